"""The frame feed (run/feed.py) against stepping the same frames one by one.

On a GPU the drawn balls go through a ring of two blocks that the engine trains on while the next block is drawn;
a small ring (RING_BYTES patched) makes the runs below wrap it several times, in calls that end mid-block."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import STEPPED_STATE

from pvm_dist import build_engine, load_spec
from pvm_dist.data import make_source
from pvm_dist.engine.native import build_info, native_module
from pvm_dist.run import feed as feed_module
from pvm_dist.run.feed import FrameFeed


def _fed_and_stepped(spec, n_seq, device, runs, observe=None):
    source = make_source("synthetic:balls", spec.image_shape, n_seq, seed=3)
    fed = build_engine(spec, backend="native", n_seq=n_seq, device=device)
    feed = FrameFeed(fed, source, observe=observe)
    for k in runs:
        feed.run(k)
    stepped = build_engine(spec, backend="native", n_seq=n_seq, device=device)
    for s in range(sum(runs)):
        stepped.step(source.frames(s))
    return feed, fed.state(), stepped.state(), source


def test_host_feed_equals_stepping():
    if native_module() is None:
        pytest.skip("the native module is not built")
    spec = load_spec("tiny").with_overrides({"delay_each_layer_learning": 2})
    feed, fed, stepped, _ = _fed_and_stepped(spec, 2, "cpu", [1, 7, 3])
    assert not feed.on_device
    for key in STEPPED_STATE:
        assert np.array_equal(fed[key], stepped[key]), key


@pytest.mark.gpu
def test_drawn_ring_equals_stepping(monkeypatch):
    pytest.importorskip("cupy")
    if native_module() is None or not build_info().get("devices"):
        pytest.skip("no CUDA engine")
    spec = load_spec("tiny").with_overrides({"delay_each_layer_learning": 2})
    n_seq = 3
    frame_bytes = n_seq * int(np.prod(spec.image_shape))
    monkeypatch.setattr(feed_module, "RING_BYTES", 2 * 4 * frame_bytes)  # blocks of 4 steps, a ring of 8
    seen: list[tuple[int, int]] = []
    runs = [1, 6, 4, 9, 2, 13]  # 35 steps: the ring wraps four times, calls end mid-block
    feed, fed, stepped, source = _fed_and_stepped(spec, n_seq, "cuda", runs,
                                                  observe=lambda first, frames: seen.append((first, len(frames))))
    assert feed.on_device and feed.block == 4 and len(feed._ring) == 8
    for key in STEPPED_STATE:
        assert np.array_equal(fed[key], stepped[key]), key
    covered = [s for first, n in seen for s in range(first, first + n)]
    assert covered == list(range(sum(runs)))  # every step's frames observed once, in order
    assert np.array_equal(feed.last_frame(1), source.frames(sum(runs) - 1)[1])
