"""MLflow tracking for one training run, robust to an unreachable tracker.

Training must never stop or slow down because the tracker is away. A :class:`Tracker` talks to MLflow
through its own ``mlflow.MlflowClient`` (no global fluent state, so several trackers can live in one
process, e.g. a parent run and nested runs) and does all tracker I/O on one background thread:

- ``log_metrics`` / ``log_params`` / ``set_tags`` / ``log_artifact`` only queue work and return at once.
- The delivery thread writes queued metrics with ``log_batch`` (at most 1000 per call) every
  ``flush_every`` seconds, or sooner when 1000 are waiting; params and tags go in batches of 100.
- **Outage** (tracker unreachable at start or gone mid-run): one :class:`TrackingWarning` per outage;
  training goes on. Metrics stay queued in memory in order (bounded by ``max_queue``; the oldest are
  shed from memory first, they are already on disk) and are also appended to the fallback file
  ``<fallback_dir>/tracking_fallback.jsonl``. Delivery is retried with exponential backoff (1 s doubling
  to 60 s; ``flush()`` and ``close()`` retry at once). When the tracker answers again the queue is
  delivered in order, so the run ends up with every metric, and a ``delivered`` record is appended to
  the fallback file. If the run could not be created at start, it is created at the first successful
  retry (``run_id`` is ``None`` until then). Artifacts are staged (hard link, else copy) under
  ``<fallback_dir>/pending_artifacts`` when logged, uploaded by the delivery thread, and retried at ``close``;
  what still fails stays there with a note in the fallback file.
- Permanent rejections (an invalid key, a param whose value changed on resume) are not outages: the
  offending items are isolated by splitting the batch, dropped, and reported once through ``logging``.
- Resuming (``run_id=...``) logs into the same run; undelivered metrics and artifacts of that run left
  in the same fallback file by an earlier process are re-queued.

Timeouts: a dead server must not stall anyone, so the first Tracker sets MLflow's HTTP retries to 0 and
its timeout to 5 s where not already set (process-wide; see
:func:`~pvm_dist.tracking.mlflow_sink.configure_http_timeouts`). A refused connection then fails in
milliseconds and a black-holed host in about 5 s (that only delays the delivery thread, or
``start``/``close`` once each).

The parts, one idea each: :mod:`~pvm_dist.tracking.outbox` (queued records, their spool to the fallback
file and their replay), :mod:`~pvm_dist.tracking.delivery` (the background thread, with
:mod:`~pvm_dist.tracking.backoff`), :mod:`~pvm_dist.tracking.mlflow_sink` (every MLflow call),
:mod:`~pvm_dist.tracking.fallback` (the fallback file's format), :mod:`~pvm_dist.tracking.normalize`
(values made fit for MLflow) and :mod:`~pvm_dist.tracking.defaults` (default URI, standard tags).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import uuid
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pvm_dist.tracking.defaults import default_tracking_uri, run_tags
from pvm_dist.tracking.delivery import Delivery, TrackingWarning
from pvm_dist.tracking.fallback import FALLBACK_FILE, pending_metrics, read_fallback
from pvm_dist.tracking.mlflow_sink import (METRICS_PER_BATCH, STATUSES, MlflowSink, configure_http_timeouts, now_ms,
                                          terminal_status)
from pvm_dist.tracking.normalize import clean_tags, finite_values, flatten_params, metric_items, short_error
from pvm_dist.tracking.outbox import Items, Outbox
from pvm_dist.tracking.owner import hold

__all__ = ["FALLBACK_FILE", "STATUSES", "Tracker", "TrackingWarning", "configure_http_timeouts",
           "default_tracking_uri", "flatten_params", "pending_metrics", "read_fallback", "run_tags"]

log = logging.getLogger(__name__)


class Tracker:
    """One MLflow run. Never raises to the caller after construction; see the module docstring."""

    def __init__(self, uri: str | None = None, experiment: str = "pvm-dist", *, run_name: str | None = None,
                 run_id: str | None = None, tags: Mapping[str, Any] | None = None,
                 parent_run_id: str | None = None, fallback_dir: str | os.PathLike[str] | None = None,
                 flush_every: float = 5.0, max_queue: int = 1_000_000, replay_fallback: bool = True,
                 run_key: str | None = None, inputs: Sequence[Mapping[str, str]] = ()) -> None:
        configure_http_timeouts()
        self.uri = uri or default_tracking_uri()
        self.experiment = experiment
        self.run_name = run_name
        self.parent_run_id = parent_run_id
        self.fallback_dir = Path(fallback_dir if fallback_dir is not None else Path.cwd() / "tracking_fallback")
        self.fallback_file = self.fallback_dir / FALLBACK_FILE
        self.flush_every = max(float(flush_every), 0.01)
        self.max_queue = max(int(max_queue), METRICS_PER_BATCH)
        self.session = uuid.uuid4().hex[:12]

        create_tags = clean_tags(tags or {})
        if parent_run_id:
            create_tags["mlflow.parentRunId"] = parent_run_id
        self._held = hold(self.fallback_dir.parent)  # a live tracker's spool: `pvm-dist sync` leaves it alone
        # Where the run lives and what it is created with: a spool delivered by `pvm-dist sync` creates a run
        # the tracker never reached with the same tags and datasets.
        identity = {"uri": self.uri, "experiment": experiment, "run_name": run_name, "run_key": run_key,
                    "parent_run_id": parent_run_id, "tags": dict(create_tags), "inputs": [dict(d) for d in inputs]}
        self._outbox = Outbox(self.fallback_dir, self.session, max_queue=self.max_queue, run_id=run_id,
                              identity=identity)
        self._sink = MlflowSink(self.uri, experiment, run_name=run_name, run_id=run_id, tags=create_tags,
                                run_key=run_key, inputs=inputs)
        if run_id and replay_fallback:
            self._outbox.replay(run_id)
        if tags and run_id:  # resuming: the run exists already, tags are logged like later ones
            self._outbox.add_items("tags", create_tags)
        self._delivery = Delivery(self._outbox, self._sink, self.flush_every)
        self._delivery.start(f"pvm-tracking-{self.session}")
        ref = weakref.ref(self)
        self._atexit = lambda: (t := ref()) is not None and t.close("KILLED", timeout=10.0)
        atexit.register(self._atexit)

    @classmethod
    def start(cls, uri: str | None = None, experiment: str = "pvm-dist", *, run_name: str | None = None,
              run_id: str | None = None, tags: Mapping[str, Any] | None = None, parent_run_id: str | None = None,
              fallback_dir: str | os.PathLike[str] | None = None, flush_every: float = 5.0,
              max_queue: int = 1_000_000, replay_fallback: bool = True, run_key: str | None = None,
              inputs: Sequence[Mapping[str, str]] = ()) -> Tracker:
        """Start (or, with ``run_id``, resume) a run in ``experiment`` at ``uri``
        (default: :func:`default_tracking_uri`).

        ``run_key`` (a string unique to this run, e.g. ``<sweep id>/<trial id>``) is tagged on the run; a
        start without ``run_id`` resumes the run that has it rather than creating a second one.

        ``parent_run_id`` makes it a nested run. ``fallback_dir`` (default ``./tracking_fallback``) receives
        the fallback JSONL and staged artifacts. ``inputs``: the run's datasets (see :class:`MlflowSink`).
        Never raises for an unreachable tracker.
        """
        return cls(uri, experiment, run_name=run_name, run_id=run_id, tags=tags, parent_run_id=parent_run_id,
                   fallback_dir=fallback_dir, flush_every=flush_every, max_queue=max_queue,
                   replay_fallback=replay_fallback, run_key=run_key, inputs=inputs)

    # ---- state ------------------------------------------------------------------------------------

    @property
    def run_id(self) -> str | None:
        """The MLflow run id; None while the run could not be created yet (tracker away since start)."""
        return self._sink.run_id

    @property
    def experiment_id(self) -> str | None:
        """The id of the run's experiment; None until the run is open."""
        return self._sink.experiment_id

    @property
    def healthy(self) -> bool:
        """False during an outage."""
        return self._delivery.backoff.ok

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called; logging calls are then ignored."""
        return self._delivery.closing

    @property
    def queued(self) -> int:
        """Metrics waiting for delivery."""
        return self._outbox.queued

    @property
    def outages(self) -> int:
        """How many outages were seen."""
        return self._delivery.backoff.outages

    @property
    def nonfinite_skipped(self) -> int:
        """Metric values skipped because NaN/inf."""
        return self._outbox.nonfinite_skipped

    @property
    def dropped_metrics(self) -> int:
        """Metrics rejected by the tracker as invalid, or shed from memory during a long outage."""
        return self._outbox.dropped

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close("FINISHED")
        else:
            self.close("KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED")

    # ---- logging (caller thread; cheap, never raises) ---------------------------------------------

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Queue params (nested dicts flatten to dotted keys; values stringified and cut to 6000 chars)."""
        try:
            flat = flatten_params(params)
        except Exception as e:  # noqa: BLE001 - a tracker never breaks training
            log.warning("tracking: could not flatten params: %s", short_error(e))
            return
        self._queue_items("params", flat)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Queue run tags (values stringified, cut to 8000 chars)."""
        try:
            clean = clean_tags(tags)
        except Exception as e:  # noqa: BLE001
            log.warning("tracking: bad tags: %s", short_error(e))
            return
        self._queue_items("tags", clean)

    def log_metrics(self, metrics: Mapping[str, Any], step: int, timestamp: int | None = None) -> None:
        """Queue metrics for ``step``, timestamped ``timestamp`` (ms since the epoch; default now). Non-finite
        values are skipped and counted.

        A sequence value (e.g. a per-layer error array) logs as ``key/0``, ``key/1``, ... A step logged again
        with the same values and timestamp (a resumed run redoing steps since its checkpoint) is stored once
        by MLflow's SQL stores, so resumes pass the timestamp the step was first logged with.
        """
        if self.closed:
            return
        ts = now_ms() if timestamp is None else int(timestamp)
        try:
            step = int(step)
            items = metric_items(metrics)
        except Exception as e:  # noqa: BLE001
            log.warning("tracking: bad metrics: %s", short_error(e))
            return
        values, skipped = finite_values(items)
        n = self._outbox.add_metrics(values, ts, step, nonfinite=skipped)
        if n >= METRICS_PER_BATCH:
            self._delivery.nudge()
        if n > self.max_queue:
            self._outbox.shed()

    def log_artifact(self, local_path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        """Queue a file or folder for upload. It is staged (hard link, else copy) now, so the caller may
        delete or replace it right away (e.g. checkpoint rotation)."""
        if self.closed:
            return
        src = Path(local_path)
        try:
            self._outbox.stage_file(src, artifact_path)
        except Exception as e:  # noqa: BLE001
            log.warning("tracking: cannot stage artifact %s: %s", src, short_error(e))
            return
        self._delivery.nudge()

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
            self._outbox.stage_bytes(text.encode("utf-8"), artifact_file)
        except Exception as e:  # noqa: BLE001
            log.warning("tracking: cannot log dict %s: %s", artifact_file, short_error(e))
            return
        self._delivery.nudge()

    def flush(self, timeout: float = 30.0) -> bool:
        """Deliver everything queued now (retrying at once even during an outage's backoff) and wait for
        the attempt, at most ``timeout`` s. True when nothing is left queued."""
        return self._delivery.flush(timeout)

    def close(self, status: str = "FINISHED", timeout: float = 30.0) -> None:
        """Deliver what is queued (one immediate attempt), upload artifacts, and end the run with ``status``
        (FINISHED, KILLED or FAILED). Whatever cannot be delivered stays in the fallback dir. Idempotent."""
        if self.closed or not self._delivery.close(terminal_status(status)):
            return
        atexit.unregister(self._atexit)
        self._delivery.join(timeout)
        self._held.release()

    def requeue(self, sessions: set[str]) -> int:
        """Re-queue what the earlier tracker ``sessions`` left undelivered in this fallback dir (metrics,
        params, tags, artifacts), for a run being finished by ``pvm-dist sync``; the metrics re-queued."""
        n = self._outbox.replay(self.run_id, sessions)
        self._delivery.nudge()
        return n

    def _queue_items(self, what: Items, items: Mapping[str, str]) -> None:
        if self.closed or not items:
            return
        self._outbox.add_items(what, items)
        self._delivery.nudge()
