"""How a source's frames reach an engine, with as little host work per step as the source allows.

- A source that repeats (file data: every stream wraps around the clips' timeline) and fits in
  ``DATASET_BYTES`` is handed to the engine once, whole, as its dataset: on a GPU it is copied there once
  and every later step is a graph launch.
- A source that can draw its frames on the GPU (the synthetic balls) fills a ring of two blocks of ``block``
  steps held on the engine's GPU, which the engine trains on as its dataset. The next block is drawn into the
  half the engine is not reading while it trains on the other, so the engine waits only for the launch.
- Otherwise each step's frames are handed over from the host, read in bulk blocks.

An ``observe(first_step, frames)`` callback sees every block of frames as the engine gets it (numpy, or
CuPy on the drawn ring), for what is computed beside the engine (the background baseline).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pvm_dist.data import FrameSource
from pvm_dist.engine.base import Engine

RING_BYTES = 256 << 20  # the most frame bytes the drawn ring holds (two blocks)
DATASET_BYTES = 1 << 30  # the most frame bytes of a repeating source held whole by the engine


class FrameFeed:
    """Trains an engine on a source's frames (see the module docstring)."""

    def __init__(self, engine: Engine, source: FrameSource,
                 observe: Callable[[int, Any], None] | None = None) -> None:
        self.engine, self.source, self.observe = engine, source, observe
        frame_bytes = engine.n_seq * int(np.prod(engine.spec.image_shape))
        self.block = max(1, min(512, RING_BYTES // 2 // frame_bytes))
        self.on_device = engine.device_label.startswith("cuda") and source.device_renderable
        # Only the native engine gains from holding frames (its steps then need no host work).
        self.whole = (not self.on_device and source.period is not None and engine.backend == "native"
                      and source.period * frame_bytes <= DATASET_BYTES)
        self._held = False  # the whole source has been handed to the engine
        self._ring: Any = None  # the device ring [2 block, n_seq, D, D, C] the engine reads as its dataset
        self._ring_first = 0

    def run(self, k: int) -> None:
        """Train the next ``k`` steps."""
        if self.whole:
            if not self._held:
                self.engine.set_dataset(self.source.frames_block(0, self.source.period), first_step=0)
                self._held = True
            if self.observe is not None:
                self.observe(self.engine.step_index, self.source.frames_block(self.engine.step_index, k))
            self.engine.run_dataset(k)
            return
        step = self.engine.step_index
        while k > 0:
            n = min(k, self.block)
            if self.on_device:
                drawn = self._fill_ring(step, n)
                self.engine.run_dataset(n)
            else:  # one step reads through the source's read-ahead; more take one bulk block
                drawn = self.source.frames(step)[None] if n == 1 else self.source.frames_block(step, n)
                for frames in drawn:
                    self.engine.step(frames)
            if self.observe is not None:
                self.observe(step, drawn)
            step, k = step + n, k - n

    def last_frame(self, seq: int) -> np.ndarray:
        """Sequence ``seq``'s frame of the last step trained (on the ring path, read from the GPU)."""
        step = self.engine.step_index - 1
        if self.on_device:
            return self._ring[(step - self._ring_first) % len(self._ring), seq].get()
        return self.source.frames(step)[seq]

    def _fill_ring(self, step: int, n: int) -> Any:
        """Draw steps step … step + n − 1 (n ≤ block) into their ring slots, (s − first) mod 2 block; the drawn block.

        At most one block is ever queued on the engine (each launch waits for the one before), and it holds at
        most ``block`` slots, so these n slots are free: the engine trains on while they are drawn."""
        import cupy

        if self._ring is None:
            shape = (2 * self.block, self.engine.n_seq, *self.engine.spec.image_shape)
            self._ring, self._ring_first = cupy.empty(shape, cupy.uint8), step
            self.engine.set_dataset(self._ring, first_step=step)
        size = len(self._ring)
        drawn = self.source.frames_block_device(step, n)
        first = (step - self._ring_first) % size
        head = min(n, size - first)
        self._ring[first : first + head] = drawn[:head]
        if head < n:
            self._ring[: n - head] = drawn[head:]
        cupy.cuda.get_current_stream().synchronize()  # drawn before the engine's stream reads it
        self.engine.synchronize()  # the block before is done: the next draw may take its slots
        return drawn
