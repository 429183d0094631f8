// Builds the engine for a device string: "cpu", "cuda" or "cuda:N".
#pragma once

#include <memory>
#include <string>

#include "pvm/engine.h"

namespace pvm {

std::unique_ptr<Engine> make_engine(Topology topo, EngineConfig cfg, const std::string& device);

}  // namespace pvm
