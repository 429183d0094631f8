// Workbench: the per-unit hidden deltas for 1..4 sequences (hidden_deltas in native/src/hidden_deltas_few.cuh; from 5
// the engine takes hidden_deltas_split), against a CPU reference, and timed.
// Units shaped as small.json's (121 of 392 outputs, 144 of 150) or with PVM_WB_SPEC=med as med's (265 and 256), W1
// blocks of M x 50, 49 hidden rows, taken most outputs first as the engine does (PVM_WB_ROWS=m: every unit m outputs,
// for a kernel's fixed cost). Checks lr * g(h(s-2)) * sum_j W1[j,k] delta_out[q,j] for every sequence in both block
// shapes (256 threads, and 512 at 3-4 sequences: hd_threads), and unit_errors' per-unit squared error sums, then
// times each with L2 flushed before each run (W1 from HBM) and without.
//   nvcc -std=c++17 -O3 -arch=sm_90 -fmad=false -I../../native/include -o hidden_deltas hidden_deltas.cu
//   ./hidden_deltas [n_seq ...]        (default: 1 2 3 4; PVM_WB_NOTIME=1: checks only, for compute-sanitizer)
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common.h"
#include "../../native/src/hidden_deltas_few.cuh"

using namespace pvm;
using namespace pvm::kernels;

namespace {

constexpr int64_t kHidden = 49, kK = kHidden + 1;

// The engine's kernel for n sequences at T threads a block (its row groups of 51 columns), from delta_out (the
// engine's computes its units' output deltas first: tests/test_native_engine.py holds those to output_deltas').
template <int T>
void launch(const StepArgs& a, unsigned units, int64_t n) {
    if (n <= 1) hidden_deltas<1, T, T / kHdNarrowCols, false><<<units, T>>>(a);
    else if (n <= 2) hidden_deltas<2, T, T / kHdNarrowCols, false><<<units, T>>>(a);
    else hidden_deltas<4, T, T / kHdNarrowCols, false><<<units, T>>>(a);
}

bool check_and_time(int64_t n) {
    // The spec's units: layer 0 (150 outputs) first, then the upper layers (392), as the topology numbers them.
    const char* spec = std::getenv("PVM_WB_SPEC");
    const bool med = spec != nullptr && std::strcmp(spec, "med") == 0;
    const int64_t small_units = med ? 256 : 144, big_units = med ? 265 : 121, kUnits = small_units + big_units;
    const char* rows = std::getenv("PVM_WB_ROWS");  // every unit this many outputs instead: a kernel's fixed cost
    std::vector<int64_t> y_off{0}, h_off{0}, w1_off{0};
    for (int64_t u = 0; u < kUnits; ++u) {
        const int64_t m = rows ? std::atoi(rows) : u < small_units ? 150 : 392;
        y_off.push_back(y_off.back() + m);
        h_off.push_back(h_off.back() + kK);
        w1_off.push_back(w1_off.back() + m * kK);
    }
    const int64_t y_total = y_off.back(), h_total = h_off.back(), n_w = w1_off.back();
    const int64_t step = 7;
    const int old = static_cast<int>((step - 2) % kRing);
    std::vector<float> w(n_w), d(n * y_total), h(kRing * n * h_total), lr(kUnits), out(n * h_total, -7.0f);
    fill_uniform(w, -0.1f, 0.1f, 11);
    fill_uniform(d, -0.05f, 0.05f, 12);
    fill_uniform(h, 0.05f, 0.95f, 13);
    fill_uniform(lr, 0.001f, 0.003f, 14);
    std::vector<double> err_sq(y_total);
    for (int64_t j = 0; j < y_total; ++j) err_sq[j] = 0.001 * static_cast<double>(j % 13);

    std::vector<double> want(n * h_total, 0.0), unit_want(2 * kUnits, 0.0);
    std::vector<bool> mask(n * h_total, false);
    for (int64_t u = 0; u < kUnits; ++u) {
        const int64_t M = y_off[u + 1] - y_off[u];
        for (int64_t q = 0; q < n; ++q)
            for (int64_t k = 0; k < kHidden; ++k) {
                double eps = 0.0;
                for (int64_t j = 0; j < M; ++j)
                    eps += static_cast<double>(w[w1_off[u] + j * kK + k]) * d[q * y_total + y_off[u] + j];
                const float ho = h[(old * n + q) * h_total + h_off[u] + k];
                const int64_t o = q * h_total + h_off[u] + k;
                want[o] = static_cast<double>(lr[u]) * delta(ho, static_cast<float>(eps), true, Derivative::Original);
                mask[o] = true;
            }
        for (int64_t j = 0; j < M; ++j) unit_want[2 * u + (j < M / 2 ? 0 : 1)] += err_sq[y_off[u] + j];
    }

    DeviceScope dev;
    StepArgs a{};
    a.n_seq = n;
    a.n_units = kUnits;
    a.hidden = kHidden;
    a.y_total = y_total;
    a.h_total = h_total;
    a.polynomial = true;
    a.derivative = static_cast<int>(Derivative::Original);
    a.y_off = dev.put(y_off);
    a.h_off = dev.put(h_off);
    a.w1_off = dev.put(w1_off);
    a.weights = dev.put(w);
    a.delta_out = dev.put(d);
    a.h = dev.put(h);
    a.unit_lr = dev.put(lr);
    a.lr_delta_hidden = dev.put(out);
    a.error_sq = dev.put(err_sq);  // one row: a single sequence group up to 8 sequences
    a.delta_group = delta_group_seqs(n);
    a.unit_error = dev.put(std::vector<double>(2 * kUnits, -1.0));
    a.layer_unit_range = dev.put(std::vector<int64_t>{0, 0});  // no layer-0 units: no baseline sums
    a.step = dev.put(std::vector<int64_t>{step});
    std::vector<int32_t> order(kUnits);  // most outputs first (the engine's unit_order)
    for (int64_t u = 0; u < kUnits; ++u) order[u] = static_cast<int32_t>(u);
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) {
        return y_off[x + 1] - y_off[x] > y_off[y + 1] - y_off[y];
    });
    a.unit_order = dev.put(order);
    const unsigned units = static_cast<unsigned>(kUnits);
    std::printf("n_seq %ld, %s units\n", static_cast<long>(n), med ? "med" : "small");
    bool ok = true;
    const auto check = [&](const char* what, auto&& run) {
        CHECK(cudaMemcpy(a.lr_delta_hidden, out.data(), out.size() * sizeof(float), cudaMemcpyHostToDevice));
        run();
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
        const auto got = to_host(a.lr_delta_hidden, out.size());
        ok &= report_check(what, relative_error(got, want, mask), 1e-5);
        bool untouched = true;
        for (size_t i = 0; i < got.size(); ++i)
            if (!mask[i] && got[i] != -7.0f) untouched = false;
        std::printf("  %-28s %s\n", "bias entries untouched", untouched ? "ok" : "FAIL");
        ok &= untouched;
    };
    check("256 threads: lr * delta_h", [&] { launch<256>(a, units, n); });
    if (n >= 3) check("512 threads: lr * delta_h", [&] { launch<512>(a, units, n); });
    unit_errors<<<static_cast<unsigned>(kUnits), kThreads>>>(a);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    const auto unit_got = to_host(a.unit_error, 2 * kUnits);
    std::vector<float> unit_f(unit_got.begin(), unit_got.end());
    ok &= report_check("unit error sums", relative_error(unit_f, unit_want), 1e-6);
    if (std::getenv("PVM_WB_NOTIME")) return ok;  // (under compute-sanitizer)
    // W1 from HBM as in a step (the W0 pass runs in between), and from L2.
    const auto report = [&](const char* what, auto&& run) {
        const double cold = time_us(run, 5, 50, flush_l2), warm = time_us(run);
        std::printf("  %-11s %.1f us (W1 from L2: %.1f us), W1 read at %.2f TB/s, %.1f us per sequence\n", what, cold, warm,
                    4.0 * n_w / (cold * 1e-6) / 1e12, cold / n);
    };
    report("256 threads", [&] { launch<256>(a, units, n); });
    if (n >= 3) report("512 threads", [&] { launch<512>(a, units, n); });
    return ok;
}

}  // namespace

int main(int argc, char** argv) {
    const std::vector<int64_t> seqs = parse_seqs(argc, argv, {1, 2, 3, 4}, 1, 4);
    bool ok = true;
    for (int64_t n : seqs) ok &= check_and_time(n);
    std::printf("%s\n", ok ? "all checks passed" : "SOME CHECKS FAILED");
    return ok ? 0 : 1;
}
