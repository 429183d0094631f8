"""Opening data: :func:`make_source` turns a data string into a frame source.

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

from pvm_dist.data.cache import FrameCache
from pvm_dist.data.convert import check_shape
from pvm_dist.data.errors import DataError, data_error
from pvm_dist.data.images import ImageClip, is_image_name
from pvm_dist.data.pvm_zip import PvmZipClip
from pvm_dist.data.sets import is_set_name, set_files
from pvm_dist.data.source import FrameSource
from pvm_dist.data.streams import FileSource
from pvm_dist.data.synthetic import SOURCES
from pvm_dist.data.video import VideoClip

PICKLE_SUFFIXES = (".pkl", ".pickle", ".pck", ".npy", ".npz")


def _synthetic_names() -> list[str]:
    return list(SOURCES)


def _expand(entry: str, data_path: str | None) -> list[Path]:
    """The files or folders one list entry stands for."""
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


def data_entries(data: str) -> list[str]:
    """The entries of a data string, checked without opening anything (a sweep plan checks it on a machine
    that may not hold the files): no empty string or list, no unknown synthetic name, no synthetic source
    in a list, no pickled data. Raises :class:`DataError`."""
    data = data.strip()
    if data.startswith("synthetic:") or data in SOURCES:
        if data not in SOURCES:
            raise DataError(f"unknown data source {data!r}; available: {', '.join(SOURCES)}, a video file, "
                            f"a PVM .zip, an image folder, a comma-separated list, or a set name with --data-path")
        return [data]
    whole = Path(data).expanduser()
    entries = [data] if ("," in data and whole.exists()) else [e.strip() for e in data.split(",") if e.strip()]
    if not entries:
        raise DataError(f"empty data string {data!r}: name synthetic:balls, a file, a folder or a set")
    for e in entries:
        if e.startswith("synthetic:"):
            raise DataError(f"{e}: a synthetic source cannot be part of a list of files ({data!r})")
        if e.lower().endswith(PICKLE_SUFFIXES):
            raise data_error(e, "pickled/numpy data is never loaded; use video files, image folders or PVM zips")
    return entries


def make_source(data: str, image_shape: tuple[int, int, int], n_seq: int, seed: int,
                data_path: str | os.PathLike | None = None, cache_bytes: int | None = None) -> FrameSource:
    """The source named by ``data`` (see the module docstring) yielding ``n_seq`` streams of frames.

    ``seed`` drives the synthetic sources; file sources are laid out deterministically without it.
    ``cache_bytes`` bounds the decoded-frame cache of file sources (default 1 GiB).
    """
    shape = check_shape(image_shape)
    if n_seq < 1:
        raise ValueError(f"n_seq must be >= 1, got {n_seq}")
    data = data.strip()
    entries = data_entries(data)
    if data in SOURCES:
        return SOURCES[data](shape, n_seq, seed)
    dp = None if data_path is None else os.fspath(data_path)
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
