"""Run STEPS training steps of SPEC at N_SEQ on the GPU from a device-resident dataset (the workload
benchmarks/profile_gpu.sh traces with Nsight Compute).  python3 profile_step.py small 1 40"""

import sys

import numpy as np

import pvm_dist

name, n_seq, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
spec = pvm_dist.load_spec(name).with_overrides({"delay_each_layer_learning": 1})  # every layer learning
engine = pvm_dist.build_engine(spec, backend="native", n_seq=n_seq, seed=0, device="cuda")
frames = np.random.default_rng(0).integers(0, 256, (8, n_seq, *spec.image_shape), dtype=np.uint8)
engine.set_dataset(frames)
engine.run_dataset(steps)
engine.metrics()
