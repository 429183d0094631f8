"""The sweep's scheduling policy: which trials go on, and where their chunks must end. No Ray, no I/O.

As in Ray Tune's ``TrialScheduler``, the driver passes each result of a running trial to a scheduler
and acts on its :class:`Decision`; the scheduler names the steps it needs results at
(:meth:`TrialScheduler.milestones`), and :class:`ChunkPlan` ends chunks there. Two policies:

- :class:`FIFOScheduler`: every trial runs to its last step (a sweep without ``early_stopping``);
- :class:`AshaScheduler`: asynchronous successive halving (:mod:`pvm_dist.sweep.asha`) on the sweep
  metric. A decision that records a value in a rung says so, so the driver journals it and a resumed
  sweep gives the rungs back to a new scheduler (``recorded``).
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import Iterable, Mapping
from typing import Any

from pvm_dist.sweep.asha import SuccessiveHalving
from pvm_dist.sweep.plan import SweepSpec


class Action(enum.Enum):
    CONTINUE = "CONTINUE"
    STOP = "STOP"
    EXPLOIT = "EXPLOIT"  # PBT: continue from a copy of ``donor``'s checkpoint with ``values``
    PAUSE = "PAUSE"  # PBT: give the worker to a waiting member; continue later from this step's checkpoint


@dataclasses.dataclass(frozen=True)
class Decision:
    """What to do with a trial after a result; ``recorded``: the value kept in a rung (to journal)."""

    action: Action
    reason: str | None = None  # why it stops (exploits, pauses)
    recorded: float | None = None
    donor: str | None = None
    values: dict[str, Any] | None = None


CONTINUE = Decision(Action.CONTINUE)


class TrialScheduler(abc.ABC):
    """Decides, result by result, whether a trial goes on."""

    @abc.abstractmethod
    def milestones(self) -> list[int]:
        """The steps (before the last) at which this scheduler needs each trial's result."""

    @abc.abstractmethod
    def on_result(self, trial_id: str, step: int, metrics: Mapping[str, float]) -> Decision:
        """A trial's ``metrics`` at ``step``: CONTINUE, or STOP with a reason."""


class FIFOScheduler(TrialScheduler):
    """Never stops a trial: trials run in plan order, each to its last step."""

    def milestones(self) -> list[int]:
        return []

    def on_result(self, trial_id: str, step: int, metrics: Mapping[str, float]) -> Decision:
        return CONTINUE


class AshaScheduler(TrialScheduler):
    """Successive halving on ``metric`` at its milestones; ``recorded``: (trial, step, value) from the journal."""

    def __init__(self, milestones: list[int], reduction_factor: int, metric: str, mode: str,
                 recorded: Iterable[tuple[str, int, float]] = ()) -> None:
        self.halving = SuccessiveHalving(milestones, reduction_factor, mode)
        self.metric = metric
        for trial_id, step, value in recorded:
            if self.halving.is_milestone(step):
                self.halving.restore(trial_id, step, value)

    def milestones(self) -> list[int]:
        return list(self.halving.milestones)

    def on_result(self, trial_id: str, step: int, metrics: Mapping[str, float]) -> Decision:
        value = metrics.get(self.metric)
        if value is None or not self.halving.is_milestone(step):
            return CONTINUE
        if self.halving.record(trial_id, step, value):
            return Decision(Action.CONTINUE, recorded=value)
        n = len(self.halving.rungs[step])
        return Decision(Action.STOP, recorded=value,
                        reason=f"early stop at step {step:,}: {self.metric} = {value:.4g} "
                               f"not in the best 1/{self.halving.rf} of {n} trials there")


def make_scheduler(sweep: SweepSpec, recorded: Iterable[tuple[str, int, float]] = ()) -> TrialScheduler:
    """The sweep's scheduler: ASHA when it has ``early_stopping``, else FIFO; ``recorded``: the journal's rungs."""
    es = sweep.early_stopping
    if es is None:
        return FIFOScheduler()
    return AshaScheduler(es.milestones(sweep.steps), es.reduction_factor, sweep.metric, sweep.mode, recorded)


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
    """Where a trial's chunks end: at every metrics, checkpoint and scheduler milestone step, and its last step.

    A chunk that ends on a checkpoint step or the last step brings back the engine state and a picture.
    """

    steps: int
    metrics_every: int
    checkpoint_every: int
    milestones: tuple[int, ...] = ()

    @classmethod
    def of(cls, sweep: SweepSpec, scheduler: TrialScheduler) -> ChunkPlan:
        return cls(sweep.steps, sweep.run.metrics_every, sweep.run.checkpoint_every, tuple(scheduler.milestones()))

    def for_steps(self, steps: int) -> ChunkPlan:
        """The plan of a trial that trains ``steps`` steps (steps may vary per trial)."""
        return dataclasses.replace(self, steps=steps, milestones=tuple(m for m in self.milestones if m < steps))

    def end_after(self, step: int) -> int:
        """The end of the chunk that starts at ``step``."""
        ends = [(step // self.metrics_every + 1) * self.metrics_every,
                (step // self.checkpoint_every + 1) * self.checkpoint_every, self.steps]
        return min(ends + [m for m in self.milestones if m > step])

    def keeps_state(self, end: int) -> bool:
        """Whether the chunk ending at ``end`` brings back the state (a checkpoint) and a picture."""
        return end % self.checkpoint_every == 0 or end == self.steps
