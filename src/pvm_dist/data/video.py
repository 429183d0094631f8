"""Video files read with ``cv2.VideoCapture`` (any container and codec this OpenCV build reads).

At opening, the whole file is decoded once, sequentially: that counts its frames exactly (the container's
``CAP_PROP_FRAME_COUNT`` is only an estimate for some formats), finds truncated or corrupt files before
training starts, and fills the frame cache as far as its budget allows. A file that declares N frames but
decodes to fewer than ``0.98·N − 1`` is reported as truncated. Later, an evicted chunk is decoded again by
reading forward from the nearest open reader (a few are kept per file), never by seeking, so frames are
exact for every codec. Unlike the original's movie provider, frames are not flipped vertically.
Videos carry no labels.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pvm_dist.data.cache import CHUNK
from pvm_dist.data.convert import fit_frame
from pvm_dist.data.errors import data_error, opencv_path
from pvm_dist.data.limits import MAX_PIXELS
from pvm_dist.data.streams import Clip

MAX_READERS = 4  # open cv2.VideoCapture objects kept per file for reading forward


class VideoClip(Clip):
    kind = "video"

    def __init__(self, path: Path, image_shape: tuple[int, int, int],
                 on_chunk: Callable[[int, np.ndarray], None] | None = None) -> None:
        self.path, self.shape = str(path), image_shape
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise data_error(path, f"cannot read ({exc.strerror or exc})") from None
        if size == 0:
            raise data_error(path, "empty file")
        try:
            with open(path, "rb") as fh:
                fh.read(1)
        except OSError as exc:
            raise data_error(path, f"cannot read ({exc.strerror or exc})") from None
        import cv2

        self._readers: list[list] = []  # [capture, index of the next frame it reads]
        cap = self._open()
        declared = cap.get(cv2.CAP_PROP_FRAME_COUNT)
        self.fps = float(cap.get(cv2.CAP_PROP_FPS) or 0.0)
        self.source_size = (int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)), int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)))
        if self.source_size[0] * self.source_size[1] > MAX_PIXELS:
            cap.release()
            raise data_error(path, f"frames are {self.source_size[1]:,}×{self.source_size[0]:,} pixels; at most "
                                   f"{MAX_PIXELS:,} pixels are decoded")
        n, chunk = 0, []
        while True:
            ok, img = cap.read()
            if not ok:
                break
            chunk.append(fit_frame(img, image_shape))
            n += 1
            if len(chunk) == CHUNK:
                if on_chunk:
                    on_chunk(n // CHUNK - 1, np.stack(chunk))
                chunk = []
        cap.release()
        if chunk and on_chunk:
            on_chunk(n // CHUNK, np.stack(chunk))
        if n == 0:
            raise data_error(path, "no frame could be decoded (empty, corrupt or not a video)")
        if declared > 0 and n < 0.98 * declared - 1:
            raise data_error(path, f"truncated or corrupt video: decoded {n} of the {int(declared)} frames it declares")
        self.n_frames = n
        self.declared_frames = int(declared) if declared > 0 else None

    def _open(self):
        # FFmpeg writes its own complaints ("moov atom not found") straight to file descriptor 2, beside the one
        # line this raises; quiet unless the user asked for its log. OpenCV reads this at its first FFmpeg open.
        os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")
        import cv2

        cap = cv2.VideoCapture(opencv_path(self.path))
        if not cap.isOpened():
            raise data_error(self.path, "not a video OpenCV can open (corrupt, truncated or unsupported format)")
        return cap

    def _reader_at(self, start: int) -> list:
        """An open reader positioned at or before ``start`` (the nearest one), opening one if needed."""
        usable = [r for r in self._readers if r[1] <= start]
        if usable:
            return max(usable, key=lambda r: r[1])
        if len(self._readers) >= MAX_READERS:
            victim = min(self._readers, key=lambda r: r[1])
            victim[0].release()
            self._readers.remove(victim)
        reader = [self._open(), 0]
        self._readers.append(reader)
        return reader

    def decode(self, start: int, stop: int) -> np.ndarray:
        reader = self._reader_at(start)
        cap = reader[0]
        while reader[1] < start:
            if not cap.grab():
                raise data_error(self.path, f"frame {reader[1]} can no longer be read (file changed?)")
            reader[1] += 1
        out = []
        for i in range(start, stop):
            ok, img = cap.read()
            if not ok:
                raise data_error(self.path, f"frame {i} can no longer be decoded (file changed?)")
            out.append(fit_frame(img, self.shape))
            reader[1] += 1
        return np.stack(out)

    def close(self) -> None:
        for cap, _ in self._readers:
            cap.release()
        self._readers = []

    def describe(self) -> dict:
        return {**super().describe(), "fps": self.fps, "source_size": list(self.source_size)}
