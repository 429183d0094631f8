"""Everything that talks to MLflow: one run at one tracking store, through its own ``MlflowClient`` (no
global fluent state, so several runs can live in one process, e.g. a parent run and nested runs).

Calls raise on a transient failure (the tracker is away: the caller keeps the data and retries) and
report permanent rejections (an invalid key, a param whose value changed on resume) as return values,
after isolating the offending items, so that one bad value never blocks the rest.

Timeouts: a dead server must not stall anyone, so :func:`configure_http_timeouts` sets (only where not
already set) ``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0`` and ``MLFLOW_HTTP_REQUEST_TIMEOUT=5`` in ``os.environ``.
MLflow reads them per request, so they apply process-wide; set them yourself to override. With these, a
refused connection fails in milliseconds and a black-holed host in about 5 s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from pvm_dist.tracking.normalize import short_error
from pvm_dist.tracking.outbox import MetricEntry

log = logging.getLogger(__name__)

STATUSES = ("FINISHED", "KILLED", "FAILED")
RUN_KEY_TAG = "pvm.run_key"  # names a run before its id is known: found again by this tag, never created twice
HTTP_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}

# MLflow's batch limits (mlflow.utils.validation).
PARAMS_TAGS_PER_BATCH = 100
METRICS_PER_BATCH = 1000

# MLflow error codes that mean "this request is wrong", not "the tracker is away".
_PERMANENT_CODES = frozenset({"INVALID_PARAMETER_VALUE", "BAD_REQUEST", "MALFORMED_REQUEST", "INVALID_STATE",
                              "RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST"})
_STORE_LOCKS: dict[str, threading.RLock] = {}
_STORE_LOCKS_GUARD = threading.Lock()

T = TypeVar("T")


def configure_http_timeouts() -> None:
    """Fail fast against a dead HTTP tracker (no MLflow-internal retries, 5 s socket timeout).

    Sets the variables only where unset; MLflow reads them at each request (process-wide).
    """
    for name, value in HTTP_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)


def store_lock(uri: str) -> threading.RLock:
    """One lock per tracking store: the trackers of one process (a sweep driver holds one per trial)
    talk to a store one at a time, so a SQLite file sees a single writer."""
    with _STORE_LOCKS_GUARD:
        return _STORE_LOCKS.setdefault(uri, threading.RLock())


@contextlib.contextmanager
def store_file_lock(uri: str) -> Iterator[None]:
    """For a SQLite store: an exclusive lock on ``<db>.lock`` (beside it) across processes.

    The first connection to a fresh SQLite file creates and migrates its schema; two processes doing it at
    once fail (``duplicate column name``) and lose their runs. Opening a run (the first call of every
    tracker) holds this lock, so the schema is made once and runs are found or created one at a time.
    Where the lock file cannot be made (no folder, no ``fcntl``), it goes on unlocked.
    """
    if not uri.startswith("sqlite:///"):
        yield
        return
    try:
        import fcntl

        handle = open(uri[len("sqlite:///"):].split("?")[0] + ".lock", "a")  # noqa: SIM115 - closed below
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        handle.close()  # releases the lock


def terminal_status(status: str) -> str:
    """``status`` as one of MLflow's end states; an unknown one is reported and taken as FAILED."""
    status = str(status).upper()
    if status not in STATUSES:
        log.warning("tracking: unknown run status %r, using FAILED", status)
        return "FAILED"
    return status


def now_ms() -> int:
    """MLflow's clock: milliseconds since the epoch."""
    return int(time.time() * 1000)


def is_permanent(exc: BaseException) -> bool:
    """True when MLflow rejected the request itself (retrying cannot help)."""
    return getattr(exc, "error_code", None) in _PERMANENT_CODES


def send_isolating(items: Sequence[T], send: Callable[[Sequence[T]], None],
                   reject: Callable[[T, BaseException], None]) -> None:
    """Send ``items``; on a permanent rejection split in halves until the bad ones are isolated and
    dropped (via ``reject``). Transient errors propagate (outage)."""
    try:
        send(items)
    except Exception as e:
        if not is_permanent(e):
            raise
        if len(items) == 1:
            reject(items[0], e)
            return
        mid = len(items) // 2
        send_isolating(items[:mid], send, reject)
        send_isolating(items[mid:], send, reject)


class MlflowSink:
    """One MLflow run (created, resumed or nested) at one store; see the module docstring.

    ``run_id`` is the run to resume (or None) until :meth:`open_run` succeeds, then the run logged into.
    ``tags`` are the creation tags (``mlflow.parentRunId`` among them for a nested run). ``run_key``, when
    given, names the run by the tag :data:`RUN_KEY_TAG`: a run of the experiment that has it is resumed
    instead of creating another (a process killed between creating a run and recording its id).
    ``inputs`` are the run's datasets (``name``, ``digest``, ``source_type``, ``source``, ``profile``,
    ``context``), logged each time the run is opened (MLflow links a dataset to a run once).
    """

    def __init__(self, uri: str, experiment: str, *, run_name: str | None, run_id: str | None,
                 tags: Mapping[str, str], run_key: str | None = None,
                 inputs: Sequence[Mapping[str, str]] = ()) -> None:
        self.uri = uri
        self.experiment = experiment
        self.run_name = run_name
        self.run_id = run_id
        self.experiment_id: str | None = None  # the run's experiment, once the run is open
        self.ready = False  # the run exists (created or resumed)
        self.lock = store_lock(uri)
        self._resume_id = run_id
        self.run_key = run_key
        self._create_tags = dict(tags) | ({RUN_KEY_TAG: run_key} if run_key else {})
        self._start_ms = now_ms()
        self._client: Any = None
        self.inputs = list(inputs)

    def client(self) -> Any:
        """The ``MlflowClient`` (created on first use: importing mlflow is slow)."""
        if self._client is None:
            from mlflow import MlflowClient

            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    def open_run(self) -> None:
        """Resume the run (or, when the store no longer knows it, start a new one tagged
        ``pvm.resumed_from``), or find it by its run key, or create it. Raises when the tracker is away."""
        with store_file_lock(self.uri):
            self._open_run(self.client())
        self._log_inputs()
        self.ready = True

    def _log_inputs(self) -> None:
        """Link the run's datasets to it; a rejection is reported and the run goes on without them."""
        if not self.inputs:
            return
        from mlflow.entities import Dataset, DatasetInput, InputTag

        datasets = [DatasetInput(Dataset(d["name"], d["digest"], d["source_type"], d["source"], profile=d.get("profile")),
                                 tags=[InputTag("mlflow.data.context", d.get("context", "training"))])
                    for d in self.inputs]
        try:
            self.client().log_inputs(self.run_id, datasets=datasets)
        except Exception as e:
            if not is_permanent(e):
                raise
            log.warning("tracking: the tracker rejected the run's dataset inputs: %s", short_error(e))

    def _open_run(self, client: Any) -> None:
        if self._resume_id:
            try:
                client.update_run(self._resume_id, status="RUNNING")
                self.experiment_id = client.get_run(self._resume_id).info.experiment_id
            except Exception as e:
                if not is_permanent(e):
                    raise
                log.warning("tracking: cannot resume run %s at %s (%s); starting a new run",
                            self._resume_id, self.uri, short_error(e))
                self._resume_id = None
                self._create_tags["pvm.resumed_from"] = self.run_id or ""
        if self._resume_id:
            return
        experiment_id = self.experiment_id = self._experiment_id(client)
        found = self._run_by_key(client, experiment_id)
        if found is not None:
            client.update_run(found, status="RUNNING")
            self.run_id = self._resume_id = found
            return
        run = client.create_run(experiment_id, start_time=self._start_ms, tags=dict(self._create_tags),
                                run_name=self.run_name)
        self.run_id = run.info.run_id

    def _run_by_key(self, client: Any, experiment_id: str) -> str | None:
        """The id of the run of ``experiment_id`` tagged with this run key (the oldest, if several)."""
        if not self.run_key:
            return None
        key = self.run_key.replace("'", "")
        runs = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{key}'",
                                  max_results=50, order_by=["attributes.start_time ASC"])
        return runs[0].info.run_id if runs else None

    def log_items(self, what: Literal["params", "tags"], items: Sequence[tuple[str, str]]) -> list[str]:
        """Log params or tags (at most :data:`PARAMS_TAGS_PER_BATCH`); the rejected ones, described."""
        from mlflow.entities import Param, RunTag

        make = Param if what == "params" else RunTag
        rejected: list[str] = []
        send_isolating(items, lambda c: self.client().log_batch(
            self.run_id, **{what: [make(k, v) for k, v in c]}, synchronous=True),
            lambda item, e: rejected.append(f"{item[0]} ({short_error(e, 160)})"))
        return rejected

    def log_metrics(self, batch: Sequence[MetricEntry]) -> list[str]:
        """Log metrics (at most :data:`METRICS_PER_BATCH`); the rejected ones, described."""
        from mlflow.entities import Metric

        rejected: list[str] = []
        send_isolating(batch, lambda b: self.client().log_batch(
            self.run_id, metrics=[Metric(e.key, e.value, e.timestamp, e.step) for e in b], synchronous=True),
            lambda entry, e: rejected.append(f"{entry.key} ({short_error(e, 160)})"))
        return rejected

    def log_artifact(self, local_path: Path, artifact_path: str | None) -> str | None:
        """Upload a file or folder; None when done, the reason when the tracker rejects it for good."""
        try:
            self.client().log_artifact(self.run_id, str(local_path), artifact_path)
        except Exception as e:
            if not is_permanent(e):
                raise
            return short_error(e)
        return None

    def end_run(self, status: str, tags: Mapping[str, str]) -> None:
        """Log the final ``tags`` (if any) and end the run with ``status``."""
        from mlflow.entities import RunTag

        if tags:
            self.client().log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()], synchronous=True)
        self.client().set_terminated(self.run_id, status=status)

    def _experiment_id(self, client: Any) -> str:
        exp = client.get_experiment_by_name(self.experiment)
        if exp is not None:
            return exp.experiment_id
        try:
            # The kind tag says model training. (MLflow 3.17's UI opens in its GenAI view whatever the tag says: the
            # address `pvm-dist train` prints names the model-training view, defaults.run_page.)
            return client.create_experiment(self.experiment, artifact_location=self._artifact_location(),
                                            tags={"mlflow.experimentKind": "custom_model_development"})
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
