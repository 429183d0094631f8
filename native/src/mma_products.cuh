// Many sequences on tensor cores: the per-unit products of unit_products.cuh as 3xTF32 mma.sync m16n8k8,
//   C[m, n] = sum_k A[k, m] B[k, n].
// A block computes a 64 x kCols tile of one unit's C with kWarpsM x kWarpsN warps (MmaShape; 2 x 4 by
// default: each warp 32 x kCols/4 as 2 x kCols/32 fragments of 16 x 8, so a B value split once serves two
// row fragments and an A value kCols/32 column fragments). Which warp sums an output does not change its
// sum: every output is one fragment's fixed sequence of mma steps over k.
// k advances in slabs of kSlab that stream through kStages stages of shared memory (cp.async): kStages - 1
// slabs are in flight while one is multiplied. A fragment value is split where it is read, hi = tf32(v),
// lo = v - hi (split() in mma_pass.cuh). Row strides of 8 mod 32 words make the reads conflict-free.
// Measured on an H200 (benchmarks/NOTES.md): slabs loaded into registers one ahead, as the FMA tiles
// before this kernel did, kept too few bytes in flight (1 TB/s; no faster than FMAs); cvt.rna.tf32 and
// per-copy address arithmetic were most of the instructions until tf32() and SlabCopies replaced them.
//
// Precision as in mma_pass.cuh: hi*hi + hi*lo + lo*hi in FP32 accumulators (relative error of a sum
// ~1e-6; FMA chains: ~6e-8), inside the engine's tolerances (pvm-algorithm.md §3.12).
// Deterministic: each output is one warp's fixed sequence of mma steps over k; no atomics.
#pragma once

#include <cstdint>
#include <type_traits>

#include "mma_pass.cuh"
#include "unit_products.cuh"

namespace pvm {
namespace kernels {

constexpr int kMmaProductRows = 64;  // rows (m) per block tile
// An update's tile prefetches its old W and V into L2 (Update::prefetch_old) at the slab kPrefetchK before its
// last k: the finish's loads then come from L2, not DRAM. Workbench, H200, 256 sequences: W0 update (64 x 128
// tiles) 281.6 -> 259.7 us, W1 update (64 x 64, 1 x 4 warps) 105.3 -> 96.2; 16 and 64 within 1.5% of 32, at
// the tile's start 271.3 and 99.7 (benchmarks/NOTES.md).
constexpr int kPrefetchK = 32;

// The arithmetic a tile shape asks for (TensorMath, mma_pass.cuh): a shape takes the default, 3xTF32, unless it
// is InPrecision<S, P> (an opt-in mode, pvm::Precision). WithPrecision<S, P> is S itself for the default, so that
// the default's kernels are the same types in every mode.
template <class S, class = void>
struct ShapePrecision {
    static constexpr Precision value = Precision::kFp32;
};
template <class S>
struct ShapePrecision<S, std::void_t<decltype(S::kPrecision)>> {
    static constexpr Precision value = S::kPrecision;
};
template <class S, Precision P>
struct InPrecision : S {
    static constexpr Precision kPrecision = P;
};
template <class S, Precision P>
using WithPrecision = std::conditional_t<P == Precision::kFp32, S, InPrecision<S, P>>;

// Shared memory of one block of shape S: S::kStages slabs of A ([k][m]) and B ([k][n]).
template <class S>
__host__ __device__ constexpr int mma_product_stage_floats() { return S::kSlab * (kMmaProductRows + 8 + S::kCols + 8); }
template <class S>
__host__ __device__ constexpr size_t mma_product_shared_bytes() { return sizeof(float) * S::kStages * mma_product_stage_floats<S>(); }

// The cp.async copies of one operand's slabs that this thread issues. Slab entry e = thread + c * threads
// (copy c): along k, consecutive threads take consecutive k (coalesced rows) and copy c moves to the
// entry threads / kSlab further along x (m or n); otherwise consecutive x, and c moves along k. So a
// thread's copies are one address stepped by copy_step, moved by slab_step per slab, and whether a copy
// is inside the matrix is a bit (along x) and one compare with what is left along k: no index arithmetic
// per copy (computing every address and bound from (k, x) was a third of mma_product's instructions).
template <bool kAlongK, int kExtent, int kSlab, int kStride, int kThreadCount, bool kKeep = false>
struct SlabCopies {
    static constexpr int kInner = kAlongK ? kSlab : kExtent, kOuterStep = kThreadCount / kInner;
    static constexpr int kCopies = kSlab * kExtent / kThreadCount;
    static_assert(kThreadCount % kInner == 0 && kCopies * kThreadCount == kSlab * kExtent, "whole copies");
    static_assert(kCopies <= 32, "one bit per copy");
    const float *base, *src;  // the operand's first entry (a safe address), this thread's copy 0 in slab 0
    int64_t copy_step, slab_step;
    // K - (copy 0's k), so that slab k0 has K - k0 - k left. In 32 bits, as the slab index (a product's K, a unit's
    // inputs, outputs or sequences, is far below 2^31): in 64 bits that arithmetic was a tenth of the W1 forward's
    // slab loop in SASS (146 -> 132 instructions a warp).
    int k_end;
    uint32_t x_inside;  // bit c: copy c's x is inside the matrix
    int dst;            // copy 0's place in a slab ([k][x], rows kStride apart)
    __device__ SlabCopies(const Operand& op, int64_t x0, int64_t K, int64_t X) : base(op.base) {
        const int inner = static_cast<int>(threadIdx.x) % kInner, outer = static_cast<int>(threadIdx.x) / kInner;
        const int k = kAlongK ? inner : outer, x = kAlongK ? outer : inner;
        src = op.at(k, x0 + x);
        copy_step = kOuterStep * (kAlongK ? op.sx : op.sk);
        slab_step = kSlab * op.sk;
        k_end = static_cast<int>(K) - k;
        x_inside = 0;
        for (int c = 0; c < kCopies; ++c)
            if (x0 + x + (kAlongK ? c * kOuterStep : 0) < X) x_inside |= 1u << c;
        dst = k * kStride + (x ^ swizzle(k));
        if constexpr (kKeep) policy = l2_evict_last();
    }
    uint64_t policy = 0;  // kKeep: the copies under evict_last
    // Along k, a warp's copies are 16 or 32 k x a few x: rows kStride = 8 (mod 32) words apart put k and
    // k + 4 in one bank. x is stored xor'ed with 2 * (k / 4 % 4) there, which spreads a warp's stores over all
    // 32 banks; the fragment reads (k / 4 fixed per read) stay conflict-free. Along x there is nothing to fix.
    __host__ __device__ static constexpr int swizzle(int k) { return kAlongK && kOuterStep % 8 == 0 ? 2 * (k / 4 % 4) : 0; }
    // Slab i into its stage; entries past the matrix as zeros.
    __device__ void copy(float* stage, int i) const {
        const int left = k_end - i * kSlab;  // copy c is inside along k if its k offset is below this
        const int k_left = left > kSlab ? kSlab : left;
        const float* s = src + i * slab_step;
#pragma unroll
        for (int c = 0; c < kCopies; ++c) {
            const bool ok = (kAlongK ? 0 : c * kOuterStep) < k_left && ((x_inside >> c) & 1u);
            float* to = stage + dst + c * kOuterStep * (kAlongK ? 1 : kStride);
            if constexpr (kKeep) copy_async4(to, ok ? s : base, ok, policy);
            else copy_async4(to, ok ? s : base, ok);
            s += copy_step;
        }
    }
};
// Whether a tile shape copies its A operand under evict_last (S::kKeepA; false where a shape does not say).
template <class S, class = void>
struct KeepsA : std::false_type {};
template <class S>
struct KeepsA<S, std::void_t<decltype(S::kKeepA)>> : std::bool_constant<S::kKeepA> {};

// SlabCopies of an IndexedOperand (W0's products reading x from the step's sources): the same slab layout,
// swizzle and masks, each copy from base[index[k] + x * sx] (along k) or base[k * sk + index[x]] (along x).
// Along x a thread's x is fixed, so its index is read once. Along k a thread's k is fixed within a slab, so
// one index serves its kCopies copies; it is read a slab ahead (copy is called in slab order) so that the
// copies do not wait for it.
template <bool kAlongK, int kExtent, int kSlab, int kStride, int kThreadCount>
struct IndexedSlabCopies {
    using Layout = SlabCopies<kAlongK, kExtent, kSlab, kStride, kThreadCount>;
    static constexpr int kOuterStep = Layout::kOuterStep, kCopies = Layout::kCopies;
    __host__ __device__ static constexpr int swizzle(int k) { return Layout::swizzle(k); }
    const float* base;
    const int32_t* index;  // along k: this thread's k in slab 0
    int64_t offset;        // along k: copy 0's x times sx; along x: copy 0's place in slab 0
    int64_t copy_step, slab_step;
    int k_end;  // as SlabCopies'
    uint32_t x_inside;
    int dst;
    mutable int32_t next = 0;  // along k: the index of the slab copy() moves next
    __device__ IndexedSlabCopies(const IndexedOperand& op, int64_t x0, int64_t K, int64_t X) : base(op.base) {
        const int inner = static_cast<int>(threadIdx.x) % Layout::kInner, outer = static_cast<int>(threadIdx.x) / Layout::kInner;
        const int k = kAlongK ? inner : outer, x = kAlongK ? outer : inner;
        k_end = static_cast<int>(K) - k;
        x_inside = 0;
        for (int c = 0; c < kCopies; ++c)
            if (x0 + x + (kAlongK ? c * kOuterStep : 0) < X) x_inside |= 1u << c;
        dst = k * kStride + (x ^ swizzle(k));
        if constexpr (kAlongK) {
            index = op.index + k;
            offset = (x0 + x) * op.sx;
            copy_step = kOuterStep * op.sx;
            slab_step = 0;
            if (k_end > 0) next = __ldg(index);
        } else {
            index = op.index;
            offset = (x_inside & 1u) ? op.index[x0 + x] + k * op.sk : 0;
            copy_step = kOuterStep * op.sk;
            slab_step = kSlab * op.sk;
        }
    }
    __device__ void copy(float* stage, int i) const {
        const int left = k_end - i * kSlab;
        const int k_left = left > kSlab ? kSlab : left;
        const float* s;
        if constexpr (kAlongK) {
            s = base + next + offset;
            if (left > kSlab) next = __ldg(index + (i + 1) * kSlab);
        } else {
            s = base + offset + i * slab_step;
        }
#pragma unroll
        for (int c = 0; c < kCopies; ++c) {
            const bool ok = (kAlongK ? 0 : c * kOuterStep) < k_left && ((x_inside >> c) & 1u);
            copy_async4(stage + dst + c * kOuterStep * (kAlongK ? 1 : kStride), ok ? s : base, ok);
            s += copy_step;
        }
    }
};
// The 4-byte copies of an operand: IndexedSlabCopies for an IndexedOperand (kIndexed), else SlabCopies.
template <bool kIndexed, bool kAlongK, int kExtent, int kSlab, int kStride, int kThreadCount>
using OperandSlabCopies = std::conditional_t<kIndexed, IndexedSlabCopies<kAlongK, kExtent, kSlab, kStride, kThreadCount>,
                                             SlabCopies<kAlongK, kExtent, kSlab, kStride, kThreadCount>>;

// An update's tile of a unit not yet learning: only its V is cleared. True when the tile is done so.
template <int BM, int BN, int kThreadCount, class P>
__device__ bool cleared_inactive(const P& p, int64_t m0, int64_t n0) {
    if constexpr (P::kUpdate) {
        if (p.inactive) {
            for (int e = threadIdx.x; e < BM * BN; e += kThreadCount) {
                const int64_t m = m0 + e / BN, n = n0 + e % BN;
                if (m < p.M && n < p.N) p.clear(m, n);
            }
            return true;
        }
    }
    return false;
}

// A warp's J accumulator fragments of 16 x 8 from row r0 and column c0: fragment j holds (g, 8j+2t),
// (g, 8j+2t+1), (g+8, 8j+2t), (g+8, 8j+2t+1) as value(j, 0..3). What finish reads of the old state is loaded
// for all of them before any is written (loads after a store to memory that may alias them each waited for
// the last: a DRAM round trip per output). kChecked: each output is checked against the matrix's extents.
template <int J, bool kChecked, class P, class F, class Value>
__device__ __forceinline__ void finish_fragments(const P& p, F fixed, int64_t r0, int64_t c0, int g, int t, Value& value) {
    typename P::Old old[J][4];
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int64_t m = r0 + g + (e >= 2 ? 8 : 0), n = c0 + 8 * j + 2 * t + e % 2;
            if (!kChecked || (m < p.M && n < p.N)) old[j][e] = p.old(m, n);
        }
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int64_t m = r0 + g + (e >= 2 ? 8 : 0), n = c0 + 8 * j + 2 * t + e % 2;
            if (!kChecked || (m < p.M && n < p.N)) p.finish(m, n, value(j, e), old[j][e], fixed);
        }
}
// A warp's outputs, G groups of J fragments from (r0 + row_step * i, c0 + col_step * i), group i's values
// value(i, j, e). Where the product asks for it (P::kFixedFinish: short sums, whose finishing is a large part
// of their instructions), its switches are compile-time constants (with_fixed: no branch per output) and a
// group inside the matrix skips the per-output checks. The W1 forward's SASS: about 35 instructions an output
// before, 15 after; engine, H100, small: that phase -4% at 64-1,024 sequences (benchmarks/NOTES.md). Elsewhere
// the checked loop as before (the W0 forward's 168 registers spilled with both, and its sums are long).
template <int G, int J, class P, class Value>
__device__ __forceinline__ void finish_tile(const P& p, int64_t r0, int64_t c0, int row_step, int col_step, int g, int t,
                                            Value&& value) {
    auto groups = [&](auto fixed) {
#pragma unroll
        for (int i = 0; i < G; ++i) {
            auto of_group = [&](int j, int e) { return value(i, j, e); };
            const int64_t r = r0 + row_step * i, c = c0 + col_step * i;
            if (P::kFixedFinish && r + 16 <= p.M && c + 8 * J <= p.N) finish_fragments<J, false>(p, fixed, r, c, g, t, of_group);
            else finish_fragments<J, true>(p, fixed, r, c, g, t, of_group);
        }
    };
    if constexpr (P::kFixedFinish) p.with_fixed(groups);
    else groups(Runtime{});
}

// The tiles are listed by the host as (unit, first m, first n), heaviest first (product_tiles).
// Launched with mma_product_shared_bytes<Shape>() of dynamic shared memory.
template <class P, class Shape = typename P::MmaTiles>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kMinBlocks)
    mma_product(StepArgs args, const int32_t* __restrict__ tiles) {
    constexpr int BM = kMmaProductRows, BN = Shape::kCols, KS = Shape::kSlab, kStages = Shape::kStages;
    constexpr int kThreadCount = Shape::kThreads, WM = Shape::kWarpsM, WN = Shape::kWarpsN;
    using M = TensorMath<ShapePrecision<Shape>::value>;
    constexpr int MT = BM / (16 * WM), NT = BN / (8 * WN);  // a warp: MT x NT fragments of 16 x 8
    static_assert(MT * 16 * WM == BM && NT * 8 * WN == BN, "whole fragments per warp");
    constexpr int kAStride = BM + 8, kBStride = BN + 8;
    static_assert(kAStride % 32 == 8 && kBStride % 32 == 8, "conflict-free fragment reads");
    static_assert(KS % 8 == 0 && BN % 32 == 0, "slabs of whole k-steps, columns of whole fragments");
    extern __shared__ __align__(16) float smem[];
    let_next_kernel_launch();
    await_prior_kernels();
    const int64_t u = tiles[3 * blockIdx.x], m0 = tiles[3 * blockIdx.x + 1], n0 = tiles[3 * blockIdx.x + 2];
    const P p(args, u);
    if (cleared_inactive<BM, BN, kThreadCount>(p, m0, n0)) return;
    const int warp = static_cast<int>(threadIdx.x / kWarp), lane = static_cast<int>(threadIdx.x % kWarp);
    const int g = lane / 4, t = lane % 4;
    const int wm = 16 * MT * (warp % WM), wn = 8 * NT * (warp / WM);  // the warp's first row and column in the tile
    bool live[MT];  // the warp's row fragments that hold rows of the matrix (warp-uniform)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) live[mt] = m0 + wm + 16 * mt < p.M;

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

    float acc[MT][NT][4] = {};  // (row g, column 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1) of fragment (mt, j)
    for (int i = 0; i < kStages - 1; ++i) fetch(i);
    const int prefetch_at = n_slabs > kPrefetchK / KS ? n_slabs - kPrefetchK / KS : 0;
    for (int i = 0; i < n_slabs; ++i) {
        copy_async_wait<kStages - 2>();  // slab i has landed (this thread's copies) ...
        __syncthreads();                 // ... and every thread's; all are done with slab i-1's stage
        fetch(i + kStages - 1);
        if constexpr (P::kUpdate)
            if (i == prefetch_at) p.prefetch_old(m0, n0, BM, BN);
        const float* As = smem + (i % kStages) * mma_product_stage_floats<Shape>();
        const float* Bs = As + KS * kAStride;
#pragma unroll
        for (int kk = 0; kk < KS; kk += 8) {
            // A (16 x 8, row-major): (g, k0), (g+8, k0), (g, k1), (g+8, k1); B (8 x 8): (k0, g), (k1, g), where
            // (k0, k1) = (t, t+4) in TF32's layout and (2t, 2t+1) in BF16's.
            const int k0 = kk + M::k0(t), k1 = kk + M::k1(t);
            // The swizzle takes k in groups of 4: TF32's k0 and k1 lie in the groups of kk and kk + 4, constants of
            // the unrolled loop (swizzle(k0) computed from t cost the W0 forward 3.5% at 256 sequences); BF16's
            // depend on t.
            const int z0 = M::kBf16 ? k0 : kk, z1 = M::kBf16 ? k1 : kk + 4;
            typename M::A af[MT];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                float v[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int k = e >= 2 ? k1 : k0, m = wm + 16 * mt + (e % 2 == 1 ? 8 : 0);
                    const float av = As[k * kAStride + m + (g ^ ACopies::swizzle(e >= 2 ? z1 : z0))];
                    v[e] = P::kScaleA ? __fmul_rn(p.a_scale, av) : av;
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
                    if (SkipsDeadRows<Shape>::value && !live[mt]) continue;
                    M::mma(acc[mt][j], af[mt], bf);  // (3xTF32: the small terms first, then hi*hi)
                }
            }
        }
    }
    // The outputs, a row fragment at a time.
    finish_tile<MT, NT>(p, m0 + wm, n0 + wn, 16, 0, g, t, [&](int mt, int j, int e) { return acc[mt][j][e]; });
}

}  // namespace kernels
}  // namespace pvm
