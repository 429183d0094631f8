"""Folders of images: name order, what is skipped, and unreadable files."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from pvm_dist.data import DataError, make_source

SHAPE = (20, 20, 3)


def image(i: int, size=(40, 30)) -> np.ndarray:
    w, h = size
    img = np.full((h, w, 3), (10 * i) % 256, np.uint8)
    img[: 2 + i % 20, :, 2] = 255
    return img


def make_folder(folder: Path, n: int, ext: str = ".png") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in reversed(range(n)):  # created out of order: the listing order must not matter
        assert cv2.imwrite(str(folder / f"frame_{i:03d}{ext}"), image(i))
    return folder


def resized(img: np.ndarray, shape=SHAPE) -> np.ndarray:
    return cv2.resize(img, (shape[1], shape[0]), interpolation=cv2.INTER_CUBIC)


def test_folder_frames_in_name_order_skipping_non_images(tmp_path):
    folder = make_folder(tmp_path / "imgs", 6)
    (folder / "README.md").write_text("not a frame")
    (folder / "groundtruth.txt").write_text("1,2,3,4\n")
    (folder / ".hidden.png").write_bytes(b"junk")
    (folder / "sub").mkdir()
    cv2.imwrite(str(folder / "sub" / "frame_000.png"), image(99))
    src = make_source(str(folder), SHAPE, 1, seed=0)
    assert len(src) == 6
    for t in range(6):
        assert np.array_equal(src.frames(t)[0], resized(image(t)))
    assert np.array_equal(src.frames(6)[0], resized(image(0)))  # wraps
    assert src.labels(0) is None and src.boxes(0) is None
    d = src.describe()
    assert d["kind"] == "images" and d["frames"] == 6 and d["labelled"] is False


def test_jpeg_folder_and_single_image(tmp_path):
    folder = make_folder(tmp_path / "jpgs", 3, ext=".JPG")
    src = make_source(str(folder), SHAPE, 1, seed=0)
    ref = cv2.imread(str(folder / "frame_002.JPG"))
    assert np.array_equal(src.frames(2)[0], resized(ref))
    one = make_source(str(folder / "frame_001.JPG"), SHAPE, 2, seed=0)
    assert len(one) == 1 and one.frames(5).shape == (2, *SHAPE)


def test_bad_folders_and_images_name_the_file(tmp_path):
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    with pytest.raises(DataError, match=r"empty_dir: no image files"):
        make_source(str(empty), SHAPE, 1, 0)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.txt").write_text("x")
    with pytest.raises(DataError, match=r"notes: no image files in folder \(1 other"):
        make_source(str(notes), SHAPE, 1, 0)
    folder = make_folder(tmp_path / "bad", 3)
    (folder / "frame_001.png").write_bytes(b"plain text pretending to be a png")
    with pytest.raises(DataError, match=r"frame_001\.png: not an image OpenCV can read"):
        make_source(str(folder), SHAPE, 1, 0)
    (folder / "frame_001.png").write_bytes(b"")
    with pytest.raises(DataError, match=r"frame_001\.png: empty file"):
        make_source(str(folder), SHAPE, 1, 0)
    ok, png = cv2.imencode(".png", image(1))
    (folder / "frame_001.png").write_bytes(png.tobytes()[:40])  # a valid header, the pixels cut off
    src = make_source(str(folder), SHAPE, 1, 0)
    with pytest.raises(DataError, match=r"frame_001\.png: not an image OpenCV can decode"):
        src.frames(0)
