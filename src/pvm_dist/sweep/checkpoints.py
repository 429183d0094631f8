"""A sweep's checkpoints on disk, written off the driver's scheduling loop, one copy each.

The loop hands a trial's state over (:meth:`CheckpointStore.submit`), or a function that fetches it (a state
a worker handed over while training on: the bytes then reach this process on the writer thread, not on
the loop), and goes on scheduling; a writer thread serialises, hashes and fsyncs it
(``io.checkpoint.save``: seconds for LARGE). A state still
waiting when a newer one of the same trial arrives is superseded and dropped, so a slow disk costs
checkpoints, never the loop. Written checkpoints come back to the loop (:meth:`take_written`), which
journals them: the journal names only files that are complete on disk.

Each trial keeps, under ``trials/<id>/checkpoints/``, its last ``keep_last`` checkpoints and its best by
the sweep metric; ``trials/<id>/checkpoint.pvmckpt`` (what a resume reads) and ``best.pvmckpt`` are
hard links to those files, and MLflow gets the path as a tag rather than a second copy: one copy of
each checkpoint on disk per sweep.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pvm_dist.run.train import CHECKPOINT_SUFFIX
from pvm_dist.run import state as run_state
from pvm_dist.run.state import RunState

LATEST, BEST = f"checkpoint{CHECKPOINT_SUFFIX}", f"best{CHECKPOINT_SUFFIX}"


@dataclasses.dataclass(frozen=True)
class Written:
    """A checkpoint complete on disk (``error``: why it could not be written; the loop reports it)."""

    trial_id: str
    step: int
    path: Path
    seconds: float
    best: bool
    metric: float | None
    error: str | None = None


@dataclasses.dataclass
class _Job:
    trial_id: str
    step: int
    state: RunState | Callable[[], RunState]  # or what fetches it
    extra: dict[str, Any]
    metric: float | None


class CheckpointStore:
    """Writes trials' checkpoints on one thread and keeps the last ``keep_last`` and the best of each."""

    def __init__(self, trials_dir: Callable[[str], Path], keep_last: int, better: Callable[[float, float], bool],
                 best: Mapping[str, tuple[int, float]] | None = None) -> None:
        self._dir, self.keep_last, self._better = trials_dir, keep_last, better
        self._best: dict[str, tuple[int, float]] = dict(best or {})  # trial -> (step, metric)
        self._pending: dict[str, _Job] = {}
        self._writing: str | None = None
        self._written: list[Written] = []
        self._closed = False
        self.dropped = 0  # superseded before they were written
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="pvm-checkpoints", daemon=True)
        self._thread.start()

    # ---- the loop's side --------------------------------------------------------------------------
    def submit(self, trial_id: str, step: int, state: RunState | Callable[[], RunState], extra: Mapping[str, Any],
               metric: float | None) -> None:
        """Queue the trial's state at ``step`` (returns at once; an older state of the trial still queued is dropped)."""
        with self._cond:
            if trial_id in self._pending:
                self.dropped += 1
            self._pending[trial_id] = _Job(trial_id, step, state, dict(extra), metric)
            self._cond.notify_all()

    def take_written(self) -> list[Written]:
        """Checkpoints finished since the last call, oldest first."""
        with self._cond:
            out, self._written = self._written, []
        return out

    def wait(self, trial_id: str | None = None, timeout: float | None = None) -> bool:
        """Until the trial's (every trial's) queued checkpoints are on disk; False on timeout."""
        def idle() -> bool:
            if trial_id is None:
                return not self._pending and self._writing is None
            return trial_id not in self._pending and self._writing != trial_id

        with self._cond:
            return self._cond.wait_for(idle, timeout)

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        self.wait()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    # ---- the writer thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if not self._pending:
                    return
                trial_id = next(iter(self._pending))
                job = self._pending.pop(trial_id)
                self._writing = trial_id
            result = self._write(job)
            with self._cond:
                self._written.append(result)
                self._writing = None
                self._cond.notify_all()

    def _write(self, job: _Job) -> Written:
        t0 = time.perf_counter()
        folder = self._dir(job.trial_id)
        path = folder / "checkpoints" / f"step_{job.step:09d}{CHECKPOINT_SUFFIX}"
        try:
            state = job.state() if callable(job.state) else job.state
        except Exception as exc:  # noqa: BLE001 - a state lost on its way (its worker died): the loop reports it
            return Written(job.trial_id, job.step, path, time.perf_counter() - t0, False, job.metric,
                           f"not received: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            run_state.save(path, state, job.extra)
            _link(path, folder / LATEST)
            best = self._is_best(job)
            if best:
                _link(path, folder / BEST)
            self._retain(job.trial_id, folder)
        except OSError as exc:
            return Written(job.trial_id, job.step, path, time.perf_counter() - t0, False, job.metric,
                           f"{type(exc).__name__}: {exc}")
        return Written(job.trial_id, job.step, path, time.perf_counter() - t0, best, job.metric)

    def _is_best(self, job: _Job) -> bool:
        if job.metric is None:
            return False
        held = self._best.get(job.trial_id)
        if held is not None and not self._better(job.metric, held[1]):
            return False
        self._best[job.trial_id] = (job.step, job.metric)
        return True

    def _retain(self, trial_id: str, folder: Path) -> None:
        """Remove the trial's step files that are neither among its last ``keep_last`` nor its best."""
        files = sorted((folder / "checkpoints").glob(f"step_*{CHECKPOINT_SUFFIX}"))
        best_step = self._best.get(trial_id, (None, None))[0]
        for old in files[:-self.keep_last]:
            if int(old.stem.split("_")[1]) != best_step:
                old.unlink(missing_ok=True)


def _link(target: Path, name: Path) -> None:
    """Point ``name`` at ``target``'s file (a hard link, replaced atomically; a copy where links fail)."""
    tmp = name.with_name(name.name + ".link")
    tmp.unlink(missing_ok=True)
    try:
        os.link(target, tmp)
    except OSError:
        import shutil

        shutil.copyfile(target, tmp)
    os.replace(tmp, name)
