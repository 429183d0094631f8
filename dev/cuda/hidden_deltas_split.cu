// Workbench: the hidden deltas of 5 to 16 sequences, the engine's two kernels for them (native/src): the product
// in 32-column tiles (mma_product<HiddenDeltas, MmaTilesFew>, mma_products.cuh) and the block per unit with its
// sum split between the warps (hidden_deltas_split, hidden_deltas_split.cuh), against a CPU reference in double,
// then timed with L2 flushed (W1 comes from DRAM in a step: the W0 pass streams through L2 in between).
// small.json-like: 265 units of 49 hidden rows, 150..409 outputs per unit.
//   nvcc -std=c++17 -O3 -arch=sm_90a -fmad=false -I../../native/include -o hidden_deltas_split hidden_deltas_split.cu
//   ./hidden_deltas_split [n_seq ...]        (default: 5 8 16)
#include "../../native/src/hidden_deltas_split.cuh"
#include "../../native/src/mma_products.cuh"
#include "step_state.h"

using namespace pvm;
using namespace pvm::kernels;

namespace {

constexpr int64_t kStep = 5;  // ring slots: cur = 2, old = 0
constexpr int kOld = (kStep - 2) % kRing;

// lr * g(h(s-2)) * eps with eps[q, k] = sum_j delta_out[q, j] W1[j, k], for every unit, sequence and hidden row.
std::vector<double> reference(const Layout& L, const State& S, int64_t n) {
    std::vector<double> out(n * L.h_total, 0.0);
    for (int64_t u = 0; u < kUnits; ++u)
        for (int64_t q = 0; q < n; ++q)
            for (int64_t k = 0; k < kHidden; ++k) {
                double eps = 0.0;
                for (int64_t j = 0; j < L.y_off[u + 1] - L.y_off[u]; ++j)
                    eps += static_cast<double>(S.d[q * L.y_total + L.y_off[u] + j]) * S.w[L.w1_off[u] + j * (kHidden + 1) + k];
                const float h_old = S.h[(kOld * n + q) * L.h_total + L.h_off[u] + k];
                out[q * L.h_total + L.h_off[u] + k] =
                    static_cast<double>(S.lr[u]) * delta(h_old, static_cast<float>(eps), true, Derivative::Original);
            }
    return out;
}

template <int NS>
void launch_split(const StepArgs& a, const int32_t*) {
    constexpr size_t bytes = split_shared_bytes<NS>();
    CHECK(cudaFuncSetAttribute(hidden_deltas_split<NS>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    hidden_deltas_split<NS><<<static_cast<unsigned>(kUnits), kSplitThreads, bytes>>>(a);
}
void launch_split_bucket(const StepArgs& a, const int32_t* tiles) {
    by_mma_bucket(a.n_seq, [&](auto bucket) {
        constexpr int NS = decltype(bucket)::value;
        if constexpr (NS <= 16) launch_split<NS>(a, tiles);
    });
}
using Few = HiddenDeltas::MmaTilesFew;
void launch_product(const StepArgs& a, const int32_t* tiles) {
    CHECK(cudaFuncSetAttribute(mma_product<HiddenDeltas, Few>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(mma_product_shared_bytes<Few>())));
    mma_product<HiddenDeltas, Few><<<static_cast<unsigned>(kUnits), Few::kThreads, mma_product_shared_bytes<Few>()>>>(a, tiles);
}

bool check_and_time(const Layout& L, int64_t n, double copy_bw, const char* name, void (*launch)(const StepArgs&, const int32_t*)) {
    const State S(L, n);
    const std::vector<double> want = reference(L, S, n);
    std::vector<bool> mask(want.size(), false);
    for (int64_t q = 0; q < n; ++q)
        for (int64_t u = 0; u < kUnits; ++u)
            for (int64_t k = 0; k < kHidden; ++k) mask[q * L.h_total + L.h_off[u] + k] = true;
    DeviceScope dev;
    StepArgs a = upload(dev, L, S, n, kStep);
    a.lr_delta_hidden = dev.put(std::vector<float>(n * L.h_total, -7.0f));
    // The product's list: one 64 x 32 tile per unit (49 hidden rows, at most 32 sequences), the longest sums first.
    const int32_t* d_tiles = dev.put(tiles(kMmaProductRows, Few::kCols, [&](int64_t u) {
        return std::array<int64_t, 3>{kHidden, n, L.y_off[u + 1] - L.y_off[u]};
    }));
    launch(a, d_tiles);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    const auto got = to_host(a.lr_delta_hidden, want.size());
    std::printf("n_seq %ld, %s\n", static_cast<long>(n), name);
    bool ok = report_check("lr * delta_h", relative_error(got, want, mask), 5e-6);
    bool untouched = true;  // the bias rows stay as poisoned
    for (size_t i = 0; i < got.size(); ++i)
        if (!mask[i] && got[i] != -7.0f) untouched = false;
    std::printf("  %-28s %s\n", "bias entries untouched", untouched ? "ok" : "FAIL");
    ok &= untouched;
    const double cold = time_us([&] { launch(a, d_tiles); }, 5, 50, flush_l2), warm = time_us([&] { launch(a, d_tiles); });
    const double bytes = 4.0 * static_cast<double>(L.n_weights - L.n_w0 + n * L.y_total);
    std::printf("  %.1f us (from L2: %.1f us), %.0f%% of copy\n", cold, warm, 100.0 * bytes / (cold * 1e-6) / copy_bw);
    return ok;
}

}  // namespace

int main(int argc, char** argv) {
    const std::vector<int64_t> seqs = parse_seqs(argc, argv, {5, 8, 16}, 1, 16);
    const Layout L([](int64_t u) { return 700 + (u * 37) % 800; }, [](int64_t u) { return 150 + (u * 53) % 260; });
    const double copy_bw = copy_bandwidth(size_t{1} << 30);
    std::printf("%ld W1 weights; copy bandwidth %.2f TB/s\n", static_cast<long>(L.n_weights - L.n_w0), copy_bw / 1e12);
    bool ok = true;
    for (int64_t n : seqs) {
        ok &= check_and_time(L, n, copy_bw, "product, 32-column tiles (engine)", launch_product);
        ok &= check_and_time(L, n, copy_bw, "a block per unit, sums split between warps", launch_split_bucket);
    }
    std::printf("%s\n", ok ? "all checks passed" : "SOME CHECKS FAILED");
    return ok ? 0 : 1;
}
