"""A few steps of the CUDA engine in every fused-pass bucket and in feed-context mode, for
compute-sanitizer (the shared-memory staging of weight_pass_multi, weight_pass_mma, mma_product and wgmma_product (an sm_90a build), the hidden
deltas' partial sums):
    compute-sanitizer --tool racecheck python3 -P dev/cuda/racecheck.py"""
import numpy as np

from pvm_dist import build_engine, load_spec

for n_seq, feed in ((2, False), (3, False), (8, False), (13, False), (16, False), (17, False), (33, False), (64, False), (100, False),
                   (3, True), (9, True)):
    spec = load_spec("tiny").with_overrides({"delay_each_layer_learning": 1, "feed_context_in_complex_layer": "1" if feed else "0"})
    eng = build_engine(spec, backend="native", n_seq=n_seq, device="cuda")
    rng = np.random.default_rng(n_seq)
    for _ in range(4):
        eng.step(rng.integers(0, 256, size=(n_seq, *spec.image_shape), dtype=np.uint8))
    print(f"n_seq {n_seq}{' feed-context' if feed else ''}: 4 steps")
