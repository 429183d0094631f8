// Shared helpers of the per-kernel workbench (dev/cuda/*.cu): checked CUDA calls, seeded random
// fills, a relative-error check against a CPU reference, and event timing (median of repeats).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CHECK(call)                                                                                      \
    do {                                                                                                 \
        cudaError_t err_ = (call);                                                                       \
        if (err_ != cudaSuccess) {                                                                       \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
            std::exit(1);                                                                                \
        }                                                                                                \
    } while (0)
#define CHECK_LAUNCH() CHECK(cudaGetLastError())

// Uniform floats in [lo, hi) from a fixed seed: every run checks the same data; change the seed to vary it.
inline void fill_uniform(std::vector<float>& v, float lo, float hi, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(lo, hi);
    for (float& x : v) x = d(rng);
}

template <class T>
T* to_device(const std::vector<T>& h) {
    T* d = nullptr;
    CHECK(cudaMalloc(&d, h.size() * sizeof(T)));
    CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

// Device copies that are freed together when the scope ends (a workbench case's inputs and outputs).
class DeviceScope {
  public:
    DeviceScope() = default;
    DeviceScope(const DeviceScope&) = delete;
    DeviceScope& operator=(const DeviceScope&) = delete;
    ~DeviceScope() {
        for (void* p : ptrs_) cudaFree(p);
    }
    template <class T>
    T* put(const std::vector<T>& h) {
        T* d = to_device(h);
        ptrs_.push_back(d);
        return d;
    }

  private:
    std::vector<void*> ptrs_;
};

// The n_seq list of a workbench's command line (defaults when none given); a value outside [lo, hi]
// is named on stderr and the program exits with status 2.
inline std::vector<int64_t> parse_seqs(int argc, char** argv, std::vector<int64_t> defaults, int64_t lo, int64_t hi) {
    std::vector<int64_t> seqs;
    for (int i = 1; i < argc; ++i) {
        char* end = nullptr;
        const long long v = std::strtoll(argv[i], &end, 10);
        if (end == argv[i] || *end != '\0' || v < lo || v > hi) {
            std::fprintf(stderr, "n_seq must be an integer in %lld..%lld, not '%s'\n", static_cast<long long>(lo),
                         static_cast<long long>(hi), argv[i]);
            std::exit(2);
        }
        seqs.push_back(v);
    }
    return seqs.empty() ? defaults : seqs;
}

template <class T>
std::vector<T> to_host(const T* d, size_t n) {
    std::vector<T> h(n);
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

// ||got - want|| / ||want|| over the entries where mask is true (all when mask is empty); NaN fails.
inline double relative_error(const std::vector<float>& got, const std::vector<double>& want,
                             const std::vector<bool>& mask = {}) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
        if (!mask.empty() && !mask[i]) continue;
        if (std::isnan(got[i])) return INFINITY;
        const double d = static_cast<double>(got[i]) - want[i];
        num += d * d;
        den += want[i] * want[i];
    }
    return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline bool report_check(const char* what, double err, double tol) {
    std::printf("  %-28s rel err %.2e (tol %.0e) %s\n", what, err, tol, err <= tol ? "ok" : "FAIL");
    return err <= tol;
}

// Writes 256 MiB (more than any L2): what a kernel reads next comes from HBM, as in a step where the
// other passes ran in between. Pass it as time_us's `before`.
inline void flush_l2() {
    static void* buf = nullptr;
    constexpr size_t kBytes = size_t{256} << 20;
    if (!buf) CHECK(cudaMalloc(&buf, kBytes));
    CHECK(cudaMemsetAsync(buf, 0, kBytes));
}

// Median time in microseconds of `reps` runs of launch(), each timed with events, after `warmup` runs;
// before() runs ahead of each timed run, outside the events.
template <class F, class B = void (*)()>
double time_us(F&& launch, int warmup = 5, int reps = 50, B before = [] {}) {
    for (int i = 0; i < warmup; ++i) launch();
    CHECK(cudaDeviceSynchronize());
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    std::vector<float> ms(reps);
    for (int i = 0; i < reps; ++i) {
        before();
        CHECK(cudaEventRecord(a));
        launch();
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        CHECK(cudaEventElapsedTime(&ms[i], a, b));
    }
    CHECK_LAUNCH();
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
    return 1000.0 * ms[reps / 2];
}

// After letting `kernel` have `bytes` of dynamic shared memory: how many of its blocks of `threads` are resident at
// once on one SM.
template <class Kernel>
int resident_per_sm(Kernel kernel, int threads, size_t bytes) {
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, bytes));
    return per_sm;
}
// The SMs of device 0.
inline int device_sms() {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    return sms;
}

// Device-to-device copy bandwidth (bytes read + written per second) over `bytes`: the memory ceiling.
inline double copy_bandwidth(size_t bytes) {
    void *src, *dst;
    CHECK(cudaMalloc(&src, bytes));
    CHECK(cudaMalloc(&dst, bytes));
    CHECK(cudaMemset(src, 1, bytes));
    const double us = time_us([&] { CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); }, 3, 20);
    CHECK(cudaFree(src));
    CHECK(cudaFree(dst));
    return 2.0 * bytes / (us * 1e-6);
}
