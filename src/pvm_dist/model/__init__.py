"""The model: typed specs, the graph built from them, the learning-rate schedule, the original's
float32 numerics and the supervised heatmap readout. Depends on nothing else in pvm_dist."""
