"""Folders of images (and single image files), read with OpenCV.

A folder's frames are its files with an image extension (``convert.IMAGE_EXTENSIONS``, case-insensitive),
sorted by file name (plain string order: number frames with zero padding, ``0001.png``, ...). Other files
(a ``README``, a ``groundtruth.txt``, ``.DS_Store``) and sub-folders are skipped, as are hidden files; a
file that has an image extension but that OpenCV cannot read is an error naming it. Image folders carry no
labels. Frames are decoded lazily (a chunk at a time, on a few threads); at opening, each file's header is
checked, so a non-image under an image name fails at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from pvm_dist.data.convert import IMAGE_EXTENSIONS, fit_frame
from pvm_dist.data.errors import data_error, opencv_path
from pvm_dist.data.limits import check_pixels
from pvm_dist.data.streams import Clip

_POOL: ThreadPoolExecutor | None = None


def decode_pool() -> ThreadPoolExecutor:
    """A shared pool for JPEG/PNG decoding (OpenCV releases the GIL while decoding and resizing)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1)), thread_name_prefix="pvm-decode")
    return _POOL


def parallel_map(fn: Callable, items: Sequence) -> list:
    """``[fn(x) for x in items]`` on the decode pool (in order; the first exception is raised)."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    return list(decode_pool().map(fn, items))


def is_image_name(name: str) -> bool:
    return Path(name).suffix.lower() in IMAGE_EXTENSIONS


def list_images(folder: Path) -> list[Path]:
    """The image files of ``folder``, sorted by name (see the module docstring)."""
    try:
        entries = sorted(os.listdir(folder))
    except OSError as exc:
        raise data_error(folder, f"cannot list folder ({exc.strerror or exc})") from None
    files = [folder / n for n in entries if not n.startswith(".") and is_image_name(n) and (folder / n).is_file()]
    if not files:
        raise data_error(folder, f"no image files in folder ({len(entries)} other entries; image extensions: "
                                 f"{', '.join(sorted(IMAGE_EXTENSIONS))})")
    return files


def read_image(path: Path, image_shape: tuple[int, int, int]) -> np.ndarray:
    """One image file decoded as BGR and fitted to ``image_shape``."""
    import cv2

    try:
        buf = np.fromfile(str(path), dtype=np.uint8)
    except OSError as exc:
        raise data_error(path, f"cannot read ({exc.strerror or exc})") from None
    if buf.size == 0:
        raise data_error(path, "empty file")
    check_pixels(buf[: 1 << 16].tobytes(), str(path))
    img = cv2.imdecode(buf, cv2.IMREAD_COLOR)
    if img is None:
        raise data_error(path, "not an image OpenCV can decode (corrupt or unsupported)")
    return fit_frame(img, image_shape)


class ImageClip(Clip):
    """The images of one folder (or one image file) as one clip, in name order."""

    kind = "images"

    def __init__(self, path: Path, image_shape: tuple[int, int, int]) -> None:
        import cv2

        self.path, self.shape = str(path), image_shape
        self.files = list_images(path) if path.is_dir() else [path]
        for f in self.files:
            try:
                ok = f.stat().st_size > 0 and cv2.haveImageReader(opencv_path(f))
            except OSError as exc:
                raise data_error(f, f"cannot read ({exc.strerror or exc})") from None
            if not ok:
                raise data_error(f, "empty file" if f.stat().st_size == 0 else "not an image OpenCV can read")
        with open(self.files[0], "rb") as fh:  # the first file's size now; every file's when it is decoded
            check_pixels(fh.read(1 << 16), str(self.files[0]))
        self.n_frames = len(self.files)

    def decode(self, start: int, stop: int) -> np.ndarray:
        return np.stack(parallel_map(lambda f: read_image(f, self.shape), self.files[start:stop]))

    def describe(self) -> dict:
        return {**super().describe(), "first": self.files[0].name, "last": self.files[-1].name}
