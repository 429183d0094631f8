"""The driver's wiring without Ray: a scripted executor stands in for the Ray one and reports the events a real
one would (a trial's metric is its seed). Checks what the driver does with them: the journal (written before
acting), ASHA stops, a lost worker's trial continuing from its checkpoint, the failure budget and a stop signal.
The whole-sweep tests (tests/test_sweep.py, tests/test_sweep_faults.py) run the same driver on Ray."""

from __future__ import annotations

import pytest
from scripted_executor import make_driver

from pvm_dist.io import checkpoint
from pvm_dist.sweep.driver import Driver

pytest.importorskip("mlflow")


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
