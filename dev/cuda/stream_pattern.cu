// Workbench: what memory pattern lets the W0 pass stream W and V at the copy rate? No engine kernel: the
// pass's traffic alone (W and V of small.json-like W0 rows read through cp.async stages into shared
// memory, a cheap momentum update there, written back with 16-byte stores; x(s), x(s-2) of 16 sequences
// staged beside them from L2), under several block shapes: R rows x C columns per chunk, S stages, and
// blocks per SM. "flat" stages the same R*C floats from one contiguous span of the run (as a tile-major
// device layout would hold them) instead of R row segments of C floats a row pitch apart.
// Reports the W/V traffic (16 bytes per weight) per second against a device-to-device copy and an
// in-place read-modify-write stream over the same bytes.
//   nvcc -std=c++17 -O3 -arch=sm_90a -I../../native/include -o /tmp/stream_pattern stream_pattern.cu && /tmp/stream_pattern
#include "../../native/src/step_kernels.cuh"
#include "common.h"

using namespace pvm::kernels;

namespace {

constexpr int kUnits = 265, kRows = 49, kNs = 16, kThreadsPB = 256;
int64_t inputs(int64_t u) { return u % 20 == 0 ? 2059 : 788 + (u * 37) % 638; }  // as weight_pass_mma.cu
int64_t pitch_of(int64_t u) { return (inputs(u) + 3) / 4 * 4; }

struct Rec {            // one block: a run of rows of one unit, chunks [c0, c1)
    int64_t base;       // float index of the run's first row
    int32_t rows, pitch, c0, c1;
    int64_t x_base;     // the unit's inputs: 2 * kNs rows of pitch floats
};

template <int R, int C>
__host__ __device__ constexpr int stage_floats() { return (2 * R + 2 * kNs) * (C + 4); }

template <int R, int C, int S, bool Flat>
__global__ void __launch_bounds__(kThreadsPB) stream(const Rec* recs, float* W, float* V, const float* X) {
    extern __shared__ __align__(16) float smem[];
    const Rec rec = recs[blockIdx.x];
    constexpr int Q = C / 4, Str = C + 4;
    const int rows = rec.rows, pitch = rec.pitch;
    const int64_t span = int64_t{rows} * pitch;  // the run's floats (flat: chunk i is [i*R*C, (i+1)*R*C))
    const auto src_of = [&](int i, int r, int q, bool& ok) -> int64_t {
        if constexpr (Flat) {
            const int64_t f = int64_t{i} * R * C + int64_t{r} * C + 4 * q;
            ok = f < span;
            return f;
        } else {
            const int col = C * i + 4 * q;
            ok = col < pitch;
            return int64_t{r} * pitch + col;
        }
    };
    const auto fetch = [&](int i) {
        if (i < rec.c1) {
            float* st = smem + (i % S) * stage_floats<R, C>();
            for (int e = threadIdx.x; e < rows * Q; e += kThreadsPB) {
                const int r = e / Q, q = e % Q;
                bool ok;
                const int64_t f = src_of(i, r, q, ok);
                copy_async16(st + r * Str + 4 * q, W + rec.base + (ok ? f : 0), ok);
                copy_async16(st + (R + r) * Str + 4 * q, V + rec.base + (ok ? f : 0), ok);
            }
            for (int e = threadIdx.x; e < 2 * kNs * Q; e += kThreadsPB) {
                const int r = e / Q, q = e % Q, col = C * i + 4 * q;
                const bool ok = col < pitch;
                copy_async16(st + (2 * R + r) * Str + 4 * q, X + rec.x_base + (ok ? int64_t{r} * pitch + col : 0), ok);
            }
        }
        copy_async_commit();
    };
    for (int i = 0; i < S - 1; ++i) fetch(rec.c0 + i);
    for (int i = rec.c0; i < rec.c1; ++i) {
        copy_async_wait<S - 2>();
        __syncthreads();
        fetch(i + S - 1);
        float* st = smem + (i % S) * stage_floats<R, C>();
        for (int e = threadIdx.x; e < rows * Q; e += kThreadsPB) {
            const int r = e / Q, q = e % Q;
            float4* w = reinterpret_cast<float4*>(st + r * Str + 4 * q);
            float4* v = reinterpret_cast<float4*>(st + (R + r) * Str + 4 * q);
            const float4 x = *reinterpret_cast<const float4*>(st + (2 * R + kNs + r % kNs) * Str + 4 * q);
            float4 vn = *v, wn = *w;
            vn.x = 0.9f * vn.x + 1e-3f * x.x; vn.y = 0.9f * vn.y + 1e-3f * x.y;
            vn.z = 0.9f * vn.z + 1e-3f * x.z; vn.w = 0.9f * vn.w + 1e-3f * x.w;
            wn.x += vn.x; wn.y += vn.y; wn.z += vn.z; wn.w += vn.w;
            *v = vn;
            *w = wn;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < rows * Q; e += kThreadsPB) {
            const int r = e / Q, q = e % Q;
            bool ok;
            const int64_t f = src_of(i, r, q, ok);
            if (!ok) continue;
            store16(W + rec.base + f, *reinterpret_cast<const float4*>(st + r * Str + 4 * q));
            store16(V + rec.base + f, *reinterpret_cast<const float4*>(st + (R + r) * Str + 4 * q));
        }
    }
}

// The same bytes as one in-place read-modify-write stream (grid-stride float4 over W and V).
__global__ void rmw(float4* W, float4* V, int64_t n4) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n4; i += int64_t{gridDim.x} * blockDim.x) {
        float4 v = V[i], w = W[i];
        v.x *= 0.9f; v.y *= 0.9f; v.z *= 0.9f; v.w *= 0.9f;
        w.x += v.x; w.y += v.y; w.z += v.z; w.w += v.w;
        V[i] = v;
        W[i] = w;
    }
}

struct Case {
    const char* name;
    double us;
    int per_sm;
};

// Blocks for runs of at most R rows, chunk lists split so that no block has more than the mean load of
// `slots` (as mma_blocks does), longest first.
template <int R, int C>
std::vector<Rec> records(const std::vector<int64_t>& row_base, const std::vector<int64_t>& x_base, int64_t slots, bool flat) {
    struct Run { int64_t base; int rows, pitch, chunks; int64_t xb; };
    std::vector<Run> runs;
    int64_t total = 0;
    for (int u = 0; u < kUnits; ++u) {
        const int n_runs = (kRows + R - 1) / R, p = static_cast<int>(pitch_of(u));
        for (int k = 0; k < n_runs; ++k) {
            const int r0 = k * kRows / n_runs, r1 = (k + 1) * kRows / n_runs;
            const int64_t floats = int64_t{r1 - r0} * p;
            const int chunks = static_cast<int>(flat ? (floats + R * C - 1) / (R * C) : (p + C - 1) / C);
            runs.push_back({row_base[u] + int64_t{r0} * p, r1 - r0, p, chunks, x_base[u]});
            total += chunks;
        }
    }
    const int64_t most = std::max<int64_t>(1, (total + slots - 1) / slots);
    std::vector<std::pair<int, Rec>> out;
    for (const Run& r : runs) {
        const int parts = static_cast<int>((r.chunks + most - 1) / most);
        for (int p = 0; p < parts; ++p) {
            const int c0 = p * r.chunks / parts, c1 = (p + 1) * r.chunks / parts;
            out.push_back({c1 - c0, Rec{r.base, r.rows, r.pitch, c0, c1, r.xb}});
        }
    }
    std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<Rec> recs;
    for (const auto& o : out) recs.push_back(o.second);
    return recs;
}

template <int R, int C, int S, bool Flat>
Case run_case(const char* name, int per_sm_wanted, float* W, float* V, const float* X, const std::vector<int64_t>& rb,
              const std::vector<int64_t>& xb, int sms) {
    const auto kernel = stream<R, C, S, Flat>;
    const size_t need = sizeof(float) * S * stage_floats<R, C>();
    const size_t bytes = std::max(need, size_t{227 * 1024} / per_sm_wanted - 1024);
    const int per_sm = resident_per_sm(kernel, kThreadsPB, bytes);
    const std::vector<Rec> recs = records<R, C>(rb, xb, int64_t{std::max(per_sm, 2)} * sms, Flat);
    Rec* d = to_device(recs);
    const double us = time_us([&] { kernel<<<static_cast<unsigned>(recs.size()), kThreadsPB, bytes>>>(d, W, V, X); }, 3, 30,
                              flush_l2);
    CHECK(cudaFree(d));
    return {name, us, per_sm};
}

}  // namespace

int main() {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    std::vector<int64_t> rb(kUnits), xb(kUnits);
    int64_t n = 0, nx = 0, weights = 0;
    for (int u = 0; u < kUnits; ++u) {
        rb[u] = n;
        xb[u] = nx;
        n += kRows * pitch_of(u);
        nx += 2 * kNs * pitch_of(u);
        weights += kRows * inputs(u);
    }
    std::vector<float> w(n), x(nx);
    fill_uniform(w, -0.1f, 0.1f, 1);
    fill_uniform(x, 0.0f, 1.0f, 2);
    DeviceScope scope;
    float* W = scope.put(w);
    float* V = scope.put(w);
    float* X = scope.put(x);
    const double traffic = 16.0 * weights;  // W, V read and written
    const double copy = copy_bandwidth(size_t(8) * n);
    const double rmw_us = time_us([&] { rmw<<<4 * sms, 512>>>(reinterpret_cast<float4*>(W), reinterpret_cast<float4*>(V), n / 4); },
                                  3, 30, flush_l2);
    std::printf("small-like W0: %lld weights, %.1f MB of W/V traffic; copy %.2f TB/s; in-place stream %.1f us (%.2f TB/s)\n",
                static_cast<long long>(weights), traffic / 1e6, copy / 1e12, rmw_us, 16.0 * n / rmw_us / 1e6);
    std::vector<Case> cases = {
        run_case<64, 32, 3, false>("R64 C32 S3 (the pass)", 2, W, V, X, rb, xb, sms),
        run_case<64, 32, 3, true>("R64 C32 S3 flat", 2, W, V, X, rb, xb, sms),
        run_case<64, 32, 4, false>("R64 C32 S4", 2, W, V, X, rb, xb, sms),
        run_case<64, 64, 2, false>("R64 C64 S2", 2, W, V, X, rb, xb, sms),
        run_case<64, 64, 3, false>("R64 C64 S3", 1, W, V, X, rb, xb, sms),
        run_case<64, 64, 2, true>("R64 C64 S2 flat", 2, W, V, X, rb, xb, sms),
        run_case<64, 128, 2, false>("R64 C128 S2", 1, W, V, X, rb, xb, sms),
        run_case<32, 64, 3, false>("R32 C64 S3", 2, W, V, X, rb, xb, sms),
        run_case<32, 128, 2, false>("R32 C128 S2", 2, W, V, X, rb, xb, sms),
        run_case<16, 128, 3, false>("R16 C128 S3", 2, W, V, X, rb, xb, sms),
        run_case<16, 256, 2, false>("R16 C256 S2", 2, W, V, X, rb, xb, sms),
        run_case<64, 32, 3, false>("R64 C32 S3, 1/SM", 1, W, V, X, rb, xb, sms),
        run_case<64, 32, 3, true>("R64 C32 S3 flat, 1/SM", 1, W, V, X, rb, xb, sms),
    };
    for (const Case& c : cases)
        std::printf("  %-26s %d/SM %8.1f us  %5.2f TB/s  %5.1f%% of copy\n", c.name, c.per_sm, c.us, traffic / c.us / 1e6,
                    100.0 * traffic / (c.us * 1e-6) / copy);
    return 0;
}
