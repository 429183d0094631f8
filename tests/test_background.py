"""The background baseline (a running mean of past frames) against a plain step-by-step oracle, on the
steps the engine scores, whatever path and chunking the frames take, and across a resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from background_oracle import RunningMeanBackground
from test_data_video import write_video

from pvm_dist import load_spec
from pvm_dist.data import make_source
from pvm_dist.engine.native import native_module
from pvm_dist.run.background import ALPHA, PRIME_STEPS, BackgroundBaseline
from pvm_dist.run.config import RunConfig
from pvm_dist.run.metrics import rmse_pixels
from pvm_dist.run.session import Session

BACKEND = "native" if native_module() is not None else "reference"
REL = 1e-9  # the same float64 terms, the means formed as block products instead of one step at a time


def oracle_of(frames: np.ndarray) -> RunningMeanBackground:
    oracle = RunningMeanBackground(ALPHA)
    for f in frames:
        oracle.step(f)
    return oracle


@pytest.mark.parametrize("product_bytes", [64 << 20, 8 * 75 * 3 * 2])  # 32 steps a product; 2 (large batches)
@pytest.mark.parametrize("chunks", [[1] * 40, [7, 33], [40], [2, 1, 37]])
def test_blocks_of_any_size_give_the_oracles_errors(chunks, product_bytes, monkeypatch):
    import pvm_dist.run.background as background

    monkeypatch.setattr(background, "_BLOCK_BYTES", product_bytes)
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 256, (40, 3, 5, 5, 3), dtype=np.uint8)
    bg, step = BackgroundBaseline(), 0
    for k in chunks:
        bg.update(step, frames[step : step + k])
        step += k
    got = bg.take()
    want = oracle_of(frames).mean_between(0, 40)
    assert bg.take()["two_step"] != bg.take()["two_step"]  # taken: nothing left (NaN)
    assert got["two_step"] == pytest.approx(want[0], rel=REL) and got["one_step"] == pytest.approx(want[1], rel=REL)


def test_a_resume_primed_from_past_frames_continues_the_unbroken_mean():
    rng = np.random.default_rng(2)
    frames = rng.integers(0, 256, (PRIME_STEPS + 90, 1, 4, 4, 3), dtype=np.uint8)
    r = PRIME_STEPS + 50  # more steps than the prime reads back
    resumed = BackgroundBaseline()
    resumed.update(r - PRIME_STEPS, frames[r - PRIME_STEPS : r])
    resumed.take()
    resumed.update(r, frames[r:])
    want = oracle_of(frames).mean_between(r, len(frames))
    got = resumed.take()
    assert got["two_step"] == pytest.approx(want[0], rel=1e-7) and got["one_step"] == pytest.approx(want[1], rel=1e-7)


def session_metrics(config: RunConfig, stops: list[int], state=None) -> tuple[list[dict], Session]:
    session = Session(config, state)
    out = []
    for stop in stops:
        session.advance(stop - session.step)
        out.append(session.take_metrics())
    return out, session


@pytest.mark.parametrize("data", ["synthetic:bar", "clip"])
def test_the_session_logs_the_oracles_background_on_the_engines_steps(tmp_path: Path, data: str):
    """Host blocks (synthetic) and a dataset held by the engine (a clip) alike; metrics taken mid-run and
    after a resume cover exactly the steps s ≥ 2 that the engine scores."""
    if data == "clip":
        data = str(write_video(tmp_path / "clip.avi", n=23))
    spec = load_spec("tiny").with_overrides({"delay_each_layer_learning": 3})
    config = RunConfig(spec=spec, data=data, n_seq=2, backend=BACKEND, device="cpu" if BACKEND == "native" else None,
                       readout=False, animation_frames=0, steps=60)
    frames = make_source(data, spec.image_shape, 2, 0).frames_block(0, 60)
    oracle = oracle_of(frames)
    (first, second), session = session_metrics(config, [25, 60])
    (resumed,), _ = session_metrics(config, [60], state=_state_at(config, 25))
    for got, (a, b) in ((first, (0, 25)), (second, (25, 60)), (resumed, (25, 60))):
        two, one = oracle.mean_between(a, b)
        assert got["background_two_step_px"] == pytest.approx(rmse_pixels(two), rel=REL)
        assert got["background_one_step_px"] == pytest.approx(rmse_pixels(one), rel=REL)
        assert got["ratio_background_two_step"] == pytest.approx(got["layer0_mse_two_step"] / two, rel=REL)


def _state_at(config: RunConfig, step: int):
    session = Session(config)
    session.advance(step)
    session.take_metrics()  # as the unbroken run did there: the state then carries no interval under way
    return session.state()


def test_the_background_beats_copy_last_on_the_bar_and_not_on_balls():
    """Why it is there: on synthetic:bar (a bar moving more than its width per step over a blank frame)
    predicting the background beats copying the last frame, so beating copy-last alone proves little."""
    spec = load_spec("tiny")
    base = dict(spec=spec, n_seq=1, backend=BACKEND, readout=False, animation_frames=0, steps=200)
    (bar,), _ = session_metrics(RunConfig(data="synthetic:bar", **base), [200])
    (balls,), _ = session_metrics(RunConfig(data="synthetic:balls", **base), [200])
    assert bar["background_two_step_px"] < 0.8 * bar["baseline_two_step_px"]
    assert balls["background_two_step_px"] > balls["baseline_two_step_px"]
