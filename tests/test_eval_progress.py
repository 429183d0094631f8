"""`pvm-dist eval`'s progress: lines on stderr while a long eval runs, in blocks that do not change its numbers
from one run to the next."""

from __future__ import annotations

import io
import json

import pytest
from cli_inprocess import run_cli

from pvm_dist.cli import progress
from pvm_dist.run import evaluate as evaluation

TRAIN = ("train", "--spec", "tiny", "--steps", "30", "--no-track", "-q", "--heldout-steps", "0", "--picture-every", "0")


@pytest.fixture
def checkpoint(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, *TRAIN, "--run-dir", str(tmp_path / "r"))
    assert code == 0, err
    return tmp_path / "r" / "checkpoints" / "step_000000030.pvmckpt"


def test_lines_come_every_interval_with_rate_and_eta(monkeypatch):
    clock = iter([100.0, 104.0, 111.0, 115.0, 122.0, 130.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    lines = progress.EvalLines(every=10, stream=out)
    for done in (100, 500, 1_200, 1_600, 2_300, 3_000):  # (at 100, 104, 111, 115, 122 and 130 s)
        lines(done, 3_000)
    # the first call starts the clock; 104 s is too soon; 111 s: 1,100 steps in 11 s; 115 s too soon; 122 s:
    # 2,200 steps in 22 s; the last step prints nothing (the report follows)
    assert out.getvalue().splitlines() == ["eval step 1,200/3,000 (40%)  100 steps/s  ETA 0:00:18",
                                           "eval step 2,300/3,000 (77%)  100 steps/s  ETA 0:00:07"]


def test_blocks_report_every_step_run_and_keep_the_numbers(monkeypatch, checkpoint):
    monkeypatch.setattr(evaluation, "EVAL_BLOCK_STEPS", 7)
    seen: list[tuple[int, int]] = []
    first = evaluation.evaluate(checkpoint, steps=40, warmup=6, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(6, 46), *((6 + k, 46) for k in (7, 14, 21, 28, 35, 40))]  # warm-up, then blocks of 7
    again = evaluation.evaluate(checkpoint, steps=40, warmup=6)  # (no callback: the same blocks)
    assert again["metrics"] == first["metrics"]


def test_block_follows_model_sequences_and_device():
    assert evaluation.eval_block(n_weights=10**8, n_seq=1, on_gpu=False) == 20
    assert evaluation.eval_block(n_weights=10**8, n_seq=64, on_gpu=False) == 1
    assert evaluation.eval_block(n_weights=10**8, n_seq=64, on_gpu=True) == 156
    assert evaluation.eval_block(n_weights=10**3, n_seq=1, on_gpu=False) == evaluation.EVAL_BLOCK_STEPS


def test_cli_prints_progress_on_stderr_and_json_on_stdout(monkeypatch, capsys, checkpoint):
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    monkeypatch.setattr(evaluation, "EVAL_BLOCK_STEPS", 5)
    code, out, err = run_cli(monkeypatch, capsys, "eval", str(checkpoint), "--steps", "30", "--json")
    assert code == 0, err
    assert json.loads(out)["steps"] == 30
    lines = [line for line in err.splitlines() if line.startswith("eval step ")]
    assert len(lines) >= 3 and all("steps/s  ETA " in line for line in lines)
    assert lines[-1].startswith("eval step 31/36 ")  # (tiny's warm-up 2·3 = 6; the last block prints none)
