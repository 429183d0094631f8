"""What a frame source is (:class:`FrameSource`) and the helpers every source's blocks share.

:func:`pvm_dist.data.loader.make_source` turns a data string into a source.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np


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
    - ``period``: the number of steps after which the frames repeat (a file source's timeline), or None;
    - ``device_renderable``: True when ``frames_block_device(step, k)`` draws the same block on the GPU
      (a CuPy array), so callers choose the path without knowing the source's type.
    """

    name: str
    n_seq: int
    period: int | None
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

