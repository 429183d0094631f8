"""Population-based training: the policy that decides when a member copies another (Jaderberg et al. 2017).

``search: {type: pbt, population, interval_steps, quantile, explore}``: the sweep plans ``population``
members with values drawn from ``vary``. Every ``interval_steps`` steps each member reports the sweep
metric; a member in the bottom ``quantile`` of the values reported at that step copies a member of the
top quantile there (its checkpoint: weights, momentum, rings, readout and step, so the learning-rate
schedule goes on where the donor was) and continues with the donor's values, the ``explore`` ones
changed (times a perturb factor, clipped to the range ``vary`` gives, or drawn again).

Asynchronous, as in Ray Tune, but compared step for step: a member that reaches an interval first is
ranked among those that reached it before (a metric that improves with training cannot compare
members at different steps), and a donor, having reached the same step, always has a checkpoint at
least as far on. A member that has ended still ranks, but is not copied.

A population larger than the sweep's concurrency takes turns, interval by interval: a member that
reaches an interval while another waits at or before that step pauses there (``PAUSE``: its checkpoint
at the interval kept, its worker given to the member furthest behind). Without turns the first members
would run to their end before the others start, and the later ones would find only ended donors.

The copy keeps every array of the donor's state as it is but the per-unit learning rates and momenta:
those the schedule set from the donor's values, so the member's are set again by replaying its own
schedule (its explored values) up to the donor's step (:func:`continue_schedule`); without that, new
values would only take effect at the schedule's next event.

Like ASHA the policy is a :class:`~pvm_dist.sweep.scheduler.TrialScheduler` (no Ray, no I/O): it
answers ``EXPLOIT`` with the donor and the new values, or ``PAUSE``. The driver then stages the member's copy of the
donor's checkpoint (:func:`stage_copy`), journals an ``exploit`` event and puts the copy in place
(:func:`put_copy_in_place`); a driver that died in between is squared by :func:`finish_copies` on
resume. The policy's state comes back from the journal (the recorded interval values, each member's
values, the count of exploits, which seeds its random choices).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pvm_dist.io import checkpoint
from pvm_dist.model.schedule import apply_events, event_steps, events_at
from pvm_dist.model.spec import Spec
from pvm_dist.model.topology import build_topology
from pvm_dist.run import state as run_state
from pvm_dist.run.config import RunConfig
from pvm_dist.run.state import RunState
from pvm_dist.sweep.journal import SweepFolder, SweepState
from pvm_dist.sweep.plan import _SIGNIFICANT_DIGITS, SweepSpec
from pvm_dist.sweep.scheduler import CONTINUE, Action, Decision, TrialScheduler


class PopulationBasedTraining(TrialScheduler):
    """See the module docstring. ``members``: each member's current varied values; ``recorded``: the journal's
    interval values (trial, step, value) in order; ``can_donate``: whether a member may be copied now (it has not
    ended); ``waiting``: whether a member waits for a worker at or before a step; ``exploits``: how many exploits
    the journal holds."""

    def __init__(self, sweep: SweepSpec, members: Mapping[str, Mapping[str, Any]],
                 recorded: Iterable[tuple[str, int, float]], can_donate: Callable[[str], bool],
                 waiting: Callable[[int], bool], exploits: int = 0) -> None:
        assert sweep.search is not None and sweep.search.interval_steps is not None
        self.sweep, self.search = sweep, sweep.search
        self.values = {t: dict(v) for t, v in members.items()}
        self.rungs: dict[int, dict[str, float]] = {}  # interval step -> member -> value there
        for trial_id, step, value in recorded:
            self.rungs.setdefault(step, {})[trial_id] = value
        self.can_donate, self.waiting, self.exploits = can_donate, waiting, exploits

    def milestones(self) -> list[int]:
        every = self.search.interval_steps
        return list(range(every, self.sweep.steps, every))

    def on_result(self, trial_id: str, step: int, metrics: Mapping[str, float]) -> Decision:
        value = metrics.get(self.sweep.metric)
        if value is None or step % self.search.interval_steps or step >= self.sweep.steps:
            return CONTINUE
        rung = self.rungs.setdefault(step, {})
        rung[trial_id] = value
        ranked = sorted(rung, key=lambda t: self._rank_key(rung[t]))  # best first
        k = max(1, int(self.search.quantile * len(ranked)))
        donors = [t for t in ranked[:k] if t != trial_id and self.can_donate(t)]
        if len(ranked) < 2 or trial_id not in ranked[-k:] or not donors:
            if self.waiting(step):
                return Decision(Action.PAUSE, recorded=value,
                                reason=f"step {step:,}: pauses for a member that waits at or before this step")
            return Decision(Action.CONTINUE, recorded=value)
        rng = np.random.default_rng([self.sweep.seed, self.exploits, step])
        donor = donors[int(rng.integers(len(donors)))]
        values = self.explore(self.values[donor], rng)
        self.values[trial_id] = values
        self.exploits += 1
        return Decision(Action.EXPLOIT, recorded=value, donor=donor, values=values,
                        reason=f"step {step:,}: {self.sweep.metric} = {value:.4g} in the bottom {self.search.quantile:g} "
                               f"of {len(ranked)} there; copies {donor} ({rung[donor]:.4g})")

    def explore(self, values: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        """The donor's values with each ``explore`` key perturbed (clipped to its range) or drawn again."""
        out = dict(values)
        for key, how in self.search.explore.items():
            dist = self.sweep.vary[key]
            if how.kind == "resample":
                out[key] = dist.draw(rng)
                continue
            x = out[key] * how.factors[int(rng.integers(len(how.factors)))]
            lo, hi = dist.values
            x = min(max(x, lo), hi)
            out[key] = int(round(x)) if dist.kind == "randint" else float(f"{x:.{_SIGNIFICANT_DIGITS}g}")
        return out

    def _rank_key(self, value: float) -> float:
        if math.isnan(value):
            return math.inf
        return value if self.sweep.mode == "min" else -value


def schedule_rates(spec: Spec, step: int) -> tuple[np.ndarray, np.ndarray]:
    """The per-unit learning rates and momenta an engine of ``spec`` holds after ``step`` steps: every schedule
    event before ``step`` replayed in order (an event of step s fires as step s starts)."""
    layer = build_topology(spec).layer
    lr = np.zeros(layer.shape[0], np.float32)
    momentum = np.zeros(layer.shape[0], np.float32)
    for at in event_steps(spec):
        if at >= step:
            break
        apply_events(events_at(spec, at), layer, lr, momentum)
    return lr, momentum


def continue_schedule(engine_state: Mapping[str, Any], spec: Spec) -> dict[str, Any]:
    """The donor's engine state for a member of ``spec``: the same arrays, the rates its own schedule gives there."""
    out = dict(engine_state)
    out["unit_learning_rate"], out["unit_momentum"] = schedule_rates(spec, int(engine_state["step"]))
    return out


def staged_file(folder: SweepFolder, trial_id: str) -> Path:
    """Where a member's copy of its donor's checkpoint waits between the exploit's journal event and its use."""
    return folder.trial_dir(trial_id) / "exploit.pvmckpt"


def stage_copy(folder: SweepFolder, trial_id: str, donor_id: str, config: RunConfig) -> int:
    """Write the member's copy of the donor's latest checkpoint, with the member's run configuration and the rates
    its schedule sets (:func:`continue_schedule`); return the donor's step, where the member goes on."""
    donor, _ = run_state.load(folder.checkpoint_file(donor_id))
    run_state.save(staged_file(folder, trial_id),
                   RunState(continue_schedule(donor.engine, config.spec), donor.readout, config),
                   {"sweep_id": folder.sweep_id, "trial_id": trial_id, "donor": donor_id})
    return donor.step


def put_copy_in_place(folder: SweepFolder, trial_id: str) -> None:
    """The staged copy becomes the member's checkpoint (after the exploit was journaled)."""
    os.replace(staged_file(folder, trial_id), folder.checkpoint_file(trial_id))


def finish_copies(folder: SweepFolder, state: SweepState) -> None:
    """A driver that died between journaling an exploit and putting the copy in place: finish the move; a copy the
    journal never got is dropped."""
    for trial_id, ts in state.trials.items():
        staged = staged_file(folder, trial_id)
        if not staged.exists():
            continue
        journaled = any(e["trial"] == trial_id for e in state.exploits)
        try:
            current = checkpoint.load(staged).step == ts.checkpoint_step
        except (checkpoint.CheckpointError, OSError):
            current = False
        if journaled and current:
            put_copy_in_place(folder, trial_id)
        else:
            staged.unlink()
