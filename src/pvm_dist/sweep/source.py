"""Where a sweep's new trials come from: the driver asks a trial source, apart from the executor that runs them.

As with Ray Tune's searchers, the search policy is a small object with no Ray and no MLflow in it. The
driver asks it for the next trial whenever a worker is free and its queue (trials to start or continue)
is empty, reports the metric at each ASHA milestone, and tells it how each trial ended:

- :class:`PlannedTrials`: a grid, random or model-zoo sweep. Every trial is planned up front and written
  to ``sweep.json``, so the driver's queue holds them all and the source has none to add;
- :class:`~pvm_dist.sweep.optuna_search.OptunaSearch`: ``search: {type: tpe | gp}``; each trial is asked of
  an Optuna study when a worker frees up, so the concurrency bound is the workers' count.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from pvm_dist.sweep.journal import SweepState
from pvm_dist.sweep.plan import SweepSpec, Trial


class TrialSource(Protocol):
    """Gives the driver new trials and learns how they did."""

    def remaining(self) -> int:
        """How many trials are still to be asked for."""

    def ask(self) -> Trial | None:
        """A new trial (the driver journals it before starting it), or None when there is none left."""

    def report(self, trial_id: str, step: int, value: float) -> None:
        """The sweep metric of a running trial at an early-stopping milestone."""

    def tell(self, trial_id: str, status: str, metric: float | None) -> None:
        """A trial ended (FINISHED, STOPPED or FAILED) with its last metric."""


class PlannedTrials:
    """A sweep whose every trial is in its plan: nothing to ask for, nothing to learn."""

    def remaining(self) -> int:
        return 0

    def ask(self) -> Trial | None:
        return None

    def report(self, trial_id: str, step: int, value: float) -> None:
        pass

    def tell(self, trial_id: str, status: str, metric: float | None) -> None:
        pass


def make_source(sweep: SweepSpec, folder: Path, trials: Mapping[str, Trial], state: SweepState) -> TrialSource:
    """The sweep's trial source; an adaptive search reloads its study from ``folder`` (a resume)."""
    if not sweep.adaptive:
        return PlannedTrials()
    from pvm_dist.sweep.optuna_search import OptunaSearch

    return OptunaSearch(sweep, folder, trials, state)
