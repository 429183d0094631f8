"""Finish what trackers left on disk: the spools (``tracking_fallback.jsonl``) of runs whose process ended
while the tracker was away, or was killed.

For each run a spool names, whose folder no live tracker holds (:mod:`~pvm_dist.tracking.owner`), and
that is not complete (no ``close`` record saying ``delivered``, or metrics not acknowledged), :func:`sync_spool`
reopens the run (by id, else by its run key, else creates it where the spool says), re-queues every
undelivered metric, param, tag and artifact, and ends the run with the status its process meant
(KILLED where it died before saying). Acknowledged metrics get ``delivered`` records, so a second sync sends
nothing: every metric arrives once.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pvm_dist.tracking.fallback import FALLBACK_FILE, pending_metrics, read_fallback
from pvm_dist.tracking.owner import claim

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)  # one object per run, hashed by identity
class SpoolRun:
    """One run as a spool tells it: the tracker sessions that logged to it and where it lives."""

    sessions: set[str]
    identity: dict[str, Any]
    run_id: str | None = None
    status: str | None = None  # the status of its last close, None when its process died first
    delivered: bool = False  # that last close reached the tracker
    pending: int = 0  # metrics not acknowledged

    @property
    def complete(self) -> bool:
        return self.delivered and not self.pending


@dataclasses.dataclass
class SyncResult:
    """What one sync did: runs finished, metrics delivered, runs left (tracker still away), folders in use."""

    runs: int = 0
    metrics: int = 0
    left: list[str] = dataclasses.field(default_factory=list)
    busy: list[str] = dataclasses.field(default_factory=list)

    def add(self, other: SyncResult) -> None:
        self.runs += other.runs
        self.metrics += other.metrics
        self.left += other.left
        self.busy += other.busy


def spool_runs(records: list[dict[str, Any]]) -> list[SpoolRun]:
    """The runs of a spool's records, grouped by run id (or run key, or tracker session)."""
    session_of: dict[str, SpoolRun] = {}
    by_name: dict[str, SpoolRun] = {}

    def run_for(rec: dict[str, Any]) -> SpoolRun:
        session = str(rec.get("session"))
        names = [n for n in (rec.get("run_id"), rec.get("run_key")) if n]
        found = [session_of.get(session), *(by_name.get(n) for n in names)]
        run = next((r for r in found if r is not None), None) or SpoolRun(set(), {})
        run.sessions.add(session)
        session_of[session] = run
        for n in names:
            by_name.setdefault(n, run)
        return run

    for rec in records:
        kind = rec.get("kind")
        run = run_for(rec)
        if rec.get("run_id"):
            run.run_id = rec["run_id"]
        if kind in ("run", "outage"):
            run.identity.update({k: rec[k] for k in ("uri", "experiment", "run_name", "run_key", "parent_run_id",
                                                      "tags", "inputs") if rec.get(k) is not None})
        elif kind == "close":
            run.status, run.delivered = rec.get("status"), bool(rec.get("delivered"))
    runs = list(dict.fromkeys(session_of.values()))  # each once, in order of appearance
    for m in pending_metrics(records):
        for run in runs:
            if m.get("session") in run.sessions:
                run.pending += 1
    return runs


def sync_spool(fallback_dir: Path) -> SyncResult:
    """Deliver and end every incomplete run of the spool in ``fallback_dir`` (see the module docstring)."""
    from pvm_dist.tracking.tracker import Tracker

    result = SyncResult()
    fallback_dir = Path(fallback_dir)
    file = fallback_dir / FALLBACK_FILE
    if not file.exists():
        return result
    lock = claim(fallback_dir.parent)
    if lock is None:
        result.busy.append(str(fallback_dir))
        return result
    try:
        for run in spool_runs(read_fallback(file)):
            if run.complete:
                continue
            ident = run.identity
            if not ident.get("uri") or not ident.get("experiment"):
                log.warning("tracking: %s names a run without its tracker (written by an older pvm-dist); "
                            "skipped", file)
                result.left.append(f"{file}: run {run.run_id} (no tracker recorded)")
                continue
            tracker = Tracker.start(ident["uri"], ident["experiment"], run_name=ident.get("run_name"),
                                    run_id=run.run_id, run_key=ident.get("run_key"),
                                    parent_run_id=None if run.run_id else ident.get("parent_run_id"),
                                    tags=None if run.run_id else ident.get("tags"), inputs=ident.get("inputs") or (),
                                    fallback_dir=fallback_dir, replay_fallback=False)
            queued = tracker.requeue(run.sessions)
            status = run.status or "KILLED"  # no close record: its process died
            tracker.close(status)
            if tracker.healthy and tracker.run_id:
                result.runs += 1
                result.metrics += queued
            else:
                result.left.append(f"{file}: run {tracker.run_id or ident.get('run_name')} (tracker "
                                   f"{ident['uri']} unreachable)")
    finally:
        lock.release()
    return result


def end_if_running(uri: str, run_id: str, owner: Path, status: str = "KILLED") -> bool:
    """End as ``status`` (KILLED: its process died without closing it) the run ``run_id`` when MLflow still has
    it RUNNING and no live tracker holds ``owner`` (the folder its process tracked from). True when it did."""
    lock = claim(owner)
    if lock is None:
        return False
    try:
        from mlflow import MlflowClient

        client = MlflowClient(uri)
        if client.get_run(run_id).info.status != "RUNNING":
            return False
        client.set_terminated(run_id, status=status)
        return True
    except Exception as e:  # noqa: BLE001 - the tracker away or the run unknown: nothing to close now
        log.warning("tracking: cannot check run %s at %s: %s", run_id, uri, e)
        return False
    finally:
        lock.release()


def spool_dirs(paths: Iterable[Path]) -> list[Path]:
    """Every folder holding a spool under ``paths`` (folders, or spool files themselves)."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_file() and path.name == FALLBACK_FILE:
            found.append(path.parent)
        elif path.is_dir():
            found += sorted(p.parent for p in path.rglob(FALLBACK_FILE))
    return list(dict.fromkeys(found))


def sync_paths(paths: Iterable[Path]) -> SyncResult:
    """:func:`sync_spool` for every spool under ``paths``."""
    result = SyncResult()
    for folder in spool_dirs(paths):
        result.add(sync_spool(folder))
    return result
