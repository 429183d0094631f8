// The engine interface both native backends implement. State lives in named flat float32 buffers
// whose layouts are those of the reference engine (architecture.md §2): weights and momentum in the
// flat W0-then-W1 layout; rings [3, n_seq, total]; per-unit learning rate and momentum.
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "pvm/topology.h"

namespace pvm {

// Sums of squared errors since the last take_metric_sums, over the measured steps (s >= 2).
struct MetricSums {
    std::vector<double> errors;           // per (layer, half): the model's predictions
    std::array<double, 2> baseline{};     // two-step, one-step: copying the frame of step s-2 (layer 0)
    int64_t steps = 0;
};

class Engine {
public:
    virtual ~Engine() = default;

    // One training step on frames [n_seq, D, D, C], host memory, uint8 BGR or float32 in [0,1].
    virtual void step_u8(const uint8_t* frames) = 0;
    virtual void step_f32(const float* frames) = 0;

    // Copy a named buffer out of / into the engine (host memory, exact size of buffer_size(name)).
    virtual void read(const std::string& name, float* out) = 0;
    virtual void write(const std::string& name, const float* in) = 0;
    int64_t buffer_size(const std::string& name) const;

    virtual int64_t step_index() = 0;
    virtual void set_step_index(int64_t step) = 0;

    // The metric sums since the last call; resets them.
    virtual MetricSums take_metric_sums() = 0;

    virtual std::string device_name() const = 0;

    // Whether a step's kernels launch as programmatic dependents of each other (the CUDA engine on sm_90+
    // with CUDA 12.3+, up to 16 sequences, unless PVM_CUDA_CHAIN=0; =all: every n_seq).
    virtual bool chained_launches() const { return false; }

    // Whether per-unit products run on wgmma (the CUDA engine from 9 sequences, built for sm_90a, on compute
    // capability 9.0, unless PVM_CUDA_WGMMA=0).
    virtual bool wgmma_products() const { return false; }

    // Wait until queued work is done (a no-op on the CPU).
    virtual void synchronize() {}

    // One step with a device timer around each phase: (phase, milliseconds). CPU: host timers.
    virtual std::vector<std::pair<std::string, double>> profile_step_u8(const uint8_t* frames) = 0;

    // A dataset the engine holds: n_frames blocks of [n_seq, D, D, C] uint8 (on the device for CUDA).
    // run_dataset(n) trains n steps; step s reads block (s - first_step) mod n_frames, so no frame
    // crosses from the host per step. The rates stay as they are: the caller splits runs at schedule events.
    virtual void set_dataset_u8(const uint8_t* host_frames, int64_t n_frames, int64_t first_step);
    // The same with frames already in this engine's device memory (e.g. a CuPy array), used in place.
    virtual void set_dataset_device_u8(uintptr_t device_frames, int64_t n_frames, int64_t first_step);
    virtual void run_dataset(int64_t n_steps);
    int64_t dataset_frames() const { return dataset_frames_; }

    // Device address of a state buffer, or of "error" (the last step's output errors [n_seq, y_total], rebuilt
    // from the rings by this call on the engine's stream); CUDA only.
    virtual uintptr_t device_pointer(const std::string& name);

    const Topology& topology() const { return topo_; }
    const EngineConfig& config() const { return cfg_; }

protected:
    Engine(Topology topo, EngineConfig cfg) : topo_(std::move(topo)), cfg_(cfg) {}
    int64_t frame_block() const { return cfg_.n_seq * topo_.image_size; }  // bytes of one step's frames
    int64_t dataset_block(int64_t step) const;  // the dataset block step `step` reads
    Topology topo_;
    EngineConfig cfg_;
    std::vector<uint8_t> host_dataset_;  // the CPU engine's dataset
    int64_t dataset_frames_ = 0;
    int64_t dataset_first_ = 0;
};

// The named state buffer of an engine, whatever its buffer type (host vector, device array).
template <class Buffer>
Buffer& select_buffer(const std::string& name, Buffer& weights, Buffer& momentum, Buffer& x_ring, Buffer& h_ring,
                      Buffer& y_ring, Buffer& unit_lr, Buffer& unit_mu) {
    if (name == "weights") return weights;
    if (name == "momentum") return momentum;
    if (name == "x_ring") return x_ring;
    if (name == "h_ring") return h_ring;
    if (name == "y_ring") return y_ring;
    if (name == "unit_learning_rate") return unit_lr;
    if (name == "unit_momentum") return unit_mu;
    throw std::invalid_argument("unknown engine buffer '" + name + "'");
}

// Buffer names, shared with the Python wrapper.
inline const std::vector<std::string>& buffer_names() {
    static const std::vector<std::string> names = {"weights", "momentum", "x_ring", "h_ring", "y_ring",
                                                   "unit_learning_rate", "unit_momentum"};
    return names;
}

}  // namespace pvm
