"""Synthetic frame sources generated from a seed: uniform noise and the original's moving bar (§5)."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class FrameSource(Protocol):
    """Anything that yields the frames of a step: [n_seq, D, D, C] uint8 BGR."""

    name: str

    def frames(self, step: int) -> np.ndarray: ...


class NoiseSource:
    """Independent uniform uint8 noise per step and sequence (a throughput and smoke-test source)."""

    def __init__(self, image_shape: tuple[int, int, int], n_seq: int, seed: int) -> None:
        self.name, self.shape, self.n_seq, self.seed = "synthetic:noise", image_shape, n_seq, seed

    def frames(self, step: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, step])
        return rng.integers(0, 256, size=(self.n_seq, *self.shape), dtype=np.uint8)


class BarSource:
    """The original's synthetic provider (§5): a white frame with a black bar, 2 rows high.

    The bar starts at the centre m = ⌊D/2⌋ and moves k = 0, 1, …, m rows in direction d; then k
    restarts at 1 and d is redrawn from {−1, +1}. Each cycle's direction comes from (seed, cycle), so
    any step can be drawn directly; sequence i runs ``i · offset`` steps ahead of sequence 0.
    """

    def __init__(self, image_shape: tuple[int, int, int], n_seq: int, seed: int, offset: int = 7) -> None:
        self.name, self.shape, self.n_seq, self.seed, self.offset = "synthetic:bar", image_shape, n_seq, seed, offset
        self.m = image_shape[0] // 2

    def _position(self, t: int) -> tuple[int, int]:
        """(k, d) of frame t: the first cycle has k = 0…m with d = +1, later ones k = 1…m."""
        if t <= self.m:
            return t, 1
        cycle, k = divmod(t - self.m - 1, self.m)
        d = 1 if np.random.default_rng([self.seed, cycle]).integers(2) else -1
        return k + 1, d

    def frame(self, t: int) -> np.ndarray:
        img = np.full(self.shape, 255, np.uint8)
        k, d = self._position(t)
        lo = self.m - 1 + k * d
        img[lo : lo + 2] = 0  # Python slicing, as the original: at lo = -1 the bar vanishes
        return img

    def frames(self, step: int) -> np.ndarray:
        return np.stack([self.frame(step + i * self.offset) for i in range(self.n_seq)])


SOURCES = {"synthetic:noise": NoiseSource, "synthetic:bar": BarSource}


def make_source(data: str, image_shape: tuple[int, int, int], n_seq: int, seed: int) -> FrameSource:
    """The source named by ``data`` (``synthetic:noise`` or ``synthetic:bar``)."""
    if data not in SOURCES:
        raise ValueError(f"unknown data source {data!r}; available: {', '.join(SOURCES)}")
    return SOURCES[data](image_shape, n_seq, seed)
