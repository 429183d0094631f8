"""Synthetic frame sources generated from a seed: uniform noise, the original's moving bar (§5), and the
moving balls of :mod:`pvm_dist.data.balls`. None needs files; all are random access by step."""

from __future__ import annotations

from typing import Any

import numpy as np

from pvm_dist.data.balls import BallSource
from pvm_dist.data.convert import check_shape
from pvm_dist.data.source import block_out, check_block


class _Synthetic:
    kind = "synthetic"
    device_renderable = False
    period: int | None = None
    name: str
    shape: tuple[int, int, int]
    n_seq: int
    seed: int

    def frames(self, step: int) -> np.ndarray:
        return self.frames_block(step, 1)[0]

    def labels(self, step: int) -> np.ndarray | None:
        return None

    def boxes(self, step: int) -> np.ndarray | None:
        return None

    def labels_block(self, step: int, k: int) -> np.ndarray | None:
        return None

    def boxes_block(self, step: int, k: int) -> np.ndarray | None:
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

    def frames_block(self, step: int, k: int, out: np.ndarray | None = None) -> np.ndarray:
        """Each step's noise comes from its own generator (seeded by (seed, step)): random access."""
        check_block(step, k)
        out = block_out(out, (k, self.n_seq, *self.shape))
        for i in range(k):
            out[i] = np.random.default_rng([self.seed, step + i]).integers(0, 256, out.shape[1:], dtype=np.uint8)
        return out


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

    def _top_rows(self, t: np.ndarray) -> np.ndarray:
        """The bar's top row m − 1 + k·d in frames ``t`` (int array): the first cycle has k = 0…m with
        d = +1, later ones k = 1…m with d drawn per cycle (one generator per distinct cycle)."""
        cycle, k = np.divmod(np.maximum(t - self.m - 1, 0), max(self.m, 1))
        cycles, which = np.unique(cycle, return_inverse=True)
        d = np.array([1 if np.random.default_rng([self.seed, int(c)]).integers(2) else -1 for c in cycles])
        return self.m - 1 + np.where(t <= self.m, t, (k + 1) * d[which.reshape(t.shape)])

    def _draw(self, t: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Frames ``t`` (int array) into ``out`` [*t.shape, H, W, C]: white, with black rows top and top + 1
        (Python slicing, as the original: at top = −1 the bar vanishes)."""
        top = self._top_rows(t)[..., None]
        rows = np.arange(self.shape[0])
        out[...] = np.where((top >= 0) & (rows >= top) & (rows <= top + 1), 0, 255).astype(np.uint8)[..., None, None]
        return out

    def frame(self, t: int) -> np.ndarray:
        return self._draw(np.array(t), np.empty(self.shape, np.uint8))

    def frames_block(self, step: int, k: int, out: np.ndarray | None = None) -> np.ndarray:
        """Stream i at step s shows frame s + i·offset."""
        check_block(step, k)
        t = step + np.arange(k)[:, None] + self.offset * np.arange(self.n_seq)
        return self._draw(t, block_out(out, (k, self.n_seq, *self.shape)))


SOURCES = {"synthetic:noise": NoiseSource, "synthetic:bar": BarSource, "synthetic:balls": BallSource}
