// Many sequences (n_seq > 16): the per-unit work of a step as matrix products of one unit's matrices,
//   C[m, n] = sum_k A[k, m] B[k, n],
// run on tensor cores by mma_product (mma_products.cuh). Each product is a small struct: its extents
// (M, N, K), where A and B are (Operand: strides along k and along m or n; kAAlongK / kBAlongK say
// whether consecutive k are adjacent in memory), a scale applied to A's entries, what to do with a
// finished sum (finish; kFixedFinish: with its switches fixed at compile time, mma_products.cuh's finish_tile),
// and its tile shape (MmaShape), chosen by measurement (benchmarks/NOTES.md).
// Deterministic: every output is summed by one warp in a fixed order; no atomics.
#pragma once

#include <cstdint>
#include <type_traits>

#include "step_kernels.cuh"

namespace pvm {
namespace kernels {

// A tile shape of mma_product: kCols columns per 64-row tile, slabs kSlab deep through kStages stages of
// shared memory, at least kMinBlocks blocks per SM; kWarpsM x kWarpsN warps, each 64/kWarpsM rows x
// kCols/kWarpsN columns of the tile.
template <int Cols, int Slab, int Stages, int MinBlocks, int WarpsM = 2, int WarpsN = 4>
struct MmaShape {
    static constexpr int kCols = Cols, kSlab = Slab, kStages = Stages, kMinBlocks = MinBlocks;
    static constexpr int kWarpsM = WarpsM, kWarpsN = WarpsN, kThreads = 32 * WarpsM * WarpsN;
};
// 4 warps of 64 x 32 (an A value split once serves 4 fragments, a B value 4); 168 registers.
using MmaWide = MmaShape<128, 16, 4, 3, 1, 4>;
// The same at 2 blocks per SM (200 registers, no spills): better where a product has one column tile per
// unit (W0 forward up to 128 sequences: 265 tiles for small leave a third block per SM nothing to do).
using MmaWideFew = MmaShape<128, 16, 4, 2, 1, 4>;
static_assert(MmaWideFew::kCols == MmaWide::kCols, "one tile list serves both");
using MmaNarrow = MmaShape<64, 16, 4, 3>;
using MmaNarrowRow = MmaShape<64, 16, 4, 4, 1, 4>;  // 4 warps of 64 x 16
using MmaNarrowShallow = MmaShape<64, 8, 4, 4>;  // the short W1 forward sums (K = 50)

// Whether mma_product (mma_products.cuh) skips the mma steps of a warp's row fragments past the matrix for shape S
// (true unless S::kSkipDead says otherwise). Their A rows are copied as zeros and finish leaves them out, so the skip
// only saves work; but the per-fragment branch keeps ptxas from interleaving the fragments' dependent 3xTF32 HMMA
// triples (W1 forward's SASS: four triples back to back; without the branch, two chains paired). AllFragments<S>: S
// without the skip; the W0 and W1 forwards and the hidden deltas' few-sequence tiles are faster so (workbench, H100:
// 4-12%), the updates not (within 1-3% either way; benchmarks/NOTES.md).
template <class S, class = void>
struct SkipsDeadRows : std::true_type {};
template <class S>
struct SkipsDeadRows<S, std::void_t<decltype(S::kSkipDead)>> : std::bool_constant<S::kSkipDead> {};
template <class S>
struct AllFragments : S {
    static constexpr bool kSkipDead = false;
};

// A tile shape of wgmma_product (wgmma_product.cuh, sm_90a): one warpgroup per 64 x kCols tile, slabs kSlab
// deep through kStages raw stages, at least kMinBlocks blocks per SM; with Window, both operands copied as
// the 16-byte chunks that cover each row's slab (along k) or each k-row's columns (along x).
template <int Cols, int Slab, int Stages, int MinBlocks, bool Window = false>
struct WgmmaShape {
    static constexpr int kCols = Cols, kSlab = Slab, kStages = Stages, kMinBlocks = MinBlocks, kThreads = 128;
    static constexpr int kWarpsM = 4, kWarpsN = 1;
    static constexpr bool kWindow = Window;
};

// A tile shape of fma_product (fma_product.cuh, plain FP32 FMAs): 64 x kCols outputs per block, Tm x Tn adjacent
// outputs a thread, slabs kSlab deep through kStages stages, at least kMinBlocks blocks per SM.
template <int Cols, int Slab, int Stages, int MinBlocks, int Tm = 8, int Tn = 8>
struct FmaShape {
    static constexpr int kCols = Cols, kSlab = Slab, kStages = Stages, kMinBlocks = MinBlocks, kTm = Tm, kTn = Tn;
    static constexpr int kThreads = (64 / Tm) * (Cols / Tn);
    static_assert(Tm % 4 == 0 && Tn % 4 == 0 && 64 % (4 * Tm) == 0 && Cols % (8 * Tn) == 0, "warps of 4 x 8 threads");
};

// ---- the products ----------------------------------------------------------------------------

// A product's step-wide switches (the activation, the derivative mode) as compile-time constants: the tile kernels
// finish their outputs inside with_fixed (one copy of the finishing code per setting, no branch per output), others
// pass Runtime, which reads the switches from the step's arguments.
struct Runtime {};
template <bool Polynomial, Derivative D = Derivative::Original>
struct Fixed {
    static constexpr bool kPolynomial = Polynomial;
    static constexpr Derivative kDerivative = D;
};
template <class F>
__device__ __forceinline__ bool polynomial_in(F, bool runtime) {
    if constexpr (std::is_same_v<F, Runtime>) return runtime;
    else return F::kPolynomial;
}
template <class F>
__device__ __forceinline__ Derivative derivative_in(F, int runtime) {
    if constexpr (std::is_same_v<F, Runtime>) return static_cast<Derivative>(runtime);
    else return F::kDerivative;
}

// Where an operand's entries are: entry (k, x) at base[k * sk + x * sx] (x = m for A, n for B).
struct Operand {
    const float* base;
    int64_t sk, sx;
    __device__ const float* at(int64_t k, int64_t x) const { return base + k * sk + x * sx; }
};
// An operand gathered along the unit's inputs (W0's products, where the x ring
// holds the step's sources and x_index places each input): entry (k, x) at base[index[k] + x * sx] when k
// runs over the inputs (the forward), base[k * sk + index[x]] when x does (the update).
struct IndexedOperand {
    const float* base;
    const int32_t* index;
    int64_t sk, sx;
};

// A forward product of one unit: out(s)[q, m] = phi(sum_k W[m, k] in(s)[q, k]), n = q. The rings'
// slot s and the unit's offsets are resolved once, in the constructor. Every product has the same
// parts: extents M, N, K; operands A, B (kBIndexed: B is an IndexedOperand); a_scale (with kScaleA, A's
// entries are a_scale * A, rounded); old (what finish reads of the old state) and finish.
template <class BOperand = Operand>
struct Forward {
    static constexpr bool kAAlongK = true, kBAlongK = true, kUpdate = false, kScaleA = false;
    static constexpr bool kBIndexed = std::is_same_v<BOperand, IndexedOperand>;
    static constexpr bool kFixedFinish = false;
    int64_t M, N, K, out_stride;
    Operand A;  // A[k, m] = W[m, k]
    BOperand B;  // B[k, q] = in(s)[q, k]
    float* out;
    bool polynomial;
    float a_scale = 1.0f;
    __device__ Forward(const StepArgs& a, int64_t rows, int64_t length, int64_t pitch, int64_t weight_base, BOperand in,
                       float* out_ring, int64_t out_stride)
        : M(rows), N(a.n_seq), K(length), out_stride(out_stride), A{a.weights + weight_base, 1, pitch}, B(in),
          out(out_ring + ring_slot(*a.step) * a.n_seq * out_stride), polynomial(a.polynomial) {}
    struct Old {};  // what finish reads of the old state (loaded for all of a thread's outputs before any is written)
    __device__ Old old(int64_t, int64_t) const { return {}; }
    template <class F = Runtime>
    __device__ void finish(int64_t m, int64_t q, float sum, Old, F f = {}) const {
        out[q * out_stride + m] = activation(sum, polynomial_in(f, polynomial));
    }
    template <class Fn>
    __device__ void with_fixed(Fn&& fn) const {
        if (polynomial) fn(Fixed<true>{});
        else fn(Fixed<false>{});
    }
};

// h(s) = phi(W0 x(s)): m = hidden row, k = input i, x(s) gathered from the step's sources.
// On mma.sync everywhere: with x gathered (4-byte copies of B) it was ahead of the wgmma shapes on an H100
// (frames/s against wgmma with 16-byte windows for W0: small 192 +0.3%, 256 +2.4%, 512 +3.9%, 1,024 +4.6%;
// med 128/256 +3.0/+2.8%, LARGE 128/256 +4.0/+5.5%; small 96/128 -0.9/-0.8% against 64-column wgmma tiles).
// Above 128 sequences at 2 blocks a SM, every fragment multiplied (AllFragments, mma_products.cuh). Workbench, H100,
// against MmaWide: 244.9 -> 245.1 us at 256 sequences, 916 -> 812 at 1,024; at 128 and below MmaWideFew as it is
// (131 against 149 us at 128).
struct W0Forward : Forward<IndexedOperand> {
    using MmaTiles = AllFragments<MmaWideFew>;
    using MmaTilesOneColumn = MmaWideFew;  // up to MmaTiles::kCols sequences
    __device__ W0Forward(const StepArgs& a, int64_t u)
        : Forward(a, a.hidden, a.x_off[u + 1] - a.x_off[u], w0_pitch(a.x_off[u + 1] - a.x_off[u]), a.w0_off[u],
                  IndexedOperand{a.x + ring_slot(*a.step) * a.n_seq * a.x_stride, a.x_index + a.x_off[u], 0, a.x_stride},
                  a.h + a.h_off[u], a.h_total) {}
};

// y(s) = phi(W1 h(s)): m = output j, k = hidden k.
// Every fragment multiplied (AllFragments): ptxas then pairs the fragments' HMMA chains. Workbench, H100: 30.5 -> 27.5
// us at 16 sequences, 32.7 -> 30.8 at 64, 394 -> 379 at 1,024.
struct W1Forward : Forward<> {
    using MmaTiles = AllFragments<MmaNarrowShallow>;
    static constexpr bool kFixedFinish = true;
    __device__ W1Forward(const StepArgs& a, int64_t u)
        : Forward(a, a.y_off[u + 1] - a.y_off[u], a.h_off[u + 1] - a.h_off[u], a.h_off[u + 1] - a.h_off[u], a.w1_off[u],
                  Operand{a.h + ring_slot(*a.step) * a.n_seq * a.h_total + a.h_off[u], 1, a.h_total}, a.y + a.y_off[u],
                  a.y_total) {}
};

// eps[q, k] = sum_j delta_out[q, j] W1[j, k] with the current W1, stored as lr * g(h(s-2)) * eps
// (what the W0 update uses); m = k < H, n = q, summed over the unit's outputs j.
struct HiddenDeltas {
    static constexpr bool kAAlongK = false, kBAlongK = true, kUpdate = false, kScaleA = false, kBIndexed = false;
    static constexpr bool kFixedFinish = true;
    using MmaTiles = MmaNarrow;
    // Up to 32 sequences: 32-column tiles of 8 warps, each 16 x 16 (a 64-column tile is mostly copies of
    // columns past n_seq; with 265 tiles, one per unit, a block's instruction chain is the time).
    // Workbench, H100, against the wgmma tiles: 31.3 -> 27.7 us at 16 sequences, 32.9 -> 27.3 at 32.
    // W1 (A) is copied under evict_last, as the hidden-deltas kernels below 17 sequences read it (step_kernels.cuh):
    // H200, frames/s, 17 / 24 / 32 sequences small +1.4 / +1.3 / +1.3%, med 0.0 / -0.2 / -0.3%, LARGE 0.0 / -0.1 /
    // -0.4% (two rounds). Every fragment multiplied (AllFragments): workbench, H100, 26.5 -> 23.6 us at 16 and 32
    // sequences. Against the wgmma tiles at 48 and 64 they were ahead in the workbench (33.1 -> 31.7, 35.5 -> 31.9
    // us), not in the engine (H100, 64 sequences: the deltas phase small 64.2 -> 63.7 us, LARGE 312 -> 320).
    struct MmaTilesFew : AllFragments<MmaShape<32, 32, 3, 3, 4, 2>> {
        static constexpr bool kKeepA = true;
    };
    // On sm_90a from 33 sequences: W1's rows (along x) and delta_out's (along k) as 16-byte windows. Workbench
    // (H100) against the tiles before (wgmma up to 64, mma.sync above): 40.2 -> 36.3 us at 64 sequences,
    // 97.6 -> 92.3 at 256, 349 -> 339 at 1,024.
    using WgmmaTiles = WgmmaShape<64, 16, 4, 3, true>;
    const StepArgs& a;
    int64_t M, N, K;
    Operand A, B;  // A[j, k] = W1[j, k], B[j, q] = delta_out[q, j]
    const float* h_old;
    float* out;
    float lr, a_scale = 1.0f;
    __device__ HiddenDeltas(const StepArgs& args, int64_t unit)
        : a(args), M(args.hidden), N(args.n_seq), K(args.y_off[unit + 1] - args.y_off[unit]),
          A{args.weights + args.w1_off[unit], args.h_off[unit + 1] - args.h_off[unit], 1},
          B{args.delta_out + args.y_off[unit], 1, args.y_total},
          h_old(args.h + ring_slot(*args.step - 2) * args.n_seq * args.h_total + args.h_off[unit]),
          out(args.lr_delta_hidden + args.h_off[unit]), lr(args.unit_lr[unit]) {}
    using Old = float;  // h(s-2)[q, k]
    __device__ Old old(int64_t k, int64_t q) const { return h_old[q * a.h_total + k]; }
    template <class F = Runtime>
    __device__ void finish(int64_t k, int64_t q, float eps, Old h, F f = {}) const {
        out[q * a.h_total + k] = __fmul_rn(lr, delta(h, eps, polynomial_in(f, a.polynomial), derivative_in(f, a.derivative)));
    }
    template <class Fn>
    __device__ void with_fixed(Fn&& fn) const {
        if (!a.polynomial) fn(Fixed<false>{});
        else if (static_cast<Derivative>(a.derivative) == Derivative::Original) fn(Fixed<true, Derivative::Original>{});
        else fn(Fixed<true, Derivative::Exact>{});
    }
};

// The momentum update of one weight matrix: g[m, n] = mean_q lr*delta[q, m] act(s-2)[q, n];
// V = fma(mu, V, g); W += V. Summed over the sequences q. Units not yet enabled only clear V.
template <class BOperand = Operand>
struct Update {
    static constexpr bool kAAlongK = false, kBAlongK = false, kUpdate = true, kScaleA = false;
    static constexpr bool kBIndexed = std::is_same_v<BOperand, IndexedOperand>;
    static constexpr bool kFixedFinish = false;
    const StepArgs& a;
    int64_t M, N, K, P;  // P: W's and V's row pitch (W0: w0_pitch(N); W1: N)
    float *W, *V;
    Operand A{};   // A[q, m] = lr * delta[q, m] (the scale in a_scale)
    BOperand B{};  // B[q, n] = the activation of step s-2
    float mu, inv_n, a_scale = 1.0f;
    bool inactive;
    __device__ Update(const StepArgs& args, int64_t rows, int64_t cols, int64_t pitch, int64_t weight_base, int64_t unit)
        : a(args), M(rows), N(cols), K(args.n_seq), P(pitch), W(args.weights + weight_base), V(args.velocity + weight_base),
          mu(args.unit_mu[unit]), inv_n(1.0f / static_cast<float>(args.n_seq)),
          inactive(args.unit_lr[unit] == 0.0f && args.unit_mu[unit] == 0.0f) {}
    using Old = float2;  // W[m, n], V[m, n]
    __device__ Old old(int64_t m, int64_t n) const { return {W[m * P + n], V[m * P + n]}; }
    template <class F = Runtime>
    __device__ void finish(int64_t m, int64_t n, float g, Old wv, F = {}) const {
        const float v = __fmaf_rn(mu, wv.y, __fmul_rn(g, inv_n));  // the mean as the passes take it: times 1/n
        W[m * P + n] = __fadd_rn(wv.x, v);
        V[m * P + n] = v;
    }
    __device__ void clear(int64_t m, int64_t n) const {
        if (V[m * P + n] != 0.0f) V[m * P + n] = 0.0f;
    }
    // The old W and V of a rows x cols tile from (m0, n0) into L2, a few slabs before finish reads them:
    // one bulk prefetch per row of W (e even) and of V (e odd), e = 2 * row + which, spread over the block.
    // Why: the finish's loads from DRAM were a quarter of the (wgmma) W0 update's stall samples at 12 warps
    // per SM (benchmarks/NOTES.md).
    __device__ void prefetch_old(int64_t m0, int64_t n0, int rows, int cols) const {
        const int live = static_cast<int>(M - m0 < rows ? M - m0 : rows);
        const int64_t n = N - n0 < cols ? N - n0 : cols;
        for (int e = static_cast<int>(threadIdx.x); e < 2 * live; e += static_cast<int>(blockDim.x))
            prefetch_l2((e % 2 ? V : W) + (m0 + e / 2) * P + n0, static_cast<int>(n));
    }
};

// W0: m = row < H, n = input i; A = lr * delta_h(s-2) (already scaled), B = x(s-2) gathered from its sources.
// On mma.sync: with the old W and V prefetched (prefetch_old) it was ahead of wgmma_product's 8-deep slabs
// (workbench, H200: 259.7 against 279.7 us at 256 sequences, 747 against 764 at 1,024; benchmarks/NOTES.md).
struct W0Update : Update<IndexedOperand> {
    using MmaTiles = MmaWide;
    // From 65 to 128 sequences (FP32 precision): plain FP32 FMAs, 8 x 8 outputs a thread, on the same 128-column tile
    // list. A tile sums over only K = n_seq sequences, where the tensor cores' split, copies and epilogue cost more
    // than the FMAs they save. H100, engine A/B (PVM_CUDA_FMA=W against the tensor cores, best of two rounds, frames/s):
    // at 72 small / med / LARGE +8.1 / +9.3 / +10.2%, at 96 +6.3 / +6.1 / +7.2%, at 128 +0.9 / +1.3 / +2.0%; at 256
    // -6.6 / -6.8 / -6.8%. The phase at small 96: 198 -> 171 us. (64 x 64 tiles, PVM_CUDA_FMA=w: 2-3 points less.)
    using FmaTilesMid = FmaShape<128, 16, 3, 2>;
    __device__ W0Update(const StepArgs& args, int64_t unit)
        : Update(args, args.hidden, args.x_off[unit + 1] - args.x_off[unit], w0_pitch(args.x_off[unit + 1] - args.x_off[unit]),
                 args.w0_off[unit], unit) {
        A = {args.lr_delta_hidden + args.h_off[unit], args.h_total, 1};
        B = {args.x + ring_slot(*args.step - 2) * args.n_seq * args.x_stride, args.x_index + args.x_off[unit], args.x_stride, 0};
    }
};

// W1: m = output j, n = hidden k; A = lr * delta_out(s-2), B = h(s-2). Above 64 sequences one warp per 16
// columns, with the old W and V prefetched (workbench, H200, against 2 x 2 warps: 102.6 -> 96.2 us at 256,
// 279.7 -> 270.7 at 1,024).
struct W1Update : Update<> {
    static constexpr bool kScaleA = true;
    using MmaTiles = MmaNarrowRow;
    // Up to 64 sequences (FP32 precision): plain FP32 FMAs, 4 x 8 adjacent outputs a thread (fma_product.cuh), where
    // a tile (64 of a unit's outputs by its 50 hidden entries) sums over only K = n_seq <= 64 sequences. H100, engine
    // A/B, frames/s against the wgmma tiles (64 x 64, slabs of 8 x 5) before: small 48 / 64 +5.6 / +4.5%, med
    // +6.5 / +4.2%, LARGE +5.9 / +3.7% (the phase at small 48: 59.8 -> 46.2 us). Above 64 the tensor cores' full
    // tiles are ahead (small 256 / 1,024: -2.4 / -5.3%).
    using FmaTilesFew = FmaShape<64, 16, 3, 3, 4, 8>;
    // From 65 to 128 sequences: FMAs still, 8 x 8 outputs a thread. H100, engine A/B against the tensor cores' tiles
    // (best of two rounds, frames/s): at 96 small / med / LARGE +1.5 / +2.8 / +2.5% (4 x 8 a thread: +1.2 / +2.7 /
    // +2.1%), at 128 +1.1 / +1.3 / +1.6% (+0.2 / +1.1 / +0.8%); the phase at LARGE 96: 386 -> 297 us.
    using FmaTilesMid = FmaShape<64, 16, 3, 4>;
    __device__ W1Update(const StepArgs& args, int64_t unit)
        : Update(args, args.y_off[unit + 1] - args.y_off[unit], args.h_off[unit + 1] - args.h_off[unit],
                 args.h_off[unit + 1] - args.h_off[unit], args.w1_off[unit], unit) {
        A = {args.delta_out + args.y_off[unit], args.y_total, 1};
        B = {args.h + ring_slot(*args.step - 2) * args.n_seq * args.h_total + args.h_off[unit], args.h_total, 1};
        a_scale = args.unit_lr[unit];  // A = lr * delta_out, rounded as the CPU engine does
    }
};

}  // namespace kernels
}  // namespace pvm
