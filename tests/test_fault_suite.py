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
TRAIN = ["--spec", "tiny", "--n-seq", "4", "--checkpoint-every", "50", "--metrics-every", "50", "--picture-every", "0",
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
    assert run.info.status == "FINISHED" and run.data.tags["pvm.run_key"] == final.meta["run_key"]
    assert final.meta["run_id"] in (None, run.info.run_id)  # None only if the tracker was away all along
    expected = list(range(50, STEPS + 1, 50))
    for key in ("l0_two_step_px", "baseline_two_step_px", "layer0_mse_two_step"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == expected, key
    for key in run.data.metrics:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert len(steps) == len(set(steps)), f"{key} logged twice at a step: {steps}"


def _logged_to(run_dir: Path) -> int:
    """The last step ``metrics.jsonl`` holds in full (0 before any)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_bytes().split(b"\n")[:-1]
        return json.loads(lines[-1])["step"] if lines else 0
    except (OSError, ValueError, KeyError):
        return 0


def _kill_train(tmp_path: Path, uri: str, seed: int, mid_write: bool) -> bool:
    """Start ``train``, SIGKILL it at a seeded random point after its first checkpoint (a few ms after a random
    metrics step, so the kill lands inside the run however fast the machine is; or, ``mid_write``, as soon as
    a checkpoint is being written); whether it was caught with a temp file open."""
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
            target, jitter = rng.randrange(50, STEPS, 50), rng.uniform(0.0, 0.03)
            while proc.poll() is None and _logged_to(run_dir) < target:
                time.sleep(0.002)
            time.sleep(jitter)
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


# ---- the tracker killed and restarted -------------------------------------------------------------------

OUTAGES = ["away-at-start", "killed-mid-run", "away-at-the-end"]


@pytest.mark.exhaustive
@pytest.mark.parametrize("when", OUTAGES)
def test_train_survives_its_tracker_killed_and_restarted(tmp_path, straight, when):
    """Every metric arrives once and the run ends FINISHED: delivered when the server is back during the run,
    or by ``pvm-dist sync`` when it came back only after the run ended."""
    from mlflow_server import MlflowServer

    server = MlflowServer(tmp_path / "server")
    server.root.mkdir()
    if when != "away-at-start":
        server.start()
    run_dir = tmp_path / "run"
    proc = _train(run_dir, server.uri)
    try:
        deadline = time.monotonic() + 240
        while not _checkpoints(run_dir):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
            time.sleep(0.05)
        if when == "away-at-start":
            server.start()
        elif when == "killed-mid-run":
            server.kill()
            time.sleep(2.0)
            server.start()
        else:
            server.kill()
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        if when == "away-at-the-end":
            server.start()
        # Whatever the run could not deliver itself (the server came back only after its close): sync, once.
        res = subprocess.run([*cli_command(), "sync", str(run_dir), "--json"], capture_output=True, text=True,
                             timeout=300, env=_env())
        assert res.returncode == 0, res.stderr[-2000:]
        assert json.loads(res.stdout)["left"] == []
        _assert_nothing_lost(run_dir, server.uri, straight)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.kill()


# ---- concurrent first writers ------------------------------------------------------------------------------

@pytest.mark.exhaustive
def test_three_trains_at_once_on_a_fresh_sqlite_store_each_get_their_run(tmp_path):
    uri = f"sqlite:///{tmp_path / 'fresh.db'}"
    procs = [_train(tmp_path / f"run{i}", uri, "--seed", str(i)) for i in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("faults").experiment_id])
    assert len(runs) == 3 and {r.info.status for r in runs} == {"FINISHED"}
    ids = {checkpoint.load(tmp_path / f"run{i}" / "checkpoints" / f"step_{STEPS:09d}.pvmckpt").meta["run_id"]
           for i in range(3)}
    assert ids == {r.info.run_id for r in runs}  # every checkpoint names its own run: no None, no sharing


# ---- a full disk ----------------------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 2.5 MB tmpfs (room for two checkpoints of the suite's run, not three); skipped where mounting is not
    allowed."""
    where = tmp_path / "small"
    where.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2500k", "tmpfs", str(where)], capture_output=True,
                         text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()[:200]}")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.mark.exhaustive
def test_a_full_disk_keeps_the_last_good_checkpoint_and_the_run_resumes_elsewhere(tmp_path, small_disk, straight):
    run_dir = small_disk / "run"
    proc = subprocess.run([*cli_command(), "train", "--steps", str(STEPS), "--run-dir", str(run_dir), "--no-track",
                           *TRAIN], capture_output=True, text=True, timeout=300, env=_env())
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and lines, proc.stderr[-2000:]  # the disk filled up: a user's problem, said so
    assert "No space left on device" in lines[-1] and "internal error" not in proc.stderr, proc.stderr[-2000:]
    left = _checkpoints(run_dir)
    assert left and not list((run_dir / "checkpoints").glob(".*.tmp-*"))  # no half-written file left behind
    for path in left:
        checkpoint.load(path)
    moved = tmp_path / "moved"
    shutil.copytree(run_dir, moved)
    res = subprocess.run([*cli_command(), "train", "--resume", str(moved / "checkpoints" / left[-1].name),
                          "--steps", str(STEPS), "-q"], capture_output=True, text=True, timeout=300, env=_env())
    assert res.returncode == 0, res.stderr[-2000:]
    final = checkpoint.load(moved / "checkpoints" / f"step_{STEPS:09d}.pvmckpt")
    for key, value in straight.items():
        assert np.array_equal(value, final.state[key]), key


# ---- the sweep driver and its workers killed -------------------------------------------------------------------

DRIVER_BOUNDARIES = ["sweep_started", "trial_run", "trial_started", "progress", "checkpoint", "trial_ended"]


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and every process it started (the driver with its local Ray: a crash of the machine's
    side of the sweep)."""
    from listening import descendants

    for p in sorted(descendants(pid), key=lambda p: p != pid):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _sweep_nothing_lost(tmp_path: Path, experiment: str, trials: list[str], steps: int, every: int,
                        uri: str | None = None) -> dict:
    """One parent run and one nested run per trial, all FINISHED, every metric step of every trial once (in the
    store ``uri``, default the sweep's ``mlflow.db``)."""
    from sweep_helpers import trial_runs

    client = mlflow.MlflowClient(uri or f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id], max_results=1000)
    nested = trial_runs(runs)  # asserts one run per trial
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and sorted(nested) == trials, [r.data.tags for r in runs]
    assert {r.info.status for r in runs} == {"FINISHED"}
    for trial, run in nested.items():
        assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        for key in run.data.metrics:
            steps_seen = [m.step for m in client.get_metric_history(run.info.run_id, key)]
            assert len(steps_seen) == len(set(steps_seen)), f"{trial} {key}: {steps_seen}"
        history = [m.step for m in client.get_metric_history(run.info.run_id, "l0_two_step_px")]
        assert history == list(range(every, steps + 1, every)), (trial, history)
    return nested


@pytest.mark.exhaustive
@pytest.mark.parametrize("event", DRIVER_BOUNDARIES)
def test_driver_killed_at_a_journal_event_resumes_with_nothing_lost(tmp_path, event):
    pytest.importorskip("ray")
    from sweep_helpers import driver_output, run, start, sweep_dir, sweep_file, wait_for

    f = sweep_file(tmp_path, "dk", steps=200, checkpoint_every=100, metrics_every=50, vary={"seed": [0, 1]})
    proc = start(tmp_path, "run", str(f), "--max-concurrent", "1", "-q")
    try:
        folder = sweep_dir(tmp_path)
        wait_for(folder, lambda e: e["event"] == event, timeout=240, proc=proc)
    finally:
        _kill_tree(proc.pid)
        proc.wait(timeout=60)
    res = run(tmp_path, "resume", folder.name, "--json", timeout=400)
    assert res.returncode == 0, res.stderr[-3000:] + driver_output(tmp_path)
    assert {t["status"] for t in json.loads(res.stdout)["trials"]} == {"FINISHED"}
    _sweep_nothing_lost(tmp_path, "dk", ["t000", "t001"], 200, 50)


@pytest.mark.exhaustive
def test_a_killed_worker_continues_with_the_metrics_of_an_uninterrupted_run(tmp_path):
    """Item 11: the restarted trial continues from its checkpoint with the same metric values a run without the
    kill logs, and logs no step twice."""
    pytest.importorskip("ray")
    from sweep_helpers import driver_output, start, sweep_dir, sweep_file, wait_for

    from pvm_dist.run import state as run_state
    from pvm_dist.run.session import Session

    f = sweep_file(tmp_path, "wk", steps=400, checkpoint_every=100, metrics_every=50, n_seq=4)
    proc = start(tmp_path, "run", str(f), "-q")
    try:
        folder = sweep_dir(tmp_path)
        started = wait_for(folder, lambda e: e["event"] == "trial_started", timeout=240, proc=proc)
        wait_for(folder, lambda e: e["event"] == "progress" and e["step"] >= 150, timeout=240, proc=proc)
        os.kill(int(started["pid"]), signal.SIGKILL)
        assert proc.wait(timeout=400) == 0, driver_output(tmp_path)
    finally:
        if proc.poll() is None:
            _kill_tree(proc.pid)
    nested = _sweep_nothing_lost(tmp_path, "wk", ["t000"], 400, 50)
    state, _ = run_state.load(folder / "trials" / "t000" / "checkpoint.pvmckpt")
    cfg = state.run.replace(track=False)
    session = Session(cfg)
    expected = {}
    while session.step < cfg.steps:
        session.advance(50)
        expected[session.step] = session.take_metrics()["l0_two_step_px"]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    got = {m.step: m.value for m in client.get_metric_history(nested["t000"].info.run_id, "l0_two_step_px")}
    assert got == expected


@pytest.mark.exhaustive
def test_a_sweep_that_ends_while_its_tracker_is_away_is_delivered_once_by_sweep_status(tmp_path):
    """Defect 3: the server dies mid-sweep and the trials end while it is away (their metrics spooled, their runs
    RUNNING); once it is back, ``sweep status`` delivers every spool, once, and closes every run."""
    pytest.importorskip("ray")
    from mlflow_server import MlflowServer
    from sweep_helpers import driver_output, run, start, sweep_dir, sweep_file, wait_for

    server = MlflowServer(tmp_path / "server")
    server.root.mkdir()
    server.start()
    f = sweep_file(tmp_path, "away", steps=400, checkpoint_every=100, metrics_every=50, vary={"seed": [0, 1]})
    proc = start(tmp_path, "run", str(f), "--mlflow", server.uri, "-q")
    try:
        folder = sweep_dir(tmp_path)
        wait_for(folder, lambda e: e["event"] == "progress", timeout=240, proc=proc)
        server.kill()
        assert proc.wait(timeout=400) == 0, driver_output(tmp_path)
        server.start()
        res = run(tmp_path, "status", folder.name)
        assert res.returncode == 0 and "delivered" in res.stderr, res.stdout + res.stderr
        again = run(tmp_path, "status", folder.name)  # nothing left: nothing sent twice
        assert again.returncode == 0 and "delivered" not in again.stderr, again.stdout + again.stderr
        _sweep_nothing_lost(tmp_path, "away", ["t000", "t001"], 400, 50, uri=f"sqlite:///{server.db}")
    finally:
        if proc.poll() is None:
            _kill_tree(proc.pid)
        server.kill()
