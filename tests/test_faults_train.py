"""`train` killed at its worst moments (issue 16, item 9): after its final checkpoint (the run can be
finished, not refused), mid-write (temp files swept on start)."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import cli_command

from pvm_dist.io import checkpoint

mlflow = pytest.importorskip("mlflow")


def _train_killed_before_the_end_of_run_work(run_dir: str, uri: str) -> None:
    """``train`` whose process dies right after its final checkpoint (before the held-out score)."""
    from pvm_dist.model.spec import load_spec
    from pvm_dist.run import train as train_mod
    from pvm_dist.run.config import RunConfig

    train_mod.score_heldout = lambda *a, **k: os._exit(9)
    cfg = RunConfig(spec=load_spec("tiny").with_overrides({"delay_each_layer_learning": "10"}), steps=40,
                    metrics_every=10, picture_every=0, heldout_steps=10, backend="reference", mlflow_uri=uri,
                    experiment="fin", overrides={"delay_each_layer_learning": "10"})
    train_mod.train(cfg, __import__("pathlib").Path(run_dir))
    os._exit(0)  # not reached


def _killed_in_a_child(target, tmp_path, migrated_db) -> tuple[Path, str, int]:
    """Run ``target(run_dir, uri)`` in a forked process that kills itself (exit 9), tracking to a fresh copy of
    the migrated store; its run folder, store URI and pid."""
    shutil.copyfile(migrated_db, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    child = multiprocessing.get_context("fork").Process(target=target, args=(str(run_dir), uri))
    child.start()
    child.join(300)
    assert child.exitcode == 9
    return run_dir, uri, child.pid


def test_a_run_killed_after_its_final_checkpoint_is_finished_by_resume(tmp_path, migrated_db):
    run_dir, uri, pid = _killed_in_a_child(_train_killed_before_the_end_of_run_work, tmp_path, migrated_db)
    (final,) = sorted((run_dir / "checkpoints").glob("*.pvmckpt"))
    ck = checkpoint.load(final)
    assert ck.step == 40 and ck.meta["run_id"]
    client = mlflow.MlflowClient(uri)
    assert client.get_run(ck.meta["run_id"]).info.status == "RUNNING"  # killed: nobody closed it
    from typer.testing import CliRunner

    from pvm_dist.cli.main import app

    synced = CliRunner().invoke(app, ["sync", str(run_dir), "--json"])  # killed runs do not stay RUNNING
    assert synced.exit_code == 0 and json.loads(synced.stdout)["killed"] == 1, synced.output
    assert client.get_run(ck.meta["run_id"]).info.status == "KILLED"
    stale = final.parent / f".{final.name}.tmp-{pid}-0badf00d"  # a write the kill cut short
    stale.write_bytes(b"half a checkpoint")

    env = {**os.environ, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    res = subprocess.run([*cli_command(), "train", "--resume", str(final), "--json", "-q"], capture_output=True,
                         text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["step"] == 40 and out["mlflow_run_id"] == ck.meta["run_id"]
    assert "heldout_l0_two_step_px" in out["heldout"]
    run = client.get_run(ck.meta["run_id"])
    assert run.info.status == "FINISHED" and "heldout_l0_two_step_px" in run.data.metrics
    assert [m.step for m in client.get_metric_history(run.info.run_id, "l0_two_step_px")] == [10, 20, 30, 40]
    assert not stale.exists()
    assert checkpoint.load(final).state["step"] == 40  # still the same, loadable

    again = subprocess.run([*cli_command(), "train", "--resume", str(final)], capture_output=True, text=True,
                           timeout=300, env=env)
    assert again.returncode == 2 and "already at step 40" in again.stderr  # finished now: nothing to do
    assert len(client.search_runs([run.info.experiment_id])) == 1


class _Killed(BaseException):
    """Stands for a SIGKILL inside ``train``: nothing after it runs (the runs below are untracked)."""


def _metric_lines(run_dir) -> dict[int, dict]:
    """metrics.jsonl by step, less what depends on the clock (time, speeds)."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out[rec.pop("step")] = {k: v for k, v in rec.items() if k not in ("time_ms", "steps_per_s", "frames_per_s")}
    return out


def test_a_run_killed_between_metrics_steps_logs_exactly_the_metrics_of_an_unbroken_run(tmp_path, monkeypatch):
    """Checkpoints every 30 steps, metrics every 20: killed after the checkpoint at 30, the resumed run's
    interval 21–40 must hold steps 21–30 (from the checkpoint) as well as 31–40, to the bit (the engine's
    errors, the copy-last-frame and the background baselines)."""
    from pvm_dist.model.spec import load_spec
    from pvm_dist.run import state as run_state
    from pvm_dist.run import train as train_mod
    from pvm_dist.run.config import RunConfig

    cfg = RunConfig(spec=load_spec("tiny"), steps=80, n_seq=2, metrics_every=20, checkpoint_every=30,
                    picture_every=0, animation_frames=0, heldout_steps=0, track=False)
    train_mod.train(cfg, tmp_path / "straight")
    save = train_mod._RunFolder.save_checkpoint

    def save_then_die(folder, state):
        path = save(folder, state)
        if state.step == 30:
            raise _Killed
        return path

    monkeypatch.setattr(train_mod._RunFolder, "save_checkpoint", save_then_die)
    with pytest.raises(_Killed):
        train_mod.train(cfg, tmp_path / "killed")
    monkeypatch.undo()
    assert sorted(_metric_lines(tmp_path / "killed")) == [20]
    state, _ = run_state.load(train_mod.checkpoint_path(tmp_path / "killed", 30))
    train_mod.train(state.run, tmp_path / "killed", resume=state)
    straight, resumed = _metric_lines(tmp_path / "straight"), _metric_lines(tmp_path / "killed")
    assert sorted(resumed) == [20, 40, 60, 80]
    assert "background_two_step_px" in resumed[40] and "layer0_mse_two_step" in resumed[40]
    assert resumed == straight


def test_a_restarted_sweep_worker_measures_exactly_what_an_unbroken_one_does():
    """A trial restarted on a fresh worker from its checkpoint (state taken at step 30, between metrics steps)
    reports the same metrics at every later chunk as the worker that never stopped."""
    from pvm_dist.model.spec import load_spec
    from pvm_dist.run.config import RunConfig
    from pvm_dist.sweep.worker import TrialWorker

    cfg = RunConfig(spec=load_spec("tiny"), steps=80, n_seq=2, metrics_every=20, checkpoint_every=30,
                    picture_every=0, animation_frames=0, heldout_steps=0, track=False, backend="native",
                    device="cpu").to_dict()
    chunks = [20, 10, 10, 20, 20]  # the chunk plan: every metrics and checkpoint step
    unbroken, later = TrialWorker(), TrialWorker()
    unbroken.start("t000", cfg, None)
    results = [unbroken.advance(n, want_state=(n == 10 and i == 1)) for i, n in enumerate(chunks)]
    later.start("t000", cfg, results[1]["state"])
    again = [later.advance(n) for n in chunks[2:]]
    clock = ("steps_per_s", "frames_per_s")
    for first, second in zip(results[2:], again):
        assert second["step"] == first["step"]
        assert {k: v for k, v in second["metrics"].items() if k not in clock} == \
               {k: v for k, v in first["metrics"].items() if k not in clock}


def _train_killed_after_its_final_checkpoint(run_dir: str, uri: str) -> None:
    """``train`` whose process dies the moment its final checkpoint is on disk."""
    from pvm_dist.run import train as train_mod

    save = train_mod._RunFolder.save_checkpoint

    def save_then_die(folder, state):
        path = save(folder, state)
        if state.step == state.run.steps:
            os._exit(9)
        return path

    train_mod._RunFolder.save_checkpoint = save_then_die
    train_mod.train(_animated(uri), __import__("pathlib").Path(run_dir))
    os._exit(0)  # not reached


def _animated(uri: str | None):
    from pvm_dist.model.spec import load_spec
    from pvm_dist.run.config import RunConfig

    return RunConfig(spec=load_spec("tiny"), steps=40, n_seq=2, metrics_every=20, checkpoint_every=20,
                     picture_every=20, animation_frames=8, heldout_steps=0, experiment="gif", mlflow_uri=uri,
                     track=uri is not None)


def test_a_run_finished_after_a_kill_has_the_pictures_and_animation_of_an_unbroken_run(tmp_path, migrated_db):
    from pvm_dist.run import state as run_state
    from pvm_dist.run.train import checkpoint_path, train

    straight = train(_animated(None), tmp_path / "straight")
    run_dir, uri, _ = _killed_in_a_child(_train_killed_after_its_final_checkpoint, tmp_path, migrated_db)
    state, _ = run_state.load(checkpoint_path(run_dir, 40))
    result = train(state.run, run_dir, resume=state)
    assert result.animation == run_dir / "prediction.gif"
    assert result.picture == run_dir / "pictures" / "step_000000040.png"
    assert result.animation.read_bytes() == straight.animation.read_bytes()
    for name in ("step_000000020.png", "step_000000040.png"):
        assert (run_dir / "pictures" / name).read_bytes() == (tmp_path / "straight" / "pictures" / name).read_bytes()
    client = mlflow.MlflowClient(uri)
    run = client.get_run(state.run.run_id)
    assert run.info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"prediction.gif", "pictures"}
    assert {a.path for a in client.list_artifacts(run.info.run_id, "pictures")} == \
           {"pictures/step_000000020.png", "pictures/step_000000040.png"}
    series = [a.path for a in client.list_artifacts(run.info.run_id, "images") if a.path.endswith(".png")]
    assert sorted(int(p.split("+step+")[1].split("+")[0]) for p in series) == [20, 40]  # each step once
