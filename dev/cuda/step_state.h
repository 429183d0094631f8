// One step of a small.json-like layer stack for the workbenches: the units' offsets as the CUDA engine
// lays them out (265 units of 49 hidden rows, W0's rows pitched to 4 floats or in column tiles, W1's blocks after W0's), the rings, deltas and rates of
// one step from fixed seeds (some units not yet learning), and the StepArgs that point at device copies.
// The x ring comes two ways: materialised (the passes') or as rows of sources with an index (the products'
// above 64 sequences, CudaEngine's input_layout): 5/6 of a unit's inputs copy runs of 50 hidden entries of
// other units, the rest have places of their own.
#pragma once

#include <array>
#include <functional>
#include <type_traits>

#include "common.h"
#include "../../native/src/step_kernels.cuh"

constexpr int64_t kUnits = 265, kHidden = 49;

struct Layout {
    std::vector<int64_t> x_off{0}, y_off{0}, h_off{0}, w0_off{0}, w1_off;
    std::vector<int32_t> y_unit;  // per output, its unit
    int64_t x_total = 0, y_total = 0, h_total = 0, n_w0 = 0, n_weights = 0;
    int64_t x_stride = 0;          // floats per row of sources
    std::vector<int32_t> x_index;  // per input entry: its place in a row of sources
    bool w0_tiled = false;  // W0 in column tiles (as the engine holds it for 5 to 64 sequences), else pitched rows
    // Entry i of row k of unit u's W0 in the engine's device layout (pvm::kernels::w0_at; the padding zero).
    int64_t w0_at(int64_t u, int64_t k, int64_t i) const {
        return w0_off[u] + pvm::kernels::w0_at(k, i, x_off[u + 1] - x_off[u], kHidden, w0_tiled);
    }
    // inputs(u), outputs(u): unit u's counts of input and output entries.
    template <class Inputs, class Outputs>
    Layout(Inputs inputs, Outputs outputs, bool tiled = false) : w0_tiled(tiled) {
        for (int64_t u = 0; u < kUnits; ++u) {
            x_off.push_back(x_off.back() + inputs(u));
            y_off.push_back(y_off.back() + outputs(u));
            h_off.push_back(h_off.back() + kHidden + 1);
            w0_off.push_back(w0_off.back() + kHidden * pvm::kernels::w0_row_floats(inputs(u), tiled));
            for (int64_t j = 0; j < outputs(u); ++j) y_unit.push_back(static_cast<int32_t>(u));
        }
        x_total = x_off.back();
        y_total = y_off.back();
        h_total = h_off.back();
        n_w0 = w0_off.back();
        w1_off.push_back(n_w0);
        for (int64_t u = 0; u < kUnits; ++u) w1_off.push_back(w1_off.back() + (y_off[u + 1] - y_off[u]) * (kHidden + 1));
        n_weights = w1_off.back();
        int64_t own = h_total;
        for (int64_t u = 0; u < kUnits; ++u)
            for (int64_t c = 0; c < inputs(u); ++c)
                x_index.push_back(static_cast<int32_t>(c < inputs(u) * 5 / 6 ? ((u * 7 + c / 50) % kUnits) * (kHidden + 1) + c % 50 : own++));
        x_stride = (own + 3) / 4 * 4;
    }
};

// (unit, first m, first n) tiles of rows x cols over every unit's M x N output (mnk(u) = {M, N, K}), as product_tiles
// in cuda_engine.cu lists them: the longest sums (K) first.
inline std::vector<int32_t> tiles(int rows, int cols, const std::function<std::array<int64_t, 3>(int64_t)>& mnk) {
    std::vector<std::array<int64_t, 4>> t;
    for (int64_t u = 0; u < kUnits; ++u) {
        const auto [M, N, K] = mnk(u);
        for (int64_t m0 = 0; m0 < M; m0 += rows)
            for (int64_t n0 = 0; n0 < N; n0 += cols) t.push_back({K, u, m0, n0});
    }
    std::stable_sort(t.begin(), t.end(), [](const auto& x, const auto& y) { return x[0] > y[0]; });
    std::vector<int32_t> out;
    for (const auto& e : t) out.insert(out.end(), {static_cast<int32_t>(e[1]), static_cast<int32_t>(e[2]), static_cast<int32_t>(e[3])});
    return out;
}

// Calls f(std::integral_constant<int, NS>) for the tensor-core passes' sequence bucket NS >= n (the workbenches':
// 8, 16, 32, 64).
template <class F>
auto by_mma_bucket(int64_t n, F&& f) {
    if (n <= 8) return f(std::integral_constant<int, 8>{});
    if (n <= 16) return f(std::integral_constant<int, 16>{});
    if (n <= 32) return f(std::integral_constant<int, 32>{});
    return f(std::integral_constant<int, 64>{});
}

// The host state of one step of n sequences; each run uploads fresh copies, so that every update
// starts from the same W and V.
struct State {
    std::vector<float> w, v, x, xs, h, y, d, ldh, lr, mu;
    State(const Layout& L, int64_t n)
        : w(L.n_weights), v(L.n_weights), x(pvm::kernels::kRing * n * L.x_total), xs(pvm::kernels::kRing * n * L.x_stride),
          h(pvm::kernels::kRing * n * L.h_total),
          y(pvm::kernels::kRing * n * L.y_total, -7.0f), d(n * L.y_total), ldh(n * L.h_total), lr(kUnits), mu(kUnits) {
        fill_uniform(w, -0.1f, 0.1f, 1);
        fill_uniform(v, -0.01f, 0.01f, 2);
        fill_uniform(x, 0.1f, 0.9f, 3);
        fill_uniform(xs, 0.1f, 0.9f, 8);
        fill_uniform(h, 0.1f, 0.9f, 4);
        fill_uniform(d, -0.05f, 0.05f, 5);
        fill_uniform(ldh, -0.01f, 0.01f, 6);
        fill_uniform(mu, 0.05f, 0.15f, 7);
        for (int64_t u = 0; u < kUnits; ++u) lr[u] = u % 17 == 0 ? 0.0f : 0.002f;  // some units not yet learning
        for (int64_t u = 0; u < kUnits; u += 17) mu[u] = 0.0f;
        for (int64_t u = 0; u < kUnits; ++u)  // W0's padding holds zeros, as in the engine
            for (int64_t k = 0; k < kHidden; ++k)
                for (int64_t i = L.x_off[u + 1] - L.x_off[u]; i < pvm::kernels::w0_row_floats(L.x_off[u + 1] - L.x_off[u], L.w0_tiled); ++i)
                    w[L.w0_at(u, k, i)] = v[L.w0_at(u, k, i)] = 0.0f;
    }
};

// The step's arguments over device copies of L and S (polynomial activation, original derivative); with
// sources, the x ring as rows of sources (S.xs, L.x_index), else materialised (S.x).
inline pvm::kernels::StepArgs upload(DeviceScope& dev, const Layout& L, const State& S, int64_t n, int64_t step,
                                     bool sources = false) {
    pvm::kernels::StepArgs a{};
    a.n_seq = n;
    a.n_units = kUnits;
    a.hidden = kHidden;
    a.x_stride = sources ? L.x_stride : L.x_total;
    a.y_total = L.y_total;
    a.h_total = L.h_total;
    a.polynomial = true;
    a.derivative = 0;
    a.x_off = dev.put(L.x_off);
    a.y_off = dev.put(L.y_off);
    a.h_off = dev.put(L.h_off);
    a.w0_off = dev.put(L.w0_off);
    a.w1_off = dev.put(L.w1_off);
    a.y_unit = dev.put(L.y_unit);
    // W, V, x and h with 4 floats of slack past them, as the engine allocates them (the window copies).
    const auto slack = [](std::vector<float> v) {
        v.resize(v.size() + 4, 0.0f);
        return v;
    };
    a.weights = dev.put(slack(S.w));
    a.velocity = dev.put(slack(S.v));
    a.x = dev.put(slack(sources ? S.xs : S.x));
    if (sources) a.x_index = dev.put(L.x_index);
    a.h = dev.put(slack(S.h));
    a.y = dev.put(S.y);
    a.delta_out = dev.put(slack(S.d));
    a.lr_delta_hidden = dev.put(S.ldh);
    a.unit_lr = dev.put(S.lr);
    a.unit_mu = dev.put(S.mu);
    a.step = dev.put(std::vector<int64_t>{step});
    return a;
}
