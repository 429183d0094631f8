"""The fallback file ``tracking_fallback.jsonl``: an append-only JSON-lines journal of what a tracker could
not deliver (and of what it delivered later), so that nothing is lost when the tracker is away and a later
process, or a person, can tell what is still missing from a run."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pvm_dist.tracking.normalize import short_error

log = logging.getLogger(__name__)

FALLBACK_FILE = "tracking_fallback.jsonl"

_FILE_LOCKS: dict[str, threading.Lock] = {}
_FILE_LOCKS_GUARD = threading.Lock()


_INT, _NUMBER = (int,), (int, float)
#: What each record kind needs to be used (field: types); kinds not listed need only their session.
RECORD_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "metric": {"seq": _INT, "key": (str,), "value": _NUMBER, "timestamp": _INT, "step": _INT},
    "delivered": {"upto": _INT}, "param": {"key": (str,)}, "tag": {"key": (str,)}, "artifact": {"local_path": (str,)},
}


def record_problem(rec: Any) -> str | None:
    """Why ``rec`` (a decoded line) cannot be used, or None when it can."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    if not isinstance(rec.get("kind"), str):
        return "no record kind"
    if not isinstance(rec.get("session"), str):
        return f"a {rec['kind']!r} record without a valid 'session'"
    for field, types in RECORD_FIELDS.get(rec["kind"], {}).items():
        value = rec.get(field)
        if isinstance(value, bool) or not isinstance(value, types):
            return f"a {rec['kind']!r} record without a valid {field!r}"
    return None


def read_fallback(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All usable records of a fallback file (or of ``<dir>/tracking_fallback.jsonl``), in order.

    Kinds: ``metric`` (session, seq, run_id, key, value, step, timestamp), ``param``, ``tag``, ``artifact``
    (a staged file not uploaded, with its note), ``run`` (the run a session's records belong to, once known),
    ``delivered`` (metrics of ``session`` up to ``upto`` reached the tracker), ``outage``, ``close``.
    A torn last line (a crash while writing) is skipped; any other damaged line is skipped with a warning
    naming it (:func:`record_problem`).
    """
    p = Path(path)
    if p.is_dir():
        p = p / FALLBACK_FILE
    return read_json_lines(p, record_problem, log, "tracking:", quiet_torn_tail=True)


def read_json_lines(path: Path, problem_of: Callable[[Any], str | None], logger: logging.Logger, label: str,
                    quiet_torn_tail: bool = False) -> list[dict[str, Any]]:
    """The lines of a JSON-lines file that decode to a record ``problem_of`` accepts (returns None for), in order;
    each other line is skipped with a warning naming the file, the line and the problem (``label`` first). With
    ``quiet_torn_tail`` a last line that is not whole JSON (its writer died mid-line) is skipped without one.
    A missing file has no records."""
    if not path.exists():
        return []
    records = []
    lines = path.read_bytes().split(b"\n")
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw.decode("utf-8"))
            problem = problem_of(rec)
        except UnicodeDecodeError:
            problem = "not UTF-8"
        except json.JSONDecodeError:
            if quiet_torn_tail and number == len(lines):
                continue
            problem = "not JSON (torn or damaged)"
        if problem is None:
            records.append(rec)
        else:
            logger.warning("%s %s line %d skipped: %s", label, path, number, problem)
    return records


def pending_metrics(records: Iterable[Mapping[str, Any]], run_id: str | None = None) -> list[dict[str, Any]]:
    """The metric records of a fallback file that never reached the tracker (optionally of one run)."""
    records = list(records)
    delivered: dict[str, int] = {}
    session_run: dict[str, str] = {}
    for rec in records:
        if rec.get("kind") == "delivered":
            delivered[rec["session"]] = max(delivered.get(rec["session"], -1), int(rec["upto"]))
        elif rec.get("kind") == "run" and rec.get("run_id"):
            session_run[rec["session"]] = rec["run_id"]
    out, seen = [], set()
    for rec in records:
        if rec.get("kind") != "metric":
            continue
        ident = (rec.get("session"), rec.get("seq"))
        if ident in seen or rec["seq"] <= delivered.get(rec["session"], -1):
            continue
        seen.add(ident)
        rid = rec.get("run_id") or session_run.get(rec["session"])
        if run_id is None or rid == run_id:
            out.append({**rec, "run_id": rid})
    return out


class Journal:
    """Appends records to one fallback file. Trackers of one process that share the file write one at a
    time (whole lines, never interleaved); a failing disk is reported once and never raises."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._failed = False

    def exists(self) -> bool:
        return self.path.exists()

    def append(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            data = "".join(json.dumps(r, default=str) + "\n" for r in records).encode("utf-8")
            with _file_lock(self.path), open(self.path, "a+b") as f:
                if f.seek(0, os.SEEK_END) > 0:
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":  # a torn last line (a process killed mid-write): end it, or it swallows these
                        data = b"\n" + data
                f.write(data)
                f.flush()
        except Exception as e:  # noqa: BLE001 - a tracker never breaks training
            if not self._failed:
                self._failed = True
                log.warning("tracking: cannot write fallback file %s: %s", self.path, short_error(e))


def _file_lock(path: Path) -> threading.Lock:
    with _FILE_LOCKS_GUARD:
        return _FILE_LOCKS.setdefault(str(path), threading.Lock())
