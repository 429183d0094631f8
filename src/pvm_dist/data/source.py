"""The frame-source protocol and :func:`make_source`, which turns a data string into a source.

Data strings:

- ``synthetic:balls``, ``synthetic:bar``, ``synthetic:noise``: generated from the seed, no files;
- a video file OpenCV reads (``clip.mp4``, ``.avi``, ``.mkv``, ...);
- an original PVM data zip (``green_ball_long.pkl.zip``: ``<name>/img/NNNN.jpg`` + ``groundtruth_rect*.txt``);
- a folder of images (frames in file-name order) or a single image file;
- a comma-separated list of any of those (and of set names), read one after the other;
- a named set of the original (``green_ball_training``, ``stop_sign_testing``, ...; see ``sets.py``), whose
  files are looked up in ``data_path``.

With ``data_path`` given, relative file names are looked up under it too. Pickle files (``.pkl``,
``.pickle``) are refused: nothing from user data is ever unpickled. Any problem with the data is one
:class:`~pvm_dist.data.errors.DataError` (a ``ValueError``) naming the file and the problem.
"""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np

from pvm_dist.data.errors import DataError, data_error

PICKLE_SUFFIXES = (".pkl", ".pickle", ".pck", ".npy", ".npz")


@runtime_checkable
class FrameSource(Protocol):
    """Anything that yields the frames of a step; every method is a pure function of ``step``.

    - ``frames(step)``: uint8 BGR (or grey) [n_seq, H, W, C];
    - ``labels(step)``: float32 [n_seq, H, W] target masks (1 inside the box, 0 elsewhere, all 0 where the
      target is absent), or None for a source without labels;
    - ``boxes(step)``: int [n_seq, 4] boxes (x, y, w, h) in model pixels, -1 where absent, or None;
    - ``cuts(step)``: bool [n_seq], True where this step's frame starts a new segment of that stream
      (step 0, a file boundary, the wrap to the first frame);
    - ``describe()``: a JSON-able dict for logging (name, kind, files, frames, labelled, ...).

    Blocks of ``k`` steps, for feeding a device-resident dataset without a Python call per step:

    - ``frames_block(step, k, out=None)``: uint8 [k, n_seq, H, W, C], equal to
      ``np.stack([frames(step + i) for i in range(k)])``; ``out`` (C-contiguous, that shape and dtype) is
      filled instead of a new array (reusing one buffer saves faulting in fresh pages for every block);
    - ``labels_block(step, k)``: float32 [k, n_seq, H, W], or None; ``boxes_block(step, k)``: int32
      [k, n_seq, 4], or None;
    - ``device_renderable``: True when ``frames_block_device(step, k)`` draws the same block on the GPU
      (a CuPy array), so callers choose the path without knowing the source's type.
    """

    name: str
    n_seq: int
    device_renderable: bool

    def frames(self, step: int) -> np.ndarray: ...

    def frames_block(self, step: int, k: int, out: np.ndarray | None = None) -> np.ndarray: ...

    def labels_block(self, step: int, k: int) -> np.ndarray | None: ...

    def boxes_block(self, step: int, k: int) -> np.ndarray | None: ...

    def labels(self, step: int) -> np.ndarray | None: ...

    def boxes(self, step: int) -> np.ndarray | None: ...

    def cuts(self, step: int) -> np.ndarray: ...

    def describe(self) -> dict[str, Any]: ...


def check_block(step: int, k: int) -> None:
    """Refuse a block that starts before step 0 or holds no steps."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if k < 1:
        raise ValueError(f"a block needs k >= 1 steps, got {k}")


def block_out(out: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    """``out`` checked to be a C-contiguous uint8 array of ``shape``, or a new one when it is None."""
    if out is None:
        return np.empty(shape, np.uint8)
    if out.shape != tuple(shape) or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous uint8 array of shape {tuple(shape)}, "
                         f"got {out.dtype} {out.shape}{'' if out.flags.c_contiguous else ' (not contiguous)'}")
    return out


LOOKAHEAD_BYTES, LOOKAHEAD_STEPS = 1 << 22, 16


class Lookahead:
    """Serves ``frames(step)`` from a kept block of ``k`` steps drawn at once by ``frames_block``.

    Reading steps in order, as training does, then costs a block's per-step time instead of one call's fixed
    overhead per step, which dominates for few streams. A step outside the kept block draws the block it
    falls in (blocks start at multiples of k), so reading far-apart steps costs up to k steps each. k is as
    many steps as fit in ``LOOKAHEAD_BYTES``, at most ``LOOKAHEAD_STEPS``; at k = 1 every call draws its step
    alone. Frames are returned as copies, so callers may change them.
    """

    def __init__(self, frames_block: Callable[..., np.ndarray], step_shape: tuple[int, ...]) -> None:
        self.frames_block = frames_block
        self.k = max(1, min(LOOKAHEAD_STEPS, LOOKAHEAD_BYTES // int(np.prod(step_shape))))
        self.start: int | None = None
        self.block: np.ndarray | None = None

    def frames(self, step: int) -> np.ndarray:
        if self.k == 1:
            return self.frames_block(step, 1)[0]
        start = step - step % self.k
        if start != self.start:
            self.start = None  # until the block is whole again
            self.block = self.frames_block(start, self.k, out=self.block)
            self.start = start
        return self.block[step - start].copy()


def _synthetic_names() -> list[str]:
    from pvm_dist.data.synthetic import SOURCES

    return list(SOURCES)


def _expand(entry: str, data_path: str | None) -> list[Path]:
    """The files or folders one list entry stands for."""
    from pvm_dist.data.sets import is_set_name, set_files

    path = Path(entry).expanduser()
    if data_path is not None and not path.is_absolute():
        under = Path(data_path).expanduser() / path
        if under.exists() or not path.exists():
            path = under
    if path.exists():
        return [path]
    if is_set_name(entry):
        return set_files(entry, data_path)
    if data_path is None and os.sep not in entry and "." not in entry:
        raise DataError(f"unknown data source {entry!r}: no such file or folder, not one of "
                        f"{', '.join(_synthetic_names())}, and not a set name (sets need --data-path)")
    raise data_error(path, "no such file or folder")


def open_clip(path: Path, image_shape: tuple[int, int, int], on_chunk=None):
    """The clip reader for one file or folder, chosen by what it is."""
    from pvm_dist.data.images import ImageClip, is_image_name
    from pvm_dist.data.pvm_zip import PvmZipClip
    from pvm_dist.data.video import VideoClip

    name = path.name.lower()
    if path.is_dir():
        return ImageClip(path, image_shape)
    if not path.exists():
        raise data_error(path, "no such file or folder")
    if name.endswith(PICKLE_SUFFIXES):
        raise data_error(path, "pickled/numpy data is never loaded; use video files, image folders or PVM zips")
    if name.endswith(".zip"):
        return PvmZipClip(path, image_shape)
    if is_image_name(name):
        return ImageClip(path, image_shape)
    return VideoClip(path, image_shape, on_chunk=on_chunk)


def make_source(data: str, image_shape: tuple[int, int, int], n_seq: int, seed: int,
                data_path: str | os.PathLike | None = None, cache_bytes: int | None = None) -> FrameSource:
    """The source named by ``data`` (see the module docstring) yielding ``n_seq`` streams of frames.

    ``seed`` drives the synthetic sources; file sources are laid out deterministically without it.
    ``cache_bytes`` bounds the decoded-frame cache of file sources (default 1 GiB).
    """
    from pvm_dist.data.cache import FrameCache
    from pvm_dist.data.convert import check_shape
    from pvm_dist.data.streams import FileSource
    from pvm_dist.data.synthetic import SOURCES

    shape = check_shape(image_shape)
    if n_seq < 1:
        raise ValueError(f"n_seq must be >= 1, got {n_seq}")
    data = data.strip()
    if data.startswith("synthetic:") or data in SOURCES:
        if data not in SOURCES:
            raise DataError(f"unknown data source {data!r}; available: {', '.join(SOURCES)}, a video file, "
                            f"a PVM .zip, an image folder, a comma-separated list, or a set name with --data-path")
        return SOURCES[data](shape, n_seq, seed)
    if not data:
        raise DataError("empty data string")
    dp = None if data_path is None else os.fspath(data_path)
    whole = Path(data).expanduser()
    entries = [data] if ("," in data and whole.exists()) else [e.strip() for e in data.split(",") if e.strip()]
    for e in entries:
        if e.startswith("synthetic:"):
            raise DataError(f"{e}: a synthetic source cannot be part of a list of files ({data!r})")
    paths = [p for e in entries for p in _expand(e, dp)]
    for p in paths:
        if not p.exists():
            raise data_error(p, "no such file or folder")
    cache = FrameCache(cache_bytes)
    clips = []
    for idx, p in enumerate(paths):
        clips.append(open_clip(p, shape, on_chunk=lambda k, arr, idx=idx: cache.put((idx, k), arr)))
    kinds = sorted({c.kind for c in clips})
    return FileSource(data, kinds[0] if len(kinds) == 1 else "mixed", clips, shape, n_seq, cache)
