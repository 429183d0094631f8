// The hidden deltas of 1 to 4 sequences (from kHiddenProductSeqs: hidden_deltas_split or the product), a block per
// unit:
//   eps[k, q] = sum_j W1[j, k] delta_out[q, j],   lr_delta_hidden[q, k] = lr * g(h(s-2)[q, k]) * eps[k, q],
// with the current (pre-update) W1. Thread (g, col) sums the rows j = g mod RG of column k for every sequence
// (coalesced row reads), U rows a trip, in P interleaved chains per sequence; the RG groups' sums are then added in
// order g = 0, 1, ... by one thread a sequence: a fixed order.
// The kernel is bound by its chain of dependent loads, not by W1's bytes (13.8 MB on small: about 3 us at the copy
// rate; the workbench with 8 outputs a unit, next to nothing to read, takes 6.7 us of the full kernel's 11.3). So:
// - delta_out staged in shared memory as [row][sequence] (a row's deltas one shared load), its loads issued with
//   the first trip's W1 rows: a trip is one round trip of W1 loads, where the kernel this replaced
//   (step_kernels.cuh before 35f1fc4) interleaved up to 64 global delta loads with its adds;
// - the topology read before the wait on the kernels before; the step, the rate, h(s-2) and the first loads right
//   after it, with nothing at the end waiting on memory;
// - at 1-2 sequences the unit's output deltas computed here (OwnDeltas), so that output_deltas is not launched.
// Workbench (dev/cuda/hidden_deltas.cu, H200, L2 flushed), the kernel before -> this: small's units, 1 / 2 / 4
// sequences 13.1 -> 11.3, 17.9 -> 12.0, 21.5 -> 12.4 us; med's 19.0 -> 16.4, 23.6 -> 16.9, 26.7 -> 17.3 us. Engine A/B
// against it (H200, frames/s, 1 / 2 / 3 / 4 sequences): small +1.1 / +3.4 / +3.5 / +4.2%, med +2.2 / +3.0 / +2.9 /
// +3.6%; the output deltas inside, then, small +0.5 / -0.1 at 1 / 2, med +1.1 / +1.2%
// (benchmarks/results-hiddendeltas-h200.md).
#pragma once

#include <type_traits>

#include "step_kernels.cuh"

namespace pvm {
namespace kernels {

constexpr int kHdRows = 16;          // W1 rows a thread has in flight (a trip)
constexpr int kHdStageRows = 512;    // delta_out rows staged at once (a unit with more takes several chunks)
constexpr int kHdOwnDeltasSeqs = 2;  // up to this many sequences the kernel computes its units' output deltas (at 4
                                     // it spilled and lost 1.1% on med)

// Threads a block: 256 (4 blocks a SM), or 512 (2 a SM, each thread half the rows) at 3-4 sequences where the units
// fill about one wave of such blocks (n_units <= 2.5 blocks a SM). Engine A/B, H200, frames/s, 512 against 256 threads:
// small (265 units) 1 / 2 / 4 sequences -0.1 / -0.6 / +2.9%; med (521) 4 sequences -0.4%, LARGE (1,497) -1.0%.
inline int hd_threads(int64_t n_seq, int64_t n_units, int sms) { return n_seq >= 3 && 2 * n_units <= 5 * int64_t{sms} ? 512 : 256; }
// A block's threads in row groups of 51 columns where the hidden rows fit them (the zoo's 49), else of 64; more
// hidden rows take more passes over the columns.
constexpr int kHdNarrowCols = 51, kHdWideCols = 64;

// A block of Threads per unit (grid n_units, the units in unit_order where it is set), RG row groups of Threads / RG
// columns; n_seq <= NS, a compile-time bucket of 1, 2 or 4. With OwnDeltas the block first computes its unit's
// output deltas (output_delta, as output_deltas does: delta_out, the error sums), so that output_deltas need not
// run; else it reads delta_out.
template <int NS, int Threads, int RG, bool OwnDeltas>
__global__ void __launch_bounds__(Threads, 1024 / Threads) hidden_deltas(StepArgs a) {
    static_assert(NS == 1 || NS == 2 || NS == 4, "the buckets of 1-4 sequences");
    static_assert(RG >= NS, "a group's first thread a sequence adds the groups' sums");
    constexpr int U = kHdRows, kCols = Threads / RG;
    constexpr int P = NS <= 2 ? 4 : 1;  // chains per sequence: from 4 sequences the sequences' own give the adds room
    constexpr int kStageTrips = (kHdStageRows + Threads - 1) / Threads;
    __shared__ __align__(16) float ds[kHdStageRows * NS];
    __shared__ float part[RG][NS][kCols];
    let_next_kernel_launch();
    const int tid = static_cast<int>(threadIdx.x), g = tid / kCols, col = tid % kCols;
    // The topology never changes: read before the wait.
    const int64_t u = a.unit_order ? a.unit_order[blockIdx.x] : blockIdx.x;
    const int64_t H = a.hidden, y0 = a.y_off[u], h0 = a.h_off[u];
    const int K = static_cast<int>(a.h_off[u + 1] - h0), M = static_cast<int>(a.y_off[u + 1] - y0);  // (a unit's W1
    const float* __restrict__ W1 = a.weights + a.w1_off[u];                                              // < 2^31 floats)
    const bool first = OwnDeltas && tid < M;  // the thread's first output's sources (OwnDeltas)
    const int64_t target = first ? a.target_src[y0 + tid] : 0, base = first ? a.baseline_src[y0 + tid] : -1;
    await_prior_kernels();
    const int n = static_cast<int>(a.n_seq);
    const int64_t s = *a.step;  // (in flight while the first W1 rows and deltas are asked for)
    const int cur = ring_slot(s), old = ring_slot(s - 2);
    const float lr = a.unit_lr[u];
    const uint64_t keep = l2_evict_last();  // W1 under evict_last (step_kernels.cuh)
    if constexpr (OwnDeltas) {
        // The unit's output deltas, output_deltas' work for its outputs (the engine does not launch it up to
        // kHdOwnDeltasSeqs sequences) through the same function, so the same values: into delta_out, and the first
        // chunk's into ds.
        const auto one = [&](int row, int64_t tg, int64_t bs) {
            const int64_t j = y0 + row;
            output_delta<NS>(a, s, cur, old, j, tg, bs, 0, 0, n, [&](int64_t q, float d) {
                a.delta_out[q * a.y_total + j] = d;
                if (row < kHdStageRows) ds[row * NS + q] = d;
            });
        };
        if (first) one(tid, target, base);
        for (int row = tid + Threads; row < M; row += Threads) one(row, a.target_src[y0 + row], a.baseline_src[y0 + row]);
        __syncthreads();  // (ds, and delta_out for the later chunks and column passes)
    }

    for (int64_t k0 = 0; k0 < H; k0 += kCols) {
        const int64_t k = k0 + col;
        const bool live = k < H && g < RG;  // (where RG does not divide the block, its last threads idle)
        float ho = 0.0f;                    // thread (g < n, col) finishes sequence g's column k: its h(s-2)
        float p[P][NS];
#pragma unroll
        for (int t = 0; t < P; ++t)
#pragma unroll
            for (int q = 0; q < NS; ++q) p[t][q] = 0.0f;
        const float* __restrict__ wk = W1 + (live ? k : 0);
        const auto load_trip = [&](float (&w)[U], int c0, int r, int rows) {
#pragma unroll
            for (int t = 0; t < U; ++t) {
                const float* at = wk + (c0 + r + t * RG) * K;
                w[t] = live && r + t * RG < rows ? load_with(at, keep) : 0.0f;
            }
        };
        for (int c0 = 0; c0 < M; c0 += kHdStageRows) {
            const int rows = M - c0 < kHdStageRows ? M - c0 : kHdStageRows;
            // The chunk's first trip of W1 rows, its deltas, and (first chunk) h(s-2): all in flight together.
            int r = g;  // the thread's row of the chunk
            float w[U];
            load_trip(w, c0, r, rows);
            float v[kStageTrips][NS];  // (the sequences past n as zeros)
            if (OwnDeltas && k0 == 0 && c0 == 0) {  // (staged by the deltas above)
#pragma unroll
                for (int i = 0; i < kStageTrips; ++i)
#pragma unroll
                    for (int q = 0; q < NS; ++q) v[i][q] = 0.0f;
            } else {
#pragma unroll
                for (int i = 0; i < kStageTrips; ++i)
#pragma unroll
                    for (int q = 0; q < NS; ++q)
                        v[i][q] = q < n && tid + i * Threads < rows ? a.delta_out[q * a.y_total + y0 + c0 + tid + i * Threads] : 0.0f;
            }
            if (c0 == 0 && g < n && k < H) ho = a.h[(old * a.n_seq + g) * a.h_total + h0 + k];
            if (c0 > 0) __syncthreads();  // the last chunk's reads of ds are done
#pragma unroll
            for (int i = 0; i < kStageTrips; ++i)
                if (!(OwnDeltas && k0 == 0 && c0 == 0) && tid + i * Threads < rows) store_row<NS>(ds, tid + i * Threads, v[i]);
            __syncthreads();
            // A trip's adds: in a full trip every row exists (no test between the shared loads), in the last some.
            const auto add = [&](auto full) {
#pragma unroll
                for (int t = 0; t < U; ++t) {
                    if (decltype(full)::value || r + t * RG < rows) {
                        float d[NS];
                        load_row<NS>(ds, r + t * RG, d);
#pragma unroll
                        for (int q = 0; q < NS; ++q)
                            if (q < n) p[t % P][q] = __fadd_rn(p[t % P][q], __fmul_rn(w[t], d[q]));
                    }
                }
            };
            while (true) {
                if (r + (U - 1) * RG < rows) add(std::true_type{});
                else add(std::false_type{});
                r += U * RG;
                if (r >= rows) break;
                load_trip(w, c0, r, rows);
            }
        }
#pragma unroll
        for (int q = 0; q < NS; ++q) {
            float e = p[0][q];  // P = 4: (p0 + p1) + (p2 + p3)
            if constexpr (P == 4) e = __fadd_rn(__fadd_rn(p[0][q], p[1][q]), __fadd_rn(p[2][q], p[3][q]));
            if (g < RG) part[g][q][col] = e;
        }
        __syncthreads();
        if (g < n && k < H) {
            float total = part[0][g][col];
#pragma unroll
            for (int t = 1; t < RG; ++t) total = __fadd_rn(total, part[t][g][col]);
            const float dh = delta(ho, total, a.polynomial, static_cast<Derivative>(a.derivative));
            a.lr_delta_hidden[g * a.h_total + h0 + k] = __fmul_rn(lr, dh);
        }
        __syncthreads();  // (part is rewritten by the next columns)
    }
}

}  // namespace kernels
}  // namespace pvm
