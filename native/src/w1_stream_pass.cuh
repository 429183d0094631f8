// W1's pass of one or two sequences on sm_90, where its rows are short (kShortMaxLen entries or fewer): W1 streamed
// by resident blocks, each over one contiguous share of it.
//
// weight_pass_single gives each W1 row 8 lanes for one trip: a thread finds its row's unit, then the unit's offsets,
// then loads 7 entries of W and V, so two of its three dependent round trips carry no weights, and the pass runs in
// about four waves of such threads (63 registers, 4 blocks a SM). Small's W1 pass took 27.6 us on an H200 for 55 MB,
// 47% of the copy rate (weight_pass_short's tiles, 64 rows a block at two stages, were level with it at two
// sequences: about two tiles a block, so its pipeline never filled). Here W1's rows go in tiles of up to
// kStreamRows rows of one unit (short_tiles' records, in W1's order), each block takes an equal run of consecutive
// tiles, so its W and V are one stream each, and:
//   - a copy warp's lane 0 moves each tile's W and V (the 16-byte groups over its span) by bulk copies S - 1 tiles
//     ahead onto the stage's `full` mbarrier (the first ones before the wait on the kernels before), and writes the
//     updated groups inside the span back once the math warps have `computed` it;
//   - the math threads gather the tile's inputs, delta_out, lr and mu kStreamInputsAhead tiles ahead (cp.async on
//     the same barrier), then compute a row per 8 lanes (each lane its entries lane, lane + 8, ...: all their shared
//     loads, then their sums and updates in turn, then the 8 lanes' sums by xor shuffles); the elements of a span's
//     two end groups, which a neighbouring tile shares, they store themselves. One sequence computes as
//     weight_pass_single<RowW1, 8> does, bit-identical to it; two in FMA chains over the sequences, as the engine's
//     fused FMA pass of 2-4 sequences did before those moved to tensor cores (weight_pass_short's tiles, which the
//     engine runs from 3 sequences, compute in 3xTF32).
// A unit not yet enabled (lr = mu = 0) writes its W unchanged and its V as zeros, as weight_pass_single leaves them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "short_rows_pass.cuh"

namespace pvm {
namespace kernels {

constexpr int kStreamLanes = 8;                                 // a row's lanes (weight_pass_single<RowW1, 8>)
constexpr int kStreamRows = 32;                                 // rows per tile: 4 a math warp
constexpr int kStreamMathThreads = kStreamRows * kStreamLanes;  // 256
constexpr int kStreamThreads = kStreamMathThreads + kWarp;      // and the copy warp
constexpr int kStreamSpan = kStreamRows * kShortMaxLen + 4;     // a tile's W (or V) from its 16-byte group on
constexpr int kStreamX = 64;                                    // x(s), x(s-2) of a sequence: the row's entries
constexpr int kStreamTrips = (kShortMaxLen + kStreamLanes - 1) / kStreamLanes;  // a lane's entries of a row, at most
// Up to 2 sequences. H200 A/B against weight_pass_short's tiles (frames/s): 2 sequences small +4.3%, med +1.9%, LARGE
// +0.8%; 4 sequences -1.4%, -3.4%, -4.4% (each row's 8 lanes then do 8 FMAs and 8 shared loads an entry: the W1
// phase on small 29.9 -> 33.4 us). Again with an entry's inputs as one vector load and a row's loads first (a bucket
// of 4, 7 stages, 94 registers): 3 / 4 sequences small +1.1 / +0.4% (+1.8 / +1.2% in another call), med -0.7 /
// -1.0%, LARGE -2.9 / -3.5%; the W1 phase still 28 -> 31 us on small and 115 -> 138 on LARGE (workbench, small's
// shapes: 29.4 against 33.3 us at 4), so the tiles keep 3-4. The same two changes at 2 sequences: small +0.6 / +1.1%
// (two calls), med +0.6 / +0.6%, LARGE -0.2 / -0.3%.
constexpr int kStreamMaxSeqs = 2;
constexpr int kStreamMaxTiles = 64;                             // a block's tile records, in shared memory
constexpr int kStreamInputsAhead = 2;
// A stage of NS sequences (a bucket: n_seq <= NS, the rest zeros): W's span, V's span, x(s) and x(s-2) of every
// sequence by entry ([entry][sequence]: one vector load gives an entry's NS inputs), delta_out of the tile's rows
// ([sequence][row]), lr and mu; whole 128 bytes, so that the stages stay aligned for the bulk copies.
template <int NS>
struct StreamStage {
    static constexpr int kXAt = 2 * kStreamSpan, kOldXAt = kXAt + NS * kStreamX, kDeltaAt = kOldXAt + NS * kStreamX;
    static constexpr int kRatesAt = kDeltaAt + NS * kStreamRows;
    static constexpr int kFloats = (kRatesAt + 2 + 31) / 32 * 32;
};
static_assert(kStreamSpan % 4 == 0, "16-byte groups (and the inputs' vectors)");
// Stages: W and V S - 1 tiles ahead, two blocks a SM. H200, engine A/B against weight_pass_single (frames/s, n_seq 1):
// 8 / 6 / 4 stages small +7.3 / +7.7 / +5.7%, med +6.6 / +6.3 / +5.8%, LARGE +6.2 / +5.9 / +5.2%; one block a SM of
// 8 stages +1.7 / +1.1 / 0.0%, of 4 -11 to -13% (the bytes in flight halved). With two sequences' inputs 8 stages
// would leave one block a SM: 7.
template <int NS>
__host__ __device__ constexpr int stream_stages() { return NS == 1 ? 8 : 7; }
template <int NS>
__host__ __device__ constexpr size_t stream_shared_bytes() { return sizeof(float) * stream_stages<NS>() * StreamStage<NS>::kFloats; }

// W1's rows in tiles of at most kStreamRows rows of one unit (a unit's rows split evenly), as short_tiles' records
// (kShortTileInts each), in unit order: w1_off, y_off, h_off as in short_tiles, outputs(u) the unit's rows.
template <class Outputs>
std::vector<int64_t> stream_tiles(int64_t n_units, Outputs outputs, const std::vector<int64_t>& w1_off, const std::vector<int64_t>& y_off,
                                  const std::vector<int64_t>& h_off) {
    std::vector<int64_t> out;
    for (int64_t u = 0; u < n_units; ++u) {
        const int64_t rows = outputs(u), tiles = (rows + kStreamRows - 1) / kStreamRows;
        for (int64_t i = 0; i < tiles; ++i)
            append_short_tile(out, u, i * rows / tiles, (i + 1) * rows / tiles - i * rows / tiles, w1_off, y_off, h_off);
    }
    return out;
}
// Block b of `blocks` takes tiles [b n / blocks, (b + 1) n / blocks) of n.
__host__ __device__ constexpr int stream_first_tile(int b, int blocks, int n) {
    return static_cast<int>(int64_t{b} * n / blocks);
}
// Whether every block's records fit kStreamMaxTiles.
inline bool stream_fits(int64_t n_tiles, int64_t blocks) { return blocks > 0 && (n_tiles + blocks - 1) / blocks <= kStreamMaxTiles; }

#if PVM_BULK_COPIES
// The 16-byte groups of tile T's span ([phase, end) from the group g0 = T.w & ~3): all of them, and those inside it.
struct StreamSpan {
    int64_t g0;
    int phase, end, whole_lo, whole_hi;  // in floats from g0; whole: the groups [whole_lo, whole_hi) lie inside
    __device__ explicit StreamSpan(const ShortTile& T)
        : g0(T.w & ~int64_t{3}), phase(static_cast<int>(T.w & 3)), end(phase + T.rows * T.len), whole_lo((phase + 3) / 4 * 4),
          whole_hi(end / 4 * 4) {}
};

// The copy warp's lane 0: tile i's W and V into stage i % S, S - 1 tiles ahead; each tile's inner groups back once
// the math warps have computed it.
// The first S - 1 tiles' loads go out before the wait on the kernels before (no kernel of the step writes W or V:
// dependent_launch.cuh), so they overlap the W0 pass's last blocks. H200, frames/s against after the wait: 1 / 2
// sequences small +0.4 / +1.6%, med +0.7 / +0.8%, LARGE +0.3 / +0.2%.
template <int NS>
__device__ void stream_copies(const StepArgs& a, const int64_t* records, int count, float* smem, uint64_t* full, uint64_t* computed) {
    constexpr int S = stream_stages<NS>(), kAhead = S - 1, kStageFloats = StreamStage<NS>::kFloats;
    const int64_t v_minus_w = a.velocity - a.weights;
    const unsigned full_at = shared_address(full), computed_at = shared_address(computed);  // (stage i's: + 8 i)
    if (threadIdx.x % kWarp != 0) {
        await_prior_kernels();
        return;
    }
    const uint64_t keep = l2_evict_last();  // (W1 and V1 under evict_last: step_kernels.cuh)
    const auto load = [&](int i) {
        const StreamSpan sp(short_tile(records + kShortTileInts * i));
        float* st = smem + stage_of<S>(i) * kStageFloats;
        const unsigned bytes = static_cast<unsigned>((sp.end + 3) / 4 * 16);  // (W and V have 4 floats allocated past their end)
        const unsigned bar = full_at + 8 * stage_of<S>(i);
        barrier_expect(bar, 2 * bytes);
        bulk_load(st, a.weights + sp.g0, bytes, bar, keep);
        bulk_load(st + kStreamSpan, a.weights + sp.g0 + v_minus_w, bytes, bar, keep);
    };
    for (int i = 0; i < kAhead && i < count; ++i) load(i);
    await_prior_kernels();
    for (int k = 0; k < count; ++k) {
        barrier_wait(computed_at + 8 * stage_of<S>(k), use_of<S>(k));
        const StreamSpan sp(short_tile(records + kShortTileInts * k));
        if (sp.whole_hi > sp.whole_lo) {
            const float* st = smem + stage_of<S>(k) * kStageFloats + sp.whole_lo;
            float* dst = a.weights + sp.g0 + sp.whole_lo;
            const unsigned bytes = static_cast<unsigned>((sp.whole_hi - sp.whole_lo) * sizeof(float));
            bulk_store(dst, st, bytes, keep);
            bulk_store(dst + v_minus_w, st + kStreamSpan, bytes, keep);
        }
        bulk_commit();
        if (k + kAhead < count) {
            bulk_wait_read<S - kAhead>();  // the store of tile k - 1, the stage's last, has read it
            load(k + kAhead);
        }
    }
    bulk_wait<0>();  // the stores are done before the block's shared memory goes
}

// The math threads: a row per kStreamLanes lanes of every tile, as the copy warp's `full` says it has landed.
template <int NS>
__device__ void stream_math(const StepArgs& a, const int64_t* records, int count, float* smem, uint64_t* full, uint64_t* computed) {
    using St = StreamStage<NS>;
    constexpr int S = stream_stages<NS>();
    const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarp;
    const int row = tid / kStreamLanes, l = tid % kStreamLanes;
    const unsigned mask = ((1u << kStreamLanes) - 1u) << (lane / kStreamLanes * kStreamLanes);
    const int64_t v_minus_w = a.velocity - a.weights;
    const unsigned full_at = shared_address(full), computed_at = shared_address(computed);  // (stage i's: + 8 i)
    await_prior_kernels();
    const int64_t s = *a.step;
    const int n = static_cast<int>(a.n_seq), cur = ring_slot(s);
    const float inv_n = 1.0f / static_cast<float>(n);
    const float* h_cur = a.h + cur * n * a.h_total;  // sequence q at + q * h_total
    const float* h_old = a.h + ring_slot(s - 2) * n * a.h_total;

    // Tile i's inputs x(s) and x(s-2) of every sequence (a column each, sequences past n_seq as zeros), delta_out of
    // its rows ([sequence][row], zeros past n_seq and the tile), lr and mu into its stage, counted on `full` (every
    // math thread arrives).
    const auto gather = [&](int i) {
        const ShortTile T = short_tile(records + kShortTileInts * i);
        float* st = smem + stage_of<S>(i) * St::kFloats;
        for (int e = tid; e < St::kRatesAt + 2 - St::kXAt; e += kStreamMathThreads) {
            if (e < 2 * NS * kStreamX) {  // (x(s) of sequences 0..NS-1, then x(s-2); entry c of sequence q at c * NS + q)
                const int c = e % kStreamX, q = e / kStreamX % NS;
                const bool ok = c < T.len && q < n;
                const int at = NS == 1 ? e : e / (NS * kStreamX) * (St::kOldXAt - St::kXAt) + c * NS + q;
                copy_async4(st + St::kXAt + at, (e < NS * kStreamX ? h_cur : h_old) + (ok ? q * a.h_total + T.h + c : 0), ok);
            } else if (e < 2 * NS * kStreamX + NS * kStreamRows) {
                const int r = (e - 2 * NS * kStreamX) % kStreamRows, q = (e - 2 * NS * kStreamX) / kStreamRows;
                const bool ok = r < T.rows && q < n;
                copy_async4(st + St::kXAt + e, a.delta_out + (ok ? q * a.y_total + T.y + r : 0), ok);
            } else {
                copy_async4(st + St::kXAt + e, (e == St::kRatesAt - St::kXAt ? a.unit_lr : a.unit_mu) + T.unit, true);
            }
        }
        copy_async_arrive(full_at + 8 * stage_of<S>(i));
    };
    for (int i = 0; i < kStreamInputsAhead && i < count; ++i) gather(i);
    for (int j = 0; j < count; ++j) {
        if (j + kStreamInputsAhead < count) {  // once every warp is done with the stage's last tile
            if (j + kStreamInputsAhead >= S)
                barrier_wait(computed_at + 8 * stage_of<S>(j + kStreamInputsAhead), use_of<S>(j + kStreamInputsAhead - S));
            gather(j + kStreamInputsAhead);
        }
        barrier_wait(full_at + 8 * stage_of<S>(j), use_of<S>(j));
        const ShortTile T = short_tile(records + kShortTileInts * j);
        if (row < T.rows) {
            const StreamSpan sp(T);
            float* st = smem + stage_of<S>(j) * St::kFloats;
            const float* xs = st + St::kXAt;  // x(s), then x(s-2) at kOldXAt, by entry (StreamStage)
            const float lr = st[St::kRatesAt], mu = st[St::kRatesAt + 1];
            const bool active = !(lr == 0.0f && mu == 0.0f);
            float ld[NS], acc[NS];
#pragma unroll
            for (int q = 0; q < NS; ++q) {
                ld[q] = __fmul_rn(lr, st[St::kDeltaAt + q * kStreamRows + row]);  // (RowW1::lr_delta)
                acc[q] = 0.0f;
            }
            float* W = a.weights + sp.g0;
            // The row's entries l, l + 8, ... (at most kStreamTrips): every shared load first, then the sums and
            // the update in entry order (a loop of load, compute, store made each entry's loads wait for the
            // stores before them, which may alias them).
            const int p0 = sp.phase + row * T.len + l;
            float w[kStreamTrips], v[kStreamTrips], x[kStreamTrips][NS], xo[kStreamTrips][NS];
#pragma unroll
            for (int i = 0; i < kStreamTrips; ++i) {
                const int c = l + i * kStreamLanes, p = p0 + i * kStreamLanes;
                if (c < T.len) {
                    w[i] = st[p];
                    v[i] = st[kStreamSpan + p];
                    load_row<NS>(xs + c * NS, 0, x[i]);  // (entry c's inputs: row c of [entry][sequence])
                    load_row<NS>(xs + St::kOldXAt - St::kXAt + c * NS, 0, xo[i]);
                }
            }
#pragma unroll
            for (int i = 0; i < kStreamTrips; ++i) {
                const int c = l + i * kStreamLanes, p = p0 + i * kStreamLanes;
                if (c >= T.len) break;
                float vn;
                if constexpr (NS == 1) {  // weight_pass_single's arithmetic
                    acc[0] = __fadd_rn(acc[0], __fmul_rn(w[i], x[i][0]));
                    vn = __fmaf_rn(mu, v[i], __fmul_rn(ld[0], xo[i][0]));
                } else {  // FMA chains over the sequences (spare sequences: inputs 0, lr*delta 0)
                    float g = 0.0f;
#pragma unroll
                    for (int q = 0; q < NS; ++q) {
                        acc[q] = __fmaf_rn(w[i], x[i][q], acc[q]);
                        g = __fmaf_rn(ld[q], xo[i][q], g);
                    }
                    vn = __fmaf_rn(mu, v[i], __fmul_rn(g, inv_n));
                }
                vn = active ? vn : 0.0f;
                const float wn = active ? __fadd_rn(w[i], vn) : w[i];
                st[p] = wn;
                st[kStreamSpan + p] = vn;
                if (p < sp.whole_lo || p >= sp.whole_hi) {  // an end group's element: the copy warp stores the rest
                    W[p] = wn;
                    W[v_minus_w + p] = vn;
                }
            }
#pragma unroll
            for (int q = 0; q < NS; ++q) {
                float total = acc[q];
                for (int offset = kStreamLanes / 2; offset > 0; offset /= 2)
                    total = __fadd_rn(total, __shfl_xor_sync(mask, total, offset, kStreamLanes));
                if (l == 0 && q < n) a.y[(cur * n + q) * a.y_total + T.y + row] = activation(total, a.polynomial);
            }
        }
        // This thread's new W and V before the copy warp's bulk store reads them, then its arrival. (One arrival per
        // warp after __syncwarp orders the same, but compute-sanitizer's racecheck, which sees no order through
        // __syncwarp, then reported the stage's next bulk load against these stores wherever a block reuses a stage;
        // every thread arriving: no report on the workbench, and frames/s within 0.3% at 1 and 2 sequences on small,
        // med and LARGE.)
        fence_async_shared();
        barrier_arrive(computed_at + 8 * stage_of<S>(j));
    }
}
#endif

// Launched on resident blocks (block b: stream_first_tile's share of n_tiles, at most kStreamMaxTiles) with
// stream_shared_bytes<NS>() of dynamic shared memory; n_seq <= NS. sm_90 only (bulk copies).
template <int NS>
__global__ void __launch_bounds__(kStreamThreads, 2) w1_stream_pass(StepArgs a, const int64_t* __restrict__ tiles, int n_tiles) {
    constexpr int S = stream_stages<NS>();
    static_assert(NS >= 1 && NS <= kStreamMaxSeqs && kStreamInputsAhead < S, "a stage is refilled after its store has read it");
#if PVM_BULK_COPIES
    extern __shared__ __align__(128) float stream_smem[];
    __shared__ uint64_t full[S], computed[S];
    __shared__ __align__(16) int64_t records[kStreamMaxTiles * kShortTileInts];
    let_next_kernel_launch();
    const int first = stream_first_tile(blockIdx.x, gridDim.x, n_tiles);
    const int count = stream_first_tile(blockIdx.x + 1, gridDim.x, n_tiles) - first;
    for (int e = static_cast<int>(threadIdx.x); e < count * kShortTileInts; e += kStreamThreads)
        records[e] = tiles[int64_t{first} * kShortTileInts + e];
    init_stage_barriers<S>(full, computed, kStreamMathThreads, kStreamMathThreads);
    __syncthreads();
    if (threadIdx.x >= kStreamMathThreads) stream_copies<NS>(a, records, count, stream_smem, full, computed);
    else stream_math<NS>(a, records, count, stream_smem, full, computed);
#else
    (void)a;
    (void)tiles;
    (void)n_tiles;
    __trap();
#endif
}

}  // namespace kernels
}  // namespace pvm
