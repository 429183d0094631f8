"""``pvm-dist train``: one model, one process, checkpoints, exact resume, MLflow tracking.

A run lives in a folder: ``spec.json`` (the effective spec), ``metrics.jsonl`` (one JSON line per
metrics interval), ``pictures/``, ``checkpoints/`` (``step_NNNNNNNNN.pvmckpt``) and ``prediction.gif``.
SIGINT and SIGTERM finish the current chunk, save a checkpoint and return, so nothing is lost on
Ctrl-C; the MLflow run is then closed as KILLED and a resume continues the same run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pvm_dist.io import checkpoint, pictures
from pvm_dist.run import state as run_state
from pvm_dist.run.config import RunConfig
from pvm_dist.run.evaluate import score_heldout
from pvm_dist.run.session import RunDiverged, Session
from pvm_dist.run.signals import stop_on_signals
from pvm_dist.run.state import RunState
from pvm_dist.tracking.images import log_image_series
from pvm_dist.tracking.keep_once import keep_once
from pvm_dist.tracking.owner import LOCK_FILE, holding
from pvm_dist.tracking.tracker import Tracker, default_tracking_uri, run_tags

CHECKPOINT_SUFFIX = ".pvmckpt"
FINISHED_FILE = "finished.json"  # written once the end-of-run work (held-out score, animation, MLflow close) is done
logger = logging.getLogger(__name__)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, say); the message names it and the last good one."""


class RunFolderBusy(RuntimeError):
    """Another process trains into the run folder (a user error: the resume command run twice, say)."""


@contextlib.contextmanager
def _held_folder(run_dir: Path) -> Iterator[None]:
    """``run_dir`` created if need be and held by this process for the run (:class:`RunFolderBusy` if another holds
    it); removed again, with the folders above it that this made, if the run left nothing in it."""
    made = next((p for p in [*reversed(run_dir.parents), run_dir] if not p.exists()), None)
    run_dir.mkdir(parents=True, exist_ok=True)
    busy = RunFolderBusy(f"{run_dir} is in use: another pvm-dist process is training into it (it holds "
                         f"{LOCK_FILE}); wait for it to end, or train into another folder")
    try:
        with holding(run_dir, busy):
            yield
    finally:
        if made is not None and [p.name for p in run_dir.iterdir()] == [LOCK_FILE]:
            shutil.rmtree(made)  # a run refused before it wrote anything: no empty folders


@dataclasses.dataclass
class Progress:
    """One progress report: where training is and how fast it goes."""

    step: int
    steps: int
    steps_per_s: float
    frames_per_s: float
    error: float | None  # layer-0 two-step RMSE in pixels
    baseline: float | None  # the copy-last-frame baseline's, in pixels
    ratio: float | None = None  # MSE ratio to the copy-last-frame baseline (< 1 beats it)
    ratio_background: float | None = None  # MSE ratio to the background baseline


@dataclasses.dataclass
class TrainResult:
    step: int
    interrupted: bool
    checkpoint: Path | None
    run_dir: Path
    seconds: float
    steps_per_s: float
    frames_per_s: float
    final_metrics: dict[str, float]
    picture: Path | None
    animation: Path | None
    config: RunConfig
    heldout: dict[str, float] = dataclasses.field(default_factory=dict)  # heldout_* scores of the final model
    experiment_id: str | None = None  # the MLflow run's experiment (None untracked, or the tracker never reached)


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:09d}{CHECKPOINT_SUFFIX}"


def _next_stop(step: int, cfg: RunConfig) -> int:
    """The next step at which something is measured, drawn or saved."""
    stops = [cfg.steps, (step // cfg.metrics_every + 1) * cfg.metrics_every]
    for every in (cfg.picture_every, cfg.checkpoint_every):
        if every:
            stops.append((step // every + 1) * every)
    return min(stops)


class _RunFolder:
    """What a local run writes: pictures, checkpoints (with retention), and their MLflow copies."""

    def __init__(self, run_dir: Path, tracker: Tracker | None) -> None:
        self.path, self.tracker = run_dir, tracker
        self.picture: Path | None = None

    def save_picture(self, session: Session) -> Path | None:
        """Write the picture of this step; a picture that cannot be written is reported, and training goes on."""
        path = self.path / "pictures" / f"step_{session.step:09d}.png"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            pictures.write_image(path, session.picture())
        except OSError as exc:
            logger.warning("pvm-dist: warning: %s; training goes on", exc)
            return None
        self._log_picture(path, session.step)
        self.picture = path
        return path

    def _log_picture(self, path: Path, step: int) -> None:
        """The picture of ``step`` to MLflow: under pictures/ and as that step of the image series."""
        if self.tracker is not None:
            self.tracker.log_artifact(path, "pictures")
            log_image_series(self.tracker, path, step, self.path / "tracking-images")

    def log_kept(self, step: int) -> Path | None:
        """Finishing a run killed after its final checkpoint: the last picture (also in the image series) and
        the animation it wrote before that checkpoint, logged again under the same artifact paths; the killed
        process may have died before delivering them. Returns the animation, if any."""
        path = self.path / "pictures" / f"step_{step:09d}.png"
        gif = self.path / "prediction.gif"
        if path.exists():
            self._log_picture(path, step)
            self.picture = path
        if self.tracker is not None and gif.exists():
            self.tracker.log_artifact(gif)
        return gif if gif.exists() else None

    def save_checkpoint(self, state: RunState) -> Path:
        """Write atomically (with the MLflow run id, once the tracker knows it), then keep the newest few plus
        every ``keep_every``-th. A failed write (a full disk) raises :class:`CheckpointWriteError`; the
        checkpoints already written stay as they are. MLflow gets only the run's last checkpoint, at the end,
        once (:func:`~pvm_dist.tracking.keep_once.keep_once`)."""
        if self.tracker is not None and self.tracker.run_id and state.run.run_id != self.tracker.run_id:
            state = dataclasses.replace(state, run=state.run.replace(run_id=self.tracker.run_id))
        cfg = state.run
        target = checkpoint_path(self.path, state.step)
        try:
            path = run_state.save(target, state)
        except OSError as exc:
            kept = sorted((self.path / "checkpoints").glob(f"step_*{CHECKPOINT_SUFFIX}"))
            raise CheckpointWriteError(
                f"cannot write checkpoint {target}: {exc.strerror or exc}; "
                + (f"the last good checkpoint {kept[-1]} is kept" if kept else "no earlier checkpoint was written")
            ) from None
        for old in sorted((self.path / "checkpoints").glob(f"step_*{CHECKPOINT_SUFFIX}"))[: -cfg.keep_checkpoints]:
            if not (cfg.keep_every and int(old.stem.split("_")[1]) % cfg.keep_every == 0):
                old.unlink(missing_ok=True)
        return path


def _start_tracker(cfg: RunConfig, session: Session, run_dir: Path) -> tuple[Tracker, RunConfig]:
    resuming = cfg.run_id is not None
    cfg = cfg.replace(mlflow_uri=cfg.mlflow_uri or default_tracking_uri(), run_key=cfg.run_key or uuid.uuid4().hex)
    tracker = Tracker.start(cfg.mlflow_uri, cfg.experiment, run_name=cfg.run_name or run_dir.name, run_id=cfg.run_id,
                            tags=run_tags(session.engine.backend, session.engine.device_label,
                                          {"run_dir": str(run_dir), "pvm_dist.command": cfg.command()}),
                            fallback_dir=run_dir / "tracking-fallback", run_key=cfg.run_key, inputs=cfg.datasets())
    if not resuming:
        tracker.log_params(cfg.params())
        tracker.log_dict({"name": cfg.spec.name, **cfg.spec.to_dict()}, "spec.json")
    return tracker, cfg.replace(run_id=tracker.run_id)


def _logged_steps(path: Path) -> dict[int, tuple[int, dict[str, Any]]]:
    """What ``metrics.jsonl`` holds, by step: when it was logged, and the values. A resumed run sends these to
    MLflow again as they were (its SQL stores keep one copy of an identical point) and does not log the steps
    it redoes after its checkpoint a second time. A torn last line (killed mid-write) is cut off."""
    if not path.exists():
        return {}
    raw = path.read_bytes()
    if raw and not raw.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(raw.rfind(b"\n") + 1)
    out: dict[int, tuple[int, dict[str, Any]]] = {}
    for line in raw.splitlines():
        try:
            rec = json.loads(line)
            step, stamp = int(rec.pop("step")), int(rec.pop("time_ms"))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # torn, or written before lines had a time
        out.setdefault(step, (stamp, rec))
    return out


def finished_at(run_dir: Path) -> int | None:
    """The step at which the run in ``run_dir`` finished its end-of-run work, None if it never did."""
    try:
        return int(json.loads((run_dir / FINISHED_FILE).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def train(cfg: RunConfig, run_dir: Path, resume: RunState | None = None,
          on_progress: Callable[[Progress], None] | None = None) -> TrainResult:
    """Train until ``cfg.steps`` (or a stop signal), checkpointing and tracking as configured, holding
    ``run_dir`` for this process (:class:`RunFolderBusy` while another trains into it).

    Resumed at ``cfg.steps`` already (killed after its last checkpoint), it does only the end-of-run work
    that was missed: the final picture, the held-out score and the MLflow run's close.
    """
    with _held_folder(run_dir):
        return _train(cfg, run_dir, resume, on_progress)


def _train(cfg: RunConfig, run_dir: Path, resume: RunState | None,
           on_progress: Callable[[Progress], None] | None) -> TrainResult:
    checkpoint.remove_stale_temps(run_dir / "checkpoints")  # of a process killed mid-write (none runs now)
    if cfg.heldout:  # fail now, not after training, if the held-out data cannot be read
        from pvm_dist.data import make_source

        make_source(cfg.heldout, cfg.spec.image_shape, 1, cfg.heldout_seed, data_path=cfg.data_path)
    session = Session(cfg, resume)
    kept = cfg.keep_checkpoints + (cfg.steps // cfg.keep_every if cfg.keep_every else 0)
    note = run_state.disk_note(cfg, kept, 1, str(run_dir))
    if note:  # said once the model is known to fit, before the first checkpoint
        logger.warning("pvm-dist: %s", note)
    note = cfg.readout_note() if session.readout is not None and session.on_gpu else None
    if note:
        logger.warning("pvm-dist: %s", note)
    tracker = None
    if cfg.track:
        tracker, cfg = _start_tracker(cfg, session, run_dir)
        session.config = cfg
    folder = _RunFolder(run_dir, tracker)
    (run_dir / "spec.json").write_text(json.dumps({"name": cfg.spec.name, **cfg.spec.to_dict()}, indent=2) + "\n")
    start_step, trained_s = session.step, 0.0
    last_ck: Path | None = None
    interrupted, status = False, "FAILED"
    metrics: dict[str, float] = {}
    heldout: dict[str, float] = {}
    animation: Path | None = None
    try:
        logged = _logged_steps(run_dir / "metrics.jsonl") if resume is not None else {}
        if tracker is not None:  # what a killed process had queued may never have arrived: send it again, as it was
            for step, (stamp, values) in logged.items():
                tracker.log_metrics(values, step=step, timestamp=stamp)
        with stop_on_signals() as should_stop, open(run_dir / "metrics.jsonl", "a") as log:
            while session.step < cfg.steps:
                t0 = time.perf_counter()
                session.advance(_next_stop(session.step, cfg) - session.step)
                trained_s += time.perf_counter() - t0
                s = session.step
                if s % cfg.metrics_every == 0 or s == cfg.steps:
                    metrics = session.take_metrics()
                    if s not in logged:  # else a redone step, logged (again) from metrics.jsonl at the start
                        stamp = int(time.time() * 1000)
                        log.write(json.dumps({"step": s, "time_ms": stamp, **metrics}) + "\n")
                        log.flush()
                        if tracker is not None:
                            tracker.log_metrics(metrics, step=s, timestamp=stamp)
                    if on_progress:
                        on_progress(Progress(s, cfg.steps, metrics["steps_per_s"], metrics["frames_per_s"],
                                             metrics.get("l0_two_step_px"), metrics.get("baseline_two_step_px"),
                                             metrics.get("ratio_two_step"), metrics.get("ratio_background_two_step")))
                if cfg.picture_every and s % cfg.picture_every == 0 and s < cfg.steps:
                    folder.save_picture(session)
                if cfg.checkpoint_every and s % cfg.checkpoint_every == 0 and s < cfg.steps:
                    last_ck = folder.save_checkpoint(session.state())
                if should_stop():
                    interrupted = True
                    break
        # The last picture and the animation are written before the final checkpoint: a process killed after
        # that checkpoint has them, and the resume that finishes the run (nothing left to train) logs them again.
        finishing = session.step == start_step and not interrupted
        if finishing:
            animation = folder.log_kept(session.step)
            if folder.picture is None:  # killed before it was drawn (a checkpoint of an earlier release)
                folder.save_picture(session)
        else:
            if session.step > start_step or not interrupted:
                folder.save_picture(session)
            if session.animation is not None and len(session.animation) > 1 and not interrupted:
                animation = session.animation.save(run_dir / "prediction.gif")
                if tracker is not None:
                    tracker.log_artifact(animation)
        final = session.state()
        if last_ck is None or last_ck != checkpoint_path(run_dir, session.step):
            last_ck = folder.save_checkpoint(final)
        if tracker is not None:  # a hard link where MLflow's store is a local folder: one copy on disk
            keep_once(tracker, last_ck, "checkpoints")
        if not interrupted:
            heldout = score_heldout(final, session.engine.backend)
            if heldout and tracker is not None:
                tracker.log_metrics(heldout, step=session.step)
        status = "KILLED" if interrupted else "FINISHED"
    except RunDiverged as exc:  # compare shows why the run failed
        if tracker is not None:
            tracker.set_tags({"status_reason": str(exc)})
        raise
    finally:
        if tracker is not None:
            tracker.close(status)
    if status == "FINISHED":
        (run_dir / FINISHED_FILE).write_text(json.dumps({"step": session.step, "time": time.time()}) + "\n")
    rate = (session.step - start_step) / max(trained_s, 1e-9)  # training only, not the held-out score
    return TrainResult(session.step, interrupted, last_ck, run_dir, trained_s, rate, rate * cfg.n_seq, metrics,
                       folder.picture, animation, cfg, heldout, tracker.experiment_id if tracker is not None else None)
