"""What a researcher sees of a run: progress lines in a job log while it runs, and eval's defaults
(the checkpoint's own data, a wrap-around said, a one-line verdict)."""

from __future__ import annotations

import json

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import cli_command
from test_data_video import write_video

CLI = cli_command()
PROGRESS = re.compile(r"^first step ([\d,]+)/([\d,]+) \(\d+%\)  [\d,]+ steps/s  [\d,]+ frames/s  err .* px RMSE "
                      r"\(MSE [\d.]+× copy-last, [\d.]+× background\)  ETA \d+:\d\d:\d\d$")


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "PVM_MLFLOW_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}


def test_progress_lines_reach_a_captured_log_while_the_run_goes_on(env, tmp_path):
    """stdout is a pipe (as under nohup or Slurm): plain lines, flushed as they are written."""
    proc = subprocess.Popen([*CLI, "train", "--steps", "1000000", "--no-track", "--log-every", "0.3",
                             "--run-dir", str(tmp_path / "r"), "--picture-every", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        seen = []
        deadline = time.monotonic() + 60
        while len(seen) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            if PROGRESS.match(line.rstrip("\n")):
                seen.append(int(line.split()[2].split("/")[0].replace(",", "")))
                assert proc.poll() is None  # the line came while the run went on
        assert len(seen) == 2 and 0 < seen[0] < seen[1] < 1_000_000
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)


def test_a_log_lines_eta_comes_from_the_wall_clock_after_the_first_report(monkeypatch):
    """The first report's interval holds the start-up (on a GPU 20-50x slower than the run): its line says no ETA;
    later lines take the rate since the first report, pictures and checkpoints included; the last says 0, and gives
    the mean rate since the first report (its own interval holds the animation's host steps)."""
    import io

    from pvm_dist.cli import progress
    from pvm_dist.run.train import Progress

    clock = iter([100.0, 110.0, 120.0, 121.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    lines = progress.LogLines("first", every=5.0, stream=out)
    for step in (1_000, 11_000, 21_000):  # 1,000 steps/s of wall clock after the first report
        lines(Progress(step, 101_000, 454.0, 454.0, 30.0, 28.0, 1.15, 0.66))
    lines(Progress(101_000, 101_000, 3_000.0, 3_000.0, 29.0, 28.0, 1.07, 0.62))  # the last step: 1 s later, shown
    got = out.getvalue().splitlines()
    assert [line.rsplit("ETA ", 1)[1] for line in got] == ["–", "0:01:30", "0:01:20", "0:00:00"], got
    assert got[0].startswith("first step 1,000/101,000 (1%)  454 steps/s  454 frames/s  err 30.00 px RMSE"), got[0]
    assert got[-1].startswith("first step 101,000/101,000 (100%)  4,762 steps/s  4,762 frames/s (mean)  err"), got[-1]


def test_eval_scores_the_checkpoints_data_says_it_wraps_and_gives_a_verdict(env, tmp_path: Path):
    clip = write_video(tmp_path / "clip.avi", n=23)
    run_dir = tmp_path / "r"
    trained = subprocess.run([*CLI, "train", "--steps", "30", "--data", str(clip), "--no-track", "-q",
                              "--run-dir", str(run_dir), "--picture-every", "0"], capture_output=True, text=True, env=env)
    assert trained.returncode == 0, trained.stderr
    ck = str(run_dir / "checkpoints" / "step_000000030.pvmckpt")
    out = subprocess.run([*CLI, "eval", ck, "--steps", "40"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert f"on {clip} (the data the checkpoint records;" in out.stdout
    # 2·3 warm-up steps + 40 scored over a 23-frame clip: round it once more, and said so.
    assert "has 23 frames per stream; 46 steps (warm-up included) go round it 1 more time(s)" in out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"layer-0 two-step error [\d.]+ px RMSE: (beats|does not beat) copy-last-frame \(MSE ratio [\d.]+\); "
                        r"(beats|does not beat) background \(MSE ratio [\d.]+\)", last), last
    from pvm_dist.run.evaluate import evaluate

    given = evaluate(Path(ck), "synthetic:bar", steps=10)
    assert given["data"] == "synthetic:bar" and given["data_from"] == "--data" and given["wraps"] == 0


def test_ray_and_doctor_say_nothing_a_user_cannot_act_on():
    """Ray's notice that it turned token auth on goes, its warning that auth is off stays; without a GPU
    driver doctor says "none" in words instead of a CUDA error."""
    import logging
    import shutil

    from pvm_dist.cli.doctor import collect
    from pvm_dist.cli.quiet import RAY_AUTH_LOGGER, quiet_third_party

    quiet_third_party()
    ray_auth = logging.getLogger(RAY_AUTH_LOGGER)
    record = lambda msg: logging.LogRecord(RAY_AUTH_LOGGER, logging.WARNING, "", 0, msg, (), None)  # noqa: E731
    assert not ray_auth.filter(record("Token authentication is enabled for this Ray cluster."))
    assert ray_auth.filter(record("Token authentication is disabled for this Ray cluster."))
    doctor = collect()
    if shutil.which("nvidia-smi") is None:
        assert doctor["gpu"] == "none: training runs on the CPU (no NVIDIA driver on this machine)"
        assert "cuda_error" not in doctor["native_module"]


def test_pictures_reach_mlflow_as_an_image_series_with_steps(tmp_path, capfd):
    """What MLflow's Images view reads: images/<key>+step+<s>+timestamp+...png with a WebP preview, and the
    tag; a fresh store says nothing about creating its tables (as the CLI has it, quieted)."""
    import mlflow

    from pvm_dist.cli.quiet import quiet_third_party

    from pvm_dist.model.spec import load_spec
    from pvm_dist.run.config import RunConfig
    from pvm_dist.run.train import train

    quiet_third_party()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = RunConfig(spec=load_spec("tiny"), steps=40, picture_every=20, metrics_every=20, readout=False,
                    animation_frames=10, mlflow_uri=uri, experiment="images")
    result = train(cfg, tmp_path / "r")
    assert "database tables" not in capfd.readouterr().err
    client = mlflow.MlflowClient(tracking_uri=uri)
    run = client.get_run(result.config.run_id)
    names = [Path(a.path).name for a in client.list_artifacts(run.info.run_id, "images")]
    steps = sorted(int(n.split("+step+")[1].split("+")[0]) for n in names if n.endswith(".png"))
    assert steps == [20, 40] and sum(n.endswith("+compressed.webp") for n in names) == 2
    assert all(n.startswith("prediction+step+") for n in names)
    assert run.data.tags["mlflow.loggedImages"] == "true"
    assert run.data.tags["pvm_dist.command"].startswith("pvm-dist train --spec tiny --steps 40 ")
    assert run.data.tags["mlflow.user"] and run.data.tags["mlflow.source.name"] == "pvm-dist"
    assert "prediction.gif" in {a.path for a in client.list_artifacts(run.info.run_id)}
    (given,) = run.inputs.dataset_inputs  # the data as an MLflow dataset: the generator and its digest
    assert (given.dataset.name, given.dataset.source_type) == ("synthetic:balls", "code")
    assert given.dataset.digest == cfg.datasets()[0]["digest"] and json.loads(given.dataset.source)["seed"] == 0
    assert {(t.key, t.value) for t in given.tags} == {("mlflow.data.context", "training")}


def test_a_data_digest_follows_the_content_not_the_run(tmp_path):
    """Files: the same bytes give the same digest, a changed frame another; synthetic data: the seed and the
    number of sequences decide the frames, so they decide the digest; data not on this machine is named."""
    from pvm_dist.data.identity import dataset_input

    clip = tmp_path / "clip"
    clip.mkdir()
    for i in range(3):
        (clip / f"{i:04d}.png").write_bytes(bytes([i]) * 100)
    first = dataset_input(str(clip), (12, 12, 3), 1, 0)
    assert first["source_type"] == "local" and json.loads(first["profile"]) == {"kind": "files", "files": 3, "bytes": 300}
    assert json.loads(first["source"])["uri"] == clip.resolve().as_uri()
    assert dataset_input(str(clip), (12, 12, 3), 4, 7)["digest"] == first["digest"]
    (clip / "0001.png").write_bytes(b"x" * 100)
    assert dataset_input(str(clip), (12, 12, 3), 1, 0)["digest"] != first["digest"]
    balls = {dataset_input("synthetic:balls", (12, 12, 3), n, seed)["digest"] for n, seed in [(1, 0), (1, 1), (2, 0)]}
    assert len(balls) == 3
    away = dataset_input(str(tmp_path / "elsewhere.mp4"), (12, 12, 3), 1, 0)
    assert "not all files are on this machine" in json.loads(away["profile"])["note"]


def test_a_sweep_off_a_terminal_logs_plain_lines(tmp_path):
    """The line a sweep prints to a job log: trials done, each running trial's step and metric, the ETA."""
    from pvm_dist.sweep import progress
    from pvm_dist.sweep.journal import RUNNING, SweepFolder
    from pvm_dist.sweep.plan import load_sweep

    sweep = load_sweep(Path(__file__).resolve().parent.parent / "experiments" / "quickstart.yaml")
    trials = sweep.plan()
    folder = SweepFolder.create(tmp_path, "q", sweep.to_dict(), [t.to_dict() for t in trials])
    state = folder.state()
    first = state.trials[trials[0].trial_id]
    first.status, first.step, first.metric = RUNNING, 2000, 1.75
    line = progress.log_line(state, [t.to_dict() for t in trials], sweep.steps, sweep.metric)
    assert line.startswith("0/2 trials done · running: t000 2,000/80,000 ratio_two_step 1.75 · overall ETA ")
