// The kernels of one training step (pvm-algorithm.md §3.3-3.7). Each reads the step counter from
// device memory, so the step can be captured once as a CUDA graph and replayed.
//
// Summation orders are fixed (a lane-strided sum per lane, then a butterfly over the warp; sums over
// outputs and over sequences in index order), and no float atomics are used: two runs on the same
// device are bit-identical.
#pragma once

#include <cstdint>

#include "dependent_launch.cuh"
#include "pvm/numerics.h"
#include "pvm/topology.h"

namespace pvm {
namespace kernels {

constexpr int kRing = 3;
constexpr int kThreads = 256;
constexpr int kWarp = 32;

struct StepArgs {
    int64_t n_seq, n_units, hidden, y_total, h_total, image_size, n_raw;
    int64_t x_stride;                  // floats per sequence in the x ring: x_total, or the step's sources (x_index)
    int64_t delta_group;               // sequences per group of output_deltas (delta_group_seqs)
    bool polynomial, opt_abs_diff;
    int derivative;
    const int64_t *x_off, *y_off, *h_off, *w0_off, *w1_off, *h_bias, *raw_dst, *raw_src, *target_src;
    const int64_t* baseline_src;       // per output: the x(s-2) entry copy-last-frame predicts it with, -1 above layer 0
    const int32_t* x_gather;          // per entry of an x ring row: its source index | its XSource << kGatherKindShift
    const int32_t* x_index;           // from 2 sequences, per input entry: its place in a ring row (the row holds
                                      // the step's sources; W0's pass and products gather x through this), else null
    const int32_t* y_unit;
    const int32_t* unit_order;        // 1-4 sequences: the units in the order hidden_deltas takes them, else null
    float *weights, *velocity, *x, *h, *y;
    const float *unit_lr, *unit_mu;
    float *delta_out, *lr_delta_hidden;
    float* mma_partial;                // weight_pass_mma, a split run: per part p, sequence q, row r the part's forward sum
    int32_t* mma_count;                // weight_pass_mma: per run (group), its blocks done this step (0 between steps)
    double* error_sq;                  // per sequence group g, output j: sum over the measured steps since the metrics
                                       // were taken of the sum over g's sequences (in order) of error^2
    double* metric_sums;
    double* unit_error;                // per unit: sum of squared errors of the two-step and one-step halves
    double* baseline_sq;               // per group, layer-0 output j: the same for copying frame s-2
    double* unit_baseline;             // per layer-0 unit: baseline_sq summed per half, like unit_error
    double* baseline_sums;             // two-step, one-step: the copy-last-frame baseline's metric sums
    const int64_t* layer_unit_range;  // per layer: first unit id (n_layers + 1 entries)
    int64_t n_layers;
    int64_t* metric_steps;
    int64_t* step;
};

__device__ __forceinline__ int ring_slot(int64_t s) { return static_cast<int>(((s % kRing) + kRing) % kRing); }

__device__ __forceinline__ int64_t global_thread() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_threads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// Element-wise kernels use a 2-D grid: x over the elements of one sequence, y over sequences.
__device__ __forceinline__ int64_t seq_index() { return blockIdx.y; }

// x(s) of every sequence: the compressed frame, kappa(h(s-1)), x(s-1)'s new signal, or 1 (§3.4). From 5
// sequences (CudaEngine::built_inputs) a ring row holds the step's sources instead: kappa(h(s-1)) once per
// hidden entry, then the other inputs; x_gather lists them, and W0's pass and products gather x (x_index).
// A thread per (ring row entry, group of kGatherSeqs sequences): the entry's packed source (x_gather:
// src | kind << kGatherKindShift) is read once, the kind decides one loop for the whole group, and the
// group's loads are issued before its stores (the compiler cannot move a load of the rings past a
// store to them). Grid: x over entries, y over groups. Measured on an H200 (small, n_seq 256): one
// thread walking all sequences 378 us; groups of 4 with the kind tested per sequence and 64-bit
// (int64 src + int8 kind) sources 242 us, compute-bound on index arithmetic.
constexpr int kGatherSeqs = 8;
constexpr int kGatherKindShift = 30;

// frames: this step's n_seq frames, or with n_frames > 0 a device-resident dataset of n_frames such
// blocks, of which the step takes block (step - first) mod n_frames (read from the step counter on the
// device, so that one captured graph serves every step, with no copy of the block first).
// A thread takes E entries, gridDim.x * blockDim.x apart, and reads their packed sources before it waits on the
// kernels before it (x_gather never changes): the loads after the wait are then the step counter and the sources.
// H200, the gather phase at one sequence (E = 1 / 2): small 7.9 / 7.7 us, med 11.4 / 10.2, LARGE 27.0 / 22.7 (26.0
// before the sources were read early); frames/s of E = 2 against 1 at 1 / 2 / 4 sequences: small +0.2 / -0.0 /
// -0.5%, med +0.7 / +0.5 / +0.2%, LARGE +0.9 / +0.9 / +0.7%.
constexpr int kGatherEntries = 2;
template <class Pixel, int E>
__global__ void assemble_inputs(StepArgs a, const Pixel* __restrict__ frames, int64_t n_frames, int64_t first) {
    let_next_kernel_launch();
    const int64_t i0 = global_thread(), span = int64_t{gridDim.x} * blockDim.x, q0 = int64_t{blockIdx.y} * kGatherSeqs;
    int32_t packed[E];
#pragma unroll
    for (int e = 0; e < E; ++e) packed[e] = i0 + e * span < a.x_stride ? a.x_gather[i0 + e * span] : 0;
    await_prior_kernels();
    if (i0 >= a.x_stride) return;
    const int64_t s = *a.step;
    if (n_frames > 0) {
        int64_t b = (s - first) % n_frames;
        if (b < 0) b += n_frames;
        frames += b * a.n_seq * a.image_size;
    }
    const int cur = ring_slot(s), prev = ring_slot(s - 1);
    const int live = static_cast<int>(a.n_seq - q0 < kGatherSeqs ? a.n_seq - q0 : kGatherSeqs);
    float v[E][kGatherSeqs];
#pragma unroll
    for (int e = 0; e < E; ++e) {
        if (i0 + e * span >= a.x_stride) break;  // (past the row: so are the later ones)
        const int64_t src = packed[e] & ((int32_t{1} << kGatherKindShift) - 1);
        const int kind = static_cast<int>(static_cast<uint32_t>(packed[e]) >> kGatherKindShift);
        if (kind == FromFrame) {
            const Pixel* p = frames + q0 * a.image_size + src;
#pragma unroll
            for (int k = 0; k < kGatherSeqs; ++k)
                if (k < live) v[e][k] = compress_pixel(p[k * a.image_size]);
        } else if (kind == FromHidden) {
            const float* p = a.h + (prev * a.n_seq + q0) * a.h_total + src;
#pragma unroll
            for (int k = 0; k < kGatherSeqs; ++k)
                if (k < live) v[e][k] = kappa(p[k * a.h_total]);
        } else if (kind == FromPrevious) {
            const float* p = a.x + (prev * a.n_seq + q0) * a.x_stride + src;
#pragma unroll
            for (int k = 0; k < kGatherSeqs; ++k)
                if (k < live) v[e][k] = p[k * a.x_stride];
        } else {
#pragma unroll
            for (int k = 0; k < kGatherSeqs; ++k) v[e][k] = 1.0f;
        }
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
        if (i0 + e * span >= a.x_stride) break;
        float* out = a.x + (cur * a.n_seq + q0) * a.x_stride + i0 + e * span;
#pragma unroll
        for (int k = 0; k < kGatherSeqs; ++k)
            if (k < live) out[k * a.x_stride] = v[e][k];
    }
}

// The raw context of feed-context mode (§3.10), launched only in that mode. The constant 1 of every
// hidden vector needs no pass per step: no kernel writes those entries, the rings start all ones, and
// set_hidden_bias puts them back after the host writes h (a launch fewer per step).
__global__ void assemble_hidden(StepArgs a) {
    let_next_kernel_launch();
    await_prior_kernels();
    const int64_t s = *a.step, q = seq_index();
    const int cur = ring_slot(s), prev = ring_slot(s - 1);
    float* hc = a.h + (cur * a.n_seq + q) * a.h_total;
    for (int64_t r = global_thread(); r < a.n_raw; r += grid_threads())
        hc[a.raw_dst[r]] = a.h[(prev * a.n_seq + q) * a.h_total + a.raw_src[r]];
}

// W0's rows on the device start on 16-byte boundaries: a row of len inputs takes w0_pitch(len) floats, the
// padding held at zero, so whole chunks of a row move as 16-byte copies. a.w0_off (and a.w1_off after W0) are
// these padded offsets; the host's layout (checkpoints, read/write, the CPU engines) stays packed, and the
// CUDA engine packs and unpacks (repitch_w0). W1's rows stay packed.
__host__ __device__ constexpr int64_t w0_pitch(int64_t len) { return (len + 3) / 4 * 4; }

// Where the engine runs W0's pass on tensor cores (5 to 64 sequences: weight_pass_mma, which stages a run of
// rows kW0TileCols columns at a time), W0 is held in column tiles instead: unit u's columns [32j, 32j + 32) of
// all its hidden rows, row after row, then the next 32 columns. A run's chunk is then one contiguous span, not
// a row segment of 128 bytes a pitch apart for every row: the pass's traffic alone, without its arithmetic, ran
// at 69% of the copy rate in row segments and at 98% in contiguous spans (dev/cuda/stream_pattern.cu, H100).
// A row takes w0_row_floats(len, true) floats of its unit's span, zeros past len.
// Within a tile's row (128 bytes) the 16-byte groups are swizzled: group c of row k sits at c ^ (k % 8). The
// pass copies a chunk into shared memory as it lies (one bulk copy) and reads the tensor cores' fragments there
// (rows g, g + 8 at one column pair for g < 8): unswizzled, those 8 rows would share their banks.
constexpr int64_t kW0TileCols = 32;
__host__ __device__ constexpr int64_t w0_row_floats(int64_t len, bool tiled) {
    return tiled ? (len + kW0TileCols - 1) / kW0TileCols * kW0TileCols : w0_pitch(len);
}
// Where column c (< kW0TileCols) of row k of a tile lies within the row.
__host__ __device__ constexpr int w0_tile_col(int64_t k, int c) { return (((c / 4) ^ static_cast<int>(k % 8)) * 4) + c % 4; }
// Entry i of row k of a unit of `hidden` rows and len inputs, from the unit's first float on the device.
__host__ __device__ constexpr int64_t w0_at(int64_t k, int64_t i, int64_t len, int64_t hidden, bool tiled) {
    return tiled ? (i / kW0TileCols * hidden + k) * kW0TileCols + w0_tile_col(k, static_cast<int>(i % kW0TileCols))
                 : k * w0_pitch(len) + i;
}

// W0 between the host's packed rows (packed_off: Topology::w0_off) and the device's layout (device_off; pitched
// rows or column tiles): block u * hidden + k copies row k of unit u. On the device the padding is written as zeros.
__global__ void repitch_w0(const float* __restrict__ from, float* __restrict__ to, const int64_t* __restrict__ x_off,
                           const int64_t* __restrict__ packed_off, const int64_t* __restrict__ device_off, int64_t hidden,
                           bool to_device, bool tiled) {
    const int64_t u = blockIdx.x / hidden, k = blockIdx.x % hidden;
    const int64_t len = x_off[u + 1] - x_off[u], floats = w0_row_floats(len, tiled);
    const int64_t packed = packed_off[u] + k * len;
    for (int64_t i = threadIdx.x; i < floats; i += blockDim.x) {
        const int64_t d = device_off[u] + w0_at(k, i, len, hidden, tiled);
        if (to_device) to[d] = i < len ? from[packed + i] : 0.0f;
        else if (i < len) to[packed + i] = from[d];
    }
}

// The constant 1 of every hidden vector: block row y sets vector y (ring slot x sequence) of h_total entries.
__global__ void set_hidden_bias(float* h, const int64_t* __restrict__ h_bias, int64_t n_units, int64_t h_total) {
    for (int64_t i = global_thread(); i < n_units; i += grid_threads()) h[blockIdx.y * h_total + h_bias[i]] = 1.0f;
}

// Loads of kSeqGroup sequences are issued before their stores (or sums): the compiler cannot tell the
// rings from error/delta_out apart, so a plain loop would wait for each load (188 -> 116 us at n_seq 256).
constexpr int kSeqGroup = 8;

// output_deltas splits the sequences into at most kDeltaGroups groups of whole kSeqGroup runs (one
// group up to kSeqGroup sequences, so small batches sum their errors exactly as before).
constexpr int64_t kDeltaGroups = 16;
__host__ __device__ inline int64_t delta_group_seqs(int64_t n_seq) {
    const int64_t runs = (n_seq + kSeqGroup - 1) / kSeqGroup;
    const int64_t groups = runs < kDeltaGroups ? runs : kDeltaGroups;
    return (runs + groups - 1) / groups * kSeqGroup;
}
__host__ __device__ inline int64_t delta_groups(int64_t n_seq, int64_t group_seqs) { return (n_seq + group_seqs - 1) / group_seqs; }

// Output j's deltas for sequences q_begin <= q < q_end (group g of output_deltas) at step s (ring slots cur of s,
// old of s - 2), with put(q, delta) storing each; its squared errors (and the baseline's, for a layer-0 output:
// base >= 0) added to row g of error_sq (baseline_sq) from step 2. target and base: target_src[j] and
// baseline_src[j]. (output_deltas, and hidden_deltas at 1-2 sequences, which computes its unit's deltas itself.)
// The sequences' loads are issued W at a time (output_deltas: kSeqGroup).
template <int W, class Put>
__device__ __forceinline__ void output_delta(const StepArgs& a, int64_t s, int cur, int old, int64_t j, int64_t target,
                                             int64_t base, int64_t g, int64_t q_begin, int64_t q_end, Put&& put) {
    // Every load that does not depend on another is issued first: the sums so far, then the inputs (issued
    // after the delta_out stores, the sums' loads were a round trip of their own, the compiler not knowing that
    // they do not alias). With the baseline in the same loop, H100: the deltas phase 24.9 -> 22.7 us at 5
    // sequences (small), 72.0 -> 68.2 at 64; LARGE 64 342 -> 318.
    const bool measured = s >= 2;  // steps 0 and 1 compare against the initial all-ones rings: not measured
    const bool baseline = measured && base >= 0;  // (a layer-0 output)
    const double e2_before = measured ? a.error_sq[g * a.y_total + j] : 0.0;
    const double b2_before = baseline ? a.baseline_sq[g * a.y_total + j] : 0.0;
    double e2 = 0.0, b2 = 0.0;
    for (int64_t q0 = q_begin; q0 < q_end; q0 += W) {
        float yo[W], t[W], xo[W];
#pragma unroll
        for (int k = 0; k < W; ++k) {
            const int64_t q = q0 + k;
            if (q >= q_end) break;
            yo[k] = a.y[(old * a.n_seq + q) * a.y_total + j];
            t[k] = a.x[(cur * a.n_seq + q) * a.x_stride + target];
            xo[k] = baseline ? a.x[(old * a.n_seq + q) * a.x_stride + base] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < W; ++k) {
            const int64_t q = q0 + k;
            if (q >= q_end) break;
            float e = t[k] - yo[k];
            e2 += static_cast<double>(e) * static_cast<double>(e);
            const double b = static_cast<double>(t[k]) - static_cast<double>(xo[k]);
            b2 += b * b;
            if (a.opt_abs_diff && j < a.n_units) e = static_cast<float>((e > 0.0f) - (e < 0.0f));
            put(q, delta(yo[k], e, a.polynomial, static_cast<Derivative>(a.derivative)));
        }
    }
    if (!measured) return;
    a.error_sq[g * a.y_total + j] = e2_before + e2;
    if (baseline) a.baseline_sq[g * a.y_total + j] = b2_before + b2;
}

// e = x(s)[target] - y(s-2); delta_out = g(y(s-2)) * e (after the opt_abs_diff sign quirk, §3.11).
// e itself is not stored (output_errors rebuilds it when asked: 70 MB a step less at n_seq 256, small).
// For a layer-0 output also the copy-last-frame baseline's squared error, into baseline_sq: the sum over
// sequences (in order) of (x(s)[target] - x(s-2)[base])^2, the difference in double, in the same loop (56
// registers under the bound for 4 blocks per SM, no spills; it had a loop of its own that reloaded x(s)[target]).
// Grid: x over outputs, y over groups of delta_group sequences, each group's squared errors summed
// (in sequence order) and added to a row of error_sq / baseline_sq of its own (from step 2, until the
// metrics are taken); sum_unit_errors adds the rows in group order. (One thread per output walking all
// 256 sequences: 147 us on an H200, small, at 22% occupancy and 2.2 TB/s: too few threads to cover the
// loads' latency.)
__global__ void __launch_bounds__(kThreads, 4) output_deltas(StepArgs a) {
    let_next_kernel_launch();
    await_prior_kernels();
    const int64_t s = *a.step, g = blockIdx.y;
    const int cur = ring_slot(s), old = ring_slot(s - 2);
    const int64_t q_begin = g * a.delta_group;
    const int64_t q_end = q_begin + a.delta_group < a.n_seq ? q_begin + a.delta_group : a.n_seq;
    for (int64_t j = global_thread(); j < a.y_total; j += grid_threads())
        output_delta<kSeqGroup>(a, s, cur, old, j, a.target_src[j], a.baseline_src[j], g, q_begin, q_end,
                     [&](int64_t q, float d) { a.delta_out[q * a.y_total + j] = d; });
}

// The sums of v[0:M/2] and v[M/2:M] (two-step half, one-step half) into out[0], out[1], where v[j] is
// the sum over the rows g < groups of row[g * stride + j] (in order): thread-strided partial sums,
// then a tree over the block (fixed order). Called by a whole block.
__device__ void sum_halves(const double* row, int64_t stride, int64_t groups, int64_t M, double* out) {
    const int64_t P = M / 2;
    double e2[2] = {0.0, 0.0};
    for (int64_t j = threadIdx.x; j < M; j += blockDim.x) {
        double v = row[j];
        for (int64_t g = 1; g < groups; ++g) v += row[g * stride + j];
        e2[j < P ? 0 : 1] += v;
    }
    __shared__ double part[2][kThreads];
    __syncthreads();  // a previous call's tree is done with part
    part[0][threadIdx.x] = e2[0];
    part[1][threadIdx.x] = e2[1];
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) {
            part[0][threadIdx.x] += part[0][threadIdx.x + stride];
            part[1][threadIdx.x] += part[1][threadIdx.x + stride];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[0] = part[0][0];
        out[1] = part[1][0];
    }
}

// One unit's squared-error sums per half from error_sq, and for a layer-0 unit the baseline's from
// baseline_sq. Called by a whole block (u is the same for all its threads).
__device__ void sum_unit_errors(const StepArgs& a, int64_t u) {
    const int64_t M = a.y_off[u + 1] - a.y_off[u], groups = delta_groups(a.n_seq, a.delta_group);
    sum_halves(a.error_sq + a.y_off[u], a.y_total, groups, M, a.unit_error + 2 * u);
    if (u < a.layer_unit_range[1]) sum_halves(a.baseline_sq + a.y_off[u], a.y_total, groups, M, a.unit_baseline + 2 * u);
}

// Per (layer, half) sums of squared errors: the unit sums (left in unit_error) of the bin's layer,
// added by one warp per bin (lane-strided, then a butterfly: a fixed order, no atomics). The bins of
// layer 0 (0: two-step, 1: one-step) add the baseline's unit sums (unit_baseline) the same way.
__global__ void accumulate_metrics(StepArgs a) {
    const int bin = blockIdx.x, lane = threadIdx.x;
    const bool layer0 = bin < 2;
    double total = 0.0, baseline = 0.0;
    for (int64_t u = a.layer_unit_range[bin / 2] + lane; u < a.layer_unit_range[bin / 2 + 1]; u += kWarp) {
        total += a.unit_error[2 * u + bin % 2];
        if (layer0) baseline += a.unit_baseline[2 * u + bin];
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
        total += __shfl_xor_sync(0xffffffffu, total, offset);
        baseline += __shfl_xor_sync(0xffffffffu, baseline, offset);
    }
    if (lane == 0) {
        a.metric_sums[bin] += total;
        if (layer0) a.baseline_sums[bin] += baseline;
    }
}

// An L2 policy keeping what it touches past ordinary lines (evict_last), and a load under a policy (sm_80+). W1 and V1
// are read and written under it by the W1 pass at 1-2 sequences (w1_stream_pass), and W1 is read under it by the hidden
// deltas up to 32 sequences (hidden_deltas, hidden_deltas_split, the product's 32-column tiles: unit_products.cuh), so
// that more of them are still in L2 when the W1 pass and the next step come back to them while W0 and V0 stream
// through. H200, frames/s against no hints:
//   - the W1 pass and the hidden deltas at one sequence (two runs of 2-3 rounds): small +0.7 / +1.7%, med +0.4 / +0.8%,
//     LARGE +0.9 / +1.9%; two sequences 0.0%, 0.0%, +0.5%;
//   - the hidden deltas alone at 3 / 4 sequences (the W1 pass there, weight_pass_short, has no hints; with them too it
//     lost 1% on small): small +1.5 / +1.5%, med -0.1 / -0.1%, LARGE +0.4 / +0.4%; at 5 / 8 / 16: small +1.7 / +1.7 /
//     +1.5%, med +0.2 / +0.1 / -0.1%, LARGE +0.4 / +0.4 / -0.1%. (Why the reads alone pay there was not measured; on
//     small the W0 pass, timed alone, was 1-4 us shorter with them.)
// A persisting share of L2 for W1 and V1 (cudaLimitPersistingL2CacheSize, min(W1 + V1, 37.5 MiB)) lost 14% (small) to
// 51% (LARGE) at one sequence: the W0 pass, left the rest of L2 for its writes, slowed from 67 to 87 us (small) and
// 131 to 290 us (med).
__device__ __forceinline__ uint64_t l2_evict_last() {
    uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
#endif
    return policy;
}
// (volatile: a load of memory that kernels before may write stays after await_prior_kernels even where its address
// is known before it)
__device__ __forceinline__ float load_with(const float* p, uint64_t policy) {
    float v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ld.global.L2::cache_hint.f32 %0, [%1], %2;\n" : "=f"(v) : "l"(p), "l"(policy));
#else
    (void)policy;
    v = *p;
#endif
    return v;
}

__global__ void advance_step(StepArgs a) {
    let_next_kernel_launch();
    await_prior_kernels();
    if (*a.step >= 2) *a.metric_steps += 1;  // a measured step (output_deltas added its errors)
    *a.step += 1;
}

// ----------------------------------------------------------------------------------------------
// The fused weight passes: one warp per weight row reads W and V once, computing the forward dot
// product of step s with the old W, and the momentum update with the s-2 activations.

struct RowW0 {  // row (u, k) of W0: h(s)[k] = phi(W0[k,:] . x(s)); update with lr*dh(s-2) x x(s-2)
    static constexpr bool kPitched = true;  // rows w0_pitch(len) apart, 16-byte aligned
    static constexpr bool kTiled = false;
    __device__ static int64_t pitch(int64_t len) { return w0_pitch(len); }
    __device__ static int64_t rows(const StepArgs& a) { return a.n_units * a.hidden; }
    __device__ static int64_t unit(const StepArgs& a, int64_t r) { return r / a.hidden; }
    __device__ static int64_t first_row(const StepArgs& a, int64_t u) { return u * a.hidden; }
    __device__ static int64_t length(const StepArgs& a, int64_t u) { return a.x_off[u + 1] - a.x_off[u]; }
    __device__ static int64_t weight_base(const StepArgs& a, int64_t r, int64_t u, int64_t len) {
        return a.w0_off[u] + (r % a.hidden) * w0_pitch(len);
    }
    // Sequence q's inputs of unit u in a ring slot: entry i at input(...)[i], or with built inputs at
    // input(...)[input_index(...)[i]].
    __device__ static const float* input(const StepArgs& a, int slot, int64_t q, int64_t u) {
        return a.x + (slot * a.n_seq + q) * a.x_stride + (a.x_index ? 0 : a.x_off[u]);
    }
    __device__ static const int32_t* input_index(const StepArgs& a, int64_t u) { return a.x_index ? a.x_index + a.x_off[u] : nullptr; }
    __device__ static float lr_delta(const StepArgs& a, int64_t q, int64_t r, int64_t u) {
        return a.lr_delta_hidden[q * a.h_total + a.h_off[u] + r % a.hidden];
    }
    __device__ static float* output(const StepArgs& a, int slot, int64_t q, int64_t r, int64_t u) {
        return a.h + (slot * a.n_seq + q) * a.h_total + a.h_off[u] + r % a.hidden;
    }
};
// W0's rows in column tiles (w0_at with tiled): for weight_pass_mma only, whose chunks are the tiles. pitch(len)
// stays the columns a pass moves (the tile's padding past w0_pitch(len) is never read); a row's next chunk is
// hidden * kW0TileCols floats on, its next row kW0TileCols.
struct RowW0Tiled : RowW0 {
    static constexpr bool kTiled = true;
    __device__ static int64_t weight_base(const StepArgs& a, int64_t r, int64_t u, int64_t) {
        return a.w0_off[u] + (r % a.hidden) * kW0TileCols;
    }
};

struct RowW1 {  // row (u, j) of W1: y(s)[j] = phi(W1[j,:] . h(s)); update with lr*do(s-2) x h(s-2)
    static constexpr bool kPitched = false;  // rows len apart, at any 4-byte phase
    static constexpr bool kTiled = false;
    __device__ static int64_t pitch(int64_t len) { return len; }
    __device__ static int64_t rows(const StepArgs& a) { return a.y_total; }
    __device__ static int64_t unit(const StepArgs& a, int64_t r) { return a.y_unit[r]; }
    __device__ static int64_t first_row(const StepArgs& a, int64_t u) { return a.y_off[u]; }
    __device__ static int64_t length(const StepArgs& a, int64_t u) { return a.h_off[u + 1] - a.h_off[u]; }
    __device__ static int64_t weight_base(const StepArgs& a, int64_t r, int64_t u, int64_t len) {
        return a.w1_off[u] + (r - a.y_off[u]) * len;
    }
    __device__ static const float* input(const StepArgs& a, int slot, int64_t q, int64_t u) {
        return a.h + (slot * a.n_seq + q) * a.h_total + a.h_off[u];
    }
    __device__ static const int32_t* input_index(const StepArgs&, int64_t) { return nullptr; }
    __device__ static float lr_delta(const StepArgs& a, int64_t q, int64_t r, int64_t u) {
        return __fmul_rn(a.unit_lr[u], a.delta_out[q * a.y_total + r]);
    }
    __device__ static float* output(const StepArgs& a, int slot, int64_t q, int64_t r, int64_t) {
        return a.y + (slot * a.n_seq + q) * a.y_total + r;
    }
};

// A pointer into shared memory as the 32-bit address that PTX's shared state space takes.
__device__ __forceinline__ unsigned shared_address(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
// Asynchronous 4-byte copy global -> shared (sm_80+); src_bytes 0 fills zero and reads nothing.
__device__ __forceinline__ void copy_async4(float* dst, const float* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst)), "l"(src), "r"(valid ? 4 : 0));
}
// The same under an L2 policy (l2_evict_last).
__device__ __forceinline__ void copy_async4(float* dst, const float* src, bool valid, uint64_t policy) {
    asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, %2, %3;\n" ::"r"(shared_address(dst)), "l"(src),
                 "r"(valid ? 4 : 0), "l"(policy));
}
// The same for 16 bytes (dst and src 16-byte aligned); not cached in L1.
__device__ __forceinline__ void copy_async16(float* dst, const float* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src), "r"(valid ? 16 : 0));
}
// The same under an L2 policy (l2_evict_last).
__device__ __forceinline__ void copy_async16(float* dst, const float* src, bool valid, uint64_t policy) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(shared_address(dst)), "l"(src),
                 "r"(valid ? 16 : 0), "l"(policy));
}
// Row r of an array of rows of NS floats ([row][NS], aligned to 4 NS bytes) as one store or load (NS = 1, 2 or 4): the
// hidden deltas' staged delta_out, the W1 stream pass's inputs by entry.
template <int NS>
__device__ __forceinline__ void store_row(float* rows, int r, const float (&v)[NS]) {
    static_assert(NS == 1 || NS == 2 || NS == 4, "a float, float2 or float4");
    if constexpr (NS == 4) reinterpret_cast<float4*>(rows)[r] = make_float4(v[0], v[1], v[2], v[3]);
    else if constexpr (NS == 2) reinterpret_cast<float2*>(rows)[r] = make_float2(v[0], v[1]);
    else rows[r] = v[0];
}
template <int NS>
__device__ __forceinline__ void load_row(const float* rows, int r, float (&v)[NS]) {
    static_assert(NS == 1 || NS == 2 || NS == 4, "a float, float2 or float4");
    if constexpr (NS == 4) {
        const float4 q = reinterpret_cast<const float4*>(rows)[r];
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else if constexpr (NS == 2) {
        const float2 q = reinterpret_cast<const float2*>(rows)[r];
        v[0] = q.x, v[1] = q.y;
    } else {
        v[0] = rows[r];
    }
}
// A 16-byte store (dst 16-byte aligned) as one st.global.v4: the compiler splits a float4 store whose
// alignment it cannot prove into four.
__device__ __forceinline__ void store16(float* dst, float4 v) {
    asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
// A hint: bring n floats from p on into L2 (sm_90: one bulk prefetch over the 16-byte chunks that cover them;
// earlier devices: nothing). The caller's allocation must hold those chunks (W and V: 256-byte aligned, with
// kWindowSlack floats past the end).
__device__ __forceinline__ void prefetch_l2(const float* p, int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{15};
    const uintptr_t end = (reinterpret_cast<uintptr_t>(p + n) + 15) & ~uintptr_t{15};
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(first), "r"(static_cast<unsigned>(end - first)) : "memory");
#else
    (void)p;
    (void)n;
#endif
}
// Where p lies within its 16 bytes, in floats (0-3): the allocations are 256-byte aligned, so this is its
// index mod 4.
__device__ __forceinline__ int float_phase(const float* p) { return static_cast<int>((reinterpret_cast<uintptr_t>(p) / sizeof(float)) % 4); }
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int Pending>
__device__ __forceinline__ void copy_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending)); }

// Bulk copies between global and shared memory (sm_90: the copy engine moves a whole 16-byte-aligned span, no
// thread holds its addresses) and the mbarriers that count their bytes. PVM_BULK_COPIES says whether this
// compilation has them; the callers keep a per-thread fallback of the same layout for earlier devices.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PVM_BULK_COPIES 1
__device__ __forceinline__ void barrier_init(uint64_t* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)), "r"(count) : "memory");
}
// After barrier_init, before the copy engine may use the barrier.
__device__ __forceinline__ void barrier_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
}
// The barrier operations below take a barrier by its shared-memory address (`unsigned`, which a pipeline computes
// once and offsets by stage; ptxas may still rebuild the shared window, an S2R and a LEA, near a use); those that
// weight_pass_mma calls also by its address.
// One arrival that also expects `bytes` more from bulk copies before the barrier's phase completes.
__device__ __forceinline__ void barrier_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void barrier_expect(uint64_t* bar, unsigned bytes) { barrier_expect(shared_address(bar), bytes); }
// Waits until the barrier's phase of this parity has completed.
__device__ __forceinline__ void barrier_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred done;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void barrier_wait(uint64_t* bar, unsigned parity) { barrier_wait(shared_address(bar), parity); }
// bytes (a multiple of 16) from src to dst, both 16-byte aligned; counted on bar.
__device__ __forceinline__ void bulk_load(float* dst, const float* src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(shared_address(dst)),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void bulk_load(float* dst, const float* src, unsigned bytes, uint64_t* bar) {
    bulk_load(dst, src, bytes, shared_address(bar));
}
// The same, with an L2 eviction policy (l2_evict_last).
__device__ __forceinline__ void bulk_load(float* dst, const float* src, unsigned bytes, unsigned bar, uint64_t policy) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(shared_address(dst)),
                 "l"(src), "r"(bytes), "r"(bar), "l"(policy)
                 : "memory");
}
// bytes from shared src to global dst, in this thread's current bulk group (bulk_commit closes it).
__device__ __forceinline__ void bulk_store(float* dst, const float* src, unsigned bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(shared_address(src)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_store(float* dst, const float* src, unsigned bytes, uint64_t policy) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;\n" ::"l"(dst), "r"(shared_address(src)),
                 "r"(bytes), "l"(policy)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// This thread's bulk groups but the newest Pending have read their shared source (it may be overwritten).
template <int Pending>
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(Pending) : "memory"); }
// This thread's bulk groups but the newest Pending are complete.
template <int Pending>
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(Pending) : "memory"); }
// This thread's shared-memory writes are ordered before later bulk copies (the copy engine's proxy) that read them.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Item i's stage among S in a pipeline and the parity of that stage's use (unsigned: for S = 4 a mask and a shift,
// where a signed remainder took a sign correction at every use).
template <int S>
__device__ __forceinline__ unsigned stage_of(int i) { return static_cast<unsigned>(i) % S; }
template <int S>
__device__ __forceinline__ unsigned use_of(int i) { return static_cast<unsigned>(i) / S % 2; }
// Thread 0 sets up the S stage barriers of a pipeline of math threads and a copy warp (the block syncs after): `full`
// counts the math threads' copies (cp.async arrivals) and the copy warp's bytes, `computed` the math threads' arrivals
// once they are done with a stage (computed_arrivals of them: one per warp, or one per thread).
template <int S>
__device__ __forceinline__ void init_stage_barriers(uint64_t* full, uint64_t* computed, int math_threads, int computed_arrivals) {
    if (threadIdx.x != 0) return;
    for (int i = 0; i < S; ++i) {
        barrier_init(&full[i], math_threads + 1);
        barrier_init(&computed[i], computed_arrivals);
    }
    barrier_init_fence();
}
// One arrival on bar.
__device__ __forceinline__ void barrier_arrive(unsigned bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory"); }
// One arrival on bar once every cp.async this thread has issued so far has landed (counted in bar's init count).
__device__ __forceinline__ void copy_async_arrive(unsigned bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
#else
#define PVM_BULK_COPIES 0
#endif

// n_seq = 1: groups of G lanes per row (G = 32 for W0's long rows, 8 for W1's rows of H+1), U loads
// of W, V and the two inputs per lane in flight per trip, and the row's last entries (fewer than U * G)
// in one predicated trip whose loads go out together: a row of W1 (50 floats, 8 lanes, U = 8) is a
// single trip; looping over it in trips of 4 * G and then one by one left three dependent round trips
// to memory per lane. Any U sums in the same order: lane l adds entries l, l + G, l + 2G, ... in turn.
// Workbench (dev/cuda/weight_pass_single.cu), H200, L2 flushed: W0 U = 4 / 8 / 16: 76.6 / 71.4 / 72.2 us;
// W1 with 4 / 8 / 16 / 32 lanes per row: 39.4 / 27.3 / 32.6 / 36.7 us (computing W1's row address
// without its unit, as the rows are packed, changed nothing: 27.1 us).
constexpr int kSingleSlots = 8;
template <class Row, int G, int U = kSingleSlots>
__global__ void __launch_bounds__(kThreads) weight_pass_single(StepArgs a) {
    static_assert(G >= 1 && G <= kWarp && (kWarp % G) == 0, "G divides the warp");
    let_next_kernel_launch();
    const int64_t gid = global_thread();
    const int64_t r = gid / G;
    const int lane = static_cast<int>(gid % G);
    await_prior_kernels();
    if (r >= Row::rows(a)) return;  // whole groups exit together
    const unsigned mask = G == kWarp ? 0xffffffffu : (((1u << G) - 1u) << ((threadIdx.x % kWarp) / G * G));
    const int64_t s = *a.step;
    const int cur = ring_slot(s), old = ring_slot(s - 2);
    const int64_t u = Row::unit(a, r), len = Row::length(a, u), base = Row::weight_base(a, r, u, len);
    float* __restrict__ W = a.weights + base;
    float* __restrict__ V = a.velocity + base;
    const float* __restrict__ in = Row::input(a, cur, 0, u);
    const float* __restrict__ in_old = Row::input(a, old, 0, u);
    const float ld = Row::lr_delta(a, 0, r, u);
    const float lr = a.unit_lr[u], mu = a.unit_mu[u];
    const bool active = !(lr == 0.0f && mu == 0.0f);
    float acc = 0.0f;
    // One trip of U entries from i: all loads first (predicated where the row may end), then the sums
    // and the update in order.
    const auto trip = [&](int64_t i, bool full) {
        float w[U], v[U], x[U], xo[U];
#pragma unroll
        for (int t = 0; t < U; ++t) {
            const int64_t j = i + t * G;
            if (full || j < len) {
                w[t] = W[j];
                v[t] = V[j];
                x[t] = in[j];
                xo[t] = in_old[j];
            }
        }
#pragma unroll
        for (int t = 0; t < U; ++t) {
            const int64_t j = i + t * G;
            if (!full && j >= len) break;
            acc = __fadd_rn(acc, __fmul_rn(w[t], x[t]));
            if (active) {
                v[t] = __fmaf_rn(mu, v[t], __fmul_rn(ld, xo[t]));
                W[j] = __fadd_rn(w[t], v[t]);
                V[j] = v[t];
            } else if (v[t] != 0.0f) {
                V[j] = 0.0f;  // a unit not yet enabled: its update is zero
            }
        }
    };
    int64_t i = lane;
    for (; i + (U - 1) * G < len; i += U * G) trip(i, true);
    if (i < len) trip(i, false);
    for (int offset = G / 2; offset > 0; offset /= 2) acc = __fadd_rn(acc, __shfl_xor_sync(mask, acc, offset, G));
    if (lane == 0) *Row::output(a, cur, 0, r, u) = activation(acc, a.polynomial);
}

__global__ void spin(int64_t cycles) {  // keeps the GPU busy while the host enqueues (profiling)
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

// This unit's squared errors (both halves; summed over sequences and steps by output_deltas), when the
// metrics are taken.
__global__ void __launch_bounds__(kThreads) unit_errors(StepArgs a) { sum_unit_errors(a, blockIdx.x); }

// The last step's output errors, e = x(s)[target] - y(s-2) as output_deltas takes them, for s = *step - 1
// (0 before the first step). After step s the rings still hold x(s) and y(s-2) (three slots), so the
// errors are rebuilt only when asked for. Grid: x over outputs, y over sequences.
__global__ void output_errors(const float* __restrict__ x, const float* __restrict__ y,
                              const int64_t* __restrict__ target_src, const int64_t* __restrict__ step, int64_t n_seq,
                              int64_t x_stride, int64_t y_total, float* __restrict__ error) {
    const int64_t s = *step - 1, q = seq_index();
    const int cur = ring_slot(s), old = ring_slot(s - 2);
    for (int64_t j = global_thread(); j < y_total; j += grid_threads())
        error[q * y_total + j] = s < 0 ? 0.0f : x[(cur * n_seq + q) * x_stride + target_src[j]] - y[(old * n_seq + q) * y_total + j];
}

// The x ring in its reference layout from a ring of step sources (CudaEngine::built_inputs): x[r, i] =
// sources[r, index[i]] for ring row r (slot x sequence). Grid: x over input entries, y over rows.
__global__ void materialise_inputs(const float* __restrict__ sources, const int32_t* __restrict__ index, int64_t x_total,
                                   int64_t stride, float* __restrict__ x) {
    const int64_t r = blockIdx.y;
    for (int64_t i = global_thread(); i < x_total; i += grid_threads()) x[r * x_total + i] = sources[r * stride + index[i]];
}

__global__ void fill(float* p, int64_t n, float value) {
    for (int64_t i = global_thread(); i < n; i += grid_threads()) p[i] = value;
}

}  // namespace kernels
}  // namespace pvm
