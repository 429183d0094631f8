"""The copy-last-frame baseline as the host computed it before every engine accumulated it itself:
the oracle the engines' baselines are checked against (float64 differences of compressed frames)."""

from __future__ import annotations

from collections import deque

import numpy as np

from pvm_dist.model.numerics import compress_frame



class CopyLastFrameBaseline:
    """Accumulates the copy-last-frame errors on the frames an engine trains on."""

    def __init__(self) -> None:
        self._recent: deque[np.ndarray] = deque(maxlen=2)  # compressed frames of steps s−2, s−1
        self._reset()

    def _reset(self) -> None:
        self.sums = np.zeros(2)  # two-step, one-step
        self.count = 0

    def update(self, frames: np.ndarray) -> None:
        """Feed the frames of the next step (the same batch the engine trains on)."""
        c = compress_frame(np.asarray(frames)).astype(np.float64)
        if len(self._recent) == 2:
            older, previous = self._recent
            self.sums += (np.mean((c - older) ** 2), np.mean((previous - older) ** 2))
            self.count += 1
        self._recent.append(c)

    def take(self) -> dict[str, float]:
        """Mean squared baseline errors since the last call, then reset."""
        out = {"two_step": np.nan, "one_step": np.nan}
        if self.count:
            out = {"two_step": float(self.sums[0] / self.count), "one_step": float(self.sums[1] / self.count)}
        self._reset()
        return out
