"""Synthetic sources: the moving balls (determinism, random access, exact labels), bar and noise."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pvm_dist.data import DataError, FrameSource, make_source
from pvm_dist.data.balls import TARGET_COLOR, BallSource
from pvm_dist.data.synthetic import BarSource, NoiseSource

SHAPE = (60, 60, 3)


def green_pixels(frame: np.ndarray) -> np.ndarray:
    return (frame == np.array(TARGET_COLOR, np.uint8)).all(axis=-1)


def test_balls_is_deterministic_and_random_access():
    a = make_source("synthetic:balls", SHAPE, 3, seed=5)
    b = make_source("synthetic:balls", SHAPE, 3, seed=5)
    assert isinstance(a, FrameSource) and a.name == "synthetic:balls"
    seq = [a.frames(t) for t in range(40)]
    for t in [39, 0, 17, 3, 17]:  # any order, any repeat: same frames as the sequential pass
        assert np.array_equal(b.frames(t), seq[t])
        assert np.array_equal(b.boxes(t), a.boxes(t))
    assert seq[0].dtype == np.uint8 and seq[0].shape == (3, *SHAPE)
    assert not np.array_equal(seq[0], seq[1]), "the scene moves"
    assert not np.array_equal(seq[0][0], seq[0][1]), "streams are different scenes"
    other = make_source("synthetic:balls", SHAPE, 3, seed=6)
    assert not np.array_equal(other.frames(0), seq[0]), "the seed changes the scenes"
    far = 10**9 + 7  # closed form: a huge step costs nothing and is still valid
    assert a.frames(far).shape == (3, *SHAPE) and (a.boxes(far) >= 0).all()


def test_balls_label_is_where_the_green_ball_is_drawn():
    src = BallSource(SHAPE, n_seq=4, seed=1)
    moved = 0
    for t in range(0, 400, 7):
        frames, boxes, masks = src.frames(t), src.boxes(t), src.labels(t)
        assert boxes.shape == (4, 4) and masks.shape == (4, 60, 60) and masks.dtype == np.float32
        for i in range(4):
            g = green_pixels(frames[i])
            ys, xs = np.nonzero(g)
            x, y, w, h = boxes[i]
            # the box is exactly the green disc's extent (PVM convention: x..x+w inclusive)
            assert (xs.min(), xs.max(), ys.min(), ys.max()) == (x, x + w, y, y + h)
            assert masks[i].sum() == (w + 1) * (h + 1) and masks[i][g].min() == 1.0
            assert set(np.unique(masks[i])) <= {0.0, 1.0}
        moved += not np.array_equal(boxes, src.boxes(t + 1))
    assert moved > 40
    assert (src.cuts(0) == True).all() and not src.cuts(1).any()  # noqa: E712
    d = src.describe()
    assert d["labelled"] is True and d["kind"] == "synthetic" and d["n_seq"] == 4


def test_balls_bounce_inside_the_frame():
    src = BallSource((48, 64, 3), n_seq=2, seed=3, n_distractors=5)
    r = src.radii
    xs = np.array([src.centres(t) for t in range(3000)])  # [T, n_seq, balls, 2]
    assert (xs[..., 0] >= r).all() and (xs[..., 0] <= 63 - r).all()
    assert (xs[..., 1] >= r).all() and (xs[..., 1] <= 47 - r).all()
    # every ball touches a wall within 3000 steps (x or y): it bounces rather than sticks or leaves
    at_wall = (xs[..., 0] == r) | (xs[..., 0] == 63 - r) | (xs[..., 1] == r) | (xs[..., 1] == 47 - r)
    assert at_wall.any(axis=0).all()
    assert src.frames(11).shape == (2, 48, 64, 3)


def test_balls_grey_and_fast():
    grey = make_source("synthetic:balls", (60, 60, 1), 2, seed=0)
    assert grey.frames(3).shape == (2, 60, 60, 1)
    src = make_source("synthetic:balls", SHAPE, 1, seed=0)
    t0 = time.perf_counter()
    for t in range(2000):
        src.frames(t)
    rate = 2000 / (time.perf_counter() - t0)
    assert rate > 2500, f"{rate:.0f} frames/s"  # measured ~35,000/s; the requirement is 5,000/s


def test_bar_and_noise_keep_their_contract():
    bar = make_source("synthetic:bar", SHAPE, 2, seed=0)
    assert isinstance(bar, BarSource) and bar.labels(0) is None and bar.boxes(0) is None
    assert np.array_equal(bar.frames(3)[1], bar.frame(10))
    assert bar.cuts(0).all() and not bar.cuts(5).any()
    noise = make_source("synthetic:noise", SHAPE, 2, seed=0)
    assert isinstance(noise, NoiseSource) and np.array_equal(noise.frames(4), noise.frames(4))
    assert noise.describe()["labelled"] is False and noise.labels(1) is None


def test_unknown_synthetic_and_unknown_names():
    with pytest.raises(DataError, match="unknown data source 'synthetic:cubes'"):
        make_source("synthetic:cubes", SHAPE, 1, 0)
    with pytest.raises(DataError, match="unknown data source 'nowhere:else'"):
        make_source("nowhere:else", SHAPE, 1, 0)
    with pytest.raises(ValueError):
        make_source("synthetic:balls", (60, 60, 2), 1, 0)
