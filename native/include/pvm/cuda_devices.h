// Which CUDA devices this process can use. Implemented by cuda_devices.cu (CUDA builds) or
// cuda_devices_stub.cpp (CPU-only builds); callers need no #if.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace pvm {

struct CudaDeviceInfo {
    int index = 0;
    std::string name;
    int major = 0;  // compute capability major.minor
    int minor = 0;
    std::size_t total_memory_bytes = 0;
    int multiprocessor_count = 0;

    std::string compute_capability() const { return std::to_string(major) + "." + std::to_string(minor); }
};

struct CudaRuntimeInfo {
    std::optional<std::string> runtime_version;  // CUDA runtime linked in, e.g. "13.0"; nullopt without CUDA
    std::optional<std::string> driver_version;   // newest CUDA the installed driver supports; nullopt if none
    std::vector<CudaDeviceInfo> devices;         // empty when none can be used
    std::optional<std::string> error;            // why the query failed, e.g. "no CUDA-capable device is detected"
};

// Queries the runtime, driver and devices. Never throws and never aborts: a machine without a GPU or
// driver gets an empty device list and the CUDA error text. Does not create a CUDA context.
CudaRuntimeInfo query_cuda_runtime() noexcept;

}  // namespace pvm
