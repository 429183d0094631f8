"""The fault-injection suite (issue 16, item 6): processes killed at random points, the tracker killed and
restarted, a full disk, concurrent first writers. Each scenario asserts that nothing is lost: every
checkpoint left loads, the resumed run is bit-identical to a straight one, every metric reaches MLflow once,
no run is left RUNNING, orphaned or duplicated.

A few cases run by default; ``pytest --slow`` runs them all (marked ``exhaustive``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_command

from pvm_dist.io import checkpoint

mlflow = pytest.importorskip("mlflow")

STEPS = 400
TRAIN = ["--n-seq", "4", "--checkpoint-every", "50", "--metrics-every", "50", "--picture-every", "0",
         "--heldout-steps", "20", "--keep", "3", "-q", "-O", "delay_each_layer_learning=10"]
N_RANDOM_KILLS = 20  # under --slow (seeded); the default runs two


def _env() -> dict[str, str]:
    env = {**os.environ, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("PVM_MLFLOW_URI", None)
    return env


def _train(run_dir: Path, uri: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*cli_command(), "train", "--steps", str(STEPS), "--run-dir", str(run_dir), "--mlflow", uri,
                             "--experiment", "faults", *TRAIN, *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())


def _resume(ck: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*cli_command(), "train", "--resume", str(ck), "--steps", str(STEPS), "-q"],
                          capture_output=True, text=True, timeout=300, env=_env())


def _store(tmp_path: Path, migrated: Path) -> str:
    shutil.copyfile(migrated, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict:
    """The run trained in one go (in this process, untracked, the configuration ``TRAIN`` gives the CLI): the
    final state every faulty run must reach, to the bit."""
    from pvm_dist.model.spec import load_spec
    from pvm_dist.run.config import RunConfig
    from pvm_dist.run.train import train

    overrides = {"delay_each_layer_learning": "10"}
    cfg = RunConfig(spec=load_spec("tiny").with_overrides(overrides), overrides=overrides, steps=STEPS, n_seq=4,
                    checkpoint_every=50, metrics_every=50, picture_every=0, heldout_steps=20, keep_checkpoints=3,
                    track=False)
    result = train(cfg, tmp_path_factory.mktemp("straight") / "run")
    return checkpoint.load(result.checkpoint).state


def _checkpoints(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "checkpoints").glob("step_*.pvmckpt"))


def _assert_nothing_lost(run_dir: Path, uri: str, straight: dict) -> None:
    """Bit-identical final state, no temp file left, one run FINISHED with every metric step once."""
    final = checkpoint.load(run_dir / "checkpoints" / f"step_{STEPS:09d}.pvmckpt")
    for key, value in straight.items():
        assert np.array_equal(value, final.state[key]), key
    assert not list((run_dir / "checkpoints").glob(".*.tmp-*"))
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("faults")
    (run,) = client.search_runs([exp.experiment_id])  # no orphan, no duplicate
    assert run.info.status == "FINISHED" and final.meta["run_id"] == run.info.run_id
    expected = list(range(50, STEPS + 1, 50))
    for key in ("l0_two_step_px", "baseline_two_step_px", "layer0_mse_two_step"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == expected, key
    for key in run.data.metrics:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert len(steps) == len(set(steps)), f"{key} logged twice at a step: {steps}"


def _kill_train(tmp_path: Path, uri: str, seed: int, mid_write: bool) -> bool:
    """Start ``train``, SIGKILL it at a seeded random moment after its first checkpoint (or, ``mid_write``, as
    soon as a checkpoint is being written); whether it was caught with a temp file open."""
    run_dir = tmp_path / "run"
    rng = random.Random(seed)
    proc = _train(run_dir, uri)
    deadline = time.monotonic() + 240
    try:
        while not _checkpoints(run_dir):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
            time.sleep(0.01)
        if mid_write:
            while proc.poll() is None and not list((run_dir / "checkpoints").glob(".*.tmp-*")):
                time.sleep(0.0005)
        else:
            time.sleep(rng.uniform(0.0, 3.5))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    return bool(list((run_dir / "checkpoints").glob(".*.tmp-*")))


def _finish_after_kill(tmp_path: Path, uri: str, straight: dict) -> None:
    run_dir = tmp_path / "run"
    left = _checkpoints(run_dir)
    assert left, "killed after its first checkpoint: one must be there"
    for path in left:
        checkpoint.load(path)  # every checkpoint left loads (none torn)
    res = _resume(left[-1])
    assert res.returncode == 0, res.stderr[-2000:]
    _assert_nothing_lost(run_dir, uri, straight)


KILL_CASES = [pytest.param(1, True, id="mid-write-1")] + [
    pytest.param(seed, seed % 4 == 0, id=f"{'mid-write' if seed % 4 == 0 else 'random'}-{seed}",
                 marks=pytest.mark.exhaustive) for seed in range(2, 2 + N_RANDOM_KILLS)]


@pytest.mark.parametrize("seed,mid_write", KILL_CASES)
def test_train_killed_at_a_random_point_resumes_with_nothing_lost(tmp_path, migrated_db, straight, seed, mid_write):
    uri = _store(tmp_path, migrated_db)
    _kill_train(tmp_path, uri, seed, mid_write)
    _finish_after_kill(tmp_path, uri, straight)
