#include <algorithm>
#include <vector>

#include "pvm/bandwidth.h"
#include "pvm/cuda_check.h"
#include "pvm/device_buffer.h"

namespace pvm {

double measure_copy_bandwidth(int device, int64_t bytes, int repeats) {
    PVM_CUDA_CHECK(cudaSetDevice(device));
    DeviceBuffer<uint8_t> src(bytes), dst(bytes);
    PVM_CUDA_CHECK(cudaMemset(src.data(), 1, src.bytes()));  // never time on untouched memory
    cudaEvent_t start, stop;
    PVM_CUDA_CHECK(cudaEventCreate(&start));
    PVM_CUDA_CHECK(cudaEventCreate(&stop));
    std::vector<float> ms(std::max(repeats, 1));
    PVM_CUDA_CHECK(cudaMemcpy(dst.data(), src.data(), src.bytes(), cudaMemcpyDeviceToDevice));  // warm-up
    for (float& t : ms) {
        PVM_CUDA_CHECK(cudaEventRecord(start));
        PVM_CUDA_CHECK(cudaMemcpy(dst.data(), src.data(), src.bytes(), cudaMemcpyDeviceToDevice));
        PVM_CUDA_CHECK(cudaEventRecord(stop));
        PVM_CUDA_CHECK(cudaEventSynchronize(stop));
        PVM_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::sort(ms.begin(), ms.end());
    return 2.0 * static_cast<double>(bytes) / (ms[ms.size() / 2] * 1e-3);
}

}  // namespace pvm
