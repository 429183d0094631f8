// Workbench: the W0 pass for 2..64 sequences on tensor cores (the engine's own code): weight_pass_mma
// (native/src/mma_pass.cuh, 3xTF32, any n_seq up to 64) and w0_span_pass (native/src/w0_span_pass.cuh, sm_90), against
// a CPU reference, and timed. (Until the tensor-core pass took 2-4 sequences too, this file also ran the fused FMA pass,
// weight_pass_multi, that the engine used there: benchmarks/NOTES.md has its numbers.)
// One step of the W0 rows of a small.json-like layer stack: 265 units of 49 hidden rows, inputs of
// unequal lengths; W0 on the device in the engine's layouts (column tiles, the engine's layout for the pass, beside
// rows pitched to 16 bytes). Checks h(s) = phi(W0 x(s)) and the momentum update
// with the (s-2) inputs for every n_seq given, then times each and reports the weight traffic
// (16 bytes per weight: W, V read and written) against the device-to-device copy bandwidth.
//   nvcc -std=c++17 -O3 -arch=sm_90a -fmad=false -I../../native/include -o weight_pass_mma weight_pass_mma.cu
//   ./weight_pass_mma [n_seq ...]        (default: 2 4 8 13 16 32 64; PVM_WB_NOTIME=1: checks only, for compute-sanitizer)
// The mma pass runs in the default precision (3xTF32) and in the opt-in TF32 and BF16 modes.
#include "../../native/src/mma_pass.cuh"
#include "../../native/src/w0_span_pass.cuh"
#include "step_state.h"

using namespace pvm;
using namespace pvm::kernels;

namespace {

// 788..1425 inputs (odd and even lengths), and every 20th unit 2059: small.json's spread (442..2059,
// mean 1084, 10-90% 788..1425), where the longest units set the pass's time. (The outputs serve no W0 row.)
int64_t inputs(int64_t u) { return u % 20 == 0 ? 2059 : 788 + (u * 37) % 638; }
int64_t outputs(int64_t) { return 150; }

template <int NS, Precision P, class Row>
void launch_mma(const StepArgs& a, const int32_t* blocks, int64_t n_blocks) {
    constexpr size_t bytes = mma_shared_bytes<NS, Row::kTiled>();
    CHECK(cudaFuncSetAttribute(weight_pass_mma<Row, NS, P>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    weight_pass_mma<Row, NS, P><<<static_cast<unsigned>(n_blocks), kMmaThreads, bytes>>>(a, blocks);
}

// The slots the engine balances the pass over (mma_balance_slots, as cuda_engine.cu's mma_slots counts them).
template <int NS>
int64_t slots() {
    return mma_balance_slots(resident_per_sm(weight_pass_mma<RowW0Tiled, NS>, kMmaThreads, mma_shared_bytes<NS, true>()), device_sms());
}
int64_t mma_slots(int64_t n) {
    return by_mma_bucket(n, [](auto bucket) { return slots<decltype(bucket)::value>(); });
}

// W0 pitched (RowW0) or in column tiles (RowW0Tiled: the engine's layout for this pass).
template <Precision P = Precision::kFp32, class Row = RowW0Tiled>
void launch_mma_bucket(const StepArgs& a, const int32_t* blocks, const int32_t*, int64_t n_blocks, int64_t n) {
    by_mma_bucket(n, [&](auto bucket) { launch_mma<decltype(bucket)::value, P, Row>(a, blocks, n_blocks); });
}

// w0_span_pass (sm_90: the engine's pass of 2-16 and 33-64 sequences, on small) with S stages, A chunks in flight,
// on span_list's blocks: how many of them are resident at once, and a launch.
template <int NS, int S, int A>
int64_t span_blocks_of() {
    return int64_t{resident_per_sm(w0_span_pass<NS, Precision::kFp32, S, A>, kSpanThreads, span_shared_bytes<NS, S>())} * device_sms();
}
template <int NS, int S, int A>
void launch_span(const StepArgs& a, const int32_t* segments, const int32_t* first, int64_t n_blocks) {
    constexpr size_t bytes = span_shared_bytes<NS, S>();
    CHECK(cudaFuncSetAttribute(w0_span_pass<NS, Precision::kFp32, S, A>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    w0_span_pass<NS, Precision::kFp32, S, A><<<static_cast<unsigned>(n_blocks), kSpanThreads, bytes>>>(
        a, reinterpret_cast<const SpanSegment*>(segments), first);
}
// The buckets of 8 and 16 with S stages, A ahead.
template <int S, int A>
void launch_span_bucket(const StepArgs& a, const int32_t* segments, const int32_t* first, int64_t n_blocks, int64_t n) {
    if (n <= 8) launch_span<8, S, A>(a, segments, first, n_blocks);
    else launch_span<16, S, A>(a, segments, first, n_blocks);
}
template <int S, int A>
int64_t span_blocks(int64_t n) {
    return n <= 8 ? span_blocks_of<8, S, A>() : span_blocks_of<16, S, A>();
}
// Any bucket of 8-64 in the engine's shape (two blocks a SM up to 16, one from 17; span_stages).
void launch_span_any(const StepArgs& a, const int32_t* segments, const int32_t* first, int64_t n_blocks, int64_t n) {
    by_mma_bucket(n, [&](auto bucket) {
        constexpr int NS = decltype(bucket)::value;
        launch_span<NS, span_stages<NS>(), span_stages<NS>() - 1>(a, segments, first, n_blocks);
    });
}
int64_t span_blocks_any(int64_t n) {
    return by_mma_bucket(n, [](auto bucket) {
        constexpr int NS = decltype(bucket)::value;
        return span_blocks_of<NS, span_stages<NS>(), span_stages<NS>() - 1>();
    });
}

// One kernel version: its name, how it is launched, and its blocks (weight_pass_mma's: mma_blocks, with `split` runs
// longer than the mean load of a resident block split, as the engine does; w0_span_pass's: span_list's).
struct Version {
    const char* name;
    void (*launch)(const StepArgs&, const int32_t*, const int32_t*, int64_t, int64_t);
    double tol;  // relative error allowed against the double reference
    bool split = false;
    bool tiled = false;  // W0 in column tiles (else pitched rows)
    int64_t (*spans)(int64_t) = nullptr;  // w0_span_pass: its block count for n sequences (span_list's blocks)
    bool sources = false;  // x as rows of the step's sources with an index (the engine's from 2 sequences)
};

bool check_and_time(const Layout& pitched, const Layout& tiled, int64_t n, double copy_bw, const Version& ver) {
    const Layout& L = ver.tiled ? tiled : pitched;
    const int64_t step = 5;  // ring slots: cur = 2, old = 0
    const int cur = static_cast<int>(step % kRing), old = static_cast<int>((step - 2) % kRing);
    State S(L, n);
    std::fill(S.h.begin(), S.h.end(), -7.0f);  // h(s) is written, the rest must stay as poisoned
    if (ver.sources)  // the materialised x the reference reads, from the sources through the index
        for (int64_t slot = 0; slot < kRing; ++slot)
            for (int64_t q = 0; q < n; ++q)
                for (int64_t e = 0; e < L.x_total; ++e)
                    S.x[(slot * n + q) * L.x_total + e] = S.xs[(slot * n + q) * L.x_stride + L.x_index[e]];
    const std::vector<float>&w = S.w, &v = S.v, &x = S.x, &h = S.h, &ldh = S.ldh, &lr = S.lr, &mu = S.mu;

    // CPU reference in double.
    std::vector<double> h_ref(n * L.h_total, 0.0), w_ref(L.n_w0), v_ref(L.n_w0);  // W0 only (W1 follows it)
    std::vector<bool> h_mask(n * L.h_total, false);
    for (int64_t u = 0; u < kUnits; ++u) {
        const int64_t len = L.x_off[u + 1] - L.x_off[u];
        const bool active = !(lr[u] == 0.0f && mu[u] == 0.0f);
        for (int64_t k = 0; k < kHidden; ++k) {
            for (int64_t q = 0; q < n; ++q) {
                const float* xq = &x[(cur * n + q) * L.x_total + L.x_off[u]];
                double sum = 0.0;
                for (int64_t i = 0; i < len; ++i) sum += static_cast<double>(w[L.w0_at(u, k, i)]) * xq[i];
                const int64_t o = q * L.h_total + L.h_off[u] + k;
                h_ref[o] = activation(static_cast<float>(sum), true);
                h_mask[o] = true;
            }
            for (int64_t i = 0; i < len; ++i) {
                double g = 0.0;
                for (int64_t q = 0; q < n; ++q)
                    g += static_cast<double>(ldh[q * L.h_total + L.h_off[u] + k]) *
                         x[(old * n + q) * L.x_total + L.x_off[u] + i];
                const int64_t at = L.w0_at(u, k, i);
                const double vv = active ? static_cast<double>(mu[u]) * v[at] + g / n : 0.0;
                v_ref[at] = vv;
                w_ref[at] = active ? w[at] + vv : w[at];
            }
        }
    }

    DeviceScope dev;
    StepArgs a = upload(dev, L, S, n, step, ver.sources);
    std::vector<int32_t> host_blocks, host_first{0};
    const int64_t* spans = nullptr;  // w0_span_pass's segments
    int64_t n_blocks = 0;
    if (ver.spans) {
        const SpanList sl = span_list(ver.spans(n), kHidden, L.x_off, L.h_off, L.w0_off);
        if (!span_fits(sl)) {
            std::printf("n_seq %ld, %s: a block's segments do not fit its shared memory\n", static_cast<long>(n), ver.name);
            return false;
        }
        const std::vector<int64_t> words = span_words(sl.segments);
        spans = dev.put(words);
        host_first = sl.first;
        n_blocks = static_cast<int64_t>(sl.first.size()) - 1;
        a.mma_partial = dev.put(std::vector<float>(sl.most_parts * n * kUnits * kHidden, 0.0f));
        a.mma_count = dev.put(std::vector<int32_t>(sl.runs, 0));
    } else {
        const MmaBlocks mb = mma_blocks(kUnits, ver.split ? mma_slots(n) : 0, [](int64_t) { return kHidden; },
                                        [&](int64_t u) { return L.x_off[u + 1] - L.x_off[u]; });
        host_blocks = mb.list;
        n_blocks = static_cast<int64_t>(host_blocks.size() / kMmaBlockInts);
        a.mma_partial = dev.put(std::vector<float>(mb.most_parts * n * kUnits * kHidden, 0.0f));
        a.mma_count = dev.put(std::vector<int32_t>(mb.groups, 0));
    }
    const int32_t* blocks = spans ? reinterpret_cast<const int32_t*>(spans) : dev.put(host_blocks);
    const int32_t* first = dev.put(host_first);
    ver.launch(a, blocks, first, n_blocks, n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    const auto h_got = to_host(a.h, h.size()), w_got = to_host(a.weights, L.n_w0), v_got = to_host(a.velocity, L.n_w0);
    std::vector<float> h_cur(h_got.begin() + cur * n * L.h_total, h_got.begin() + (cur + 1) * n * L.h_total);
    std::printf("n_seq %ld, %s\n", static_cast<long>(n), ver.name);
    bool ok = report_check("h(s) = phi(W0 x(s))", relative_error(h_cur, h_ref, h_mask), ver.tol);
    ok &= report_check("W0 after the update", relative_error(w_got, w_ref), ver.tol);
    ok &= report_check("V after the update", relative_error(v_got, v_ref), 10 * ver.tol);
    bool untouched = true;  // the hidden entries no row writes (bias slots) and other ring slots stay as poisoned
    for (int64_t i = 0; i < static_cast<int64_t>(h_got.size()); ++i) {
        const bool written = i / (n * L.h_total) == cur && h_mask[i % (n * L.h_total)];
        if (!written && h_got[i] != -7.0f) untouched = false;
    }
    std::printf("  %-28s %s\n", "nothing else written", untouched ? "ok" : "FAIL");
    ok &= untouched;

    if (std::getenv("PVM_WB_NOTIME")) return ok;  // (under compute-sanitizer)
    const double us = time_us([&] { ver.launch(a, blocks, first, n_blocks, n); }, 5, 50, flush_l2);  // W, V keep changing: fine for timing
    const double bytes = 16.0 * L.n_w0;
    std::printf("  %.1f us, weight traffic %.2f TB/s = %.0f%% of copy; %.1f us per sequence\n", us, bytes / us * 1e-6,
                100.0 * bytes / (us * 1e-6) / copy_bw, us / n);
    return ok;
}

}  // namespace

int main(int argc, char** argv) {
    const std::vector<int64_t> seqs = parse_seqs(argc, argv, {2, 4, 8, 13, 16, 32, 64}, 2, 64);
    const Layout L(inputs, outputs), tiled(inputs, outputs, true);
    const double copy_bw = copy_bandwidth(size_t{1} << 30);
    std::printf("W0: %ld weights (%.1f MB of W and V); copy bandwidth %.2f TB/s\n", static_cast<long>(L.n_w0),
                8.0 * L.n_w0 / 1e6, copy_bw / 1e12);
    bool ok = true;
    // TF32 pairs keep 22 of 24 bits.
    const Version mma{"weight_pass_mma (3xTF32), W0 tiled, long runs split (engine)", launch_mma_bucket, 2e-6, true, true},
        mma_rows{"weight_pass_mma, W0 in pitched rows, split", launch_mma_bucket<Precision::kFp32, RowW0>, 2e-6, true},
        mma_unit{"weight_pass_mma, W0 tiled, a block per unit", launch_mma_bucket, 2e-6, false, true},
        // The opt-in precision modes (issue 12 item 3): their errors against the double reference are the point;
        // the tolerances only catch a broken fragment layout (TF32 keeps 10 mantissa bits, BF16 7).
        mma_tf32{"weight_pass_mma, TF32 (one product)", launch_mma_bucket<Precision::kTf32>, 2e-3, true, true},
        mma_bf16{"weight_pass_mma, BF16 operands", launch_mma_bucket<Precision::kBf16>, 2e-2, true, true},
        span43{"w0_span_pass, 4 stages, 3 ahead (engine, 2-16)", launch_span_bucket<4, 3>, 2e-6, false, true, span_blocks<4, 3>},
        span42{"w0_span_pass, 4 stages, 2 ahead", launch_span_bucket<4, 2>, 2e-6, false, true, span_blocks<4, 2>},
        span54{"w0_span_pass, 5 stages, 4 ahead", launch_span_bucket<5, 4>, 2e-6, false, true, span_blocks<5, 4>},
        // The same two on x as rows of sources (the engine's x from 2 sequences).
        mma_src{"weight_pass_mma, W0 tiled, split, x from sources (engine)", launch_mma_bucket, 2e-6, true, true, nullptr, true},
        span_src{"w0_span_pass, 4 stages, 3 ahead, x from sources (engine)", launch_span_bucket<4, 3>, 2e-6, false, true,
                 span_blocks<4, 3>, true},
        span_wide{"w0_span_pass, engine shape, x from sources (17-64: one block a SM)", launch_span_any, 2e-6, false, true,
                  span_blocks_any, true};
    for (int64_t n : seqs) {
        ok &= check_and_time(L, tiled, n, copy_bw, mma);
        ok &= check_and_time(L, tiled, n, copy_bw, mma_rows);
        ok &= check_and_time(L, tiled, n, copy_bw, mma_unit);
        ok &= check_and_time(L, tiled, n, copy_bw, mma_tf32);
        ok &= check_and_time(L, tiled, n, copy_bw, mma_bf16);
        if (n <= kSpanMaxSeqs) {
            ok &= check_and_time(L, tiled, n, copy_bw, span43);
            ok &= check_and_time(L, tiled, n, copy_bw, span42);
            ok &= check_and_time(L, tiled, n, copy_bw, span54);
            ok &= check_and_time(L, tiled, n, copy_bw, mma_src);
            ok &= check_and_time(L, tiled, n, copy_bw, span_src);
        }
        if (n > kSpanMaxSeqs) {
            ok &= check_and_time(L, tiled, n, copy_bw, mma_src);
            ok &= check_and_time(L, tiled, n, copy_bw, span_wide);
        }
    }
    std::printf("%s\n", ok ? "all checks passed" : "SOME CHECKS FAILED");
    return ok ? 0 : 1;
}
