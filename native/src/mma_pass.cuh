// The fused weight pass on tensor cores (8 to 64 sequences): one read of a unit's W and V per step
// serves every sequence, and both per-unit products run as mma.sync m16n8k8 over the sequences:
//   forward  h(s)[r, q] = phi(sum_c W[r, c] x(s)[q, c])              (rows x sequences, k = columns)
//   update   G[r, c]    = sum_q lr*delta[r, q] x(s-2)[q, c]           (rows x columns,   k = sequences)
// then V = mu V + G / n_seq, W = W + V, as weight_pass_multi does with one FMA chain per weight.
//
// Precision: 3xTF32. Every operand is split as hi = tf32(v), lo = tf32(v - hi), and a product is
// hi*hi + hi*lo + lo*hi, accumulated in FP32 by the tensor core: about FP32's relative error (the
// dropped lo*lo term is ~2^-22 of the product), within the engine's tolerances (pvm-algorithm.md §3.12).
// Deterministic: the tensor core's accumulation order is fixed for one device; no atomics.
//
// The one fragment layout that serves both products: a lane (g = lane / 4, t = lane % 4) holds W at
// rows g, g+8 and columns 2t, 2t+1 of each 8-column step. That is the accumulator layout of the
// update (rows x columns) and, reading the forward's k index t as column 2t and t+4 as column 2t+1
// (a sum may take its terms in any order), the A operand of the forward.
#pragma once

#include <cstdint>

#include "step_kernels.cuh"

namespace pvm {
namespace kernels {

// A block: 4 row tiles of 16 rows (64 rows of one unit) x kMmaSlots column slots, a warp each. Slot c
// takes the 8-column steps c, c + kMmaSlots, ... of every staged chunk, so a unit's rows are read by
// 4 * kMmaSlots warps (4 warps per block left 8 warps per SM: 236 us for small's W0 pass at n_seq 8).
constexpr int kMmaTiles = 4, kMmaSlots = 2;
constexpr int kMmaThreads = kMmaTiles * kMmaSlots * kWarp;  // 256
constexpr int kMmaRows = 16 * kMmaTiles;                    // at most 64 rows per block
constexpr int kMmaSteps = 4;                                // 8-column k-steps per staged chunk
constexpr int kMmaWarpSteps = kMmaSteps / kMmaSlots;        // of them, per warp
constexpr int kMmaCols = 8 * kMmaSteps;                     // 32 columns per chunk
constexpr int kMmaStride = kMmaCols + 8;           // staged row stride: conflict-free fragment reads

__device__ __forceinline__ uint32_t tf32(float v) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
    return r;
}

struct Split {  // v = hi + lo, both TF32
    uint32_t hi, lo;
};
__device__ __forceinline__ Split split(float v) {
    const uint32_t hi = tf32(v);
    return {hi, tf32(__fsub_rn(v, __uint_as_float(hi)))};
}

// d += A B for one m16n8k8 TF32 product (A: a[0..3] row-major fragment, B: b[0..1]).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d += A B in 3xTF32: the small terms first, then hi*hi.
__device__ __forceinline__ void mma_3xtf32(float (&d)[4], const Split (&a)[4], const Split (&b)[2]) {
    const uint32_t ah[4] = {a[0].hi, a[1].hi, a[2].hi, a[3].hi}, al[4] = {a[0].lo, a[1].lo, a[2].lo, a[3].lo};
    const uint32_t bh[2] = {b[0].hi, b[1].hi}, bl[2] = {b[0].lo, b[1].lo};
    mma_tf32(d, al, bh);
    mma_tf32(d, ah, bl);
    mma_tf32(d, ah, bh);
}

// Blocks listed by the host as (unit, first row, end row), at most kMmaRows rows; NS a multiple of 8
// with n_seq <= NS (spare sequences staged as zeros with lr*delta 0: they add nothing).
template <class Row, int NS>
__global__ void __launch_bounds__(kMmaThreads, NS <= 32 ? 2 : 1) weight_pass_mma(StepArgs a, const int32_t* __restrict__ blocks) {
    static_assert(NS % 8 == 0 && NS >= 8, "sequences in tiles of 8");
    constexpr int NT = NS / 8;  // sequence tiles
    __shared__ __align__(16) float xs[2][2][NS][kMmaStride];  // [stage][0: x(s), 1: x(s-2)][sequence][column]
    const int warp = static_cast<int>(threadIdx.x / kWarp), lane = static_cast<int>(threadIdx.x % kWarp);
    const int tile = warp % kMmaTiles, slot = warp / kMmaTiles;
    const int g = lane / 4, t = lane % 4;
    const int64_t u = blocks[3 * blockIdx.x];
    const int r_begin = blocks[3 * blockIdx.x + 1], r_end = blocks[3 * blockIdx.x + 2];
    const int64_t s = *a.step;
    const int cur = ring_slot(s), old = ring_slot(s - 2);
    const int n = static_cast<int>(a.n_seq);
    const int64_t len = Row::length(a, u), first = Row::first_row(a, u);
    // This lane's two rows (g and g+8 of the warp's 16); a row past the block's end reads zeros, writes nothing.
    const int lr0 = r_begin + 16 * tile + g, lr1 = lr0 + 8;
    const bool live0 = lr0 < r_end, live1 = lr1 < r_end;
    float* __restrict__ W0 = a.weights + Row::weight_base(a, first + (live0 ? lr0 : r_begin), u, len);
    float* __restrict__ V0 = a.velocity + (W0 - a.weights);
    float* __restrict__ W1 = a.weights + Row::weight_base(a, first + (live1 ? lr1 : r_begin), u, len);
    float* __restrict__ V1 = a.velocity + (W1 - a.weights);
    const float* __restrict__ in = Row::input(a, cur, 0, u);
    const float* __restrict__ in_old = Row::input(a, old, 0, u);
    const int64_t stride = Row::input(a, cur, 1, u) - in;
    const float lr = a.unit_lr[u], mu = a.unit_mu[u], inv_n = 1.0f / static_cast<float>(n);
    const bool active = !(lr == 0.0f && mu == 0.0f);

    // The update's A operand, lr*delta[row, sequence], split once: (g, 8j+t), (g+8, 8j+t), (g, 8j+t+4), (g+8, 8j+t+4).
    Split ld[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int q = 8 * j + t + (e >= 2 ? 4 : 0);
            const bool row_ok = (e % 2 == 0) ? live0 : live1;
            const int64_t r = first + ((e % 2 == 0) ? lr0 : lr1);
            ld[j][e] = split(q < n && row_ok ? Row::lr_delta(a, q, r, u) : 0.0f);
        }
    float acc[NT][4];  // forward sums: (row g, sequence 8j+2t), (g, 8j+2t+1), (g+8, 8j+2t), (g+8, 8j+2t+1)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

    // W and V of this warp's steps of a chunk in the accumulator layout:
    // [step][0: (g, 2t), 1: (g, 2t+1), 2: (g+8, 2t), 3: (g+8, 2t+1)], step kk at columns 8 * (slot + kMmaSlots * kk).
    float w_next[kMmaWarpSteps][4], v_next[kMmaWarpSteps][4];
    auto fetch = [&](int64_t c0, int stage) {
        const int width = static_cast<int>(len - c0 < kMmaCols ? len - c0 : kMmaCols);
#pragma unroll
        for (int k = 0; k < kMmaWarpSteps; ++k)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int c = 8 * (slot + kMmaSlots * k) + 2 * t + (e % 2);
                const bool ok = c < width && (e < 2 ? live0 : live1);
                const float* Wp = e < 2 ? W0 : W1;
                const float* Vp = e < 2 ? V0 : V1;
                w_next[k][e] = ok ? Wp[c0 + c] : 0.0f;
                v_next[k][e] = ok ? Vp[c0 + c] : 0.0f;
            }
        // Thread (row h, column c) stages column c of sequences h, h + kPass, ... of both steps.
        const int col = static_cast<int>(threadIdx.x % kMmaCols), seq0 = static_cast<int>(threadIdx.x / kMmaCols);
        constexpr int kPass = kMmaThreads / kMmaCols;
#pragma unroll 4
        for (int q = seq0; q < NS; q += kPass) {
            const bool valid = col < width && q < n;
            const int64_t at = valid ? q * stride + c0 + col : 0;
            copy_async4(&xs[stage][0][q][col], in + at, valid);
            copy_async4(&xs[stage][1][q][col], in_old + at, valid);
        }
        copy_async_commit();
    };

    fetch(0, 0);
    int stage = 0;
    for (int64_t c0 = 0; c0 < len; c0 += kMmaCols, stage ^= 1) {
        const int width = static_cast<int>(len - c0 < kMmaCols ? len - c0 : kMmaCols);
        float w[kMmaWarpSteps][4], v[kMmaWarpSteps][4];
#pragma unroll
        for (int k = 0; k < kMmaWarpSteps; ++k)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                w[k][e] = w_next[k][e];
                v[k][e] = v_next[k][e];
            }
        if (c0 + kMmaCols < len) {
            fetch(c0 + kMmaCols, stage ^ 1);
            copy_async_wait<1>();
        } else {
            copy_async_wait<0>();
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < kMmaWarpSteps; ++k) {
            const int col0 = 8 * (slot + kMmaSlots * k);
            // Forward: A = W (k index t: column 2t, t+4: column 2t+1), B = x(s)[sequence 8j+g][those columns].
            const Split wa[4] = {split(w[k][0]), split(w[k][2]), split(w[k][1]), split(w[k][3])};
            float grad[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const float2 xv = *reinterpret_cast<const float2*>(&xs[stage][0][8 * j + g][col0 + 2 * t]);
                const Split xb[2] = {split(xv.x), split(xv.y)};
                mma_3xtf32(acc[j], wa, xb);
                // Update: A = lr*delta (rows x sequences), B = x(s-2)[sequence 8j+t, 8j+t+4][column 8k+g].
                const Split ob[2] = {split(xs[stage][1][8 * j + t][col0 + g]), split(xs[stage][1][8 * j + t + 4][col0 + g])};
                mma_3xtf32(grad, ld[j], ob);
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int c = col0 + 2 * t + (e % 2);
                if (c >= width || !(e < 2 ? live0 : live1)) continue;
                float* Wp = e < 2 ? W0 : W1;
                float* Vp = e < 2 ? V0 : V1;
                if (active) {
                    const float vn = __fmaf_rn(mu, v[k][e], __fmul_rn(grad[e], inv_n));
                    Wp[c0 + c] = __fadd_rn(w[k][e], vn);
                    Vp[c0 + c] = vn;
                } else if (v[k][e] != 0.0f) {
                    Vp[c0 + c] = 0.0f;  // a unit not yet enabled: its update is zero
                }
            }
        }
        __syncthreads();  // xs[stage] is refilled two chunks on
    }
    // The forward sums of the two slots, slot 0's plus slot 1's (a fixed order), through the free staging buffer.
    static_assert(kMmaSlots == 2, "the sums of two slots are combined");
    static_assert(kMmaTiles * NT * 4 * kWarp <= 2 * 2 * NS * kMmaStride, "the partial sums fit the staging buffer");
    float* part = &xs[0][0][0][0] + tile * (NT * 4 * kWarp);
    if (slot == 1)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) part[(j * 4 + e) * kWarp + lane] = acc[j][e];
    __syncthreads();
    if (slot == 1) return;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int q = 8 * j + 2 * t + (e % 2);
            const bool row_ok = e < 2 ? live0 : live1;
            if (q < n && row_ok)
                *Row::output(a, cur, q, first + (e < 2 ? lr0 : lr1), u) =
                    activation(__fadd_rn(acc[j][e], part[(j * 4 + e) * kWarp + lane]), a.polynomial);
        }
}

}  // namespace kernels
}  // namespace pvm
