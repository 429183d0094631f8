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
    given = json.loads(subprocess.run([*CLI, "eval", ck, "--steps", "10", "--data", "synthetic:bar", "--json"],
                                      capture_output=True, text=True, env=env).stdout)
    assert given["data"] == "synthetic:bar" and given["data_from"] == "--data" and given["wraps"] == 0
