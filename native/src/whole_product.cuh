// A per-unit product whose whole K fits one copy: the W1 forward (K = a unit's hidden entries and its constant 1,
// 50 in every zoo spec), y(s)[q, j] = phi(sum_k W1[j, k] h(s)[q, k]), on 3xTF32 mma.sync as mma_product computes it.
// Why: mma_product streams K in slabs of 8 through 4 stages with a 4-byte cp.async per entry (W1's rows and h's
// segments start anywhere in 16 bytes). For K = 50 that is 7 slab trips of copies, predicates, waits and barriers
// around 12 HMMA a warp each; Nsight Compute had the kernel at the issue limit, mostly integer work, with 45% of its
// global sectors in excess (benchmarks/NOTES.md). Here a block copies each of its 64 rows of A and of B once, as the
// aligned 16-byte chunks that cover the row, waits once, and runs every k-step from shared memory; other resident
// blocks cover the copies' latency.
// A row's entries lie in its shared row from its phase d (its first entry's index mod 4). Fragment reads are
// conflict-free when the 8 rows a read touches share a phase (rows kPitch = 28 mod 32 floats apart): where the rows'
// pitch in memory is 2 mod 4 (W1's 50 entries, h's h_total), a tile's rows of each parity are grouped (a fragment's
// rows g and g + 8 are the tile's rows 2g and 2g + 1), so each read stays within one phase.
// Deterministic: each output is one warp's fixed sequence of mma steps over k, the same for every tile.
#pragma once

#include <cstdint>
#include <type_traits>

#include "mma_products.cuh"

namespace pvm {
namespace kernels {

template <class S>
struct IsWholeShape : std::false_type {};
template <int C, int K, int B, int WM, int WN>
struct IsWholeShape<WholeShape<C, K, B, WM, WN>> : std::true_type {};
template <class S, Precision P>
struct IsWholeShape<InPrecision<S, P>> : IsWholeShape<S> {};

template <class S>
__host__ __device__ constexpr int whole_product_floats() { return (kMmaProductRows + S::kCols) * S::kPitch; }
template <class S>
__host__ __device__ constexpr size_t whole_product_shared_bytes() { return sizeof(float) * whole_product_floats<S>(); }

// The shared row of a tile's row r (0-63): with pairs, each 16 rows as their 8 even rows, then their 8 odd ones.
__device__ __forceinline__ int whole_slot(int r, bool pairs) { return pairs ? (r & ~15) + 8 * (r & 1) + (r & 15) / 2 : r; }
// The tile's row in shared row s (whole_slot's inverse).
__device__ __forceinline__ int whole_row(int s, bool pairs) { return pairs ? (s & ~15) + 2 * (s & 7) + (s & 15) / 8 : s; }

// The rows x0..x0 + R - 1 of an along-k operand into shared rows of kPitch floats, each from its phase. The threads
// of a block take 16 rows at a time, kThreads / 16 to a row, and a thread the same chunks of rows r0, r0 + 16, ...:
// those rows share their phase, and their shared rows lie 16 apart under whole_slot. Chunks wholly past K and rows
// past X are not copied (what the block reads there it zeroes or does not store). Reads up to 3 floats before a row
// and past its end: the operands' allocations carry that much slack.
template <class S, int R>
__device__ __forceinline__ void copy_whole_rows(float* rows, const Operand& op, int64_t x0, int64_t K, int64_t X, bool pairs) {
    constexpr int kPerRow = S::kThreads / 16, kChunksEach = (S::kChunks + kPerRow - 1) / kPerRow;
    static_assert(S::kThreads % 16 == 0 && R % 16 == 0, "16 rows at a time");
    const int r0 = static_cast<int>(threadIdx.x) / kPerRow, c0 = static_cast<int>(threadIdx.x) % kPerRow;
    const float* row = op.at(0, x0 + r0);
    const int d = float_phase(row);
    const float* src = row - d + 4 * c0;
    float* dst = rows + whole_slot(r0, pairs) * S::kPitch + 4 * c0;
    const int64_t rows_left = X - x0 - r0;
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int c = 0; c < kChunksEach; ++c)
            copy_async16_if(dst + i * 16 * S::kPitch + 4 * kPerRow * c, src + i * 16 * op.sx + 4 * kPerRow * c,
                            16 * i < rows_left && 4 * (c0 + kPerRow * c) < d + K);
}

// f(std::integral_constant<int, n>{}) for 0 <= n <= N.
template <int N, class F>
__device__ __forceinline__ void by_count(int n, F&& f) {
    if constexpr (N > 0)
        if (n < N) return by_count<N - 1>(n, f);
    f(std::integral_constant<int, N>{});
}

// The tiles are listed by the host as (unit, first m, first n), heaviest first (product_tiles), as for mma_product.
// Launched with whole_product_shared_bytes<Shape>() of dynamic shared memory. P's K must be at most Shape::kMaxK.
template <class P, class Shape>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kMinBlocks)
    whole_product(StepArgs args, const int32_t* __restrict__ tiles) {
    static_assert(P::kAAlongK && P::kBAlongK && !P::kBIndexed && !P::kUpdate && !P::kScaleA, "a forward product of rows");
    // (P's outputs through out_of and finish_in, as Forward has them)
    constexpr int BM = kMmaProductRows, BN = Shape::kCols, WM = Shape::kWarpsM, WN = Shape::kWarpsN, kPitch = Shape::kPitch;
    using M = TensorMath<ShapePrecision<Shape>::value>;
    constexpr int MT = BM / (16 * WM), NT = BN / (8 * WN);  // a warp: MT x NT fragments of 16 x 8
    static_assert(MT * 16 * WM == BM && NT * 8 * WN == BN && NT % 2 == 0, "whole fragments per warp, in pairs of columns");
    extern __shared__ __align__(16) float smem[];
    let_next_kernel_launch();
    await_prior_kernels();
    const int64_t u = tiles[3 * blockIdx.x], m0 = tiles[3 * blockIdx.x + 1], n0 = tiles[3 * blockIdx.x + 2];
    const P p(args, u);
    float* As = smem;
    float* Bs = smem + BM * kPitch;
    const bool a_pairs = (p.A.sx & 3) == 2, b_pairs = (p.B.sx & 3) == 2;
    copy_whole_rows<Shape, BM>(As, p.A, m0, p.K, p.M, a_pairs);
    copy_whole_rows<Shape, BN>(Bs, p.B, n0, p.K, p.N, b_pairs);
    copy_async_commit();

    const int warp = static_cast<int>(threadIdx.x / kWarp), lane = static_cast<int>(threadIdx.x % kWarp);
    const int g = lane / 4, t = lane % 4;
    const int wm = 16 * MT * (warp % WM), wn = 8 * NT * (warp / WM);  // the warp's first shared row of A and of B
    // Where this lane's fragment rows start in shared memory, each from its row's phase.
    const int a_d0 = float_phase(p.A.at(0, m0)), a_sx = static_cast<int>(p.A.sx & 3);
    const int b_d0 = float_phase(p.B.at(0, n0)), b_sx = static_cast<int>(p.B.sx & 3);
    int a_at[MT][2], b_at[NT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int s = wm + 16 * mt + g + 8 * h;
            a_at[mt][h] = s * kPitch + ((a_d0 + whole_row(s, a_pairs) * a_sx) & 3);
        }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int s = wn + 8 * j + g;
        b_at[j] = s * kPitch + ((b_d0 + whole_row(s, b_pairs) * b_sx) & 3);
    }
    const int K = static_cast<int>(p.K);
    copy_async_wait<0>();
    __syncthreads();

    float acc[MT][NT][4] = {};
    // k-step kk; in the last, partial one (kTail) entries past K are read as zeros (past a row's chunks shared
    // memory holds anything).
    auto k_step = [&](int kk, auto tail) {
        constexpr bool kTail = decltype(tail)::value;
        const int k0 = kk + M::k0(t), k1 = kk + M::k1(t);
        typename M::A af[MT];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            float v[4] = {As[a_at[mt][0] + k0], As[a_at[mt][1] + k0], As[a_at[mt][0] + k1], As[a_at[mt][1] + k1]};
            if constexpr (kTail) {
#pragma unroll
                for (int e = 0; e < 4; ++e) v[e] = (e >= 2 ? k1 : k0) < K ? v[e] : 0.0f;
            }
            af[mt] = M::a(v[0], v[1], v[2], v[3]);
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            float b0 = Bs[b_at[j] + k0], b1 = Bs[b_at[j] + k1];
            if constexpr (kTail) {
                b0 = k0 < K ? b0 : 0.0f;
                b1 = k1 < K ? b1 : 0.0f;
            }
            const typename M::B bf = M::b(b0, b1);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) M::mma(acc[mt][j], af[mt], bf);
        }
    };
    const int full = K / 8;
    // The whole k-steps as one straight run for their count (a run under a branch per step had each step recompute
    // its lanes' shared addresses: about a third more instructions).
    auto steps = [&](auto count) {
#pragma unroll
        for (int s = 0; s < decltype(count)::value; ++s) k_step(8 * s, std::false_type{});
    };
    by_count<Shape::kMaxK / 8>(full, steps);
    if (K % 8 != 0) k_step(8 * full, std::true_type{});

    // The outputs: fragment (mt, j)'s entry e is shared row wm + 16 mt + g (+ 8 for e >= 2) of A by shared row
    // wn + 8 j + 2t + e % 2 of B, each the tile's row whole_row gives (recomputed here: kept live from the phases above,
    // the rows cost registers and the 2 x 4 shape spilled). A tile inside the matrix skips the checks.
    int64_t m_of[MT][2], n_of[NT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) m_of[mt][h] = m0 + whole_row(wm + 16 * mt + g + 8 * h, a_pairs);
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) n_of[j][c] = n0 + whole_row(wn + 8 * j + 2 * t + c, b_pairs);
    float* column[NT][2];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) column[j][c] = p.out_of(n_of[j][c]);
    auto outputs = [&](auto fixed) {
        auto all = [&](auto checked) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int64_t m = m_of[mt][e / 2], n = n_of[j][e % 2];
                        if (!decltype(checked)::value || (m < p.M && n < p.N)) p.finish_in(column[j][e % 2], m, acc[mt][j][e], fixed);
                    }
        };
        if (m0 + BM <= p.M && n0 + BN <= p.N) all(std::false_type{});
        else all(std::true_type{});
    };
    if constexpr (P::kFixedFinish) p.with_fixed(outputs);
    else outputs(Runtime{});
}

}  // namespace kernels
}  // namespace pvm
