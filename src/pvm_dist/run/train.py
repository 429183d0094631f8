"""``pvm-dist train``: one model, one process, checkpoints, exact resume, MLflow tracking.

A run lives in a folder: ``spec.json`` (the effective spec), ``metrics.jsonl`` (one JSON line per
metrics interval), ``pictures/``, ``checkpoints/`` (``step_NNNNNNNNN.pvmckpt``) and ``prediction.gif``.
SIGINT and SIGTERM finish the current chunk, save a checkpoint and return, so nothing is lost on
Ctrl-C; the MLflow run is then closed as KILLED and a resume continues the same run.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

import cv2

from pvm_dist.run import state as run_state
from pvm_dist.run.config import RunConfig
from pvm_dist.run.evaluate import score_heldout
from pvm_dist.run.session import Session
from pvm_dist.run.signals import stop_on_signals
from pvm_dist.run.state import RunState
from pvm_dist.tracking.keep_once import keep_once
from pvm_dist.tracking.tracker import Tracker, default_tracking_uri, run_tags

CHECKPOINT_SUFFIX = ".pvmckpt"


@dataclasses.dataclass
class Progress:
    """One progress report: where training is and how fast it goes."""

    step: int
    steps: int
    steps_per_s: float
    frames_per_s: float
    error: float | None  # layer-0 two-step RMSE in pixels
    baseline: float | None  # the copy-last-frame baseline's, in pixels


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

    def save_picture(self, session: Session) -> Path:
        path = self.path / "pictures" / f"step_{session.step:09d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(path), session.picture())
        if self.tracker is not None:
            self.tracker.log_artifact(path, "pictures")
        self.picture = path
        return path

    def save_checkpoint(self, state: RunState) -> Path:
        """Write atomically, then keep the newest few plus every ``keep_every``-th. MLflow gets only the
        run's last checkpoint, at the end, once (:func:`~pvm_dist.tracking.keep_once.keep_once`)."""
        cfg = state.run
        path = run_state.save(checkpoint_path(self.path, state.step), state)
        for old in sorted((self.path / "checkpoints").glob(f"step_*{CHECKPOINT_SUFFIX}"))[: -cfg.keep_checkpoints]:
            if not (cfg.keep_every and int(old.stem.split("_")[1]) % cfg.keep_every == 0):
                old.unlink(missing_ok=True)
        return path


def _start_tracker(cfg: RunConfig, session: Session, run_dir: Path) -> tuple[Tracker, RunConfig]:
    resuming = cfg.run_id is not None
    cfg = cfg.replace(mlflow_uri=cfg.mlflow_uri or default_tracking_uri())
    tracker = Tracker.start(cfg.mlflow_uri, cfg.experiment, run_name=cfg.run_name or run_dir.name, run_id=cfg.run_id,
                            tags=run_tags(session.engine.backend, session.engine.device_label, {"run_dir": str(run_dir)}),
                            fallback_dir=run_dir / "tracking-fallback")
    if not resuming:
        tracker.log_params(cfg.params())
        tracker.log_dict({"name": cfg.spec.name, **cfg.spec.to_dict()}, "spec.json")
    return tracker, cfg.replace(run_id=tracker.run_id)


def train(cfg: RunConfig, run_dir: Path, resume: RunState | None = None,
          on_progress: Callable[[Progress], None] | None = None) -> TrainResult:
    """Train until ``cfg.steps`` (or a stop signal), checkpointing and tracking as configured."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.heldout:  # fail now, not after training, if the held-out data cannot be read
        from pvm_dist.data import make_source

        make_source(cfg.heldout, cfg.spec.image_shape, 1, cfg.heldout_seed, data_path=cfg.data_path)
    session = Session(cfg, resume)
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
        with stop_on_signals() as should_stop, open(run_dir / "metrics.jsonl", "a") as log:
            while session.step < cfg.steps:
                t0 = time.perf_counter()
                session.advance(_next_stop(session.step, cfg) - session.step)
                trained_s += time.perf_counter() - t0
                s = session.step
                if s % cfg.metrics_every == 0 or s == cfg.steps:
                    metrics = session.take_metrics()
                    log.write(json.dumps({"step": s, **metrics}) + "\n")
                    log.flush()
                    if tracker is not None:
                        tracker.log_metrics(metrics, step=s)
                    if on_progress:
                        on_progress(Progress(s, cfg.steps, metrics["steps_per_s"], metrics["frames_per_s"],
                                             metrics.get("l0_two_step_px"), metrics.get("baseline_two_step_px")))
                if cfg.picture_every and s % cfg.picture_every == 0 and s < cfg.steps:
                    folder.save_picture(session)
                if cfg.checkpoint_every and s % cfg.checkpoint_every == 0 and s < cfg.steps:
                    last_ck = folder.save_checkpoint(session.state())
                if should_stop():
                    interrupted = True
                    break
        final = session.state()
        if last_ck is None or last_ck != checkpoint_path(run_dir, session.step):
            last_ck = folder.save_checkpoint(final)
        if session.step > start_step:
            folder.save_picture(session)
        if session.animation is not None and len(session.animation) > 1 and not interrupted:
            animation = session.animation.save(run_dir / "prediction.gif")
            if tracker is not None:
                tracker.log_artifact(animation)
        if tracker is not None:  # a hard link where MLflow's store is a local folder: one copy on disk
            keep_once(tracker, last_ck, "checkpoints")
        if not interrupted:
            heldout = score_heldout(final, session.engine.backend)
            if heldout and tracker is not None:
                tracker.log_metrics(heldout, step=session.step)
        status = "KILLED" if interrupted else "FINISHED"
    finally:
        if tracker is not None:
            tracker.close(status)
    rate = (session.step - start_step) / max(trained_s, 1e-9)  # training only, not the held-out score
    return TrainResult(session.step, interrupted, last_ck, run_dir, trained_s, rate, rate * cfg.n_seq, metrics,
                       folder.picture, animation, cfg, heldout)
