"""Sweeps on a simulated cluster (``ray.cluster_utils.Cluster``: a head and two nodes with one logical GPU
each) and the faults of issue 5: a killed worker, a removed node, a killed driver, a diverging trial, the
failure budget and Ctrl-C. The driver runs as a process, as a user starts it; the test reads its journal
and MLflow store."""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest
from sweep_helpers import (RAY_ENV, driver_output, events, mlflow_runs, of, run, start, sweep_dir,
                           sweep_file, trial_runs, wait_for)

from pvm_dist.io import checkpoint

pytest.importorskip("ray")
pytest.importorskip("mlflow")
pytestmark = pytest.mark.slow

#: Trials long enough to interrupt mid-way on a 2-core machine (several seconds each); no readout, animation or
#: held-out score, which these faults do not touch (the first test keeps them).
LONG = {"steps": 1500, "checkpoint_every": 300, "metrics_every": 100, "n_seq": 8, "readout": False,
        "animation_frames": 0, "heldout_steps": 0}


@pytest.fixture(scope="module")
def cluster():
    os.environ.update(RAY_ENV)
    from ray.cluster_utils import Cluster

    from mlflow_server import free_port

    client_port = free_port()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0, "include_dashboard": False,
                                                      "ray_client_server_port": client_port})
    c.client_address = f"ray://127.0.0.1:{client_port}"
    for _ in range(2):
        c.add_node(num_cpus=1, num_gpus=1)
    c.wait_for_nodes()
    yield c
    c.shutdown()


def finished_ok(proc, tmp_path, timeout: float = 240) -> None:
    rc = proc.wait(timeout=timeout)
    assert rc == 0, driver_output(tmp_path)


def final_state(folder, trial: str) -> dict:
    return checkpoint.load(folder / "trials" / trial / "checkpoint.pvmckpt").state


def straight_run(trial_spec: str, overrides: dict, seed: int, n_seq: int, steps: int) -> dict:
    """The same trial trained in one go, in this process (the native CPU engine is deterministic)."""
    from pvm_dist.data import make_source
    from pvm_dist.engine import build_engine
    from pvm_dist.model.spec import load_spec

    spec = load_spec(trial_spec).with_overrides(overrides)
    engine = build_engine(spec, backend="native", n_seq=n_seq, seed=seed, device="cpu")
    source = make_source("synthetic:balls", spec.image_shape, n_seq, seed)
    engine.run(steps, source.frames)
    return engine.state()


def test_sweep_on_gpu_workers_records_parent_and_nested_runs(cluster, tmp_path):
    """Through Ray Client (ray://), as from a laptop outside the cluster."""
    f = sweep_file(tmp_path, "grid", vary={"initial_learning_rate": [0.002, 0.01]})
    res = run(tmp_path, "run", str(f), "--address", cluster.client_address, "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    import json

    out = json.loads(res.stdout)
    assert out["status"] == "FINISHED" and len(out["trials"]) == 2
    assert {t["status"] for t in out["trials"]} == {"FINISHED"}
    values = [t["metric"] for t in out["trials"]]
    assert out["best"]["metric"] == min(values)
    runs = mlflow_runs(tmp_path, "grid")
    parents = [r for r in runs if r.data.tags.get("pvm_dist.role") == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].data.tags["best_trial"] == out["best"]["trial_id"]
    trials = trial_runs(runs)
    assert sorted(trials) == ["t000", "t001"]
    for tid, r in trials.items():
        assert r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert r.info.status == "FINISHED"
        assert {"sweep_id", "trial_id", "node", "gpu", "backend", "host"} <= set(r.data.tags)
        assert r.data.params["spec.momentum"] and r.data.params["varied.initial_learning_rate"]
        assert "ratio_two_step" in r.data.metrics and "frames_per_s" in r.data.metrics
        import mlflow

        names = {a.path for a in mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").list_artifacts(r.info.run_id, "checkpoints")}
        assert names == {"checkpoints/checkpoint.pvmckpt"}
    # Two workers, one per logical GPU, on the two GPU nodes.
    assert len({(t["node"], t["gpu"]) for t in out["trials"]}) == 2
    status = run(tmp_path, "status", out["sweep_id"], "--json")
    assert json.loads(status.stdout)["counts"] == {"FINISHED": 2}
    again = run(tmp_path, "resume", out["sweep_id"], "--address", cluster.client_address)
    assert again.returncode == 2 and "no unfinished trials" in again.stderr


def test_killed_worker_trial_continues_from_its_last_checkpoint(cluster, tmp_path):
    overrides = {"delay_each_layer_learning": 10}
    f = sweep_file(tmp_path, "kill", vary={"seed": [3, 4]}, **LONG)
    proc = start(tmp_path, "run", str(f), "--address", cluster.address, "--json")
    folder = sweep_dir(tmp_path)
    ck = wait_for(folder, lambda e: e["event"] == "checkpoint" and e["trial"] == "t000", proc=proc)
    started = of(events(folder), "trial_started", "t000")[0]
    os.kill(started["pid"], signal.SIGKILL)
    finished_ok(proc, tmp_path)
    evs = events(folder)
    lost = of(evs, "trial_lost", "t000")
    assert lost and "worker lost" in lost[0]["reason"]
    restart = of(evs, "trial_started", "t000")[1]
    # Continued from its last checkpoint (at or after the one seen before the kill), not from step 0.
    assert restart["step"] == lost[0]["checkpoint_step"] >= ck["step"] > 0
    assert of(evs, "trial_ended", "t000")[0]["status"] == "FINISHED"
    # ... and ends exactly where an uninterrupted run ends.
    want = straight_run("tiny", overrides, seed=3, n_seq=LONG["n_seq"], steps=LONG["steps"])
    got = final_state(folder, "t000")
    for key in ("weights", "momentum"):
        np.testing.assert_array_equal(got[key], want[key])
    runs = trial_runs(mlflow_runs(tmp_path, "kill"))  # one run per trial, the continued one reopened
    assert runs["t000"].info.status == "FINISHED" and runs["t001"].info.status == "FINISHED"


def test_removed_node_trials_continue_on_another_node(cluster, tmp_path):
    f = sweep_file(tmp_path, "node", vary={"seed": [5, 6]}, max_failures=3, **LONG)
    proc = start(tmp_path, "run", str(f), "--address", cluster.address, "--json")
    folder = sweep_dir(tmp_path)
    wait_for(folder, lambda e: e["event"] == "checkpoint" and e["trial"] == "t000", proc=proc)
    node_id = of(events(folder), "trial_started", "t000")[0]["node"]
    victim = next(n for n in cluster.worker_nodes if n.node_id.startswith(node_id))
    cluster.remove_node(victim)
    try:
        finished_ok(proc, tmp_path)
        evs = events(folder)
        restart = of(evs, "trial_started", "t000")[1]
        assert restart["node"] != node_id and restart["step"] > 0
        assert {e["status"] for e in of(evs, "trial_ended")} == {"FINISHED"}
        assert of(evs, "failure")  # the lost worker counted against the failure budget
    finally:
        cluster.add_node(num_cpus=1, num_gpus=1)
        cluster.wait_for_nodes()


def test_killed_driver_resumes_without_redoing_or_duplicating(cluster, tmp_path):
    f = sweep_file(tmp_path, "drv", vary={"seed": [7, 8, 9]}, max_concurrent=1, **LONG)
    proc = start(tmp_path, "run", str(f), "--address", cluster.address, "--json")
    folder = sweep_dir(tmp_path)
    wait_for(folder, lambda e: e["event"] == "checkpoint" and e["trial"] == "t001", proc=proc)
    proc.kill()
    proc.wait()
    before = events(folder)
    assert of(before, "trial_ended", "t000")[0]["status"] == "FINISHED"
    ck_step = max(e["step"] for e in of(before, "checkpoint", "t001"))
    res = run(tmp_path, "resume", folder.name, "--address", cluster.address, "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    evs = events(folder)
    assert len(of(evs, "trial_started", "t000")) == 1  # finished work is reused
    assert of(evs, "trial_started", "t001")[-1]["step"] == ck_step  # continued from its checkpoint
    assert {e["trial"] for e in of(evs, "trial_ended")} == {"t000", "t001", "t002"}
    runs = mlflow_runs(tmp_path, "drv")
    assert len([r for r in runs if r.data.tags.get("pvm_dist.role") == "sweep"]) == 1
    trials = trial_runs(runs)
    assert sorted(trials) == ["t000", "t001", "t002"]
    assert all(r.info.status == "FINISHED" for r in trials.values())
    want = straight_run("tiny", {"delay_each_layer_learning": 10}, seed=8, n_seq=LONG["n_seq"], steps=LONG["steps"])
    np.testing.assert_array_equal(final_state(folder, "t001")["weights"], want["weights"])


def test_diverging_trial_fails_with_its_reason_and_the_rest_finish(cluster, tmp_path):
    f = sweep_file(tmp_path, "nan", vary={"initial_learning_rate": [0.002, 1.0e30, 0.01]})
    res = run(tmp_path, "run", str(f), "--address", cluster.address, "--json")
    assert res.returncode == 3, res.stderr[-3000:]  # some trials failed
    assert "1 of 3 trials failed" in res.stderr and "--retry-failed" in res.stderr
    import json

    out = {t["trial_id"]: t for t in json.loads(res.stdout)["trials"]}
    assert out["t001"]["status"] == "FAILED" and "NaN" in out["t001"]["reason"]
    assert out["t000"]["status"] == out["t002"]["status"] == "FINISHED"
    runs = trial_runs(mlflow_runs(tmp_path, "nan"))
    assert runs["t001"].info.status == "FAILED"
    assert "diverged" in runs["t001"].data.tags["status_reason"]
    assert runs["t000"].info.status == "FINISHED"


def test_trials_failing_in_their_first_chunk_leave_no_unhandled_ray_error(cluster, tmp_path):
    """Images fail as they are decoded, in a trial's first chunk, so its queued second chunk fails as well; the driver
    ended without reading that failure, and Ray printed it at exit as an "Unhandled error" traceback."""
    import cv2

    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(40):
        png = cv2.imencode(".png", np.full((16, 16, 3), 6 * i, np.uint8))[1].tobytes()
        (folder / f"{i:03d}.png").write_bytes(png[: len(png) // 2] if i == 5 else png)
    f = sweep_file(tmp_path, "bad", vary={"seed": [1, 2]}, data=str(folder), **LONG)
    res = run(tmp_path, "run", str(f), "--address", cluster.address)
    assert res.returncode == 4 and "every trial failed" in res.stderr, res.stderr[-3000:]
    assert "005.png" in res.stdout + res.stderr
    assert "Unhandled error" not in res.stderr and "Traceback" not in res.stderr, res.stderr[-3000:]


def test_failure_budget_stops_a_crash_loop(cluster, tmp_path):
    f = sweep_file(tmp_path, "loop", vary={"seed": [1, 2, 3, 4, 5, 6]}, max_failures=1, max_concurrent=1,
                   data=str(tmp_path / "missing.mp4"))
    res = run(tmp_path, "run", str(f), "--address", cluster.address)
    assert res.returncode == 3, res.stderr[-3000:]
    assert "failure budget spent: 2 failures > max_failures 1" in res.stderr
    assert "missing.mp4" in res.stderr and "pvm-dist sweep resume" in res.stderr
    evs = events(sweep_dir(tmp_path))
    assert len(of(evs, "trial_ended")) == 2  # stopped after the second failure, four trials never started
    assert of(evs, "sweep_ended")[0]["status"] == "FAILED"


def test_ctrl_c_checkpoints_running_trials_and_resume_finishes_in_the_same_runs(cluster, tmp_path):
    f = sweep_file(tmp_path, "sigint", vary={"seed": [1, 2]}, **LONG)
    proc = start(tmp_path, "run", str(f), "--address", cluster.address)
    folder = sweep_dir(tmp_path)
    wait_for(folder, lambda e: e["event"] == "checkpoint", proc=proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130, driver_output(tmp_path)
    assert f"pvm-dist sweep resume {folder.name}" in driver_output(tmp_path)
    evs = events(folder)
    assert of(evs, "sweep_ended")[0]["status"] == "INTERRUPTED"
    paused = [e for e in of(evs, "trial_lost") if e["reason"] == "sweep stopped"]
    assert paused, "running trials were checkpointed"
    runs = trial_runs(mlflow_runs(tmp_path, "sigint"))
    assert {r.info.status for r in runs.values()} == {"KILLED"}
    ids = {t: r.info.run_id for t, r in runs.items()}
    # Each paused trial's checkpoint is where it stopped: at its last reported step, not an interval back
    # (a trial stopped before its first chunk has nothing to keep).
    for e in paused:
        reported = [p["step"] for p in of(evs, "progress", e["trial"])]
        checkpoints = [c["step"] for c in of(evs, "checkpoint", e["trial"])]
        assert (checkpoints[-1] if checkpoints else 0) == (max(reported) if reported else 0)
    t0 = time.monotonic()
    res = run(tmp_path, "resume", folder.name, "--address", cluster.address, "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    runs = trial_runs(mlflow_runs(tmp_path, "sigint"))
    assert {t: r.info.run_id for t, r in runs.items()} == ids  # same runs, none added
    assert {r.info.status for r in runs.values()} == {"FINISHED"}
    assert time.monotonic() - t0 < 200


# ---- issue 14: an adaptive search and per-trial axes on the same cluster ---------------------------------

#: Short trials with nothing at the end but their checkpoint (no animation, no held-out score).
BRIEF = {"checkpoint_every": 100, "metrics_every": 50, "animation_frames": 0, "heldout_steps": 0}

def test_tpe_sweep_killed_driver_resumes_asking_no_trial_twice(cluster, tmp_path):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    f = sweep_file(tmp_path, "tpe", steps=200, **BRIEF, vary={"initial_learning_rate": {"loguniform": [0.0005, 0.05]},
                                                     "momentum": {"uniform": [0.5, 0.95]}},
                   search={"type": "tpe", "trials": 4, "startup_trials": 2}, max_concurrent=2)
    proc = start(tmp_path, "run", str(f), "--address", cluster.address, "--json")
    folder = sweep_dir(tmp_path)
    wait_for(folder, lambda e: e["event"] == "trial_ended", proc=proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = events(folder)
    res = run(tmp_path, "resume", folder.name, "--address", cluster.address, "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    evs = events(folder)
    added = {e["trial"]: e["definition"]["varied"] for e in of(evs, "trial_added")}
    assert len(of(evs, "trial_added")) == len(added) == 4  # each asked for once, 4 in all
    assert sorted(e["trial"] for e in of(evs, "trial_ended")) == sorted(added)
    assert {e["status"] for e in of(evs, "trial_ended")} == {"FINISHED"}
    for e in of(before, "trial_ended"):  # what ended before the kill was not trained again
        assert len(of(evs, "trial_started", e["trial"])) == 1
    open_, most = set(), 0
    for e in evs:
        open_ |= {e["trial"]} if e["event"] == "trial_added" else set()
        open_ -= {e["trial"]} if e["event"] == "trial_ended" else set()
        most = max(most, len(open_))
    assert most <= 2  # max_concurrent
    study = optuna.load_study(study_name="search",
                              storage=JournalStorage(JournalFileBackend(str(folder / "search.optuna.log"))))
    done = {f"t{t.number:03d}": t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE}
    assert {k: t.params for k, t in done.items()} == added  # the study knows every trial with what it trained
    assert all(t.state == optuna.trial.TrialState.FAIL for t in study.trials if f"t{t.number:03d}" not in done)
    assert sorted(trial_runs(mlflow_runs(tmp_path, "tpe"))) == sorted(added)  # one MLflow run per trial


def test_sweep_over_n_seq_and_data_with_a_frames_budget(cluster, tmp_path):
    from pvm_dist.run import state as run_state

    f = sweep_file(tmp_path, "axes", steps=None, frames=400, **{**BRIEF, "checkpoint_every": 50}, vary={"n_seq": [1, 4], "data": ["synthetic:balls",
                                                                                             "synthetic:bar"]})
    plan = run(tmp_path, "run", str(f), "--dry-run", "--json")
    assert plan.returncode == 0, plan.stderr
    rows = json.loads(plan.stdout)["trials"]
    assert [(r["varied"]["n_seq"], r["varied"]["data"], r["steps"]) for r in rows] == [
        (1, "synthetic:balls", 400), (1, "synthetic:bar", 400), (4, "synthetic:balls", 100), (4, "synthetic:bar", 100)]
    res = run(tmp_path, "run", str(f), "--address", cluster.address, "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    folder = sweep_dir(tmp_path)
    assert {e["status"] for e in of(events(folder), "trial_ended")} == {"FINISHED"}
    for r in rows:
        state = run_state.load(folder / "trials" / r["trial_id"] / "checkpoint.pvmckpt")[0]
        assert (state.run.n_seq, state.run.data) == (r["varied"]["n_seq"], r["varied"]["data"])
        assert state.step * state.run.n_seq == 400  # every trial saw the same frames
    logged = {t: (r.data.params["n_seq"], r.data.params["steps"]) for t, r in trial_runs(mlflow_runs(tmp_path, "axes")).items()}
    assert logged == {r["trial_id"]: (str(r["varied"]["n_seq"]), str(r["steps"])) for r in rows}


@pytest.mark.exhaustive  # two driver processes on Ray: over a minute on a shared 2-core machine; the same death
# inside one process is tests/test_sweep_search.py::test_a_driver_dying_right_after_an_exploit_resumes_the_population
def test_pbt_sweep_killed_driver_resumes_the_population(cluster, tmp_path):
    f = sweep_file(tmp_path, "pbt", steps=800, n_seq=8, **{**BRIEF, "checkpoint_every": 200, "metrics_every": 100},
                   seed=5, max_concurrent=2,
                   vary={"initial_learning_rate": {"loguniform": [0.0005, 0.2]}, "momentum": {"uniform": [0.3, 0.95]}},
                   metric={"name": "ratio_two_step", "mode": "min"},
                   search={"type": "pbt", "population": 2, "interval_steps": 200, "quantile": 0.5,
                           "explore": {"initial_learning_rate": {"perturb": [0.8, 1.25]}, "momentum": "resample"}})
    proc = start(tmp_path, "run", str(f), "--address", cluster.address, "--json")
    folder = sweep_dir(tmp_path)
    # Mid-population: both members have a checkpoint (and so a rung value) and neither has ended.
    wait_for(folder, lambda e: {x["trial"] for x in of(events(folder), "checkpoint")} == {"t000", "t001"}, proc=proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = events(folder)
    assert not of(before, "trial_ended")
    kept = {e["trial"]: e["step"] for e in before if e["event"] in ("checkpoint", "exploit")}  # last of each
    res = run(tmp_path, "resume", folder.name, "--address", cluster.address, "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    evs = events(folder)
    after = evs[len(before):]
    # Each member went on from what it had kept (its own checkpoint, or a donor's copy), not from step 0 ...
    assert {t: of(after, "trial_started", t)[0]["step"] for t in ("t000", "t001")} == kept
    assert {(e["trial"], e["status"], e["step"]) for e in of(evs, "trial_ended")} == {("t000", "FINISHED", 800),
                                                                                    ("t001", "FINISHED", 800)}
    # ... and the policy went on ranking them at the intervals after the kill, against values from before it.
    rungs = {(e["trial"], e["step"]) for e in of(evs, "milestone")}
    assert {(t, s) for t in ("t000", "t001") for s in (200, 400, 600)} <= rungs
    assert len(of(evs, "milestone")) == len(rungs)  # no interval value recorded twice
    rows = {r["trial_id"]: r for r in json.loads(res.stdout)["trials"]}
    runs = trial_runs(mlflow_runs(tmp_path, "pbt"))
    assert sorted(runs) == ["t000", "t001"]  # one MLflow run per member, the resumed one reopened
    for exploit in of(evs, "exploit"):  # the lineage of every copy, before and after the kill
        last = [e for e in of(evs, "exploit") if e["trial"] == exploit["trial"]][-1]
        assert rows[exploit["trial"]]["varied"] == last["values"]
        assert f'"donor": "{exploit["donor"]}"' in runs[exploit["trial"]].data.tags["pbt_lineage"]
