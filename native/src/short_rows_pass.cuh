// The W1 pass on tensor cores for short rows (W1 outside feed-context mode: H+1 <= 50 entries), 2 to 64 sequences
// (the engine takes it from 2 to 32; below 5 in 3xTF32 whatever the precision mode).
// weight_pass_mma streams a block's rows along their columns; with 50-entry rows a block there had two chunks,
// so every block was one exposed load, compute and store, in about five waves (small's W1 pass at 16 sequences:
// 44 us on an H200, 30% of the copy rate). Here resident blocks walk 64-row tiles instead: tile i+1's W, V,
// inputs and delta_out are in flight while tile i is computed and written back.
// A tile is up to 64 rows of one unit, a warp per 16 rows, each warp over every column of its rows (at most
// kShortSteps 8-column k-steps), so the forward sums need no combining between warps. A unit's W1 rows are
// contiguous, so a tile's W and V are one span each, copied and written back as 16-byte groups and staged packed
// (element (r, c) at the span's phase + r len + c). The arithmetic is weight_pass_mma's (TensorMath<P>, the same
// fragment layout: a lane holds W at rows g, g+8 and columns 2t, 2t+1 of each k-step, the update's accumulator
// and the forward's A operand at once).
#pragma once

#include <vector>

#include "mma_pass.cuh"

namespace pvm {
namespace kernels {

constexpr int kShortWarps = 4, kShortThreads = kShortWarps * kWarp;  // 128
constexpr int kShortRows = 16 * kShortWarps;                          // rows per tile
constexpr int kShortMaxLen = 50;                                      // entries per row (H+1 for H <= 49)
constexpr int kShortSteps = (kShortMaxLen + 7) / 8;                   // 8-column k-steps
// Inputs staged 56 floats apart (= 24 mod 32 banks: the forward's float2 reads at rows g, columns 2t and the
// update's at rows t, column g fall in distinct banks), zero past the row's end.
constexpr int kShortXStride = 8 * kShortSteps;
constexpr int kShortSpan = kShortRows * kShortMaxLen + 4;  // a tile's W (or V) span from its 16-byte group on
static_assert(kShortSpan % 4 == 0, "16-byte staging");
constexpr int kShortStages = 2;
// A stage: W's span, V's span, x(s) and x(s-2) of every sequence ([sequence][column]), delta_out ([row][sequence],
// rows NS + 4 apart: conflict-free A fragments), then the tile's lr and mu and the record of the block's tile after
// next (kShortMetaFloats). The tile records and rates come through the stages so that no trip waits on a load.
template <int NS>
__host__ __device__ constexpr int short_delta_at(int row, int q) { return row * (NS + 4) + q; }
constexpr int kShortMetaFloats = 12;  // lr, mu, 2 spare, then a record (16-byte aligned)
template <int NS>
__host__ __device__ constexpr int short_meta_at() { return 2 * kShortSpan + 2 * NS * kShortXStride + kShortRows * (NS + 4); }
template <int NS>
__host__ __device__ constexpr int short_stage_floats() { return short_meta_at<NS>() + kShortMetaFloats; }
static_assert(kShortXStride % 4 == 0, "the meta floats 16-byte aligned");
template <int NS>
__host__ __device__ constexpr size_t short_shared_bytes() { return sizeof(float) * kShortStages * short_stage_floats<NS>(); }

// A tile's record, kShortTileInts int64 each: W1's offset of its first row (in W), its first output row, its unit's
// offset in h, and unit | rows << 32 | len << 48. One 32-byte load per tile, no dependent lookups.
constexpr int kShortTileInts = 4;
// Appends the record of unit u's rows [r0, r0 + rows) to out (short_tile reads it back).
inline void append_short_tile(std::vector<int64_t>& out, int64_t u, int64_t r0, int64_t rows, const std::vector<int64_t>& w1_off,
                              const std::vector<int64_t>& y_off, const std::vector<int64_t>& h_off) {
    const int64_t len = h_off[u + 1] - h_off[u];
    out.insert(out.end(), {w1_off[u] + r0 * len, y_off[u] + r0, h_off[u], u | rows << 32 | len << 48});
}
// The records of W1's rows in tiles of at most kShortRows (runs as mma_blocks makes them, unsplit: its list of
// kMmaBlockInts per block), from the device offsets of W1 (w1_off), the outputs (y_off) and h (h_off).
inline std::vector<int64_t> short_tiles(const std::vector<int32_t>& runs, const std::vector<int64_t>& w1_off,
                                        const std::vector<int64_t>& y_off, const std::vector<int64_t>& h_off) {
    std::vector<int64_t> out;
    for (size_t i = 0; i + kMmaBlockInts <= runs.size(); i += kMmaBlockInts)
        append_short_tile(out, runs[i], runs[i + 1], runs[i + 2] - runs[i + 1], w1_off, y_off, h_off);
    return out;
}
struct ShortTile {
    int64_t w = 0, y = 0, h = 0;
    int unit = 0, rows = 0, len = 0;
};
// A record (kShortTileInts int64 at p, global or shared); rows 0 for none.
__device__ __forceinline__ ShortTile short_tile(const int64_t* p) {
    ShortTile t;
    const longlong2 a = reinterpret_cast<const longlong2*>(p)[0], b = reinterpret_cast<const longlong2*>(p)[1];
    t.w = a.x, t.y = a.y, t.h = b.x;
    t.unit = static_cast<int>(b.y & 0xffffffff), t.rows = static_cast<int>((b.y >> 32) & 0xffff), t.len = static_cast<int>(b.y >> 48);
    return t;
}

// W1's pass over the tiles listed (short_tiles, rows of at most kShortMaxLen entries); block b takes tiles b,
// b + gridDim.x, ... NS a multiple of 8 with n_seq <= NS. Launched with short_shared_bytes<NS>() of dynamic shared
// memory; W and V need 4 floats allocated past their end (the last 16-byte group).
template <int NS, Precision P = Precision::kFp32>
__global__ void __launch_bounds__(kShortThreads) weight_pass_short(StepArgs a, const int64_t* __restrict__ tiles, int n_tiles) {
    static_assert(NS % 8 == 0 && NS >= 8, "sequences in tiles of 8");
    using M = TensorMath<P>;
    constexpr int NT = NS / 8;
    extern __shared__ __align__(16) float smem[];
    let_next_kernel_launch();
    const int tid = static_cast<int>(threadIdx.x), warp = tid / kWarp, lane = tid % kWarp;
    const int g = lane / 4, t = lane % 4;
    const int n = static_cast<int>(a.n_seq);
    const float inv_n = 1.0f / static_cast<float>(n);
    // The rows past a short tile's end read what the span's place holds: zeros at first, then earlier tiles'
    // finite values; their sums and updates are not kept.
    for (int e = tid; e < kShortStages * 2 * kShortSpan; e += kShortThreads)
        smem[(e / (2 * kShortSpan)) * short_stage_floats<NS>() + e % (2 * kShortSpan)] = 0.0f;
    __syncthreads();  // (before any copy lands there)
    const ShortTile first_tile = blockIdx.x < n_tiles ? short_tile(tiles + kShortTileInts * blockIdx.x) : ShortTile{};
    await_prior_kernels();
    const int64_t s = *a.step;
    const int cur = ring_slot(s), old = ring_slot(s - 2);
    const int64_t v_minus_w = a.velocity - a.weights;

    // Tile T into stage `stage`: W and V (the 16-byte groups over each span), the inputs (sequences past n_seq
    // and columns past the row as zeros), delta_out (sequences past n_seq and rows past the tile as zeros: they
    // add nothing), lr, mu and the record of tile `after` (rows 0 if none); then the group is committed.
    const int x_col = tid % 64, x_row = tid / 64;  // the inputs: a column each, rows x_row, x_row + 2, ...
    const auto fetch = [&](const ShortTile& T, int stage, int after) {
        if (T.rows > 0) {
            float* st = smem + stage * short_stage_floats<NS>();
            float* meta = st + short_meta_at<NS>();
            if (tid == 0) {
                copy_async4(meta, a.unit_lr + T.unit, true);
                copy_async4(meta + 1, a.unit_mu + T.unit, true);
            } else if (tid == 1 || tid == 2) {  // (zeros: no tile after)
                const bool ok = after < n_tiles;
                copy_async16(meta + 4 * tid, reinterpret_cast<const float*>(tiles + kShortTileInts * (ok ? after : 0)) + 4 * (tid - 1), ok);
            }
            const int64_t g0 = T.w & ~int64_t{3};
            const int groups = static_cast<int>((T.w - g0) + T.rows * T.len + 3) / 4;
            const float* src = a.weights + g0;
            for (int grp = tid; grp < groups; grp += kShortThreads) {
                copy_async16(st + 4 * grp, src + 4 * grp, true);
                copy_async16(st + kShortSpan + 4 * grp, src + v_minus_w + 4 * grp, true);
            }
            float* xs = st + 2 * kShortSpan;
            const float* in = a.h + static_cast<int64_t>(cur) * n * a.h_total + T.h + x_col;
            const float* in_old = a.h + static_cast<int64_t>(old) * n * a.h_total + T.h + x_col;
            if (x_col < kShortXStride) {
#pragma unroll
                for (int k = 0; k < NS; ++k) {  // row x_row + 2k: sequence q of x(s) (rows < NS) or x(s-2)
                    const int row = x_row + 2 * k, q = row % NS;
                    const bool ok = q < n && x_col < T.len;
                    copy_async4(xs + row * kShortXStride + x_col, ok ? (row < NS ? in : in_old) + q * a.h_total : in, ok);
                }
            }
            float* ds = xs + 2 * NS * kShortXStride;
            const float* d = a.delta_out + T.y + x_col;
#pragma unroll
            for (int k = 0; k < NS / 2; ++k) {  // sequence x_row + 2k, row x_col
                const int q = x_row + 2 * k;
                const bool ok = q < n && x_col < T.rows;
                copy_async4(ds + short_delta_at<NS>(x_col, q), ok ? d + q * a.y_total : a.delta_out, ok);
            }
        }
        copy_async_commit();
    };

    const int row0 = 16 * warp + g, row1 = row0 + 8;
    fetch(first_tile, 0, blockIdx.x + gridDim.x);
    ShortTile T = first_tile;
    int stage = 0;
    for (int ti = blockIdx.x; ti < n_tiles; ti += gridDim.x, stage ^= 1) {
        copy_async_wait<0>();  // tile ti has landed (this thread's copies) ...
        __syncthreads();       // ... and every thread's; the other stage's write-back is done
        const float* meta = smem + stage * short_stage_floats<NS>() + short_meta_at<NS>();
        const ShortTile next = short_tile(reinterpret_cast<const int64_t*>(meta + 4));
        fetch(next, stage ^ 1, ti + 2 * gridDim.x);
        const float lr = meta[0], mu = meta[1];
        const bool active = !(lr == 0.0f && mu == 0.0f);
        float* ws = smem + stage * short_stage_floats<NS>() + (T.w & 3);  // element (r, c) at r len + c
        float* vs = ws + kShortSpan;
        const float* xs = smem + stage * short_stage_floats<NS>() + 2 * kShortSpan;
        const float* ds = xs + 2 * NS * kShortXStride;

        // The update's A operand, lr*delta[row, sequence] (RowW1::lr_delta's product): rows g, g+8, sequences
        // 8j+k0(t), 8j+k1(t).
        typename M::A ld[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int q0 = 8 * j + M::k0(t), q1 = 8 * j + M::k1(t);
            ld[j] = M::a(__fmul_rn(lr, ds[short_delta_at<NS>(row0, q0)]), __fmul_rn(lr, ds[short_delta_at<NS>(row1, q0)]),
                         __fmul_rn(lr, ds[short_delta_at<NS>(row0, q1)]), __fmul_rn(lr, ds[short_delta_at<NS>(row1, q1)]));
        }
        float acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
        const int at0 = row0 * T.len + 2 * t, at1 = row1 * T.len + 2 * t;
#pragma unroll
        for (int k = 0; k < kShortSteps; ++k) {
            if (8 * k >= T.len) break;
            const int col0 = 8 * k;
            // W in the accumulator layout: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1); past the row's end 0 (those
            // places belong to the next row, perhaps another warp's).
            const bool in0 = col0 + 2 * t < T.len, in1 = col0 + 2 * t + 1 < T.len;
            const float w[4] = {in0 ? ws[at0 + col0] : 0.0f, in1 ? ws[at0 + col0 + 1] : 0.0f, in0 ? ws[at1 + col0] : 0.0f,
                                in1 ? ws[at1 + col0 + 1] : 0.0f};
            const typename M::A wa = M::a(w[0], w[2], w[1], w[3]);
            float grad[2][4] = {};
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const float2 xv = *reinterpret_cast<const float2*>(xs + (8 * j + g) * kShortXStride + col0 + 2 * t);
                M::mma(acc[j], wa, M::b(xv.x, xv.y));
                const float* xo = xs + (NS + 8 * j) * kShortXStride + col0 + g;
                M::mma(grad[j % 2], ld[j], M::b(xo[M::k0(t) * kShortXStride], xo[M::k1(t) * kShortXStride]));
            }
            if (active) {  // the new W and V replace the old in the stage, within the row only
                const int at[4] = {at0 + col0, at0 + col0 + 1, at1 + col0, at1 + col0 + 1};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (!(e % 2 == 0 ? in0 : in1)) continue;
                    const float gsum = NT > 1 ? __fadd_rn(grad[0][e], grad[1][e]) : grad[0][e];
                    const float vn = __fmaf_rn(mu, vs[at[e]], __fmul_rn(gsum, inv_n));
                    vs[at[e]] = vn;
                    ws[at[e]] = __fadd_rn(w[e], vn);
                }
            }
        }
        // The forward sums: (row g, sequence 8j+2t), (g, 8j+2t+1), (g+8, 8j+2t), (g+8, 8j+2t+1).
        float* y = a.y + static_cast<int64_t>(cur) * n * a.y_total + T.y;
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int q = 8 * j + 2 * t + (e % 2), row = e < 2 ? row0 : row1;
                if (q < n && row < T.rows) y[q * a.y_total + row] = activation(acc[j][e], a.polynomial);
            }
        // Every warp's update of the tile is in the stage: the block writes the spans back, the 16-byte groups
        // inside the tile whole and the elements of its two end groups one by one (the neighbouring tiles' may be
        // in flight elsewhere). A unit not yet enabled: its V is zeroed where it is not.
        __syncthreads();
        const int64_t g0 = T.w & ~int64_t{3};
        const int phase = static_cast<int>(T.w - g0), end = phase + T.rows * T.len;
        const int whole_lo = (phase + 3) / 4, whole_hi = end / 4;  // the groups inside [phase, end)
        const float* wst = ws - phase;
        float* W = a.weights + g0;
        if (active) {
            for (int grp = whole_lo + tid; grp < whole_hi; grp += kShortThreads) {
                store16(W + 4 * grp, *reinterpret_cast<const float4*>(wst + 4 * grp));
                store16(W + v_minus_w + 4 * grp, *reinterpret_cast<const float4*>(wst + kShortSpan + 4 * grp));
            }
            // The ends, [phase, 4 whole_lo) by threads 0-3 and [4 whole_hi, end) by threads 4-7 (one group's
            // worth when the span lies inside one group).
            const int at = tid < 4 ? phase + tid : 4 * max(whole_hi, whole_lo) + tid - 4;
            if (tid < 8 && at < (tid < 4 ? min(4 * whole_lo, end) : end)) {
                W[at] = wst[at];
                W[v_minus_w + at] = wst[kShortSpan + at];
            }
        } else {
            for (int at = phase + tid; at < end; at += kShortThreads)
                if (wst[kShortSpan + at] != 0.0f) W[v_minus_w + at] = 0.0f;
        }
        T = next;
    }
    copy_async_wait<0>();  // (no copy outlives the block)
}

}  // namespace kernels
}  // namespace pvm
