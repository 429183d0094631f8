"""The durable outbox of one tracker: what the caller logged and the tracker has not confirmed yet.

Metrics wait in memory in order (bounded by ``max_queue``: past it the oldest are shed from memory, after
they are on disk), params and tags by key, artifacts as staged copies (hard link, else copy) under
``<fallback_dir>/pending_artifacts``, so the caller may delete or replace the original at once. While the
tracker is away, :meth:`Outbox.spool` appends what is queued and not yet on disk to the fallback file (a
staged artifact as a record of where it waits, so that a process killed during the outage leaves it to be
re-queued, as its metrics are); when a batch is confirmed, :meth:`Outbox.ack_metrics` drops it and records
``delivered`` for what was on disk. A later process resuming the run re-queues (:meth:`Outbox.replay`) what
is still undelivered, so nothing is lost or sent twice.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pvm_dist.tracking.fallback import FALLBACK_FILE, Journal, pending_metrics, read_fallback

log = logging.getLogger(__name__)

PENDING_ARTIFACTS = "pending_artifacts"

Items = Literal["params", "tags"]
_RECORD_KIND = {"params": "param", "tags": "tag"}


class MetricEntry(NamedTuple):
    """One metric value; ``(session, seq)`` names it in the fallback file."""

    session: str
    seq: int
    key: str
    value: float
    timestamp: int
    step: int


class StagedArtifact(NamedTuple):
    """A file or folder waiting for upload."""

    staged: Path  # our own copy (hard link) of the file or folder
    artifact_path: str | None
    cleanup: Path  # the staging folder (holding only ``staged``) to remove after upload


class Backlog(NamedTuple):
    """How much is waiting."""

    metrics: int
    params_tags: int
    artifacts: int


class Outbox:
    """Queued records of one tracker session, and their copy in ``<fallback_dir>/tracking_fallback.jsonl``.

    Thread-safe: callers add while the delivery thread sends and acknowledges.
    """

    def __init__(self, fallback_dir: Path, session: str, *, max_queue: int, run_id: str | None,
                 identity: Mapping[str, Any] | None = None) -> None:
        self.fallback_dir = fallback_dir
        self.fallback_file = fallback_dir / FALLBACK_FILE
        self.session = session
        self.max_queue = max_queue
        self.run_id = run_id  # written into the records; see attach_run
        self.identity = dict(identity or {})  # where the run lives (uri, experiment, ...): in run and outage records
        self.nonfinite_skipped = 0  # metric values never queued because NaN/inf
        self.dropped = 0  # metrics rejected by the tracker as invalid, or shed from memory during a long outage
        self._journal = Journal(self.fallback_file)
        self._dir_existed = fallback_dir.exists()
        self._lock = threading.Lock()
        self._spool_lock = threading.Lock()  # one spool (or acknowledgement) at a time
        self._metrics: deque[MetricEntry] = deque()
        self._seq = 0
        self._spooled_seq = 0  # own metrics with seq <= this are in the fallback file
        self._items: dict[Items, dict[str, str]] = {"params": {}, "tags": {}}
        self._spooled_items: dict[Items, dict[str, str]] = {"params": {}, "tags": {}}
        self._artifacts: list[StagedArtifact] = []
        self._recorded: set[Path] = set()  # staged artifacts with a record in the fallback file
        self._artifact_counter = itertools.count()
        self._run_announced = False  # a "run" record was written to the fallback file

    # ---- adding (caller threads) ------------------------------------------------------------------

    def add_metrics(self, values: Iterable[tuple[str, float]], timestamp: int, step: int, nonfinite: int) -> int:
        """Queue clean ``(key, value)`` pairs of one step (``nonfinite`` more were skipped); the queue length."""
        with self._lock:
            for key, value in values:
                self._seq += 1
                self._metrics.append(MetricEntry(self.session, self._seq, key, value, timestamp, step))
            self.nonfinite_skipped += nonfinite
            return len(self._metrics)

    def add_items(self, what: Items, items: Mapping[str, str]) -> None:
        """Queue params or tags (a later value of a key replaces a queued one)."""
        with self._lock:
            self._items[what].update(items)

    def stage_file(self, src: Path, artifact_path: str | None) -> None:
        """Queue a copy of the file or folder ``src`` (hard links where possible). Raises if it cannot."""
        folder = self._staging_folder()
        dst = folder / src.name
        if src.is_dir():
            shutil.copytree(src, dst, copy_function=_link_or_copy)
        else:
            _link_or_copy(src, dst)
        self._add_artifact(StagedArtifact(dst, artifact_path, folder))

    def stage_bytes(self, data: bytes, artifact_file: str) -> None:
        """Queue ``data`` as the artifact ``artifact_file`` (a path inside the run). Raises if it cannot."""
        parts = [p for p in artifact_file.replace("\\", "/").split("/") if p not in ("", ".", "..")]
        if not parts:
            raise ValueError(f"empty artifact_file {artifact_file!r}")
        folder = self._staging_folder()
        dst = folder / parts[-1]
        dst.write_bytes(data)
        self._add_artifact(StagedArtifact(dst, "/".join(parts[:-1]) or None, folder))

    def shed(self) -> None:
        """Over ``max_queue``: make sure everything is on disk, then drop the oldest from memory."""
        self.spool()
        with self._lock:
            excess = len(self._metrics) - self.max_queue
            if excess <= 0:
                return
            excess = max(excess, self.max_queue // 10)  # shed in chunks: this path stays rare
            for _ in range(min(excess, len(self._metrics))):
                self._metrics.popleft()
            self.dropped += excess
        log.warning("tracking: %d queued metrics shed from memory during the outage (kept in %s)",
                    excess, self.fallback_file)

    # ---- state ------------------------------------------------------------------------------------

    @property
    def queued(self) -> int:
        """Metrics waiting for delivery."""
        return len(self._metrics)

    def backlog(self) -> Backlog:
        with self._lock:
            return Backlog(len(self._metrics), len(self._items["params"]) + len(self._items["tags"]),
                           len(self._artifacts))

    # ---- delivery (the delivery thread) -----------------------------------------------------------

    def peek_metrics(self, n: int) -> list[MetricEntry]:
        """The oldest ``n`` queued metrics, left queued until acknowledged."""
        with self._lock:
            return list(itertools.islice(self._metrics, 0, n))

    def ack_metrics(self, batch: list[MetricEntry], rejected: int) -> None:
        """``batch`` (from :meth:`peek_metrics`) reached the tracker, ``rejected`` of them refused as invalid:
        drop it, and record it delivered where it was on disk."""
        with self._spool_lock:
            delivered: dict[str, int] = {}
            for e in batch:
                if e.session != self.session or e.seq <= self._spooled_seq:
                    delivered[e.session] = max(delivered.get(e.session, -1), e.seq)
            with self._lock:
                ids = {id(e) for e in batch}
                while self._metrics and id(self._metrics[0]) in ids:
                    self._metrics.popleft()
                self.dropped += rejected
        if delivered:
            self._journal.append([{"kind": "delivered", "session": s, "upto": upto, "run_id": self.run_id,
                                   "time": time.time()} for s, upto in delivered.items()])

    def pending_items(self, what: Items) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._items[what].items())

    def ack_items(self, what: Items, sent: list[tuple[str, str]]) -> None:
        """Params or tags ``sent`` (from :meth:`pending_items`) were handled; a value queued since stays."""
        with self._lock:
            pending = self._items[what]
            for k, v in sent:
                if pending.get(k) is v:
                    del pending[k]

    def pending_artifacts(self) -> list[StagedArtifact]:
        with self._lock:
            return list(self._artifacts)

    def done_artifact(self, art: StagedArtifact, uploaded: bool) -> None:
        """Stop retrying ``art``; its staged copy is removed once ``uploaded``."""
        if uploaded:
            shutil.rmtree(art.cleanup, ignore_errors=True)
        with self._lock:
            self._artifacts.remove(art)
            self._recorded.discard(art.staged)

    def reject_artifact(self, art: StagedArtifact, reason: str) -> None:
        """Record in the fallback file that the tracker refused ``art``: it stays staged, and a resumed run does
        not upload it again (this record overrides one :meth:`spool` wrote)."""
        self._journal.append([self._artifact_record(art, f"rejected: {reason}", False)])

    def attach_run(self, run_id: str | None, outage: bool) -> None:
        """The run now exists. The fallback file (if any, or during an ``outage``) learns this session's run,
        so records written before the run id was known still find their run."""
        with self._lock:
            self.run_id = run_id
        if (self._journal.exists() or outage) and not self._run_announced:
            self._journal.append([{"kind": "run", "session": self.session, "run_id": run_id, **self.identity}])
            self._run_announced = True

    def record(self, kind: str, **fields: Any) -> None:
        """Append an event (``outage``, ``close``) of this session to the fallback file."""
        self._journal.append([{"kind": kind, "session": self.session, "run_id": self.run_id, **fields}])

    def spool(self) -> None:
        """Append to the fallback file what is queued and not yet written there: metrics, params and tags, and
        a record of each staged artifact (where it waits, to be uploaded by a resumed run)."""
        with self._spool_lock:
            with self._lock:
                new: list[MetricEntry] = []
                for e in reversed(self._metrics):
                    if e.session != self.session or e.seq <= self._spooled_seq:
                        break
                    new.append(e)
                new.reverse()
                upto = self._seq
                changed = {what: {k: v for k, v in items.items() if self._spooled_items[what].get(k) != v}
                           for what, items in self._items.items()}
                run_id = self.run_id
                arts = [a for a in self._artifacts if a.staged not in self._recorded]
                self._recorded.update(a.staged for a in arts)
            recs: list[dict[str, Any]] = [
                {"kind": "metric", "session": e.session, "seq": e.seq, "run_id": run_id, "key": e.key,
                 "value": e.value, "step": e.step, "timestamp": e.timestamp} for e in new]
            recs += [self._artifact_record(a, "staged, not uploaded yet", True) for a in arts]
            for what, items in changed.items():
                recs += [{"kind": _RECORD_KIND[what], "session": self.session, "run_id": run_id, "key": k,
                          "value": v} for k, v in items.items()]
            self._journal.append(recs)
            with self._lock:
                self._spooled_seq = max(self._spooled_seq, upto)
                for what, items in changed.items():
                    self._spooled_items[what].update(items)

    def replay(self, run_id: str | None, sessions: set[str] | None = None) -> int:
        """Re-queue what an earlier process left undelivered for run ``run_id`` (or by tracker ``sessions``,
        whose run may never have been known) in the same fallback file; the metrics re-queued."""
        records = read_fallback(self.fallback_file)
        sessions = sessions or set()

        def ours(rec: Mapping[str, Any]) -> bool:
            return (run_id is not None and rec.get("run_id") == run_id) or rec.get("session") in sessions

        metrics = [m for m in pending_metrics(records) if ours(m)]
        last = {r.get("local_path"): r for r in records if r.get("kind") == "artifact" and ours(r)}  # latest wins
        arts = [r for r in last.values() if r.get("retry", True) and Path(r.get("local_path") or "").exists()]
        # params and tags of sessions being finished: sent again (the same values are harmless)
        items = [("params" if r["kind"] == "param" else "tags", str(r.get("key")), str(r.get("value")))
                 for r in records if r.get("kind") in ("param", "tag") and r.get("session") in sessions]
        with self._lock:
            for what, key, value in items:
                self._items[what][key] = value
            for rec in metrics:
                self._metrics.append(MetricEntry(rec["session"], int(rec["seq"]), rec["key"], float(rec["value"]),
                                                 int(rec["timestamp"]), int(rec["step"])))
            for rec in arts:
                staged = Path(rec["local_path"])
                self._artifacts.append(StagedArtifact(staged, rec.get("artifact_path"), staged.parent))
        if metrics or arts:
            log.info("tracking: re-queued %d undelivered metrics and %d artifacts of run %s from %s",
                     len(metrics), len(arts), run_id, self.fallback_file)
        return len(metrics)

    def remove_empty_staging(self) -> None:
        """After a clean close: remove the staging folder, and the fallback dir if we made it, when empty."""
        try:
            (self.fallback_dir / PENDING_ARTIFACTS).rmdir()  # only when empty
            if not self._dir_existed:
                self.fallback_dir.rmdir()  # ours, and empty
        except OSError:
            pass

    def _artifact_record(self, art: StagedArtifact, note: str, retry: bool) -> dict[str, Any]:
        return {"kind": "artifact", "session": self.session, "run_id": self.run_id, "local_path": str(art.staged),
                "artifact_path": art.artifact_path, "note": note, "retry": retry}

    def _staging_folder(self) -> Path:
        folder = self.fallback_dir / PENDING_ARTIFACTS / f"{self.session}-{next(self._artifact_counter):05d}"
        folder.mkdir(parents=True, exist_ok=False)
        return folder

    def _add_artifact(self, art: StagedArtifact) -> None:
        with self._lock:
            self._artifacts.append(art)


def _link_or_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
