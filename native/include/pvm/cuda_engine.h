// The native engine on one CUDA GPU. One step is a handful of kernels (up to 64 sequences: assemble
// inputs, output deltas, hidden deltas, metrics, the fused W0 pass, the fused W1 pass, advance the
// step counter; more sequences: matrix products on tensor cores in place of the passes), captured
// once as a CUDA graph and replayed. The step counter and the per-unit rates live in device memory
// and are read by the kernels, so replaying the graph never freezes them.
#pragma once

#if !PVM_WITH_CUDA
#error "pvm/cuda_engine.h is only for CUDA builds"
#endif

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "pvm/device_buffer.h"
#include "pvm/engine.h"
#include "pvm/numerics.h"

namespace pvm {

class CudaGraph;
namespace kernels {
struct StepArgs;
struct StepLaunch;
}

class CudaEngine final : public Engine {
public:
    CudaEngine(Topology topo, EngineConfig cfg, int device);
    ~CudaEngine() override;

    void step_u8(const uint8_t* frames) override;
    void step_f32(const float* frames) override;
    void read(const std::string& name, float* out) override;
    void write(const std::string& name, const float* in) override;
    int64_t step_index() override { return host_step_; }
    void set_step_index(int64_t step) override;
    MetricSums take_metric_sums() override;
    std::string device_name() const override { return name_; }
    bool chained_launches() const override;
    bool wgmma_products() const override;
    void synchronize() override;
    std::vector<std::pair<std::string, double>> profile_step_u8(const uint8_t* frames) override;
    void set_dataset_u8(const uint8_t* host_frames, int64_t n_frames, int64_t first_step) override;
    void set_dataset_device_u8(uintptr_t device_frames, int64_t n_frames, int64_t first_step) override;
    void run_dataset(int64_t n_steps) override;
    uintptr_t device_pointer(const std::string& name) override;

private:
    template <class Pixel>
    void step(const Pixel* frames);
    // Enqueue one step's kernels; mark(phase) is called after each phase (for profiling). With n_frames
    // > 0, d_frames is a device dataset of n_frames blocks of n_seq frames and the step reads block
    // (step - first) mod n_frames in place.
    template <class Pixel, class Mark>
    void enqueue_step(const Pixel* d_frames, Mark&& mark, int64_t n_frames = 0, int64_t first = 0);
    // The tensor-core work of a step in precision P (EngineConfig::precision).
    template <Precision P, class Mark>
    void enqueue_products(const kernels::StepArgs& a, const kernels::StepLaunch& launch, Mark& mark);
    kernels::StepArgs step_args();
    template <Precision P, class Mark>
    void enqueue_mma_passes(const kernels::StepArgs& a, const kernels::StepLaunch& launch, Mark& mark);
    void launch_short_w1(const kernels::StepArgs& a, const kernels::StepLaunch& launch);
    void launch_stream_w1(const kernels::StepArgs& a, const kernels::StepLaunch& launch);
    // W0's pass on tensor cores (2 to 64 sequences), in precision P.
    template <Precision P>
    void launch_w0_pass(const kernels::StepArgs& a, const kernels::StepLaunch& launch);
    // A step's deltas: the output deltas, then the hidden deltas (hidden_deltas below kHiddenProductSeqs sequences,
    // which at 1-2 computes the output deltas itself; then hidden_deltas_split or the product, in precision P).
    template <Precision P>
    void launch_deltas(const kernels::StepArgs& a, const kernels::StepLaunch& launch);
    template <class Pixel>
    Pixel* upload_frames(const Pixel* frames);
    DeviceBuffer<float>& buffer(const std::string& name);
    void check_memory() const;
    // Whether a row of the x ring holds the step's sources rather than x (from kBuiltInputsMinSeqs sequences;
    // input_layout in cuda_engine.cu), and x in the reference layout from them (into out, on the stream).
    bool built_inputs() const;
    void materialise_x(float* out);
    // W or V between the device's layout (W0's rows pitched, kernels::w0_pitch, or in column tiles: w0_tiled_)
    // and the host's packed one, on the stream.
    void pack_weights(const DeviceBuffer<float>& on_device, float* packed);
    void unpack_weights(const float* packed, DeviceBuffer<float>& on_device);

    int device_;
    std::string name_;
    cudaStream_t stream_ = nullptr;
    // A step's kernels as programmatic dependents of each other (dependent_launch.cuh; up to 8
    // sequences): on sm_90 and later with CUDA 12.3 or later, unless the environment sets
    // PVM_CUDA_CHAIN=0 (to compare, or to rule it out).
    bool chain_ = false;
    bool chain_all_ = false;  // PVM_CUDA_CHAIN=all: chained at every n_seq, not only up to kChainMaxSeqs (A/Bs)
    bool wgmma_ = false;  // products on wgmma where measured ahead (from kProductSeqs, sm_90a build, capability 9.0, FP32 precision)

    // Topology on the device.
    // w0_off_, w1_off_: the device's offsets (W0's rows pitched or tiled); w0_packed_off_: the host's (Topology::w0_off).
    DeviceBuffer<int64_t> x_off_, y_off_, h_off_, w0_off_, w1_off_, w0_packed_off_, h_bias_, raw_dst_, raw_src_, target_src_,
        baseline_src_;
    bool w0_tiled_ = false;           // W0 in column tiles (kernels::w0_at): where weight_pass_mma runs its pass
    int64_t device_weights_ = 0;      // floats of W (and of V) on the device
    int64_t x_stride_ = 0;            // floats per row of the x ring (InputLayout)
    DeviceBuffer<int32_t> x_gather_;  // per row entry: source | kind << kGatherKindShift
    DeviceBuffer<int32_t> x_index_;   // built_inputs: per input entry, its place in a row (else empty)
    std::vector<int32_t> x_index_host_;
    DeviceBuffer<int32_t> y_unit_;
    // hidden_deltas' units, most outputs first (1-4 sequences; empty: the topology's order).
    DeviceBuffer<int32_t> unit_order_;
    DeviceBuffer<int64_t> layer_unit_range_;  // first unit of every layer, then n_units
    // Tiles of the many-sequence products (unit_products.cuh): (unit, first m, first n), longest sums first.
    DeviceBuffer<int32_t> w0_forward_, w1_forward_, hidden_deltas_, w0_update_, w1_update_;
    // Blocks of the tensor-core passes for 2..64 sequences (weight_pass_mma): (unit, first row, end row). W0's pass
    // on w0_span_pass instead: its segments (kernels::SpanSegment, 8 words each), and per block its first
    // (w0_span_first_, empty where weight_pass_mma runs).
    DeviceBuffer<int32_t> w0_rows_, w1_rows_, w0_span_first_;
    DeviceBuffer<int64_t> w0_spans_;
    // W1's pass on weight_pass_short (short_rows_pass.cuh) where its rows are short, 2 to kMmaW1MaxSeqs sequences:
    // the tiles' records, and the resident blocks that walk them (0: weight_pass_mma's pass).
    // Up to kStreamMaxSeqs sequences on sm_90 instead, the same records in tiles of kStreamRows walked by w1_stream_pass's
    // w1_stream_blocks_ resident blocks (0: the other passes).
    DeviceBuffer<int64_t> w1_tiles_;
    int w1_short_blocks_ = 0, w1_stream_blocks_ = 0;
    int hd_threads_ = 256;        // the block of hidden_deltas (1-4 sequences; kernels::hd_threads)
    bool hd_own_deltas_ = false;  // hidden_deltas computes the output deltas (no output_deltas launch; 1-2 sequences)
    // The hidden deltas of kHiddenProductSeqs to kSplitMaxSeqs sequences on hidden_deltas_split (W1's rows short, at most
    // kSplitRows hidden rows), else as the product (hidden_deltas_'s tiles).
    bool split_hidden_deltas_ = false;
    bool split_own_deltas_ = false;  // hidden_deltas_split computes the output deltas (PVM_CUDA_SPLIT_OWN=1)
    // Experiment (PVM_CUDA_FMA, letters f, u, h, w; FP32 precision, from kFmaMinSeqs sequences): the W1 forward, the W1
    // update, the hidden deltas or the W0 update (above kMmaMaxSeqs) in plain FP32 FMAs (fma_product.cuh). 0: the
    // default kernels; 1 or 2: the product's first or second FMA shape (lower or upper case letter).
    int fma_w1_forward_ = 0, fma_w1_update_ = 0, fma_hidden_ = 0, fma_w0_update_ = 0;

    // State.
    DeviceBuffer<float> weights_, velocity_, x_, h_, y_, unit_lr_, unit_mu_;
    DeviceBuffer<float> lr_delta_out_, lr_delta_hidden_, error_;
    DeviceBuffer<float> x_view_;  // built_inputs: device_pointer("x_ring")'s x, allocated when first asked for
    DeviceBuffer<float> weights_view_, momentum_view_;  // device_pointer's packed copies, allocated when first asked for
    DeviceBuffer<float> mma_partial_;   // weight_pass_mma: the forward sums of split runs, per part
    DeviceBuffer<int32_t> mma_count_;   // weight_pass_mma: per run, its blocks done this step
    DeviceBuffer<double> metric_sums_, unit_error_, error_sq_;
    DeviceBuffer<double> baseline_sums_, unit_baseline_, baseline_sq_;  // the copy-last-frame baseline (layer 0)
    DeviceBuffer<int64_t> step_, metric_steps_;
    int64_t host_step_ = 0;

    // Frames: double-buffered pinned staging on the host, one device buffer the graph reads.
    DeviceBuffer<uint8_t> frames_u8_;
    DeviceBuffer<float> frames_f32_;
    void* pinned_[2] = {nullptr, nullptr};
    cudaEvent_t pinned_free_[2] = {nullptr, nullptr};
    int pinned_next_ = 0;

    CudaGraph* graph_u8_ = nullptr;
    CudaGraph* graph_f32_ = nullptr;

    // Device-resident dataset: the step's graph first copies block (step - first) mod n from it.
    DeviceBuffer<uint8_t> dataset_owned_;  // set_dataset_u8's copy (empty for an external one)
    const uint8_t* dataset_ = nullptr;
    CudaGraph* graph_dataset_ = nullptr;
    void use_dataset(const uint8_t* frames, int64_t n_frames, int64_t first_step);
};

}  // namespace pvm
