"""The driver's wiring without Ray: a scripted executor stands in for the Ray one and reports the events a real
one would (a trial's metric is its seed). Checks what the driver does with them: the journal (written before
acting), ASHA stops, a lost worker's trial continuing from its checkpoint, the failure budget and a stop signal.
The whole-sweep tests (tests/test_sweep.py, tests/test_sweep_faults.py) run the same driver on Ray."""

from __future__ import annotations

import numpy as np
import pytest

from pvm_dist.io import checkpoint
from pvm_dist.sweep import driver as driver_module
from pvm_dist.sweep.driver import Driver, DriverOptions
from pvm_dist.sweep.executor import (ChunkDone, FinalState, PoolWorker, TrialError, TrialStarted, WorkerInfo,
                                     WorkerLost)
from pvm_dist.sweep.journal import SweepFolder
from pvm_dist.sweep.plan import load_sweep

pytest.importorskip("mlflow")


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


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setattr(driver_module, "Executor", ScriptedExecutor)
    monkeypatch.setattr(ScriptedExecutor, "lose", set())
    monkeypatch.setattr(ScriptedExecutor, "fail", False)
    return ScriptedExecutor


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def make_driver(tmp_path, mlflow_uri, on_update=None, **fields) -> Driver:
    sweep = load_sweep({"name": "d", "spec": "tiny", "steps": 600, "checkpoint_every": 200, "metrics_every": 100,
                        "metric": {"name": "ratio_two_step", "mode": "min"}, **fields})
    trials = sweep.plan()
    folder = SweepFolder.create(tmp_path, "s", sweep.to_dict(), [t.to_dict() for t in trials])
    opts = DriverOptions(mlflow_uri=mlflow_uri, experiment=f"d-{tmp_path.name}", root=tmp_path, on_update=on_update)
    return Driver(folder, sweep, trials, opts, folder.state())


def journal(driver: Driver, *kinds: str) -> list[tuple]:
    return [(e["event"], e.get("trial"), e.get("step")) for e in driver.folder.events() if e["event"] in kinds]


def test_asha_stops_trials_and_journals_each_milestone_before_acting(tmp_path, mlflow_uri, scripted):
    d = make_driver(tmp_path, mlflow_uri, vary={"seed": [1, 5, 2]}, max_concurrent=1,
                    early_stopping={"type": "asha", "grace_steps": 200, "reduction_factor": 2})
    out = d.run()
    assert out.status == "FINISHED" and out.best["trial_id"] == "t000"
    status = {t["trial_id"]: (t["status"], t["step"]) for t in out.trials}
    assert status == {"t000": ("FINISHED", 600), "t001": ("STOPPED", 200), "t002": ("STOPPED", 200)}
    assert "early stop at step 200: ratio_two_step = 5" in out.trials[1]["reason"]
    assert journal(d, "milestone", "trial_ended") == [
        ("milestone", "t000", 200), ("milestone", "t000", 400), ("trial_ended", "t000", 600),
        ("milestone", "t001", 200), ("trial_ended", "t001", 200),
        ("milestone", "t002", 200), ("trial_ended", "t002", 200)]
    assert out.frames == (600 + 200 + 200) * d.sweep.run.n_seq and scripted.last.shut
    # A resumed driver's scheduler gets the rungs back from the journal.
    again = Driver(d.folder, d.sweep, list(d.trials.values()), d.opts, d.folder.state())
    assert again.scheduler.halving.rungs == {200: {"t000": 1.0, "t001": 5.0, "t002": 2.0}, 400: {"t000": 1.0}}


def test_lost_worker_trial_continues_from_its_checkpoint_on_a_replacement(tmp_path, mlflow_uri, scripted):
    scripted.lose = {("t000", 300)}
    d = make_driver(tmp_path, mlflow_uri, vary={"seed": [1, 2]}, max_concurrent=1, max_failures=1)
    out = d.run()
    assert out.status == "FINISHED" and {t["status"] for t in out.trials} == {"FINISHED"}
    starts = [e["step"] for e in d.folder.events() if e["event"] == "trial_started" and e["trial"] == "t000"]
    assert starts == [0, 200]  # continued from its checkpoint at 200
    lost = [e for e in d.folder.events() if e["event"] == "trial_lost"]
    assert lost[0]["reason"] == "worker lost: ActorDiedError: killed" and lost[0]["checkpoint_step"] == 200
    assert d.state.failures == 1 and len(scripted.last.workers) == 2  # counted, and a replacement started
    assert checkpoint.load(d.folder.checkpoint_file("t000")).step == 600


def test_failure_budget_stops_the_sweep(tmp_path, mlflow_uri, scripted):
    scripted.fail = True
    d = make_driver(tmp_path, mlflow_uri, vary={"seed": [1, 2, 3, 4]}, max_concurrent=1, max_failures=1)
    out = d.run()
    assert out.status == "FAILED"
    assert out.reason.startswith("failure budget spent: 2 failures > max_failures 1 (last: trial t001: DataError")
    assert [t["status"] for t in out.trials] == ["FAILED", "FAILED", "PENDING", "PENDING"]


def test_a_stop_signal_checkpoints_running_trials_where_they_are(tmp_path, mlflow_uri, scripted):
    def interrupt(driver: Driver) -> None:
        if any(e["event"] == "progress" for e in driver.folder.events()):
            driver.interrupted = True

    d = make_driver(tmp_path, mlflow_uri, on_update=interrupt, vary={"seed": [1, 2, 3]}, max_concurrent=2)
    out = d.run()
    assert out.status == "INTERRUPTED"
    paused = [e["trial"] for e in d.folder.events() if e["event"] == "trial_lost" and e["reason"] == "sweep stopped"]
    assert sorted(paused) == ["t000", "t001"] and out.trials[2]["status"] == "PENDING"
    for trial in paused:
        reported = max(e["step"] for e in d.folder.events() if e["event"] == "progress" and e["trial"] == trial)
        assert checkpoint.load(d.folder.checkpoint_file(trial)).step == reported


def test_a_restarted_trial_logs_each_step_once(tmp_path, mlflow_uri, scripted):
    """Lost after reporting step 300 with its checkpoint at 200: the replacement redoes step 300, which MLflow
    gets no second time (issue 16, item 11)."""
    import mlflow

    scripted.lose = {("t000", 400)}
    d = make_driver(tmp_path, mlflow_uri, max_failures=1)
    out = d.run()
    assert out.status == "FINISHED"
    assert [e["step"] for e in d.folder.events() if e["event"] == "trial_started"] == [0, 200]
    reported = [e["step"] for e in d.folder.events() if e["event"] == "progress"]
    assert reported.count(300) == 2  # redone
    client = mlflow.MlflowClient(mlflow_uri)
    history = client.get_metric_history(d.state.trials["t000"].run_id, "ratio_two_step")
    assert sorted(m.step for m in history) == [100, 200, 300, 400, 500, 600]
