// Workbench: the five per-unit products of a many-sequence step (W0 forward, W1 forward, hidden deltas,
// W0 update, W1 update) on tensor cores (native/src/mma_products.cuh, 3xTF32) and in plain FP32 FMAs
// (native/src/fma_product.cuh; "FMA" in the labels) against a CPU reference
// in double (every 8th unit), on one step of a small.json-like stack: 265 units of 49 hidden rows,
// 700..1499 inputs and 150..409 outputs per unit. Each product is checked and timed under several tile
// shapes, with its least traffic (operands once, W and V read and written for an update) against the
// copy rate.
//   nvcc -std=c++17 -O3 -arch=sm_90a -fmad=false -I../../native/include -o mma_products mma_products.cu
// (sm_90a for the wgmma_product shapes; with another -arch they are skipped)
//   ./mma_products [n_seq ...]        (default: 64 256)
// PVM_WB_ONLY="W0 update,W1 update" runs only the products named (and skips the other references);
// PVM_WB_FIRST=N times only the first N shapes of each (the engine's come first), for quick A/Bs of one kernel.
#include "../../native/src/mma_products.cuh"
#include "../../native/src/wgmma_product.cuh"
#include "step_state.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

using namespace pvm;
using namespace pvm::kernels;

namespace {

constexpr int64_t kStep = 5;  // ring slots: cur = 2, old = 0
constexpr int kCur = kStep % kRing, kOld = (kStep - 2) % kRing;
constexpr int64_t kSampleEvery = 8;  // the CPU reference covers every 8th unit
// The hidden deltas' MmaTilesFew skipping dead row fragments, as before AllFragments.
struct FewSkipping : MmaShape<32, 32, 3, 3, 4, 2> {
    static constexpr bool kKeepA = true;
};

// Expected values of a product's output entries: (index in the buffer result() returns, value).
using Expected = std::vector<std::pair<int64_t, double>>;

// h(s)[q, m] = phi(sum_i W0[m, i] x(s)[q, i]) and y(s)[q, j] = phi(sum_k W1[j, k] h(s)[q, k]).
Expected forward_ref(const Layout& L, const State& S, int64_t n, bool w0) {
    Expected out;
    for (int64_t u = 0; u < kUnits; u += kSampleEvery) {
        const int64_t rows = w0 ? kHidden : L.y_off[u + 1] - L.y_off[u], len = w0 ? L.x_off[u + 1] - L.x_off[u] : kHidden + 1;
        // x(s) through its places in the rows of sources; h(s) as it is
        const float* in = w0 ? &S.xs[kCur * n * L.x_stride] : &S.h[kCur * n * L.h_total + L.h_off[u]];
        const int64_t in_stride = w0 ? L.x_stride : L.h_total;
        auto at = [&](int64_t k) { return w0 ? L.x_index[L.x_off[u] + k] : k; };
        const float* W = &S.w[w0 ? L.w0_off[u] : L.w1_off[u]];
        const int64_t pitch = w0 ? w0_pitch(len) : len;
        for (int64_t q = 0; q < n; ++q)
            for (int64_t r = 0; r < rows; ++r) {
                double sum = 0.0;
                for (int64_t k = 0; k < len; ++k) sum += static_cast<double>(W[r * pitch + k]) * in[q * in_stride + at(k)];
                const int64_t at = w0 ? (kCur * n + q) * L.h_total + L.h_off[u] + r : (kCur * n + q) * L.y_total + L.y_off[u] + r;
                out.emplace_back(at, activation(static_cast<float>(sum), true));
            }
    }
    return out;
}

// lr * g(h(s-2)) * eps with eps[q, k] = sum_j delta_out[q, j] W1[j, k].
Expected hidden_deltas_ref(const Layout& L, const State& S, int64_t n) {
    Expected out;
    for (int64_t u = 0; u < kUnits; u += kSampleEvery) {
        const int64_t outs = L.y_off[u + 1] - L.y_off[u];
        for (int64_t q = 0; q < n; ++q)
            for (int64_t k = 0; k < kHidden; ++k) {
                double eps = 0.0;
                for (int64_t j = 0; j < outs; ++j)
                    eps += static_cast<double>(S.d[q * L.y_total + L.y_off[u] + j]) * S.w[L.w1_off[u] + j * (kHidden + 1) + k];
                const float h_old = S.h[(kOld * n + q) * L.h_total + L.h_off[u] + k];
                out.emplace_back(q * L.h_total + L.h_off[u] + k,
                                 static_cast<double>(S.lr[u]) * delta(h_old, static_cast<float>(eps), true, Derivative::Original));
            }
    }
    return out;
}

// V = mu V + (sum_q A[q, m] B[q, x]) / n, W = W + V (a unit not learning: V = 0, W kept); entries of
// W at their index, V's after all of W (as result() returns them).
Expected update_ref(const Layout& L, const State& S, int64_t n, bool w0) {
    Expected out;
    for (int64_t u = 0; u < kUnits; u += kSampleEvery) {
        const int64_t rows = w0 ? kHidden : L.y_off[u + 1] - L.y_off[u], len = w0 ? L.x_off[u + 1] - L.x_off[u] : kHidden + 1;
        const int64_t base = w0 ? L.w0_off[u] : L.w1_off[u];
        const bool active = !(S.lr[u] == 0.0f && S.mu[u] == 0.0f);
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < len; ++c) {
                double g = 0.0;
                for (int64_t q = 0; q < n; ++q) {
                    const double a = w0 ? S.ldh[q * L.h_total + L.h_off[u] + r]
                                        : static_cast<double>(S.lr[u] * S.d[q * L.y_total + L.y_off[u] + r]);
                    const double b = w0 ? S.xs[(kOld * n + q) * L.x_stride + L.x_index[L.x_off[u] + c]]
                                        : S.h[(kOld * n + q) * L.h_total + L.h_off[u] + c];
                    g += a * b;
                }
                const int64_t i = base + r * (w0 ? w0_pitch(len) : len) + c;
                const double v = active ? static_cast<double>(S.mu[u]) * S.v[i] + g / static_cast<double>(n) : 0.0;
                out.emplace_back(i, active ? S.w[i] + v : S.w[i]);
                out.emplace_back(L.n_weights + i, v);
            }
    }
    return out;
}

// What a product writes, read back: the h, y or lr*delta_h buffer, or W and V.
std::vector<float> result(const StepArgs& a, const Layout& L, int64_t n, int which) {
    switch (which) {
        case 0: return to_host(a.h, kRing * n * L.h_total);
        case 1: return to_host(a.y, kRing * n * L.y_total);
        case 2: return to_host(a.lr_delta_hidden, n * L.h_total);
        default: {
            auto w = to_host(a.weights, L.n_weights), v = to_host(a.velocity, L.n_weights);
            w.insert(w.end(), v.begin(), v.end());
            return w;
        }
    }
}

bool wgmma_in_binary() {
    static const bool built = [] {
        bool b = false;
        CHECK(query_wgmma_built(b));
        return b;
    }();
    return built;
}

template <class P, class Shape>
void launch_mma(const StepArgs& a, const std::vector<int32_t>& t, const int32_t* d) {
    product_kernel<P, Shape>()<<<static_cast<unsigned>(t.size() / 3), Shape::kThreads, product_shared_bytes<Shape>()>>>(a, d);
}

// One product at n sequences under each shape in Shapes: checked against `want`, then timed.
template <class P, class... Shapes>
bool bench(const char* name, int which, const Layout& L, const State& S, int64_t n, double bytes, double flops,
           const std::function<Expected()>& reference, std::function<std::array<int64_t, 3>(int64_t)> mnk, double copy_bw) {
    const char* only = std::getenv("PVM_WB_ONLY");
    if (only != nullptr && std::strstr(only, name) == nullptr) return true;
    std::printf("  %s (%.0f MB moved at least, %.1f GFLOP)\n", name, bytes / 1e6, flops / 1e9);
    const Expected want = reference();
    bool ok = true;
    const char* first = std::getenv("PVM_WB_FIRST");
    int left = first != nullptr ? std::atoi(first) : 1 << 30;
    auto one = [&](auto shape) {
        using Shape = decltype(shape);
        if (left-- <= 0) return;
        if (IsWgmmaShape<Shape>::value && !wgmma_in_binary()) {
            std::printf("    wgmma shape skipped: build with -arch=sm_90a on an H100/H200\n");
            return;
        }
        DeviceScope dev;
        const StepArgs a = upload(dev, L, S, n, kStep, true);
        const auto t = tiles(kMmaProductRows, Shape::kCols, mnk);
        const int32_t* d = dev.put(t);
        CHECK(cudaFuncSetAttribute(product_kernel<P, Shape>(), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(product_shared_bytes<Shape>())));
        launch_mma<P, Shape>(a, t, d);
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
        const std::vector<float> all = result(a, L, n, which);
        std::vector<float> got;
        std::vector<double> expect;
        for (const auto& [i, v] : want) {
            got.push_back(all[i]);
            expect.push_back(v);
        }
        const double err = relative_error(got, expect);
        const Precision precision = ShapePrecision<Shape>::value;
        const double us = time_us([&] { launch_mma<P, Shape>(a, t, d); });  // W, V keep changing: fine for timing
        char label[64];
        const char* kind = "";
        if constexpr (IsWgmmaShape<Shape>::value) kind = Shape::kWindow ? "wgmma window " : "wgmma ";
        if (precision != Precision::kFp32) kind = precision == Precision::kTf32 ? "TF32 " : "BF16 ";
        if constexpr (!IsWgmmaShape<Shape>::value && !IsFmaShape<Shape>::value)
            if (!SkipsDeadRows<Shape>::value) kind = "all fragments ";
        if constexpr (IsFmaShape<Shape>::value)
            std::snprintf(label, sizeof label, "FMA 64x%d slab %dx%d, %d/SM, %dx%d a thread", Shape::kCols, Shape::kSlab,
                          Shape::kStages, Shape::kMinBlocks, Shape::kTm, Shape::kTn);
        else
            std::snprintf(label, sizeof label, "%s64x%d slab %dx%d, %d/SM, %dx%d w", kind, Shape::kCols, Shape::kSlab,
                          Shape::kStages, Shape::kMinBlocks, Shape::kWarpsM, Shape::kWarpsN);
        // 3xTF32: ~22 bits per operand; sums of ~1,000 terms measured at 2.2e-6. The opt-in modes' errors are what
        // they measure; their bounds only catch a broken fragment layout.
        const bool good = err <= (precision == Precision::kFp32 ? 5e-6 : precision == Precision::kTf32 ? 2e-3 : 2e-2);
        std::printf("    %-32s %8.1f us  %6.1f TFLOP/s  %5.0f%% of copy  rel err %.1e %s\n", label, us,
                    flops / us * 1e-6, 100.0 * bytes / (us * 1e-6) / copy_bw, err, good ? "ok" : "FAIL");
        ok &= good;
    };
    (one(Shapes{}), ...);
    return ok;
}

}  // namespace

int main(int argc, char** argv) {
    const std::vector<int64_t> seqs = parse_seqs(argc, argv, {64, 256}, 9, 4096);
    const Layout L([](int64_t u) { return 700 + (u * 37) % 800; }, [](int64_t u) { return 150 + (u * 53) % 260; });
    const double copy_bw = copy_bandwidth(size_t{1} << 30);
    const double w0 = static_cast<double>(L.n_w0), w1 = static_cast<double>(L.n_weights - L.n_w0);
    std::printf("%ld W0 and %ld W1 weights; copy bandwidth %.2f TB/s\n", static_cast<long>(L.n_w0),
                static_cast<long>(L.n_weights - L.n_w0), copy_bw / 1e12);
    auto inputs = [&](int64_t u) { return L.x_off[u + 1] - L.x_off[u]; };
    auto outputs = [&](int64_t u) { return L.y_off[u + 1] - L.y_off[u]; };
    bool ok = true;
    for (int64_t n : seqs) {
        const double N = static_cast<double>(n);
        std::printf("n_seq %ld\n", static_cast<long>(n));
        const State S(L, n);
        // The engine's shapes (unit_products.cuh) first, then the ones they replaced or beat (benchmarks/NOTES.md);
        // the engine's mma.sync shapes also in the opt-in TF32 and BF16 modes (issue 12 item 3).
        using Tf32Wide = InPrecision<MmaWide, Precision::kTf32>;
        using Bf16Wide = InPrecision<MmaWide, Precision::kBf16>;
        using Tf32W0Forward = InPrecision<W0Forward::MmaTiles, Precision::kTf32>;
        using Bf16W0Forward = InPrecision<W0Forward::MmaTiles, Precision::kBf16>;
        using Tf32Row = InPrecision<MmaNarrowRow, Precision::kTf32>;
        using Bf16Row = InPrecision<MmaNarrowRow, Precision::kBf16>;
        using Tf32Shallow = InPrecision<W1Forward::MmaTiles, Precision::kTf32>;
        using Bf16Shallow = InPrecision<W1Forward::MmaTiles, Precision::kBf16>;
        using Tf32Narrow = InPrecision<MmaNarrow, Precision::kTf32>;
        using Bf16Narrow = InPrecision<MmaNarrow, Precision::kBf16>;
        using Wide2x4 = MmaShape<128, 16, 4, 2>;
        using Wide2x2 = MmaShape<128, 16, 4, 3, 2, 2>;
        using MmaNarrowQuad = MmaShape<64, 16, 4, 4, 2, 2>;  // the W1 update's above 64 before prefetch_old
        using Narrow1x2 = MmaShape<64, 16, 4, 6, 1, 2>;
        using Shallow1x4 = MmaShape<64, 8, 4, 4, 1, 4>;
        using WgmmaDeep = WgmmaShape<128, 16, 3, 2>;     // 4-byte copies (the W0 forward's before window copies)
        using WgmmaShallow = WgmmaShape<128, 8, 5, 3>;   // the W0 update's on sm_90a before prefetch_old
        using WgNarrow = WgmmaShape<64, 8, 5, 4>;
        using WgNarrowDeep = WgmmaShape<64, 16, 4, 3>;
        using WgNarrowShort = WgmmaShape<64, 8, 3, 4>;
        using FmaWide = FmaShape<128, 16, 3, 2>;  // plain FP32 FMAs (fma_product.cuh): 8 x 8 a thread
        using FmaWide3 = FmaShape<128, 16, 3, 3>;
        using FmaWideQuad = FmaShape<128, 16, 3, 2, 4, 8>;  // 4 x 8 a thread, 256 threads
        using FmaNarrow = FmaShape<64, 16, 3, 4>;       // 64 threads
        using FmaNarrowDeep = FmaShape<64, 32, 3, 4>;
        using FmaNarrowQuad = FmaShape<64, 16, 3, 3, 4, 8>;  // 128 threads
        using FmaWideDeep = FmaShape<128, 32, 3, 2>;  // W1's K = 50 in flight at once (2 slabs of 32)
        using ShallowDeep = MmaShape<64, 32, 3, 3>;
        // 128 columns a tile for the many-sequence W1 forward and hidden deltas: each A value split once serves twice
        // the columns, and W1 is read half as often; slower (H100, 1,024 sequences: W1 forward 518-588 against 393 us,
        // hidden deltas 359-420 against 329), with fewer warps a SM (benchmarks/results-finish-h100.md).
        using WideShallow = MmaShape<128, 8, 4, 3, 1, 4>;
        using WideShallow2x4 = MmaShape<128, 8, 4, 2, 2, 4>;
        using WgWideWindow = WgmmaShape<128, 16, 4, 2, true>;
        ok &= bench<W0Forward, W0Forward::MmaTiles, MmaWideFew, MmaWide, AllFragments<MmaWide>, FmaWide, FmaWideQuad, Tf32W0Forward, Bf16W0Forward, WgmmaDeep, WgmmaShallow, Wide2x4, Wide2x2>(
            "W0 forward", 0, L, S, n, 4.0 * (w0 + N * L.x_stride), 2.0 * N * w0, [&] { return forward_ref(L, S, n, true); },
            [&](int64_t u) { return std::array<int64_t, 3>{kHidden, n, inputs(u)}; }, copy_bw);
        ok &= bench<W0Update, MmaWide, AllFragments<MmaWide>, FmaWide, FmaWideQuad, Tf32Wide, Bf16Wide, WgmmaShallow, WgmmaDeep, MmaWideFew, Wide2x4, Wide2x2>(
            "W0 update", 3, L, S, n, 16.0 * w0 + 4.0 * N * L.x_stride, 2.0 * N * w0, [&] { return update_ref(L, S, n, true); },
            [&](int64_t u) { return std::array<int64_t, 3>{kHidden, inputs(u), n}; }, copy_bw);
        ok &= bench<W1Forward, W1Forward::MmaTiles, MmaNarrowShallow, AllFragments<MmaShape<64, 8, 4, 3>>, ShallowDeep, WideShallow, WideShallow2x4, FmaWide, FmaWideDeep, FmaWide3, FmaWideQuad, FmaNarrow, FmaNarrowDeep, FmaNarrowQuad, Tf32Shallow, Bf16Shallow, WgNarrowShort, WgNarrow, Shallow1x4, MmaNarrowQuad>(
            "W1 forward", 1, L, S, n, 4.0 * (w1 + N * L.y_total), 2.0 * N * w1, [&] { return forward_ref(L, S, n, false); },
            [&](int64_t u) { return std::array<int64_t, 3>{outputs(u), n, kHidden + 1}; }, copy_bw);
        ok &= bench<W1Update, MmaNarrowRow, AllFragments<MmaNarrowRow>, FmaNarrowQuad, FmaNarrow, FmaNarrowDeep, Tf32Row, Bf16Row, MmaNarrowQuad, WgNarrow, WgNarrowDeep, MmaNarrow, Narrow1x2>(
            "W1 update", 3, L, S, n, 16.0 * w1 + 4.0 * N * L.y_total, 2.0 * N * w1, [&] { return update_ref(L, S, n, false); },
            [&](int64_t u) { return std::array<int64_t, 3>{outputs(u), kHidden + 1, n}; }, copy_bw);
        using WindowShallow = WgmmaShape<64, 8, 5, 4, true>;
        ok &= bench<HiddenDeltas, HiddenDeltas::WgmmaTiles, HiddenDeltas::MmaTilesFew, FewSkipping, WgWideWindow, MmaWide, MmaNarrow, FmaWide, FmaWideQuad, FmaNarrow, FmaNarrowQuad, Tf32Narrow, Bf16Narrow, WgNarrowDeep, WindowShallow, MmaNarrowQuad, MmaNarrowRow>(
            "hidden deltas", 2, L, S, n, 4.0 * (w1 + N * L.y_total), 2.0 * N * w1, [&] { return hidden_deltas_ref(L, S, n); },
            [&](int64_t u) { return std::array<int64_t, 3>{kHidden, n, outputs(u)}; }, copy_bw);
    }
    std::printf("%s\n", ok ? "all checks passed" : "SOME CHECKS FAILED");
    return ok ? 0 : 1;
}
