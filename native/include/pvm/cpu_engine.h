// The native engine on the CPU: the same per-element math as the CUDA kernels (pvm/numerics.h),
// units in parallel with OpenMP where available. Each unit's work has a fixed order, so runs are
// bit-identical whatever the thread count.
#pragma once

#include "pvm/engine.h"

namespace pvm {

class CpuEngine final : public Engine {
public:
    CpuEngine(Topology topo, EngineConfig cfg);

    void step_u8(const uint8_t* frames) override;
    void step_f32(const float* frames) override;
    void read(const std::string& name, float* out) override;
    void write(const std::string& name, const float* in) override;
    int64_t step_index() override { return step_; }
    void set_step_index(int64_t step) override { step_ = step; }
    MetricSums take_metric_sums() override;
    std::string device_name() const override { return "cpu"; }
    std::vector<std::pair<std::string, double>> profile_step_u8(const uint8_t* frames) override;

private:
    template <class Pixel>
    void step(const Pixel* frames);
    template <class Pixel>
    void assemble_inputs(const Pixel* frames, int cur, int prev);
    void forward(int cur);
    void learn(int cur, int old);
    std::vector<float>& buffer(const std::string& name);

    float* x(int slot, int64_t seq) { return x_.data() + (slot * cfg_.n_seq + seq) * topo_.x_total; }
    float* h(int slot, int64_t seq) { return h_.data() + (slot * cfg_.n_seq + seq) * topo_.h_total; }
    float* y(int slot, int64_t seq) { return y_.data() + (slot * cfg_.n_seq + seq) * topo_.y_total; }

    std::vector<float> weights_, velocity_, x_, h_, y_, unit_lr_, unit_mu_;
    std::vector<float> delta_out_;  // [n_seq, y_total] scratch
    MetricSums metrics_;
    int64_t step_ = 0;
};

}  // namespace pvm
