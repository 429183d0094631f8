// The original PVM_cuda float32 arithmetic, one element at a time (pvm-algorithm.md §3.3-3.7, §3.12).
// Shared by the CPU engine and the CUDA kernels (PVM_HD), and mirrored by pvm_dist/engine/numerics.py.
// Build with floating-point contraction off (-ffp-contract=off, nvcc -fmad=false) so that every
// rounding written here happens exactly where it is written; the one fused multiply-add the original
// has (the momentum update) is spelled out with fmaf.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define PVM_HD __host__ __device__ __forceinline__
#else
#define PVM_HD inline
#endif

namespace pvm {

enum class Derivative : int { Original = 0, Exact = 1 };

// The tensor cores' arithmetic in the CUDA engine's products (from 5 sequences; issue 12 item 3; W1's pass at 2-4
// sequences runs on tensor cores too, always in kFp32). kFp32, the default:
// 3xTF32 (split operands), within the engine's FP32 tolerances. kTf32: one TF32 product (operands rounded to 10
// mantissa bits). kBf16: BF16 operands (7 bits). All accumulate in FP32, and W and V stay FP32 in memory. The CPU
// engine and the element-wise kernels compute in FP32 in every mode.
enum class Precision : int { kFp32 = 0, kTf32 = 1, kBf16 = 2 };

// uint8 BGR -> float32 in [0,1] (divide by 255 in float32), then c = fl32(fl32(F*0.8f) + 0.1f).
PVM_HD float compress_pixel(uint8_t v) {
    float f = static_cast<float>(v) / 255.0f;
    return f * 0.8f + 0.1f;
}
PVM_HD float compress_pixel(float f) { return f * 0.8f + 0.1f; }

// Context compression: 0.8*h + 0.1 in double, rounded once to float32 (1.0 -> 0.89999998).
PVM_HD float kappa(float h) { return static_cast<float>(0.8 * static_cast<double>(h) + 0.1); }

// The rational sigmoid a / (2(1+|a|)) + 1/2 with the original's roundings, or the logistic.
PVM_HD float activation(float a, bool polynomial) {
    if (polynomial) return a / (2.0f * (fabsf(a) + 1.0f)) + 0.5f;
    return 1.0f / (1.0f + expf(-a));
}

// delta = g(y) * e, g the derivative factor in terms of the output (§3.6, §3.12).
// Original: the CUDA kernel's 1 / (2 (1 + |u|/(1+|u|))^2), u = 2y-1, division and product in double.
// Exact: (1 - |u|)^2 / 2. Logistic: y (1 - y).
PVM_HD float delta(float y, float e, bool polynomial, Derivative mode) {
    if (!polynomial) return y * (1.0f - y) * e;
    float u = 2.0f * y - 1.0f;
    if (mode == Derivative::Original) {
        float r = u / (1.0f + fabsf(u));
        float z = fabsf(r) + 1.0f;
        float zz = z * z;
        return static_cast<float>((1.0 / (2.0 * static_cast<double>(zz))) * static_cast<double>(e));
    }
    double w = static_cast<double>(1.0f - fabsf(u));
    return static_cast<float>(0.5 * (w * w) * static_cast<double>(e));
}

// The update product fl32(fl32(lr * delta) * a), before any averaging over sequences.
PVM_HD float update_product(float lr_delta, float a) { return lr_delta * a; }

// V <- fma(mu, V, g); W <- W + V. The reference emulates the fma in double; results agree to 1 ulp.
PVM_HD void momentum_step(float& w, float& v, float mu, float g) {
    v = fmaf(mu, v, g);
    w = w + v;
}

}  // namespace pvm
