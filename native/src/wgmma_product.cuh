// The per-unit products of unit_products.cuh on Hopper's warpgroup tensor-core instruction
// (wgmma.mma_async m64nNk8, TF32, sm_90a), 3xTF32 as mma_product (mma_products.cuh) computes them:
//   C[m, n] = sum_k A[k, m] B[k, n]   as   lo(A) hi(B) + hi(A) lo(B) + hi(A) hi(B).
// One warpgroup (4 warps) computes a 64 x kCols tile; warp w holds rows 16w..16w+15 of C (kCols / 8
// fragments of 16 x 8, the m16n8 accumulator layout).
// Why: mma.sync splits an operand value in every warp that reads it and issues 48 mma per warp and
// k-step; here every value is split once per block, and a k-step is 3 instructions for the warpgroup.
// The sums are bit-identical to mma_product's. Measured (dev/cuda/mma_products.cu, H100): ahead for W0's
// update (8-deep slabs, 5 stages: 286 against 314 us at 256 sequences, 227 against 269 at 128) until
// mma_product prefetched the update's old W and V (H200: 259.7 against 279.7 at 256). For W0's
// forward the 4-byte copies of unaligned rows and the per-value split, not the multiplies, set the pace
// (265 against 259 us at 256); window copies (WindowCopies: 16-byte chunks) put it ahead (247 against 266
// at 256) until x was gathered from the step's sources, which has no rows to window: W0's forward is on
// mma_product again (unit_products.cuh; benchmarks/NOTES.md).
// k advances in slabs of kSlab through kStages raw stages (cp.async, [k][x] as mma_product stages them).
// Each slab is split into hi and lo tiles of A and B in the layout wgmma reads (K-major, no swizzle: core
// matrices of 8 rows x 4 k, 16-byte rows), in two buffers: the split of slab i+1 runs while the tensor
// cores multiply slab i.
#pragma once

#include <cstdint>
#include <type_traits>

#include "fma_product.cuh"
#include "mma_products.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || (defined(__CUDA_ARCH_SPECIFIC__) && __CUDA_ARCH_SPECIFIC__ == 900)
#define PVM_WGMMA 1
#else
#define PVM_WGMMA 0
#endif

namespace pvm {
namespace kernels {

// A raw stage: both operands' [k][x] slabs, or with window copies each operand's rows: [x][k] rows of kSlab + 4
// floats along k (WindowCopies), [k][x] rows of X + 4 along x (RowWindowCopies); room for either.
__host__ __device__ constexpr int wgmma_window_floats(int X, int slab) {
    return X * (slab + 4) > slab * (X + 4) ? X * (slab + 4) : slab * (X + 4);
}
template <class S>
__host__ __device__ constexpr int wgmma_raw_stage_floats() {
    return S::kWindow ? wgmma_window_floats(kMmaProductRows, S::kSlab) + wgmma_window_floats(S::kCols, S::kSlab)
                      : S::kSlab * (kMmaProductRows + 8 + S::kCols + 8);
}

// The 16-byte copies both window layouts issue: this thread's chunk c from src[c] (at slab 0) into stage +
// dst[c], step floats further on per slab, zeros where its k (k0[c] at slab 0) is past K or the chunk lies
// outside the matrix (bit c of inside clear).
template <int kChunks, int kSlab, int kThreadCount>
struct ChunkCopies {
    static constexpr int kCopies = (kChunks + kThreadCount - 1) / kThreadCount;
    const float* base;
    const float* src[kCopies];
    int k0[kCopies];
    int dst[kCopies];
    uint32_t inside = 0;
    int64_t K;
    __device__ ChunkCopies(const float* base_, int64_t K_) : base(base_), K(K_) {}
    __device__ void copy_chunks(float* stage, int64_t i, int64_t step) const {
#pragma unroll
        for (int c = 0; c < kCopies; ++c) {
            if (kChunks % kThreadCount != 0 && static_cast<int>(threadIdx.x) + c * kThreadCount >= kChunks) continue;
            const bool ok = ((inside >> c) & 1u) && i * kSlab + k0[c] < K;
            copy_async16(stage + dst[c], ok ? src[c] + i * step : base, ok);
        }
    }
};
// Slab i of an along-k operand's rows x0.. as the kSlab / 4 + 1 aligned 16-byte chunks that cover each row's
// slab, whatever the row's offset d (its first entry's index mod 4): [x][k] rows of kSlab + 4 floats, row x's
// slab from float d. Rows past X and chunks wholly past K are zeros; what a chunk holds past K (the next
// row's entries) the split zeroes. Reads up to 3 floats before a row and past its end: the operands'
// allocations carry that much slack. Why: a 4-byte cp.async per entry was most of the products' instructions
// (benchmarks/NOTES.md); this moves 16 bytes per copy without padding W0's rows or x's segments.
template <int kExtent, int kSlab, int kThreadCount>
struct WindowCopies : ChunkCopies<kExtent * (kSlab / 4 + 1), kSlab, kThreadCount> {
    static constexpr int kPerRow = kSlab / 4 + 1, kStride = 4 * kPerRow, kChunks = kExtent * kPerRow;
    using Chunks = ChunkCopies<kChunks, kSlab, kThreadCount>;
    using Chunks::kCopies, Chunks::src, Chunks::k0, Chunks::dst, Chunks::inside;
    __device__ WindowCopies(const Operand& op, int64_t x0, int64_t K_, int64_t X) : Chunks(op.base, K_) {
#pragma unroll
        for (int c = 0; c < kCopies; ++c) {
            const int e = static_cast<int>(threadIdx.x) + c * kThreadCount, row = e / kPerRow, j = e % kPerRow;
            const bool ok = e < kChunks && x0 + row < X;
            k0[c] = 4 * j - (ok ? float_phase(op.at(0, x0 + row)) : 0);  // the chunk's first k: -3..kSlab
            src[c] = ok ? op.at(0, x0 + row) + k0[c] : op.base;
            dst[c] = row * kStride + 4 * j;
            if (ok) inside |= 1u << c;
        }
    }
    __device__ void copy(float* stage, int64_t i) const { this->copy_chunks(stage, i, kSlab); }
};
// Slab i of an operand along x (consecutive x adjacent) as the kExtent / 4 + 1 aligned 16-byte chunks that
// cover each k-row's x0..x0 + kExtent - 1, whatever the row's offset d(k): [k][x] rows of kExtent + 4 floats,
// row k's entries from float d(k), the same in every slab (kSlab rows move a multiple of 4 floats). Rows
// past K and chunks wholly past X are zeros; a chunk that crosses X holds whatever follows in memory, which
// reaches only outputs past X (not stored). Reads up to 3 floats before a row's first and past its last
// entry: the allocations carry that much slack.
template <int kExtent, int kSlab, int kThreadCount>
struct RowWindowCopies : ChunkCopies<kSlab * (kExtent / 4 + 1), kSlab, kThreadCount> {
    static constexpr int kPerRow = kExtent / 4 + 1, kStride = 4 * kPerRow, kChunks = kSlab * kPerRow;
    static_assert(kSlab % 4 == 0, "d(k) the same in every slab");
    using Chunks = ChunkCopies<kChunks, kSlab, kThreadCount>;
    using Chunks::kCopies, Chunks::src, Chunks::k0, Chunks::dst, Chunks::inside;
    int64_t slab_step;
    __device__ RowWindowCopies(const Operand& op, int64_t x0, int64_t K_, int64_t X) : Chunks(op.base, K_), slab_step(kSlab * op.sk) {
#pragma unroll
        for (int c = 0; c < kCopies; ++c) {
            const int e = static_cast<int>(threadIdx.x) + c * kThreadCount, k = e / kPerRow, j = e % kPerRow;
            const int d = e < kChunks ? float_phase(op.at(k, x0)) : 0;
            const bool ok = e < kChunks && x0 + 4 * j - d < X;
            src[c] = ok ? op.at(k, x0) - d + 4 * j : op.base;
            k0[c] = k;  // the chunk's row
            dst[c] = k * kStride + 4 * j;
            if (ok) inside |= 1u << c;
        }
    }
    __device__ void copy(float* stage, int64_t i) const { this->copy_chunks(stage, i, slab_step); }
};

template <class C>
struct IsRowWindow : std::false_type {};
template <int E, int S, int T>
struct IsRowWindow<RowWindowCopies<E, S, T>> : std::true_type {};
template <class C>
struct IsWindow : std::false_type {};
template <int E, int S, int T>
struct IsWindow<WindowCopies<E, S, T>> : std::true_type {};

// The copies of one operand of wgmma_product: 4-byte OperandSlabCopies, or with window copies (kWindow) 16-byte
// WindowCopies along k or RowWindowCopies along x (an IndexedOperand has no rows to window).
template <bool kWindow, bool kIndexed, bool kAlongK, int X, int KS, int kThreadCount>
struct WgmmaCopies {
    static_assert(!(kWindow && kIndexed), "a gathered operand takes 4-byte copies");
    using type = std::conditional_t<!kWindow, OperandSlabCopies<kIndexed, kAlongK, X, KS, X + 8, kThreadCount>,
                                    std::conditional_t<kAlongK, WindowCopies<X, KS, kThreadCount>, RowWindowCopies<X, KS, kThreadCount>>>;
};

template <class S>  // one buffer of split tiles: hi and lo of A (64 rows) and B (kCols rows)
__host__ __device__ constexpr int wgmma_split_floats() { return 2 * S::kSlab * (kMmaProductRows + S::kCols); }
template <class S>
__host__ __device__ constexpr size_t wgmma_product_shared_bytes() {
    return sizeof(float) * (S::kStages * wgmma_raw_stage_floats<S>() + 2 * wgmma_split_floats<S>());
}

#if PVM_WGMMA
// A shared-memory matrix descriptor, no swizzle: start, leading (K) and stride (N) byte offsets of core matrices.
__device__ __forceinline__ uint64_t wgmma_descriptor(const float* start, uint32_t k_bytes, uint32_t n_bytes) {
    const uint64_t address = static_cast<uint64_t>(__cvta_generic_to_shared(start));
    return ((address & 0x3ffff) >> 4) | (static_cast<uint64_t>(k_bytes >> 4) << 16) |
           (static_cast<uint64_t>(n_bytes >> 4) << 32);
}

template <int N>
struct Wgmma;

// d (64 x 128, this thread's 64 floats) += A B, both from shared memory (descriptors), TF32.
template <>
struct Wgmma<128> {
    __device__ static void run(float (&d)[64], uint64_t a, uint64_t b) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
            "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
            "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
            "%64, %65, p, 1, 1;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "l"(a), "l"(b));
    }
};

// d (64 x 64, this thread's 32 floats) += A B, both from shared memory (descriptors), TF32.
template <>
struct Wgmma<64> {
    __device__ static void run(float (&d)[32], uint64_t a, uint64_t b) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
            "%32, %33, p, 1, 1;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "l"(a), "l"(b));
    }
};

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
#endif

template <class P, class Shape>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kMinBlocks)
    wgmma_product(StepArgs args, const int32_t* __restrict__ tiles) {
#if PVM_WGMMA
    constexpr int BM = kMmaProductRows, BN = Shape::kCols, KS = Shape::kSlab, kStages = Shape::kStages;
    constexpr int kThreadCount = Shape::kThreads, NT = BN / 8;
    constexpr int kAStride = BM + 8, kBStride = BN + 8;
    static_assert(KS % 8 == 0 && (BN == 64 || BN == 128) && kStages >= 3, "slabs of whole k-steps; the instruction widths below");
    // The split buffers first, then the raw stages. A buffer: A hi, A lo, B hi, B lo, each [k / 4][x][4]
    // (x = m or n): 16-byte core-matrix rows, core matrices 128 bytes apart along x and x * 16 bytes apart
    // along k. (Addressed from the array itself: a pointer rounded through an integer lost the shared
    // space, and every access became a generic load or store.)
    extern __shared__ __align__(16) float smem[];  // 16-byte aligned: enough for descriptors without swizzle
    float* stages = smem + 2 * wgmma_split_floats<Shape>();
    let_next_kernel_launch();
    await_prior_kernels();
    const int64_t u = tiles[3 * blockIdx.x], m0 = tiles[3 * blockIdx.x + 1], n0 = tiles[3 * blockIdx.x + 2];
    const P p(args, u);
    if (cleared_inactive<BM, BN, kThreadCount>(p, m0, n0)) return;
    const int warp = static_cast<int>(threadIdx.x / kWarp), lane = static_cast<int>(threadIdx.x % kWarp);
    const int g = lane / 4, t = lane % 4;
    const int wm = 16 * warp;

    constexpr bool kWin = Shape::kWindow;
    using ACopies = typename WgmmaCopies<kWin, false, P::kAAlongK, BM, KS, kThreadCount>::type;
    using BCopies = typename WgmmaCopies<kWin, P::kBIndexed, P::kBAlongK, BN, KS, kThreadCount>::type;
    static_assert(kAStride == BM + 8 && kBStride == BN + 8, "SlabCopies' rows as WgmmaCopies gives them");
    constexpr int kBOffset = !kWin ? KS * kAStride : P::kAAlongK ? BM * (KS + 4) : KS * (BM + 4);  // B's raw slab in a stage
    const ACopies a_copies(p.A, m0, p.K, p.M);
    const BCopies b_copies(p.B, n0, p.K, p.N);
    const int64_t n_slabs = (p.K + KS - 1) / KS;
    auto fetch = [&](int64_t i) {
        if (i < n_slabs) {
            float* As = stages + (i % kStages) * wgmma_raw_stage_floats<Shape>();
            a_copies.copy(As, i);
            b_copies.copy(As + kBOffset, i);
        }
        copy_async_commit();
    };
    // Raw slab i into split buffer i % 2: a thread takes 4 consecutive k of one row x (one 16-byte row of a
    // core matrix) and writes two 16-byte words. From [k][x] stages it reads 4 conflict-free words; from
    // window stages ([x][k], the row's slab from float d) two 16-byte words, shifted by d with selects, and in
    // the last slab it zeroes what lies past K.
    auto split_slab = [&](int64_t i) {
        const float* As = stages + (i % kStages) * wgmma_raw_stage_floats<Shape>();
        float* buf = smem + (i % 2) * wgmma_split_floats<Shape>();
        const bool last = (i + 1) * KS > p.K;
        const int64_t k_left = p.K - i * KS;
        auto rows = [&](auto copies, const float* raw, int stride, int X, float* hi, float* lo, bool scale, const auto& op,
                        int64_t x0) {
            constexpr bool kAlongX = IsRowWindow<decltype(copies)>::value, kAlongK = IsWindow<decltype(copies)>::value;
            // Along k: the phase of this thread's row x (X divides the block). Along x: row 0's phase, and
            // how a row's phase moves from one k to the next (sk mod 4).
            [[maybe_unused]] int d = 0, d_step = 0;
            if constexpr (kAlongX || kAlongK) d = float_phase(op.at(0, x0 + (kAlongX ? 0 : static_cast<int>(threadIdx.x) % X)));
            if constexpr (kAlongX) d_step = static_cast<int>(op.sk & 3);
#pragma unroll
            for (int r = 0; r < KS / 4 * X / kThreadCount; ++r) {
                const int e = static_cast<int>(threadIdx.x) + r * kThreadCount, x = e % X, kg = e / X;
                float v[4];
                if constexpr (kAlongX) {
#pragma unroll
                    for (int c = 0; c < 4; ++c) v[c] = raw[(4 * kg + c) * (X + 4) + x + ((d + (4 * kg + c) * d_step) & 3)];
                } else if constexpr (kAlongK) {
                    const float4 a = *reinterpret_cast<const float4*>(raw + x * (KS + 4) + 4 * kg);
                    const float4 b = *reinterpret_cast<const float4*>(raw + x * (KS + 4) + 4 * kg + 4);
                    const float t8[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                    float t6[6];
#pragma unroll
                    for (int c = 0; c < 6; ++c) t6[c] = (d & 2) ? t8[c + 2] : t8[c];
#pragma unroll
                    for (int c = 0; c < 4; ++c) v[c] = (d & 1) ? t6[c + 1] : t6[c];
                    if (last) {
#pragma unroll
                        for (int c = 0; c < 4; ++c) v[c] = 4 * kg + c < k_left ? v[c] : 0.0f;
                    }
                } else {
#pragma unroll
                    for (int c = 0; c < 4; ++c) v[c] = raw[(4 * kg + c) * stride + (x ^ decltype(copies)::swizzle(4 * kg))];
                }
                uint32_t h[4], l[4];
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const Split sp = split(scale ? __fmul_rn(p.a_scale, v[c]) : v[c]);
                    h[c] = sp.hi;
                    l[c] = sp.lo;
                }
                *reinterpret_cast<uint4*>(hi + (kg * X + x) * 4) = make_uint4(h[0], h[1], h[2], h[3]);
                *reinterpret_cast<uint4*>(lo + (kg * X + x) * 4) = make_uint4(l[0], l[1], l[2], l[3]);
            }
        };
        rows(a_copies, As, kAStride, BM, buf, buf + KS * BM, P::kScaleA, p.A, m0);
        rows(b_copies, As + kBOffset, kBStride, BN, buf + 2 * KS * BM, buf + 2 * KS * BM + KS * BN, false, p.B, n0);
        fence_async_shared();  // the tensor cores read what these stores wrote
    };

    float acc[NT * 4] = {};
    for (int i = 0; i < kStages - 1; ++i) fetch(i);
    copy_async_wait<kStages - 2>();
    __syncthreads();
    split_slab(0);
    __syncthreads();
    for (int64_t i = 0; i < n_slabs; ++i) {
        const float* buf = smem + (i % 2) * wgmma_split_floats<Shape>();
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < KS / 8; ++ks) {
            const float* a = buf + ks * 2 * BM * 4;
            const float* b = buf + 2 * KS * BM + ks * 2 * BN * 4;
            const uint64_t a_hi = wgmma_descriptor(a, BM * 16, 128), a_lo = wgmma_descriptor(a + KS * BM, BM * 16, 128);
            const uint64_t b_hi = wgmma_descriptor(b, BN * 16, 128), b_lo = wgmma_descriptor(b + KS * BN, BN * 16, 128);
            Wgmma<BN>::run(acc, a_lo, b_hi);  // the small terms first, then hi*hi
            Wgmma<BN>::run(acc, a_hi, b_lo);
            Wgmma<BN>::run(acc, a_hi, b_hi);
        }
        wgmma_commit();
        if (i + 1 < n_slabs) {
            copy_async_wait<kStages - 3>();  // slab i+1 has landed (this thread's copies)
            wgmma_wait<1>();                 // this warp's products of slab i-1 are done
            __syncthreads();                 // every thread's copies and every warp's products: buffer (i+1) % 2 is free
            fetch(i + kStages - 1);          // into slab i-1's stage (split in iteration i-2)
            split_slab(i + 1);
            __syncthreads();                 // slab i+1's tiles are written
        }
    }
    wgmma_wait<0>();
    // The outputs: 4 fragments of 16 x 8 at a time (finish_fragments, as mma_product finishes).
    finish_tile<NT / 4, 4>(p, m0 + wm, n0, 0, 32, g, t, [&](int i, int j, int e) { return acc[4 * (4 * i + j) + e]; });
#endif
}

// 1 where this binary holds the kernel above (compiled for sm_90a), else 0.
__global__ void wgmma_built(int* out) { *out = PVM_WGMMA; }

// Whether this binary holds wgmma_product's code for the current device, asked with a one-thread launch (the
// engine once, the workbench once); CUDA's error, if any, is returned.
inline cudaError_t query_wgmma_built(bool& built) {
    int* d = nullptr;
    int h = 0;
    cudaError_t e = cudaMalloc(&d, sizeof(int));
    if (e != cudaSuccess) return e;
    wgmma_built<<<1, 1>>>(d);
    e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
    cudaFree(d);
    built = h == 1;
    return e;
}

// The kernel of product P under tile shape S (mma_product, wgmma_product or fma_product) and its shared memory.
template <class S>
struct IsWgmmaShape : std::false_type {};
template <int C, int K, int St, int B, bool W>
struct IsWgmmaShape<WgmmaShape<C, K, St, B, W>> : std::true_type {};
template <class P, class S>
constexpr auto product_kernel() {
    if constexpr (IsWgmmaShape<S>::value) return wgmma_product<P, S>;
    else if constexpr (IsFmaShape<S>::value) return fma_product<P, S>;
    else return mma_product<P, S>;
}
template <class S>
constexpr size_t product_shared_bytes() {
    if constexpr (IsWgmmaShape<S>::value) return wgmma_product_shared_bytes<S>();
    else return mma_product_shared_bytes<S>();
}

}  // namespace kernels
}  // namespace pvm
