// The exception a failed CUDA call becomes. Plain C++ (no CUDA headers), so CPU-only code and the
// Python bindings can name it; raised through PVM_CUDA_CHECK in pvm/cuda_check.h.
#pragma once

#include <stdexcept>
#include <string>

namespace pvm {

class CudaError : public std::runtime_error {
public:
    CudaError(int code, const std::string& message) : std::runtime_error(message), code_(code) {}

    // The cudaError_t value.
    int code() const noexcept { return code_; }

private:
    int code_;
};

}  // namespace pvm
