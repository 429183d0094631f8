// CPU-only build of pvm/cuda_devices.h: there is no CUDA runtime to ask.
#include "pvm/cuda_devices.h"

namespace pvm {

CudaRuntimeInfo query_cuda_runtime() noexcept {
    CudaRuntimeInfo info;
    try {
        info.error = "CUDA not compiled in";
    } catch (...) {  // std::string allocation; keep the noexcept promise
    }
    return info;
}

}  // namespace pvm
