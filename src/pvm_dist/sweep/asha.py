"""Asynchronous successive halving (ASHA-style early stopping) on the sweep metric.

At each milestone (``grace · rf^k`` steps) a trial's metric is recorded in that milestone's rung. A trial
goes on only while its value is among the best ``1/rf`` of the values the rung has seen so far (itself
included); with fewer than ``rf`` values in the rung there is nothing to compare yet and it goes on.
Decisions never wait for other trials, so a stopped trial frees its GPU at once for the next one.
"""

from __future__ import annotations

import math


class SuccessiveHalving:
    """Rungs of recorded metric values, and the keep-or-stop rule."""

    def __init__(self, milestones: list[int], reduction_factor: int, mode: str) -> None:
        if reduction_factor < 2:
            raise ValueError("reduction_factor must be at least 2")
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self.milestones = sorted(milestones)
        self.rf = reduction_factor
        self.mode = mode
        self.rungs: dict[int, dict[str, float]] = {m: {} for m in self.milestones}

    def is_milestone(self, step: int) -> bool:
        return step in self.rungs

    def restore(self, trial_id: str, step: int, value: float) -> None:
        """Put back a value recorded before (replayed from the sweep journal), deciding nothing."""
        self.rungs[step][trial_id] = value

    def record(self, trial_id: str, step: int, value: float) -> bool:
        """Record ``value`` of ``trial_id`` at milestone ``step``; True if the trial should go on.

        Recording the same trial twice at a rung (a resumed trial) keeps the latest value.
        """
        rung = self.rungs[step]
        rung[trial_id] = value
        if not math.isfinite(value):
            return False
        values = sorted(v for v in rung.values() if math.isfinite(v))
        if len(values) < self.rf:
            return True
        keep = max(1, len(values) // self.rf)
        if self.mode == "min":
            return value <= values[keep - 1]
        return value >= values[-keep]
