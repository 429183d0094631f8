"""Training metrics: the model's prediction errors next to two baselines, as flat names.

At step s the engine compares y(s−2) with what arrived: its first half predicted the signal of step s
(two steps ahead), its second half the signal of step s−1 (one step ahead). The copy-last-frame
baseline predicts both by copying the frame of step s−2, on the same frames and the same steps (s ≥ 2);
every engine accumulates it from the frames it holds. The background baseline predicts both by the
running mean of the frames up to s−2 (:mod:`pvm_dist.run.background`, computed beside the engine).
Errors are mean squared in the network's compressed units (0.8·v + 0.1); for layer 0 they are also
given as RMSE in pixel units (0–255). Ratios are of mean squared errors (below 1: the model beats
that baseline); the RMSEs' ratio is their square root.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

PIXELS_PER_COMPRESSED_UNIT = 255.0 / 0.8
#: The names a metrics interval reports (:func:`summarize` and the session's speeds), besides LAYER_METRIC's.
LAYER0_METRICS = ("l0_two_step_px", "l0_one_step_px", "baseline_two_step_px", "baseline_one_step_px",
                  "ratio_two_step", "ratio_one_step", "background_two_step_px", "background_one_step_px",
                  "ratio_background_two_step", "ratio_background_one_step")
SPEED_METRICS = ("frames_per_s", "steps_per_s")  # higher is better; every error is lower-is-better
METRICS = LAYER0_METRICS + SPEED_METRICS
LAYER_METRIC = re.compile(r"layer\d+_mse_(two|one)_step")


def rmse_pixels(mse_compressed: float) -> float:
    """RMSE in pixel units of a mean squared error measured in compressed units."""
    return float(np.sqrt(mse_compressed) * PIXELS_PER_COMPRESSED_UNIT)


def diverged_layers(engine_metrics: dict[str, Any]) -> list[int]:
    """Layers whose error in ``engine.metrics()`` is NaN or infinite."""
    if not engine_metrics.get("steps"):
        return []
    pairs = zip(engine_metrics["mse_two_step"], engine_metrics["mse_one_step"])
    return [i for i, (a, b) in enumerate(pairs) if not (np.isfinite(a) and np.isfinite(b))]


def _ratio(model: float, baseline: float) -> float:
    return float(model / baseline) if baseline > 0 else float("nan")


def summarize(engine_metrics: dict[str, Any], background: dict[str, float] | None = None) -> dict[str, float]:
    """Flat, named metrics for logs and MLflow from ``engine.metrics()`` (errors and the copy-last-frame
    baseline) and the background baseline's ``{two_step, one_step}`` MSEs over the same steps."""
    if not engine_metrics.get("steps"):
        return {}
    two, one = np.asarray(engine_metrics["mse_two_step"]), np.asarray(engine_metrics["mse_one_step"])
    base_two, base_one = float(engine_metrics["baseline_two_step"]), float(engine_metrics["baseline_one_step"])
    bg_two, bg_one = (background or {}).get("two_step", np.nan), (background or {}).get("one_step", np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = (rmse_pixels(two[0]), rmse_pixels(one[0]), rmse_pixels(base_two), rmse_pixels(base_one),
                  _ratio(two[0], base_two), _ratio(one[0], base_one), rmse_pixels(bg_two), rmse_pixels(bg_one),
                  _ratio(two[0], bg_two), _ratio(one[0], bg_one))
    out = dict(zip(LAYER0_METRICS, values))
    for layer in range(len(two)):
        out[f"layer{layer}_mse_two_step"] = float(two[layer])
        out[f"layer{layer}_mse_one_step"] = float(one[layer])
    return {k: v for k, v in out.items() if np.isfinite(v)}


def verdict(metrics: dict[str, float]) -> str:
    """One line: the layer-0 two-step error in pixels and which baselines it beats (MSE ratios, < 1 beats)."""
    if "l0_two_step_px" not in metrics:
        return "no prediction error measured"
    parts = []
    for name, key in (("copy-last-frame", "ratio_two_step"), ("background", "ratio_background_two_step")):
        if key in metrics:
            r = metrics[key]
            parts.append(f"{'beats' if r < 1 else 'does not beat'} {name} (MSE ratio {r:.3f})")
    return f"layer-0 two-step error {metrics['l0_two_step_px']:.2f} px RMSE: " + ("; ".join(parts) or "no baseline measured")
