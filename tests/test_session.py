"""The training session: whatever path frames take to the engine (a held dataset, host blocks, one step at
a time for the readout and the animation), the run is the one that stepping frame by frame gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_data_video import write_video

from pvm_dist import build_engine, load_spec
from pvm_dist.data import make_source
from pvm_dist.engine.native import native_module
from pvm_dist.run import session as session_module
from pvm_dist.run.config import RunConfig
from pvm_dist.run.session import Session

BACKENDS = ["reference"] + (["native"] if native_module() is not None else [])
SPEC = load_spec("tiny").with_overrides({"delay_each_layer_learning": 3})


def stepped(config: RunConfig, steps: int) -> dict:
    """The engine state after ``steps`` steps fed one frame batch at a time (the definition of a run)."""
    engine = build_engine(config.spec, backend=config.backend, n_seq=config.n_seq, seed=config.seed)
    source = make_source(config.data, config.spec.image_shape, config.n_seq, config.seed)
    for s in range(steps):
        engine.step(source.frames(s))
    return engine.state()


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(a[key], b[key]), key


@pytest.mark.parametrize("backend", BACKENDS)
def test_file_data_held_by_the_engine_trains_as_stepping(tmp_path: Path, backend: str):
    clip = write_video(tmp_path / "clip.avi", n=23)  # a period that no chunk or block size divides
    config = RunConfig(spec=SPEC, data=str(clip), n_seq=3, backend=backend, readout=False, animation_frames=0)
    session = Session(config)
    assert session.feed.whole == (backend == "native")
    for chunk in (7, 20, 30):  # crosses the clip's wrap and the schedule's events
        session.advance(chunk)
    assert_same(session.engine.state(), stepped(config, 57))


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunks_readout_and_animation_do_not_change_the_run(backend: str):
    config = RunConfig(spec=SPEC, steps=60, n_seq=2, backend=backend, readout_from=25, animation_frames=10)
    whole, chunked = Session(config), Session(config)
    whole.advance(60)
    for chunk in (13, 12, 1, 34):
        chunked.advance(chunk)
    assert_same(whole.engine.state(), stepped(config, 60))
    assert_same(chunked.engine.state(), whole.engine.state())
    assert_same(chunked.readout.state(), whole.readout.state())
    assert len(whole.animation) == len(chunked.animation) == 8  # the last 10 steps, paired two steps late
    metrics = whole.take_metrics()
    assert metrics["baseline_two_step_px"] > 0 and metrics["frames_per_s"] > 0


def test_a_resumed_session_continues_the_run():
    config = RunConfig(spec=SPEC, steps=40, n_seq=2, backend=BACKENDS[-1], readout_from=10, animation_frames=0)
    straight, first = Session(config), Session(config)
    straight.advance(40)
    first.advance(17)
    resumed = Session(config, first.state())
    resumed.advance(23)
    assert_same(resumed.engine.state(), straight.engine.state())
    assert_same(resumed.readout.state(), straight.readout.state())


def test_the_readout_waits_for_its_step_also_on_animation_steps():
    config = RunConfig(spec=SPEC, steps=30, backend=BACKENDS[-1], readout_from=1000, animation_frames=10)
    session = Session(config)
    untrained = session.readout.state()
    session.advance(30)
    assert len(session.animation) == 8  # the last steps went one at a time ...
    assert_same(session.readout.state(), untrained)  # ... without training the readout before readout_from


@pytest.mark.parametrize("learn", [True, False])
def test_host_steps_take_their_labels_a_bounded_block_at_a_time(monkeypatch, learn: bool):
    """An eval advances all its steps at once, and asked the source for every step's labels in one block (11.5 GB
    at 100,000 steps of 8 sequences on small); in blocks of HOST_LABEL_BYTES the run is the same."""
    config = RunConfig(spec=SPEC, steps=40, n_seq=2, backend=BACKENDS[-1], readout_from=0, animation_frames=0)
    state = None if learn else Session(config).state()
    whole = Session(config, state, learn=learn)
    whole.advance(40)
    h, w = SPEC.image_shape[:2]
    monkeypatch.setattr(session_module, "HOST_LABEL_BYTES", 7 * 2 * h * w * 4)  # 7 steps of 2 sequences
    blocked = Session(config, state, learn=learn)
    asked: list[int] = []
    labels_block = blocked.source.labels_block
    monkeypatch.setattr(blocked.source, "labels_block", lambda step, k: asked.append(k) or labels_block(step, k))
    blocked.advance(40)
    assert asked == [7] * 5 + [5]
    assert_same(blocked.engine.state(), whole.engine.state())
    assert_same(blocked.readout.state(), whole.readout.state())
    assert blocked.take_scores() == whole.take_scores()
