"""MLflow tracking for one training run, robust to an unreachable tracker.

Training must never stop or slow down because the tracker is away. A :class:`Tracker` talks to MLflow
through its own ``mlflow.MlflowClient`` (no global fluent state, so several trackers can live in one
process, e.g. a parent run and nested runs) and does all tracker I/O on one background thread:

- ``log_metrics`` / ``log_params`` / ``set_tags`` / ``log_artifact`` only queue work and return at once.
- The worker thread writes queued metrics with ``log_batch`` (at most 1000 per call) every
  ``flush_every`` seconds, or sooner when 1000 are waiting; params and tags go in batches of 100.
- **Outage** (tracker unreachable at start or gone mid-run): one :class:`TrackingWarning` per outage;
  training goes on. Metrics stay queued in memory in order (bounded by ``max_queue``; the oldest are
  shed from memory first, they are already on disk) and are also appended to the fallback file
  ``<fallback_dir>/tracking_fallback.jsonl``. Delivery is retried with exponential backoff (1 s doubling
  to 60 s; ``flush()`` and ``close()`` retry at once). When the tracker answers again the queue is
  delivered in order, so the run ends up with every metric, and a ``delivered`` record is appended to
  the fallback file. If the run could not be created at start, it is created at the first successful
  retry (``run_id`` is ``None`` until then). Artifacts are staged (hard link, else copy) under
  ``<fallback_dir>/pending_artifacts`` when logged, uploaded by the worker, and retried at ``close``;
  what still fails stays there with a note in the fallback file.
- Permanent rejections (an invalid key, a param whose value changed on resume) are not outages: the
  offending items are isolated by splitting the batch, dropped, and reported once through ``logging``.
- Resuming (``run_id=...``) logs into the same run; undelivered metrics and artifacts of that run left
  in the same fallback file by an earlier process are re-queued.

Timeouts: a dead server must not stall anyone, so the first Tracker sets (only where not already set)
``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0`` and ``MLFLOW_HTTP_REQUEST_TIMEOUT=5`` in ``os.environ``. MLflow reads
them per request, so they apply process-wide; set them yourself to override. With these, a refused
connection fails in milliseconds and a black-holed host in about 5 s (that only delays the worker, or
``start``/``close`` once each).
"""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
import warnings
import weakref
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from pvm_dist.tracking.defaults import default_tracking_uri, run_tags
from pvm_dist.tracking.fallback import FALLBACK_FILE, Journal, pending_metrics, read_fallback
from pvm_dist.tracking.normalize import clean_tags, finite_values, flatten_params, metric_items, short_error

__all__ = ["FALLBACK_FILE", "STATUSES", "Tracker", "TrackingWarning", "configure_http_timeouts",
           "default_tracking_uri", "flatten_params", "pending_metrics", "read_fallback", "run_tags"]

log = logging.getLogger(__name__)

PENDING_ARTIFACTS = "pending_artifacts"
STATUSES = ("FINISHED", "KILLED", "FAILED")
HTTP_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}

# MLflow's batch limits (mlflow.utils.validation).
PARAMS_TAGS_PER_BATCH = 100
METRICS_PER_BATCH = 1000

MIN_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0

# MLflow error codes that mean "this request is wrong", not "the tracker is away".
_PERMANENT_CODES = frozenset({"INVALID_PARAMETER_VALUE", "BAD_REQUEST", "MALFORMED_REQUEST", "INVALID_STATE",
                              "RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST"})
_STORE_LOCKS_GUARD = threading.Lock()
_STORE_LOCKS: dict[str, threading.RLock] = {}


class TrackingWarning(UserWarning):
    """Emitted once per tracker outage (and never raised: training goes on)."""


# --------------------------------------------------------------------------------------------------
# Helpers


def configure_http_timeouts() -> None:
    """Fail fast against a dead HTTP tracker (no MLflow-internal retries, 5 s socket timeout).

    Sets the variables only where unset; MLflow reads them at each request (process-wide).
    """
    for name, value in HTTP_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)


def _store_lock(uri: str) -> threading.RLock:
    """One lock per tracking store: the trackers of one process (a sweep driver holds one per trial)
    talk to a store one at a time, so a SQLite file sees a single writer."""
    with _STORE_LOCKS_GUARD:
        return _STORE_LOCKS.setdefault(uri, threading.RLock())


def _is_permanent(exc: BaseException) -> bool:
    return getattr(exc, "error_code", None) in _PERMANENT_CODES


def _now_ms() -> int:
    return int(time.time() * 1000)


class _Entry(NamedTuple):
    session: str
    seq: int
    key: str
    value: float
    timestamp: int
    step: int


class _Artifact(NamedTuple):
    staged: Path  # our own copy (hard link) of the file or folder
    artifact_path: str | None
    cleanup: Path  # the staging folder (holding only ``staged``) to remove after upload


# --------------------------------------------------------------------------------------------------
# Tracker


class Tracker:
    """One MLflow run. Never raises to the caller after construction; see the module docstring."""

    def __init__(self, uri: str | None = None, experiment: str = "pvm-dist", *, run_name: str | None = None,
                 run_id: str | None = None, tags: Mapping[str, Any] | None = None,
                 parent_run_id: str | None = None, fallback_dir: str | os.PathLike[str] | None = None,
                 flush_every: float = 5.0, max_queue: int = 1_000_000, replay_fallback: bool = True) -> None:
        configure_http_timeouts()
        self.uri = uri or default_tracking_uri()
        self.experiment = experiment
        self.run_name = run_name
        self.parent_run_id = parent_run_id
        self.fallback_dir = Path(fallback_dir if fallback_dir is not None else Path.cwd() / "tracking_fallback")
        self.fallback_file = self.fallback_dir / FALLBACK_FILE
        self._journal = Journal(self.fallback_file)
        self._fallback_dir_existed = self.fallback_dir.exists()
        self.flush_every = max(float(flush_every), 0.01)
        self.max_queue = max(int(max_queue), METRICS_PER_BATCH)
        self.session = uuid.uuid4().hex[:12]
        self.outages = 0  # how many outages were seen
        self.nonfinite_skipped = 0  # metric values skipped because NaN/inf
        self.dropped_metrics = 0  # rejected by the tracker as invalid, or shed from memory during a long outage
        self.closed = False

        self._resume_id = run_id
        self._run_id = run_id
        self._run_ready = False
        self._run_announced = False  # a "run" record was written to the fallback file
        self._client: Any = None
        self._start_ms = _now_ms()
        self._create_tags = clean_tags(tags or {})
        if parent_run_id:
            self._create_tags["mlflow.parentRunId"] = parent_run_id

        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._spool_lock = threading.Lock()
        self._metrics: deque[_Entry] = deque()
        self._seq = 0
        self._spooled_seq = 0  # own metrics with seq <= this are in the fallback file
        self._params: dict[str, str] = {}
        self._tags: dict[str, str] = {}
        self._spooled_params: dict[str, str] = {}
        self._spooled_tags: dict[str, str] = {}
        self._artifacts: list[_Artifact] = []
        self._artifact_counter = itertools.count()
        self._ok = True
        self._backoff = MIN_BACKOFF_S
        self._retry_at = 0.0
        self._next_tick = time.monotonic() + self.flush_every
        self._flush_requested = 0
        self._flush_done = 0
        self._closing = False
        self._close_status = "FINISHED"

        if run_id and replay_fallback:
            self._replay(run_id)
        if tags and run_id:  # resuming: the run exists already, tags are logged like later ones
            self._tags.update(self._create_tags)

        with _store_lock(self.uri):
            self._cycle(force=True)  # connect (and create the run) now, so run_id is known when the tracker is up
        self._thread = threading.Thread(target=self._loop, name=f"pvm-tracking-{self.session}", daemon=True)
        self._thread.start()
        ref = weakref.ref(self)
        self._atexit = lambda: (t := ref()) is not None and t.close("KILLED", timeout=10.0)
        atexit.register(self._atexit)

    @classmethod
    def start(cls, uri: str | None = None, experiment: str = "pvm-dist", *, run_name: str | None = None,
              run_id: str | None = None, tags: Mapping[str, Any] | None = None, parent_run_id: str | None = None,
              fallback_dir: str | os.PathLike[str] | None = None, flush_every: float = 5.0,
              max_queue: int = 1_000_000, replay_fallback: bool = True) -> Tracker:
        """Start (or, with ``run_id``, resume) a run in ``experiment`` at ``uri``
        (default: :func:`default_tracking_uri`).

        ``parent_run_id`` makes it a nested run. ``fallback_dir`` (default ``./tracking_fallback``) receives
        the fallback JSONL and staged artifacts. Never raises for an unreachable tracker.
        """
        return cls(uri, experiment, run_name=run_name, run_id=run_id, tags=tags, parent_run_id=parent_run_id,
                   fallback_dir=fallback_dir, flush_every=flush_every, max_queue=max_queue,
                   replay_fallback=replay_fallback)

    # ---- public API (caller thread; cheap, never raises) ------------------------------------------

    @property
    def run_id(self) -> str | None:
        """The MLflow run id; None while the run could not be created yet (tracker away since start)."""
        return self._run_id

    @property
    def healthy(self) -> bool:
        """False during an outage."""
        return self._ok

    @property
    def queued(self) -> int:
        """Metrics waiting for delivery."""
        return len(self._metrics)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close("FINISHED")
        else:
            self.close("KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED")

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Queue params (nested dicts flatten to dotted keys; values stringified and cut to 6000 chars)."""
        try:
            flat = flatten_params(params)
        except Exception as e:  # noqa: BLE001 - a tracker never breaks training
            log.warning("tracking: could not flatten params: %s", short_error(e))
            return
        self._queue_dict(self._params, flat)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Queue run tags (values stringified, cut to 8000 chars)."""
        try:
            clean = clean_tags(tags)
        except Exception as e:  # noqa: BLE001
            log.warning("tracking: bad tags: %s", short_error(e))
            return
        self._queue_dict(self._tags, clean)

    def log_metric(self, key: str, value: float, step: int) -> None:
        self.log_metrics({key: value}, step)

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        """Queue metrics for ``step`` (timestamped now). Non-finite values are skipped and counted.

        A sequence value (e.g. a per-layer error array) logs as ``key/0``, ``key/1``, ...
        """
        if self.closed:
            return
        ts = _now_ms()
        try:
            step = int(step)
            items = metric_items(metrics)
        except Exception as e:  # noqa: BLE001
            log.warning("tracking: bad metrics: %s", short_error(e))
            return
        values, skipped = finite_values(items)
        with self._lock:
            entries = []
            for key, v in values:
                self._seq += 1
                entries.append(_Entry(self.session, self._seq, key, v, ts, step))
            self.nonfinite_skipped += skipped
            self._metrics.extend(entries)
            n = len(self._metrics)
            if n >= METRICS_PER_BATCH and self._ok:
                self._cv.notify_all()
        if n > self.max_queue:
            self._shed()

    def log_artifact(self, local_path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        """Queue a file or folder for upload. It is staged (hard link, else copy) now, so the caller may
        delete or replace it right away (e.g. checkpoint rotation)."""
        if self.closed:
            return
        src = Path(local_path)
        try:
            folder = self._staging_folder()
            dst = folder / src.name
            if src.is_dir():
                shutil.copytree(src, dst, copy_function=_link_or_copy)
            else:
                _link_or_copy(src, dst)
        except Exception as e:  # noqa: BLE001
            log.warning("tracking: cannot stage artifact %s: %s", src, short_error(e))
            return
        self._queue_artifact(_Artifact(dst, artifact_path, folder))

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        """Log ``obj`` as JSON (or YAML for ``.yaml``/``.yml``) at ``artifact_file`` in the run."""
        if self.closed:
            return
        try:
            if artifact_file.endswith((".yaml", ".yml")):
                import yaml

                text = yaml.safe_dump(obj, sort_keys=False)
            else:
                text = json.dumps(obj, indent=2, default=str) + "\n"
            self._stage_bytes(text.encode("utf-8"), artifact_file)
        except Exception as e:  # noqa: BLE001
            log.warning("tracking: cannot log dict %s: %s", artifact_file, short_error(e))

    def log_image(self, image: Any, artifact_file: str) -> None:
        """Log an image (uint8 BGR ``HxWx3``, BGRA ``HxWx4`` or gray ``HxW``) as a PNG at ``artifact_file``.

        Float images are taken as 0..1 and scaled to 0..255.
        """
        if self.closed:
            return
        try:
            import cv2
            import numpy as np

            arr = np.asarray(image)
            if arr.dtype != np.uint8:
                scale = 255.0 if np.issubdtype(arr.dtype, np.floating) else 1.0
                arr = np.clip(np.nan_to_num(arr.astype(np.float64) * scale), 0, 255).round().astype(np.uint8)
            if arr.ndim == 3 and arr.shape[2] == 1:
                arr = arr[:, :, 0]
            if not artifact_file.lower().endswith(".png"):
                artifact_file += ".png"
            ok, buf = cv2.imencode(".png", np.ascontiguousarray(arr))
            if not ok:
                raise ValueError(f"cv2.imencode failed for shape {arr.shape}")
            self._stage_bytes(buf.tobytes(), artifact_file)
        except Exception as e:  # noqa: BLE001
            log.warning("tracking: cannot log image %s: %s", artifact_file, short_error(e))

    def flush(self, timeout: float = 30.0) -> bool:
        """Deliver everything queued now (retrying at once even during an outage's backoff) and wait for
        the attempt, at most ``timeout`` s. True when nothing is left queued."""
        with self._cv:
            if self.closed or not self._thread.is_alive():
                return not self._metrics
            self._flush_requested += 1
            ticket = self._flush_requested
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._flush_done >= ticket, timeout=timeout)
            return not (self._metrics or self._params or self._tags or self._artifacts)

    def close(self, status: str = "FINISHED", timeout: float = 30.0) -> None:
        """Deliver what is queued (one immediate attempt), upload artifacts, and end the run with ``status``
        (FINISHED, KILLED or FAILED). Whatever cannot be delivered stays in the fallback dir. Idempotent."""
        with self._cv:
            if self.closed:
                return
            self.closed = True
            status = str(status).upper()
            if status not in STATUSES:
                log.warning("tracking: unknown run status %r, using FAILED", status)
                status = "FAILED"
            self._close_status = status
            self._closing = True
            self._cv.notify_all()
        atexit.unregister(self._atexit)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("tracking: the tracker did not answer within %.0f s at close; leaving its thread "
                            "(daemon) to finish; undelivered data is in %s", timeout, self.fallback_dir)

    # ---- queueing helpers -------------------------------------------------------------------------

    def _queue_dict(self, target: dict[str, str], items: Mapping[str, str]) -> None:
        if self.closed or not items:
            return
        with self._cv:
            target.update(items)
            if self._ok:
                self._cv.notify_all()

    def _queue_artifact(self, art: _Artifact) -> None:
        with self._cv:
            self._artifacts.append(art)
            if self._ok:
                self._cv.notify_all()

    def _staging_folder(self) -> Path:
        folder = self.fallback_dir / PENDING_ARTIFACTS / f"{self.session}-{next(self._artifact_counter):05d}"
        folder.mkdir(parents=True, exist_ok=False)
        return folder

    def _stage_bytes(self, data: bytes, artifact_file: str) -> None:
        parts = [p for p in artifact_file.replace("\\", "/").split("/") if p not in ("", ".", "..")]
        if not parts:
            raise ValueError(f"empty artifact_file {artifact_file!r}")
        folder = self._staging_folder()
        dst = folder / parts[-1]
        dst.write_bytes(data)
        self._queue_artifact(_Artifact(dst, "/".join(parts[:-1]) or None, folder))

    def _shed(self) -> None:
        """Over ``max_queue``: make sure everything is on disk, then drop the oldest from memory."""
        self._spool()
        with self._lock:
            excess = len(self._metrics) - self.max_queue
            if excess <= 0:
                return
            excess = max(excess, self.max_queue // 10)  # shed in chunks: this path stays rare
            for _ in range(min(excess, len(self._metrics))):
                self._metrics.popleft()
            self.dropped_metrics += excess
        log.warning("tracking: %d queued metrics shed from memory during the outage (kept in %s)",
                    excess, self.fallback_file)

    # ---- fallback file ----------------------------------------------------------------------------

    def _spool(self) -> None:
        """Append to the fallback file what is queued and not yet written there."""
        with self._spool_lock:
            with self._lock:
                new: list[_Entry] = []
                for e in reversed(self._metrics):
                    if e.session != self.session or e.seq <= self._spooled_seq:
                        break
                    new.append(e)
                new.reverse()
                upto = self._seq
                params = {k: v for k, v in self._params.items() if self._spooled_params.get(k) != v}
                tags = {k: v for k, v in self._tags.items() if self._spooled_tags.get(k) != v}
                run_id = self._run_id
            recs: list[dict[str, Any]] = [
                {"kind": "metric", "session": e.session, "seq": e.seq, "run_id": run_id, "key": e.key,
                 "value": e.value, "step": e.step, "timestamp": e.timestamp} for e in new]
            recs += [{"kind": "param", "session": self.session, "run_id": run_id, "key": k, "value": v}
                     for k, v in params.items()]
            recs += [{"kind": "tag", "session": self.session, "run_id": run_id, "key": k, "value": v}
                     for k, v in tags.items()]
            self._journal.append(recs)
            with self._lock:
                self._spooled_seq = max(self._spooled_seq, upto)
                self._spooled_params.update(params)
                self._spooled_tags.update(tags)

    def _replay(self, run_id: str) -> None:
        """Re-queue what an earlier process left undelivered for this run in the same fallback file."""
        records = read_fallback(self.fallback_file)
        metrics = pending_metrics(records, run_id)
        for rec in metrics:
            self._metrics.append(_Entry(rec["session"], int(rec["seq"]), rec["key"], float(rec["value"]),
                                        int(rec["timestamp"]), int(rec["step"])))
        arts = [r for r in records if r.get("kind") == "artifact" and r.get("run_id") == run_id
                and r.get("retry", True) and Path(r.get("local_path", "")).exists()]
        arts = list({r["local_path"]: r for r in arts}.values())
        for rec in arts:
            staged = Path(rec["local_path"])
            self._artifacts.append(_Artifact(staged, rec.get("artifact_path"), staged.parent))
        if metrics or arts:
            log.info("tracking: re-queued %d undelivered metrics and %d artifacts of run %s from %s",
                     len(metrics), len(arts), run_id, self.fallback_file)

    # ---- worker -----------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cv:
                force = False
                while True:
                    if self._closing:
                        break
                    if self._flush_requested > self._flush_done:
                        force = True
                        break
                    if self._ok and (len(self._metrics) >= METRICS_PER_BATCH or self._params or self._tags
                                     or self._artifacts):
                        break
                    wait = self._next_tick - time.monotonic()
                    if wait <= 0:
                        break
                    self._cv.wait(wait)
                closing = self._closing
                ticket = self._flush_requested
            try:
                with _store_lock(self.uri):
                    self._cycle(force=force or closing)
                    if closing:
                        self._finish()
            except Exception:  # noqa: BLE001 - the worker must never die
                log.exception("tracking: internal error in the tracking thread")
            with self._cv:
                self._flush_done = ticket
                self._next_tick = time.monotonic() + self.flush_every
                self._cv.notify_all()
            if closing:
                return

    def _cycle(self, force: bool) -> None:
        """One delivery attempt of everything queued (or, during an outage's backoff, only spooling)."""
        if not self._ok:
            self._spool()
            if not force and time.monotonic() < self._retry_at:
                return
        try:
            self._ensure_run()
            self._send_dict(self._params, "params")
            self._send_dict(self._tags, "tags")
            self._send_metrics()
            self._send_artifacts()
        except Exception as e:  # noqa: BLE001 - anything here means: the tracker is away
            self._failed(e)
        else:
            self._recovered()

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            first = self._ok
            self._ok = False
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)
            if first:
                self.outages += 1
        if first:
            self._journal.append([{"kind": "outage", "session": self.session, "run_id": self._run_id, "uri": self.uri,
                           "error": short_error(exc), "time": time.time()}])
            self._warn(f"MLflow tracker {self.uri} unreachable (outage {self.outages}: {short_error(exc)}); "
                       f"training continues, metrics are queued in memory and written to {self.fallback_file}; "
                       f"retrying with backoff")
        self._spool()

    def _recovered(self) -> None:
        if not self._ok:
            with self._lock:
                self._ok = True
                self._backoff = MIN_BACKOFF_S
            log.info("tracking: MLflow tracker %s reachable again; queued data delivered", self.uri)

    def _warn(self, message: str) -> None:
        try:
            warnings.warn(message, TrackingWarning, stacklevel=2)
        except Exception:  # noqa: BLE001 - e.g. -W error: still never raise
            log.warning("%s", message)

    def _get_client(self) -> Any:
        if self._client is None:
            from mlflow import MlflowClient

            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    def _ensure_run(self) -> None:
        client = self._get_client()
        if self._run_ready:
            return
        if self._resume_id:
            try:
                client.update_run(self._resume_id, status="RUNNING")
            except Exception as e:
                if not _is_permanent(e):
                    raise
                log.warning("tracking: cannot resume run %s at %s (%s); starting a new run",
                            self._resume_id, self.uri, short_error(e))
                self._resume_id = None
                self._create_tags["pvm.resumed_from"] = self._run_id or ""
        if not self._resume_id:
            experiment_id = self._experiment_id(client)
            tags = dict(self._create_tags)
            run = client.create_run(experiment_id, start_time=self._start_ms, tags=tags, run_name=self.run_name)
            with self._lock:
                self._run_id = run.info.run_id
        self._run_ready = True
        if (self._journal.exists() or not self._ok) and not self._run_announced:
            self._journal.append([{"kind": "run", "session": self.session, "run_id": self._run_id}])
            self._run_announced = True

    def _experiment_id(self, client: Any) -> str:
        exp = client.get_experiment_by_name(self.experiment)
        if exp is not None:
            return exp.experiment_id
        try:
            return client.create_experiment(self.experiment, artifact_location=self._artifact_location())
        except Exception as e:
            if getattr(e, "error_code", None) != "RESOURCE_ALREADY_EXISTS":
                raise
            exp = client.get_experiment_by_name(self.experiment)  # created concurrently by another process
            if exp is None:
                raise
            return exp.experiment_id

    def _artifact_location(self) -> str | None:
        """For a SQLite store: ``<db dir>/mlartifacts/<experiment>`` (else the tracker's default)."""
        if not self.uri.startswith("sqlite:///"):
            return None
        db = Path(self.uri[len("sqlite:///"):].split("?")[0])
        safe = re.sub(r"[^\w.\-]", "_", self.experiment) or "default"
        return str((db.parent / "mlartifacts" / safe).resolve())

    def _send_dict(self, pending: dict[str, str], what: str) -> None:
        from mlflow.entities import Param, RunTag

        make = Param if what == "params" else RunTag
        with self._lock:
            items = list(pending.items())
        rejected: list[str] = []
        for i in range(0, len(items), PARAMS_TAGS_PER_BATCH):
            chunk = items[i:i + PARAMS_TAGS_PER_BATCH]
            self._send_isolating(chunk, lambda c: self._get_client().log_batch(
                self._run_id, **{what: [make(k, v) for k, v in c]}, synchronous=True),
                lambda item, e: rejected.append(f"{item[0]} ({short_error(e, 160)})"))
            with self._lock:
                for k, v in chunk:
                    if pending.get(k) is v:
                        del pending[k]
        if rejected:
            log.warning("tracking: the tracker rejected %d %s, dropped: %s", len(rejected), what,
                        "; ".join(rejected[:10]))

    def _send_metrics(self) -> None:
        from mlflow.entities import Metric

        with self._lock:
            budget = len(self._metrics)  # what is queued now; later additions wait for the next cycle
        rejected: list[str] = []

        def reject(entry: _Entry, e: BaseException) -> None:
            with self._lock:
                self.dropped_metrics += 1
            rejected.append(f"{entry.key} ({short_error(e, 160)})")

        while budget > 0:
            with self._lock:
                batch = list(itertools.islice(self._metrics, 0, min(METRICS_PER_BATCH, budget)))
            if not batch:
                break
            self._send_isolating(batch, lambda b: self._get_client().log_batch(
                self._run_id, metrics=[Metric(e.key, e.value, e.timestamp, e.step) for e in b], synchronous=True),
                reject)
            budget -= len(batch)
            with self._spool_lock:
                delivered: dict[str, int] = {}
                for e in batch:
                    if e.session != self.session or e.seq <= self._spooled_seq:
                        delivered[e.session] = max(delivered.get(e.session, -1), e.seq)
                with self._lock:
                    ids = {id(e) for e in batch}
                    while self._metrics and id(self._metrics[0]) in ids:
                        self._metrics.popleft()
            if delivered:
                self._journal.append([{"kind": "delivered", "session": s, "upto": upto, "run_id": self._run_id,
                               "time": time.time()} for s, upto in delivered.items()])
        if rejected:
            log.warning("tracking: the tracker rejected %d metric values, dropped: %s", len(rejected),
                        "; ".join(rejected[:10]))

    @staticmethod
    def _send_isolating(items: list[Any], send: Any, reject: Any) -> None:
        """Send ``items``; on a permanent rejection split in halves until the bad ones are isolated and
        dropped (via ``reject``). Transient errors propagate (outage)."""
        try:
            send(items)
        except Exception as e:
            if not _is_permanent(e):
                raise
            if len(items) == 1:
                reject(items[0], e)
                return
            mid = len(items) // 2
            Tracker._send_isolating(items[:mid], send, reject)
            Tracker._send_isolating(items[mid:], send, reject)

    def _send_artifacts(self) -> None:
        with self._lock:
            pending = list(self._artifacts)
        for art in pending:
            if not art.staged.exists():
                log.warning("tracking: staged artifact %s vanished; skipped", art.staged)
            else:
                try:
                    self._get_client().log_artifact(self._run_id, str(art.staged), art.artifact_path)
                except Exception as e:
                    if not _is_permanent(e):
                        raise
                    log.warning("tracking: the tracker rejected artifact %s: %s (kept there)", art.staged, short_error(e))
                    self._note_artifact(art, f"rejected: {short_error(e)}", retry=False)
                else:
                    shutil.rmtree(art.cleanup, ignore_errors=True)  # our staged copy, now uploaded
            with self._lock:
                self._artifacts.remove(art)

    def _note_artifact(self, art: _Artifact, note: str, retry: bool = True) -> None:
        self._journal.append([{"kind": "artifact", "session": self.session, "run_id": self._run_id,
                       "local_path": str(art.staged), "artifact_path": art.artifact_path, "note": note,
                       "retry": retry}])

    def _finish(self) -> None:
        """At close, after the final delivery attempt: end the run, or leave everything in the fallback dir."""
        if self._ok and self._run_ready:
            try:
                if self.nonfinite_skipped or self.dropped_metrics:
                    self._get_client().log_batch(self._run_id, tags=self._count_tags(), synchronous=True)
                self._get_client().set_terminated(self._run_id, status=self._close_status)
            except Exception as e:  # noqa: BLE001
                self._failed(e)
        if self._ok:
            self._remove_empty_staging()
            return
        self._spool()
        with self._lock:
            arts = list(self._artifacts)
            n_metrics = len(self._metrics)
        for art in arts:
            self._note_artifact(art, "not uploaded: tracker unreachable at close")
        self._journal.append([{"kind": "close", "session": self.session, "run_id": self._run_id,
                       "status": self._close_status, "delivered": False, "queued_metrics": n_metrics,
                       "artifacts": len(arts), "time": time.time()}])
        log.warning("tracking: MLflow tracker %s unreachable at close: run %s not ended (%s); %d metrics, "
                    "%d params/tags and %d artifacts left in %s (see pvm_dist.tracking.tracker.read_fallback)",
                    self.uri, self._run_id, self._close_status, n_metrics, len(self._params) + len(self._tags),
                    len(arts), self.fallback_dir)

    def _count_tags(self) -> list[Any]:
        from mlflow.entities import RunTag

        return [RunTag("pvm.metrics_nonfinite_skipped", str(self.nonfinite_skipped)),
                RunTag("pvm.metrics_dropped", str(self.dropped_metrics))]

    def _remove_empty_staging(self) -> None:
        try:
            (self.fallback_dir / PENDING_ARTIFACTS).rmdir()  # only when empty
            if not self._fallback_dir_existed:
                self.fallback_dir.rmdir()  # ours, and empty
        except OSError:
            pass


def _link_or_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
