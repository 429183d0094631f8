"""n_seq streams (distinct files or offsets), wrap-around and cut marks, and the bounded frame cache."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from pvm_dist.data import make_source
from pvm_dist.data.cache import CHUNK, FrameCache
from pvm_dist.data.streams import stream_starts

SHAPE = (16, 16, 3)


def folder(path: Path, n: int, tag: int) -> Path:
    """n distinct frames: frame i of folder ``tag`` has value ``tag * 50 + i`` in channel 0."""
    path.mkdir()
    for i in range(n):
        img = np.zeros((16, 16, 3), np.uint8)
        img[:, :, 0] = tag * 50 + i
        img[:, :, 1] = tag
        cv2.imwrite(str(path / f"{i:04d}.png"), img)
    return path


def ids(frames: np.ndarray) -> list[int]:
    return [int(f[0, 0, 0]) for f in frames]


def test_stream_starts():
    assert stream_starts([100], 4).tolist() == [0, 25, 50, 75]
    assert stream_starts([10], 3).tolist() == [0, 3, 6]
    assert stream_starts([5, 6, 7], 3).tolist() == [0, 5, 11]  # one file each
    assert stream_starts([5, 6, 7, 8], 2).tolist() == [0, 11]  # files 0 and 2: spread over the list
    assert stream_starts([5, 6, 7], 4).tolist() == [0, 4, 9, 13]  # fewer files than streams: offsets


def test_offsets_wrap_and_cuts(tmp_path):
    src = make_source(str(folder(tmp_path / "a", 10, 0)), SHAPE, 3, seed=0)
    assert src.describe()["stream_starts"] == [0, 3, 6]
    assert ids(src.frames(0)) == [0, 3, 6]
    assert ids(src.frames(5)) == [5, 8, 1]  # stream 2 wrapped
    cuts = np.array([src.cuts(t) for t in range(21)])
    assert cuts[0].all()
    assert [np.flatnonzero(cuts[:, i]).tolist() for i in range(3)] == [[0, 10, 20], [0, 7, 17], [0, 4, 14]]
    with pytest.raises(ValueError):
        src.frames(-1)


def test_streams_from_distinct_files(tmp_path):
    paths = [folder(tmp_path / f"f{k}", n, k) for k, n in enumerate([4, 6, 5])]
    data = ",".join(str(p) for p in paths)
    src = make_source(data, SHAPE, 3, seed=0)
    assert src.describe()["stream_starts"] == [0, 4, 10] and len(src) == 15
    assert [int(f[0, 0, 1]) for f in src.frames(0)] == [0, 1, 2]  # each stream in its own file
    assert ids(src.frames(4)) == [50, 54, 104]  # stream 0 enters file 1
    assert ids(src.frames(5)) == [51, 55, 0]  # stream 2 wraps to file 0
    assert src.cuts(4).tolist() == [True, False, False]
    assert src.cuts(5).tolist() == [False, False, True]
    assert src.describe()["kind"] == "images" and src.describe()["files"] == [str(p) for p in paths]
    two = make_source(data, SHAPE, 2, seed=0)
    assert two.describe()["stream_starts"] == [0, 4]


def test_cache_eviction_keeps_frames_identical(tmp_path):
    path = str(folder(tmp_path / "long", 150, 0))
    chunk_bytes = CHUNK * 16 * 16 * 3
    big = make_source(path, SHAPE, 4, seed=0)
    small = make_source(path, SHAPE, 4, seed=0, cache_bytes=2 * chunk_bytes)
    rng = np.random.default_rng(0)
    for t in list(range(60)) + rng.integers(0, 1000, 60).tolist():
        assert np.array_equal(small.frames(t), big.frames(t))
    st = small.cache.stats()
    assert st["evictions"] > 10 and st["bytes"] <= 2 * chunk_bytes and st["chunks"] <= 2
    assert big.cache.stats()["evictions"] == 0


def test_blocks_equal_the_steps_and_fill_out(tmp_path):
    paths = [folder(tmp_path / f"f{k}", n, k) for k, n in enumerate([40, 6, 35])]
    src = make_source(",".join(str(p) for p in paths), SHAPE, 5, seed=0)
    block = src.frames_block(3, 90)  # crosses chunk and file boundaries and wraps (81 frames)
    assert block.shape == (90, 5, *SHAPE) and block.dtype == np.uint8
    assert all(np.array_equal(block[i], src.frames(3 + i)) for i in range(90))
    assert [ids(block[i]) for i in (0, 37)] == [ids(src.frames(3)), ids(src.frames(40))]
    out = np.zeros((4, 5, *SHAPE), np.uint8)
    assert src.frames_block(7, 4, out=out) is out and np.array_equal(out, block[4:8])
    assert src.labels_block(0, 3) is None and src.boxes_block(0, 3) is None and src.device_renderable is False
    with pytest.raises(ValueError, match="out must be"):
        src.frames_block(0, 4, out=np.zeros((4, 5, 16, 16, 1), np.uint8))
    with pytest.raises(ValueError, match="k >= 1"):
        src.frames_block(0, 0)
    with pytest.raises(ValueError, match="step must be >= 0"):
        src.frames_block(-1, 2)


def test_lru_order():
    cache = FrameCache(budget=300)
    calls = []

    def load(v):
        def f():
            calls.append(v)
            return np.full(100, v, np.uint8)
        return f

    for k in (1, 2, 3):
        cache.get(k, load(k))
    cache.get(1, load(1))  # 1 is now the most recent
    cache.get(4, load(4))  # evicts 2, the least recently used
    assert 2 not in cache and 1 in cache and 3 in cache and 4 in cache
    assert calls == [1, 2, 3, 4] and cache.bytes == 300
    with pytest.raises(ValueError):
        cache.get(1, load(1))[0] = 7  # kept arrays are read-only
    cache.put(9, np.zeros(1000, np.uint8))  # larger than the budget: not kept, nothing evicted
    assert 9 not in cache and len(cache) == 3


def test_mixed_list_of_kinds(tmp_path):
    img = folder(tmp_path / "imgs", 3, 1)
    vid = tmp_path / "v.avi"
    out = cv2.VideoWriter(str(vid), cv2.VideoWriter_fourcc(*"MJPG"), 25, (32, 32))
    for i in range(5):
        out.write(np.full((32, 32, 3), 40 * i, np.uint8))
    out.release()
    src = make_source(f"{img},{vid}", SHAPE, 1, seed=0)
    assert src.describe()["kind"] == "mixed" and src.describe()["frames_per_file"] == [3, 5]
    assert src.describe()["file_kinds"] == ["images", "video"] and src.cuts(3).tolist() == [True]


def test_lists_reject_synthetic_entries(tmp_path):
    from pvm_dist.data import DataError

    with pytest.raises(DataError, match="synthetic:balls: a synthetic source cannot be part of a list"):
        make_source(f"{folder(tmp_path / 'a', 2, 0)},synthetic:balls", SHAPE, 1, 0)
