"""Training metrics: the model's prediction errors next to the copy-last-frame baseline.

At step s the engine compares y(s−2) with what arrived: its first half predicted the signal of
step s (two steps ahead), its second half the signal of step s−1 (one step ahead). The baseline
predicts both by copying the frame of step s−2, on the same frames and the same steps (s ≥ 2).
Errors are mean squared in the network's compressed units (0.8·v + 0.1); for layer 0 they are
also given as RMSE in pixel units (0–255), the unit a reader of frames thinks in.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from pvm_dist.model.numerics import compress_frame

PIXELS_PER_COMPRESSED_UNIT = 255.0 / 0.8


def rmse_pixels(mse_compressed: float) -> float:
    """RMSE in pixel units of a mean squared error measured in compressed units."""
    return float(np.sqrt(mse_compressed) * PIXELS_PER_COMPRESSED_UNIT)


class CopyLastFrameBaseline:
    """Accumulates the copy-last-frame errors on the frames the engine trains on."""

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


def summarize(engine_metrics: dict[str, Any], baseline: dict[str, float]) -> dict[str, float]:
    """Flat, named metrics for logs and MLflow from ``engine.metrics()`` and the baseline."""
    if not engine_metrics.get("steps"):
        return {}
    two, one = np.asarray(engine_metrics["mse_two_step"]), np.asarray(engine_metrics["mse_one_step"])
    out = {
        "l0_two_step_px": rmse_pixels(two[0]),
        "l0_one_step_px": rmse_pixels(one[0]),
        "baseline_two_step_px": rmse_pixels(baseline["two_step"]),
        "baseline_one_step_px": rmse_pixels(baseline["one_step"]),
    }
    if baseline["two_step"] > 0:
        out["ratio_two_step"] = float(two[0] / baseline["two_step"])
    if baseline["one_step"] > 0:
        out["ratio_one_step"] = float(one[0] / baseline["one_step"])
    for layer in range(len(two)):
        out[f"layer{layer}_mse_two_step"] = float(two[layer])
        out[f"layer{layer}_mse_one_step"] = float(one[layer])
    return {k: v for k, v in out.items() if np.isfinite(v)}
