// Workbench: the W1 pass, the engine's versions (its own code): weight_pass_mma<RowW1> (native/src/mma_pass.cuh: a
// block per run of up to 64 rows, streamed along its 50 columns) and weight_pass_short (native/src/short_rows_pass.cuh:
// resident blocks walking 64-row tiles) on tensor cores for 1..64 sequences; at one and two sequences also
// w1_stream_pass (native/src/w1_stream_pass.cuh: resident blocks streaming equal runs of 32-row tiles by bulk copies,
// sm_90) and at one the row pass weight_pass_single<RowW1, 8>; against a CPU reference in double, and timed (L2
// flushed before each run).
// One step of the W1 rows of a small.json-like layer stack: 265 units of 49 hidden entries plus the bias (rows of
// 50), 150..392 outputs per unit as in small.json. Checks y(s) = phi(W1 h(s)) and the momentum update with
// lr*delta_out and h(s-2), then reports the weight traffic (16 bytes per weight) against the copy bandwidth.
//   nvcc -std=c++17 -O3 -arch=sm_90a -fmad=false -I../../native/include -o w1_pass w1_pass.cu
//   ./w1_pass [n_seq ...]        (default: 1 2 4 5 8 16 32 64; PVM_WB_NOTIME=1: checks only, for compute-sanitizer)
#include "../../native/src/short_rows_pass.cuh"
#include "../../native/src/w1_stream_pass.cuh"
#include "step_state.h"

using namespace pvm;
using namespace pvm::kernels;

namespace {

int64_t inputs(int64_t u) { return 788 + (u * 37) % 638; }  // (W0's; only its offsets matter here)
int64_t outputs(int64_t u) { return 150 + (u * 53) % 243; }  // 150..392, as small.json's units
constexpr int64_t kLen = kHidden + 1;

// The lists the versions walk, on the device: weight_pass_mma's runs (mma_blocks), weight_pass_short's 64-row tiles
// and w1_stream_pass's 32-row tiles (short_tiles' records).
struct Lists {
    const int32_t* runs;
    const int64_t *tiles, *stream;
    int64_t n_runs, n_tiles, n_stream;
};

void launch_mma(const StepArgs& a, const Lists& l, int64_t n) {
    by_mma_bucket(n, [&](auto bucket) {
        constexpr int NS = decltype(bucket)::value;
        constexpr size_t bytes = mma_shared_bytes<NS>();
        CHECK(cudaFuncSetAttribute(weight_pass_mma<RowW1, NS>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
        weight_pass_mma<RowW1, NS><<<static_cast<unsigned>(l.n_runs), kMmaThreads, bytes>>>(a, l.runs);
    });
}

// Resident blocks of `kernel` with `threads` and `bytes` of dynamic shared memory: as many as fit at once (at most n).
template <class Kernel>
int64_t resident(Kernel kernel, int threads, size_t bytes, int64_t n) {
    return std::min<int64_t>(n, int64_t{resident_per_sm(kernel, threads, bytes)} * device_sms());
}

void launch_short(const StepArgs& a, const Lists& l, int64_t n) {
    by_mma_bucket(n, [&](auto bucket) {
        constexpr int NS = decltype(bucket)::value;
        constexpr size_t bytes = short_shared_bytes<NS>();
        const int64_t grid = resident(weight_pass_short<NS>, kShortThreads, bytes, l.n_tiles);
        weight_pass_short<NS><<<static_cast<unsigned>(grid), kShortThreads, bytes>>>(a, l.tiles, static_cast<int>(l.n_tiles));
    });
}

template <int NS>
void launch_stream_bucket(const StepArgs& a, const Lists& l) {
    constexpr size_t bytes = stream_shared_bytes<NS>();
    const int64_t grid = resident(w1_stream_pass<NS>, kStreamThreads, bytes, l.n_stream);
    if (!stream_fits(l.n_stream, grid)) {
        std::fprintf(stderr, "w1_stream_pass: more than %d tiles a block\n", kStreamMaxTiles);
        std::exit(1);
    }
    w1_stream_pass<NS><<<static_cast<unsigned>(grid), kStreamThreads, bytes>>>(a, l.stream, static_cast<int>(l.n_stream));
}
void launch_stream(const StepArgs& a, const Lists& l, int64_t n) {
    if (n == 1) launch_stream_bucket<1>(a, l);
    else launch_stream_bucket<2>(a, l);
}

void launch_rows(const StepArgs& a, const Lists&, int64_t) {
    const int64_t threads = a.y_total * 8;
    weight_pass_single<RowW1, 8><<<static_cast<unsigned>((threads + kThreads - 1) / kThreads), kThreads>>>(a);
}

struct Version {
    const char* name;
    void (*launch)(const StepArgs&, const Lists&, int64_t);
};

bool check_and_time(const Layout& L, int64_t n, double copy_bw, const Version& ver) {
    const int64_t step = 5;  // ring slots: cur = 2, old = 0
    const int cur = static_cast<int>(step % kRing), old = static_cast<int>((step - 2) % kRing);
    State S(L, n);
    const int64_t n_w1 = L.n_weights - L.n_w0;
    std::vector<double> y_ref(n * L.y_total), w_ref(n_w1), v_ref(n_w1);
    for (int64_t u = 0; u < kUnits; ++u) {
        const bool active = !(S.lr[u] == 0.0f && S.mu[u] == 0.0f);
        for (int64_t r = L.y_off[u]; r < L.y_off[u + 1]; ++r) {
            const int64_t base = L.w1_off[u] + (r - L.y_off[u]) * kLen;
            for (int64_t q = 0; q < n; ++q) {
                const float* hq = &S.h[(cur * n + q) * L.h_total + L.h_off[u]];
                double sum = 0.0;
                for (int64_t c = 0; c < kLen; ++c) sum += static_cast<double>(S.w[base + c]) * hq[c];
                y_ref[q * L.y_total + r] = activation(static_cast<float>(sum), true);
            }
            for (int64_t c = 0; c < kLen; ++c) {
                double g = 0.0;
                for (int64_t q = 0; q < n; ++q)
                    g += static_cast<double>(S.lr[u]) * S.d[q * L.y_total + r] * S.h[(old * n + q) * L.h_total + L.h_off[u] + c];
                const double vv = active ? static_cast<double>(S.mu[u]) * S.v[base + c] + g / n : 0.0;
                v_ref[base - L.n_w0 + c] = vv;
                w_ref[base - L.n_w0 + c] = active ? S.w[base + c] + vv : S.w[base + c];
            }
        }
    }

    DeviceScope dev;
    const StepArgs a = upload(dev, L, S, n, step);
    const auto rows = [&](int64_t u) { return L.y_off[u + 1] - L.y_off[u]; };
    const MmaBlocks mb = mma_blocks(kUnits, 0, rows, [](int64_t) { return kLen; });
    const std::vector<int64_t> stream = stream_tiles(kUnits, rows, L.w1_off, L.y_off, L.h_off);
    const int64_t n_runs = static_cast<int64_t>(mb.list.size() / kMmaBlockInts);
    const Lists lists{dev.put(mb.list), dev.put(short_tiles(mb.list, L.w1_off, L.y_off, L.h_off)), dev.put(stream), n_runs, n_runs,
                      static_cast<int64_t>(stream.size()) / kShortTileInts};
    ver.launch(a, lists, n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    const auto y_got = to_host(a.y, S.y.size());
    const auto w_got = to_host(a.weights + L.n_w0, n_w1), v_got = to_host(a.velocity + L.n_w0, n_w1);
    const auto w0_got = to_host(a.weights, L.n_w0);
    std::vector<float> y_cur(y_got.begin() + cur * n * L.y_total, y_got.begin() + (cur + 1) * n * L.y_total);
    std::printf("n_seq %ld, %s\n", static_cast<long>(n), ver.name);
    bool ok = report_check("y(s) = phi(W1 h(s))", relative_error(y_cur, y_ref), 2e-6);
    ok &= report_check("W1 after the update", relative_error(w_got, w_ref), 2e-6);
    ok &= report_check("V after the update", relative_error(v_got, v_ref), 2e-5);
    bool untouched = std::equal(w0_got.begin(), w0_got.end(), S.w.begin());  // W0 and the other ring slots stay
    for (int64_t i = 0; i < static_cast<int64_t>(y_got.size()); ++i)
        if (i / (n * L.y_total) != cur && y_got[i] != -7.0f) untouched = false;
    std::printf("  %-28s %s\n", "nothing else written", untouched ? "ok" : "FAIL");
    ok &= untouched;

    if (std::getenv("PVM_WB_NOTIME")) return ok;  // (under compute-sanitizer)
    const double us = time_us([&] { ver.launch(a, lists, n); }, 5, 50, flush_l2);
    const double bytes = 16.0 * n_w1;
    std::printf("  %.1f us, weight traffic %.2f TB/s = %.0f%% of copy\n", us, bytes / us * 1e-6, 100.0 * bytes / (us * 1e-6) / copy_bw);
    return ok;
}

}  // namespace

int main(int argc, char** argv) {
    const std::vector<int64_t> seqs = parse_seqs(argc, argv, {1, 2, 4, 5, 8, 16, 32, 64}, 1, 64);
    const Layout L(inputs, outputs);
    const double copy_bw = copy_bandwidth(size_t{1} << 30);
    std::printf("W1: %ld rows of %ld (%.1f MB of W and V); copy bandwidth %.2f TB/s\n", static_cast<long>(L.y_total),
                static_cast<long>(kLen), 8.0 * (L.n_weights - L.n_w0) / 1e6, copy_bw / 1e12);
    bool ok = true;
    const Version mma{"weight_pass_mma<RowW1>", launch_mma}, tiles{"weight_pass_short", launch_short},
        streamed{"w1_stream_pass", launch_stream}, row_pass{"weight_pass_single<RowW1, 8>", launch_rows};
    int device_major = 0;
    CHECK(cudaDeviceGetAttribute(&device_major, cudaDevAttrComputeCapabilityMajor, 0));
    for (int64_t n : seqs) {
        if (n == 1) ok &= check_and_time(L, n, copy_bw, row_pass);
        ok &= check_and_time(L, n, copy_bw, mma);
        ok &= check_and_time(L, n, copy_bw, tiles);
        if (n <= kStreamMaxSeqs && device_major >= 9) ok &= check_and_time(L, n, copy_bw, streamed);  // (bulk copies: sm_90)
    }
    std::printf("%s\n", ok ? "all checks passed" : "SOME CHECKS FAILED");
    return ok ? 0 : 1;
}
