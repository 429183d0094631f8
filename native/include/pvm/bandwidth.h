// Device memory bandwidth as a large device-to-device copy achieves it: the denominator of the
// memory floor that `pvm-dist bench` reports against (bytes read + bytes written per second).
#pragma once

#include <cstdint>

namespace pvm {

// Median over `repeats` copies of `bytes` bytes on CUDA device `device`. Throws in CPU-only builds.
double measure_copy_bandwidth(int device, int64_t bytes, int repeats);

}  // namespace pvm
