"""Video files through OpenCV: a clip written here, the shared clip, and broken files."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from pvm_dist.data import DataError, make_source

SHARED_CLIP = Path(__file__).resolve().parents[2] / "shared" / "data" / "bigbuckbunny.mp4"
SHAPE = (24, 24, 3)


def write_video(path: Path, n: int = 40, size: tuple[int, int] = (64, 48), fourcc: str = "MJPG") -> Path:
    """A clip whose frame i is a grey level ramp with a square at a position that depends on i."""
    w, h = size
    out = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), 25, (w, h))
    assert out.isOpened()
    for i in range(n):
        img = np.full((h, w, 3), (i * 5) % 256, np.uint8)
        img[(2 * i) % (h - 8) :][:8, (3 * i) % (w - 8) :][:, :8] = (0, 0, 255)
        out.write(img)
    out.release()
    return path


def reference_frames(path: Path, shape=SHAPE) -> np.ndarray:
    cap = cv2.VideoCapture(str(path))
    frames = []
    while True:
        ok, img = cap.read()
        if not ok:
            return np.stack(frames)
        frames.append(cv2.resize(img, (shape[1], shape[0]), interpolation=cv2.INTER_CUBIC))


@pytest.fixture
def clip(tmp_path) -> Path:
    return write_video(tmp_path / "clip.avi")


def test_video_frames_are_the_resized_decoded_frames(clip):
    ref = reference_frames(clip)
    src = make_source(str(clip), SHAPE, 1, seed=0)
    assert len(ref) == 40 and len(src) == 40
    got = np.stack([src.frames(t)[0] for t in range(45)])
    assert got.dtype == np.uint8 and got.shape == (45, *SHAPE)
    assert np.array_equal(got[:40], ref)
    assert np.array_equal(got[40:], ref[:5])  # wraps to the first frame
    assert src.labels(0) is None and src.boxes(0) is None
    assert [t for t in range(45) if src.cuts(t)[0]] == [0, 40]
    d = src.describe()
    assert d["kind"] == "video" and d["frames"] == 40 and d["files"] == [str(clip)] and d["labelled"] is False


def test_video_random_access_after_eviction(clip):
    seq = make_source(str(clip), SHAPE, 3, seed=0)
    tiny = make_source(str(clip), SHAPE, 3, seed=0, cache_bytes=1)  # keeps nothing: every read decodes
    for t in [37, 2, 0, 39, 15, 15, 81]:
        assert np.array_equal(tiny.frames(t), seq.frames(t))
    assert tiny.cache.stats()["bytes"] == 0 and seq.cache.stats()["misses"] == 0


def test_grey_model_gets_grey_frames(clip):
    src = make_source(str(clip), (16, 16, 1), 1, seed=0)
    ref = cv2.cvtColor(reference_frames(clip, (16, 16, 3))[3], cv2.COLOR_BGR2GRAY)
    assert np.array_equal(src.frames(3)[0, :, :, 0], ref)


@pytest.mark.skipif(not SHARED_CLIP.is_file(), reason="../shared is only beside the developers' checkout")
def test_shared_clip():
    src = make_source(str(SHARED_CLIP), (60, 60, 3), 4, seed=0)
    assert len(src) == 132 and src.describe()["stream_starts"] == [0, 33, 66, 99]
    f = src.frames(0)
    assert f.shape == (4, 60, 60, 3) and f.dtype == np.uint8 and f.std() > 10
    assert src.clips[0].source_size == (720, 1280)
    assert np.array_equal(src.frames(33)[0], f[1])  # stream 1 runs 33 frames ahead
    assert src.cuts(33).tolist() == [False, False, False, True]  # stream 3 wraps: 99 + 33 = 132 -> 0


def test_broken_videos_name_the_file(tmp_path, clip):
    missing = tmp_path / "nope.mp4"
    with pytest.raises(DataError, match=r"nope\.mp4: no such file"):
        make_source(str(missing), SHAPE, 1, 0)
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match=r"empty\.mp4: empty file"):
        make_source(str(empty), SHAPE, 1, 0)
    junk = tmp_path / "junk.mkv"
    junk.write_bytes(b"this is not a video at all\n" * 100)
    with pytest.raises(DataError, match=r"junk\.mkv: "):
        make_source(str(junk), SHAPE, 1, 0)
    data = clip.read_bytes()
    half = tmp_path / "half.avi"
    half.write_bytes(data[: len(data) // 2])  # frames lost, the header still declares 40
    with pytest.raises(DataError, match=r"half\.avi: truncated or corrupt video: decoded \d+ of the 40"):
        make_source(str(half), SHAPE, 1, 0)
    mp4 = write_video(tmp_path / "clip.mp4", fourcc="mp4v")
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(mp4.read_bytes()[:-200])  # the index (moov) is at the end: cannot be opened
    with pytest.raises(DataError, match=r"cut\.mp4: ") as err:
        make_source(str(cut), SHAPE, 1, 0)
    assert "\n" not in str(err.value)
