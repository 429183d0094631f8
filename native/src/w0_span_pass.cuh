// W0's pass of 2-16 and 33-64 sequences on sm_90 where its runs fill about one wave of slots (span_seqs, spans_pay:
// small.json, not med or LARGE): weight_pass_mma's arithmetic (TensorMath<P>, the same fragments and the same sums
// in the same order per chunk), scheduled differently.
//
// weight_pass_mma gives each block one run (a unit's rows) or a part of a long one, and its 8 math warps meet at
// two block barriers per 32-column chunk: one before a chunk is read (every thread's input copies have landed),
// one before its bulk store (every warp's new W and V are in the stage). The blocks of unequal runs then leave a
// tail (265 runs on 264 slots for small, split to the mean), and a block that starts or ends fills or drains its
// pipeline on its own. Here:
//   - the grid is the resident blocks, and each takes an equal span of all runs' chunks in one order (whole runs
//     and the ends of runs cut between neighbours: segments), so the blocks end together;
//   - a ninth warp copies: its lane 0 moves a chunk's W and V by bulk copies onto the stage's `full` mbarrier,
//     one chunk fewer than the stages ahead, across segment ends (a new segment does not refill the pipeline), and
//     writes the updated stage back;
//   - the math warps gather the inputs of the chunk kSpanInputsAhead ahead (a column and every 8th sequence a
//     thread, cp.async counted on the same barrier; with the copy warp issuing all of them the pass took 110.5 us
//     at 16 sequences against weight_pass_mma's 95.2, and takes 90.7 now: H200 workbench, x from sources), wait on
//     `full` for their chunk, and arrive on `computed` once their new W and V are in the stage; the copy warp
//     stores a stage after all 8 have arrived. No block barrier per chunk.
// At a segment's end the math warps add their forward sums (slot 1's to slot 0's, a named barrier per row tile)
// and write h(s); a segment that is part of a run cut between blocks writes its sums to mma_partial, and the
// run's last part to finish adds the parts in part order (a fixed order, as weight_pass_mma's split runs).
// The cut follows the device's resident block count, so the sums of a cut run differ in rounding between
// devices; on one device two runs stay bit-identical.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "mma_pass.cuh"

namespace pvm {
namespace kernels {

constexpr int kSpanMathThreads = kMmaThreads;           // 8 math warps: 4 row tiles x 2 column slots
constexpr int kSpanThreads = kSpanMathThreads + kWarp;  // and the copy warp
// The sequence counts it serves (on sm_90): 2-16 (from kMmaMinSeqs), two blocks a SM, and 33-64, one (the buckets of
// 48 and 64). At 17-32 (one block a SM: the math needs 141 registers, and 2 blocks of 9 warps leave 96 on the
// sub-partition that holds 5 of them) it was level with weight_pass_mma on small (24 / 32 sequences -0.5 / +0.6%) and
// lost 8-9% on med and LARGE, so weight_pass_mma stays there. H200 engine A/B, small at 48 / 64: +3.3 / +2.7%.
constexpr int kSpanMaxSeqs = 16, kSpanWideMinSeqs = 33, kSpanWideMaxSeqs = 64;
inline bool span_seqs(int64_t n) { return n <= kSpanMaxSeqs || (n >= kSpanWideMinSeqs && n <= kSpanWideMaxSeqs); }
template <int NS>
__host__ __device__ constexpr int span_blocks_per_sm() { return NS <= kSpanMaxSeqs ? 2 : 1; }
// Stages (span_stages: 4 where they fit, with W and V 3 chunks ahead, from DRAM), the inputs kSpanInputsAhead ahead
// (gathered from L2 by the math warps).
constexpr int kSpanStages = 4, kSpanInputsAhead = 2;
// Where the spans pay: runs of at most one and a half times the slots weight_pass_mma balances over (two a SM, also
// where one block fits: mma_balance_slots). There weight_pass_mma's blocks of one run (or part) leave a tail; where
// the runs fill two waves or more its blocks balance by themselves, and the spans' segment ends cost more than they
// save. H200, engine A/B against weight_pass_mma (PVM_CUDA_SPANS=0): small (265 runs on 264 slots) 5 / 8 / 16
// sequences +1.6 / +0.3 / +1.6% (before the segments were read from shared memory only); med (521) 8 / 16 -5.6 /
// -5.3%, LARGE (1,497) -3.5 / -3.1%; at 64, med -3.9% and LARGE -2.2%.
inline bool spans_pay(int64_t runs, int per_sm, int sms) { return 2 * runs <= 3 * mma_balance_slots(per_sm, sms); }
// A block's segments are read from shared memory (copied there once), at most kSpanSharedSegments of them and the
// spare record after them: span_fits says whether a list fits. (Read through a pointer that may be shared or global,
// every field was a generic load, in the gather of every chunk.)
constexpr int kSpanSharedSegments = 32;

// A segment: a run's chunks [first_chunk, end_chunk) within one block's span, with what its copies and sums need.
struct SpanSegment {
    int64_t w;  // W's offset (the device's column tiles) of the run's first row in the unit's first tile
    int64_t x;  // the unit's first input in a ring row of x (x_off[u]; with built inputs, its first place in x_index)
    int64_t h;  // the run's first row in a hidden vector (h_off[u] + first row)
    int32_t row;   // the run's first row among all units' (u * hidden + first row in the unit)
    int32_t rows, len, first_chunk, end_chunk, part, parts, run;
    int32_t key;  // the run's first row in the unit, mod 8 (w0_tile_col's swizzle)
    int32_t spare;
};
static_assert(sizeof(SpanSegment) == 64, "8 words a segment");

// Where each stage holds the lr*delta rows of a segment that starts with its chunk ([sequence][row], rows
// kSpanLdStride apart: conflict-free fragment reads), then the unit's lr and mu; past the chunk's W, V and inputs.
constexpr int kSpanLdStride = kMmaRows + 8;
template <int NS>
__host__ __device__ constexpr int span_stage_floats() {  // (whole 128 bytes: the stages stay aligned for the bulk copies)
    return (mma_stage_floats<NS, true>() + NS * kSpanLdStride + 2 + 31) / 32 * 32;
}
template <int NS>
__host__ __device__ constexpr int span_sum_floats() { return kMmaTiles * (NS / 8) * 4 * kWarp; }
template <int NS, int S>
__host__ __device__ constexpr size_t span_shared_bytes_of() {
    return sizeof(float) * (S * span_stage_floats<NS>() + span_sum_floats<NS>());
}
// The kernel's static shared memory with S stages: their barriers, the block's segments, and a flag.
template <int S>
__host__ __device__ constexpr size_t span_static_bytes() {
    return 2 * S * sizeof(uint64_t) + (kSpanSharedSegments + 1) * sizeof(SpanSegment) + sizeof(int);
}
// Stages: kSpanStages where they fit a block's 227 KB beside the static shared memory, else 3 (64 sequences; W and V
// 2 chunks ahead).
template <int NS>
__host__ __device__ constexpr int span_stages() {
    return span_shared_bytes_of<NS, kSpanStages>() + span_static_bytes<kSpanStages>() <= 227 * 1024 ? kSpanStages : kSpanStages - 1;
}
template <int NS, int S = span_stages<NS>()>
__host__ __device__ constexpr size_t span_shared_bytes() { return span_shared_bytes_of<NS, S>(); }

struct SpanList {
    std::vector<SpanSegment> segments;  // block after block, then one spare record (zeros)
    std::vector<int32_t> first;         // per block its first segment, then the end: blocks + 1 entries
    int64_t runs = 0, most_parts = 1;
};
// Every unit's rows (hidden of them) in runs of at most kMmaRows, their chunks in unit order, cut into `blocks`
// spans of equal chunk counts (within one). x_off, h_off: the topology's; w0_off: W0's device offsets (column tiles).
inline SpanList span_list(int64_t blocks, int64_t hidden, const std::vector<int64_t>& x_off, const std::vector<int64_t>& h_off,
                          const std::vector<int64_t>& w0_off) {
    const int64_t n_units = static_cast<int64_t>(x_off.size()) - 1;
    std::vector<std::array<int64_t, 4>> runs;  // (unit, r0, r1, chunks)
    int64_t total = 0;
    const int64_t n_runs = (hidden + kMmaRows - 1) / kMmaRows;
    for (int64_t u = 0; u < n_units; ++u) {
        const int64_t chunks = mma_chunks(x_off[u + 1] - x_off[u]);
        for (int64_t r = 0; r < n_runs; ++r, total += chunks) runs.push_back({u, r * hidden / n_runs, (r + 1) * hidden / n_runs, chunks});
    }
    blocks = std::max<int64_t>(1, std::min(blocks, total));
    std::vector<std::array<int64_t, 4>> cut;  // (block, run, first chunk, end chunk)
    std::vector<int64_t> parts(runs.size(), 0);
    size_t run = 0;
    int64_t c = 0;
    for (int64_t b = 0; b < blocks; ++b)
        for (int64_t at = b * total / blocks, end = (b + 1) * total / blocks; at < end;) {
            const int64_t take = std::min(end - at, runs[run][3] - c);
            cut.push_back({b, static_cast<int64_t>(run), c, c + take});
            ++parts[run];
            at += take;
            if ((c += take) == runs[run][3]) ++run, c = 0;
        }
    SpanList out;
    out.runs = static_cast<int64_t>(runs.size());
    std::vector<int32_t> part(runs.size(), 0);
    for (const auto& s : cut) {
        while (static_cast<int64_t>(out.first.size()) <= s[0]) out.first.push_back(static_cast<int32_t>(out.segments.size()));
        const auto& [u, r0, r1, chunks] = runs[s[1]];
        out.most_parts = std::max(out.most_parts, parts[s[1]]);
        const auto i32 = [](int64_t v) { return static_cast<int32_t>(v); };
        out.segments.push_back({w0_off[u] + r0 * kW0TileCols, x_off[u], h_off[u] + r0, i32(u * hidden + r0), i32(r1 - r0),
                                i32(x_off[u + 1] - x_off[u]), i32(s[2]), i32(s[3]), part[s[1]]++, i32(parts[s[1]]), i32(s[1]),
                                i32(r0 % 8), 0});
    }
    out.first.push_back(static_cast<int32_t>(out.segments.size()));
    out.segments.push_back(SpanSegment{});
    return out;
}
// Whether every block's segments fit its shared memory (kSpanSharedSegments).
inline bool span_fits(const SpanList& list) {
    for (size_t b = 0; b + 1 < list.first.size(); ++b)
        if (list.first[b + 1] - list.first[b] > kSpanSharedSegments) return false;
    return true;
}
// The segments as the words of a device buffer (the engine's DeviceBuffer<int64_t>).
inline std::vector<int64_t> span_words(const std::vector<SpanSegment>& segments) {
    std::vector<int64_t> words(segments.size() * sizeof(SpanSegment) / sizeof(int64_t));
    std::memcpy(words.data(), segments.data(), segments.size() * sizeof(SpanSegment));
    return words;
}

#if PVM_BULK_COPIES
// The `threads` threads (whole warps) that reach barrier id meet there; ids 1-15 (0 is __syncthreads').
__device__ __forceinline__ void named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// A block's segments, in shared memory.
struct SpanSegments {
    const SpanSegment* shared;
    int count;
    __device__ const SpanSegment& operator[](int i) const { return shared[i]; }
};

// A walk over a block's chunks (the copy warp's, the math warps' gather): segment i, chunk c of its run.
struct SpanCursor {
    int i = 0, c = 0;
    __device__ void start(const SpanSegments& segs) { i = 0, c = segs[0].first_chunk; }
    __device__ void next(const SpanSegments& segs) {
        if (++c == segs[i].end_chunk) c = segs[++i].first_chunk;  // (past the last: the spare record)
    }
    // This lane's column of the chunk: its place in a ring row, or -1 past the run's columns. (32-bit, so that a
    // place read a chunk ahead is not widened, waiting on its load, until it is used.)
    __device__ int32_t place(const StepArgs& a, const SpanSegments& segs, int lane) const {
        const int32_t column = kMmaCols * c + lane;
        return column >= segs[i].len ? -1 : a.x_index ? a.x_index[segs[i].x + column] : column;
    }
};

// The copy warp: the W and V of n_chunks chunks, kAhead in flight (lane 0); stores each once the math warps
// have `computed` it.
template <int NS, int S, int kAhead, bool kEarlyWV>
__device__ void span_copies(const StepArgs& a, const SpanSegments& segs, int n_chunks, float* smem, uint64_t* full, uint64_t* computed) {
    constexpr int kStageFloats = span_stage_floats<NS>();
    const int64_t chunk_step = kMmaCols * a.hidden, v_minus_w = a.velocity - a.weights;
    const unsigned full_at = shared_address(full), computed_at = shared_address(computed);  // (stage i's: + 8 i)
    const auto span = [&](const SpanCursor& k, float*& st, float*& w, unsigned& bytes, int j) {
        const SpanSegment& sg = segs[k.i];
        st = smem + stage_of<S>(j) * kStageFloats;
        w = a.weights + sg.w + chunk_step * k.c;
        bytes = static_cast<unsigned>(sg.rows * kMmaCols * sizeof(float));
    };
    const auto load_wv = [&](const SpanCursor& k, int j) {
        float *st, *src;
        unsigned bytes;
        span(k, st, src, bytes, j);
        const unsigned bar = full_at + 8 * stage_of<S>(j);
        barrier_expect(bar, 2 * bytes);
        bulk_load(st, src, bytes, bar);
        bulk_load(st + kMmaRows * kMmaCols, src + v_minus_w, bytes, bar);
    };
    if constexpr (!kEarlyWV) await_prior_kernels();
    if (threadIdx.x % kWarp == 0) {  // (the first loads before the wait where early: no kernel of the step writes W or V)
        SpanCursor in, out;
        in.start(segs);
        out.start(segs);
        for (int i = 0; i < kAhead && i < n_chunks; ++i, in.next(segs)) load_wv(in, i);
        for (int k = 0; k < n_chunks; ++k, out.next(segs)) {
            barrier_wait(computed_at + 8 * stage_of<S>(k), use_of<S>(k));
            float *st, *dst;
            unsigned bytes;
            span(out, st, dst, bytes, k);
            bulk_store(dst, st, bytes);
            bulk_store(dst + v_minus_w, st + kMmaRows * kMmaCols, bytes);
            bulk_commit();
            if (k + kAhead < n_chunks) {
                bulk_wait_read<S - kAhead>();  // the store of chunk k + kAhead - S, the stage's last, has read it
                load_wv(in, k + kAhead);
                in.next(segs);
            }
        }
        bulk_wait<0>();  // the stores are done before the block's shared memory goes
    }
    if constexpr (kEarlyWV) await_prior_kernels();
}

// The math warps: the block's segments in order, a chunk at a time as the copy warp's `full` says it has landed.
template <int NS, Precision P, int S, int kInputsAhead>
__device__ void span_math(const StepArgs& a, const SpanSegments& segs, int n_chunks, float* smem, float* sums, uint64_t* full,
                          uint64_t* computed, int* last_part) {
    using M = TensorMath<P>;
    constexpr int NT = NS / 8, kWv = kMmaCols;
    constexpr int kStageFloats = span_stage_floats<NS>(), kInputs = 2 * kMmaRows * kWv, kLd = mma_stage_floats<NS, true>();
    const unsigned full_at = shared_address(full), computed_at = shared_address(computed);  // (stage i's: + 8 i)
    const int warp = static_cast<int>(threadIdx.x / kWarp), lane = static_cast<int>(threadIdx.x % kWarp);
    const int tile = warp % kMmaTiles, slot = warp / kMmaTiles;
    const int g = lane / 4, t = lane % 4;
    const int n = static_cast<int>(a.n_seq);
    const float inv_n = 1.0f / static_cast<float>(n);
    const int row0 = 16 * tile + g, row1 = 16 * tile + g + 8;
    const int x_fwd = mma_input_at(g, 2 * t), x_upd = mma_input_at(NS + M::k0(t), g), x_upd4 = mma_input_at(NS + M::k1(t), g);
    await_prior_kernels();
    const int64_t step = *a.step, stride = a.x_stride;
    const int cur = ring_slot(step);
    const int64_t R = a.n_units * a.hidden;

    // Chunk j's inputs into its stage, kInputsAhead chunks ahead: this thread's column (lane) of sequences warp,
    // warp + 8, ... of x(s) (rows 0..NS-1) and x(s-2) (NS..2NS-1), from its place in a ring row (read a chunk
    // ahead); at a segment's first chunk also its lr*delta rows and the unit's lr and mu. Counted on the
    // stage's `full` (each thread's copies).
    const float* x_cur = a.x + cur * n * stride;
    const int64_t old_minus_cur = (ring_slot(step - 2) - cur) * n * stride;
    SpanCursor in, ahead;
    in.start(segs);
    ahead.start(segs);
    ahead.next(segs);
    int32_t place = in.place(a, segs, lane), place_next = n_chunks > 1 ? ahead.place(a, segs, lane) : -1;
    const auto gather = [&](int i) {
        const SpanSegment& sg = segs[in.i];
        float* st = smem + stage_of<S>(i) * kStageFloats;
        const float* src = x_cur + (a.x_index ? 0 : sg.x) + (place < 0 ? 0 : place);
#pragma unroll
        for (int k = 0; k < NS / 8; ++k) {
            const int q = warp + 8 * k;
            if (q >= n) break;  // (zeroed once)
            copy_async4(st + kInputs + mma_input_at(q, lane), src + q * stride, place >= 0);
            copy_async4(st + kInputs + mma_input_at(NS + q, lane), src + q * stride + old_minus_cur, place >= 0);
        }
        if (in.c == sg.first_chunk) {
            for (int e = static_cast<int>(threadIdx.x); e < sg.rows * n; e += kSpanMathThreads) {
                const int q = e / sg.rows, r = e % sg.rows;
                copy_async4(st + kLd + q * kSpanLdStride + r, a.lr_delta_hidden + q * a.h_total + sg.h + r, true);
            }
            if (threadIdx.x < 2)
                copy_async4(st + kLd + NS * kSpanLdStride + threadIdx.x, (threadIdx.x == 0 ? a.unit_lr : a.unit_mu) + sg.row / a.hidden, true);
        }
        copy_async_arrive(full_at + 8 * stage_of<S>(i));
        in.next(segs);
        place = place_next;
        if (i + 2 < n_chunks) {
            ahead.next(segs);
            place_next = ahead.place(a, segs, lane);
        }
    };
    for (int i = 0; i < kInputsAhead && i < n_chunks; ++i) gather(i);
    int j = 0;  // the block's chunk
    for (int i = 0; i < segs.count; ++i) {
        const SpanSegment& sg = segs[i];
        const int rows = sg.rows, part = sg.part, parts = sg.parts;
        const bool live0 = row0 < rows, live1 = row1 < rows;
        const int key = (sg.key + g) % 8;  // both rows' swizzle (w0_tile_col)
        const auto wv_at = [&](int row, int col0) { return row * kWv + (((col0 / 4 + t / 2) ^ key) * 4) + (2 * t) % 4; };
        typename M::A ld[NT];  // lr*delta[row, sequence]: rows g, g+8, sequences 8j+k0(t), 8j+k1(t)
        float mu = 0.0f;
        bool active = false;
        float acc[NT][4];  // forward sums: (row g, sequence 8j+2t), (g, 8j+2t+1), (g+8, 8j+2t), (g+8, 8j+2t+1)
#pragma unroll
        for (int jt = 0; jt < NT; ++jt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[jt][e] = 0.0f;

        for (int c = sg.first_chunk; c < sg.end_chunk; ++c, ++j) {
            if (j + kInputsAhead < n_chunks) {  // once every warp is done with the stage's last chunk
                if (j + kInputsAhead >= S) barrier_wait(computed_at + 8 * stage_of<S>(j + kInputsAhead), use_of<S>(j + kInputsAhead - S));
                gather(j + kInputsAhead);
            }
            barrier_wait(full_at + 8 * stage_of<S>(j), use_of<S>(j));
            float* ws = smem + stage_of<S>(j) * kStageFloats;
            float* vs = ws + kMmaRows * kWv;
            const float* xs = ws + kInputs;
            if (c == sg.first_chunk) {  // the segment's rates and deltas came with its first chunk
                const float* lds = ws + kLd;
                const float lr = lds[NS * kSpanLdStride];
                mu = lds[NS * kSpanLdStride + 1];
                active = !(lr == 0.0f && mu == 0.0f);
#pragma unroll
                for (int jt = 0; jt < NT; ++jt) {
                    float v[4];
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int q = 8 * jt + (e >= 2 ? M::k1(t) : M::k0(t));
                        const bool row_ok = (e % 2 == 0) ? live0 : live1;
                        v[e] = q < n && row_ok ? lds[q * kSpanLdStride + ((e % 2 == 0) ? row0 : row1)] : 0.0f;
                    }
                    ld[jt] = M::a(v[0], v[1], v[2], v[3]);
                }
            }
            float wk[kMmaWarpSteps][4], grad[kMmaWarpSteps][2][4];
            chunk_products<M>(ws, xs, wv_at, slot, row0, row1, x_fwd, x_upd, x_upd4, ld, acc, wk, grad);
            // The new W and V in the stage (a unit not yet enabled: W unchanged, V zeros).
            chunk_momentum<NT>(ws, vs, wv_at, slot, row0, row1, wk, grad, active, mu, inv_n);
            // The warp's new W and V before the copy warp's bulk store reads them: each lane's writes ordered before
            // the async proxy's reads, then one arrival per warp.
            fence_async_shared();
            __syncwarp();
            if (lane == 0) barrier_arrive(computed_at + 8 * stage_of<S>(j));
        }

        // The segment's forward sums: slot 1's added to slot 0's (a fixed order), through this tile's sums.
        float* mine = sums + tile * (NT * 4 * kWarp);
        if (slot == 1)
#pragma unroll
            for (int jt = 0; jt < NT; ++jt)
#pragma unroll
                for (int e = 0; e < 4; ++e) mine[(jt * 4 + e) * kWarp + lane] = acc[jt][e];
        named_barrier(1 + tile, 2 * kWarp);
        if (slot == 0) {
#pragma unroll
            for (int jt = 0; jt < NT; ++jt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int q = 8 * jt + 2 * t + (e % 2);
                    const bool row_ok = e < 2 ? live0 : live1;
                    if (q >= n || !row_ok) continue;
                    const int row = e < 2 ? row0 : row1;
                    const float total = __fadd_rn(acc[jt][e], mine[(jt * 4 + e) * kWarp + lane]);
                    if (parts == 1) a.h[(cur * n + q) * a.h_total + sg.h + row] = activation(total, a.polynomial);
                    else a.mma_partial[(static_cast<int64_t>(part) * n + q) * R + sg.row + row] = total;
                }
        }
        named_barrier(1 + tile, 2 * kWarp);  // (slot 1 may write the next segment's sums)
        if (parts == 1) continue;

        // A cut run: the last of its parts to finish adds the parts' sums in part order and leaves the run's
        // counter at zero for the next step. One thread fences and counts, after a barrier that orders every math
        // thread's sums before it (fences are cumulative), so that the other threads' input copies in flight are
        // not waited for.
        named_barrier(5, kSpanMathThreads);
        if (threadIdx.x == 0) {
            __threadfence();  // this part's sums are visible device-wide before it is counted
            *last_part = atomicAdd(a.mma_count + sg.run, 1) == parts - 1;
            if (*last_part) __threadfence();  // and the other parts' before they are read
        }
        named_barrier(5, kSpanMathThreads);
        if (!*last_part) continue;
        for (int e = static_cast<int>(threadIdx.x); e < rows * n; e += kSpanMathThreads) {
            const int64_t q = e / rows, r = e % rows;
            float total = __ldcg(a.mma_partial + q * R + sg.row + r);
            for (int p = 1; p < parts; ++p) total = __fadd_rn(total, __ldcg(a.mma_partial + (p * n + q) * R + sg.row + r));
            a.h[(cur * n + q) * a.h_total + sg.h + r] = activation(total, a.polynomial);
        }
        if (threadIdx.x == 0) a.mma_count[sg.run] = 0;
    }
}
#endif

// Launched on span_list's blocks (one each, all resident at once) with span_shared_bytes<NS, S>() of dynamic
// shared memory; NS a multiple of 8 with n_seq <= NS (sequences past n_seq staged as zeros: they add nothing).
// sm_90 only (bulk copies): elsewhere the engine runs weight_pass_mma.
template <int NS, Precision P = Precision::kFp32, int S = span_stages<NS>(), int kAhead = S - 1>
__global__ void __launch_bounds__(kSpanThreads, span_blocks_per_sm<NS>())
    w0_span_pass(StepArgs a, const SpanSegment* __restrict__ segments, const int32_t* __restrict__ first_segment) {
    static_assert(NS % 8 == 0 && NS >= 8 && NS <= kSpanWideMaxSeqs, "sequences in tiles of 8");
    static_assert(kAhead < S && kSpanInputsAhead < S, "a stage is refilled after its store has read it");
#if PVM_BULK_COPIES
    extern __shared__ __align__(128) float span_smem[];  // (128-byte aligned for the bulk copies, as weight_pass_mma's)
    __shared__ uint64_t full[S], computed[S];
    __shared__ SpanSegment shared_segments[kSpanSharedSegments + 1];
    __shared__ int last_part;
    let_next_kernel_launch();
    constexpr int kStageFloats = span_stage_floats<NS>(), kInputs = 2 * kMmaRows * kMmaCols;
    const int n = static_cast<int>(a.n_seq);
    const int first = first_segment[blockIdx.x];
    const SpanSegments segs{shared_segments, first_segment[blockIdx.x + 1] - first};
    // The block's segments (and the spare record after them) into shared memory, a word a thread.
    constexpr int kWords = sizeof(SpanSegment) / sizeof(int64_t);
    for (int e = static_cast<int>(threadIdx.x); e < (segs.count + 1) * kWords; e += kSpanThreads)
        reinterpret_cast<int64_t*>(shared_segments)[e] = reinterpret_cast<const int64_t*>(segments + first)[e];
    // The rows of sequences past n_seq are never copied: zeros in every stage, once.
    for (int e = static_cast<int>(threadIdx.x); e < S * 2 * (NS - n) * kMmaCols; e += kSpanThreads) {
        const int c = e % kMmaCols, q = n + (e / kMmaCols) % (NS - n), half = (e / kMmaCols / (NS - n)) % 2;
        span_smem[e / kMmaCols / (NS - n) / 2 * kStageFloats + kInputs + mma_input_at(half * NS + q, c)] = 0.0f;
    }
    init_stage_barriers<S>(full, computed, kSpanMathThreads, kSpanMathThreads / kWarp);
    __syncthreads();
    int n_chunks = 0;
    for (int i = 0; i < segs.count; ++i) n_chunks += segs[i].end_chunk - segs[i].first_chunk;
    if (threadIdx.x >= kSpanMathThreads) span_copies<NS, S, kAhead, NS == 8>(a, segs, n_chunks, span_smem, full, computed);
    else span_math<NS, P, S, kSpanInputsAhead>(a, segs, n_chunks, span_smem, span_smem + S * kStageFloats, full, computed, &last_part);
#else
    (void)a;
    (void)segments;
    (void)first_segment;
    __trap();
#endif
}

}  // namespace kernels
}  // namespace pvm
