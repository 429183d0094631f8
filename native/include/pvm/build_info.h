// What this build of the native engine is: version, compiler, whether CUDA is compiled in, and the
// CUDA devices it can see. Reported to Python as pvm_dist._native.build_info().
#pragma once

#include <optional>
#include <string>

#include "pvm/cuda_devices.h"

namespace pvm {

struct BuildInfo {
    std::string version;    // the pvm-dist package version this module was built as
    std::string compiler;   // C++ compiler id and version, e.g. "GNU 12.2.0"
    int cxx_standard = 0;   // C++ standard the compiler used, e.g. 17
    bool cuda_compiled = false;
    std::optional<std::string> cuda_architectures;  // as given to CMake; nullopt without CUDA
    CudaRuntimeInfo cuda;   // runtime/driver versions and devices, queried at call time
};

// The pvm-dist package version this module was built as. Cheap; touches no CUDA.
std::string version();

// Collects the build facts and queries the CUDA devices now. Never throws for a missing GPU or
// driver: that is reported in cuda.error.
BuildInfo build_info();

}  // namespace pvm
