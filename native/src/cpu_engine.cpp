// One training step on the CPU, in the order of pvm-algorithm.md §3.3:
// assemble x(s) -> forward h(s), y(s) -> error of y(s-2) against x(s) -> W1^T delta -> update W0, W1.
#include "pvm/cpu_engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "pvm/numerics.h"

namespace pvm {

namespace {
constexpr int kRing = 3;
// Below this many weight·sequence products a step is too small to share: OpenMP barriers would cost
// more than the work (and stall badly when the cores are busy with something else).
constexpr int64_t kParallelWork = int64_t{1} << 20;
int slot(int64_t step) { return static_cast<int>(((step % kRing) + kRing) % kRing); }
}  // namespace

CpuEngine::CpuEngine(Topology topo, EngineConfig cfg) : Engine(std::move(topo), cfg) {
    const int64_t n = cfg_.n_seq;
    weights_.assign(topo_.n_weights, 0.0f);
    velocity_.assign(topo_.n_weights, 0.0f);
    // Rings start all ones (§3.2): bias entries stay 1 and the first two updates see ones.
    x_.assign(kRing * n * topo_.x_total, 1.0f);
    h_.assign(kRing * n * topo_.h_total, 1.0f);
    y_.assign(kRing * n * topo_.y_total, 1.0f);
    unit_lr_.assign(topo_.n_units, 0.0f);
    unit_mu_.assign(topo_.n_units, 0.0f);
    delta_out_.assign(n * topo_.y_total, 0.0f);
    metrics_.errors.assign(topo_.metric_bins(), 0.0);
}

void CpuEngine::step_u8(const uint8_t* frames) { step(frames); }
void CpuEngine::step_f32(const float* frames) { step(frames); }

template <class Pixel>
void CpuEngine::step(const Pixel* frames) {
    const int cur = slot(step_), prev = slot(step_ - 1), old = slot(step_ - 2);
    assemble_inputs(frames, cur, prev);
    forward(cur);
    learn(cur, old);
    ++step_;
}

template <class Pixel>
void CpuEngine::assemble_inputs(const Pixel* frames, int cur, int prev) {
    const Topology& T = topo_;
    for (int64_t s = 0; s < cfg_.n_seq; ++s) {
        const Pixel* frame = frames + s * T.image_size;
        float* xc = x(cur, s);
        const float* xp = x(prev, s);
        const float* hp = h(prev, s);
        for (int64_t i = 0; i < T.x_total; ++i) {
            const int64_t src = T.x_src[i];
            switch (T.x_kind[i]) {
                case FromFrame: xc[i] = compress_pixel(frame[src]); break;
                case FromHidden: xc[i] = kappa(hp[src]); break;
                case FromPrevious: xc[i] = xp[src]; break;
                default: xc[i] = 1.0f; break;
            }
        }
        float* hc = h(cur, s);
        for (int64_t b : T.h_bias) hc[b] = 1.0f;
        for (size_t i = 0; i < T.raw_context_dst.size(); ++i) hc[T.raw_context_dst[i]] = hp[T.raw_context_src[i]];
    }
}

void CpuEngine::forward(int cur) {
    const Topology& T = topo_;
    const int64_t H = T.hidden;
    const bool poly = cfg_.polynomial;
    const bool parallel = T.n_weights * cfg_.n_seq >= kParallelWork;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
    for (int64_t u = 0; u < T.n_units; ++u) {
        const int64_t nin = T.inputs(u), K = T.hidden_len(u), M = T.outputs(u);
        const float* W0 = weights_.data() + T.w0_off[u];
        const float* W1 = weights_.data() + T.w1_off[u];
        for (int64_t s = 0; s < cfg_.n_seq; ++s) {
            const float* xu = x(cur, s) + T.x_off[u];
            float* hu = h(cur, s) + T.h_off[u];
            for (int64_t k = 0; k < H; ++k) {
                double acc = 0.0;  // float32 products, summed in double in index order
                const float* row = W0 + k * nin;
                for (int64_t i = 0; i < nin; ++i) acc += static_cast<double>(row[i] * xu[i]);
                hu[k] = activation(static_cast<float>(acc), poly);
            }
            float* yu = y(cur, s) + T.y_off[u];
            for (int64_t j = 0; j < M; ++j) {
                double acc = 0.0;
                const float* row = W1 + j * K;
                for (int64_t c = 0; c < K; ++c) acc += static_cast<double>(row[c] * hu[c]);
                yu[j] = activation(static_cast<float>(acc), poly);
            }
        }
    }
}

void CpuEngine::learn(int cur, int old) {
    const Topology& T = topo_;
    const int64_t n = cfg_.n_seq, H = T.hidden;
    const bool poly = cfg_.polynomial;
    const auto mode = static_cast<Derivative>(cfg_.derivative);
    const bool measure = step_ >= 2;  // steps 0 and 1 compare against the initial all-ones rings
    for (int64_t s = 0; s < n; ++s) {
        const float* xc = x(cur, s);
        const float* yo = y(old, s);
        float* d = delta_out_.data() + s * T.y_total;
        const float* xo = x(old, s);
        for (int64_t j = 0; j < T.y_total; ++j) {
            const float t = xc[T.target_src[j]];
            float e = t - yo[j];
            if (measure) {
                metrics_.errors[T.y_bin[j]] += static_cast<double>(e) * static_cast<double>(e);
                if (T.baseline_src[j] >= 0) {  // layer 0: copying frame s-2, the difference in double
                    const double b = static_cast<double>(t) - static_cast<double>(xo[T.baseline_src[j]]);
                    metrics_.baseline[T.y_bin[j]] += b * b;
                }
            }
            // §3.11 bug kept: the sign covers only the first n_units entries of the error array.
            if (cfg_.opt_abs_diff && j < T.n_units) e = static_cast<float>((e > 0.0f) - (e < 0.0f));
            d[j] = delta(yo[j], e, poly, mode);
        }
    }
    if (measure) ++metrics_.steps;

    const bool parallel = T.n_weights * n >= kParallelWork;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
    for (int64_t u = 0; u < T.n_units; ++u) {
        const float lr = unit_lr_[u], mu = unit_mu_[u];
        const int64_t nin = T.inputs(u), K = T.hidden_len(u), M = T.outputs(u);
        float* W0 = weights_.data() + T.w0_off[u];
        float* V0 = velocity_.data() + T.w0_off[u];
        float* W1 = weights_.data() + T.w1_off[u];
        float* V1 = velocity_.data() + T.w1_off[u];
        if (lr == 0.0f && mu == 0.0f) {  // a unit not yet enabled: its update is zero
            std::fill(V0, V0 + H * nin, 0.0f);
            std::fill(V1, V1 + M * K, 0.0f);
            continue;
        }
        // Hidden deltas of every sequence, from the current (pre-update) W1: eps_k = sum_j W1[j,k] d_j,
        // a float32 sum over j in order, as the original kernel.
        std::vector<float> dh(n * H), lr_do(n * M), lr_dh(n * H);
        for (int64_t s = 0; s < n; ++s) {
            const float* d = delta_out_.data() + s * T.y_total + T.y_off[u];
            const float* ho = h(old, s) + T.h_off[u];
            for (int64_t k = 0; k < H; ++k) {
                float eps = 0.0f;
                for (int64_t j = 0; j < M; ++j) eps += W1[j * K + k] * d[j];
                dh[s * H + k] = delta(ho[k], eps, poly, mode);
                lr_dh[s * H + k] = lr * dh[s * H + k];
            }
            for (int64_t j = 0; j < M; ++j) lr_do[s * M + j] = lr * d[j];
        }
        // g = mean over sequences of fl32(fl32(lr*delta) * a): float64 sum in sequence order, then / n.
        auto mean_product = [n](const float* lr_delta, int64_t stride, const float* const* acts, int64_t col) {
            if (n == 1) return update_product(lr_delta[0], acts[0][col]);
            double sum = 0.0;
            for (int64_t s = 0; s < n; ++s) sum += static_cast<double>(update_product(lr_delta[s * stride], acts[s][col]));
            return static_cast<float>(sum / static_cast<double>(n));
        };
        std::vector<const float*> h_old(n), x_old(n);
        for (int64_t s = 0; s < n; ++s) {
            h_old[s] = h(old, s) + T.h_off[u];
            x_old[s] = x(old, s) + T.x_off[u];
        }
        for (int64_t j = 0; j < M; ++j)
            for (int64_t c = 0; c < K; ++c)
                momentum_step(W1[j * K + c], V1[j * K + c], mu, mean_product(lr_do.data() + j, M, h_old.data(), c));
        for (int64_t k = 0; k < H; ++k)
            for (int64_t i = 0; i < nin; ++i)
                momentum_step(W0[k * nin + i], V0[k * nin + i], mu, mean_product(lr_dh.data() + k, H, x_old.data(), i));
    }
}

std::vector<std::pair<std::string, double>> CpuEngine::profile_step_u8(const uint8_t* frames) {
    using clock = std::chrono::steady_clock;
    auto ms = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    const int cur = slot(step_), prev = slot(step_ - 1), old = slot(step_ - 2);
    const auto t0 = clock::now();
    assemble_inputs(frames, cur, prev);
    const auto t1 = clock::now();
    forward(cur);
    const auto t2 = clock::now();
    learn(cur, old);
    const auto t3 = clock::now();
    ++step_;
    return {{"gather", ms(t0, t1)}, {"forward", ms(t1, t2)}, {"backward+update", ms(t2, t3)}};
}

MetricSums CpuEngine::take_metric_sums() {
    MetricSums out = metrics_;
    std::fill(metrics_.errors.begin(), metrics_.errors.end(), 0.0);
    metrics_.baseline = {};
    metrics_.steps = 0;
    return out;
}

std::vector<float>& CpuEngine::buffer(const std::string& name) {
    return select_buffer(name, weights_, velocity_, x_, h_, y_, unit_lr_, unit_mu_);
}

void CpuEngine::read(const std::string& name, float* out) {
    const auto& b = buffer(name);
    std::memcpy(out, b.data(), b.size() * sizeof(float));
}

void CpuEngine::write(const std::string& name, const float* in) {
    auto& b = buffer(name);
    std::memcpy(b.data(), in, b.size() * sizeof(float));
}

}  // namespace pvm
