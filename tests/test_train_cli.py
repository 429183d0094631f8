"""`pvm-dist train` and `eval` end to end: MLflow records, exact resume in the same run, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_command
from mlflow_server import MlflowServer

from pvm_dist.io import checkpoint
from pvm_dist.data.synthetic import BarSource

mlflow = pytest.importorskip("mlflow")
CLI = cli_command()
FAST = ["--spec", "tiny", "-O", "delay_each_layer_learning=10", "--metrics-every", "10", "--picture-every", "20"]


@pytest.fixture
def env(tmp_path):
    """A private SQLite store for each test, and fast failure against dead HTTP servers."""
    return {**os.environ, "PVM_MLFLOW_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


def run(env, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env)


def runs_of(uri: str, experiment: str = "pvm-dist") -> list:
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id])


def artifacts(uri: str, run_id: str, path: str = "") -> set[str]:
    client = mlflow.MlflowClient(tracking_uri=uri)
    out = set()
    for item in client.list_artifacts(run_id, path or None):
        out |= artifacts(uri, run_id, item.path) if item.is_dir else {item.path}
    return out


def test_train_records_everything_in_mlflow(env, tmp_path):
    out = run(env, "train", "--steps", "40", "--n-seq", "2", "--run-dir", str(tmp_path / "r"), "--json",
              "--checkpoint-every", "20", *FAST)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    (mlrun,) = runs_of(env["PVM_MLFLOW_URI"])
    assert mlrun.info.run_id == summary["mlflow_run_id"] and mlrun.info.status == "FINISHED"
    params = mlrun.data.params
    assert params["spec.layer_shapes"] == "[4, 2, 1]" and params["spec.delay_each_layer_learning"] == "10"
    assert params["overrides.delay_each_layer_learning"] == "10" and params["n_seq"] == "2"
    assert params["data"] == "synthetic:balls" and params["seed"] == "0"
    for key in ("l0_two_step_px", "baseline_two_step_px", "ratio_two_step", "frames_per_s", "layer2_mse_one_step"):
        assert key in mlrun.data.metrics
    tags = mlrun.data.tags
    assert tags["backend"] in ("native", "reference") and tags["host"] and tags["pvm_dist.version"]
    history = mlflow.MlflowClient(tracking_uri=env["PVM_MLFLOW_URI"]).get_metric_history(mlrun.info.run_id, "ratio_two_step")
    assert [m.step for m in history] == [10, 20, 30, 40]
    files = artifacts(env["PVM_MLFLOW_URI"], mlrun.info.run_id)
    assert {"spec.json", "pictures/step_000000020.png", "pictures/step_000000040.png",
            "checkpoints/step_000000040.pvmckpt", "prediction.gif"} <= files
    assert not any(f.startswith("checkpoints/") and f != "checkpoints/step_000000040.pvmckpt" for f in files)
    # The last checkpoint, once on disk: MLflow's local store holds a link to the run folder's file.
    stored = Path(mlflow.MlflowClient(tracking_uri=env["PVM_MLFLOW_URI"]).get_run(mlrun.info.run_id).info.artifact_uri
                  .removeprefix("file://")) / "checkpoints" / "step_000000040.pvmckpt"
    assert stored.samefile(tmp_path / "r" / "checkpoints" / "step_000000040.pvmckpt")
    assert checkpoint.load(stored).step == 40
    assert summary["picture"].endswith("step_000000040.png") and summary["animation"].endswith("prediction.gif")
    # Where to look: the run's charts in the UI's model-training view, at `mlflow ui`'s address for a SQLite store.
    assert summary["mlflow_page"] == (f"http://127.0.0.1:5000/#/experiments/{mlrun.info.experiment_id}/runs/"
                                      f"{mlrun.info.run_id}/model-metrics?workflowType=machine_learning")


def test_train_then_resume_equals_straight_run_in_the_same_mlflow_run(env, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert run(env, "train", "--steps", "60", "--run-dir", str(a), "--experiment", "straight", "-q", *FAST).returncode == 0
    out = run(env, "train", "--steps", "25", "--run-dir", str(b), "--experiment", "resumed", "-q", *FAST)
    assert out.returncode == 0, out.stderr
    out = run(env, "train", "--resume", str(b / "checkpoints" / "step_000000025.pvmckpt"), "--steps", "60", "--json")
    assert out.returncode == 0, out.stderr
    page = json.loads(out.stdout)["mlflow_page"]
    straight = checkpoint.load(a / "checkpoints" / "step_000000060.pvmckpt")
    resumed = checkpoint.load(b / "checkpoints" / "step_000000060.pvmckpt")
    assert straight.spec == resumed.spec and straight.spec["delay_each_layer_learning"] == 10
    assert straight.state.keys() == resumed.state.keys() and any(k.startswith("readout_") for k in straight.state)
    for key, value in straight.state.items():  # the model; not the background baseline's running means (metrics_*),
        if not key.startswith("metrics_"):  # summed in blocks that the shorter run's end at step 25 split differently
            assert np.array_equal(value, resumed.state[key]), key
    (mlrun,) = runs_of(env["PVM_MLFLOW_URI"], "resumed")  # one run, continued
    assert f"/#/experiments/{mlrun.info.experiment_id}/runs/{mlrun.info.run_id}/" in page  # (its experiment looked up)
    history = mlflow.MlflowClient(tracking_uri=env["PVM_MLFLOW_URI"]).get_metric_history(mlrun.info.run_id, "frames_per_s")
    assert sorted(m.step for m in history) == [10, 20, 25, 30, 40, 50, 60] and mlrun.info.status == "FINISHED"
    lines = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [10, 20, 30, 40, 50, 60]


def test_resume_keeps_the_checkpointed_data_and_cadence_unless_told(env, tmp_path):
    run_dir = tmp_path / "r"
    first = ["train", "--steps", "40", "--data", "synthetic:bar", "--metrics-every", "10", "--checkpoint-every", "20",
             "--keep", "5", "--picture-every", "0", "--run-dir", str(run_dir), "-q", "--no-track",
             "-O", "delay_each_layer_learning=10"]
    assert run(env, *first).returncode == 0
    out = run(env, "train", "--resume", str(run_dir / "checkpoints" / "step_000000040.pvmckpt"), "--steps", "80",
              "--json")
    assert out.returncode == 0, out.stderr
    ck = checkpoint.load(run_dir / "checkpoints" / "step_000000080.pvmckpt")
    assert ck.meta["data"] == "synthetic:bar" and ck.meta["metrics_every"] == 10 and ck.meta["track"] is False
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(10, 90, 10))  # the checkpointed cadence, not the CLI's default of 50
    kept = sorted(p.name for p in (run_dir / "checkpoints").glob("*.pvmckpt"))
    assert kept == [f"step_{s:09d}.pvmckpt" for s in (20, 40, 60, 80)]  # checkpoint_every 20, keep 5
    out = run(env, "train", "--resume", str(run_dir / "checkpoints" / "step_000000080.pvmckpt"), "--steps", "100",
              "--metrics-every", "20", "-q")
    assert out.returncode == 0, out.stderr
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1:] == [100] and steps[-2] == 80  # told otherwise: every 20 from there
    assert checkpoint.load(run_dir / "checkpoints" / "step_000000100.pvmckpt").meta["metrics_every"] == 20


def test_a_diverging_run_stops_with_one_line(env, tmp_path):
    out = run(env, "train", "--steps", "200", "--metrics-every", "20", "--run-dir", str(tmp_path / "r"), "-q",
              "-O", "initial_learning_rate=1e30", "-O", "momentum=0.99")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("pvm-dist: error: diverged by step 20: prediction error is NaN")
    (mlrun,) = runs_of(env["PVM_MLFLOW_URI"])
    assert mlrun.info.status == "FAILED"


def _hangup(disposition: signal.Handlers) -> None:
    """In a child before exec: SIGHUP as a terminal session (SIG_DFL) or ``nohup`` (SIG_IGN) gives it, whatever this
    test process inherited (a CI job under nohup ignores it)."""
    signal.signal(signal.SIGHUP, disposition)


@pytest.fixture
def started_train(env, tmp_path):
    """``started_train(ignore_hangup=False)``: a long train, once it has logged its first metrics (``ignore_hangup``:
    started as under ``nohup``); killed at the test's end if a failing test left it running."""
    procs: list[subprocess.Popen] = []

    def start(ignore_hangup: bool = False) -> subprocess.Popen:
        disposition = signal.SIG_IGN if ignore_hangup else signal.SIG_DFL
        proc = subprocess.Popen([*CLI, "train", "--steps", "1000000", "--run-dir", str(tmp_path), "-q", *FAST],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                preexec_fn=lambda: _hangup(disposition))
        procs.append(proc)
        deadline = time.time() + 120
        while not (tmp_path / "metrics.jsonl").exists() or not (tmp_path / "metrics.jsonl").read_text():
            assert time.time() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() is not None else ""
            time.sleep(0.1)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# SIGHUP: the terminal or SSH session closed. It ended the process where it stood, losing the steps since the
# last checkpoint and leaving the MLflow run RUNNING.
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP], ids=["SIGINT", "SIGHUP"])
def test_sigint_saves_checkpoint_closes_run_killed_and_prints_resume(env, tmp_path, started_train, sig):
    proc = started_train()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "resume with: pvm-dist train --resume" in err and "Traceback" not in err
    saved = sorted((tmp_path / "checkpoints").glob("*.pvmckpt"))
    assert len(saved) == 1
    ck = checkpoint.load(saved[0])
    assert 10 <= ck.step < 1_000_000 and ck.state["step"] == ck.step
    (mlrun,) = runs_of(env["PVM_MLFLOW_URI"])
    assert mlrun.info.status == "KILLED" and ck.meta["run_id"] == mlrun.info.run_id


def test_a_run_whose_terminal_closes_saves_where_it_stood(env, tmp_path):
    """In a terminal (a pseudo-terminal here), then the terminal goes away: the run's state at that step is kept
    (it was lost back to the last checkpoint; here none was due before the end)."""
    pty = pytest.importorskip("pty")
    pid, fd = pty.fork()
    if pid == 0:  # the child: the run, in the terminal
        _hangup(signal.SIG_DFL)
        os.execve(CLI[0], [*CLI, "train", "--steps", "1000000", "--run-dir", str(tmp_path / "r"), "--no-track",
                           "--checkpoint-every", "0", *FAST], env)
    import select

    try:
        deadline = time.time() + 120
        while not (tmp_path / "r" / "metrics.jsonl").exists() or not (tmp_path / "r" / "metrics.jsonl").read_text():
            assert time.time() < deadline
            if select.select([fd], [], [], 0.2)[0]:
                os.read(fd, 65536)  # what the terminal shows (read, or the run would wait on a full terminal)
        os.close(fd)  # the terminal closes: the kernel hangs up its session
        deadline = time.time() + 120
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            assert time.time() < deadline, "the run went on after its terminal closed"
            time.sleep(0.1)
        pid = 0
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    saved = sorted((tmp_path / "r" / "checkpoints").glob("*.pvmckpt"))
    assert len(saved) == 1 and 10 <= checkpoint.load(saved[0]).step < 1_000_000


def test_an_ignored_hangup_is_left_ignored(started_train):
    """Under nohup the run goes on when its terminal closes."""
    proc = started_train(ignore_hangup=True)
    proc.send_signal(signal.SIGHUP)
    time.sleep(3)
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130


def test_train_against_a_real_tracking_server(env, tmp_path):
    server = MlflowServer(tmp_path / "server")
    server.root.mkdir()
    server.start()
    try:
        out = run(env, "train", "--steps", "20", "--run-dir", str(tmp_path / "r"), "--mlflow", server.uri, "-q", *FAST)
        assert out.returncode == 0, out.stderr
        (mlrun,) = runs_of(server.uri)
        assert "ratio_two_step" in mlrun.data.metrics and mlrun.info.status == "FINISHED"
        assert "checkpoints/step_000000020.pvmckpt" in artifacts(server.uri, mlrun.info.run_id)
    finally:
        server.kill()


def test_unreachable_tracker_does_not_stop_training(env, tmp_path):
    from mlflow_server import free_port

    out = run(env, "train", "--steps", "20", "--run-dir", str(tmp_path / "r"), "--mlflow", f"http://127.0.0.1:{free_port()}",
              "--json", *FAST)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["step"] == 20 and (tmp_path / "r" / "checkpoints" / "step_000000020.pvmckpt").exists()
    assert "Traceback" not in out.stderr
    fallback = list((tmp_path / "r" / "tracking-fallback").glob("*.jsonl"))
    assert fallback and "ratio_two_step" in fallback[0].read_text()


def test_eval_reports_error_baseline_and_readout(env, tmp_path):
    assert run(env, "train", "--steps", "40", "--run-dir", str(tmp_path / "r"), "-q", *FAST).returncode == 0
    ck = str(tmp_path / "r" / "checkpoints" / "step_000000040.pvmckpt")
    out = run(env, "eval", ck, "--steps", "30", "--json", "--log")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    m = result["metrics"]
    assert result["trained_steps"] == 40 and result["steps"] == 30
    assert {"l0_two_step_px", "baseline_two_step_px", "ratio_two_step", "readout_iou", "readout_hit_rate"} <= m.keys()
    assert 0.0 <= m["readout_iou"] <= 1.0
    (mlrun,) = runs_of(env["PVM_MLFLOW_URI"])
    assert "eval_ratio_two_step" in mlrun.data.metrics and mlrun.info.status == "FINISHED"
    # the logged run's charts in the UI's model-training view, the same address train printed
    assert result["mlflow_page"] == (f"http://127.0.0.1:5000/#/experiments/{mlrun.info.experiment_id}/runs/"
                                     f"{mlrun.info.run_id}/model-metrics?workflowType=machine_learning")
    text = run(env, "eval", ck, "--steps", "10", "--data", "synthetic:bar")
    assert text.returncode == 0 and "ratio_two_step" in text.stdout and "readout" not in text.stdout
    assert "charts" not in text.stdout  # (nothing logged, no address)
    logged = run(env, "eval", ck, "--steps", "10", "--log")
    assert logged.returncode == 0 and f"charts {result['mlflow_page']} (after mlflow ui --backend-store-uri" in logged.stdout


# The recipe the README shows: 16 scenes, a constant PVM rate until step 5,000 (tiny's own schedule
# cools it at step 200, while its hidden states still barely move), a fast readout rate.
BALL_RECIPE = ["--spec", "tiny", "--data", "synthetic:balls", "--n-seq", "16", "--steps", "8000", "--readout-lr", "0.5",
               "-O", "initial_learning_rate=0.05", "-O", "delay_each_layer_learning=10",
               "-O", "intermediate_learning_rate=0.005", "-O", "delay_intermediate_learning_rate=5000",
               "-O", "delay_final_learning_rate=1000000"]


def test_readout_learns_ball_position_on_tiny(env, tmp_path):
    """Trained online beside the PVM, the readout finds the green ball in scenes it never saw (train
    scores it at the end on 8 scenes of seed 1, and logs that to MLflow)."""
    out = run(env, "train", *BALL_RECIPE, "--picture-every", "0", "--metrics-every", "1000",
              "--run-dir", str(tmp_path / "r"), "--json")
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)["heldout"]
    print({k: round(v, 3) for k, v in m.items() if "readout" in k})
    assert m["heldout_readout_iou"] > 3 * m["heldout_readout_iou_chance"]  # a box of the right size dropped at random
    assert m["heldout_readout_iou"] > m["heldout_readout_iou_position_blind"] + 0.03  # the best fixed heatmap for those frames
    assert m["heldout_readout_hit_rate"] > m["heldout_readout_hit_rate_position_blind"] + 0.3
    (mlrun,) = runs_of(env["PVM_MLFLOW_URI"])
    assert mlrun.data.metrics["heldout_readout_iou"] == pytest.approx(m["heldout_readout_iou"])
    assert mlrun.data.params["heldout"] == "synthetic:balls"


def test_bad_arguments_are_one_line(env, tmp_path):
    out = run(env, "train", "--data", "nowhere:else", "--steps", "5", "--run-dir", str(tmp_path))
    assert out.returncode == 2 and "nowhere:else" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    out = run(env, "train", "-O", "lateral_radus=1", "--steps", "5")
    assert out.returncode == 2 and "lateral_radus" in out.stderr
    bad = tmp_path / "bad.pvmckpt"
    bad.write_bytes(b"PVMCKPT\x00garbage")
    for cmd in (["train", "--resume", str(bad)], ["eval", str(bad)]):
        out = run(env, *cmd)
        assert out.returncode == 2 and "bad.pvmckpt" in out.stderr and "Traceback" not in out.stderr
    out = run(env, "train", "--data", str(tmp_path / "missing.mp4"), "--steps", "5", "--run-dir", str(tmp_path / "m"))
    assert out.returncode == 2 and "missing.mp4" in out.stderr and "Traceback" not in out.stderr
    out = run(env, "train", "--heldout", str(tmp_path / "gone.mp4"), "--steps", "5", "--run-dir", str(tmp_path / "h"))
    assert out.returncode == 2 and "gone.mp4" in out.stderr and "Traceback" not in out.stderr  # before training


def test_bar_source_follows_the_original():
    src = BarSource((60, 60, 3), n_seq=2, seed=0)
    dark = lambda img: np.flatnonzero((img[:, :, 0] == 0).all(axis=1)).tolist()  # noqa: E731
    assert dark(src.frame(0)) == [29, 30]  # m − 1 + k·d with m = 30, k = 0
    assert dark(src.frame(5)) == [34, 35]
    assert dark(src.frame(30)) == [59]  # k = m: clipped to one row at the bottom edge
    moves = src._top_rows(np.arange(31, 31 + 300)) - 29  # k·d after the first cycle
    assert np.abs(moves[:30]).tolist() == list(range(1, 31)) and set(np.sign(moves).tolist()) == {-1, 1}
    vanished = [t for t in range(31, 400) if src._top_rows(np.array(t)) == -1]  # k = m, d = −1
    assert vanished and dark(src.frame(vanished[0])) == []
