// Workbench: the n_seq = 1 weight passes (weight_pass_single in native/src/step_kernels.cuh): W0's
// rows with a warp each and W1's rows of H+1 = 50 floats with 8 lanes each, against a CPU reference,
// and timed with L2 flushed before each run (in a step, the other pass's weights come in between).
// A small.json-like layer stack: 265 units of 49 hidden rows, inputs of 400..1769 entries (rows start
// at every alignment), 150 or 392 outputs per unit, W1 after W0 as the topology lays them out.
// Checks the forward sums phi(W x(s)) and the momentum update with the (s-2) inputs, then reports the
// weight traffic (16 bytes per weight: W, V read and written) against the device copy bandwidth, for
// the engine's version and the others (U loads per lane per trip, lanes per W1 row).
//   nvcc -std=c++17 -O3 -arch=sm_90 -fmad=false -I../../native/include -o weight_pass_single weight_pass_single.cu
//   ./weight_pass_single
#include "step_state.h"

using namespace pvm;
using namespace pvm::kernels;

namespace {

constexpr int64_t kK = kHidden + 1;

// One kernel version: which rows (W0 or W1), its name, and how it is launched.
struct Version {
    bool w1;
    const char* name;
    void (*launch)(const StepArgs&, const Layout&);
};

template <class Row, int G, int U>
void launch(const StepArgs& a, const Layout& L) {
    const int64_t rows = Row::kW1 ? L.y_total : kUnits * kHidden;
    weight_pass_single<Row, G, U><<<static_cast<unsigned>((rows * G + kThreads - 1) / kThreads), kThreads>>>(a);
}

struct W0 : RowW0 { static constexpr bool kW1 = false; };
struct W1 : RowW1 { static constexpr bool kW1 = true; };

bool check_and_time(const Layout& L, double copy_bw, const Version& ver) {
    const int64_t step = 5;  // ring slots: cur = 2, old = 0
    const int cur = static_cast<int>(step % kRing), old = static_cast<int>((step - 2) % kRing);
    State S(L, 1);
    if (!ver.w1)  // W0 writes h(s): poisoned
        std::fill(S.h.begin() + cur * L.h_total, S.h.begin() + (cur + 1) * L.h_total, -7.0f);
    const std::vector<float>&w = S.w, &v = S.v, &x = S.x, &h = S.h, &d = S.d, &ldh = S.ldh, &lr = S.lr, &mu = S.mu;

    // CPU reference in double for the rows this version computes; the other weights stay as they are.
    std::vector<double> out_ref(ver.w1 ? L.y_total : L.h_total, 0.0), w_ref(w.begin(), w.end()), v_ref(v.begin(), v.end());
    std::vector<bool> out_mask(out_ref.size(), false);
    for (int64_t u = 0; u < kUnits; ++u) {
        const bool active = !(lr[u] == 0.0f && mu[u] == 0.0f);
        const int64_t rows = ver.w1 ? L.y_off[u + 1] - L.y_off[u] : kHidden;
        const int64_t len = ver.w1 ? kK : L.x_off[u + 1] - L.x_off[u];
        const float* in = ver.w1 ? &h[cur * L.h_total + L.h_off[u]] : &x[cur * L.x_total + L.x_off[u]];
        const float* in_old = ver.w1 ? &h[old * L.h_total + L.h_off[u]] : &x[old * L.x_total + L.x_off[u]];
        for (int64_t k = 0; k < rows; ++k) {
            const int64_t base = ver.w1 ? L.w1_off[u] + k * len : L.w0_at(u, k, 0);  // (pitched rows)
            const int64_t o = ver.w1 ? L.y_off[u] + k : L.h_off[u] + k;
            const float ld = ver.w1 ? lr[u] * d[L.y_off[u] + k] : ldh[L.h_off[u] + k];
            double sum = 0.0;
            for (int64_t i = 0; i < len; ++i) sum += static_cast<double>(w[base + i]) * in[i];
            out_ref[o] = activation(static_cast<float>(sum), true);
            out_mask[o] = true;
            for (int64_t i = 0; i < len; ++i) {
                const double vv = active ? static_cast<double>(mu[u]) * v[base + i] + static_cast<double>(ld) * in_old[i] : 0.0;
                v_ref[base + i] = vv;
                w_ref[base + i] = active ? w[base + i] + vv : w[base + i];
            }
        }
    }

    DeviceScope dev;
    const StepArgs a = upload(dev, L, S, 1, step);
    ver.launch(a, L);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    const auto w_got = to_host(a.weights, w.size()), v_got = to_host(a.velocity, v.size());
    const int64_t per_slot = ver.w1 ? L.y_total : L.h_total;
    const auto ring = to_host(ver.w1 ? a.y : a.h, kRing * per_slot);
    std::vector<float> out_got(ring.begin() + cur * per_slot, ring.begin() + (cur + 1) * per_slot);
    std::printf("%s\n", ver.name);
    bool ok = report_check("outputs phi(W in(s))", relative_error(out_got, out_ref, out_mask), 1e-6);
    ok &= report_check("W after the update", relative_error(w_got, w_ref), 1e-6);
    ok &= report_check("V after the update", relative_error(v_got, v_ref), 1e-5);

    const double us = time_us([&] { ver.launch(a, L); }, 5, 50, flush_l2);  // W, V keep changing: fine for timing
    const int64_t n_w = ver.w1 ? L.n_weights - L.n_w0 : L.n_w0;
    const double bytes = 16.0 * n_w;
    std::printf("  %.1f us, weight traffic %.2f TB/s = %.0f%% of copy\n", us, bytes / us * 1e-6, 100.0 * bytes / (us * 1e-6) / copy_bw);
    return ok;
}

}  // namespace

int main() {
    const Layout L([](int64_t u) { return 400 + (u * 37) % 1370; }, [](int64_t u) { return u < 144 ? 150 : 392; });
    const double copy_bw = copy_bandwidth(size_t{1} << 30);
    std::printf("W0: %ld weights, W1: %ld (%.1f MB of W and V); copy bandwidth %.2f TB/s\n", static_cast<long>(L.n_w0),
                static_cast<long>(L.n_weights - L.n_w0), 8.0 * L.n_weights / 1e6, copy_bw / 1e12);
    const Version versions[] = {
        {false, "W0, a warp per row, U = 8 (engine)", launch<W0, kWarp, 8>},
        {false, "W0, a warp per row, U = 4", launch<W0, kWarp, 4>},
        {false, "W0, a warp per row, U = 16", launch<W0, kWarp, 16>},
        {true, "W1, 8 lanes per row (engine)", launch<W1, 8, 8>},
        {true, "W1, 4 lanes per row", launch<W1, 4, 16>},
        {true, "W1, 16 lanes per row", launch<W1, 16, 4>},
        {true, "W1, 32 lanes per row", launch<W1, 32, 2>},
    };
    bool ok = true;
    for (const Version& v : versions) ok &= check_and_time(L, copy_bw, v);
    std::printf("%s\n", ok ? "all checks passed" : "SOME CHECKS FAILED");
    return ok ? 0 : 1;
}
