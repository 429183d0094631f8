"""Tracking under faults (issue 16, items 3, 4, 5): concurrent first writers of a fresh SQLite store, runs
found again by their key instead of created twice, and delivery of what an outage left on disk."""

from __future__ import annotations

import multiprocessing
import time

import pytest

mlflow = pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402

from pvm_dist.tracking.tracker import Tracker  # noqa: E402


@pytest.fixture(autouse=True)
def _mlflow_env(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("PVM_MLFLOW_URI", raising=False)


def runs_of(uri: str, experiment: str) -> list:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id], max_results=1000)


def _first_writer(uri: str, name: str, folder: str, barrier, out) -> None:
    """One process's run on a store nobody has opened yet (they all start together)."""
    barrier.wait()
    tr = Tracker.start(uri, "race", run_name=name, fallback_dir=folder, flush_every=0.05)
    for step in range(1, 6):
        tr.log_metrics({"loss": 1.0 / step}, step=step)
    tr.close("FINISHED")
    out.put((name, tr.run_id))


def test_concurrent_first_writers_of_a_fresh_sqlite_store_all_get_their_run(tmp_path):
    uri = f"sqlite:///{tmp_path / 'fresh.db'}"
    ctx = multiprocessing.get_context("fork")  # mlflow is imported already: the children start at once
    n = 3
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_first_writer, args=(uri, f"w{i}", str(tmp_path / f"fb{i}"), barrier, out))
             for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    ids = dict(out.get(timeout=5) for _ in range(n))
    assert all(p.exitcode == 0 for p in procs)
    assert None not in ids.values(), ids
    runs = {r.info.run_name: r for r in runs_of(uri, "race")}
    assert sorted(runs) == ["w0", "w1", "w2"]
    client = MlflowClient(uri)
    for name, run in runs.items():
        assert run.info.status == "FINISHED" and run.info.run_id == ids[name]
        assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3, 4, 5]


def test_a_run_is_found_by_its_key_instead_of_created_twice(tmp_path):
    """A process killed after the run was created but before its id was recorded: the next start with the
    same key (and no id) continues that run."""
    uri = f"sqlite:///{tmp_path / 'k.db'}"
    first = Tracker.start(uri, "keys", run_name="t000", run_key="sweep-1/t000", fallback_dir=tmp_path / "a")
    first.log_metrics({"x": 1.0}, step=1)
    first.flush()
    # (killed here: nobody recorded first.run_id)
    again = Tracker.start(uri, "keys", run_name="t000", run_key="sweep-1/t000", fallback_dir=tmp_path / "b")
    again.log_metrics({"x": 2.0}, step=2)
    again.close("FINISHED")
    other = Tracker.start(uri, "keys", run_name="t001", run_key="sweep-1/t001", fallback_dir=tmp_path / "c")
    other.close("FINISHED")
    assert again.run_id == first.run_id != other.run_id
    runs = runs_of(uri, "keys")
    assert len(runs) == 2
    hist = MlflowClient(uri).get_metric_history(first.run_id, "x")
    assert [(m.step, m.value) for m in hist] == [(1, 1.0), (2, 2.0)]
