"""A few steps of the CUDA engine in every fused-pass bucket and in feed-context mode, for compute-sanitizer (the
shared-memory staging of w1_stream_pass (one and two sequences), weight_pass_mma, w0_span_pass (tiny at
8-16, 33-64), weight_pass_short, mma_product and wgmma_product (an sm_90a build), the hidden deltas' partial sums),
also in the opt-in precisions:
    compute-sanitizer --tool racecheck python3 -P dev/cuda/racecheck.py [n_seq ...]
(with sequence counts: only those cases). tiny's blocks in the span and stream passes walk too few chunks to reuse a
stage; the workbenches (dev/cuda/weight_pass_mma.cu, w1_pass.cu) run those passes on small.json's shapes, where
they do."""
import sys

import numpy as np

from pvm_dist import build_engine, load_spec

for n_seq, feed, precision in ((1, False, "fp32"), (2, False, "fp32"), (3, False, "fp32"), (8, False, "fp32"), (13, False, "fp32"),
                              (16, False, "fp32"), (17, False, "fp32"), (33, False, "fp32"), (64, False, "fp32"), (100, False, "fp32"), (3, True, "fp32"),
                              (9, True, "fp32"), (17, False, "tf32"), (100, False, "tf32"), (17, False, "bf16"), (100, False, "bf16")):
    if len(sys.argv) > 1 and str(n_seq) not in sys.argv[1:]:
        continue
    spec = load_spec("tiny").with_overrides({"delay_each_layer_learning": 1, "feed_context_in_complex_layer": "1" if feed else "0",
                                            "precision": precision})
    eng = build_engine(spec, backend="native", n_seq=n_seq, device="cuda")
    rng = np.random.default_rng(n_seq)
    for _ in range(4):
        eng.step(rng.integers(0, 256, size=(n_seq, *spec.image_shape), dtype=np.uint8))
    print(f"n_seq {n_seq}{' feed-context' if feed else ''} {precision}: 4 steps")
