"""An adaptive search (TPE or GP) through Optuna's ask-and-tell interface, its study kept in the sweep folder.

Each Optuna trial asked for becomes the sweep trial ``t<number>`` over the sweep's ``vary`` distributions;
the driver journals it (``trial_added``) before starting it, and tells the study how it ended (a trial
that ASHA stopped is PRUNED, after its milestone values were reported). The study lives in
``<sweep>/search.optuna.log`` (Optuna's journal file storage), so it outlives the driver, and a resumed
sweep reloads it and squares it with the sweep journal:

- an Optuna trial still running that the sweep journal never got (the driver died between the ask and
  the journal) is told FAIL: its values were never trained, and no trial is asked twice;
- a sweep trial that ended while the study missed it (the driver died between the two) is told now;
- the sweep's unfinished trials continue under their Optuna trials, and the count of trials asked for
  is the count the sweep journal holds.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from pvm_dist.sweep.journal import FINAL_STATUSES, FINISHED, STOPPED, SweepState
from pvm_dist.sweep.plan import Distribution, SweepSpec, Trial

STUDY_FILE = "search.optuna.log"
STUDY_NAME = "search"


class OptunaSearch:
    """``search: {type: tpe | gp, trials, startup_trials}`` over ``vary``, a trial source
    (:class:`pvm_dist.sweep.source.TrialSource`); see the module docstring."""

    def __init__(self, sweep: SweepSpec, folder: Path, trials: Mapping[str, Trial], state: SweepState) -> None:
        assert sweep.search is not None and sweep.search.trials is not None
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.sweep, self.total = sweep, sweep.search.trials
        self.distributions = {k: optuna_distribution(d) for k, d in sweep.vary.items()}
        storage = JournalStorage(JournalFileBackend(str(folder / STUDY_FILE)))
        previous = optuna.load_study(study_name=STUDY_NAME, storage=storage) if _has_study(storage) else None
        asked_before = len(previous.trials) if previous is not None else 0
        self.study = optuna.create_study(
            storage=storage, study_name=STUDY_NAME, load_if_exists=True,
            sampler=_sampler(sweep, asked_before), direction="minimize" if sweep.mode == "min" else "maximize")
        self.asked = len(trials)  # an adaptive sweep plans none: every trial it has was asked for
        self._width = max(3, len(str(self.total - 1)))
        self._handles: dict[int, optuna.trial.Trial] = {}
        self._square(trials, state)

    def remaining(self) -> int:
        return max(self.total - self.asked, 0)

    def ask(self) -> Trial | None:
        if not self.remaining():
            return None
        handle = self.study.ask(self.distributions)
        self._handles[handle.number] = handle
        self.asked += 1
        return self.sweep.make_trial(f"t{handle.number:0{self._width}d}", self.sweep.specs[0], handle.params)

    def report(self, trial_id: str, step: int, value: float) -> None:
        if math.isfinite(value):
            self._handle(_number(trial_id)).report(value, step)

    def tell(self, trial_id: str, status: str, metric: float | None) -> None:
        number = _number(trial_id)
        if status == FINISHED and metric is not None and math.isfinite(metric):
            self.study.tell(number, metric, skip_if_finished=True)
        else:
            self.study.tell(number, state=TrialState.PRUNED if status == STOPPED else TrialState.FAIL,
                            skip_if_finished=True)
        self._handles.pop(number, None)

    def _square(self, trials: Mapping[str, Trial], state: SweepState) -> None:
        """Bring a reloaded study in line with the sweep journal (see the module docstring)."""
        journaled = {_number(t): t for t in trials}
        for frozen in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            trial_id = journaled.get(frozen.number)
            if trial_id is None:
                self.study.tell(frozen.number, state=TrialState.FAIL)
            elif state.trials[trial_id].status in FINAL_STATUSES:
                ts = state.trials[trial_id]
                self.tell(trial_id, ts.status, ts.metric)

    def _handle(self, number: int) -> optuna.trial.Trial:
        """The live Optuna trial of ``number`` (rebuilt for a trial asked for before a resume)."""
        if number not in self._handles:
            frozen = next(t for t in self.study.get_trials(deepcopy=False) if t.number == number)
            self._handles[number] = optuna.trial.Trial(self.study, frozen._trial_id)  # noqa: SLF001 - no public way
        return self._handles[number]


def optuna_distribution(d: Distribution) -> BaseDistribution:
    """The Optuna distribution of one ``vary`` entry: grids and choices are categorical."""
    if d.kind in ("grid", "choice"):
        return CategoricalDistribution(list(d.values))
    lo, hi = d.values
    if d.kind == "randint":
        return IntDistribution(int(lo), int(hi))
    return FloatDistribution(float(lo), float(hi), log=d.kind == "loguniform")


def _sampler(sweep: SweepSpec, asked_before: int) -> Any:
    """TPE (with the constant liar, for trials running side by side) or GP; seeded from the sweep's seed and the
    trials asked before, so a resumed driver does not draw its first values again."""
    assert sweep.search is not None
    seed, startup = sweep.seed + asked_before, sweep.search.startup_trials
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if sweep.search.type == "gp":
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, constant_liar=True)


def _has_study(storage: JournalStorage) -> bool:
    return any(s.study_name == STUDY_NAME for s in storage.get_all_studies())


def _number(trial_id: str) -> int:
    return int(trial_id.lstrip("t"))

