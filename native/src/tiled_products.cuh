// Many sequences (n_seq > kFusedSeqs): the per-unit work of a step as tiled matrix products
//   C[m, n] = sum_k A[k, m] B[k, n]       (one unit's matrices; k in order, fused multiply-adds)
// A block of 224 threads (14 x 16) computes a 56 x 16·TN tile of one unit's C, each thread a 4 x TN
// micro-tile read from shared memory as float4s (2 or 3 shared reads per 16 or 32 FMAs). 56 rows
// hold the 49 hidden units (50 with the bias) of the zoo's specs in one tile. k advances in slabs;
// the next slab's global loads are issued before this slab's products.
//
// Each product is a small struct: its extents (M, N, K), how to load A[k, m] and B[k, n], whether
// consecutive k (or consecutive m, n) are adjacent in memory, what to do with a finished sum, and its
// tile shape (TileShape: TN, slab depth, blocks per SM), chosen by measurement (benchmarks/NOTES.md).
// Deterministic: every output is summed by one thread in a fixed order; no atomics.
#pragma once

#include <cstdint>

#include "step_kernels.cuh"

namespace pvm {
namespace kernels {

constexpr int kTileRowThreads = 14, kTileColThreads = 16;
constexpr int kTileThreads = kTileRowThreads * kTileColThreads;  // 224
constexpr int kMicroRows = 4;
constexpr int kTileRows = kTileRowThreads * kMicroRows;  // 56

// TN micro-tile columns, slabs kSlab deep, at least kMinBlocks blocks per SM (caps the registers).
template <int TN, int Slab, int MinBlocks>
struct TileShape {
    static_assert(TN == 4 || TN == 8, "micro-tiles of 4 or 8 columns");
    static constexpr int kMicroCols = TN, kSlab = Slab, kMinBlocks = MinBlocks, kCols = kTileColThreads * TN;
};
// Measured on an H100, small.json at n_seq 256 (µs per step): the long sums (W0) want wide tiles;
// the short ones (W1, hidden deltas) more resident blocks to hide their load latency.
using WideTiles = TileShape<8, 8, 2>;          // W0 forward 404, W0 update 513
using NarrowTiles = TileShape<4, 8, 3>;        // W1 update 249 (wide: 337), hidden deltas
using NarrowDeepTiles = TileShape<4, 16, 3>;   // W1 forward 190 (wide: 236)

// ---- the products ----------------------------------------------------------------------------

// A forward product of one unit: out(s)[q, m] = phi(sum_k W[m, k] in(s)[q, k]), n = q. The rings'
// slot s and the unit's offsets are resolved once, in the constructor.
struct Forward {
    static constexpr bool kAAlongK = true, kBAlongK = true, kUpdate = false;
    int64_t M, N, K, in_stride, out_stride;
    const float *W, *in;
    float* out;
    bool polynomial;
    __device__ Forward(const StepArgs& a, int64_t rows, int64_t length, int64_t weight_base, const float* in_ring,
                       int64_t in_stride, float* out_ring, int64_t out_stride)
        : M(rows), N(a.n_seq), K(length), in_stride(in_stride), out_stride(out_stride), W(a.weights + weight_base),
          in(in_ring + ring_slot(*a.step) * a.n_seq * in_stride), out(out_ring + ring_slot(*a.step) * a.n_seq * out_stride),
          polynomial(a.polynomial) {}
    __device__ float load_a(int64_t k, int64_t m) const { return W[m * K + k]; }
    __device__ float load_b(int64_t k, int64_t q) const { return in[q * in_stride + k]; }
    __device__ void finish(int64_t m, int64_t q, float sum) const { out[q * out_stride + m] = activation(sum, polynomial); }
};

// h(s) = phi(W0 x(s)): m = hidden row, k = input i.
struct W0Forward : Forward {
    using Tiles = WideTiles;
    __device__ W0Forward(const StepArgs& a, int64_t u)
        : Forward(a, a.hidden, a.x_off[u + 1] - a.x_off[u], a.w0_off[u], a.x + a.x_off[u], a.x_total, a.h + a.h_off[u],
                  a.h_total) {}
};

// y(s) = phi(W1 h(s)): m = output j, k = hidden k.
struct W1Forward : Forward {
    using Tiles = NarrowDeepTiles;
    __device__ W1Forward(const StepArgs& a, int64_t u)
        : Forward(a, a.y_off[u + 1] - a.y_off[u], a.h_off[u + 1] - a.h_off[u], a.w1_off[u], a.h + a.h_off[u], a.h_total,
                  a.y + a.y_off[u], a.y_total) {}
};

// eps[q, k] = sum_j delta_out[q, j] W1[j, k] with the current W1, stored as lr * g(h(s-2)) * eps
// (what the W0 update uses); m = k < H, n = q, summed over the unit's outputs j.
struct HiddenDeltas {
    static constexpr bool kAAlongK = false, kBAlongK = true, kUpdate = false;
    using Tiles = NarrowTiles;
    const StepArgs& a;
    int64_t M, N, K, cols;
    const float *W, *d, *h_old;
    float* out;
    float lr;
    __device__ HiddenDeltas(const StepArgs& args, int64_t unit)
        : a(args), M(args.hidden), N(args.n_seq), K(args.y_off[unit + 1] - args.y_off[unit]),
          cols(args.h_off[unit + 1] - args.h_off[unit]), W(args.weights + args.w1_off[unit]),
          d(args.delta_out + args.y_off[unit]),
          h_old(args.h + ring_slot(*args.step - 2) * args.n_seq * args.h_total + args.h_off[unit]),
          out(args.lr_delta_hidden + args.h_off[unit]), lr(args.unit_lr[unit]) {}
    __device__ float load_a(int64_t j, int64_t k) const { return W[j * cols + k]; }
    __device__ float load_b(int64_t j, int64_t q) const { return d[q * a.y_total + j]; }
    __device__ void finish(int64_t k, int64_t q, float eps) const {
        const float dh = delta(h_old[q * a.h_total + k], eps, a.polynomial, static_cast<Derivative>(a.derivative));
        out[q * a.h_total + k] = __fmul_rn(lr, dh);
    }
};

// The momentum update of one weight matrix: g[m, n] = mean_q lr*delta[q, m] act(s-2)[q, n];
// V = fma(mu, V, g); W += V. Summed over the sequences q. Units not yet enabled only clear V.
struct Update {
    static constexpr bool kAAlongK = false, kBAlongK = false, kUpdate = true;
    const StepArgs& a;
    int64_t M, N, K;
    float *W, *V;
    float mu;
    bool inactive;
    __device__ Update(const StepArgs& args, int64_t rows, int64_t cols, int64_t weight_base, int64_t unit)
        : a(args), M(rows), N(cols), K(args.n_seq), W(args.weights + weight_base), V(args.velocity + weight_base),
          mu(args.unit_mu[unit]), inactive(args.unit_lr[unit] == 0.0f && args.unit_mu[unit] == 0.0f) {}
    __device__ void finish(int64_t m, int64_t n, float g) const {
        const int64_t i = m * N + n;
        const float v = __fmaf_rn(mu, V[i], __fdiv_rn(g, static_cast<float>(a.n_seq)));
        W[i] = __fadd_rn(W[i], v);
        V[i] = v;
    }
    __device__ void clear(int64_t m, int64_t n) const {
        if (V[m * N + n] != 0.0f) V[m * N + n] = 0.0f;
    }
};

// W0: m = row < H, n = input i; A = lr * delta_h(s-2) (already scaled), B = x(s-2).
struct W0Update : Update {
    using Tiles = WideTiles;
    const float *dh, *x;
    __device__ W0Update(const StepArgs& args, int64_t unit)
        : Update(args, args.hidden, args.x_off[unit + 1] - args.x_off[unit], args.w0_off[unit], unit),
          dh(args.lr_delta_hidden + args.h_off[unit]),
          x(args.x + ring_slot(*args.step - 2) * args.n_seq * args.x_total + args.x_off[unit]) {}
    __device__ float load_a(int64_t q, int64_t row) const { return dh[q * a.h_total + row]; }
    __device__ float load_b(int64_t q, int64_t i) const { return x[q * a.x_total + i]; }
};

// W1: m = output j, n = hidden k; A = lr * delta_out(s-2), B = h(s-2).
struct W1Update : Update {
    using Tiles = NarrowTiles;
    const float *d, *h;
    float lr;
    __device__ W1Update(const StepArgs& args, int64_t unit)
        : Update(args, args.y_off[unit + 1] - args.y_off[unit], args.h_off[unit + 1] - args.h_off[unit],
                 args.w1_off[unit], unit),
          d(args.delta_out + args.y_off[unit]),
          h(args.h + ring_slot(*args.step - 2) * args.n_seq * args.h_total + args.h_off[unit]),
          lr(args.unit_lr[unit]) {}
    __device__ float load_a(int64_t q, int64_t j) const { return __fmul_rn(lr, d[q * a.y_total + j]); }
    __device__ float load_b(int64_t q, int64_t k) const { return h[q * a.h_total + k]; }
};

// ---- the tile loop ---------------------------------------------------------------------------

// Slab element e of an operand with `extent` entries along m (or n): which (k, m) it is. Along k:
// consecutive threads take consecutive k (rows contiguous in k, coalesced); otherwise consecutive m.
template <bool kAlongK, int kExtent, int kSlab>
__device__ __forceinline__ void slab_coords(int e, int& k, int& mn) {
    if (kAlongK) {
        k = e % kSlab;
        mn = e / kSlab;
    } else {
        k = e / kExtent;
        mn = e % kExtent;
    }
}

// The tiles to compute are listed by the host as (unit, first m, first n), heaviest first.
template <class P>
__global__ void __launch_bounds__(kTileThreads, P::Tiles::kMinBlocks)
    tiled_product(StepArgs args, const int32_t* __restrict__ tiles) {
    constexpr int TN = P::Tiles::kMicroCols, BN = P::Tiles::kCols, kSlab = P::Tiles::kSlab;
    constexpr int kALoads = (kSlab * kTileRows + kTileThreads - 1) / kTileThreads;
    constexpr int kBLoads = (kSlab * BN + kTileThreads - 1) / kTileThreads;
    __shared__ __align__(16) float As[kSlab][kTileRows + 4];  // +4: fewer bank conflicts, float4 alignment kept
    __shared__ __align__(16) float Bs[kSlab][BN + 4];
    const int64_t u = tiles[3 * blockIdx.x], m0 = tiles[3 * blockIdx.x + 1], n0 = tiles[3 * blockIdx.x + 2];
    const P p(args, u);
    const int tx = threadIdx.x % kTileColThreads, ty = threadIdx.x / kTileColThreads;
    // Thread (ty, tx) owns rows m0 + 4 ty + r and columns n0 + 64 g + 4 tx + c (r, c < 4, g < TN / 4).
    auto row_of = [&](int r) { return m0 + kMicroRows * ty + r; };
    auto col_of = [&](int t) { return n0 + 64 * (t / 4) + 4 * tx + t % 4; };
    if constexpr (P::kUpdate) {
        if (p.inactive) {
            for (int r = 0; r < kMicroRows; ++r)
                for (int t = 0; t < TN; ++t)
                    if (row_of(r) < p.M && col_of(t) < p.N) p.clear(row_of(r), col_of(t));
            return;
        }
    }
    float acc[kMicroRows][TN] = {};
    float a_next[kALoads], b_next[kBLoads];
    auto load = [&](int64_t k0) {
#pragma unroll
        for (int t = 0; t < kALoads; ++t) {
            const int e = threadIdx.x + t * kTileThreads;
            int k, m;
            slab_coords<P::kAAlongK, kTileRows, kSlab>(e, k, m);
            a_next[t] = (e < kSlab * kTileRows && k0 + k < p.K && m0 + m < p.M) ? p.load_a(k0 + k, m0 + m) : 0.0f;
        }
#pragma unroll
        for (int t = 0; t < kBLoads; ++t) {
            const int e = threadIdx.x + t * kTileThreads;
            int k, n;
            slab_coords<P::kBAlongK, BN, kSlab>(e, k, n);
            b_next[t] = (e < kSlab * BN && k0 + k < p.K && n0 + n < p.N) ? p.load_b(k0 + k, n0 + n) : 0.0f;
        }
    };
    load(0);
    for (int64_t k0 = 0; k0 < p.K; k0 += kSlab) {
#pragma unroll
        for (int t = 0; t < kALoads; ++t) {
            const int e = threadIdx.x + t * kTileThreads;
            int k, m;
            slab_coords<P::kAAlongK, kTileRows, kSlab>(e, k, m);
            if (e < kSlab * kTileRows) As[k][m] = a_next[t];
        }
#pragma unroll
        for (int t = 0; t < kBLoads; ++t) {
            const int e = threadIdx.x + t * kTileThreads;
            int k, n;
            slab_coords<P::kBAlongK, BN, kSlab>(e, k, n);
            if (e < kSlab * BN) Bs[k][n] = b_next[t];
        }
        __syncthreads();
        if (k0 + kSlab < p.K) load(k0 + kSlab);
#pragma unroll
        for (int k = 0; k < kSlab; ++k) {
            const float4 av = *reinterpret_cast<const float4*>(&As[k][kMicroRows * ty]);
            const float am[kMicroRows] = {av.x, av.y, av.z, av.w};
            float bn[TN];
#pragma unroll
            for (int g = 0; g < TN / 4; ++g) {
                const float4 bv = *reinterpret_cast<const float4*>(&Bs[k][64 * g + 4 * tx]);
                bn[4 * g] = bv.x;
                bn[4 * g + 1] = bv.y;
                bn[4 * g + 2] = bv.z;
                bn[4 * g + 3] = bv.w;
            }
#pragma unroll
            for (int r = 0; r < kMicroRows; ++r)
#pragma unroll
                for (int t = 0; t < TN; ++t) acc[r][t] = __fmaf_rn(am[r], bn[t], acc[r][t]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < kMicroRows; ++r)
#pragma unroll
        for (int t = 0; t < TN; ++t)
            if (row_of(r) < p.M && col_of(t) < p.N) p.finish(row_of(r), col_of(t), acc[r][t]);
}

}  // namespace kernels
}  // namespace pvm
