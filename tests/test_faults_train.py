"""`train` killed at its worst moments (issue 16, item 9): after its final checkpoint (the run can be
finished, not refused), mid-write (temp files swept on start)."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess

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


def test_a_run_killed_after_its_final_checkpoint_is_finished_by_resume(tmp_path, migrated_db):
    shutil.copyfile(migrated_db, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    child = multiprocessing.get_context("fork").Process(target=_train_killed_before_the_end_of_run_work,
                                                        args=(str(run_dir), uri))
    child.start()
    child.join(300)
    assert child.exitcode == 9
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
    stale = final.parent / f".{final.name}.tmp-{child.pid}-0badf00d"  # a write the kill cut short
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
