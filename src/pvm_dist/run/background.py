"""The background baseline: predict a frame by the per-pixel running mean of the frames before it.

Copying the last frame is a weak rival when objects move more than their own size per step: then
predicting the background (a blank frame without the moving bar) beats it, and so would a model that
learnt only the background. This baseline catches that. Its mean is an exponential running mean,
m(s) = m(s−1) + α·(c(s) − m(s−1)) with m(0) = c(0), of the compressed frames c = 0.8·f + 0.1 the network
trains on (:func:`~pvm_dist.model.numerics.compress_frame`). At step s ≥ 2 it predicts frames s (two
steps ahead) and s−1 (one step ahead) by m(s−2), exactly as the engine scores its own layer-0 output
y(s−2) and the copy-last-frame baseline frame s−2: mean squared error in compressed units over the
frame's entries, on the same steps.

It is computed beside the engine from the frames the feed hands over, with numpy on the host or CuPy
where the frames live on a GPU, in float64 and a block of steps at a time (one small matrix product
per block instead of a handful of array operations per step).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pvm_dist.model.numerics import compress_frame

ALPHA = 1.0 / 16  # the running mean's weight of the newest frame: a memory of about 16 steps
PRIME_STEPS = 320  # frames read back on resume: the mean then differs from an unbroken run's by (1−α)^320 < 1e-8
_BLOCK = 32  # steps per matrix product, at most ...
_BLOCK_BYTES = 64 << 20  # ... and at most this many bytes of float64 frames (large batches: fewer steps)


class BackgroundBaseline:
    """Accumulates the background baseline's errors over the steps fed (see the module docstring)."""

    def __init__(self, alpha: float = ALPHA) -> None:
        self.alpha = alpha
        self._mean: Any = None  # m(s−1), flat [n_seq·entries]
        self._mean2: Any = None  # m(s−2)
        self._last: Any = None  # c(s−1)
        self._next_step: int | None = None
        self._seen = 0  # frames in the mean
        self._weights: dict[tuple[int, str], tuple[Any, Any]] = {}
        self._reset()

    def _reset(self) -> None:
        self._sums: Any = 0.0  # two-step, one-step (an array of 2 once something was measured)
        self.count = 0

    def update(self, first_step: int, frames: Any) -> None:
        """Feed the frames [k, n_seq, D, D, C] (uint8 or float32; numpy or CuPy) of steps first_step … first_step+k−1.

        Steps must follow on from the last call; a gap (a resume) starts the mean afresh at ``first_step``.
        """
        xp = _array_module(frames)
        if self._next_step != first_step:
            self._mean = self._mean2 = self._last = None
            self._seen = 0
        elif self._mean is not None and _array_module(self._mean) is not xp:  # a restored state meets GPU frames
            self._mean, self._mean2, self._last = (None if a is None else _to(xp, a)
                                                   for a in (self._mean, self._mean2, self._last))
            if self.count:
                self._sums = _to(xp, self._sums)
        entries = int(np.prod(frames.shape[1:]))
        block = max(1, min(_BLOCK, _BLOCK_BYTES // (8 * entries)))
        for i in range(0, len(frames), block):
            c = _compress(xp, frames[i : i + block])
            self._block(xp, first_step + i, c.reshape(len(c), -1))
        self._next_step = first_step + len(frames)

    def _block(self, xp: Any, first_step: int, c: Any) -> None:
        """Means m(t) for the block's k steps in one product, then the errors of the steps it can score."""
        k = len(c)
        if self._mean is None:  # m(first) = c(first): start from a mean equal to the first frame
            self._mean, self._last = c[0], c[0]
        decay, weights = self._operators(xp, k)
        means = weights @ c + decay[:, None] * self._mean[None, :]  # m(first) … m(first+k−1)
        before = xp.concatenate([xp.stack([self._mean2 if self._mean2 is not None else self._mean, self._mean]), means])
        previous = xp.concatenate([self._last[None, :], c[:-1]])  # c(s−1)
        steps = first_step + np.arange(k)
        scored = (steps >= 2) & (self._seen + np.arange(k) >= 2)  # frame s−2 is in the mean
        if scored.any():
            rows = xp.asarray(np.flatnonzero(scored))
            m2 = before[rows]  # m(s−2): before[t] is m(first+t−2)
            two = ((c[rows] - m2) ** 2).mean(axis=1).sum()
            one = ((previous[rows] - m2) ** 2).mean(axis=1).sum()
            self._sums = self._sums + xp.stack([two, one])
            self.count += int(scored.sum())
        self._mean2, self._mean, self._last = before[-2], means[-1], c[-1]
        self._seen += k

    def _operators(self, xp: Any, k: int) -> tuple[Any, Any]:
        """(1−α)^(t+1) and the lower-triangular α(1−α)^(t−j) of a block of k steps, cached per array module."""
        key = (k, xp.__name__)
        if key not in self._weights:
            t = np.arange(k)
            keep = 1.0 - self.alpha
            weights = np.where(t[:, None] >= t[None, :], self.alpha * keep ** (t[:, None] - t[None, :]), 0.0)
            self._weights[key] = (xp.asarray(keep ** (t + 1.0)), xp.asarray(weights))
        return self._weights[key]

    def state(self) -> dict[str, Any]:
        """Host copies of what the next steps continue from (the means m(s−1), m(s−2) and the sums of the
        interval under way, float64 as kept), for a checkpoint: a run resumed from it measures exactly what an
        unbroken run measures. The last frame c(s−1) is not kept: :meth:`load_state` takes it from the source."""
        if self._mean is None or self._next_step is None:
            return {}
        mean2 = self._mean2 if self._mean2 is not None else self._mean
        sums = self._sums if self.count else np.zeros(2)
        return {"mean": _host(self._mean), "mean2": _host(mean2), "sums": _host(sums).astype(np.float64),
                "count": int(self.count), "seen": int(self._seen), "next_step": int(self._next_step),
                "has_mean2": int(self._mean2 is not None)}

    def load_state(self, state: dict[str, Any], last_frame: np.ndarray) -> None:
        """Continue from :meth:`state`; ``last_frame`` is the frame [n_seq, D, D, C] of step ``next_step − 1``."""
        self._mean = np.array(state["mean"], np.float64)
        self._mean2 = np.array(state["mean2"], np.float64) if int(state["has_mean2"]) else None
        self._last = _compress(np, last_frame[None]).reshape(-1)
        self._next_step, self._seen = int(state["next_step"]), int(state["seen"])
        self.count = int(state["count"])
        self._sums = np.array(state["sums"], np.float64) if self.count else 0.0

    def take(self) -> dict[str, float]:
        """Mean squared errors (compressed units) since the last call, ``two_step`` and ``one_step``; then reset."""
        out = {"two_step": float("nan"), "one_step": float("nan")}
        if self.count:
            sums = self._sums.get() if hasattr(self._sums, "get") else np.asarray(self._sums)
            out = {"two_step": float(sums[0]) / self.count, "one_step": float(sums[1]) / self.count}
        self._reset()
        return out


def _array_module(frames: Any) -> Any:
    """numpy, or CuPy for a CuPy array."""
    if type(frames).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def _host(a: Any) -> np.ndarray:
    """A numpy copy of a numpy or CuPy array."""
    return a.get() if hasattr(a, "get") else np.array(a)


def _to(xp: Any, a: Any) -> Any:
    """``a`` as an array of module ``xp`` (numpy or CuPy)."""
    return xp.asarray(a) if xp is not np else _host(a)


def _compress(xp: Any, frames: Any) -> Any:
    """The network's compressed frames (float32 roundings of :func:`compress_frame`) as float64."""
    if xp is np:
        return compress_frame(np.asarray(frames)).astype(np.float64)
    f = frames.astype(xp.float32) / xp.float32(255.0) if frames.dtype == xp.uint8 else frames
    return (f * xp.float32(0.8) + xp.float32(0.1)).astype(xp.float64)
