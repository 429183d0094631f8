"""Sweeps on this machine: successive halving, the journal, the CLI's checks, and a whole sweep on a local
Ray instance that pvm-dist starts itself (CPU workers), tracked by a real MLflow server with served artifacts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_command
from sweep_helpers import environment, events, mlflow_runs, of, run, sweep_dir, sweep_file, trial_runs

from pvm_dist.engine.native import build_info, native_module
from pvm_dist.sweep.asha import SuccessiveHalving
from pvm_dist.sweep.journal import FAILED, FINISHED, PENDING, RUNNING, SweepFolder

# ---- successive halving ---------------------------------------------------------------------------


def test_asha_keeps_the_best_fraction_of_each_rung_as_trials_arrive():
    asha = SuccessiveHalving([100, 200], reduction_factor=2, mode="min")
    assert asha.record("a", 100, 5.0)  # alone in its rung: nothing to compare with yet
    assert not asha.record("b", 100, 6.0)  # two values, the best one goes on: b is the worse
    assert asha.record("c", 100, 4.0)  # three values, one goes on: c is the best
    assert asha.record("d", 100, 4.5)  # four values, two go on: 4.0 and 4.5
    assert not asha.record("e", 100, 4.6)  # five values, two go on
    assert asha.record("a", 200, 3.0)  # rungs are separate
    assert not asha.record("x", 100, float("nan"))  # a non-finite value never goes on


def test_asha_max_mode_and_checks():
    asha = SuccessiveHalving([10], reduction_factor=3, mode="max")
    assert asha.record("a", 10, 0.1) and asha.record("b", 10, 0.2)
    assert not asha.record("c", 10, 0.15)  # three values, one goes on: 0.2
    assert asha.record("d", 10, 0.9)
    with pytest.raises(ValueError):
        SuccessiveHalving([10], reduction_factor=1, mode="min")
    with pytest.raises(ValueError):
        SuccessiveHalving([10], reduction_factor=2, mode="lowest")


# ---- the journal ------------------------------------------------------------------------------------


def test_journal_replays_trial_states_and_skips_a_torn_last_line(tmp_path):
    folder = SweepFolder.create(tmp_path, "s1", {"name": "s"}, [{"trial_id": t} for t in ("t0", "t1", "t2")])
    folder.append("sweep_started", parent_run_id="p", mlflow_uri="sqlite:///x.db", experiment="e", host="h", pid=1)
    folder.append("trial_started", trial="t0", step=0, node="n1", gpu="0", warm=False, start_cost_s=0.5)
    folder.append("progress", trial="t0", step=100, metric=2.5, steps_per_s=10.0, frames_per_s=10.0, metrics={})
    folder.append("checkpoint", trial="t0", step=100, path="p")
    folder.append("progress", trial="t0", step=150, metric=2.4, steps_per_s=10.0, frames_per_s=10.0, metrics={})
    folder.append("trial_lost", trial="t0", reason="worker lost")
    folder.append("trial_started", trial="t0", step=100, node="n2", gpu="1", warm=True, start_cost_s=0.02)
    folder.append("trial_started", trial="t1", step=0, node="n1", gpu="0", warm=True, start_cost_s=0.03)
    folder.append("trial_ended", trial="t1", status=FAILED, reason="diverged", step=50)
    folder.append("failure", what="t1")
    with open(folder.journal_file, "a") as f:
        f.write('{"time": 1, "event": "trial_ended", "trial": "t0", "sta')  # the driver killed mid-write
    st = folder.state()
    t0, t1, t2 = st.trials["t0"], st.trials["t1"], st.trials["t2"]
    assert (t0.status, t0.step, t0.checkpoint_step, t0.node, t0.starts) == (RUNNING, 100, 100, "n2", 2)
    assert t0.start_cost_s == [0.02]  # only starts on a worker that had run a trial count as warm
    assert (t1.status, t1.reason) == (FAILED, "diverged")
    assert t2.status == PENDING
    assert st.failures == 1 and st.parent_run_id == "p" and st.experiment == "e"
    assert st.unfinished() == ["t0", "t2"]


# ---- the CLI's checks --------------------------------------------------------------------------------


def test_dry_run_and_validate_print_the_plan_without_a_cluster(tmp_path):
    f = sweep_file(tmp_path, "plan", vary={"momentum": [0.5, 0.9], "seed": [1, 2]})
    res = run(tmp_path, "run", str(f), "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert [t["trial_id"] for t in plan["trials"]] == ["t000", "t001", "t002", "t003"]
    assert plan["total_frames"] == 4 * 400
    assert not (tmp_path / "sweeps").exists()  # a dry run starts nothing and writes nothing
    from conftest import cli_command
    import subprocess

    res = subprocess.run([*cli_command(), "validate", str(f)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "4 trials" in res.stdout


@pytest.mark.parametrize("fields, message", [
    ({"vary": {"momentun": [0.5]}}, "momentum"),  # unknown key, with the suggestion
    ({"vary": {"momentum": {"uniform": [0.9, 0.1]}}}, "vary.momentum"),
    ({"spec": "no_such_model"}, "no_such_model"),
    ({"colour": "blue"}, "colour"),
])
def test_bad_sweep_files_get_one_clear_message(tmp_path, fields, message):
    f = sweep_file(tmp_path, "bad", **fields)
    res = run(tmp_path, "run", str(f))
    assert res.returncode == 2
    assert message in res.stderr and "Traceback" not in res.stderr


def test_status_of_an_unknown_sweep_is_a_user_error(tmp_path):
    res = run(tmp_path, "status", "nope")
    assert res.returncode == 2 and "no sweep 'nope'" in res.stderr


# ---- a whole sweep on a local Ray, with early stopping ------------------------------------------------


def test_local_sweep_with_early_stopping_against_a_tracking_server(tmp_path):
    """No --address: pvm-dist starts Ray itself. One worker at a time, so ASHA's decisions are fixed:
    the trial that does not learn (rate 0) is stopped at the first milestone and the next trial takes its place."""
    pytest.importorskip("ray")
    from mlflow_server import MlflowServer

    server = MlflowServer(tmp_path / "server")
    server.root.mkdir()
    server.start()
    try:
        f = sweep_file(tmp_path, "asha", steps=600, checkpoint_every=200, metrics_every=100,
                       vary={"initial_learning_rate": [0.01, 0.0, 0.005]},
                       overrides={"delay_each_layer_learning": 10, "intermediate_learning_rate": 0.0,
                                  "final_learning_rate": 0.0},
                       early_stopping={"type": "asha", "grace_steps": 200, "reduction_factor": 2})
        res = run(tmp_path, "run", str(f), "--mlflow", server.uri, "--max-concurrent", "1", "--json")
        assert res.returncode == 0, res.stderr[-3000:]
        assert res.stdout.strip(), res.stderr[-3000:]
        out = json.loads(res.stdout)
        status = {t["trial_id"]: t for t in out["trials"]}
        assert status["t000"]["status"] == FINISHED
        assert status["t001"]["status"] == "STOPPED" and status["t001"]["step"] == 200
        assert "early stop at step 200" in status["t001"]["reason"]
        assert out["best"]["trial_id"] in ("t000", "t002")
        evs = events(sweep_dir(tmp_path))
        stop_time = of(evs, "trial_ended", "t001")[0]["time"]
        assert of(evs, "trial_started", "t002")[0]["time"] >= stop_time  # its worker went to the next trial
        import mlflow

        client = mlflow.MlflowClient(server.uri)
        exp = client.get_experiment_by_name("asha")
        runs = client.search_runs([exp.experiment_id])
        trials = trial_runs(runs)
        assert sorted(trials) == ["t000", "t001", "t002"]
        assert trials["t001"].data.tags["sweep_status"] == "STOPPED"
        # The checkpoint reached the server's artifact store: any machine can fetch it from there.
        local = client.download_artifacts(trials["t000"].info.run_id, "checkpoints/checkpoint.pvmckpt", str(tmp_path))
        from pvm_dist.io import checkpoint

        assert checkpoint.load(local).step == 600
        from conftest import cli_command
        import os
        import subprocess

        cmp = subprocess.run([*cli_command(), "compare", "asha", "--mlflow", server.uri, "--json"], capture_output=True,
                             text=True, timeout=120, env={**os.environ, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"})
        assert cmp.returncode == 0, cmp.stderr
        rows = json.loads(cmp.stdout)["runs"]
        # The trials, not the parent run, each named by its varied value.
        assert sorted(r["name"] for r in rows) == ["lr=0.0 (t001)", "lr=0.005 (t002)", "lr=0.01 (t000)"]
    finally:
        server.kill()


def test_unreachable_cluster_is_one_line_and_leaves_nothing(tmp_path):
    from mlflow_server import free_port

    f = sweep_file(tmp_path, "away")
    res = run(tmp_path, "run", str(f), "--address", f"127.0.0.1:{free_port()}", timeout=60)
    assert res.returncode == 2 and "cannot reach a Ray cluster at 127.0.0.1:" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "sweeps").exists() or not any((tmp_path / "sweeps").iterdir())


# ---- the engine every worker gets -------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent
TRIAL = {"steps": 120, "checkpoint_every": 60, "metrics_every": 30, "picture_every": 60, "heldout_steps": 20,
         "readout_lr": 0.5, "overrides": {"delay_each_layer_learning": 10, "initial_learning_rate": 0.05}}


def _from_repo_root(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``pvm-dist sweep ARGS`` run from the checkout's root, as the README runs it."""
    return subprocess.run([*cli_command(), "sweep", *args, "--root", str(tmp_path / "sweeps")], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, env=environment(tmp_path))


@pytest.mark.skipif(native_module() is None, reason="the native module is not built")
def test_sweep_from_the_repo_root_trains_on_the_native_engine_like_train(tmp_path):
    """From the repo root, Ray workers import the installed package (not the source tree) and build the native
    engine; a trial on labelled data logs what `train` logs for the same run configuration, to the bit."""
    pytest.importorskip("ray")
    import mlflow

    f = sweep_file(tmp_path, "root", vary={"seed": [0, 1]}, **TRIAL)
    res = _from_repo_root(tmp_path, "run", str(f), "--json", "--mlflow", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert res.returncode == 0, res.stderr[-3000:]
    assert {t["status"] for t in json.loads(res.stdout)["trials"]} == {FINISHED}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    trials = trial_runs(mlflow_runs(tmp_path, "root"))
    assert sorted(trials) == ["t000", "t001"]
    assert {r.data.tags["backend"] for r in trials.values()} == {"native"}

    run_dir = tmp_path / "train"
    args = ["train", "--spec", "tiny", "--steps", "120", "--seed", "0", "--n-seq", "1", "--backend", "native",
            "--data", "synthetic:balls", "--metrics-every", "30", "--picture-every", "60", "--heldout-steps", "20",
            "--readout-lr", "0.5", "-O", "delay_each_layer_learning=10", "-O", "initial_learning_rate=0.05",
            "--checkpoint-every", "60", "--run-dir", str(run_dir), "--experiment", "train", "--mlflow", uri, "--json"]
    out = subprocess.run([*cli_command(), *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env=environment(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    (local,) = mlflow_runs(tmp_path, "train")
    trial = trials["t000"]
    heldout = {k: v for k, v in local.data.metrics.items() if k.startswith("heldout_")}
    assert {"heldout_readout_iou", "heldout_readout_hit_rate", "heldout_l0_two_step_px"} <= heldout.keys()
    assert {k: trial.data.metrics[k] for k in heldout} == heldout
    for key in ("l0_two_step_px", "baseline_two_step_px", "ratio_two_step"):
        assert trial.data.metrics[key] == local.data.metrics[key], key
    client = mlflow.MlflowClient(uri)
    listed = {a.path for a in client.list_artifacts(trial.info.run_id)}
    assert {"prediction.gif", "pictures", "checkpoints"} <= listed
    # Both name their data as the same MLflow dataset (synthetic balls of seed 0: one digest).
    given = [[(d.dataset.name, d.dataset.digest) for d in client.get_run(r.info.run_id).inputs.dataset_inputs]
             for r in (trial, local)]
    assert given[0] == given[1] and given[0][0][0] == "synthetic:balls" and len(given[0]) == 1
    # The sweep's checkpoint at step 60 was handed over while the worker trained on (asked for later), the one at
    # 120 with the last chunk; both equal train's own checkpoints there, every array to the bit.
    from pvm_dist.run import state as run_state

    folder = next((tmp_path / "sweeps").glob("root-*"))
    steps = [e["step"] for e in events(folder) if e["event"] == "checkpoint" and e["trial"] == "t000"]
    assert steps == [60, 120]
    for step in (60, 120):
        swept = run_state.load(folder / "trials" / "t000" / "checkpoints" / f"step_{step:09d}.pvmckpt")[0]
        trained = run_state.load(run_dir / "checkpoints" / f"step_{step:09d}.pvmckpt")[0]
        for part in ("engine", "readout"):
            got, want = getattr(swept, part), getattr(trained, part)
            assert got.keys() == want.keys() and want
            for key, value in want.items():
                assert np.asarray(got[key]).tobytes() == np.asarray(value).tobytes(), (step, part, key)


@pytest.mark.skipif(native_module() is None or bool(build_info().get("devices")),
                    reason="needs the native module and no GPU (the sweep asks for a CUDA engine it cannot build)")
def test_a_sweep_whose_engine_cannot_load_fails_once_before_any_trial(tmp_path):
    pytest.importorskip("ray")
    f = sweep_file(tmp_path, "nocuda", device="cuda", vary={"seed": [0, 1, 2]}, max_failures=5, **TRIAL)
    res = _from_repo_root(tmp_path, "run", str(f))
    assert res.returncode == 3, res.stderr[-3000:]
    failed = [line for line in res.stderr.splitlines() if line.startswith("pvm-dist: sweep failed:")]
    assert len(failed) == 1 and "cannot build the 'native' engine" in failed[0], res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    evs = events(sweep_dir(tmp_path))
    assert not of(evs, "trial_started") and not of(evs, "failure")  # no trial burnt the failure budget
