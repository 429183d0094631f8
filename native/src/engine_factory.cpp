#include "pvm/engine_factory.h"

#include <stdexcept>
#include <string>

#include "pvm/cpu_engine.h"
#include "pvm/numerics.h"
#if PVM_WITH_CUDA
#include "pvm/cuda_engine.h"
#endif

namespace pvm {

namespace {
int cuda_index(const std::string& device) {
    if (device == "cuda") return 0;
    const std::string prefix = "cuda:";
    if (device.rfind(prefix, 0) == 0 && device.size() > prefix.size()) {
        size_t used = 0;
        const int index = std::stoi(device.substr(prefix.size()), &used);
        if (used == device.size() - prefix.size() && index >= 0) return index;
    }
    throw std::invalid_argument("unknown device '" + device + "': expected 'cpu', 'cuda' or 'cuda:N'");
}
}  // namespace

std::unique_ptr<Engine> make_engine(Topology topo, EngineConfig cfg, const std::string& device) {
    if (cfg.n_seq < 1) throw std::invalid_argument("n_seq must be at least 1");
    // pvm::Precision; the CPU engine computes in FP32 in every mode.
    if (cfg.precision < 0 || cfg.precision > static_cast<int>(Precision::kBf16))
        throw std::invalid_argument("precision must be 0 (fp32), 1 (tf32) or 2 (bf16), got " + std::to_string(cfg.precision));
    if (device == "cpu") return std::make_unique<CpuEngine>(std::move(topo), cfg);
    const int index = cuda_index(device);
#if PVM_WITH_CUDA
    return std::make_unique<CudaEngine>(std::move(topo), cfg, index);
#else
    (void)index;
    throw std::invalid_argument("device '" + device + "' asked for, but this build of pvm_dist._native has no CUDA "
                                "(reinstall where nvcc is found, or use device='cpu')");
#endif
}

}  // namespace pvm
