"""A stand-in for the Ray executor: it reports the events a real one would ('training' by counting steps, a
trial's metric is its seed), so the driver's wiring is tested without Ray (tests/test_sweep_driver.py,
test_sweep_outcomes.py, test_sweep_search.py; the ``scripted`` fixture in conftest.py installs it)."""

from __future__ import annotations

from concurrent.futures import Executor, Future

import numpy as np

from pvm_dist.sweep.driver import Driver, DriverOptions
from pvm_dist.sweep.executor import (ChunkDone, FinalState, PoolWorker, TrialError, TrialStarted, WorkerInfo,
                                     WorkerLost)
from pvm_dist.sweep.journal import SweepFolder
from pvm_dist.sweep.plan import load_sweep


class InlineOpener(Executor):
    """Runs each submitted call at once, on the loop: with it the driver opens trials' runs in a fixed order,
    so scripted sweeps replay the same events every time (the real driver opens them on a thread)."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        done: Future = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # as a thread would: kept for whoever takes the result
            done.set_exception(exc)
        return done


def run_state(step: int, *arrays: np.ndarray) -> dict:
    """A worker's state as it comes back through Ray (RunState.to_dict(); the driver keeps its own config)."""
    return {"engine": {"step": step, **{f"w{i}": a for i, a in enumerate(arrays)}}, "readout": {}, "run": {}}


class ScriptedExecutor:
    """The executor's interface, 'training' by counting steps; ``lose``: (trial, step) where its worker dies."""

    lose: set[tuple[str, int]] = set()
    fail = False

    def __init__(self, sweep, chunks) -> None:
        self.chunks = chunks
        self.workers: dict[int, str | None] = {}  # index -> its trial
        self.dead: set[int] = set()
        self.retired: set[int] = set()  # released by the driver's pool
        self.at: dict[str, int] = {}  # chunks queued up to this step
        self.value: dict[str, float] = {}
        self.events: list = []
        self.shut = False
        ScriptedExecutor.last = self

    def cluster_resources(self) -> dict:
        return {"CPU": 2.0}

    def use(self, demand) -> None:
        self.demand = demand

    def add_worker(self) -> None:
        self.workers[len(self.workers)] = None

    def retire(self, index: int) -> None:
        self.dead.add(index)
        self.retired.add(index)

    def alive(self) -> list:
        return [PoolWorker(i, True, t is None, t is not None) for i, t in self.workers.items() if i not in self.dead]

    def idle_workers(self) -> list[int]:
        return [i for i, t in self.workers.items() if t is None and i not in self.dead]

    def workers_up(self) -> int:
        return len(self.workers) - len(self.dead)

    def has_trials(self) -> bool:
        return any(t is not None for t in self.workers.values())

    def start_trial(self, index, trial, state) -> None:
        self.workers[index] = trial.trial_id
        self.at[trial.trial_id] = int(state["engine"]["step"]) if state else 0
        self.value[trial.trial_id] = float(trial.seed)
        if self.fail is True or (callable(self.fail) and self.fail(trial)):  # a predicate: which trials fail
            self.events.append(TrialError(trial.trial_id, "DataError: no such file"))
            return
        info = WorkerInfo("node00", "host", 100 + index, f"actor{index}", ())
        self.events.append(TrialStarted(trial.trial_id, info, self.at[trial.trial_id], "native", "cpu", 0.01,
                                        False, 0.02))

    def feed(self, trial_id: str) -> None:
        while self._queued(trial_id) < 2 and self.at[trial_id] < self.chunks.steps:
            start = self.at[trial_id]
            end = self.at[trial_id] = self.chunks.end_after(start)
            if (trial_id, end) in self.lose:  # dies when this chunk's result would come
                self.lose.discard((trial_id, end))
                index = next(i for i, t in self.workers.items() if t == trial_id)
                self.events.append(WorkerLost(index, "host/node00 cpu", trial_id, "ActorDiedError: killed"))
                return
            state = run_state(end, np.full(3, float(end))) if self.chunks.keeps_state(end) else None
            self.events.append(ChunkDone(trial_id, end - start, end, {"ratio_two_step": self.value[trial_id]},
                                         state, None))

    def request_state(self, trial_id: str) -> None:
        self.events.append(FinalState(trial_id, self.at[trial_id], run_state(self.at[trial_id])))

    def release(self, trial_id: str) -> None:
        self.workers = {i: (None if t == trial_id else t) for i, t in self.workers.items()}
        self.events = [e for e in self.events if e.trial_id != trial_id]

    def poll(self, timeout_s: float) -> list:
        """The oldest event of each trial, as the Ray executor reports one result per worker and wait."""
        out, seen = [], set()
        for e in self.events:
            if e.trial_id not in seen:
                out.append(e)
                seen.add(e.trial_id)
        self.events = [e for e in self.events if e not in out]
        for e in out:
            if isinstance(e, WorkerLost):  # its queued results are lost with it
                self.dead.add(e.index)
                self.release(e.trial_id)
        return out

    def summary(self) -> list[dict]:
        return [{"index": i, "where": "host", "dead": i in self.dead} for i in self.workers]

    def shutdown(self) -> None:
        self.shut = True

    def _queued(self, trial_id: str) -> int:
        return sum(1 for e in self.events if isinstance(e, ChunkDone) and e.trial_id == trial_id)


def make_driver(tmp_path, mlflow_uri, on_update=None, **fields) -> Driver:
    sweep = load_sweep({"name": "d", "spec": "tiny", "steps": 600, "checkpoint_every": 200, "metrics_every": 100,
                        "metric": {"name": "ratio_two_step", "mode": "min"}, **fields})
    trials = sweep.plan()
    folder = SweepFolder.create(tmp_path, "s", sweep.to_dict(), [t.to_dict() for t in trials])
    opts = DriverOptions(mlflow_uri=mlflow_uri, experiment=f"d-{tmp_path.name}", root=tmp_path, on_update=on_update)
    return Driver(folder, sweep, trials, opts, folder.state())
