"""Synthetic frame sources generated from a seed: uniform noise, the original's moving bar (§5), and the
moving balls of :mod:`pvm_dist.data.balls`. None needs files; all are random access by step."""

from __future__ import annotations

from typing import Any

import numpy as np

from pvm_dist.data.balls import BallSource
from pvm_dist.data.convert import check_shape


class _Synthetic:
    kind = "synthetic"
    name: str
    shape: tuple[int, int, int]
    n_seq: int
    seed: int

    def labels(self, step: int) -> np.ndarray | None:
        return None

    def boxes(self, step: int) -> np.ndarray | None:
        return None

    def cuts(self, step: int) -> np.ndarray:
        """True for every stream at step 0 only: the scenes run on without breaks."""
        return np.full(self.n_seq, step == 0)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "files": [], "frames": None, "labelled": False,
                "n_seq": self.n_seq, "image_shape": list(self.shape), "seed": self.seed}


class NoiseSource(_Synthetic):
    """Independent uniform uint8 noise per step and sequence (a throughput and smoke-test source).

    Frames have no temporal structure, but no cuts are marked after step 0 (nothing to reset for).
    """

    def __init__(self, image_shape: tuple[int, int, int], n_seq: int, seed: int) -> None:
        self.name, self.shape, self.n_seq, self.seed = "synthetic:noise", check_shape(image_shape), n_seq, seed

    def frames(self, step: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, step])
        return rng.integers(0, 256, size=(self.n_seq, *self.shape), dtype=np.uint8)


class BarSource(_Synthetic):
    """The original's synthetic provider (§5): a white frame with a black bar, 2 rows high.

    The bar starts at the centre m = ⌊D/2⌋ and moves k = 0, 1, …, m rows in direction d; then k
    restarts at 1 and d is redrawn from {−1, +1}. Each cycle's direction comes from (seed, cycle), so
    any step can be drawn directly; sequence i runs ``i · offset`` steps ahead of sequence 0. Unlabelled
    (the original's label was all zeros); the jump back to the centre is part of the scene, not a cut.
    """

    def __init__(self, image_shape: tuple[int, int, int], n_seq: int, seed: int, offset: int = 7) -> None:
        self.name, self.shape, self.n_seq, self.seed, self.offset = "synthetic:bar", check_shape(image_shape), n_seq, seed, offset
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


SOURCES = {"synthetic:noise": NoiseSource, "synthetic:bar": BarSource, "synthetic:balls": BallSource}
