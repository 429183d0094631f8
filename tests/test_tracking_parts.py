"""Tests for the parts of pvm_dist.tracking one at a time, without MLflow: the outbox (spool, acknowledgement,
replay), reconnect backoff, the isolation of rejected items, and the delivery thread against a fake sink.
The whole tracker against real stores is tests/test_tracking.py."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import pytest

import pvm_dist.tracking as tracking_package
from pvm_dist.tracking import backoff, tracker
from pvm_dist.tracking.delivery import Delivery, TrackingWarning
from pvm_dist.tracking.fallback import pending_metrics, read_fallback
from pvm_dist.tracking.mlflow_sink import send_isolating
from pvm_dist.tracking.outbox import MetricEntry, Outbox


def _outbox(path: Path, session: str = "s1", run_id: str | None = "run1", max_queue: int = 1000) -> Outbox:
    return Outbox(path, session, max_queue=max_queue, run_id=run_id)


def test_package_exports_the_tracker_api():
    for name in tracker.__all__:
        assert getattr(tracking_package, name) is getattr(tracker, name)


def test_outbox_spools_acknowledges_and_replays_without_loss_or_duplicates(tmp_path):
    box = _outbox(tmp_path)
    assert box.add_metrics([("loss", float(s)) for s in range(5)], timestamp=1, step=0, nonfinite=2) == 5
    box.add_items("params", {"lr": "0.1"})
    box.spool()
    box.spool()  # nothing new: nothing written twice
    records = read_fallback(tmp_path)
    assert [r["seq"] for r in records if r["kind"] == "metric"] == [1, 2, 3, 4, 5]
    assert [r["key"] for r in records if r["kind"] == "param"] == ["lr"]

    box.ack_metrics(box.peek_metrics(2), rejected=1)
    assert box.queued == 3 and box.dropped == 1 and box.nonfinite_skipped == 2
    assert [r["seq"] for r in pending_metrics(read_fallback(tmp_path), "run1")] == [3, 4, 5]

    again = _outbox(tmp_path, session="s2")  # a later process resuming run1
    again.replay("run1")
    assert [e.seq for e in again.peek_metrics(10)] == [3, 4, 5]
    again.ack_metrics(again.peek_metrics(10), rejected=0)  # replayed entries are on disk: recorded delivered
    assert pending_metrics(read_fallback(tmp_path), "run1") == []


def test_outbox_records_the_run_of_metrics_spooled_before_it_existed(tmp_path):
    box = _outbox(tmp_path, run_id=None)
    box.add_metrics([("loss", 1.0)], timestamp=1, step=0, nonfinite=0)
    box.spool()
    box.attach_run("late-run", outage=True)
    assert [r["run_id"] for r in pending_metrics(read_fallback(tmp_path), "late-run")] == ["late-run"]


def test_outbox_sheds_memory_but_keeps_everything_on_disk(tmp_path):
    box = _outbox(tmp_path, max_queue=1000)
    box.add_metrics([("x", float(i)) for i in range(1500)], timestamp=1, step=0, nonfinite=0)
    box.shed()
    assert box.queued <= 1000 and box.dropped == 500
    assert len(pending_metrics(read_fallback(tmp_path))) == 1500


def test_outbox_stages_artifacts_so_the_caller_may_delete_them(tmp_path):
    src = tmp_path / "ckpt.bin"
    src.write_bytes(b"abc")
    box = _outbox(tmp_path / "fb")
    box.stage_file(src, "checkpoints")
    box.stage_bytes(b"{}", "spec/spec.json")
    src.unlink()
    first, second = box.pending_artifacts()
    assert first.staged.read_bytes() == b"abc" and first.artifact_path == "checkpoints"
    assert second.staged.name == "spec.json" and second.artifact_path == "spec"
    for art in (first, second):
        box.done_artifact(art, uploaded=True)
    box.remove_empty_staging()
    assert not (tmp_path / "fb").exists()


def test_outbox_spools_staged_artifacts_so_a_killed_process_leaves_them_to_a_resume(tmp_path):
    """A spool (an outage) records where each staged artifact waits, once; a later process resuming the run re-queues
    those still staged, but not one the tracker refused nor one uploaded (its staged copy gone)."""
    fb = tmp_path / "fb"
    box = _outbox(fb)
    for name in ("kept.json", "refused.json", "uploaded.json"):
        box.stage_bytes(b"{}", f"out/{name}")
    box.spool()
    box.spool()  # nothing new: nothing written twice
    records = [r for r in read_fallback(fb) if r["kind"] == "artifact"]
    assert sorted(Path(r["local_path"]).name for r in records) == ["kept.json", "refused.json", "uploaded.json"]
    assert all(r["retry"] and r["run_id"] == "run1" and r["artifact_path"] == "out" for r in records)
    kept, refused, uploaded = box.pending_artifacts()
    box.reject_artifact(refused, "bad path")
    box.done_artifact(refused, uploaded=False)  # left where it is
    box.done_artifact(uploaded, uploaded=True)
    # ... and the process dies here, without a close: only the fallback file says what is left
    again = _outbox(fb, session="s2")
    again.replay("run1")
    assert [a.staged for a in again.pending_artifacts()] == [kept.staged]
    assert refused.staged.exists() and not uploaded.staged.exists()
    assert _outbox(fb, session="s3").replay("another-run") == 0  # another run's resume takes none of them
    assert _outbox(fb, session="s3").pending_artifacts() == []


def test_backoff_doubles_to_a_cap_and_counts_outages(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(backoff.time, "monotonic", lambda: now[0])
    b = backoff.Backoff()
    assert b.ok and b.due()
    assert b.failed() is True and not b.ok and b.outages == 1
    assert not b.due()
    now[0] += backoff.MIN_BACKOFF_S
    assert b.due()
    delays = []
    for _ in range(8):
        start = now[0]
        assert b.failed() is False  # the same outage
        while not b.due():
            now[0] += 0.5
        delays.append(now[0] - start)
    assert delays[0] == 2 * backoff.MIN_BACKOFF_S and delays[-1] == backoff.MAX_BACKOFF_S
    assert b.recovered() is True and b.ok and b.recovered() is False
    assert b.failed() is True and b.outages == 2


class _Rejected(Exception):
    error_code = "INVALID_PARAMETER_VALUE"


def test_send_isolating_drops_only_the_bad_items_and_lets_outages_through():
    sent, rejected = [], []

    def send(items):
        if "bad" in items:
            raise _Rejected("no")
        sent.extend(items)

    send_isolating(["a", "bad", "b", "c", "bad"], send, lambda item, e: rejected.append(item))
    assert sorted(sent) == ["a", "b", "c"] and rejected == ["bad", "bad"]
    with pytest.raises(ConnectionError):
        send_isolating(["a"], lambda items: (_ for _ in ()).throw(ConnectionError()), lambda item, e: None)


class _FakeSink:
    """The part of MlflowSink that Delivery uses; ``up`` says whether the tracker answers."""

    def __init__(self) -> None:
        self.uri = "fake://store"
        self.lock = threading.RLock()
        self.ready = False
        self.run_id: str | None = None
        self.up = True
        self.metrics: list[MetricEntry] = []
        self.ended: str | None = None

    def _check(self) -> None:
        if not self.up:
            raise ConnectionError("tracker away")

    def open_run(self) -> None:
        self._check()
        self.run_id, self.ready = "fake-run", True

    def log_items(self, what, items) -> list[str]:
        self._check()
        return []

    def log_metrics(self, batch) -> list[str]:
        self._check()
        self.metrics.extend(batch)
        return []

    def log_artifact(self, local_path, artifact_path) -> str | None:
        self._check()
        return None

    def end_run(self, status, tags) -> None:
        self._check()
        self.ended = status


def test_delivery_survives_an_outage_and_delivers_in_order(tmp_path):
    sink = _FakeSink()
    sink.up = False
    box = _outbox(tmp_path, run_id=None)
    delivery = Delivery(box, sink, flush_every=60)  # only flush() and close() deliver
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        delivery.start("pvm-tracking-test")
        box.add_metrics([("loss", float(s)) for s in range(3)], timestamp=1, step=0, nonfinite=0)
        assert delivery.flush(timeout=10) is False and not delivery.backoff.ok
        box.add_metrics([("loss", 3.0)], timestamp=1, step=1, nonfinite=0)
        assert delivery.flush(timeout=10) is False
    assert [w for w in caught if issubclass(w.category, TrackingWarning)] and delivery.backoff.outages == 1
    assert len(pending_metrics(read_fallback(tmp_path))) == 4

    sink.up = True
    assert delivery.flush(timeout=10) is True and delivery.backoff.ok
    assert [e.value for e in sink.metrics] == [0.0, 1.0, 2.0, 3.0]
    assert pending_metrics(read_fallback(tmp_path)) == []
    assert delivery.close("FINISHED") is True and delivery.close("FINISHED") is False
    delivery.join(10)
    assert sink.ended == "FINISHED"


def test_an_image_series_entry_is_named_by_its_picture(tmp_path):
    """The same picture logged again (a run finished after a kill) gets the same artifact names, so MLflow keeps
    one entry for that step; another picture at that step gets other names."""
    import cv2
    import numpy as np

    from pvm_dist.tracking.images import image_series_files

    png = tmp_path / "step_000000040.png"
    cv2.imwrite(str(png), np.full((30, 40, 3), 90, np.uint8))
    first = image_series_files(png, "prediction", 40, tmp_path / "a")
    again = image_series_files(png, "prediction", 40, tmp_path / "b")
    assert [p.name for p in first] == [p.name for p in again]
    assert first[0].name.startswith("prediction+step+40+timestamp+") and first[1].name.endswith("+compressed.webp")
    assert first[0].read_bytes() == png.read_bytes()
    cv2.imwrite(str(png), np.full((30, 40, 3), 200, np.uint8))
    other = image_series_files(png, "prediction", 40, tmp_path / "c")
    assert other[0].name != first[0].name
