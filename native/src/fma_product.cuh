// Many sequences: the per-unit products of unit_products.cuh in plain FP32 FMAs,
//   C[m, n] = sum_k A[k, m] B[k, n],
// in the products workbench (dev/cuda/mma_products.cu), the engine's W1 update of 33-128 sequences and W0 update of
// 65-128, and behind the experiment switch PVM_CUDA_FMA. Why: W1's three products (K = 50 for the forward, M = 49 or
// N = 50 for the others) are short, and so are the updates' sums (K = n_seq).
// Measured (H100, engine; benchmarks/results-fma-products-h100.md, results-session7-h100.md): the W1 update of
// 33-128 sequences wins (+3.7 to +6.5% at 33-64, +0.2 to +4.5% at 72-128; W1Update::FmaTilesFew, FmaTilesMid), the
// W0 update of 65-128 too (+0.9 to +10.2%; W0Update::FmaTilesMid); the W1 forward (-9 to -11% at 64), the hidden
// deltas (-2 to -9%) and the W0 forward (-5 to -18% at 72-256) lose everywhere, the updates above 128 too.
// A block computes a 64 x kCols tile of one unit's C, its operands staged in slabs of kSlab k through kStages
// stages of shared memory by mma_product's copies (SlabCopies: [k][x], along-k operands swizzled). A thread
// sums kTm x kTn adjacent outputs, reading its kTm values of A and kTn of B per k as float4s (a warp is 4 x 8
// threads: 6 shared-memory wavefronts per 64 FMAs at 8 x 8). The finished tile goes through shared memory,
// so that consecutive threads take consecutive outputs along the output's contiguous dimension (m for the
// forwards and the hidden deltas, n for the updates) for finish's loads and stores.
// Exact as FP32 sums go: each output is one thread's FMA chain over k in order (relative error ~6e-8 a term,
// against 3xTF32's ~1e-6); deterministic, no atomics.
#pragma once

#include <cstdint>

#include "mma_products.cuh"

namespace pvm {
namespace kernels {

template <class S>
struct IsFmaShape : std::false_type {};
template <int C, int K, int St, int B, int Tm, int Tn>
struct IsFmaShape<FmaShape<C, K, St, B, Tm, Tn>> : std::true_type {};

// Four adjacent entries x..x+3 (x a multiple of 4) of a staged row whose entries were stored at x ^ sw
// (SlabCopies::swizzle: 0, 2, 4 or 6): one float4 load, its halves swapped where sw has bit 1.
__device__ __forceinline__ float4 staged4(const float* row, int x, int sw) {
    const float4 v = *reinterpret_cast<const float4*>(row + (x ^ (sw & 4)));
    return (sw & 2) ? make_float4(v.z, v.w, v.x, v.y) : v;
}

// The tiles are listed by the host as (unit, first m, first n), heaviest first (product_tiles), as for
// mma_product. Launched with mma_product_shared_bytes<Shape>() of dynamic shared memory.
template <class P, class Shape>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kMinBlocks)
    fma_product(StepArgs args, const int32_t* __restrict__ tiles) {
    constexpr int BM = kMmaProductRows, BN = Shape::kCols, KS = Shape::kSlab, kStages = Shape::kStages;
    constexpr int kThreadCount = Shape::kThreads, TM = Shape::kTm, TN = Shape::kTn, kWarpRows = BM / TM / 4;
    constexpr int kAStride = BM + 8, kBStride = BN + 8;
    static_assert(kAStride % 4 == 0 && kBStride % 4 == 0, "float4 rows");
    extern __shared__ __align__(16) float smem[];
    let_next_kernel_launch();
    await_prior_kernels();
    const int64_t u = tiles[3 * blockIdx.x], m0 = tiles[3 * blockIdx.x + 1], n0 = tiles[3 * blockIdx.x + 2];
    const P p(args, u);
    if (cleared_inactive<BM, BN, kThreadCount>(p, m0, n0)) return;
    // This thread's outputs: rows tm..tm+TM-1, columns tn..tn+TN-1 of the tile.
    const int warp = static_cast<int>(threadIdx.x / kWarp), lane = static_cast<int>(threadIdx.x % kWarp);
    const int tm = TM * (4 * (warp % kWarpRows) + lane / 8), tn = TN * (8 * (warp / kWarpRows) + lane % 8);

    using ACopies = SlabCopies<P::kAAlongK, BM, KS, kAStride, kThreadCount, KeepsA<Shape>::value>;
    using BCopies = OperandSlabCopies<P::kBIndexed, P::kBAlongK, BN, KS, kBStride, kThreadCount>;
    const ACopies a_copies(p.A, m0, p.K, p.M);
    const BCopies b_copies(p.B, n0, p.K, p.N);
    const int n_slabs = static_cast<int>((p.K + KS - 1) / KS);
    auto fetch = [&](int i) {  // slab i into stage i % kStages; always commits a group
        if (i < n_slabs) {
            float* As = smem + (i % kStages) * mma_product_stage_floats<Shape>();
            a_copies.copy(As, i);
            b_copies.copy(As + KS * kAStride, i);
        }
        copy_async_commit();
    };
    // k = kk of a staged slab into acc.
    float acc[TM][TN] = {};
    auto step = [&](const float* As, const float* Bs, int kk) {
        float a[TM], b[TN];
#pragma unroll
        for (int i = 0; i < TM; i += 4) {
            const float4 v = staged4(As + kk * kAStride, tm + i, ACopies::swizzle(kk));
            a[i] = v.x, a[i + 1] = v.y, a[i + 2] = v.z, a[i + 3] = v.w;
        }
#pragma unroll
        for (int j = 0; j < TN; j += 4) {
            const float4 v = staged4(Bs + kk * kBStride, tn + j, BCopies::swizzle(kk));
            b[j] = v.x, b[j + 1] = v.y, b[j + 2] = v.z, b[j + 3] = v.w;
        }
        if constexpr (P::kScaleA)
#pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = __fmul_rn(p.a_scale, a[i]);
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = __fmaf_rn(a[i], b[j], acc[i][j]);
    };
    // A thread whose rows or columns all lie past the matrix sums nothing (M = 49 in 64-row tiles).
    const bool sums = tm < p.M - m0 && tn < p.N - n0;

    for (int i = 0; i < kStages - 1; ++i) fetch(i);
    const int prefetch_at = n_slabs > kPrefetchK / KS ? n_slabs - kPrefetchK / KS : 0;
    for (int i = 0; i < n_slabs; ++i) {
        copy_async_wait<kStages - 2>();  // slab i has landed (this thread's copies) ...
        __syncthreads();                 // ... and every thread's; all are done with slab i-1's stage
        fetch(i + kStages - 1);
        if constexpr (P::kUpdate)
            if (i == prefetch_at) p.prefetch_old(m0, n0, BM, BN);
        if (!sums) continue;
        const float* As = smem + (i % kStages) * mma_product_stage_floats<Shape>();
        const float* Bs = As + KS * kAStride;
        const int64_t left = p.K - static_cast<int64_t>(i) * KS;
        if (left >= KS) {
#pragma unroll
            for (int kk = 0; kk < KS; ++kk) step(As, Bs, kk);
        } else {  // the last, partial slab: only its k inside the matrix (W1's K = 50 in slabs of 16)
#pragma unroll
            for (int kk = 0; kk < KS; ++kk)
                if (kk < left) step(As, Bs, kk);
        }
    }

    // The tile through shared memory (the stages are free once every thread is past its last slab), laid out
    // along the output's contiguous dimension: [n][m] for the forwards and the hidden deltas, [m][n] for the updates.
    constexpr bool kAlongM = !P::kUpdate;
    constexpr int kInner = kAlongM ? BM : BN, kPitch = kInner + 1;
    static_assert((kAlongM ? BN : BM) * kPitch <= kStages * mma_product_stage_floats<Shape>(), "the tile fits the stages");
    copy_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) smem[kAlongM ? (tn + j) * kPitch + tm + i : (tm + i) * kPitch + tn + j] = acc[i][j];
    __syncthreads();
    // Each thread's outputs e = threadIdx.x + c * threads, in groups of kGroup: what finish reads of the old state is
    // loaded for a group before any of it is written (a load after a store that may alias it waits for the store).
    constexpr int kPer = BM * BN / kThreadCount, kGroup = kPer < 8 ? kPer : 8;
    static_assert(kPer % kGroup == 0, "whole groups");
    const int64_t rows = p.M - m0, cols = p.N - n0;
    for (int c0 = 0; c0 < kPer; c0 += kGroup) {
        typename P::Old old[kGroup];
#pragma unroll
        for (int c = 0; c < kGroup; ++c) {
            const int e = static_cast<int>(threadIdx.x) + (c0 + c) * kThreadCount, x = e % kInner, y = e / kInner;
            const int m = kAlongM ? x : y, n = kAlongM ? y : x;
            if (m < rows && n < cols) old[c] = p.old(m0 + m, n0 + n);
        }
#pragma unroll
        for (int c = 0; c < kGroup; ++c) {
            const int e = static_cast<int>(threadIdx.x) + (c0 + c) * kThreadCount, x = e % kInner, y = e / kInner;
            const int m = kAlongM ? x : y, n = kAlongM ? y : x;
            if (m < rows && n < cols) p.finish(m0 + m, n0 + n, smem[y * kPitch + x], old[c]);
        }
    }
}

}  // namespace kernels
}  // namespace pvm
