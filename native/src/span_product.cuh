// Many sequences: a short-sum product (the W1 forward: K = 50) over several column tiles per block, on tensor cores.
// Why: mma_product's W1 forward runs at about a third of its traffic floor at 256 sequences and is no faster on
// one-pass TF32 or on FMAs (benchmarks/NOTES.md): with K = 50 each 64 x 64 tile is a pipeline fill, a few slabs and an
// epilogue. Here a block stages A (64 rows x all of K) once, then walks kSpan column tiles with each tile's whole B
// (K x kTileCols) double-buffered, so the next tile's copies are in flight during a tile's sums and epilogue.
// In the products workbench (dev/cuda/mma_products.cu) and behind the engine's experiment switch (PVM_CUDA_FMA s, S).
// Measured (benchmarks/results-fma-products-h100.md, H100): the workbench (cold L2) no faster than mma_product; the
// engine small -2.7 / +0.3 / +1.1% at 64 / 256 / 1,024 sequences (W1 forward 398 -> 366 us at 1,024).
// The fragment code and the outputs are mma_product's (mma_products.cuh); the same sums in the same order.
#pragma once

#include <cstdint>
#include <type_traits>

#include "mma_products.cuh"

namespace pvm {
namespace kernels {

// kSpan column tiles of kTileCols per block (kCols = kSpan * kTileCols: the tile list's columns), K up to kMaxSlabs
// slabs of kSlab, kWarpsM x kWarpsN warps per 64 x kTileCols tile, at least kMinBlocks blocks per SM.
template <int TileCols, int Span, int Slab, int MaxSlabs, int MinBlocks, int WarpsM = 2, int WarpsN = 4>
struct SpanShape {
    static constexpr int kTileCols = TileCols, kSpan = Span, kCols = TileCols * Span, kSlab = Slab, kMaxSlabs = MaxSlabs;
    static constexpr int kMinBlocks = MinBlocks, kWarpsM = WarpsM, kWarpsN = WarpsN, kThreads = 32 * WarpsM * WarpsN;
};
template <class S>
struct IsSpanShape : std::false_type {};
template <int C, int Sp, int K, int MS, int B, int WM, int WN>
struct IsSpanShape<SpanShape<C, Sp, K, MS, B, WM, WN>> : std::true_type {};

template <class S>
__host__ __device__ constexpr int span_a_floats() { return S::kMaxSlabs * S::kSlab * (kMmaProductRows + 8); }
template <class S>
__host__ __device__ constexpr int span_b_floats() { return S::kMaxSlabs * S::kSlab * (S::kTileCols + 8); }
template <class S>
__host__ __device__ constexpr size_t span_product_shared_bytes() {
    return sizeof(float) * (span_a_floats<S>() + 2 * span_b_floats<S>());
}

// The tiles are listed by the host as (unit, first m, first n) with kCols columns each (product_tiles); every unit's
// K at most kMaxSlabs * kSlab (the host checks). Launched with span_product_shared_bytes<Shape>() of dynamic shared memory.
template <class P, class Shape>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kMinBlocks)
    span_product(StepArgs args, const int32_t* __restrict__ tiles) {
    static_assert(!P::kUpdate, "no old state: forward products");
    constexpr int BM = kMmaProductRows, BN = Shape::kTileCols, KS = Shape::kSlab;
    constexpr int kThreadCount = Shape::kThreads, WM = Shape::kWarpsM, WN = Shape::kWarpsN;
    using M = TensorMath<ShapePrecision<Shape>::value>;
    constexpr int MT = BM / (16 * WM), NT = BN / (8 * WN);
    static_assert(MT * 16 * WM == BM && NT * 8 * WN == BN, "whole fragments per warp");
    constexpr int kAStride = BM + 8, kBStride = BN + 8;
    static_assert(kAStride % 32 == 8 && kBStride % 32 == 8, "conflict-free fragment reads");
    static_assert(KS % 8 == 0 && BN % 32 == 0, "slabs of whole k-steps, columns of whole fragments");
    extern __shared__ __align__(16) float smem[];
    let_next_kernel_launch();
    await_prior_kernels();
    const int64_t u = tiles[3 * blockIdx.x], m0 = tiles[3 * blockIdx.x + 1], n_first = tiles[3 * blockIdx.x + 2];
    const P p(args, u);
    const int warp = static_cast<int>(threadIdx.x / kWarp), lane = static_cast<int>(threadIdx.x % kWarp);
    const int g = lane / 4, t = lane % 4;
    const int wm = 16 * MT * (warp % WM), wn = 8 * NT * (warp / WM);
    bool live[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) live[mt] = m0 + wm + 16 * mt < p.M;

    using ACopies = SlabCopies<P::kAAlongK, BM, KS, kAStride, kThreadCount>;
    using BCopies = OperandSlabCopies<P::kBIndexed, P::kBAlongK, BN, KS, kBStride, kThreadCount>;
    const int n_slabs = static_cast<int>((p.K + KS - 1) / KS);  // <= kMaxSlabs
    float* a_stage = smem;
    float* b_stages = smem + span_a_floats<Shape>();
    {
        const ACopies a_copies(p.A, m0, p.K, p.M);
        for (int i = 0; i < n_slabs; ++i) a_copies.copy(a_stage + i * KS * kAStride, i);
    }
    auto fetch = [&](int c) {  // column tile c's B into buffer c % 2; always commits a group
        const int64_t n0 = n_first + static_cast<int64_t>(c) * BN;
        if (c < Shape::kSpan && n0 < p.N) {
            const BCopies b_copies(p.B, n0, p.K, p.N);
            float* Bs = b_stages + (c % 2) * span_b_floats<Shape>();
            for (int i = 0; i < n_slabs; ++i) b_copies.copy(Bs + i * KS * kBStride, i);
        }
        copy_async_commit();
    };
    fetch(0);  // (with A)
    fetch(1);
    for (int c = 0; c < Shape::kSpan; ++c) {
        const int64_t n0 = n_first + static_cast<int64_t>(c) * BN;
        if (n0 >= p.N) break;  // (the same for the whole block)
        copy_async_wait<1>();  // A and tile c's B have landed (this thread's copies) ...
        __syncthreads();       // ... and every thread's
        const float* Bc = b_stages + (c % 2) * span_b_floats<Shape>();
        float acc[MT][NT][4] = {};
        for (int i = 0; i < n_slabs; ++i) {
            const float* As = a_stage + i * KS * kAStride;
            const float* Bs = Bc + i * KS * kBStride;
#pragma unroll
            for (int kk = 0; kk < KS; kk += 8) {
                const int k0 = kk + M::k0(t), k1 = kk + M::k1(t);
                const int z0 = M::kBf16 ? k0 : kk, z1 = M::kBf16 ? k1 : kk + 4;
                typename M::A af[MT];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    float v[4];
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int k = e >= 2 ? k1 : k0, m = wm + 16 * mt + (e % 2 == 1 ? 8 : 0);
                        v[e] = As[k * kAStride + m + (g ^ ACopies::swizzle(e >= 2 ? z1 : z0))];
                    }
                    af[mt] = M::a(v[0], v[1], v[2], v[3]);
                }
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const int n = wn + 8 * j;
                    const typename M::B bf = M::b(Bs[k0 * kBStride + n + (g ^ BCopies::swizzle(z0))],
                                                  Bs[k1 * kBStride + n + (g ^ BCopies::swizzle(z1))]);
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        if (!live[mt]) continue;
                        M::mma(acc[mt][j], af[mt], bf);
                    }
                }
            }
        }
        __syncthreads();  // every warp is done with buffer c % 2 ...
        fetch(c + 2);     // ... which takes tile c + 2, in flight through this tile's outputs and the next one's sums
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int64_t m = m0 + wm + 16 * mt + g + (e >= 2 ? 8 : 0), n = n0 + wn + 8 * j + 2 * t + e % 2;
                    if (m < p.M && n < p.N) p.finish(m, n, acc[mt][j][e], typename P::Old{});
                }
    }
}

}  // namespace kernels
}  // namespace pvm
