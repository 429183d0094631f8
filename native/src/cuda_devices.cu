// CUDA build of pvm/cuda_devices.h: asks the CUDA runtime which devices this process can use.
#include "pvm/cuda_devices.h"

#include <cuda_runtime_api.h>

#include <new>
#include <string>
#include <utility>
#include <vector>

#include "pvm/cuda_check.h"

namespace pvm {
namespace {

// 13000 -> "13.0", 12040 -> "12.4" (the encoding of cudaRuntimeGetVersion / cudaDriverGetVersion).
std::string format_cuda_version(int version) {
    return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

std::vector<CudaDeviceInfo> list_devices() {
    int count = 0;
    PVM_CUDA_CHECK(cudaGetDeviceCount(&count));
    std::vector<CudaDeviceInfo> devices;
    for (int index = 0; index < count; ++index) {
        cudaDeviceProp prop{};
        PVM_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
        CudaDeviceInfo device;
        device.index = index;
        device.name = prop.name;
        device.major = prop.major;
        device.minor = prop.minor;
        device.total_memory_bytes = prop.totalGlobalMem;
        device.multiprocessor_count = prop.multiProcessorCount;
        devices.push_back(std::move(device));
    }
    return devices;
}

}  // namespace

CudaRuntimeInfo query_cuda_runtime() noexcept {
    CudaRuntimeInfo info;
    cudaError_t failure = cudaSuccess;
    const char* host_failure = nullptr;
    try {
        int runtime_version = 0;
        if (cudaRuntimeGetVersion(&runtime_version) == cudaSuccess) {
            info.runtime_version = format_cuda_version(runtime_version);
        }
        int driver_version = 0;  // 0 when no driver is installed
        if (cudaDriverGetVersion(&driver_version) == cudaSuccess && driver_version > 0) {
            info.driver_version = format_cuda_version(driver_version);
        }
        info.devices = list_devices();  // all or nothing: a partial list would look like fewer GPUs
    } catch (const CudaError& error) {
        failure = static_cast<cudaError_t>(error.code());
    } catch (const std::bad_alloc&) {
        host_failure = "out of host memory while querying CUDA devices";
    }
    if (failure != cudaSuccess) {
        // No GPU or no driver is an answer here, not a failure: report CUDA's own words, and clear the
        // runtime's last-error slot so it does not resurface as the error of a later, unrelated call.
        (void)cudaGetLastError();
        host_failure = cudaGetErrorString(failure);
    }
    if (host_failure != nullptr) {
        try {
            info.error = host_failure;
        } catch (...) {  // std::string allocation; keep the noexcept promise
        }
    }
    return info;
}

}  // namespace pvm
