"""The background thread that moves a tracker's outbox into MLflow, so no caller ever waits for the tracker.

It wakes every ``flush_every`` seconds, sooner when a full metric batch, a param, a tag or an artifact
waits, or when asked to flush or close. Each cycle opens the run if needed, then sends params, tags,
metrics (in order, in batches) and artifacts. A failure means an outage: one :class:`TrackingWarning`,
everything queued spooled to the fallback file, retries with backoff (``flush`` and ``close`` retry at
once). Trackers of one store deliver one at a time (the store lock).
"""

from __future__ import annotations

import logging
import threading
import time
import warnings

from pvm_dist.tracking.backoff import Backoff
from pvm_dist.tracking.mlflow_sink import METRICS_PER_BATCH, PARAMS_TAGS_PER_BATCH, MlflowSink
from pvm_dist.tracking.normalize import short_error
from pvm_dist.tracking.outbox import Items, Outbox

log = logging.getLogger(__name__)


class TrackingWarning(UserWarning):
    """Emitted once per tracker outage (and never raised: training goes on)."""


class Delivery:
    """Delivers ``outbox`` to ``sink``: on the caller's thread once at :meth:`start`, then on its own."""

    def __init__(self, outbox: Outbox, sink: MlflowSink, flush_every: float) -> None:
        self.outbox = outbox
        self.sink = sink
        self.flush_every = flush_every
        self.backoff = Backoff()
        self.closing = False
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._next_tick = time.monotonic() + flush_every
        self._flush_requested = 0
        self._flush_done = 0
        self._close_status = "FINISHED"

    def start(self, name: str) -> None:
        """Connect (and open the run) now, so the run id is known when the tracker is up; then go on in the
        daemon thread ``name``."""
        with self.sink.lock:
            self._cycle(force=True)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def nudge(self) -> None:
        """Something was queued: deliver it now rather than at the next tick, unless in an outage."""
        if self.backoff.ok:
            with self._cv:
                self._cv.notify_all()

    def flush(self, timeout: float) -> bool:
        """Request an immediate delivery attempt and wait for it (at most ``timeout`` s); True when
        nothing is left queued."""
        with self._cv:
            if self.closing or self._thread is None or not self._thread.is_alive():
                return not self.outbox.queued
            self._flush_requested += 1
            ticket = self._flush_requested
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._flush_done >= ticket, timeout=timeout)
            return not any(self.outbox.backlog())

    def close(self, status: str) -> bool:
        """Ask for a last delivery and the end of the run with ``status``; False when already closing."""
        with self._cv:
            if self.closing:
                return False
            self.closing = True
            self._close_status = status
            self._cv.notify_all()
            return True

    def join(self, timeout: float) -> None:
        """Wait for the last delivery after :meth:`close` (at most ``timeout`` s; the thread is a daemon)."""
        if self._thread is None or threading.current_thread() is self._thread:
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("tracking: the tracker did not answer within %.0f s at close; leaving its thread "
                        "(daemon) to finish; undelivered data is in %s", timeout, self.outbox.fallback_dir)

    # ---- the thread -------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cv:
                force = False
                while True:
                    if self.closing:
                        break
                    if self._flush_requested > self._flush_done:
                        force = True
                        break
                    if self.backoff.ok and self._worth_sending():
                        break
                    wait = self._next_tick - time.monotonic()
                    if wait <= 0:
                        break
                    self._cv.wait(wait)
                closing = self.closing
                ticket = self._flush_requested
            try:
                with self.sink.lock:
                    self._cycle(force=force or closing)
                    if closing:
                        self._finish()
            except Exception:  # noqa: BLE001 - the thread must never die
                log.exception("tracking: internal error in the tracking thread")
            with self._cv:
                self._flush_done = ticket
                self._next_tick = time.monotonic() + self.flush_every
                self._cv.notify_all()
            if closing:
                return

    def _worth_sending(self) -> bool:
        """A full metric batch, or any param, tag or artifact, is waiting."""
        backlog = self.outbox.backlog()
        return backlog.metrics >= METRICS_PER_BATCH or bool(backlog.params_tags or backlog.artifacts)

    def _cycle(self, force: bool) -> None:
        """One delivery attempt of everything queued (or, during an outage's backoff, only spooling)."""
        if not self.backoff.ok:
            self.outbox.spool()
            if not force and not self.backoff.due():
                return
        try:
            if not self.sink.ready:
                self.sink.open_run()
                self.outbox.attach_run(self.sink.run_id, outage=not self.backoff.ok)
            self._send_items("params")
            self._send_items("tags")
            self._send_metrics()
            self._send_artifacts()
        except Exception as e:  # noqa: BLE001 - anything here means: the tracker is away
            self._failed(e)
        else:
            if self.backoff.recovered():
                log.info("tracking: MLflow tracker %s reachable again; queued data delivered", self.sink.uri)

    def _failed(self, exc: BaseException) -> None:
        if self.backoff.failed():
            self.outbox.record("outage", **self.outbox.identity, error=short_error(exc), time=time.time())
            _warn(f"MLflow tracker {self.sink.uri} unreachable (outage {self.backoff.outages}: {short_error(exc)}); "
                  f"training continues, metrics are queued in memory and written to {self.outbox.fallback_file}; "
                  f"retrying with backoff")
        self.outbox.spool()

    def _send_items(self, what: Items) -> None:
        items = self.outbox.pending_items(what)
        rejected: list[str] = []
        for i in range(0, len(items), PARAMS_TAGS_PER_BATCH):
            chunk = items[i:i + PARAMS_TAGS_PER_BATCH]
            rejected += self.sink.log_items(what, chunk)
            self.outbox.ack_items(what, chunk)
        if rejected:
            log.warning("tracking: the tracker rejected %d %s, dropped: %s", len(rejected), what,
                        "; ".join(rejected[:10]))

    def _send_metrics(self) -> None:
        budget = self.outbox.queued  # what is queued now; later additions wait for the next cycle
        rejected: list[str] = []
        while budget > 0:
            batch = self.outbox.peek_metrics(min(METRICS_PER_BATCH, budget))
            if not batch:
                break
            refused = self.sink.log_metrics(batch)
            rejected += refused
            budget -= len(batch)
            self.outbox.ack_metrics(batch, rejected=len(refused))
        if rejected:
            log.warning("tracking: the tracker rejected %d metric values, dropped: %s", len(rejected),
                        "; ".join(rejected[:10]))

    def _send_artifacts(self) -> None:
        for art in self.outbox.pending_artifacts():
            if not art.staged.exists():
                log.warning("tracking: staged artifact %s vanished; skipped", art.staged)
                self.outbox.done_artifact(art, uploaded=False)
                continue
            reason = self.sink.log_artifact(art.staged, art.artifact_path)
            if reason is not None:
                log.warning("tracking: the tracker rejected artifact %s: %s (kept there)", art.staged, reason)
                self.outbox.reject_artifact(art, reason)
            self.outbox.done_artifact(art, uploaded=reason is None)

    def _finish(self) -> None:
        """At close, after the final delivery attempt: end the run, or leave everything in the fallback dir."""
        if self.backoff.ok and self.sink.ready:
            counts: dict[str, str] = {}
            if self.outbox.nonfinite_skipped or self.outbox.dropped:
                counts = {"pvm.metrics_nonfinite_skipped": str(self.outbox.nonfinite_skipped),
                          "pvm.metrics_dropped": str(self.outbox.dropped)}
            try:
                self.sink.end_run(self._close_status, counts)
            except Exception as e:  # noqa: BLE001
                self._failed(e)
        if self.backoff.ok:
            if self.outbox.fallback_file.exists():  # a spool was written: say the run is complete now
                self.outbox.record("close", status=self._close_status, delivered=True, time=time.time())
            self.outbox.remove_empty_staging()
            return
        self.outbox.spool()  # with a record of each artifact left staged
        backlog = self.outbox.backlog()
        arts = self.outbox.pending_artifacts()
        self.outbox.record("close", status=self._close_status, delivered=False, queued_metrics=backlog.metrics,
                           artifacts=len(arts), time=time.time())
        log.warning("tracking: MLflow tracker %s unreachable at close: run %s not ended (%s); %d metrics, "
                    "%d params/tags and %d artifacts left in %s (see pvm_dist.tracking.tracker.read_fallback)",
                    self.sink.uri, self.sink.run_id, self._close_status, backlog.metrics, backlog.params_tags,
                    len(arts), self.outbox.fallback_dir)


def _warn(message: str) -> None:
    try:
        warnings.warn(message, TrackingWarning, stacklevel=2)
    except Exception:  # noqa: BLE001 - e.g. -W error: still never raise
        log.warning("%s", message)
