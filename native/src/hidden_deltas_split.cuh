// The hidden deltas of 5 to 16 sequences on tensor cores, a block per unit with the sum over the unit's outputs
// split between its warps:
//   eps[k, q] = sum_j W1[j, k] delta_out[q, j],   lr_delta_hidden[q, k] = lr * g(h(s-2)[q, k]) * eps[k, q].
// The product it replaces (mma_product<HiddenDeltas>, 32-column tiles) gives each of 8 warps a 16 x 16 piece of
// the 64 x 32 output and walks all of a unit's outputs j in every warp: 31-32 us on an H100 at 5-16 sequences for
// 13.8 MB of W1 (ncu: 20% of warps active, 15-18% of DRAM bandwidth), three quarters of it on columns past n_seq
// below 9 sequences. Here slabs of kSplitSlab outputs stream through the stages and warp w takes k-step w of each
// slab for the whole 64 x NS output: a warp's chains are a unit's outputs / kSplitSlab k-steps long instead of all
// of them, and its A values (W1) serve every sequence tile. The 8 partial sums are added in warp order (a fixed
// order) at the end. Rows of W1 of up to kSplitMaxLen entries (H + 1 <= 50: not feed-context mode) and at most
// 64 hidden rows; the arithmetic is weight_pass_mma's (TensorMath<P>).
// Workbench (dev/cuda/hidden_deltas_split.cu, H100, L2 flushed), product -> this: 5 / 8 / 16 sequences 26.5 -> 18.2,
// 26.8 -> 18.8, 28.3 -> 22.3 us, relative error 2.2e-6 -> 3.1e-7; at 32 sequences 30.9 -> 34.0 (the engine keeps the
// product from 17). 3 stages instead of 4: 18.5 / 19.2 us at 5 / 8 (an earlier version with 3 stages: 25.5 at 16).
#pragma once

#include "mma_pass.cuh"

namespace pvm {
namespace kernels {

constexpr int kSplitWarps = 8, kSplitThreads = kSplitWarps * kWarp;  // 256
constexpr int kSplitSlab = 8 * kSplitWarps;                          // outputs j per slab: a k-step per warp
constexpr int kSplitRows = 64;                                       // hidden rows k: 4 row tiles of 16
constexpr int kSplitMaxLen = 50;                                     // entries of a W1 row (H + 1)
constexpr int kSplitStages = 4;  // slabs i+1..i+3 in flight while slab i is multiplied
// A slab's W1 rows are one span (a unit's rows are contiguous), staged packed from its 16-byte group on: entry (j,
// k) at the span's phase + j len + k. The A reads of the last row reach k = 63, past its len entries: the span's
// room covers them (zeros or earlier slabs' finite values, which meet only columns that are not kept).
constexpr int kSplitSpan = ((kSplitSlab - 1) * kSplitMaxLen + kSplitRows + 3 + 3) / 4 * 4;
// delta_out staged [sequence][j], rows kSplitSlab + 4 floats apart: the B reads (sequence g, j = t) are in 32
// distinct banks.
constexpr int kSplitDStride = kSplitSlab + 4;
template <int NS>
__host__ __device__ constexpr int split_stage_floats() { return kSplitSpan + NS * kSplitDStride; }
// The stages, and afterwards the warps' partial sums ([warp][row tile][sequence tile][4][lane]).
template <int NS>
__host__ __device__ constexpr size_t split_shared_bytes() {
    const int stages = kSplitStages * split_stage_floats<NS>(), sums = kSplitWarps * (kSplitRows / 16) * (NS / 8) * 4 * kWarp;
    return sizeof(float) * (stages > sums ? stages : sums);
}

// A block per unit (grid n_units), kSplitThreads threads, split_shared_bytes<NS>() of dynamic shared memory; NS a
// multiple of 8 with n_seq <= NS. W1's spans move as the 16-byte groups that cover them: the weights need 3 floats
// allocated past W1's end (the engine's kWindowSlack). With OwnDeltas the block first computes its unit's output
// deltas (output_deltas' work for its outputs, group by group through the same function: the same delta_out and
// error sums), so that output_deltas need not run (PVM_CUDA_SPLIT_OWN=1, an experiment).
template <int NS, Precision P = Precision::kFp32, bool OwnDeltas = false>
__global__ void __launch_bounds__(kSplitThreads, 2) hidden_deltas_split(StepArgs a) {
    static_assert(NS % 8 == 0 && NS >= 8 && NS <= 16, "sequences in tiles of 8; 32 was slower than the product");
    using M = TensorMath<P>;
    constexpr int NT = NS / 8, MT = kSplitRows / 16;
    constexpr int kStageFloats = split_stage_floats<NS>();
    extern __shared__ __align__(16) float smem[];
    let_next_kernel_launch();
    const int tid = static_cast<int>(threadIdx.x), warp = tid / kWarp, lane = tid % kWarp;
    const int g = lane / 4, t = lane % 4;
    const int64_t u = blockIdx.x;
    const int64_t K = a.y_off[u + 1] - a.y_off[u];
    const int len = static_cast<int>(a.h_off[u + 1] - a.h_off[u]);
    const float* W = a.weights + a.w1_off[u];
    const uint64_t keep = l2_evict_last();  // W1 under evict_last (step_kernels.cuh)
    const float* D = a.delta_out + a.y_off[u];  // delta_out[q, j] at D[q * y_total + j]
    const int n = static_cast<int>(a.n_seq);
    const int64_t n_slabs = (K + kSplitSlab - 1) / kSplitSlab;
    // The last slab's rows past the unit's outputs meet zero deltas: their W1 places must hold finite values. Its
    // stage is zeroed first; earlier slabs there leave finite values.
    float* last = smem + ((n_slabs - 1) % kSplitStages) * kStageFloats;
    for (int e = tid; e < kSplitSpan; e += kSplitThreads) last[e] = 0.0f;
    __syncthreads();  // (the zeros before any copy lands there)
    await_prior_kernels();  // delta_out is the step's (output_deltas), and the step counter
    if constexpr (OwnDeltas) {
        // The unit's outputs j in output_deltas' groups of a.delta_group sequences, an (output, group) a thread.
        const int64_t s = *a.step, y0 = a.y_off[u], groups = delta_groups(a.n_seq, a.delta_group);
        const int cur = ring_slot(s), old_slot = ring_slot(s - 2);
        for (int64_t e = tid; e < K * groups; e += kSplitThreads) {
            const int64_t j = y0 + e % K, g = e / K, q_begin = g * a.delta_group;
            const int64_t q_end = q_begin + a.delta_group < a.n_seq ? q_begin + a.delta_group : a.n_seq;
            output_delta<kSeqGroup>(a, s, cur, old_slot, j, a.target_src[j], a.baseline_src[j], g, q_begin, q_end,
                                    [&](int64_t q, float d) { a.delta_out[q * a.y_total + j] = d; });
        }
        __syncthreads();  // the block's delta_out stores before its copies read them
    }
    // This thread's outputs (k, q) = (o % kSplitRows, o / kSplitRows), o = tid + c kSplitThreads: h(s-2) read now,
    // while the slabs load.
    constexpr int kOuts = kSplitRows * NS / kSplitThreads;
    const int old = ring_slot(*a.step - 2);
    float h_old[kOuts];
#pragma unroll
    for (int c = 0; c < kOuts; ++c) {
        const int o = tid + c * kSplitThreads, k = o % kSplitRows, q = o / kSplitRows;
        h_old[c] = k < a.hidden && q < n ? a.h[(old * a.n_seq + q) * a.h_total + a.h_off[u] + k] : 0.0f;
    }

    const auto fetch = [&](int64_t i) {  // slab i into stage i % kSplitStages; always commits a group
        if (i < n_slabs) {
            float* st = smem + (i % kSplitStages) * kStageFloats;
            const int64_t j0 = i * kSplitSlab;
            const int rows = static_cast<int>(K - j0 < kSplitSlab ? K - j0 : kSplitSlab);
            const float* span = W + j0 * len;
            const int phase = float_phase(span), groups = (phase + rows * len + 3) / 4;
            for (int q4 = tid; q4 < groups; q4 += kSplitThreads) copy_async16(st + 4 * q4, span - phase + 4 * q4, true, keep);
            float* ds = st + kSplitSpan;
#pragma unroll
            for (int c = 0; c < NS * kSplitSlab / kSplitThreads; ++c) {
                const int e = tid + c * kSplitThreads, q = e / kSplitSlab, j = e % kSplitSlab;
                const bool ok = q < n && j < rows;
                copy_async4(ds + q * kSplitDStride + j, ok ? D + q * a.y_total + j0 + j : D, ok);
            }
        }
        copy_async_commit();
    };

    float acc[MT][NT][4];  // (row g, sequence 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1) of tile (mt, j)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.0f;
    // The lane's A entries: rows g, g+8 of each row tile at outputs k0(t), k1(t) of the warp's k-step; B: sequence
    // 8j + g at the same outputs.
    const int a0 = (8 * warp + M::k0(t)) * len + g, a1 = (8 * warp + M::k1(t)) * len + g;
    const int b0 = g * kSplitDStride + 8 * warp + M::k0(t), b1 = g * kSplitDStride + 8 * warp + M::k1(t);
    for (int i = 0; i < kSplitStages - 1; ++i) fetch(i);
    for (int64_t i = 0; i < n_slabs; ++i) {
        copy_async_wait<kSplitStages - 2>();  // slab i has landed (this thread's copies) ...
        __syncthreads();                      // ... and every thread's; all are done with slab i-1's stage
        fetch(i + kSplitStages - 1);
        if (8 * warp >= K - i * kSplitSlab) continue;  // the warp's k-step is past the unit's outputs
        const float* st = smem + (i % kSplitStages) * kStageFloats;
        const float* As = st + float_phase(W + i * kSplitSlab * len);
        const float* Bs = st + kSplitSpan;
        typename M::B bf[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) bf[j] = M::b(Bs[8 * j * kSplitDStride + b0], Bs[8 * j * kSplitDStride + b1]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const float* r = As + 16 * mt;
            const typename M::A af = M::a(r[a0], r[a0 + 8], r[a1], r[a1 + 8]);
#pragma unroll
            for (int j = 0; j < NT; ++j) M::mma(acc[mt][j], af, bf[j]);
        }
    }
    copy_async_wait<0>();
    __syncthreads();  // every warp is done with the stages
    float* sums = smem;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) sums[(((warp * MT + mt) * NT + j) * 4 + e) * kWarp + lane] = acc[mt][j][e];
    __syncthreads();
    // Output (k, q), consecutive k in consecutive threads: the warps' sums in warp order, then the delta.
    const float lr = a.unit_lr[u];
#pragma unroll
    for (int c = 0; c < kOuts; ++c) {
        const int o = tid + c * kSplitThreads, k = o % kSplitRows, q = o / kSplitRows;
        if (k >= a.hidden || q >= n) continue;
        const int mt = k / 16, e = (k % 16) / 8 * 2 + q % 2, at_lane = (k % 8) * 4 + (q % 8) / 2;
        const float* p = sums + ((mt * NT + q / 8) * 4 + e) * kWarp + at_lane;
        float eps = p[0];
#pragma unroll
        for (int w = 1; w < kSplitWarps; ++w) eps = __fadd_rn(eps, p[w * MT * NT * 4 * kWarp]);
        a.lr_delta_hidden[q * a.h_total + a.h_off[u] + k] =
            __fmul_rn(lr, delta(h_old[c], eps, a.polynomial, static_cast<Derivative>(a.derivative)));
    }
}

}  // namespace kernels
}  // namespace pvm
