"""Tracking under faults (issue 16, items 3, 4, 5): concurrent first writers of a fresh SQLite store, runs
found again by their key instead of created twice, and delivery of what an outage left on disk."""

from __future__ import annotations

import multiprocessing
import time

import pytest

mlflow = pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402

from pvm_dist.tracking.tracker import Tracker  # noqa: E402


pytestmark = pytest.mark.usefixtures("mlflow_offline_env")


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


@pytest.mark.parametrize("n", [2, pytest.param(3, marks=pytest.mark.exhaustive)])
def test_concurrent_first_writers_of_a_fresh_sqlite_store_all_get_their_run(tmp_path, n):
    uri = f"sqlite:///{tmp_path / 'fresh.db'}"
    ctx = multiprocessing.get_context("fork")  # mlflow is imported already: the children start at once
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
    assert sorted(runs) == [f"w{i}" for i in range(n)]
    client = MlflowClient(uri)
    for name, run in runs.items():
        assert run.info.status == "FINISHED" and run.info.run_id == ids[name]
        assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3, 4, 5]


def test_a_run_is_found_by_its_key_instead_of_created_twice(tmp_path, away):
    """A process killed after the run was created but before its id was recorded: the next start with the
    same key (and no id) continues that run."""
    away.back()
    uri = away.uri
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


# ---- delivery that finishes ---------------------------------------------------------------------------

class AwayStore:
    """A SQLite store the tracker cannot reach until :meth:`back`: where its folder should be lies a file."""

    def __init__(self, tmp_path, migrated) -> None:
        self.home, self.migrated = tmp_path / "store", migrated
        self.home.write_text("not a folder")
        self.uri = f"sqlite:///{self.home / 'mlflow.db'}"

    def back(self) -> None:
        import shutil

        self.home.unlink()
        self.home.mkdir()
        shutil.copyfile(self.migrated, self.home / "mlflow.db")


@pytest.fixture
def away(tmp_path, migrated_db) -> AwayStore:
    return AwayStore(tmp_path, migrated_db)


def _history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, key)]


def test_a_run_that_ends_during_an_outage_is_delivered_once_by_sync(tmp_path, away):
    """The tracker is away from start to close: nothing reached it. Once it is back, ``sync`` creates the run,
    with the tags and dataset it was started with, delivers every metric and param once and ends it FINISHED;
    a second sync sends nothing."""
    from pvm_dist.tracking.sync import sync_paths

    uri = away.uri
    data = {"name": "synthetic:balls", "digest": "0123abcd", "source_type": "synthetic", "source": "synthetic:balls",
            "context": "training"}
    with pytest.warns(UserWarning):
        tr = Tracker.start(uri, "outage", run_name="r", fallback_dir=tmp_path / "run" / "fb", flush_every=0.05,
                           run_key="k1", tags={"trial_id": "t007"}, inputs=[data])
    tr.log_params({"lr": 0.1})
    for step in range(1, 41):
        tr.log_metrics({"loss": 1.0 / step, "acc": step / 40}, step=step)
    tr.close("FINISHED")
    assert tr.run_id is None
    away.back()  # the tracker is back
    first = sync_paths([tmp_path / "run"])
    assert (first.runs, first.metrics, first.left) == (1, 80, [])
    (run,) = runs_of(uri, "outage")
    assert run.info.status == "FINISHED" and run.data.params == {"lr": "0.1"}
    assert run.data.tags["trial_id"] == "t007"  # created as it was started, not bare
    assert [(d.dataset.name, d.dataset.digest) for d in run.inputs.dataset_inputs] == [("synthetic:balls", "0123abcd")]
    assert _history(uri, run.info.run_id, "loss") == [(s, 1.0 / s) for s in range(1, 41)]
    again = sync_paths([tmp_path / "run"])
    assert (again.runs, again.metrics) == (0, 0)
    assert len(_history(uri, run.info.run_id, "acc")) == 40 and len(runs_of(uri, "outage")) == 1


def _killed_during_outage(uri: str, folder: str, ready) -> None:
    """A process logging during an outage, killed (no close, no atexit) once its spool is on disk."""
    import os
    import warnings

    warnings.simplefilter("ignore")
    tr = Tracker.start(uri, "killed", run_name="k", fallback_dir=folder, flush_every=0.05, run_key="k2")
    for step in range(1, 21):
        tr.log_metrics({"loss": float(step)}, step=step)
    tr.flush(timeout=5)
    ready.set()
    time.sleep(0.2)
    os._exit(9)


def test_a_killed_run_is_closed_killed_by_sync_with_all_its_metrics(tmp_path, away):
    from pvm_dist.tracking.sync import sync_paths

    uri = away.uri
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=_killed_during_outage, args=(uri, str(tmp_path / "run" / "fb"), ready))
    p.start()
    p.join(60)
    assert ready.is_set() and p.exitcode == 9
    away.back()
    res = sync_paths([tmp_path / "run"])
    assert (res.runs, res.metrics) == (1, 20)
    (run,) = runs_of(uri, "killed")
    assert run.info.status == "KILLED"
    assert _history(uri, run.info.run_id, "loss") == [(s, float(s)) for s in range(1, 21)]


def test_sync_leaves_the_spool_of_a_live_run_alone(tmp_path, away):
    from pvm_dist.tracking.sync import sync_paths

    uri = away.uri
    with pytest.warns(UserWarning):
        tr = Tracker.start(uri, "live", fallback_dir=tmp_path / "run" / "fb", flush_every=0.05)
    tr.log_metrics({"x": 1.0}, step=1)
    tr.flush(timeout=5)
    away.back()
    busy = sync_paths([tmp_path / "run"])
    assert (busy.runs, len(busy.busy)) == (0, 1) and runs_of(uri, "live") == []
    tr.close("FINISHED")  # its own last attempt delivers (the store is back)
    (run,) = runs_of(uri, "live")
    assert run.info.status == "FINISHED" and _history(uri, run.info.run_id, "x") == [(1, 1.0)]
    assert sync_paths([tmp_path / "run"]).runs == 0
