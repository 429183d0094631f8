"""How a source's frames reach an engine: in blocks of steps, rendered on the GPU where they can be.

A source that can draw its frames on the device (the synthetic balls) fills a ring of ``block`` steps
held on the engine's GPU, which the engine trains on as its dataset: no frame crosses the host, and
between two blocks the host only waits for the engine and launches the drawing. Every other source
hands the engine each step's frames from a host block (one bulk read of the source per block).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pvm_dist.data import FrameSource
from pvm_dist.engine.base import Engine

BLOCK_BYTES = 256 << 20  # the most frame bytes one block holds


class FrameFeed:
    """Trains an engine on a source's frames, ``block`` steps at a time at most."""

    def __init__(self, engine: Engine, source: FrameSource) -> None:
        self.engine, self.source = engine, source
        frame_bytes = engine.n_seq * int(np.prod(engine.spec.image_shape))
        self.block = max(1, min(1024, BLOCK_BYTES // frame_bytes))
        self._ring: Any = None  # the device ring [block, n_seq, D, D, C] the engine reads as its dataset
        self._ring_first = 0
        self._last: np.ndarray | None = None  # the host path's last frames [n_seq, D, D, C]
        self.on_device = engine.device_label.startswith("cuda") and source.device_renderable

    def run(self, k: int) -> None:
        """Train the next ``k`` steps with no per-step host work where the engine and source allow it."""
        step = self.engine.step_index
        while k > 0:
            n = min(k, self.block)
            if self.on_device:
                self._fill_ring(step, n)
                self.engine.run_dataset(n)
            else:  # one step reads through the source's read-ahead; more take one bulk block
                block = self.source.frames(step)[None] if n == 1 else self.source.frames_block(step, n)
                for frames in block:
                    self.engine.step(frames)
                self._last = block[-1]
            step, k = step + n, k - n

    def last_frame(self, seq: int) -> np.ndarray:
        """Sequence ``seq``'s frame of the last step trained (a host copy; from the device ring on that path)."""
        if self.on_device:
            slot = (self.engine.step_index - 1 - self._ring_first) % self.block
            return self._ring[slot, seq].get()
        return self._last[seq].copy()

    def _fill_ring(self, step: int, n: int) -> None:
        """Draw steps step … step + n − 1 into their ring slots, (s − first) mod block."""
        import cupy

        if self._ring is None:
            shape = (self.block, self.engine.n_seq, *self.engine.spec.image_shape)
            self._ring, self._ring_first = cupy.empty(shape, cupy.uint8), step
            self.engine.set_dataset(self._ring, first_step=step)
        self.engine.synchronize()  # the engine has read the slots about to be drawn over
        drawn = self.source.frames_block_device(step, n)
        first = (step - self._ring_first) % self.block
        head = min(n, self.block - first)
        self._ring[first : first + head] = drawn[:head]
        if head < n:
            self._ring[: n - head] = drawn[head:]
        cupy.cuda.get_current_stream().synchronize()  # drawn before the engine's stream reads it
