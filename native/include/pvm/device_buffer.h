// A typed, owning cudaMalloc'd array (move-only). Every call is checked.
#pragma once

#if !PVM_WITH_CUDA
#error "pvm/device_buffer.h is only for CUDA builds"
#endif

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "pvm/cuda_check.h"

namespace pvm {

template <class T>
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    // n elements, and `slack` more allocated past them that size() and bytes() leave out (for kernels that
    // read a few elements past the last one they use, e.g. the 16-byte window copies), set to zero bytes
    // (a product may multiply them by a masked 0: they must not be NaN).
    explicit DeviceBuffer(int64_t n, int64_t slack = 0) : size_(n) {
        if (n > 0) PVM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), sizeof(T) * static_cast<size_t>(n + slack)));
        if (n > 0 && slack > 0) PVM_CUDA_CHECK(cudaMemset(ptr_ + n, 0, sizeof(T) * static_cast<size_t>(slack)));
    }
    explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(static_cast<int64_t>(host.size())) {
        if (size_ > 0) PVM_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice));
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) {
            release();
            ptr_ = std::exchange(o.ptr_, nullptr);
            size_ = std::exchange(o.size_, 0);
        }
        return *this;
    }
    ~DeviceBuffer() { release(); }

    T* data() { return ptr_; }
    const T* data() const { return ptr_; }
    int64_t size() const { return size_; }
    size_t bytes() const { return sizeof(T) * static_cast<size_t>(size_); }

    void fill_async(int byte_value, cudaStream_t stream) {
        if (size_ > 0) PVM_CUDA_CHECK(cudaMemsetAsync(ptr_, byte_value, bytes(), stream));
    }

private:
    void release() {
        if (ptr_) cudaFree(ptr_);  // never throws from a destructor
        ptr_ = nullptr;
    }
    T* ptr_ = nullptr;
    int64_t size_ = 0;
};

}  // namespace pvm
