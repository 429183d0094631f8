"""Prediction-error metrics, the copy-last-frame baseline, and frozen (evaluation) engines."""

from __future__ import annotations

import numpy as np
import pytest
from baseline_oracle import CopyLastFrameBaseline
from conftest import random_frames

from pvm_dist import build_engine, load_spec
from pvm_dist.engine.native import native_module
from pvm_dist.run.metrics import rmse_pixels, summarize

BACKENDS = ["reference"] + (["native"] if native_module() is not None else [])


def test_baseline_matches_hand_computation():
    frames = [np.full((1, 2, 2, 1), v, np.uint8) for v in (0, 51, 255, 102)]
    base = CopyLastFrameBaseline()
    for f in frames:
        base.update(f)
    c = [np.float32(np.float32(v / np.float32(255)) * np.float32(0.8)) + np.float32(0.1) for v in (0, 51, 255, 102)]
    c = [float(np.float32(v)) for v in c]
    # steps 2 and 3: two-step copies frame s−2 for frame s; one-step copies s−2 for s−1.
    two = ((c[2] - c[0]) ** 2 + (c[3] - c[1]) ** 2) / 2
    one = ((c[1] - c[0]) ** 2 + (c[2] - c[1]) ** 2) / 2
    got = base.take()
    assert got["two_step"] == pytest.approx(two, rel=1e-6) and got["one_step"] == pytest.approx(one, rel=1e-6)
    assert np.isnan(base.take()["two_step"])  # reset after take
    assert rmse_pixels(0.8**2 / 255**2 * 9) == pytest.approx(3.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_summary_names_and_ratio(backend):
    spec = load_spec("tiny")
    eng = build_engine(spec, backend=backend)
    for f in random_frames(spec, 20):
        eng.step(f)
    m = summarize(eng.metrics())
    assert {"l0_two_step_px", "baseline_two_step_px", "ratio_two_step", "layer2_mse_one_step"} <= m.keys()
    assert m["ratio_two_step"] == pytest.approx((m["l0_two_step_px"] / m["baseline_two_step_px"]) ** 2, rel=1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_frozen_engine_measures_without_learning(backend):
    spec = load_spec("tiny").with_overrides({"delay_each_layer_learning": 2})
    frames = random_frames(spec, 30)
    eng = build_engine(spec, backend=backend)
    eng.run(10, iter(frames[:10]))
    eng.freeze()
    w = eng.weights.copy()
    eng.run(20, iter(frames[10:]))  # crosses schedule steps: they must not re-enable learning
    assert np.array_equal(eng.weights, w)
    assert not eng.unit_lr.any() and eng.metrics()["steps"] == 28
