#include "pvm/cuda_engine.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <utility>

#include "pvm/cuda_check.h"
#include "pvm/cuda_graph.h"
#include "dependent_launch.cuh"
#include "hidden_deltas_few.cuh"
#include "hidden_deltas_split.cuh"
#include "mma_pass.cuh"
#include "mma_products.cuh"
#include "short_rows_pass.cuh"
#include "step_kernels.cuh"
#include "unit_products.cuh"
#include "w0_span_pass.cuh"
#include "w1_stream_pass.cuh"
#include "wgmma_product.cuh"

namespace pvm {

namespace {

int blocks_for(int64_t n, int threads = kernels::kThreads) {
    return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, 1 << 20)));
}

// How a step's work is split by n_seq (benchmarks/NOTES.md has the measurements behind each bound):
// - W0 and W1 passes: one sequence a row pass (weight_pass_single; W1 streamed on sm_90, below); from kMmaMinSeqs
//   to kMmaMaxSeqs one pass on tensor cores (weight_pass_mma or w0_span_pass, one read of W and V per step for all
//   sequences; with the x ring holding the step's sources, kBuiltInputsMinSeqs); above, forward and update as
//   separate per-unit products on tensor cores (mma_product; the updates up to kFmaUpdateMaxSeqs on FMAs,
//   fma_product). When the tensor-core pass was first written it won from 5 sequences over a fused FMA pass
//   (weight_pass_multi; H200, small: 23.2k, 26.7k, 30.6k, 34.2k frames/s at 5-8 against 22.3k, 25.3k, 28.7k, 31.5k;
//   a tie at 4); with its span pass and the sources ring it won from 2, and
//   the FMA pass went (frames/s against it at 3 / 4 sequences, H200: small +5.6 / +7.8%, med +8.8 / +10.7%, LARGE
//   +10.4 / +11.6%, LARGE's gather 26.8 -> 10.2 us and W0 phase 477 -> 426 us; at 2, H100: small +3.4%, med +5.2%,
//   LARGE +5.4%). The W1 pass ends earlier, at kMmaW1MaxSeqs: with 33-64 sequences its 50-float rows leave the
//   pass at one block per SM (153 us at 64 against 98 us for the two W1 products), while the W0 pass still beats
//   its products (287 against 395 us at 64). From 2 to kMmaW1MaxSeqs sequences W1's rows of up to kShortMaxLen
//   entries go in 64-row tiles instead (weight_pass_short; feed-context rows are longer and keep the passes above),
//   and at 1-2 on sm_90 they are streamed through resident blocks (w1_stream_pass).
// - Hidden deltas: up to 4 sequences the per-unit kernel hidden_deltas<NS, threads, row groups>; from kHiddenProductSeqs on tensor
//   cores (H100, small, frames/s against hidden_deltas<8>: 5 +0.4%, 6 +1.1%, 8 +3.4%; med 8 +7.4%, LARGE 8
//   +6.6%; at 3 and 4 the product lost 7-8%): up to kSplitMaxSeqs sequences a block per unit with its sum split
//   between the warps (hidden_deltas_split, where W1's rows are short), else a per-unit product. The squared
//   errors are summed per output by output_deltas, per unit and layer only when the metrics are taken
//   (take_metric_sums).
constexpr int64_t kMmaMinSeqs = 2, kMmaMaxSeqs = 64, kMmaW1MaxSeqs = 32, kProductSeqs = 9, kHiddenProductSeqs = 5;
// The hidden deltas' split sums up to this many sequences (H100, small, bench against the product: 5 +12.3%,
// 8 +11.0%, 16 +4.1%, 32 -1.6%; workbench at 32: 34.0 against 30.9 us).
constexpr int64_t kSplitMaxSeqs = 16;
// Chained launches up to this many sequences (PVM_CUDA_CHAIN=0: none, =all: at every n_seq). H100, engine A/B
// (PVM_CUDA_CHAIN=all against the default of then, chained below 9), frames/s: small 9 / 12 / 16 / 24 +2.6 / +2.9 /
// +2.5 / -2.6%, med +1.7 / +1.7 / +1.6 / +1.4%, LARGE +0.8 / +0.6 / +0.7 / -0.3%; 32 small -2.0%, med +0.8%; 64, 256
// and 1,024 -6 to -11% on both (the phases, timed unchained, are equal in both arms: presumably the chained kernels'
// early blocks hold SM slots the running pass's tail wants; not profiled). Decided in 2026-11 at 16-64 (-1%) on the
// kernels of then.
constexpr int64_t kChainMaxSeqs = 16;
constexpr int64_t kFmaMinSeqs = 33;  // PVM_CUDA_FMA (an experiment): W1's products on FMAs from here
// The updates run on FMAs (default precision) up to this many sequences: the W1 update from kMmaW1MaxSeqs + 1
// (W1Update::FmaTilesFew up to kMmaMaxSeqs, FmaTilesMid above), the W0 update from kMmaMaxSeqs + 1
// (W0Update::FmaTilesMid; below, the W0 pass); the tensor cores' tiles above.
constexpr int64_t kFmaUpdateMaxSeqs = 128;
// From this many sequences (every weight_pass_mma bucket and the products) the x ring holds each step's sources
// (input_layout): the pass and the products read their inputs with 4-byte copies, which can gather them.
constexpr int64_t kBuiltInputsMinSeqs = kMmaMinSeqs;
// Floats allocated past W, V and delta_out for the window copies (wgmma_product's WindowCopies and
// RowWindowCopies read up to 3 past a row): the hidden deltas' copies of W1 and delta_out, and the updates'
// L2 prefetch of W and V, which rounds a row's end up to 16 bytes (prefetch_l2). x and h have none since
// weight_pass_mma lost its windows and x is gathered (compute-sanitizer's memcheck found no read past them).
constexpr int64_t kWindowSlack = 4;
constexpr int kW1Lanes = 8;  // lanes per W1 row (rows of H+1 = 50 floats) in the row passes

// Calls f(std::integral_constant<int, NS>) for hidden_deltas' compile-time sequence bucket NS >= n
// (n < kHiddenProductSeqs).
template <class F>
void by_bucket(int64_t n, F&& f) {
    static_assert(kHiddenProductSeqs == 5, "the buckets end at 4");
    if (n <= 1) return f(std::integral_constant<int, 1>{});
    if (n <= 2) return f(std::integral_constant<int, 2>{});
    return f(std::integral_constant<int, 4>{});
}

// A source and its kind in one int32 (assemble_inputs reads 4 bytes an entry, not 9).
int32_t pack_source(int64_t src, int kind) {
    return static_cast<int32_t>(static_cast<uint32_t>(src) | (static_cast<uint32_t>(kind) << kernels::kGatherKindShift));
}

// What a row of the x ring holds (one sequence, one step) and what assemble_inputs writes into it.
// Materialised (one sequence, where the row pass reads x's rows whole): the inputs, entry i at i.
// Built (from kBuiltInputsMinSeqs; CudaEngine::built_inputs): the step's sources, kappa(h(s-1)) once per
// hidden entry in h's layout, then the other inputs (frame pixels, x(s-1)'s signal, 1s) in input order;
// index places every input in that row, and W0's pass (up to 64 sequences) and products (above) gather
// their inputs through it. Why: 84% of small's inputs are copies of a hidden value
// (each copied to about 18 inputs), so the row is 5x shorter than x, and the gather's write and W0's two
// reads of it (about 45% of a step at 256 sequences) shrink with it; the row of 256 sequences (60 MB for
// small) stays mostly in L2.
struct InputLayout {
    int64_t stride = 0;            // floats per row
    std::vector<int32_t> index;    // built: per input entry, its place in the row
    std::vector<int32_t> gather;   // per row entry: source | kind << kGatherKindShift
};

InputLayout input_layout(const Topology& t, bool built) {
    const int64_t limit = int64_t{1} << kernels::kGatherKindShift;
    for (size_t i = 0; i < t.x_src.size(); ++i)
        if (t.x_src[i] < 0 || t.x_src[i] >= limit || t.x_kind[i] < 0 || t.x_kind[i] > 3 ||
            (t.x_kind[i] == FromHidden && t.x_src[i] >= t.h_total) || (t.x_kind[i] == FromPrevious && t.x_src[i] >= t.x_total))
            throw std::invalid_argument("input entry " + std::to_string(i) + " has a source the CUDA engine cannot hold");
    InputLayout out;
    if (!built) {
        out.stride = t.x_total;
        for (int64_t i = 0; i < t.x_total; ++i) out.gather.push_back(pack_source(t.x_src[i], t.x_kind[i]));
        return out;
    }
    out.index.resize(t.x_total);
    int64_t next = t.h_total;
    for (int64_t i = 0; i < t.x_total; ++i) out.index[i] = static_cast<int32_t>(t.x_kind[i] == FromHidden ? t.x_src[i] : next++);
    out.stride = (next + 3) / 4 * 4;  // rows of whole 16-byte words
    if (out.stride >= limit) throw std::invalid_argument("the model's inputs are too many for the CUDA engine's gather");
    out.gather.assign(out.stride, pack_source(0, Bias));
    for (int64_t j = 0; j < t.h_total; ++j) out.gather[j] = pack_source(j, FromHidden);
    for (int64_t i = 0; i < t.x_total; ++i)
        if (t.x_kind[i] != FromHidden)
            out.gather[out.index[i]] = pack_source(t.x_kind[i] == FromPrevious ? out.index[t.x_src[i]] : t.x_src[i], t.x_kind[i]);
    return out;
}

// Input entries' places in a row of the x ring (InputLayout::index; none: materialised); -1 stays.
std::vector<int64_t> placed(std::vector<int64_t> entries, const std::vector<int32_t>& index) {
    if (!index.empty())
        for (int64_t& e : entries)
            if (e >= 0) e = index[e];
    return entries;
}

// What a step enqueues between phases when it is not being profiled.
struct NoMark {
    void operator()(const char*) const {}
};

void launch_output_deltas(const kernels::StepArgs& a, const kernels::StepLaunch& launch) {
    const dim3 grid(blocks_for(a.y_total), static_cast<unsigned>(kernels::delta_groups(a.n_seq, a.delta_group)));
    PVM_CUDA_CHECK(launch(kernels::output_deltas, grid, kernels::kThreads, 0, a));
}

// The tensor-core pass (kMmaMinSeqs <= n <= 64 sequences) in the bucket of 8, 16, 32, 48 or 64 sequences:
// f(std::integral_constant<int, NS>).
template <class F>
void by_mma_bucket(int64_t n, F&& f) {
    if (n <= 8) return f(std::integral_constant<int, 8>{});
    if (n <= 16) return f(std::integral_constant<int, 16>{});
    if (n <= 32) return f(std::integral_constant<int, 32>{});
    if (n <= 48) return f(std::integral_constant<int, 48>{});
    return f(std::integral_constant<int, 64>{});
}

// The engine's tensor-core precision (EngineConfig::precision) as a compile-time value: f(std::integral_constant<Precision, P>).
template <class F>
void by_precision(int precision, F&& f) {
    switch (static_cast<Precision>(precision)) {
        case Precision::kTf32: return f(std::integral_constant<Precision, Precision::kTf32>{});
        case Precision::kBf16: return f(std::integral_constant<Precision, Precision::kBf16>{});
        default: return f(std::integral_constant<Precision, Precision::kFp32>{});
    }
}

// Lets the pass of n sequences have its dynamic shared memory (over the 48 KB default); once per engine.
template <class Row, Precision P>
void allow_mma_shared(int64_t n) {
    by_mma_bucket(n, [&](auto bucket) {
        constexpr int NS = decltype(bucket)::value;
        PVM_CUDA_CHECK(cudaFuncSetAttribute(kernels::weight_pass_mma<Row, NS, P>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(kernels::mma_shared_bytes<NS, Row::kTiled>())));
    });
}

// The device's SMs.
int sm_count(int device) {
    int sms = 0;
    PVM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return sms;
}

// How many blocks of `threads` threads with `bytes` of dynamic shared memory are resident at once on one SM.
template <class Kernel>
int resident_per_sm(Kernel kernel, int threads, size_t bytes) {
    int per_sm = 0;
    PVM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, bytes));
    return per_sm;
}

// The same after letting the kernel have those bytes (over the 48 KB default).
template <class Kernel>
int allow_and_count_per_sm(Kernel kernel, int threads, size_t bytes) {
    PVM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    return resident_per_sm(kernel, threads, bytes);
}

// The slots that mma_blocks balances the pass of n sequences over on this device (kernels::mma_balance_slots).
template <class Row, Precision P>
int64_t mma_slots(int64_t n, int device) {
    int per_sm = 0;
    by_mma_bucket(n, [&](auto bucket) {
        constexpr int NS = decltype(bucket)::value;
        per_sm = resident_per_sm(kernels::weight_pass_mma<Row, NS, P>, kernels::kMmaThreads, kernels::mma_shared_bytes<NS, Row::kTiled>());
    });
    return kernels::mma_balance_slots(per_sm, sm_count(device));
}

// Calls f(std::integral_constant<int, NS>) for weight_pass_short's bucket NS >= n (n <= kMmaW1MaxSeqs).
template <class F>
void by_short_bucket(int64_t n, F&& f) {
    static_assert(kMmaW1MaxSeqs == 32, "the buckets end at 32");
    if (n <= 8) return f(std::integral_constant<int, 8>{});
    if (n <= 16) return f(std::integral_constant<int, 16>{});
    return f(std::integral_constant<int, 32>{});
}

// The same for w1_stream_pass (n <= kStreamMaxSeqs): the bucket of 1 or 2.
template <class F>
void by_stream_bucket(int64_t n, F&& f) {
    static_assert(kernels::kStreamMaxSeqs == 2, "the buckets end at 2");
    if (n <= 1) return f(std::integral_constant<int, 1>{});
    return f(std::integral_constant<int, 2>{});
}

// The same for hidden_deltas_split (n <= kSplitMaxSeqs): the bucket of 8 or 16.
template <class F>
void by_bucket_of_16(int64_t n, F&& f) {
    static_assert(kSplitMaxSeqs == 16, "the buckets end at 16");
    if (n <= 8) return f(std::integral_constant<int, 8>{});
    return f(std::integral_constant<int, 16>{});
}

// The same for w0_span_pass (kernels::span_seqs): the bucket of 8, 16, 48 or 64.
template <class F>
void by_span_bucket(int64_t n, F&& f) {
    static_assert(kernels::kSpanMaxSeqs == 16 && kernels::kSpanWideMinSeqs == 33 && kernels::kSpanWideMaxSeqs == 64, "8, 16, 48, 64");
    if (n <= 8) return f(std::integral_constant<int, 8>{});
    if (n <= 16) return f(std::integral_constant<int, 16>{});
    if (n <= 48) return f(std::integral_constant<int, 48>{});
    return f(std::integral_constant<int, 64>{});
}

// Lets weight_pass_short have its shared memory; returns how many of its blocks are resident at once on the device.
template <Precision P>
int short_pass_slots(int64_t n, int device) {
    int per_sm = 0;
    by_short_bucket(n, [&](auto bucket) {
        constexpr int NS = decltype(bucket)::value;
        per_sm = allow_and_count_per_sm(kernels::weight_pass_short<NS, P>, kernels::kShortThreads, kernels::short_shared_bytes<NS>());
    });
    return per_sm * sm_count(device);
}

// Lets w0_span_pass have its shared memory; returns how many of its blocks are resident on one SM (0: none fits, and
// the engine runs weight_pass_mma).
template <Precision P>
int span_pass_per_sm(int64_t n) {
    int per_sm = 0;
    by_span_bucket(n, [&](auto bucket) {
        constexpr int NS = decltype(bucket)::value;
        per_sm = allow_and_count_per_sm(kernels::w0_span_pass<NS, P>, kernels::kSpanThreads, kernels::span_shared_bytes<NS>());
    });
    return per_sm;
}

template <class Row, Precision P>
void launch_mma(int64_t n, const DeviceBuffer<int32_t>& blocks, const kernels::StepArgs& a, const kernels::StepLaunch& launch) {
    by_mma_bucket(n, [&](auto bucket) {
        constexpr int NS = decltype(bucket)::value;
        PVM_CUDA_CHECK(launch(kernels::weight_pass_mma<Row, NS, P>, static_cast<unsigned>(blocks.size() / kernels::kMmaBlockInts),
                              kernels::kMmaThreads, kernels::mma_shared_bytes<NS, Row::kTiled>(), a, blocks.data()));
    });
}

// The tiles of one many-sequence product (unit_products.cuh): for every unit, its M x N output in tiles
// of kMmaProductRows x cols, as (unit, first m, first n), the tiles of the longest sums (K) first so
// that the last wave is of short ones.
template <class Extent>
std::vector<int32_t> product_tiles(int64_t n_units, int cols, Extent m, Extent n, Extent k) {
    std::vector<std::array<int64_t, 4>> tiles;  // (K, unit, m0, n0)
    for (int64_t u = 0; u < n_units; ++u)
        for (int64_t m0 = 0; m0 < m(u); m0 += kernels::kMmaProductRows)
            for (int64_t n0 = 0; n0 < n(u); n0 += cols) tiles.push_back({k(u), u, m0, n0});
    std::stable_sort(tiles.begin(), tiles.end(), [](const auto& x, const auto& y) { return x[0] > y[0]; });
    std::vector<int32_t> out;
    for (const auto& t : tiles)
        out.insert(out.end(), {static_cast<int32_t>(t[1]), static_cast<int32_t>(t[2]), static_cast<int32_t>(t[3])});
    return out;
}

// Lets the tensor-core kernel of product P have its dynamic shared memory (over the 48 KB default).
template <class P, class Shape = typename P::MmaTiles>
void allow_mma_product_shared() {
    PVM_CUDA_CHECK(cudaFuncSetAttribute(kernels::product_kernel<P, Shape>(), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kernels::product_shared_bytes<Shape>())));
}

// The same for Product's mma.sync shape Mma in precision P and, where the engine runs wgmma (wgmma: the default
// precision only, as launch_product_on picks), its wgmma shape Wgmma.
template <class Product, class Wgmma, class Mma, Precision P>
void allow_product_shared_on(bool wgmma) {
    allow_mma_product_shared<Product, kernels::WithPrecision<Mma, P>>();
    if constexpr (P == Precision::kFp32)
        if (wgmma) allow_mma_product_shared<Product, Wgmma>();
}

// The other shapes of PVM_CUDA_FMA (an experiment): per product, the shapes its letters pick (1: lower case, 2: upper).
struct AltShapes {
    using FmaNarrow = kernels::FmaShape<64, 16, 3, 4>;
    using FmaWide = kernels::FmaShape<128, 16, 3, 2>;
    using FmaNarrowQuad = kernels::FmaShape<64, 16, 3, 3, 4, 8>;
};
template <class Product>
struct AltShapesOf {
    using type = std::tuple<AltShapes::FmaNarrow, AltShapes::FmaWide>;
};
template <>
struct AltShapesOf<kernels::W1Update> {
    using type = std::tuple<AltShapes::FmaNarrow, AltShapes::FmaNarrowQuad>;
};
// f(shape) for Product's shape `which` (1-based; 0: none).
template <class List, class F, size_t... I>
void by_alt_shape_in(int which, F& f, std::index_sequence<I...>) {
    ((which == static_cast<int>(I) + 1 ? f(std::tuple_element_t<I, List>{}) : void()), ...);
}
template <class Product, class F>
void by_alt_shape(int which, F&& f) {
    using List = typename AltShapesOf<Product>::type;
    by_alt_shape_in<List>(which, f, std::make_index_sequence<std::tuple_size_v<List>>{});
}
// The tile list's columns under shape `which` (tensor_cols for 0).
template <class Product>
int alt_cols(int which, int tensor_cols) {
    int cols = tensor_cols;
    by_alt_shape<Product>(which, [&](auto s) { cols = decltype(s)::kCols; });
    return cols;
}

// The same for every product a step of n sequences launches in precision P (wgmma: the engine's wgmma_).
template <Precision P>
void allow_products_shared(int64_t n, bool wgmma) {
    using namespace kernels;
    if (n >= kHiddenProductSeqs) {
        allow_product_shared_on<HiddenDeltas, HiddenDeltas::WgmmaTiles, HiddenDeltas::MmaTiles, P>(wgmma);
        allow_mma_product_shared<HiddenDeltas, WithPrecision<HiddenDeltas::MmaTilesFew, P>>();
    }
    if (n >= kProductSeqs && n > kMmaMaxSeqs) {
        allow_mma_product_shared<W0Forward, WithPrecision<W0Forward::MmaTiles, P>>();
        allow_mma_product_shared<W0Forward, WithPrecision<W0Forward::MmaTilesOneColumn, P>>();
        allow_mma_product_shared<W0Update, WithPrecision<W0Update::MmaTiles, P>>();
        if constexpr (P == Precision::kFp32)
            if (n <= kFmaUpdateMaxSeqs) allow_mma_product_shared<W0Update, W0Update::FmaTilesMid>();
    }
    if (n >= kProductSeqs && n > kMmaW1MaxSeqs) {
        allow_mma_product_shared<W1Forward, WithPrecision<W1Forward::MmaTiles, P>>();
        allow_mma_product_shared<W1Update, WithPrecision<W1Update::MmaTiles, P>>();
        if constexpr (P == Precision::kFp32) {
            if (n <= kMmaMaxSeqs) allow_mma_product_shared<W1Update, W1Update::FmaTilesFew>();
            else if (n <= kFmaUpdateMaxSeqs) allow_mma_product_shared<W1Update, W1Update::FmaTilesMid>();
        }
    }
}

// First unit id of every layer, plus n_units (units are numbered layer by layer).
std::vector<int64_t> layer_unit_ranges(const Topology& t) {
    std::vector<int64_t> first(t.n_layers + 1, t.n_units);
    for (int64_t u = t.n_units - 1; u >= 0; --u) first[t.unit_layer[u]] = u;
    return first;
}

std::string gib(double bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
    return buf;
}

}  // namespace

CudaEngine::CudaEngine(Topology topo, EngineConfig cfg, int device) : Engine(std::move(topo), cfg), device_(device) {
    int count = 0;
    PVM_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (device_ >= count)
        throw std::invalid_argument("device cuda:" + std::to_string(device_) + " asked for, but " + std::to_string(count) +
                                    " CUDA device(s) are visible");
    PVM_CUDA_CHECK(cudaSetDevice(device_));
    cudaDeviceProp prop{};
    PVM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    name_ = "cuda:" + std::to_string(device_) + " (" + prop.name + ")";
    // Programmatic edges in a captured graph (graph edge data) came with CUDA 12.3: with an older driver or
    // runtime each kernel waits for the last to end, as before.
    int driver = 0, runtime = 0;
    PVM_CUDA_CHECK(cudaDriverGetVersion(&driver));
    PVM_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    const char* chain = std::getenv("PVM_CUDA_CHAIN");
    chain_ = prop.major >= 9 && std::min(driver, runtime) >= 12030 && !(chain != nullptr && std::strcmp(chain, "0") == 0);
    chain_all_ = chain_ && chain != nullptr && std::strcmp(chain, "all") == 0;  // (every n_seq: for comparisons)
    // Products on wgmma (wgmma_product.cuh) where a step has products (from kProductSeqs) and this binary
    // holds them for this device: an sm_90a build on compute capability 9.0 (PVM_CUDA_WGMMA=0 keeps mma.sync,
    // for comparisons). Only in the default precision: the opt-in modes run on mma.sync.
    const char* wgmma = std::getenv("PVM_CUDA_WGMMA");
    if (cfg_.n_seq >= kProductSeqs && cfg_.precision == static_cast<int>(Precision::kFp32) && prop.major == 9 &&
        prop.minor == 0 && !(wgmma != nullptr && std::strcmp(wgmma, "0") == 0))
        PVM_CUDA_CHECK(kernels::query_wgmma_built(wgmma_));
    const Topology& t = topo_;
    const int64_t n = cfg_.n_seq;
    InputLayout inputs_layout = input_layout(t, built_inputs());
    x_stride_ = inputs_layout.stride;
    check_memory();
    PVM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));

    x_off_ = DeviceBuffer<int64_t>(t.x_off);
    y_off_ = DeviceBuffer<int64_t>(t.y_off);
    h_off_ = DeviceBuffer<int64_t>(t.h_off);
    // W and V on the device: W0's rows pitched (kernels::w0_pitch), or in column tiles where its pass runs on
    // tensor cores (kernels::w0_at), then W1 as on the host.
    const bool mma = n >= kMmaMinSeqs && n <= kMmaMaxSeqs;
    w0_tiled_ = mma;
    std::vector<int64_t> w0_device(t.w0_off.size(), 0), w1_device(t.w1_off.size());
    for (int64_t u = 0; u < t.n_units; ++u)
        w0_device[u + 1] = w0_device[u] + t.hidden * kernels::w0_row_floats(t.inputs(u), w0_tiled_);
    for (size_t u = 0; u < t.w1_off.size(); ++u) w1_device[u] = w0_device.back() + t.w1_off[u] - t.w1_off[0];
    device_weights_ = w1_device.back();
    w0_packed_off_ = DeviceBuffer<int64_t>(t.w0_off);
    w0_off_ = DeviceBuffer<int64_t>(w0_device);
    w1_off_ = DeviceBuffer<int64_t>(w1_device);
    x_gather_ = DeviceBuffer<int32_t>(inputs_layout.gather);
    x_index_ = DeviceBuffer<int32_t>(inputs_layout.index);
    x_index_host_ = std::move(inputs_layout.index);
    h_bias_ = DeviceBuffer<int64_t>(t.h_bias);
    raw_dst_ = DeviceBuffer<int64_t>(t.raw_context_dst);
    raw_src_ = DeviceBuffer<int64_t>(t.raw_context_src);
    target_src_ = DeviceBuffer<int64_t>(placed(t.target_src, x_index_host_));
    baseline_src_ = DeviceBuffer<int64_t>(placed(t.baseline_src, x_index_host_));
    y_unit_ = DeviceBuffer<int32_t>(t.y_unit);
    layer_unit_range_ = DeviceBuffer<int64_t>(layer_unit_ranges(t));
    // W0's pass on tensor cores: at 2-16 and 33-64 sequences on sm_90 (kernels::span_seqs), where its runs fill about
    // one wave of resident blocks (kernels::spans_pay), in equal spans of those blocks (w0_span_pass; PVM_CUDA_SPANS=0
    // keeps weight_pass_mma, for comparisons); else weight_pass_mma's blocks.
    const char* spans = std::getenv("PVM_CUDA_SPANS");
    int span_per_sm = 0;
    if (mma && kernels::span_seqs(n) && prop.major >= 9 && !(spans != nullptr && std::strcmp(spans, "0") == 0))
        by_precision(cfg_.precision, [&](auto prec) { span_per_sm = span_pass_per_sm<decltype(prec)::value>(n); });
    const int64_t w0_runs = t.n_units * ((t.hidden + kernels::kMmaRows - 1) / kernels::kMmaRows);
    if (mma && n <= kMmaW1MaxSeqs)  // (W1's pass may run on weight_pass_mma: where its rows are long)
        by_precision(cfg_.precision, [&](auto prec) { allow_mma_shared<kernels::RowW1, decltype(prec)::value>(n); });
    // Either W0 pass's sums of runs cut between blocks (per part, sequence and row) and a counter per run.
    const auto cut_run_sums = [&](int64_t most_parts, int64_t runs) {
        mma_partial_ = DeviceBuffer<float>(most_parts > 1 ? most_parts * n * t.n_units * t.hidden : 1);
        mma_count_ = DeviceBuffer<int32_t>(std::vector<int32_t>(runs, 0));
    };
    const int sms = sm_count(device_);
    const kernels::SpanList w0_spans = span_per_sm > 0 && kernels::spans_pay(w0_runs, span_per_sm, sms)
                                           ? kernels::span_list(int64_t{span_per_sm} * sms, t.hidden, t.x_off, t.h_off, w0_device)
                                           : kernels::SpanList{};
    if (!w0_spans.first.empty() && kernels::span_fits(w0_spans)) {
        w0_spans_ = DeviceBuffer<int64_t>(kernels::span_words(w0_spans.segments));
        w0_span_first_ = DeviceBuffer<int32_t>(w0_spans.first);
        cut_run_sums(w0_spans.most_parts, w0_spans.runs);
    } else if (mma) {
        int64_t w0_slots = 0;
        by_precision(cfg_.precision, [&](auto prec) {
            constexpr Precision P = decltype(prec)::value;
            allow_mma_shared<kernels::RowW0Tiled, P>(n);
            w0_slots = mma_slots<kernels::RowW0Tiled, P>(n, device_);
        });
        const kernels::MmaBlocks w0 = kernels::mma_blocks(
            t.n_units, w0_slots, [&](int64_t) { return t.hidden; }, [&](int64_t u) { return t.inputs(u); });
        w0_rows_ = DeviceBuffer<int32_t>(w0.list);
        cut_run_sums(w0.most_parts, w0.groups);
    }
    // W1's pass: from 2 to kMmaW1MaxSeqs sequences in tiles where its rows are short (weight_pass_short), else
    // weight_pass_mma's blocks of rows.
    const auto w1_runs = [&] {  // W1's rows of H+1 (or H+1+H|ctx|) in runs of up to 64: not split
        return kernels::mma_blocks(t.n_units, 0, [&](int64_t u) { return t.outputs(u); }, [&](int64_t u) { return t.hidden_len(u); })
            .list;
    };
    int64_t longest = 0;
    for (int64_t u = 0; u < t.n_units; ++u) longest = std::max(longest, t.hidden_len(u));
    // Up to kStreamMaxSeqs sequences on sm_90 W1 is streamed by resident blocks (w1_stream_pass; PVM_CUDA_W1STREAM=0
    // keeps the passes below, for comparisons).
    const char* w1_stream = std::getenv("PVM_CUDA_W1STREAM");
    if (n <= kernels::kStreamMaxSeqs && longest <= kernels::kShortMaxLen && prop.major >= 9 &&
        !(w1_stream != nullptr && std::strcmp(w1_stream, "0") == 0)) {
        const std::vector<int64_t> tiles = kernels::stream_tiles(t.n_units, [&](int64_t u) { return t.outputs(u); }, w1_device, t.y_off, t.h_off);
        const int64_t n_tiles = static_cast<int64_t>(tiles.size()) / kernels::kShortTileInts;
        int per_sm = 0;
        by_stream_bucket(n, [&](auto bucket) {
            constexpr int NS = decltype(bucket)::value;
            per_sm = allow_and_count_per_sm(kernels::w1_stream_pass<NS>, kernels::kStreamThreads, kernels::stream_shared_bytes<NS>());
        });
        const int64_t blocks = std::min<int64_t>(int64_t{per_sm} * sms, n_tiles);
        if (kernels::stream_fits(n_tiles, blocks)) {
            w1_tiles_ = DeviceBuffer<int64_t>(tiles);
            w1_stream_blocks_ = static_cast<int>(blocks);
        }
    }
    if (w1_stream_blocks_ > 0) {  // (w1_tiles_ holds the streamed pass's records)
    } else if (n > 1 && n <= kMmaW1MaxSeqs && longest <= kernels::kShortMaxLen) {
        w1_tiles_ = DeviceBuffer<int64_t>(kernels::short_tiles(w1_runs(), w1_device, t.y_off, t.h_off));
        by_precision(cfg_.precision, [&](auto prec) { w1_short_blocks_ = short_pass_slots<decltype(prec)::value>(n, device_); });
        // (at least one block: 0 means the other passes)
        w1_short_blocks_ = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(w1_short_blocks_, w1_tiles_.size() / kernels::kShortTileInts)));
    } else if (mma && n <= kMmaW1MaxSeqs) {
        w1_rows_ = DeviceBuffer<int32_t>(w1_runs());
    }
    std::function<int64_t(int64_t)> hidden = [&](int64_t) { return t.hidden; }, seqs = [&](int64_t) { return n; },
                                     inputs = [&](int64_t u) { return t.inputs(u); },
                                     outputs = [&](int64_t u) { return t.outputs(u); },
                                     hidden_len = [&](int64_t u) { return t.hidden_len(u); };
    hd_threads_ = kernels::hd_threads(n, t.n_units, sms);
    if (const char* fma = std::getenv("PVM_CUDA_FMA"); fma != nullptr && n >= kFmaMinSeqs &&
                                                        cfg_.precision == static_cast<int>(Precision::kFp32)) {
        const auto pick = [&](char c) { return std::strchr(fma, c) ? 1 : std::strchr(fma, c - 'a' + 'A') ? 2 : 0; };
        fma_w1_forward_ = pick('f');
        fma_w1_update_ = pick('u');
        fma_hidden_ = pick('h');
        fma_w0_update_ = pick('w');
    }
    // Up to 2 sequences the hidden deltas compute their units' output deltas, with no output_deltas launch
    // (PVM_CUDA_OWN_DELTAS=0: output_deltas does, for comparisons). H200, engine A/B, frames/s: small 1 / 2 / 4
    // sequences +0.5 / -0.1 / +0.1%, med +1.1 / +1.2 / -1.1% (the deltas phase 2-4 us shorter, the chained step
    // little: output_deltas mostly overlapped its neighbours already), so not at 3-4.
    const char* own = std::getenv("PVM_CUDA_OWN_DELTAS");
    hd_own_deltas_ = n <= kernels::kHdOwnDeltasSeqs && !(own != nullptr && std::strcmp(own, "0") == 0);
    split_hidden_deltas_ = n >= kHiddenProductSeqs && n <= kSplitMaxSeqs && longest <= kernels::kSplitMaxLen &&
                           t.hidden <= kernels::kSplitRows;
    // PVM_CUDA_SPLIT_OWN=1 (an experiment): hidden_deltas_split computes its units' output deltas, with no
    // output_deltas launch.
    const char* split_own = std::getenv("PVM_CUDA_SPLIT_OWN");
    split_own_deltas_ = split_hidden_deltas_ && split_own != nullptr && std::strcmp(split_own, "1") == 0;
    if (split_hidden_deltas_) {
        by_precision(cfg_.precision, [&](auto prec) {
            by_bucket_of_16(n, [&](auto bucket) {
                constexpr int NS = decltype(bucket)::value;
                for (auto kernel : {kernels::hidden_deltas_split<NS, decltype(prec)::value, false>,
                                    kernels::hidden_deltas_split<NS, decltype(prec)::value, true>})
                    PVM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                        static_cast<int>(kernels::split_shared_bytes<NS>())));
            });
        });
    } else if (n >= kHiddenProductSeqs) {
        using HiddenDeltas = kernels::HiddenDeltas;
        const bool few = n <= HiddenDeltas::MmaTilesFew::kCols;
        hidden_deltas_ = DeviceBuffer<int32_t>(product_tiles(
            t.n_units, few ? HiddenDeltas::MmaTilesFew::kCols : alt_cols<HiddenDeltas>(fma_hidden_, HiddenDeltas::MmaTiles::kCols),
            hidden, seqs, outputs));
    }
    if (n >= kProductSeqs && n > kMmaMaxSeqs) {
        w0_forward_ = DeviceBuffer<int32_t>(product_tiles(t.n_units, kernels::W0Forward::MmaTiles::kCols, hidden, seqs, inputs));
        w0_update_ = DeviceBuffer<int32_t>(product_tiles(
            t.n_units, alt_cols<kernels::W0Update>(fma_w0_update_, kernels::W0Update::MmaTiles::kCols), hidden, inputs, seqs));
    }
    if (n >= kProductSeqs && n > kMmaW1MaxSeqs) {
        w1_forward_ = DeviceBuffer<int32_t>(product_tiles(
            t.n_units, alt_cols<kernels::W1Forward>(fma_w1_forward_, kernels::W1Forward::MmaTiles::kCols), outputs, seqs, hidden_len));
        w1_update_ = DeviceBuffer<int32_t>(product_tiles(
            t.n_units, alt_cols<kernels::W1Update>(fma_w1_update_, kernels::W1Update::MmaTiles::kCols), outputs, hidden_len, seqs));
    }
    by_precision(cfg_.precision, [&](auto prec) { allow_products_shared<decltype(prec)::value>(n, wgmma_); });
    by_alt_shape<kernels::W1Forward>(fma_w1_forward_, [](auto s) { allow_mma_product_shared<kernels::W1Forward, decltype(s)>(); });
    by_alt_shape<kernels::W1Update>(fma_w1_update_, [](auto s) { allow_mma_product_shared<kernels::W1Update, decltype(s)>(); });
    by_alt_shape<kernels::HiddenDeltas>(fma_hidden_, [](auto s) { allow_mma_product_shared<kernels::HiddenDeltas, decltype(s)>(); });
    by_alt_shape<kernels::W0Update>(fma_w0_update_, [](auto s) { allow_mma_product_shared<kernels::W0Update, decltype(s)>(); });
    // hidden_deltas (1-4 sequences) takes the units with the most outputs first (as weight_pass_mma's blocks and the
    // products' tiles are listed): the last blocks to start are then the shortest, where the units fill more than one
    // wave of its blocks (med at 4 sequences, 3 blocks a SM: +3.5%). PVM_CUDA_LPT=0 keeps the topology's order.
    const char* lpt = std::getenv("PVM_CUDA_LPT");
    if (n < kHiddenProductSeqs && !(lpt != nullptr && std::strcmp(lpt, "0") == 0)) {
        std::vector<int32_t> units(t.n_units);
        for (int64_t u = 0; u < t.n_units; ++u) units[u] = static_cast<int32_t>(u);
        std::stable_sort(units.begin(), units.end(), [&](int32_t x, int32_t y) { return t.outputs(x) > t.outputs(y); });
        unit_order_ = DeviceBuffer<int32_t>(units);
    }

    weights_ = DeviceBuffer<float>(device_weights_, kWindowSlack);
    velocity_ = DeviceBuffer<float>(device_weights_, kWindowSlack);
    x_ = DeviceBuffer<float>(3 * n * x_stride_);
    h_ = DeviceBuffer<float>(3 * n * t.h_total);
    y_ = DeviceBuffer<float>(3 * n * t.y_total);
    unit_lr_ = DeviceBuffer<float>(t.n_units);
    unit_mu_ = DeviceBuffer<float>(t.n_units);
    lr_delta_out_ = DeviceBuffer<float>(n * t.y_total, kWindowSlack);
    lr_delta_hidden_ = DeviceBuffer<float>(n * t.h_total);
    error_ = DeviceBuffer<float>(n * t.y_total);
    metric_sums_ = DeviceBuffer<double>(t.metric_bins());
    unit_error_ = DeviceBuffer<double>(2 * t.n_units);
    const int64_t delta_rows = kernels::delta_groups(n, kernels::delta_group_seqs(n));
    error_sq_ = DeviceBuffer<double>(delta_rows * t.y_total);
    baseline_sums_ = DeviceBuffer<double>(2);
    unit_baseline_ = DeviceBuffer<double>(2 * t.n_units);
    baseline_sq_ = DeviceBuffer<double>(delta_rows * t.y_total);
    step_ = DeviceBuffer<int64_t>(1);
    metric_steps_ = DeviceBuffer<int64_t>(1);
    frames_u8_ = DeviceBuffer<uint8_t>(n * t.image_size);
    frames_f32_ = DeviceBuffer<float>(n * t.image_size);

    for (DeviceBuffer<float>* b : {&weights_, &velocity_, &unit_lr_, &unit_mu_, &lr_delta_out_, &lr_delta_hidden_, &error_})
        b->fill_async(0, stream_);
    for (DeviceBuffer<float>* b : {&x_, &h_, &y_}) {  // rings start all ones (§3.2)
        kernels::fill<<<blocks_for(b->size()), kernels::kThreads, 0, stream_>>>(b->data(), b->size(), 1.0f);
        PVM_CUDA_CHECK_LAUNCH();
    }
    metric_sums_.fill_async(0, stream_);
    baseline_sums_.fill_async(0, stream_);
    error_sq_.fill_async(0, stream_);
    baseline_sq_.fill_async(0, stream_);
    step_.fill_async(0, stream_);
    metric_steps_.fill_async(0, stream_);

    const size_t staging = static_cast<size_t>(n * t.image_size) * sizeof(float);
    for (int i = 0; i < 2; ++i) {
        PVM_CUDA_CHECK(cudaMallocHost(&pinned_[i], staging));
        PVM_CUDA_CHECK(cudaEventCreateWithFlags(&pinned_free_[i], cudaEventDisableTiming));
        PVM_CUDA_CHECK(cudaEventRecord(pinned_free_[i], stream_));
    }
    PVM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

CudaEngine::~CudaEngine() {
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    delete graph_u8_;
    delete graph_f32_;
    delete graph_dataset_;
    for (int i = 0; i < 2; ++i) {
        if (pinned_[i]) cudaFreeHost(pinned_[i]);
        if (pinned_free_[i]) cudaEventDestroy(pinned_free_[i]);
    }
    if (stream_) cudaStreamDestroy(stream_);
}

void CudaEngine::check_memory() const {
    const Topology& t = topo_;
    const double n = static_cast<double>(cfg_.n_seq);
    const double need = 4.0 * (2.0 * (t.n_weights + 3.0 * t.n_units * t.hidden) + 3.0 * n * (x_stride_ + t.h_total + t.y_total) +
                               n * (2.0 * t.y_total + t.h_total) + 2.0 * n * t.image_size) +
                        8.0 * (t.x_total + t.x_off.size() * 5 + 3.0 * t.y_total);
    size_t free_bytes = 0, total_bytes = 0;
    PVM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (need > 0.95 * static_cast<double>(free_bytes))
        throw std::runtime_error("this model with n_seq=" + std::to_string(cfg_.n_seq) + " needs about " + gib(need) +
                                 " on " + name_ + ", which has " + gib(static_cast<double>(free_bytes)) + " free of " +
                                 gib(static_cast<double>(total_bytes)));
}

namespace {

template <class Product, class Shape = typename Product::MmaTiles>
void launch_product(const kernels::StepArgs& a, const DeviceBuffer<int32_t>& tiles, const kernels::StepLaunch& launch) {
    PVM_CUDA_CHECK(launch(kernels::product_kernel<Product, Shape>(), static_cast<unsigned>(tiles.size() / 3), Shape::kThreads,
                          kernels::product_shared_bytes<Shape>(), a, tiles.data()));
}

// Product on its wgmma shape Wgmma where the engine runs wgmma (wgmma_: the default precision only), else on the
// mma.sync shape Mma in precision P.
template <class Product, class Wgmma, class Mma, Precision P>
void launch_product_on(bool wgmma, const kernels::StepArgs& a, const DeviceBuffer<int32_t>& tiles,
                       const kernels::StepLaunch& launch) {
    if constexpr (P == Precision::kFp32)
        if (wgmma) return launch_product<Product, Wgmma>(a, tiles, launch);
    launch_product<Product, kernels::WithPrecision<Mma, P>>(a, tiles, launch);
}

// Product on its PVM_CUDA_FMA shape `which` where the switch picked one (by_alt_shape), else on Shape.
template <class Product, class Shape>
void launch_product_or_alt(int which, const kernels::StepArgs& a, const DeviceBuffer<int32_t>& tiles,
                           const kernels::StepLaunch& launch) {
    if (which != 0)
        by_alt_shape<Product>(which, [&](auto s) { launch_product<Product, decltype(s)>(a, tiles, launch); });
    else
        launch_product<Product, Shape>(a, tiles, launch);
}

// An update of more than kMmaMaxSeqs sequences in precision P: on FMAs (Product::FmaTilesMid) up to kFmaUpdateMaxSeqs in
// the default precision, else on its tensor-core tiles; PVM_CUDA_FMA's shape `which` over either.
template <class Product, Precision P>
void launch_update(int which, const kernels::StepArgs& a, const DeviceBuffer<int32_t>& tiles, const kernels::StepLaunch& launch) {
    if constexpr (P == Precision::kFp32)
        if (a.n_seq <= kFmaUpdateMaxSeqs) return launch_product_or_alt<Product, typename Product::FmaTilesMid>(which, a, tiles, launch);
    launch_product_or_alt<Product, kernels::WithPrecision<typename Product::MmaTiles, P>>(which, a, tiles, launch);
}

}  // namespace

// Many sequences: the per-unit products as matrix products on tensor cores (unit_products.cuh), in precision P.
// The forward products and the hidden deltas read the old weights, so the updates come last.
template <Precision P, class Mark>
void CudaEngine::enqueue_products(const kernels::StepArgs& a, const kernels::StepLaunch& launch, Mark& mark) {
    using namespace kernels;
    // wgmma (sm_90a, default precision) where the workbench measured it ahead (benchmarks/NOTES.md), and the W1 update
    // and the W0 update on FMAs up to kFmaUpdateMaxSeqs sequences (default precision); same tile lists. (The hidden
    // deltas' product, where it runs, takes 32-column tiles up to 32 sequences: a tile list of its own.)
    static_assert(HiddenDeltas::WgmmaTiles::kCols == HiddenDeltas::MmaTiles::kCols &&
                      W1Update::FmaTilesFew::kCols == W1Update::MmaTiles::kCols &&
                      W1Update::FmaTilesMid::kCols == W1Update::MmaTiles::kCols &&
                      W0Update::FmaTilesMid::kCols == W0Update::MmaTiles::kCols, "one tile list per product");
    launch_deltas<P>(a, launch);
    mark("deltas");
    if (a.n_seq <= kMmaW1MaxSeqs) {
        enqueue_mma_passes<P>(a, launch, mark);
    } else if (a.n_seq <= kMmaMaxSeqs) {
        launch_w0_pass<P>(a, launch);
        mark("w0 forward+update");
        launch_product_or_alt<W1Forward, WithPrecision<W1Forward::MmaTiles, P>>(fma_w1_forward_, a, w1_forward_, launch);
        mark("w1 forward");
        using W1UpdateFew = std::conditional_t<P == Precision::kFp32, W1Update::FmaTilesFew, WithPrecision<W1Update::MmaTiles, P>>;
        launch_product_or_alt<W1Update, W1UpdateFew>(fma_w1_update_, a, w1_update_, launch);
        mark("w1 update");
    } else {
        // On mma.sync (the updates on FMAs up to kFmaUpdateMaxSeqs): with x gathered (W0Forward) and the old state
        // prefetched (W0Update, W1Update) each was ahead of the wgmma shapes tried (benchmarks/NOTES.md).
        if (a.n_seq > W0Forward::MmaTiles::kCols)
            launch_product<W0Forward, WithPrecision<W0Forward::MmaTiles, P>>(a, w0_forward_, launch);
        else
            launch_product<W0Forward, WithPrecision<W0Forward::MmaTilesOneColumn, P>>(a, w0_forward_, launch);
        mark("w0 forward");
        launch_product_or_alt<W1Forward, WithPrecision<W1Forward::MmaTiles, P>>(fma_w1_forward_, a, w1_forward_, launch);
        mark("w1 forward");
        launch_update<W0Update, P>(fma_w0_update_, a, w0_update_, launch);
        mark("w0 update");
        launch_update<W1Update, P>(fma_w1_update_, a, w1_update_, launch);
        mark("w1 update");
    }
}

template <Precision P>
void CudaEngine::launch_deltas(const kernels::StepArgs& a, const kernels::StepLaunch& launch) {
    using namespace kernels;
    if (a.n_seq < kHiddenProductSeqs) {
        if (!hd_own_deltas_) launch_output_deltas(a, launch);
        by_bucket(a.n_seq, [&](auto bucket) {
            constexpr int NS = decltype(bucket)::value;
            const auto go = [&](auto threads) {
                constexpr int T = decltype(threads)::value;
                const auto columns = [&](auto own) {  // row groups of 51 columns where the hidden rows fit them, else 64
                    constexpr bool O = decltype(own)::value;
                    return a.hidden <= kHdNarrowCols ? hidden_deltas<NS, T, T / kHdNarrowCols, O> : hidden_deltas<NS, T, T / kHdWideCols, O>;
                };
                auto kernel = columns(std::false_type{});
                if constexpr (NS <= kHdOwnDeltasSeqs)
                    if (hd_own_deltas_) kernel = columns(std::true_type{});
                PVM_CUDA_CHECK(launch(kernel, static_cast<unsigned>(a.n_units), T, 0, a));
            };
            if constexpr (NS == 4)  // (512 threads only at 3-4 sequences: hd_threads)
                if (hd_threads_ == 512) return go(std::integral_constant<int, 512>{});
            go(std::integral_constant<int, 256>{});
        });
        return;
    }
    if (!(split_hidden_deltas_ && split_own_deltas_)) launch_output_deltas(a, launch);
    if (split_hidden_deltas_) {
        by_bucket_of_16(a.n_seq, [&](auto bucket) {
            constexpr int NS = decltype(bucket)::value;
            auto kernel = split_own_deltas_ ? hidden_deltas_split<NS, P, true> : hidden_deltas_split<NS, P, false>;
            PVM_CUDA_CHECK(launch(kernel, static_cast<unsigned>(a.n_units), kSplitThreads, split_shared_bytes<NS>(), a));
        });
    } else if (a.n_seq <= HiddenDeltas::MmaTilesFew::kCols) {
        launch_product<HiddenDeltas, WithPrecision<HiddenDeltas::MmaTilesFew, P>>(a, hidden_deltas_, launch);
    } else if (fma_hidden_ != 0) {
        by_alt_shape<HiddenDeltas>(fma_hidden_, [&](auto s) { launch_product<HiddenDeltas, decltype(s)>(a, hidden_deltas_, launch); });
    } else {
        launch_product_on<HiddenDeltas, HiddenDeltas::WgmmaTiles, HiddenDeltas::MmaTiles, P>(wgmma_, a, hidden_deltas_, launch);
    }
}

// kMmaMinSeqs to kMmaW1MaxSeqs sequences: the W0 pass, then the W1 pass (it reads the h(s) the first writes), on tensor cores.
// W1's rows of up to kShortMaxLen entries go in tiles (weight_pass_short): H200, small, 36.6 against 43.8 us at 16
// sequences, 48.4 against 60.7 at 32 (dev/cuda/w1_pass.cu; benchmarks/NOTES.md).
template <Precision P, class Mark>
void CudaEngine::enqueue_mma_passes(const kernels::StepArgs& a, const kernels::StepLaunch& launch, Mark& mark) {
    launch_w0_pass<P>(a, launch);
    mark("w0 forward+update");
    if (w1_stream_blocks_ > 0) launch_stream_w1(a, launch);
    else if (w1_short_blocks_ > 0) launch_short_w1(a, launch);
    else launch_mma<kernels::RowW1, P>(a.n_seq, w1_rows_, a, launch);
    mark("w1 forward+update");
}

// W0's pass on tensor cores (kMmaMinSeqs to kMmaMaxSeqs sequences): w0_span_pass's spans where the engine listed them, else
// weight_pass_mma's blocks.
template <Precision P>
void CudaEngine::launch_w0_pass(const kernels::StepArgs& a, const kernels::StepLaunch& launch) {
    if (w0_span_first_.size() == 0) return launch_mma<kernels::RowW0Tiled, P>(a.n_seq, w0_rows_, a, launch);
    const auto* segments = reinterpret_cast<const kernels::SpanSegment*>(w0_spans_.data());
    by_span_bucket(a.n_seq, [&](auto bucket) {
        constexpr int NS = decltype(bucket)::value;
        PVM_CUDA_CHECK(launch(kernels::w0_span_pass<NS, P>, static_cast<unsigned>(w0_span_first_.size() - 1), kernels::kSpanThreads,
                              kernels::span_shared_bytes<NS>(), a, segments, w0_span_first_.data()));
    });
}

void CudaEngine::launch_stream_w1(const kernels::StepArgs& a, const kernels::StepLaunch& launch) {
    by_stream_bucket(a.n_seq, [&](auto bucket) {
        constexpr int NS = decltype(bucket)::value;
        PVM_CUDA_CHECK(launch(kernels::w1_stream_pass<NS>, static_cast<unsigned>(w1_stream_blocks_), kernels::kStreamThreads,
                              kernels::stream_shared_bytes<NS>(), a, w1_tiles_.data(), static_cast<int>(w1_tiles_.size() / kernels::kShortTileInts)));
    });
}

void CudaEngine::launch_short_w1(const kernels::StepArgs& a, const kernels::StepLaunch& launch) {
    by_precision(cfg_.precision, [&](auto prec) {
        by_short_bucket(a.n_seq, [&](auto bucket) {
            constexpr int NS = decltype(bucket)::value;
            PVM_CUDA_CHECK(launch(kernels::weight_pass_short<NS, decltype(prec)::value>, static_cast<unsigned>(w1_short_blocks_),
                                  kernels::kShortThreads, kernels::short_shared_bytes<NS>(), a, w1_tiles_.data(),
                                  static_cast<int>(w1_tiles_.size() / kernels::kShortTileInts)));
        });
    });
}

// Every buffer and extent a step's kernels take.
kernels::StepArgs CudaEngine::step_args() {
    const Topology& t = topo_;
    const int64_t n = cfg_.n_seq;
    kernels::StepArgs a{};
    a.n_seq = n;
    a.n_units = t.n_units;
    a.hidden = t.hidden;
    a.x_stride = x_stride_;
    a.y_total = t.y_total;
    a.h_total = t.h_total;
    a.image_size = t.image_size;
    a.delta_group = kernels::delta_group_seqs(n);
    a.n_raw = static_cast<int64_t>(t.raw_context_dst.size());
    a.polynomial = cfg_.polynomial;
    a.opt_abs_diff = cfg_.opt_abs_diff;
    a.derivative = cfg_.derivative;
    a.x_off = x_off_.data();
    a.y_off = y_off_.data();
    a.h_off = h_off_.data();
    a.w0_off = w0_off_.data();
    a.w1_off = w1_off_.data();
    a.x_gather = x_gather_.data();
    a.x_index = x_index_.data();
    a.h_bias = h_bias_.data();
    a.raw_dst = raw_dst_.data();
    a.raw_src = raw_src_.data();
    a.target_src = target_src_.data();
    a.baseline_src = baseline_src_.data();
    a.y_unit = y_unit_.data();
    a.unit_order = unit_order_.data();
    a.weights = weights_.data();
    a.velocity = velocity_.data();
    a.x = x_.data();
    a.h = h_.data();
    a.y = y_.data();
    a.unit_lr = unit_lr_.data();
    a.unit_mu = unit_mu_.data();
    a.delta_out = lr_delta_out_.data();
    a.lr_delta_hidden = lr_delta_hidden_.data();
    a.mma_partial = mma_partial_.data();
    a.mma_count = mma_count_.data();
    a.error_sq = error_sq_.data();
    a.metric_sums = metric_sums_.data();
    a.unit_error = unit_error_.data();
    a.baseline_sq = baseline_sq_.data();
    a.unit_baseline = unit_baseline_.data();
    a.baseline_sums = baseline_sums_.data();
    a.layer_unit_range = layer_unit_range_.data();
    a.n_layers = t.n_layers;
    a.metric_steps = metric_steps_.data();
    a.step = step_.data();
    return a;
}

template <class Pixel, class Mark>
void CudaEngine::enqueue_step(const Pixel* d_frames, Mark&& mark, int64_t n_frames, int64_t first) {
    const Topology& t = topo_;
    const int64_t n = cfg_.n_seq;
    const kernels::StepArgs a = step_args();

    using namespace kernels;
    const int T = kThreads;
    const unsigned seqs = static_cast<unsigned>(n);
    // Chained launches (dependent_launch.cuh) up to kChainMaxSeqs sequences, where a step is short and its
    // launch boundaries weigh most. H200, small, frames/s unchained -> chained: n_seq 1 8,814 -> 8,945,
    // 2 15,515 -> 16,146, 4 26,440 -> 27,251, 8 41,096 -> 42,323 (-> 27,625 and 42,916 with the W and V
    // copies moved ahead of the wait). Profiling records an event between phases: each phase's time is
    // then its own, unchained.
    const StepLaunch launch{stream_, chained_launches() && std::is_same_v<std::decay_t<Mark>, NoMark>};
    PVM_CUDA_CHECK(launch(assemble_inputs<Pixel, kGatherEntries>,
                          dim3(blocks_for((x_stride_ + kGatherEntries - 1) / kGatherEntries), static_cast<unsigned>((n + kGatherSeqs - 1) / kGatherSeqs)),
                          T, 0, a, d_frames, n_frames, first));
    if (a.n_raw > 0) {  // feed-context mode; the hidden vectors' constant 1s stay put (set_hidden_bias)
        PVM_CUDA_CHECK(launch(assemble_hidden, dim3(blocks_for(a.n_raw), seqs), T, 0, a));
    }
    mark("gather");
    if (n >= kProductSeqs) {
        by_precision(cfg_.precision, [&](auto prec) { enqueue_products<decltype(prec)::value>(a, launch, mark); });
    } else {
        by_precision(cfg_.precision, [&](auto prec) { launch_deltas<decltype(prec)::value>(a, launch); });
        mark("deltas");
        const bool long_w1_rows = !t.raw_context_dst.empty();  // feed-context mode: rows of H+1+H|ctx|
        if (n >= kMmaMinSeqs) {
            by_precision(cfg_.precision, [&](auto prec) { enqueue_mma_passes<decltype(prec)::value>(a, launch, mark); });
        } else {
            PVM_CUDA_CHECK(launch(weight_pass_single<RowW0, kWarp>, blocks_for(t.n_units * t.hidden * kWarp), T, 0, a));
            mark("w0 forward+update");
            if (w1_stream_blocks_ > 0) {
                launch_stream_w1(a, launch);
            } else if (long_w1_rows) {
                PVM_CUDA_CHECK(launch(weight_pass_single<RowW1, kWarp>, blocks_for(t.y_total * kWarp), T, 0, a));
            } else {
                PVM_CUDA_CHECK(launch(weight_pass_single<RowW1, kW1Lanes>, blocks_for(t.y_total * kW1Lanes), T, 0, a));
            }
            mark("w1 forward+update");
        }
    }
    PVM_CUDA_CHECK(launch(advance_step, 1, 1, 0, a));
}

bool CudaEngine::chained_launches() const { return chain_ && (chain_all_ || cfg_.n_seq <= kChainMaxSeqs); }
bool CudaEngine::wgmma_products() const { return wgmma_; }

template <class Pixel>
Pixel* CudaEngine::upload_frames(const Pixel* frames) {
    PVM_CUDA_CHECK(cudaSetDevice(device_));
    const size_t bytes = static_cast<size_t>(cfg_.n_seq * topo_.image_size) * sizeof(Pixel);
    Pixel* d_frames;
    if constexpr (sizeof(Pixel) == 1) {
        d_frames = reinterpret_cast<Pixel*>(frames_u8_.data());
    } else {
        d_frames = reinterpret_cast<Pixel*>(frames_f32_.data());
    }
    // Double-buffered pinned staging: wait until the copy that last used this buffer has run.
    const int i = pinned_next_;
    pinned_next_ ^= 1;
    PVM_CUDA_CHECK(cudaEventSynchronize(pinned_free_[i]));
    std::memcpy(pinned_[i], frames, bytes);
    PVM_CUDA_CHECK(cudaMemcpyAsync(d_frames, pinned_[i], bytes, cudaMemcpyHostToDevice, stream_));
    PVM_CUDA_CHECK(cudaEventRecord(pinned_free_[i], stream_));
    return d_frames;
}

template <class Pixel>
void CudaEngine::step(const Pixel* frames) {
    Pixel* d_frames = upload_frames(frames);
    CudaGraph*& graph = sizeof(Pixel) == 1 ? graph_u8_ : graph_f32_;
    if (graph == nullptr) graph = new CudaGraph(stream_, [&] { enqueue_step(d_frames, NoMark{}); });
    graph->launch(stream_);
    ++host_step_;
}

void CudaEngine::set_dataset_u8(const uint8_t* host_frames, int64_t n_frames, int64_t first_step) {
    if (n_frames < 1) throw std::invalid_argument("a dataset needs at least one block of frames");
    PVM_CUDA_CHECK(cudaSetDevice(device_));
    PVM_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old dataset may still be read
    dataset_owned_ = DeviceBuffer<uint8_t>(n_frames * frame_block());
    PVM_CUDA_CHECK(cudaMemcpy(dataset_owned_.data(), host_frames, static_cast<size_t>(dataset_owned_.size()),
                              cudaMemcpyHostToDevice));
    use_dataset(dataset_owned_.data(), n_frames, first_step);
}

void CudaEngine::set_dataset_device_u8(uintptr_t device_frames, int64_t n_frames, int64_t first_step) {
    if (n_frames < 1) throw std::invalid_argument("a dataset needs at least one block of frames");
    cudaPointerAttributes attr{};
    PVM_CUDA_CHECK(cudaPointerGetAttributes(&attr, reinterpret_cast<const void*>(device_frames)));
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
        throw std::invalid_argument("set_dataset_device: the address is not device memory");
    if (attr.device != device_)
        throw std::invalid_argument("set_dataset_device: the frames are on GPU " + std::to_string(attr.device) +
                                    ", the engine on GPU " + std::to_string(device_));
    PVM_CUDA_CHECK(cudaSetDevice(device_));
    PVM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    dataset_owned_ = DeviceBuffer<uint8_t>();
    use_dataset(reinterpret_cast<const uint8_t*>(device_frames), n_frames, first_step);
}

void CudaEngine::use_dataset(const uint8_t* frames, int64_t n_frames, int64_t first_step) {
    dataset_ = frames;
    dataset_frames_ = n_frames;
    dataset_first_ = first_step;
    delete graph_dataset_;  // its first kernel captured the old address
    graph_dataset_ = nullptr;
}

void CudaEngine::run_dataset(int64_t n_steps) {
    if (dataset_ == nullptr) throw std::logic_error("run_dataset before set_dataset");
    PVM_CUDA_CHECK(cudaSetDevice(device_));
    if (graph_dataset_ == nullptr) {
        graph_dataset_ = new CudaGraph(stream_, [&] {
            enqueue_step(dataset_, NoMark{}, dataset_frames_, dataset_first_);  // the step's block read in place
        });
    }
    for (int64_t i = 0; i < n_steps; ++i) {
        graph_dataset_->launch(stream_);
        ++host_step_;
    }
}

uintptr_t CudaEngine::device_pointer(const std::string& name) {
    if (name == "error") {  // rebuilt from the rings for the last step (output_deltas does not store it)
        PVM_CUDA_CHECK(cudaSetDevice(device_));
        const int64_t n = cfg_.n_seq;
        kernels::output_errors<<<dim3(blocks_for(topo_.y_total), static_cast<unsigned>(n)), kernels::kThreads, 0, stream_>>>(
            x_.data(), y_.data(), target_src_.data(), step_.data(), n, x_stride_, topo_.y_total, error_.data());
        PVM_CUDA_CHECK_LAUNCH();
        return reinterpret_cast<uintptr_t>(error_.data());
    }
    if (name == "x_ring" && built_inputs()) {  // the rows hold the step's sources: x in its layout, built now
        PVM_CUDA_CHECK(cudaSetDevice(device_));
        if (x_view_.size() == 0) x_view_ = DeviceBuffer<float>(buffer_size("x_ring"));
        materialise_x(x_view_.data());
        return reinterpret_cast<uintptr_t>(x_view_.data());
    }
    if (name == "weights" || name == "momentum") {  // W0 is pitched or tiled on the device: packed now
        PVM_CUDA_CHECK(cudaSetDevice(device_));
        DeviceBuffer<float>& view = name == "weights" ? weights_view_ : momentum_view_;
        if (view.size() == 0) view = DeviceBuffer<float>(topo_.n_weights);
        pack_weights(buffer(name), view.data());
        return reinterpret_cast<uintptr_t>(view.data());
    }
    return reinterpret_cast<uintptr_t>(buffer(name).data());
}

void CudaEngine::pack_weights(const DeviceBuffer<float>& on_device, float* packed) {
    const Topology& t = topo_;
    kernels::repitch_w0<<<static_cast<unsigned>(t.n_units * t.hidden), kernels::kThreads, 0, stream_>>>(
        on_device.data(), packed, x_off_.data(), w0_packed_off_.data(), w0_off_.data(), t.hidden, false, w0_tiled_);
    PVM_CUDA_CHECK_LAUNCH();
    const int64_t w0 = t.w1_off[0], w1 = t.n_weights - w0;
    PVM_CUDA_CHECK(cudaMemcpyAsync(packed + w0, on_device.data() + (device_weights_ - w1), w1 * sizeof(float),
                                   cudaMemcpyDeviceToDevice, stream_));
}

void CudaEngine::unpack_weights(const float* packed, DeviceBuffer<float>& on_device) {
    const Topology& t = topo_;
    kernels::repitch_w0<<<static_cast<unsigned>(t.n_units * t.hidden), kernels::kThreads, 0, stream_>>>(
        packed, on_device.data(), x_off_.data(), w0_packed_off_.data(), w0_off_.data(), t.hidden, true, w0_tiled_);
    PVM_CUDA_CHECK_LAUNCH();
    const int64_t w0 = t.w1_off[0], w1 = t.n_weights - w0;
    PVM_CUDA_CHECK(cudaMemcpyAsync(on_device.data() + (device_weights_ - w1), packed + w0, w1 * sizeof(float),
                                   cudaMemcpyDeviceToDevice, stream_));
}

bool CudaEngine::built_inputs() const { return cfg_.n_seq >= kBuiltInputsMinSeqs; }

void CudaEngine::materialise_x(float* out) {
    const dim3 grid(blocks_for(topo_.x_total), static_cast<unsigned>(kernels::kRing * cfg_.n_seq));
    kernels::materialise_inputs<<<grid, kernels::kThreads, 0, stream_>>>(x_.data(), x_index_.data(), topo_.x_total, x_stride_, out);
    PVM_CUDA_CHECK_LAUNCH();
}

void CudaEngine::synchronize() {
    PVM_CUDA_CHECK(cudaSetDevice(device_));
    PVM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

std::vector<std::pair<std::string, double>> CudaEngine::profile_step_u8(const uint8_t* frames) {
    uint8_t* d_frames = upload_frames(frames);
    std::vector<std::pair<std::string, cudaEvent_t>> marks;
    auto record = [&](const char* phase) {
        cudaEvent_t e;
        PVM_CUDA_CHECK(cudaEventCreate(&e));
        PVM_CUDA_CHECK(cudaEventRecord(e, stream_));
        marks.emplace_back(phase, e);
    };
    kernels::spin<<<1, 1, 0, stream_>>>(2'000'000);  // the host enqueues while the GPU waits: pure device times
    PVM_CUDA_CHECK_LAUNCH();
    record("start");
    enqueue_step(d_frames, record);
    PVM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<std::pair<std::string, double>> out;
    for (size_t i = 1; i < marks.size(); ++i) {
        float ms = 0.0f;
        PVM_CUDA_CHECK(cudaEventElapsedTime(&ms, marks[i - 1].second, marks[i].second));
        out.emplace_back(marks[i].first, ms);
    }
    for (auto& m : marks) cudaEventDestroy(m.second);
    ++host_step_;
    return out;
}

void CudaEngine::step_u8(const uint8_t* frames) { step(frames); }
void CudaEngine::step_f32(const float* frames) { step(frames); }

DeviceBuffer<float>& CudaEngine::buffer(const std::string& name) {
    return select_buffer(name, weights_, velocity_, x_, h_, y_, unit_lr_, unit_mu_);
}

void CudaEngine::read(const std::string& name, float* out) {
    PVM_CUDA_CHECK(cudaSetDevice(device_));
    if (name == "x_ring" && built_inputs()) {
        DeviceBuffer<float> x(buffer_size(name));
        materialise_x(x.data());
        PVM_CUDA_CHECK(cudaMemcpyAsync(out, x.data(), x.bytes(), cudaMemcpyDeviceToHost, stream_));
        PVM_CUDA_CHECK(cudaStreamSynchronize(stream_));
        return;
    }
    if (name == "weights" || name == "momentum") {
        DeviceBuffer<float> packed(topo_.n_weights);
        pack_weights(buffer(name), packed.data());
        PVM_CUDA_CHECK(cudaMemcpyAsync(out, packed.data(), packed.bytes(), cudaMemcpyDeviceToHost, stream_));
        PVM_CUDA_CHECK(cudaStreamSynchronize(stream_));
        return;
    }
    auto& b = buffer(name);
    PVM_CUDA_CHECK(cudaMemcpyAsync(out, b.data(), b.bytes(), cudaMemcpyDeviceToHost, stream_));
    PVM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaEngine::write(const std::string& name, const float* in) {
    PVM_CUDA_CHECK(cudaSetDevice(device_));
    if (name == "x_ring" && built_inputs()) {
        // Each input into its place in the rows of sources; the inputs that copy one hidden value share a
        // place (a ring the engine wrote holds one value there; otherwise the last input's stays). Places no
        // input has are zeros: nothing reads them (the gather rewrites a slot before a step reads it through
        // x_index), so the device's old rows need not be copied back first.
        const int64_t rows = kernels::kRing * cfg_.n_seq, X = topo_.x_total;
        std::vector<float> sources(static_cast<size_t>(rows * x_stride_), 0.0f);
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t i = 0; i < X; ++i) sources[r * x_stride_ + x_index_host_[i]] = in[r * X + i];
        PVM_CUDA_CHECK(cudaMemcpy(x_.data(), sources.data(), x_.bytes(), cudaMemcpyHostToDevice));
        return;
    }
    if (name == "weights" || name == "momentum") {
        DeviceBuffer<float> packed(topo_.n_weights);
        PVM_CUDA_CHECK(cudaMemcpyAsync(packed.data(), in, packed.bytes(), cudaMemcpyHostToDevice, stream_));
        unpack_weights(packed.data(), buffer(name));
        PVM_CUDA_CHECK(cudaStreamSynchronize(stream_));
        return;
    }
    auto& b = buffer(name);
    PVM_CUDA_CHECK(cudaMemcpyAsync(b.data(), in, b.bytes(), cudaMemcpyHostToDevice, stream_));
    if (&b == &h_) {  // the steps never write the constant 1s: put them back in every ring slot
        const Topology& t = topo_;
        kernels::set_hidden_bias<<<dim3(blocks_for(t.n_units), static_cast<unsigned>(kernels::kRing * cfg_.n_seq)), kernels::kThreads, 0,
                                   stream_>>>(h_.data(), h_bias_.data(), t.n_units, t.h_total);
        PVM_CUDA_CHECK_LAUNCH();
    }
    PVM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaEngine::set_step_index(int64_t step) {
    PVM_CUDA_CHECK(cudaSetDevice(device_));
    PVM_CUDA_CHECK(cudaMemcpyAsync(step_.data(), &step, sizeof step, cudaMemcpyHostToDevice, stream_));
    PVM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    host_step_ = step;
}

// The squared errors summed per output since the last call (output_deltas adds each measured step's), then
// per unit and per (layer, half) here: two launches when the metrics are asked for, not every step (at
// 16 sequences they were 11-13 us of a 250 us step).
MetricSums CudaEngine::take_metric_sums() {
    PVM_CUDA_CHECK(cudaSetDevice(device_));
    const kernels::StepArgs a = step_args();
    kernels::unit_errors<<<static_cast<unsigned>(topo_.n_units), kernels::kThreads, 0, stream_>>>(a);
    PVM_CUDA_CHECK_LAUNCH();
    kernels::accumulate_metrics<<<static_cast<unsigned>(2 * topo_.n_layers), kernels::kWarp, 0, stream_>>>(a);
    PVM_CUDA_CHECK_LAUNCH();
    MetricSums out;
    out.errors.resize(metric_sums_.size());
    PVM_CUDA_CHECK(cudaMemcpyAsync(out.errors.data(), metric_sums_.data(), metric_sums_.bytes(), cudaMemcpyDeviceToHost,
                                   stream_));
    PVM_CUDA_CHECK(cudaMemcpyAsync(out.baseline.data(), baseline_sums_.data(), baseline_sums_.bytes(),
                                   cudaMemcpyDeviceToHost, stream_));
    PVM_CUDA_CHECK(cudaMemcpyAsync(&out.steps, metric_steps_.data(), sizeof(int64_t), cudaMemcpyDeviceToHost, stream_));
    metric_sums_.fill_async(0, stream_);
    baseline_sums_.fill_async(0, stream_);
    metric_steps_.fill_async(0, stream_);
    error_sq_.fill_async(0, stream_);
    baseline_sq_.fill_async(0, stream_);
    PVM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return out;
}

}  // namespace pvm
