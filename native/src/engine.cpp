#include "pvm/engine.h"

#include <stdexcept>

namespace pvm {

int64_t Engine::buffer_size(const std::string& name) const {
    const int64_t ring = 3 * cfg_.n_seq;
    if (name == "weights" || name == "momentum") return topo_.n_weights;
    if (name == "x_ring") return ring * topo_.x_total;
    if (name == "h_ring") return ring * topo_.h_total;
    if (name == "y_ring") return ring * topo_.y_total;
    if (name == "unit_learning_rate" || name == "unit_momentum") return topo_.n_units;
    throw std::invalid_argument("unknown engine buffer '" + name + "'");
}

int64_t Engine::dataset_block(int64_t step) const {
    const int64_t i = (step - dataset_first_) % dataset_frames_;
    return i < 0 ? i + dataset_frames_ : i;
}

void Engine::set_dataset_u8(const uint8_t* host_frames, int64_t n_frames, int64_t first_step) {
    if (n_frames < 1) throw std::invalid_argument("a dataset needs at least one block of frames");
    host_dataset_.assign(host_frames, host_frames + n_frames * frame_block());
    dataset_frames_ = n_frames;
    dataset_first_ = first_step;
}

void Engine::set_dataset_device_u8(uintptr_t, int64_t, int64_t) {
    throw std::invalid_argument("a dataset in device memory needs a CUDA engine; this one runs on " + device_name());
}

void Engine::run_dataset(int64_t n_steps) {
    if (dataset_frames_ == 0) throw std::logic_error("run_dataset before set_dataset");
    for (int64_t i = 0; i < n_steps; ++i)
        step_u8(host_dataset_.data() + dataset_block(step_index()) * frame_block());
}

uintptr_t Engine::device_pointer(const std::string&) {
    throw std::invalid_argument("device pointers exist only on a CUDA engine; this one runs on " + device_name());
}

}  // namespace pvm
