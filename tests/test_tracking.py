"""Tests for pvm_dist.tracking.tracker: MLflow logging into a SQLite store and through a real ``mlflow server``,
and the outage behaviour (server killed mid-run and restarted, server dead from the start).

The HTTP tests start ``mlflow server`` subprocesses on 127.0.0.1 (about 6 s each on 2 cores); the whole file
runs in well under 90 s.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest

mlflow = pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402


from mlflow_server import MlflowServer, free_port  # noqa: E402

from pvm_dist.tracking import tracker as tracking  # noqa: E402
from pvm_dist.tracking.fallback import Journal  # noqa: E402

Tracker = tracking.Tracker
TrackingWarning = tracking.TrackingWarning


pytestmark = pytest.mark.usefixtures("mlflow_offline_env")


def _our_warnings(caught) -> list:
    return [w for w in caught if issubclass(w.category, TrackingWarning)]


def _no_tracking_threads(tr) -> bool:
    return not any(t.name == f"pvm-tracking-{tr.session}" for t in threading.enumerate())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    srv.start()
    yield srv
    print(f"\nmlflow server start times (s): {[round(s, 2) for s in srv.start_seconds]}")
    srv.kill()


@pytest.fixture
def live_server(server):
    """The module's server, (re)started if an earlier test left it down."""
    if not server.running:
        server.start()
    return server


@pytest.fixture(scope="module")
def sqlite_uri(tmp_path_factory) -> str:
    """One SQLite store for the module (creating a store costs ~2 s); tests use their own experiments."""
    return f"sqlite:///{tmp_path_factory.mktemp('sqlite-store') / 'mlflow.db'}"


def _client(uri: str) -> MlflowClient:
    return MlflowClient(tracking_uri=uri)


def _steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


# --------------------------------------------------------------------------------------------------
# Pure helpers


def test_default_tracking_uri(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert tracking.default_tracking_uri() == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking.default_tracking_uri() == "http://127.0.0.1:5000"
    monkeypatch.setenv("PVM_MLFLOW_URI", "sqlite:////x/y.db")
    assert tracking.default_tracking_uri() == "sqlite:////x/y.db"


def test_flatten_params():
    flat = tracking.flatten_params({"spec": {"layers": [4, 2], "opt": {"lr": 0.01, "on": True}}, "seed": 3,
                                    "none": None, "arr": np.array([1, 2]), "long": "x" * 7000, "bad key?": 1})
    assert flat["spec.layers"] == "[4, 2]"
    assert flat["spec.opt.lr"] == "0.01"
    assert flat["spec.opt.on"] == "true"
    assert flat["seed"] == "3"
    assert flat["none"] == "null"
    assert flat["arr"] == "[1, 2]"
    assert len(flat["long"]) == 6000
    assert flat["bad key_"] == "1"


def test_run_tags():
    tags = tracking.run_tags("native", "NVIDIA H100", {"spec": "small"})
    assert tags["backend"] == "native" and tags["device"] == "NVIDIA H100" and tags["spec"] == "small"
    assert tags["host"] == socket.gethostname()
    assert tags["pvm_dist.version"]
    if "git.commit" in tags:
        assert len(tags["git.commit"]) == 40 and tags["mlflow.source.git.commit"] == tags["git.commit"]


def test_ui_pages_open_the_model_training_view():
    from pvm_dist.tracking.defaults import experiment_page, run_page

    tail = "/#/experiments/3/runs/abc/model-metrics?workflowType=machine_learning"
    assert run_page("sqlite:////x/mlflow.db", "3", "abc") == "http://127.0.0.1:5000" + tail  # `mlflow ui`'s default
    assert run_page("http://tracker:8080/", "3", "abc") == "http://tracker:8080" + tail
    assert run_page("https://example.org/mlflow", "3", "abc") == "https://example.org/mlflow" + tail
    assert experiment_page("file:///x/mlruns", "7") == "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning"


def test_read_fallback_skips_a_torn_line(tmp_path):
    path = tmp_path / tracking.FALLBACK_FILE
    path.write_text(json.dumps({"kind": "metric", "session": "s", "seq": 1, "run_id": None, "key": "a",
                                "value": 1.0, "step": 0, "timestamp": 1}) + "\n"
                    + json.dumps({"kind": "delivered", "session": "s", "upto": 1}) + "\n"
                    + json.dumps({"kind": "metric", "session": "s", "seq": 2, "run_id": None, "key": "a",
                                  "value": 2.0, "step": 1, "timestamp": 2}) + "\n" + '{"kind": "met')
    records = tracking.read_fallback(tmp_path)
    assert [r["kind"] for r in records] == ["metric", "delivered", "metric"]
    assert [r["seq"] for r in tracking.pending_metrics(records)] == [2]


def test_a_torn_last_line_does_not_swallow_the_next_record(tmp_path):
    """A process killed mid-write leaves a line without its newline; the next process's first record went onto it."""
    path = tmp_path / tracking.FALLBACK_FILE
    path.write_text(json.dumps({"kind": "run", "session": "s", "run_id": "r"}) + "\n" + '{"kind": "met')
    Journal(path).append([{"kind": "metric", "session": "t", "seq": 1, "run_id": "r", "key": "a", "value": 1.0,
                           "step": 0, "timestamp": 1}])
    assert [r["kind"] for r in tracking.read_fallback(tmp_path)] == ["run", "metric"]


@pytest.mark.parametrize("line,words", [
    (b"\xff\xfe garbage", "not UTF-8"),
    (b'{"kind": "metric"', "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"session": "s"}', "no record kind"),
    (b'{"kind": "metric", "session": "s", "seq": 3}', "without a valid 'key'"),
    (b'{"kind": "metric", "session": "s", "seq": true, "key": "a", "value": 1, "step": 0, "timestamp": 1}',
     "without a valid 'seq'"),
    (b'{"kind": "delivered", "upto": 1}', "without a valid 'session'"),
    (b'{"kind": "artifact", "session": "s", "local_path": 5}', "without a valid 'local_path'"),
], ids=["binary", "torn inside", "a list", "no kind", "metric without key", "bool seq", "no session",
        "artifact path"])
def test_read_fallback_skips_a_damaged_line_with_a_warning_naming_it(tmp_path, caplog, line, words):
    good = [json.dumps({"kind": "metric", "session": "s", "seq": i, "run_id": "r", "key": "a", "value": 1.0,
                        "step": i, "timestamp": 1}).encode() for i in (1, 2)]
    (tmp_path / tracking.FALLBACK_FILE).write_bytes(b"\n".join([good[0], line, good[1]]) + b"\n")
    with caplog.at_level(logging.WARNING, logger="pvm_dist.tracking.fallback"):
        records = tracking.read_fallback(tmp_path)
    assert [r["seq"] for r in tracking.pending_metrics(records)] == [1, 2]
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "line 2 skipped" in warned[0] and words in warned[0], warned


# --------------------------------------------------------------------------------------------------
# SQLite store


def test_sqlite_params_metrics_tags_artifacts(sqlite_uri, tmp_path):
    image = np.random.default_rng(0).integers(0, 256, size=(12, 16, 3), dtype=np.uint8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tr = Tracker.start(sqlite_uri, "sqlite-all", run_name="all", fallback_dir=tmp_path / "fb", flush_every=0.2,
                           tags=tracking.run_tags("numpy", "cpu", {"spec": "small"}))
        assert tr.run_id
        tr.log_params({"spec": {"layers": [4, 2], "opt": {"lr": 0.01}}, "seed": 3})
        tr.log_params({f"p{i:03d}": i for i in range(250)})  # three batches of at most 100
        for step in range(0, 300, 10):
            tr.log_metrics({"loss": 1.0 / (step + 1), "per_layer": np.array([step, step + 1.0]),
                            "bad": float("nan")}, step)
        tr.set_tags({"phase": "test"})
        artifact = tmp_path / "notes.txt"
        artifact.write_text("hello")
        tr.log_artifact(artifact, "files")
        artifact.unlink()  # staged at log time: the caller may delete it at once
        tr.log_dict({"name": "small", "layers": [4, 2]}, "spec/spec.json")
        picture = tmp_path / "frame_000010.png"
        assert cv2.imwrite(str(picture), image)
        tr.log_artifact(picture, "pictures")  # how training logs its pictures
        tr.close()
    assert _our_warnings(caught) == []
    assert _no_tracking_threads(tr)
    client = _client(sqlite_uri)
    run = client.get_run(tr.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "all"
    params = run.data.params
    assert params["spec.layers"] == "[4, 2]" and params["spec.opt.lr"] == "0.01" and params["seed"] == "3"
    assert all(params[f"p{i:03d}"] == str(i) for i in range(250))
    assert _steps(client, tr.run_id, "loss") == list(range(0, 300, 10))
    assert _steps(client, tr.run_id, "per_layer/1") == list(range(0, 300, 10))
    assert "bad" not in run.data.metrics and tr.nonfinite_skipped == 30
    tags = run.data.tags
    assert tags["phase"] == "test" and tags["backend"] == "numpy" and tags["spec"] == "small"
    assert tags["pvm.metrics_nonfinite_skipped"] == "30"
    root = Path(run.info.artifact_uri.removeprefix("file://"))
    assert root.is_relative_to(Path(sqlite_uri.removeprefix("sqlite:///")).parent / "mlartifacts")
    assert (root / "files" / "notes.txt").read_text() == "hello"
    assert json.loads((root / "spec" / "spec.json").read_text()) == {"name": "small", "layers": [4, 2]}
    assert np.array_equal(cv2.imread(str(root / "pictures" / "frame_000010.png")), image)
    assert not (tmp_path / "fb").exists()  # nothing to fall back on; staging cleaned up


def test_status_killed_and_failed(sqlite_uri, tmp_path):
    tr = Tracker.start(sqlite_uri, "sqlite-status", fallback_dir=tmp_path)
    tr.log_metrics({"x": 1.0}, 0)
    tr.close("KILLED")
    tr.close("FINISHED")  # idempotent
    with pytest.raises(RuntimeError):
        with Tracker.start(sqlite_uri, "sqlite-status", fallback_dir=tmp_path) as failed:
            raise RuntimeError("training blew up")
    client = _client(sqlite_uri)
    assert client.get_run(tr.run_id).info.status == "KILLED"
    assert client.get_run(failed.run_id).info.status == "FAILED"
    assert _steps(client, tr.run_id, "x") == [0]


def test_resume_appends_to_the_same_run(sqlite_uri, tmp_path, caplog):
    params = {"spec": {"layers": [4, 2]}, "steps": 10}
    first = Tracker.start(sqlite_uri, "sqlite-resume", run_name="r", fallback_dir=tmp_path)
    first.log_params(params)
    for s in range(5):
        first.log_metrics({"loss": float(s)}, s)
    first.close("KILLED")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second = Tracker.start(sqlite_uri, "sqlite-resume", run_id=first.run_id, fallback_dir=tmp_path,
                               tags={"resumed": "yes"})
        assert second.run_id == first.run_id
        second.log_params(params)  # identical values: fine
        second.log_params({"seed": 1, "spec": {"changed": 1}})
        second.log_params({"steps": 20})  # a changed value is rejected by MLflow: dropped, reported, no outage
        for s in range(5, 10):
            second.log_metrics({"loss": float(s)}, s)
        assert second.flush()
        second.close()
    assert _our_warnings(caught) == [] and second.outages == 0
    assert "rejected 1 params" in caplog.text
    client = _client(sqlite_uri)
    runs = client.search_runs([client.get_experiment_by_name("sqlite-resume").experiment_id])
    assert [r.info.run_id for r in runs] == [first.run_id]
    run = client.get_run(first.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["resumed"] == "yes"
    assert run.data.params["steps"] == "10" and run.data.params["seed"] == "1"
    assert _steps(client, first.run_id, "loss") == list(range(10))


def test_nested_run(sqlite_uri, tmp_path):
    parent = Tracker.start(sqlite_uri, "sqlite-nested", run_name="sweep", fallback_dir=tmp_path)
    children = [Tracker.start(sqlite_uri, "sqlite-nested", run_name=f"trial{i}", parent_run_id=parent.run_id,
                              fallback_dir=tmp_path) for i in range(2)]
    for i, child in enumerate(children):
        child.log_metrics({"loss": float(i)}, 0)
        child.close()
    parent.log_metrics({"best": 0.0}, 0)
    parent.close()
    client = _client(sqlite_uri)
    exp = client.get_experiment_by_name("sqlite-nested")
    nested = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent.run_id}'")
    assert sorted(r.info.run_name for r in nested) == ["trial0", "trial1"]
    assert "mlflow.parentRunId" not in client.get_run(parent.run_id).data.tags


def test_undelivered_metrics_replay_on_resume(sqlite_uri, tmp_path):
    """A process that lost the tracker leaves its metrics in the fallback file; resuming delivers them."""
    fb = tmp_path / "fb"
    first = Tracker.start(sqlite_uri, "sqlite-replay", fallback_dir=fb)
    first.log_metrics({"loss": 0.0}, 0)
    first.close("KILLED")
    dead = f"http://127.0.0.1:{free_port()}"
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        lost = Tracker.start(dead, "sqlite-replay", run_id=first.run_id, fallback_dir=fb, flush_every=0.05)
        for s in range(1, 4):
            lost.log_metrics({"loss": float(s)}, s)
        lost.log_dict({"a": 1}, "late.json")
        lost.close("KILLED")
    assert len(tracking.pending_metrics(tracking.read_fallback(fb), first.run_id)) == 3
    again = Tracker.start(sqlite_uri, "sqlite-replay", run_id=first.run_id, fallback_dir=fb)
    again.log_metrics({"loss": 4.0}, 4)
    again.close()
    client = _client(sqlite_uri)
    assert _steps(client, first.run_id, "loss") == [0, 1, 2, 3, 4]
    assert [a.path for a in client.list_artifacts(first.run_id)] == ["late.json"]
    assert tracking.pending_metrics(tracking.read_fallback(fb), first.run_id) == []


def test_artifacts_of_a_process_killed_during_an_outage_reach_the_run_on_resume(sqlite_uri, tmp_path):
    """A process that lost the tracker and was then killed (no close, no atexit) leaves its staged artifacts on
    record in the fallback file, as its metrics; resuming the run uploads them."""
    fb = tmp_path / "fb"
    first = Tracker.start(sqlite_uri, "sqlite-killed", fallback_dir=fb)
    first.log_metrics({"loss": 0.0}, 0)
    first.close("KILLED")
    dead = f"http://127.0.0.1:{free_port()}"
    script = "\n".join([
        "import os, warnings",
        "warnings.simplefilter('ignore')",
        "from pvm_dist.tracking import Tracker",
        f"t = Tracker.start({dead!r}, 'sqlite-killed', run_id={first.run_id!r}, fallback_dir={str(fb)!r},",
        "                  flush_every=0.05)",
        "t.log_metrics({'loss': 1.0}, 1)",
        "t.log_dict({'step': 1}, 'checkpoints/last.json')",
        "assert t.flush(timeout=10) is False",  # the outage: everything spooled to the fallback file
        "os._exit(9)",
    ])
    package_root = Path(tracking.__file__).parents[2]  # the pvm_dist this test imports, for the child too
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(package_root), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 9, done.stderr
    again = Tracker.start(sqlite_uri, "sqlite-killed", run_id=first.run_id, fallback_dir=fb)
    again.close()
    client = _client(sqlite_uri)
    assert _steps(client, first.run_id, "loss") == [0, 1]
    assert [a.path for a in client.list_artifacts(first.run_id, "checkpoints")] == ["checkpoints/last.json"]
    assert not any((fb / "pending_artifacts").glob("*/last.json"))  # uploaded, so no longer kept


# --------------------------------------------------------------------------------------------------
# Dead tracker


def test_unreachable_at_start_falls_back(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    fb = tmp_path / "fb"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        tr = Tracker.start(dead, "dead", run_name="nobody-home", fallback_dir=fb, flush_every=0.05)
        assert time.perf_counter() - t0 < 3
        assert tr.run_id is None and not tr.healthy
        tr.log_params({"spec": {"layers": [4, 2]}})
        worst = 0.0
        for s in range(200):
            t = time.perf_counter()
            tr.log_metrics({"loss": float(s), "fps": 100.0}, s)
            worst = max(worst, time.perf_counter() - t)
        tr.log_dict({"a": 1}, "spec.json")
        assert tr.flush(timeout=10) is False
        t0 = time.perf_counter()
        tr.close()
        assert time.perf_counter() - t0 < 5
    assert len(_our_warnings(caught)) == 1
    assert worst < 0.1
    assert _no_tracking_threads(tr)
    records = tracking.read_fallback(fb)
    metrics = tracking.pending_metrics(records)
    assert sorted(r["step"] for r in metrics if r["key"] == "loss") == list(range(200))
    assert {r["key"]: r["value"] for r in records if r["kind"] == "param"} == {"spec.layers": "[4, 2]"}
    (art,) = [r for r in records if r["kind"] == "artifact"]
    assert json.loads(Path(art["local_path"]).read_text()) == {"a": 1}
    assert records[-1]["kind"] == "close" and records[-1]["delivered"] is False


def test_hung_server_does_not_stall_training(tmp_path, monkeypatch):
    """A tracker that accepts connections and never answers costs the caller nothing but start/close."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)  # never accept()ed: requests time out
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            tr = Tracker.start(f"http://127.0.0.1:{listener.getsockname()[1]}", "hung", fallback_dir=tmp_path,
                               flush_every=0.05)
            assert time.perf_counter() - t0 < 4
            worst = 0.0
            t0 = time.perf_counter()
            for s in range(300):
                t = time.perf_counter()
                tr.log_metrics({"loss": float(s)}, s)
                worst = max(worst, time.perf_counter() - t)
                time.sleep(0.002)
            t0 = time.perf_counter()
            tr.close()
            assert time.perf_counter() - t0 < 6
        assert worst < 0.1
        assert len(_our_warnings(caught)) == 1
        assert len(tracking.pending_metrics(tracking.read_fallback(tmp_path))) == 300
    finally:
        listener.close()


def test_queue_is_bounded(tmp_path):
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        tr = Tracker.start(f"http://127.0.0.1:{free_port()}", "dead", fallback_dir=tmp_path, max_queue=1000,
                           flush_every=60)
        for s in range(2500):
            tr.log_metrics({"loss": float(s)}, s)
        assert tr.queued <= 1000 and tr.dropped_metrics >= 1500
        tr.close()
    # nothing is lost on disk
    assert len(tracking.pending_metrics(tracking.read_fallback(tmp_path))) == 2500


# --------------------------------------------------------------------------------------------------
# Real mlflow server


def test_http_logging(live_server, tmp_path):
    tr = Tracker.start(live_server.uri, "http", run_name="over-http", fallback_dir=tmp_path / "fb",
                       tags={"backend": "numpy"}, flush_every=0.1)
    assert tr.run_id and tr.healthy
    tr.log_params({"spec": {"layers": [4, 2]}})
    for s in range(20):
        tr.log_metrics({"loss": 1.0 / (s + 1)}, s)
    client = _client(live_server.uri)
    deadline = time.perf_counter() + 10  # the background thread flushes every flush_every s by itself
    while _steps(client, tr.run_id, "loss") != list(range(20)):
        assert time.perf_counter() < deadline, "metrics never flushed in the background"
        time.sleep(0.05)
    (tmp_path / "ckpt.bin").write_bytes(b"\x00\x01" * 100)
    tr.log_artifact(tmp_path / "ckpt.bin", "checkpoints")
    assert cv2.imwrite(str(tmp_path / "zero.png"), np.zeros((8, 8, 3), np.uint8))
    tr.log_artifact(tmp_path / "zero.png", "pictures")
    tr.close()
    assert tr.outages == 0
    run = client.get_run(tr.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["spec.layers"] == "[4, 2]" and run.data.tags["backend"] == "numpy"
    assert _steps(client, tr.run_id, "loss") == list(range(20))
    assert [a.path for a in client.list_artifacts(tr.run_id, "checkpoints")] == ["checkpoints/ckpt.bin"]
    stored = list(live_server.artifacts.rglob("ckpt.bin"))
    assert len(stored) == 1 and stored[0].read_bytes() == b"\x00\x01" * 100
    assert [a.path for a in client.list_artifacts(tr.run_id, "pictures")] == ["pictures/zero.png"]


def test_outage_mid_run_then_recovery(live_server, tmp_path):
    server = live_server
    fb = tmp_path / "fb"
    tr = Tracker.start(server.uri, "outage", run_name="survivor", fallback_dir=fb, flush_every=0.1)
    run_id = tr.run_id
    assert run_id
    tr.log_params({"steps": 60})
    for s in range(10):
        tr.log_metrics({"loss": float(s), "fps": 50.0}, s)
    assert tr.flush()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        server.kill()
        worst = 0.0
        for s in range(10, 60):
            t = time.perf_counter()
            tr.log_metrics({"loss": float(s), "fps": 50.0}, s)
            worst = max(worst, time.perf_counter() - t)
            if s % 10 == 0:
                t = time.perf_counter()
                assert tr.flush(timeout=10) is False  # a forced retry against the dead server
                assert time.perf_counter() - t < 2
            time.sleep(0.005)
        tr.log_artifact(_write(tmp_path / "late.txt", "written during the outage"))
        assert tr.flush(timeout=10) is False
        # a second tracker started while the server is down: its run is created once the server is back
        late = Tracker.start(server.uri, "outage", run_name="late", fallback_dir=tmp_path / "fb-late",
                             flush_every=0.1)
        assert late.run_id is None
        for s in range(5):
            late.log_metrics({"loss": float(s)}, s)
    assert len([w for w in _our_warnings(caught) if "outage 1" in str(w.message)]) == 2  # one per tracker
    assert len([w for w in _our_warnings(caught) if str(tr.fallback_file) in str(w.message)]) == 1
    assert worst < 0.1 and not tr.healthy and tr.outages == 1
    spooled = tracking.pending_metrics(tracking.read_fallback(fb))
    assert sorted(r["step"] for r in spooled if r["key"] == "loss") == list(range(10, 60))

    server.start()  # same port, same store
    assert tr.flush(timeout=30) and tr.healthy
    tr.close()
    assert late.flush(timeout=30) and late.run_id
    late.close()
    assert _no_tracking_threads(tr) and _no_tracking_threads(late)

    client = _client(server.uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["steps"] == "60"
    assert _steps(client, run_id, "loss") == list(range(60))
    assert _steps(client, run_id, "fps") == list(range(60))
    assert [a.path for a in client.list_artifacts(run_id)] == ["late.txt"]
    exp = client.get_experiment_by_name("outage")
    assert sorted(r.info.run_name for r in client.search_runs([exp.experiment_id])) == ["late", "survivor"]
    assert client.get_run(late.run_id).info.status == "FINISHED"
    assert _steps(client, late.run_id, "loss") == list(range(5))
    # the fallback file says the spooled metrics were delivered after all
    assert tracking.pending_metrics(tracking.read_fallback(fb)) == []
    assert tracking.pending_metrics(tracking.read_fallback(tmp_path / "fb-late")) == []


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
