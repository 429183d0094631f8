// The fused weight pass on tensor cores (the engine uses it for 2 to 64 sequences, W1 up to 32): one read of a unit's W and V per step
// serves every sequence, and both per-unit products run as mma.sync m16n8k8 over the sequences:
//   forward  h(s)[r, q] = phi(sum_c W[r, c] x(s)[q, c])              (rows x sequences, k = columns)
//   update   G[r, c]    = sum_q lr*delta[r, q] x(s-2)[q, c]           (rows x columns,   k = sequences)
// then V = mu V + G / n_seq, W = W + V (the engine's FMA pass of 2-4 sequences did it with one FMA chain per weight).
//
// Precision: 3xTF32. Every operand is split as hi = tf32(v), lo = v - hi (exact in FP32; the tensor
// core reads its top 19 bits, truncating it to TF32: <= 2^-21 of v), and a product is hi*hi + hi*lo +
// lo*hi, accumulated in FP32 by the tensor core (the dropped lo*lo term is ~2^-22 of the product).
// Rounding lo as well (two more integer operations per operand) left every error the workbench
// measures unchanged (dev/cuda/mma_products.cu: 2.1e-6, 2.5e-8, 7.0e-8 against 7.1e-8) and cost 1-3%:
// the tensor core's FP32 accumulation dominates. Truncating hi as well (one operation fewer) was 2-3%
// faster but moved the engine's errors (tiny n_seq 64 momentum 4.2e-7 -> 7.2e-7): rejected. Measured (dev/cuda/weight_pass_mma.cu): h within 1.1e-6 of a double reference (FMA
// chains: 6e-8), W and V as exact as before; within the engine's tolerances (pvm-algorithm.md §3.12).
// TensorMath<P> holds the arithmetic: this default, or the opt-in TF32 and BF16 modes (EngineConfig::precision;
// their errors and times: dev/cuda/weight_pass_mma.cu and benchmarks/NOTES.md).
// Deterministic: the tensor core's accumulation order is fixed for one device; no atomics.
//
// The one fragment layout that serves both products: a lane (g = lane / 4, t = lane % 4) holds W at
// rows g, g+8 and columns 2t, 2t+1 of each 8-column step. That is the accumulator layout of the
// update (rows x columns) and, reading the forward's k index t as column 2t and t+4 as column 2t+1
// (a sum may take its terms in any order), the A operand of the forward.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

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
constexpr int kMmaStride = kMmaCols + 8;                    // staged row stride: conflict-free fragment reads
// Where an input row (x(s) of sequence row, or x(s-2) of row - NS) has the chunk's column cc in a stage: the
// forward reads each pair of columns as one 8-byte load.
__host__ __device__ constexpr int mma_input_at(int row, int cc) { return row * kMmaStride + cc; }
// The chunks of a row of len entries.
__host__ __device__ constexpr int64_t mma_chunks(int64_t len) { return (len + kMmaCols - 1) / kMmaCols; }
// (16-byte windows of W0's rows, staged from each row's own phase with the rows of one phase in one tile, took
// the pass up to 16 sequences from 2026-11-26 until the inputs were gathered from the step's sources, which
// 4-byte copies can do and windows cannot; benchmarks/NOTES.md has both measurements.)

// v rounded to TF32 (10 mantissa bits), to nearest with ties away from zero, as cvt.rna.tf32.f32 rounds
// finite values: half an ulp of TF32 added to the magnitude bits, then the 13 low bits cleared. Two
// integer operations; sm_90 runs cvt.rna.tf32 as a sequence of about seven (ncu: 12% of the issued
// instructions of mma_product were its FSETPs alone).
__device__ __forceinline__ uint32_t tf32(float v) { return (__float_as_uint(v) + 0x1000u) & 0xffffe000u; }

struct Split {  // v = hi + lo, hi a TF32 value
    uint32_t hi, lo;
};
__device__ __forceinline__ Split split(float v) {
    const uint32_t hi = tf32(v);
    return {hi, __float_as_uint(__fsub_rn(v, __uint_as_float(hi)))};
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

// d += A B for one m16n8k8 BF16 product (A: a[0..1], B: b[0], each register two BF16 values, the lower k index
// in the low half), accumulated in FP32.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[2], const uint32_t (&b)[1]) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b[0]));
}
// lo and hi as two BF16 values in one register (round to nearest even), lo in the low half.
__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// The tensor cores' arithmetic in precision P (pvm::Precision, numerics.h; BF16 on m16n8k8.bf16): the A and B
// fragments of one m16n8k8 product, built from FP32 values. A lane (g, t) holds A at rows g,
// g+8 and the k indices k0(t), k1(t) (TF32's layout: t, t+4; BF16's: 2t, 2t+1), and B at k0(t), k1(t) of column g.
template <Precision P>
struct TensorMath {
    static constexpr bool kBf16 = P == Precision::kBf16;
    using Reg = std::conditional_t<P == Precision::kFp32, Split, uint32_t>;
    struct A {
        Reg r[kBf16 ? 2 : 4];
    };
    struct B {
        Reg r[kBf16 ? 1 : 2];
    };
    __device__ static int k0(int t) { return kBf16 ? 2 * t : t; }
    __device__ static int k1(int t) { return kBf16 ? 2 * t + 1 : t + 4; }
    // A from its values at (g, k0), (g+8, k0), (g, k1), (g+8, k1).
    __device__ static A a(float g_k0, float g8_k0, float g_k1, float g8_k1) {
        if constexpr (kBf16) return {{bf16x2(g_k0, g_k1), bf16x2(g8_k0, g8_k1)}};
        else return {{one(g_k0), one(g8_k0), one(g_k1), one(g8_k1)}};
    }
    // B from its values at (k0, g), (k1, g).
    __device__ static B b(float at_k0, float at_k1) {
        if constexpr (kBf16) return {{bf16x2(at_k0, at_k1)}};
        else return {{one(at_k0), one(at_k1)}};
    }
    __device__ static void mma(float (&d)[4], const A& x, const B& y) {
        if constexpr (P == Precision::kFp32) mma_3xtf32(d, x.r, y.r);
        else if constexpr (P == Precision::kTf32) mma_tf32(d, x.r, y.r);
        else mma_bf16(d, x.r, y.r);
    }

private:
    __device__ static Reg one(float v) {
        if constexpr (P == Precision::kFp32) return split(v);
        else return tf32(v);
    }
};

// Shared memory of one block: stages of W and V of the chunk ([row][column], the block's 64 rows) and the
// inputs x(s), x(s-2) of every sequence ([sequence][column], rows of kMmaStride floats). Rows (W1, W0 in
// pitched rows): W and V rows kMmaStride floats apart, 3 stages, chunk i+2 in flight while chunk i is computed.
// W0's column tiles (Tiled): W and V as the tile lies (rows of kMmaCols floats, swizzled: w0_tile_col), one bulk
// copy each way; 4 stages, still chunk i+2 in flight, so that a stage's bulk store has a chunk's time to read it
// before the stage is refilled.
constexpr int kMmaStages = 3, kMmaTiledStages = 4;
template <bool Tiled>
__host__ __device__ constexpr int mma_stages() { return Tiled ? kMmaTiledStages : kMmaStages; }
template <bool Tiled>
__host__ __device__ constexpr int mma_wv_stride() { return Tiled ? kMmaCols : kMmaStride; }
template <int NS, bool Tiled = false>
__host__ __device__ constexpr int mma_stage_floats() { return 2 * kMmaRows * mma_wv_stride<Tiled>() + 2 * NS * kMmaStride; }
template <int NS, bool Tiled = false>
__host__ __device__ constexpr size_t mma_shared_bytes() { return sizeof(float) * mma_stages<Tiled>() * mma_stage_floats<NS, Tiled>(); }

// The blocks of weight_pass_mma, kMmaBlockInts each: (unit, first row, end row, part, parts, group).
// A unit's rows go in runs of at most kMmaRows (a group each). Given `slots` (blocks resident at once on
// the device; 0: never split), a run of more chunks (kMmaCols columns) than the mean load of a slot is
// split into `parts` near-equal ranges of whole chunks, one block each; blocks of most chunks first.
// Small's W0 at 5-32 sequences (265 runs for 264 slots, 65 chunks in the longest against a mean of 34)
// waited on its longest units while the other SMs ran out of work: +4-7% frames/s split. Where the runs
// already fill several waves (med, LARGE) no run is longer than the mean load, and splitting anyway at
// 34 chunks cost 2-8%. A split run's sums differ in rounding from one block's (and the split follows
// the device's SM count); one device's runs stay bit-identical.
constexpr int kMmaBlockInts = 6;
// The slots mma_blocks balances over, from the blocks resident per SM and the SMs: at least two per SM. Where
// one block fits (33-64 sequences), whole units left a tail: ncu had the SMs busy 73% of small's W0 pass at 64
// (265 blocks on 132 SMs); split for two per SM, 64 sequences 279.7 -> 243.9 us (workbench, H200). Three or four
// per SM, or two where two fit (9-32), were slower.
inline int64_t mma_balance_slots(int per_sm, int sms) { return int64_t{std::max(per_sm, 2)} * sms; }
struct MmaBlocks {
    std::vector<int32_t> list;
    int64_t groups = 0, most_parts = 1;
};
template <class Rows, class Length>
MmaBlocks mma_blocks(int64_t n_units, int64_t slots, Rows rows, Length length) {
    const auto chunks_of = [&](int64_t u) { return mma_chunks(length(u)); };
    int64_t total = 0;
    for (int64_t u = 0; u < n_units; ++u) total += (rows(u) + kMmaRows - 1) / kMmaRows * chunks_of(u);
    const int64_t max_chunks = slots > 0 ? std::max<int64_t>(1, (total + slots - 1) / slots) : total + 1;
    std::vector<std::array<int64_t, 7>> blocks;  // (chunks, unit, r0, r1, part, parts, group)
    MmaBlocks out;
    for (int64_t u = 0; u < n_units; ++u) {
        const int64_t R = rows(u), runs = (R + kMmaRows - 1) / kMmaRows, chunks = chunks_of(u);
        const int64_t parts = (chunks + max_chunks - 1) / max_chunks;
        out.most_parts = std::max(out.most_parts, parts);
        for (int64_t run = 0; run < runs; ++run, ++out.groups)
            for (int64_t p = 0; p < parts; ++p)
                blocks.push_back({(p + 1) * chunks / parts - p * chunks / parts, u, run * R / runs, (run + 1) * R / runs, p,
                                  parts, out.groups});
    }
    std::stable_sort(blocks.begin(), blocks.end(), [](const auto& x, const auto& y) { return x[0] > y[0]; });
    for (const auto& b : blocks)
        for (int k = 1; k < 7; ++k) out.list.push_back(static_cast<int32_t>(b[k]));
    return out;
}

// A warp's work on one staged chunk, shared by weight_pass_mma and the span pass (w0_span_pass.cuh). The lane
// (g, t) holds rows row0 = 16 tile + g and row1 = row0 + 8; wv_at(row, col0) is where its W (and, from vs, its V)
// at a k-step's columns 2t, 2t+1 lies in the stage; xs the stage's inputs (mma_input_at), read at x_fwd (forward:
// sequence 8j + g, columns 2t, 2t+1) and x_upd, x_upd4 (update: sequences 8j + k0(t), 8j + k1(t) of x(s-2), column g).

// Both products of the chunk's k-steps of this warp's slot: the forward's sums into acc, the update's into grad
// (two chains a k-step, even and odd sequence tiles), and the lane's W kept in wk for the momentum. Both k-steps'
// products first (no shared stores between them, so the loads of the second can be issued early).
template <class M, int NT, class At>
__device__ __forceinline__ void chunk_products(const float* ws, const float* xs, const At& wv_at, int slot, int row0, int row1,
                                               int x_fwd, int x_upd, int x_upd4, const typename M::A (&ld)[NT],
                                               float (&acc)[NT][4], float (&wk)[kMmaWarpSteps][4],
                                               float (&grad)[kMmaWarpSteps][2][4]) {
#pragma unroll
    for (int k = 0; k < kMmaWarpSteps; ++k) {
        const int col0 = 8 * (slot + kMmaSlots * k);
        // W in the accumulator layout: [0: (g, 2t), 1: (g, 2t+1), 2: (g+8, 2t), 3: (g+8, 2t+1)].
        const float2 w0 = *reinterpret_cast<const float2*>(ws + wv_at(row0, col0));
        const float2 w1 = *reinterpret_cast<const float2*>(ws + wv_at(row1, col0));
        wk[k][0] = w0.x; wk[k][1] = w0.y; wk[k][2] = w1.x; wk[k][3] = w1.y;
        // Forward: A = W, B = x(s)[sequence 8j+g][columns 2t, 2t+1]. (g, 2t) and (g, 2t+1) are W's k indices
        // k0(t), k1(t) (a sum may take its terms in any order).
        const typename M::A wa = M::a(wk[k][0], wk[k][2], wk[k][1], wk[k][3]);
#pragma unroll
        for (int p = 0; p < 2; ++p)
#pragma unroll
            for (int e = 0; e < 4; ++e) grad[k][p][e] = 0.0f;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const float2 xv = *reinterpret_cast<const float2*>(xs + x_fwd + 8 * j * kMmaStride + col0);
            M::mma(acc[j], wa, M::b(xv.x, xv.y));
            // Update: A = lr*delta (rows x sequences), B = x(s-2)[sequences 8j+k0(t), 8j+k1(t)][column col0+g].
            const float* xo = xs + 8 * j * kMmaStride + col0;
            M::mma(grad[k][j % 2], ld[j], M::b(xo[x_upd], xo[x_upd4]));
        }
    }
}

// The momentum step on the lane's fragments, in the stage: V = mu V + G / n, W = W + V; a unit not yet enabled
// (!active) keeps its W and gets V = 0. Each lane writes only what it read.
template <int NT, class At>
__device__ __forceinline__ void chunk_momentum(float* ws, float* vs, const At& wv_at, int slot, int row0, int row1,
                                               const float (&wk)[kMmaWarpSteps][4], const float (&grad)[kMmaWarpSteps][2][4],
                                               bool active, float mu, float inv_n) {
#pragma unroll
    for (int k = 0; k < kMmaWarpSteps; ++k) {
        const int col0 = 8 * (slot + kMmaSlots * k);
        float2* w0p = reinterpret_cast<float2*>(ws + wv_at(row0, col0));
        float2* w1p = reinterpret_cast<float2*>(ws + wv_at(row1, col0));
        float2* v0p = reinterpret_cast<float2*>(vs + wv_at(row0, col0));
        float2* v1p = reinterpret_cast<float2*>(vs + wv_at(row1, col0));
        const float2 v0 = *v0p, v1 = *v1p;
        const float v[4] = {v0.x, v0.y, v1.x, v1.y};
        float vn[4], wn[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float gsum = NT > 1 ? __fadd_rn(grad[k][0][e], grad[k][1][e]) : grad[k][0][e];
            vn[e] = active ? __fmaf_rn(mu, v[e], __fmul_rn(gsum, inv_n)) : 0.0f;
            wn[e] = active ? __fadd_rn(wk[k][e], vn[e]) : wk[k][e];
        }
        *w0p = make_float2(wn[0], wn[1]);
        *w1p = make_float2(wn[2], wn[3]);
        *v0p = make_float2(vn[0], vn[1]);
        *v1p = make_float2(vn[2], vn[3]);
    }
}

// Blocks listed by the host as mma_blocks makes them, at most kMmaRows rows; NS a multiple of 8
// with n_seq <= NS (spare sequences staged as zeros with lr*delta 0: they add nothing). Launched with
// mma_shared_bytes<NS, Row::kTiled>() of dynamic shared memory. Chunks of kMmaCols columns stream through the
// stages: chunk i+2's W, V and inputs are in flight while chunk i is computed (W and V loaded into registers one
// chunk ahead left the pass latency-bound: 190-220 us for small's W0 at 4-32 sequences, 1.1 TB/s).
template <class Row, int NS, Precision P = Precision::kFp32>
__global__ void __launch_bounds__(kMmaThreads, NS <= 32 ? 2 : 1) weight_pass_mma(StepArgs a, const int32_t* __restrict__ blocks) {
    static_assert(NS % 8 == 0 && NS >= 8, "sequences in tiles of 8");
    using M = TensorMath<P>;
    constexpr int NT = NS / 8;  // sequence tiles
    constexpr bool kTiled = Row::kTiled;
    constexpr int kStages = mma_stages<kTiled>(), kAhead = 2, kWv = mma_wv_stride<kTiled>();
    constexpr int kStageFloats = mma_stage_floats<NS, kTiled>();
    static_assert(kAhead < kStages && (kTiled || kAhead == kStages - 1), "tiles: a stage is refilled two chunks after its store");
    // (Its own name: the tiles' bulk copies want the stages 128-byte aligned, past the static barriers; the other
    // kernels' `smem` is declared 16-byte aligned. At 16 bytes the pass took 11 us longer at 5-8 sequences, H100.)
    extern __shared__ __align__(128) float pass_smem[];
    float* smem = pass_smem;
    let_next_kernel_launch();
    const int warp = static_cast<int>(threadIdx.x / kWarp), lane = static_cast<int>(threadIdx.x % kWarp);
    const int tile = warp % kMmaTiles, slot = warp / kMmaTiles;
    const int g = lane / 4, t = lane % 4;
    const int32_t* block = blocks + kMmaBlockInts * blockIdx.x;
    const int64_t u = block[0];
    const int r_begin = block[1], r_end = block[2], rows = r_end - r_begin, part = block[3], parts = block[4];
    const int n = static_cast<int>(a.n_seq);
    const int64_t len = Row::length(a, u), first = Row::first_row(a, u);
    const int64_t pitch = Row::pitch(len);
    float* __restrict__ W = a.weights + Row::weight_base(a, first + r_begin, u, len);  // the block's first row
    float* __restrict__ V = a.velocity + (W - a.weights);
    const int all_chunks = static_cast<int>(mma_chunks(len));  // this block's: [c_begin, n_chunks)
    const int c_begin = part * all_chunks / parts, n_chunks = (part + 1) * all_chunks / parts;
    // Chunk i's stage (chunks counted from the block's first, so that a stage's uses count its barrier's phases).
    const auto stage_of = [&](int i) { return (i - c_begin) % kStages; };
    const auto stage = [&](int i) { return smem + stage_of(i) * kStageFloats; };
    const int col = static_cast<int>(threadIdx.x % kMmaCols), lane_row = static_cast<int>(threadIdx.x / kMmaCols);
    constexpr int kPass = kMmaThreads / kMmaCols;
    const int64_t v_minus_w = V - W;

    // W0 in column tiles: a chunk's rows are one contiguous span (kMmaCols floats a row, its next chunk hidden *
    // kMmaCols on), moved whole by bulk copies: in on full[stage], out as one bulk group per chunk.
    static_assert(!kTiled || kMmaCols == kW0TileCols, "a chunk is one column tile");
    const int64_t chunk_step = kTiled ? kMmaCols * a.hidden : kMmaCols;
#if PVM_BULK_COPIES
    const unsigned span_bytes = static_cast<unsigned>(rows * kMmaCols * sizeof(float));
    __shared__ uint64_t full[kTiled ? kStages : 1];
    if constexpr (kTiled) {
        if (threadIdx.x == 0) {
            for (int i = 0; i < kStages; ++i) barrier_init(&full[i], 1);
            barrier_init_fence();
        }
        __syncthreads();
    }
#endif

    // Chunk i into its stage: W, V of the live rows (past the row's end as zeros), then the inputs (sequences
    // past n_seq and columns outside the row as zeros); then a group is committed.
    // In the bucket of 8 (5 to 8 sequences, run as a chained step: dependent_launch.cuh), the first
    // stages' W and V are copied while the kernels before this one finish (none of them writes W or V),
    // their inputs after. Elsewhere the early copies cost 1-5% (H200: unchained at 16 and 32 sequences,
    // chained or not at 64).
    constexpr bool kEarlyWV = NS == 8;
    // A thread's rows of a chunk are lane_row, lane_row + kPass, ...: one pointer per operand, stepped by kPass
    // rows (64-bit products and selects per copy were half of the pass's copy instructions). Pitched rows
    // (W0: 16-byte aligned, zeros past len) move as 16-byte groups instead: thread (quad_row, quad) takes
    // group quad of rows quad_row, quad_row + kQuadPass, ..., a quarter of the copies and stores.
    const int64_t row_step = kPass * pitch;
    constexpr int kQuads = kMmaCols / 4, kQuadPass = kMmaThreads / kQuads;
    const int quad = static_cast<int>(threadIdx.x % kQuads), quad_row = static_cast<int>(threadIdx.x / kQuads);
    const int64_t quad_step = kQuadPass * pitch;
    const auto fetch_wv = [&](int i) {
        if (i >= n_chunks) return;
        float* st = stage(i);
        if constexpr (kTiled) {
            const float* src = W + chunk_step * i;
#if PVM_BULK_COPIES
            if (threadIdx.x == 0) {
                bulk_wait_read<kStages - kAhead - 1>();  // the store of the stage's last chunk has read it
                uint64_t* bar = &full[stage_of(i)];
                barrier_expect(bar, 2 * span_bytes);
                bulk_load(st, src, span_bytes, bar);
                bulk_load(st + kMmaRows * kWv, src + v_minus_w, span_bytes, bar);
            }
#else
            for (int q = threadIdx.x; q < rows * kQuads; q += kMmaThreads) {
                copy_async16(st + 4 * q, src + 4 * q, true);
                copy_async16(st + kMmaRows * kWv + 4 * q, src + v_minus_w + 4 * q, true);
            }
#endif
        } else if constexpr (Row::kPitched) {
            st += quad_row * kWv + 4 * quad;
            const bool quad_ok = kMmaCols * i + 4 * quad < pitch;  // (the padding up to pitch holds zeros)
            const float* src = W + (quad_ok ? quad_row * pitch + kMmaCols * i + 4 * quad : 0);
            const int64_t step = quad_ok ? quad_step : 0;
#pragma unroll
            for (int k = 0; k < kMmaRows / kQuadPass; ++k, src += step) {
                if (quad_row + k * kQuadPass >= rows) break;
                copy_async16(st + k * kQuadPass * kWv, src, quad_ok);
                copy_async16(st + (kMmaRows + k * kQuadPass) * kWv, src + v_minus_w, quad_ok);
            }
        } else {
            st += lane_row * kWv + col;
            const bool col_ok = kMmaCols * i + col < len;
            const float* src = W + (col_ok ? lane_row * pitch + kMmaCols * i + col : 0);
            const int64_t step = col_ok ? row_step : 0;
#pragma unroll
            for (int k = 0; k < kMmaRows / kPass; ++k, src += step) {
                if (lane_row + k * kPass >= rows) break;
                copy_async4(st + k * kPass * kWv, src, col_ok);
                copy_async4(st + (kMmaRows + k * kPass) * kWv, src + v_minus_w, col_ok);
            }
        }
    };
    if constexpr (kEarlyWV)
        for (int i = 0; i < kAhead; ++i) fetch_wv(c_begin + i);
    await_prior_kernels();

    const int64_t s = *a.step;
    const int cur = ring_slot(s), old = ring_slot(s - 2);
    const float* __restrict__ in = Row::input(a, cur, 0, u);
    const float* __restrict__ in_old = Row::input(a, old, 0, u);
    const int64_t stride = Row::input(a, cur, 1, u) - in;
    // Built inputs: this thread's column's place in a row, read a chunk ahead
    // (fetch_inputs runs in chunk order) so that the copies do not wait for it.
    const int32_t* __restrict__ index = Row::input_index(a, u);
    int32_t next_place = index && kMmaCols * c_begin + col < len ? index[kMmaCols * c_begin + col] : 0;
    const float lr = a.unit_lr[u], mu = a.unit_mu[u], inv_n = 1.0f / static_cast<float>(n);
    const bool active = !(lr == 0.0f && mu == 0.0f);
    // This lane's two staged rows (g and g+8 of the warp's tile); a row past the block's end computes on
    // whatever its shared rows hold and is not written back (rows of a product do not mix).
    const int row0 = 16 * tile + g, row1 = 16 * tile + g + 8;
    const bool live0 = row0 < rows, live1 = row1 < rows;
    // Where the lane's W and V are in a stage: rows row0, row1 at a k-step's columns 2t, 2t+1 (col0 + 2t for the
    // k-step at col0), and for tiles the 16-byte group col0 / 4 + t / 2 swizzled by the rows' key (both rows'
    // keys are (r_begin + g) % 8: w0_tile_col).
    const int key = (r_begin + g) % 8;
    const auto wv_at = [&](int row, int col0) {
        return kTiled ? row * kWv + (((col0 / 4 + t / 2) ^ key) * 4) + (2 * t) % 4 : row * kWv + col0 + 2 * t;
    };
    // Where the lane reads its inputs in a stage. Forward: sequence 8j + g at columns 2t, 2t+1 of a k-step;
    // update: sequences 8j + k0(t) and 8j + k1(t) of x(s-2) at column g.
    const int x_fwd = mma_input_at(g, 2 * t), x_upd = mma_input_at(NS + M::k0(t), g), x_upd4 = mma_input_at(NS + M::k1(t), g);

    // The update's A operand, lr*delta[row, sequence], converted once: rows g, g+8, sequences 8j+k0(t), 8j+k1(t).
    typename M::A ld[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int q = 8 * j + (e >= 2 ? M::k1(t) : M::k0(t));
            const bool row_ok = (e % 2 == 0) ? live0 : live1;
            const int64_t r = first + r_begin + ((e % 2 == 0) ? row0 : row1);
            v[e] = q < n && row_ok ? Row::lr_delta(a, q, r, u) : 0.0f;
        }
        ld[j] = M::a(v[0], v[1], v[2], v[3]);
    }
    float acc[NT][4];  // forward sums: (row g, sequence 8j+2t), (g, 8j+2t+1), (g+8, 8j+2t), (g+8, 8j+2t+1)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

    constexpr int kInputs = 2 * kMmaRows * kWv;  // where a stage's inputs start
    const auto fetch_inputs = [&](int i) {  // then commits the chunk's group
        if (i < n_chunks) {
            float* xs = stage(i) + kInputs;
            const int64_t c0 = kMmaCols * i;
            // x(s) rows 0..NS-1, x(s-2) rows NS..2NS-1: the chunk's columns.
            const bool col_ok = c0 + col < len;
            int64_t column = c0 + col;  // the column's place in a row
            if (index) {
                column = next_place;
                if (c0 + kMmaCols + col < len) next_place = index[c0 + kMmaCols + col];
            }
            const float* src = in + (col_ok ? lane_row * stride + column : 0);
            const int64_t old_minus_cur = in_old - in, step = col_ok ? kPass * stride : 0;
#pragma unroll
            for (int k = 0; k < NS / kPass; ++k, src += step) {
                const int q = lane_row + k * kPass;
                if (q >= n) break;  // (zeroed once, below)
                copy_async4(xs + mma_input_at(q, col), src, col_ok);
                copy_async4(xs + mma_input_at(NS + q, col), src + old_minus_cur, col_ok);
            }
        }
        copy_async_commit();
    };
    const auto fetch = [&](int i) {
        fetch_wv(i);
        fetch_inputs(i);
    };

    // The rows of sequences past n_seq are never copied: zeros in every stage, once (the main loop's first
    // barrier orders these stores before any read).
    for (int e = threadIdx.x; e < kStages * 2 * (NS - n) * kMmaCols; e += kMmaThreads) {
        const int c = e % kMmaCols, q = n + (e / kMmaCols) % (NS - n), half = (e / kMmaCols / (NS - n)) % 2;
        const int st = e / kMmaCols / (NS - n) / 2;
        smem[st * kStageFloats + kInputs + mma_input_at(half * NS + q, c)] = 0.0f;
    }
    for (int i = 0; i < kAhead; ++i) {  // (group 0 holds every early W and V)
        if constexpr (!kEarlyWV) fetch_wv(c_begin + i);
        fetch_inputs(c_begin + i);
    }
    for (int i = c_begin; i < n_chunks; ++i) {
        copy_async_wait<kAhead - 1>();  // chunk i has landed (this thread's copies) ...
#if PVM_BULK_COPIES
        if constexpr (kTiled) barrier_wait(&full[stage_of(i)], ((i - c_begin) / kStages) % 2);  // (and its W and V)
#endif
        __syncthreads();  // ... and every thread's; all are done with chunk i-1's stage
        fetch(i + kAhead);
        float* ws = stage(i);
        float* vs = ws + kMmaRows * kWv;
        const float* xs = ws + kInputs;  // (W and inputs past a row's end are staged as 0)
        float wk[kMmaWarpSteps][4], grad[kMmaWarpSteps][2][4];
        chunk_products<M>(ws, xs, wv_at, slot, row0, row1, x_fwd, x_upd, x_upd4, ld, acc, wk, grad);
        // The new W and V replace the old in the stage: each lane writes only what it read. Tiles go back whole,
        // so a unit not yet enabled writes its W unchanged and its V as zeros; pitched rows and W1 skip it here
        // and zero V where it is not (below).
        if (kTiled || active) chunk_momentum<NT>(ws, vs, wv_at, slot, row0, row1, wk, grad, active, mu, inv_n);
        // Every warp's update of the chunk is in the stage: the block writes its rows back as whole 32-float
        // segments (each lane storing its own fragment wrote 3.2 L2 sectors per 32 bytes).
#if PVM_BULK_COPIES
        if constexpr (kTiled) fence_async_shared();  // (this thread's new W and V, before the copy engine reads them)
#endif
        __syncthreads();
        if constexpr (kTiled) {
            float* dst = W + chunk_step * i;
#if PVM_BULK_COPIES
            if (threadIdx.x == 0) {
                bulk_store(dst, ws, span_bytes);
                bulk_store(dst + v_minus_w, vs, span_bytes);
                bulk_commit();
            }
#else
            for (int q = threadIdx.x; q < rows * kQuads; q += kMmaThreads) {
                store16(dst + 4 * q, *reinterpret_cast<const float4*>(ws + 4 * q));
                store16(dst + v_minus_w + 4 * q, *reinterpret_cast<const float4*>(vs + 4 * q));
            }
#endif
        } else if constexpr (Row::kPitched) {  // 16-byte groups; the padding's zeros go back as zeros
            if (kMmaCols * i + 4 * quad < pitch) {
                float* dst = W + quad_row * pitch + kMmaCols * i + 4 * quad;
                const float* from = ws + quad_row * kWv + 4 * quad;
#pragma unroll
                for (int k = 0; k < kMmaRows / kQuadPass; ++k, dst += quad_step) {
                    if (quad_row + k * kQuadPass >= rows) break;
                    const float4 w_new = *reinterpret_cast<const float4*>(from + k * kQuadPass * kWv);
                    const float4 v_new = *reinterpret_cast<const float4*>(from + (kMmaRows + k * kQuadPass) * kWv);
                    if (active) {
                        store16(dst, w_new);
                        store16(dst + v_minus_w, v_new);
                    } else if (v_new.x != 0.0f || v_new.y != 0.0f || v_new.z != 0.0f || v_new.w != 0.0f) {
                        store16(dst + v_minus_w, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
                    }
                }
            }
        } else if (kMmaCols * i + col < len) {
            float* dst = W + lane_row * pitch + kMmaCols * i + col;
            const float* from = ws + lane_row * kWv + col;
#pragma unroll
            for (int k = 0; k < kMmaRows / kPass; ++k, dst += row_step) {
                if (lane_row + k * kPass >= rows) break;
                const float w_new = from[k * kPass * kWv], v_new = from[(kMmaRows + k * kPass) * kWv];
                if (active) {
                    dst[0] = w_new;
                    dst[v_minus_w] = v_new;
                } else if (v_new != 0.0f) {
                    dst[v_minus_w] = 0.0f;
                }
            }
        }
    }
    // The forward sums of the two slots, slot 0's plus slot 1's (a fixed order), through stage 0.
    static_assert(kMmaSlots == 2, "the sums of two slots are combined");
    static_assert(kMmaTiles * NT * 4 * kWarp <= kStageFloats, "the partial sums fit one stage");
    copy_async_wait<0>();
#if PVM_BULK_COPIES
    if (kTiled && threadIdx.x == 0) bulk_wait<0>();  // the stores are done (with the stages, and the block)
#endif
    __syncthreads();  // every warp is done with the stages
    float* sums = smem + tile * (NT * 4 * kWarp);
    if (slot == 1)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) sums[(j * 4 + e) * kWarp + lane] = acc[j][e];
    __syncthreads();
    if (slot == 0) {
        const int64_t R = Row::rows(a);
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int q = 8 * j + 2 * t + (e % 2);
                const bool row_ok = e < 2 ? live0 : live1;
                if (q >= n || !row_ok) continue;
                const int64_t r = first + r_begin + (e < 2 ? row0 : row1);
                const float total = __fadd_rn(acc[j][e], sums[(j * 4 + e) * kWarp + lane]);
                if (parts == 1) *Row::output(a, cur, q, r, u) = activation(total, a.polynomial);
                else a.mma_partial[(static_cast<int64_t>(part) * n + q) * R + r] = total;
            }
    }
    if (parts == 1) return;

    // A split run: the last of its blocks to finish adds the parts' sums in part order (a fixed order,
    // whichever block is last) and leaves the run's counter at zero for the next step.
    __shared__ bool last;
    __threadfence();  // this block's sums are visible device-wide before it is counted
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(a.mma_count + block[5], 1) == parts - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int64_t R = Row::rows(a);
    for (int e = threadIdx.x; e < rows * n; e += kMmaThreads) {
        const int64_t q = e / rows, r = first + r_begin + e % rows;
        float total = __ldcg(a.mma_partial + q * R + r);
        for (int p = 1; p < parts; ++p) total = __fadd_rn(total, __ldcg(a.mma_partial + (p * n + q) * R + r));
        *Row::output(a, cur, q, r, u) = activation(total, a.polynomial);
    }
    if (threadIdx.x == 0) a.mma_count[block[5]] = 0;
}

}  // namespace kernels
}  // namespace pvm
