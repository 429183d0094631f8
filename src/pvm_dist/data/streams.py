"""File-backed sources: files ("clips") laid end to end, read by ``n_seq`` streams that wrap around.

The clips of a source are concatenated in the order given into one timeline of L frames (as the original's
``ZipCollectionDataProvider``). Stream i reads position ``(start_i + step) mod L``:

- with at least ``n_seq`` files, ``start_i`` is the first frame of file ``⌊i · F / n_seq⌋`` (F files), so the
  streams start in distinct files;
- otherwise ``start_i = ⌊i · L / n_seq⌋`` (distinct offsets).

All streams advance one frame per step and wrap to frame 0 after the last. ``cuts(step)`` marks, per
stream, a frame that does not continue the stream's previous frame: step 0, the first frame of a file, and
so the wrap. Nothing is reset by the source; what to do at a cut is the trainer's choice (the original
trained straight across them).

Everything is a function of ``step``, so a resumed run sees exactly the frames it would have seen.
Decoded frames are kept in a :class:`~pvm_dist.data.cache.FrameCache` in chunks of ``CHUNK`` frames.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pvm_dist.data.cache import CHUNK, FrameCache
from pvm_dist.data.convert import box_masks
from pvm_dist.data.source import Lookahead, block_out, check_block


class Clip:
    """One file's frames: ``n_frames`` of them, decoded on demand, resized to the source's shape.

    ``boxes`` is int32 [n_frames, 4] in model pixels (-1 rows where the target is absent), or None when
    the file has no labels.
    """

    kind = "clip"
    path: str
    n_frames: int
    boxes: np.ndarray | None = None

    def decode(self, start: int, stop: int) -> np.ndarray:
        """uint8 frames ``start..stop-1`` of this file as [stop - start, H, W, C]."""
        raise NotImplementedError

    def close(self) -> None:
        """Release open files (a later ``decode`` opens them again)."""

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "file": self.path, "frames": self.n_frames, "labelled": self.boxes is not None}


def stream_starts(file_lengths: list[int], n_seq: int) -> np.ndarray:
    """Start position of each stream in the concatenated timeline (see the module docstring)."""
    n_files, total = len(file_lengths), int(sum(file_lengths))
    if n_files >= n_seq:
        firsts = np.concatenate([[0], np.cumsum(file_lengths)[:-1]])
        return np.array([firsts[(i * n_files) // n_seq] for i in range(n_seq)], np.int64)
    return np.array([(i * total) // n_seq for i in range(n_seq)], np.int64)


class FileSource:
    """A random-access frame source over clips (video files, image folders, PVM zips, or a mix)."""

    device_renderable = False

    def __init__(self, name: str, kind: str, clips: list[Clip], image_shape: tuple[int, int, int], n_seq: int,
                 cache: FrameCache) -> None:
        if n_seq < 1:
            raise ValueError(f"n_seq must be >= 1, got {n_seq}")
        self.name, self.kind, self.clips, self.shape, self.n_seq, self.cache = name, kind, clips, image_shape, n_seq, cache
        self.lengths = [c.n_frames for c in clips]
        self.n_frames = int(sum(self.lengths))
        self.period = self.n_frames  # every stream wraps around the timeline
        self.file_starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self.starts = stream_starts(self.lengths, n_seq)
        self._ahead = Lookahead(self.frames_block, (n_seq, *image_shape))
        self.labelled = any(c.boxes is not None for c in clips)
        self._boxes = None
        if self.labelled:
            self._boxes = np.concatenate([c.boxes if c.boxes is not None else np.full((c.n_frames, 4), -1, np.int32)
                                          for c in clips]).astype(np.int32)

    def __len__(self) -> int:
        return self.n_frames

    def positions(self, step: int) -> np.ndarray:
        """Timeline position [n_seq] that each stream reads at ``step``."""
        return self.positions_block(step, 1)[0]

    def positions_block(self, step: int, k: int) -> np.ndarray:
        """Timeline positions [k, n_seq] that the streams read at steps ``step … step+k−1``."""
        check_block(step, k)
        return (self.starts + (int(step) + np.arange(k, dtype=np.int64))[:, None]) % self.n_frames

    def _chunk(self, f: int, k: int) -> np.ndarray:
        """The (read-only, cached) frames of chunk ``k`` of file ``f``."""
        clip = self.clips[f]
        return self.cache.get((f, k), lambda: clip.decode(k * CHUNK, min(clip.n_frames, (k + 1) * CHUNK)))

    def frames_block(self, step: int, k: int, out: np.ndarray | None = None) -> np.ndarray:
        """uint8 [k, n_seq, H, W, C] frames of steps ``step … step+k−1``.

        Each cached chunk that the block touches is fetched once and copied out with one fancy index.
        """
        pos = self.positions_block(step, k).ravel()
        out = block_out(out, (k, self.n_seq, *self.shape))
        flat = out.reshape(-1, *self.shape)
        f = np.searchsorted(self.file_starts, pos, side="right") - 1
        local = pos - self.file_starts[f]
        keys, which = np.unique(f * (self.n_frames // CHUNK + 1) + local // CHUNK, return_inverse=True)
        order = np.argsort(which, kind="stable")
        bounds = np.searchsorted(which[order], np.arange(len(keys) + 1))
        for u in range(len(keys)):
            sel = order[bounds[u] : bounds[u + 1]]
            fu, ku = int(f[sel[0]]), int(local[sel[0]] // CHUNK)
            flat[sel] = self._chunk(fu, ku)[local[sel] - ku * CHUNK]
        return out

    def frames(self, step: int) -> np.ndarray:
        """uint8 [n_seq, H, W, C] frames of ``step`` (read a few steps at a time: see :class:`Lookahead`)."""
        return self._ahead.frames(step)

    def boxes_block(self, step: int, k: int) -> np.ndarray | None:
        """int32 [k, n_seq, 4] boxes of steps ``step … step+k−1`` (-1 where absent), or None if unlabelled."""
        if self._boxes is None:
            return None
        return self._boxes[self.positions_block(step, k)]

    def boxes(self, step: int) -> np.ndarray | None:
        boxes = self.boxes_block(step, 1)
        return None if boxes is None else boxes[0]

    def labels_block(self, step: int, k: int) -> np.ndarray | None:
        """float32 [k, n_seq, H, W] box masks of steps ``step … step+k−1``, or None if unlabelled."""
        boxes = self.boxes_block(step, k)
        return None if boxes is None else box_masks(boxes, self.shape)

    def labels(self, step: int) -> np.ndarray | None:
        labels = self.labels_block(step, 1)
        return None if labels is None else labels[0]

    def cuts(self, step: int) -> np.ndarray:
        if step == 0:
            return np.ones(self.n_seq, bool)
        return np.isin(self.positions(step), self.file_starts)

    def close(self) -> None:
        for c in self.clips:
            c.close()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "files": [c.path for c in self.clips],
                "file_kinds": [c.kind for c in self.clips], "frames": self.n_frames,
                "frames_per_file": list(self.lengths), "labelled": self.labelled, "n_seq": self.n_seq,
                "image_shape": list(self.shape), "stream_starts": [int(s) for s in self.starts],
                "cache_budget_bytes": self.cache.budget}
