"""The background baseline computed the plain way, one step at a time: the oracle the session's
block-wise computation is checked against."""

from __future__ import annotations

import numpy as np

from pvm_dist.model.numerics import compress_frame


class RunningMeanBackground:
    """m(s) = m(s−1) + α(c(s) − m(s−1)), m(0) = c(0); at step s ≥ 2, m(s−2) scored against c(s) and c(s−1)."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.means: list[np.ndarray] = []  # m(0), m(1), ...
        self.frames: list[np.ndarray] = []  # c(0), c(1), ...
        self.two: list[float] = []  # per scored step
        self.one: list[float] = []
        self.scored_steps: list[int] = []

    def step(self, frames: np.ndarray) -> None:
        """The frames [n_seq, D, D, C] of the next step (starting at step 0)."""
        c = compress_frame(np.asarray(frames)).astype(np.float64)
        s = len(self.frames)
        if s >= 2:
            m2 = self.means[s - 2]
            self.two.append(float(np.mean((c - m2) ** 2)))
            self.one.append(float(np.mean((self.frames[s - 1] - m2) ** 2)))
            self.scored_steps.append(s)
        self.means.append(c if s == 0 else self.means[-1] + self.alpha * (c - self.means[-1]))
        self.frames.append(c)

    def mean_between(self, first: int, end: int) -> tuple[float, float]:
        """Mean two-step and one-step MSE over the scored steps first ≤ s < end."""
        keep = [i for i, s in enumerate(self.scored_steps) if first <= s < end]
        return float(np.mean([self.two[i] for i in keep])), float(np.mean([self.one[i] for i in keep]))
