// Checked CUDA calls: every CUDA runtime call and kernel launch goes through one of these, so a
// failure becomes a pvm::CudaError (a Python exception through the bindings) that carries the CUDA
// error name and message and the failing call's source location, instead of being silently ignored.
//
//   PVM_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream));
//   kernel<<<grid, block, 0, stream>>>(...);
//   PVM_CUDA_CHECK_LAUNCH();
//
// Only for CUDA builds (PVM_WITH_CUDA=1).
#pragma once

#if !PVM_WITH_CUDA
#error "pvm/cuda_check.h is only for CUDA builds (PVM_WITH_CUDA=1)"
#endif

#include <cuda_runtime_api.h>

#include <string>

#include "pvm/cuda_error.h"

namespace pvm {

// "cudaErrorNoDevice: no CUDA-capable device is detected"
inline std::string cuda_error_text(cudaError_t status) {
    return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

// Throws CudaError unless status is cudaSuccess. Prefer the macro, which fills in what and where.
inline void cuda_check(cudaError_t status, const char* what, const char* file, int line) {
    if (status != cudaSuccess) {
        throw CudaError(static_cast<int>(status), std::string(what) + " failed at " + file + ":" +
                                                      std::to_string(line) + ": " + cuda_error_text(status));
    }
}

}  // namespace pvm

#define PVM_CUDA_CHECK(call) ::pvm::cuda_check((call), #call, __FILE__, __LINE__)

// After a kernel launch: reports a bad launch configuration (the launch itself returns nothing).
#define PVM_CUDA_CHECK_LAUNCH() ::pvm::cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
