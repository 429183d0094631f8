// The PVM graph as the engines see it: flat offsets and gather maps, built once in Python
// (pvm_dist/topology.py, Topology.native_arrays) and copied here unchanged. The engines never
// re-derive the graph.
#pragma once

#include <cstdint>
#include <vector>

namespace pvm {

// Where input entry i of step s comes from (Topology.X_FROM_* in Python).
enum XSource : int8_t { FromFrame = 0, FromHidden = 1, FromPrevious = 2, Bias = 3 };

struct Topology {
    int64_t n_units = 0, hidden = 0, n_layers = 0;
    int64_t image_size = 0;  // D*D*C
    int64_t x_total = 0;     // sum(N+1): one sequence's input vectors
    int64_t y_total = 0;     // sum(M): one sequence's outputs
    int64_t h_total = 0;     // sum(K): hidden segments (H activations, bias 1, raw context)
    int64_t n_weights = 0;
    // Per unit (size n_units + 1 for offsets): flat starts of x, y, h, W0 and W1.
    std::vector<int64_t> x_off, y_off, h_off, w0_off, w1_off, unit_layer;
    // Per input entry: its source kind and index (frame pixel, hidden entry, previous input entry).
    std::vector<int8_t> x_kind;
    std::vector<int64_t> x_src;
    std::vector<int64_t> h_bias;                            // hidden entries that hold the constant 1
    std::vector<int64_t> raw_context_dst, raw_context_src;  // feed-context mode (§3.10)
    std::vector<int64_t> target_src;                        // per output: the input entry it predicts
    std::vector<int32_t> y_bin;                             // per output: layer*2 + half, for metrics
    std::vector<int32_t> y_unit;                            // per output: its unit
    std::vector<int64_t> baseline_src;                      // per output: copy-last-frame's x(s-2) entry (layer 0), else -1

    int64_t inputs(int64_t u) const { return x_off[u + 1] - x_off[u]; }   // N+1
    int64_t outputs(int64_t u) const { return y_off[u + 1] - y_off[u]; }  // M
    int64_t hidden_len(int64_t u) const { return h_off[u + 1] - h_off[u]; }  // K
    int64_t metric_bins() const { return 2 * n_layers; }
};

// What changes the arithmetic but not the graph.
struct EngineConfig {
    bool polynomial = true;
    int derivative = 0;  // pvm::Derivative
    int precision = 0;   // pvm::Precision: the CUDA engine's tensor-core arithmetic
    bool opt_abs_diff = false;
    int64_t n_seq = 1;
};

}  // namespace pvm
