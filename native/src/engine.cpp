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

}  // namespace pvm
