"""The learning-rate schedule (pvm-algorithm.md §3.8), quirks included.

At the start of step s, in this order: (1) every D steps the next layer is enabled with the
initial rate and the momentum; (2) at ``delay_final_learning_rate`` every unit, enabled or not,
gets the final rate; (3) at ``delay_intermediate_learning_rate`` (if present) every unit gets the
intermediate rate, which overrides (2) when both fire together. Steps count frames per sequence.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pvm_dist.model.spec import Spec


@dataclasses.dataclass(frozen=True)
class ScheduleEvent:
    """One change of per-unit rates at the start of ``step``."""

    step: int
    kind: str  # "enable_layer" | "final" | "intermediate"
    learning_rate: float
    momentum: float | None = None  # set only by "enable_layer"
    layer: int | None = None  # None: every unit

    def describe(self) -> str:
        if self.kind == "enable_layer":
            return f"step {self.step}: enabling layer {self.layer} (lr {self.learning_rate:g}, momentum {self.momentum:g})"
        return f"step {self.step}: setting {self.kind} learning rate {self.learning_rate:g} for every unit"


def events_at(spec: Spec, step: int) -> list[ScheduleEvent]:
    """The schedule changes that fire at the start of ``step``, in the order they apply."""
    events = []
    delay = spec["delay_each_layer_learning"]
    if step % delay == 0 and step // delay < spec.n_layers:
        events.append(ScheduleEvent(step, "enable_layer", spec["initial_learning_rate"], spec["momentum"], step // delay))
    if step == spec["delay_final_learning_rate"]:
        events.append(ScheduleEvent(step, "final", spec["final_learning_rate"]))
    if spec["delay_intermediate_learning_rate"] is not None and step == spec["delay_intermediate_learning_rate"]:
        events.append(ScheduleEvent(step, "intermediate", spec["intermediate_learning_rate"]))
    return events


def event_steps(spec: Spec) -> list[int]:
    """Every step at which some event fires, ascending (engines run uninterrupted between them)."""
    delay = spec["delay_each_layer_learning"]
    steps = {k * delay for k in range(spec.n_layers)} | {spec["delay_final_learning_rate"]}
    if spec["delay_intermediate_learning_rate"] is not None:
        steps.add(spec["delay_intermediate_learning_rate"])
    return sorted(steps)


def apply_events(events: list[ScheduleEvent], unit_layer: np.ndarray, lr: np.ndarray, mom: np.ndarray) -> None:
    """Apply ``events`` in place to the per-unit float32 rate and momentum arrays."""
    for ev in events:
        sel = slice(None) if ev.layer is None else unit_layer == ev.layer
        with np.errstate(over="ignore"):  # a rate past float32 becomes Inf: the run's divergence check names it
            lr[sel] = np.float32(ev.learning_rate)
            if ev.momentum is not None:
                mom[sel] = np.float32(ev.momentum)

