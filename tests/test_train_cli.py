"""`pvm-dist train`: end to end, exact resume through the CLI, and the Ctrl-C path."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np

from conftest import cli_command

from pvm_dist import checkpoint
from pvm_dist.data.synthetic import BarSource

CLI = cli_command()


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def test_train_then_resume_equals_straight_run(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    out = run("train", "--steps", "60", "--n-seq", "2", "--run-dir", str(a), "--json", "-O", "delay_each_layer_learning=10")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["step"] == 60
    assert run("train", "--steps", "25", "--n-seq", "2", "--run-dir", str(b), "-q", "-O", "delay_each_layer_learning=10").returncode == 0
    out = run("train", "--resume", str(b / "checkpoints" / "step_000000025.pvmckpt"), "--steps", "60", "-q")
    assert out.returncode == 0, out.stderr
    straight = checkpoint.load(a / "checkpoints" / "step_000000060.pvmckpt")
    resumed = checkpoint.load(b / "checkpoints" / "step_000000060.pvmckpt")
    assert straight.spec == resumed.spec and straight.spec["delay_each_layer_learning"] == 10
    for key, value in straight.state.items():
        assert np.array_equal(value, resumed.state[key]), key
    lines = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [50, 60] and len(lines[0]["mse_two_step"]) == 3


def test_sigint_saves_checkpoint_and_prints_resume_command(tmp_path):
    proc = subprocess.Popen([*CLI, "train", "--steps", "1000000", "--run-dir", str(tmp_path), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (tmp_path / "metrics.jsonl").exists() or not (tmp_path / "metrics.jsonl").read_text():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "resume with: pvm-dist train --resume" in err and "Traceback" not in err
    saved = sorted((tmp_path / "checkpoints").glob("*.pvmckpt"))
    assert len(saved) == 1
    ck = checkpoint.load(saved[0])
    assert 50 <= ck.step < 1_000_000 and ck.state["step"] == ck.step


def test_bad_arguments_are_one_line(tmp_path):
    out = run("train", "--data", "nowhere:else", "--steps", "5", "--run-dir", str(tmp_path))
    assert out.returncode == 2 and "unknown data source" in out.stderr and "Traceback" not in out.stderr
    out = run("train", "-O", "lateral_radus=1", "--steps", "5")
    assert out.returncode == 2 and "lateral_radus" in out.stderr
    bad = tmp_path / "bad.pvmckpt"
    bad.write_bytes(b"PVMCKPT\x00garbage")
    out = run("train", "--resume", str(bad))
    assert out.returncode == 2 and "bad.pvmckpt" in out.stderr and "Traceback" not in out.stderr


def test_bar_source_follows_the_original():
    src = BarSource((60, 60, 3), n_seq=2, seed=0)
    dark = lambda img: np.flatnonzero((img[:, :, 0] == 0).all(axis=1)).tolist()  # noqa: E731
    assert dark(src.frame(0)) == [29, 30]  # m − 1 + k·d with m = 30, k = 0
    assert dark(src.frame(5)) == [34, 35]
    assert dark(src.frame(30)) == [59]  # k = m: clipped to one row at the bottom edge
    ks = [src._position(t) for t in range(31, 31 + 300)]
    assert [k for k, _ in ks[:30]] == list(range(1, 31)) and {d for _, d in ks} == {-1, 1}
    assert np.array_equal(src.frames(3)[1], src.frame(3 + 7))
    vanished = [t for t in range(31, 400) if src._position(t) == (30, -1)]
    assert vanished and dark(src.frame(vanished[0])) == []
