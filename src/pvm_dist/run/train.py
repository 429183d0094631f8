"""Local training: one model, one process, checkpoints, exact resume, MLflow tracking.

A run lives in a folder: ``spec.json`` (the effective spec), ``metrics.jsonl`` (one JSON line per
metrics interval), ``pictures/`` and ``checkpoints/`` (``step_NNNNNNNNN.pvmckpt``). SIGINT and
SIGTERM finish the current step, save a checkpoint and return, so nothing is lost on Ctrl-C; the
MLflow run is then closed as KILLED and a resume continues the same run.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pvm_dist.io import checkpoint
from pvm_dist.data import make_source
from pvm_dist.engine import build_engine
from pvm_dist.run.metrics import CopyLastFrameBaseline, summarize
from pvm_dist.model.spec import Spec, load_spec
from pvm_dist.run.signals import stop_on_signals

CHECKPOINT_SUFFIX = ".pvmckpt"
READOUT_PREFIX = "readout_"  # the readout's state keys; they sit beside the engine's in a checkpoint
ANIMATION_FRAMES = 100  # the last steps of a run, as input | prediction


@dataclasses.dataclass
class TrainConfig:
    """What to train and where to keep it. ``steps`` is the step count to reach, also on resume."""

    spec: Spec
    steps: int
    run_dir: Path
    n_seq: int = 1
    seed: int = 0
    backend: str = "auto"
    device: str | None = None  # native engine: "cpu", "cuda", "cuda:N" (default: a GPU if visible)
    data: str = "synthetic:balls"
    data_path: str | None = None
    checkpoint_every: int = 0  # 0: only at the end (and on interruption)
    keep_checkpoints: int = 2  # the newest few are kept ...
    keep_every: int = 0  # ... and every checkpoint whose step is a multiple of this (0: none)
    metrics_every: int = 50
    picture_every: int = 500  # 0: only at the end
    readout_from: int = 0  # train the readout from this step on, when the data has labels
    readout_lr: float | None = None  # None: the original's readout schedule (§4: 0.01, then 10 × the PVM rate)
    heldout: str | None = None  # data scoring the readout at the end (None: synthetic data of another seed)
    heldout_steps: int = 300  # frames per sequence of that score (0: none)
    track: bool = True
    mlflow_uri: str | None = None
    experiment: str = "pvm-dist"
    run_name: str | None = None
    run_id: str | None = None  # an MLflow run to continue (set on resume)
    overrides: dict[str, str] = dataclasses.field(default_factory=dict)

    def meta(self) -> dict[str, Any]:
        """What a checkpoint records so that a resume can rebuild this config."""
        return {"spec": self.spec.to_dict(), "spec_name": self.spec.name, "seed": self.seed, "n_seq": self.n_seq,
                "data": self.data, "data_path": self.data_path, "backend": self.backend, "device": self.device,
                "steps": self.steps, "readout_from": self.readout_from, "readout_lr": self.readout_lr, "mlflow_uri": self.mlflow_uri,
                "heldout": self.heldout, "heldout_steps": self.heldout_steps,
                "experiment": self.experiment, "run_name": self.run_name, "run_id": self.run_id,
                "overrides": self.overrides, "metrics_every": self.metrics_every, "picture_every": self.picture_every,
                "track": self.track}

    def params(self) -> dict[str, Any]:
        """MLflow params: every effective spec value, the overrides, and how the run was set up."""
        return {"spec": self.spec.to_dict(), "spec_name": self.spec.name, "overrides": self.overrides or "none",
                "n_seq": self.n_seq, "backend": self.backend, "data": self.data, "seed": self.seed,
                "steps": self.steps, "readout_from": self.readout_from, "readout_lr": self.readout_lr or "schedule",
                "heldout": self.heldout_data() or "none"}

    @property
    def heldout_seed(self) -> int:
        """Seed of the held-out data: synthetic scenes training never saw."""
        return self.seed + 1

    def heldout_data(self) -> str | None:
        """The data the readout is scored on at the end: ``heldout``, else synthetic scenes of another seed."""
        if self.heldout:
            return self.heldout
        return self.data if self.data.startswith("synthetic:") else None


@dataclasses.dataclass
class Progress:
    """One progress report: where training is and how fast it goes."""

    step: int
    steps: int
    steps_per_s: float
    frames_per_s: float
    error: float | None  # layer-0 two-step RMSE in pixels
    ratio: float | None  # model / copy-last-frame baseline


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
    run_id: str | None
    tracking_uri: str | None
    heldout: dict[str, float] = dataclasses.field(default_factory=dict)  # heldout_* scores of the final model


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:09d}{CHECKPOINT_SUFFIX}"


def config_from_checkpoint(path: Path, steps: int | None, run_dir: Path | None) -> tuple[TrainConfig, checkpoint.Checkpoint]:
    """Rebuild the config a checkpoint was written with (its run folder unless told otherwise)."""
    ck = checkpoint.load(path)
    m = ck.meta
    spec = load_spec(ck.spec, name=m.get("spec_name", "spec"))
    cfg = TrainConfig(
        spec=spec, steps=steps if steps is not None else int(m.get("steps", ck.step)),
        run_dir=run_dir or Path(path).resolve().parent.parent, n_seq=int(m["n_seq"]), seed=int(m["seed"]),
        backend=m.get("backend", "auto"), device=m.get("device"), data=m.get("data", "synthetic:bar"),
        data_path=m.get("data_path"), readout_from=int(m.get("readout_from", 0)), readout_lr=m.get("readout_lr"),
        heldout=m.get("heldout"), heldout_steps=int(m.get("heldout_steps", 300)), mlflow_uri=m.get("mlflow_uri"),
        experiment=m.get("experiment", "pvm-dist"), run_name=m.get("run_name"), run_id=m.get("run_id"),
        overrides=dict(m.get("overrides") or {}), metrics_every=int(m.get("metrics_every", 50)),
        picture_every=int(m.get("picture_every", 500)), track=bool(m.get("track", True)))
    return cfg, ck


class _Run:
    """The pieces of one training run and the bookkeeping between steps."""

    def __init__(self, cfg: TrainConfig, resume: checkpoint.Checkpoint | None) -> None:
        self.cfg = cfg
        self.engine = build_engine(cfg.spec, backend=cfg.backend, n_seq=cfg.n_seq, seed=cfg.seed, device=cfg.device)
        self.source = make_source(cfg.data, cfg.spec.image_shape, cfg.n_seq, cfg.seed, data_path=cfg.data_path)
        if cfg.heldout:  # fail now, not after training, if the held-out data cannot be read
            make_source(cfg.heldout, cfg.spec.image_shape, 1, cfg.heldout_seed, data_path=cfg.data_path)
        self.baseline = CopyLastFrameBaseline()
        self.readout = self._make_readout()
        if resume is not None:
            self.engine.load_state({k: v for k, v in resume.state.items() if not k.startswith(READOUT_PREFIX)})
            readout_state = {k: v for k, v in resume.state.items() if k.startswith(READOUT_PREFIX)}
            if self.readout is not None and readout_state:
                self.readout.load_state(readout_state)
        self.tracker = self._make_tracker()
        self.animation: Any = None
        self._recent_predictions: deque[np.ndarray] = deque(maxlen=2)  # made at steps s−2, s−1
        self.picture: Path | None = None

    def _make_readout(self) -> Any:
        if self.source.labels(0) is None:
            return None
        from pvm_dist.model.readout import Readout

        return Readout(self.engine.topo, seed=self.cfg.seed, momentum=self.cfg.spec["momentum"])

    def _make_tracker(self) -> Any:
        if not self.cfg.track:
            return None
        from pvm_dist.tracking.tracker import Tracker, default_tracking_uri, run_tags

        cfg = self.cfg
        resuming = cfg.run_id is not None
        cfg.mlflow_uri = cfg.mlflow_uri or default_tracking_uri()
        device = getattr(self.engine, "device_label", "cpu")
        tracker = Tracker.start(cfg.mlflow_uri, cfg.experiment, run_name=cfg.run_name or cfg.run_dir.name,
                                run_id=cfg.run_id, tags=run_tags(self.engine.backend, device, {"run_dir": str(cfg.run_dir)}),
                                fallback_dir=cfg.run_dir / "tracking-fallback")
        cfg.run_id = tracker.run_id
        if not resuming:
            tracker.log_params(cfg.params())
            tracker.log_dict({"name": cfg.spec.name, **cfg.spec.to_dict()}, "spec.json")
        return tracker

    # --- per step ---------------------------------------------------------------------------
    def step(self) -> None:
        s = self.engine.step_index
        frames = self.source.frames(s)
        self.baseline.update(frames)
        self.engine.step(frames)
        if self.readout is not None and s >= self.cfg.readout_from:
            labels = self.source.labels(s)
            if labels is not None:
                from pvm_dist.model.readout import readout_learning_rate

                lr = self.cfg.readout_lr if self.cfg.readout_lr is not None else readout_learning_rate(self.cfg.spec, s)
                self.readout.set_learning_rate(lr)
                self.readout.train(self.engine.hidden(), labels)
        if self.animation is not None:
            # The two-step prediction made at step s−2 is of this step's frame.
            if len(self._recent_predictions) == 2:
                self.animation.add(frames[0], self._recent_predictions[0])
            self._recent_predictions.append(self._predicted_frame())

    def _predicted_frame(self) -> np.ndarray:
        from pvm_dist.io.pictures import predicted_frame

        return predicted_frame(self.engine.topo, self.engine.prediction()[0], ahead=2)

    def save_picture(self, tag: str) -> Path:
        """The display of §6 for sequence 0: frame, prediction, error, readout, hidden tiles."""
        from pvm_dist.io.pictures import picture_grid

        s = self.engine.step_index
        # The last step (s−1) predicted frame s+1 two steps ahead: show that frame beside it.
        frame = self.source.frames(s + 1)[0]
        hidden = self.engine.hidden()  # one read: on the native engine it copies the ring off the device
        heatmap, box = None, None
        if self.readout is not None:
            from pvm_dist.model.readout import decode

            heatmap = decode(self.readout.forward(hidden))[0]
            boxes = self.source.boxes(max(s - 1, 0))
            box = None if boxes is None else tuple(int(v) for v in boxes[0])
        caption = {"step": s, "spec": self.cfg.spec.name, "backend": self.engine.backend}
        image = picture_grid(frame, self._predicted_frame(), self.engine.topo, hidden[0],
                             heatmap=heatmap, label_box=box, caption=caption)
        path = self.cfg.run_dir / "pictures" / f"{tag}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        import cv2

        cv2.imwrite(str(path), image)
        if self.tracker is not None:
            self.tracker.log_artifact(path, "pictures")
        self.picture = path
        return path

    def save_checkpoint(self) -> Path:
        """Write a checkpoint atomically, then apply retention (newest few + every keep_every-th)."""
        cfg = self.cfg
        state = self.engine.state()
        if self.readout is not None:
            state.update(self.readout.state())
        path = checkpoint.save(checkpoint_path(cfg.run_dir, self.engine.step_index), state, cfg.meta())
        existing = sorted((cfg.run_dir / "checkpoints").glob(f"step_*{CHECKPOINT_SUFFIX}"))
        for old in existing[: -max(cfg.keep_checkpoints, 1)]:
            step = int(old.stem.split("_")[1])
            if not (cfg.keep_every and step % cfg.keep_every == 0):
                old.unlink(missing_ok=True)
        if self.tracker is not None:  # MLflow keeps the latest under one name, replaced each time
            latest = cfg.run_dir / "tracking-latest" / f"latest{CHECKPOINT_SUFFIX}"
            latest.parent.mkdir(exist_ok=True)
            latest.unlink(missing_ok=True)
            try:
                latest.hardlink_to(path)
            except OSError:
                import shutil

                shutil.copyfile(path, latest)
            self.tracker.log_artifact(latest, "checkpoints")
        return path


def train(cfg: TrainConfig, resume: checkpoint.Checkpoint | None = None,
          on_progress: Callable[[Progress], None] | None = None) -> TrainResult:
    """Train until ``cfg.steps`` (or a stop signal), checkpointing and tracking as configured."""
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    run = _Run(cfg, resume)
    engine = run.engine
    (cfg.run_dir / "spec.json").write_text(json.dumps({"name": cfg.spec.name, **cfg.spec.to_dict()}, indent=2) + "\n")
    start_step, t0 = engine.step_index, time.perf_counter()
    window_step, window_t = start_step, t0
    last_ck: Path | None = None
    interrupted, status = False, "FAILED"
    metrics: dict[str, float] = {}
    heldout: dict[str, float] = {}
    try:
        with stop_on_signals() as should_stop, open(cfg.run_dir / "metrics.jsonl", "a") as log:
            collect_from = max(start_step, cfg.steps - ANIMATION_FRAMES)
            while engine.step_index < cfg.steps:
                if run.animation is None and engine.step_index >= collect_from:
                    from pvm_dist.io.pictures import Animation

                    run.animation = Animation(min_side=96)
                run.step()
                s = engine.step_index
                if s % cfg.metrics_every == 0 or s == cfg.steps:
                    now = time.perf_counter()
                    rate = (s - window_step) / max(now - window_t, 1e-9)
                    window_step, window_t = s, now
                    metrics = summarize(engine.metrics(), run.baseline.take())
                    metrics.update({"steps_per_s": rate, "frames_per_s": rate * cfg.n_seq})
                    log.write(json.dumps({"step": s, **metrics}) + "\n")
                    log.flush()
                    if run.tracker is not None:
                        run.tracker.log_metrics(metrics, step=s)
                    if on_progress:
                        on_progress(Progress(s, cfg.steps, rate, rate * cfg.n_seq, metrics.get("l0_two_step_px"),
                                             metrics.get("ratio_two_step")))
                if cfg.picture_every and s % cfg.picture_every == 0 and s < cfg.steps:
                    run.save_picture(f"step_{s:09d}")
                if cfg.checkpoint_every and s % cfg.checkpoint_every == 0 and s < cfg.steps:
                    last_ck = run.save_checkpoint()
                if should_stop():
                    interrupted = True
                    break
        if last_ck is None or last_ck != checkpoint_path(cfg.run_dir, engine.step_index):
            last_ck = run.save_checkpoint()
        animation = None
        if engine.step_index > start_step:
            run.save_picture(f"step_{engine.step_index:09d}")
        if run.animation is not None and len(run.animation) > 1 and not interrupted:
            animation = run.animation.save(cfg.run_dir / "prediction.gif")
            if run.tracker is not None:
                run.tracker.log_artifact(animation)
        if run.tracker is not None:
            run.tracker.log_artifact(last_ck, "checkpoints")
        seconds = time.perf_counter() - t0  # training only, not the held-out score
        if not interrupted:
            heldout = _score_heldout(cfg, last_ck, run)
        status = "KILLED" if interrupted else "FINISHED"
    finally:
        if run.tracker is not None:
            run.tracker.close(status)
    rate = (engine.step_index - start_step) / max(seconds, 1e-9)
    return TrainResult(engine.step_index, interrupted, last_ck, cfg.run_dir, seconds, rate, rate * cfg.n_seq, metrics,
                       run.picture, animation, cfg.run_id, cfg.mlflow_uri, heldout)


def _score_heldout(cfg: TrainConfig, checkpoint_file: Path, run: _Run) -> dict[str, float]:
    """The final model on held-out data (``pvm-dist eval``), when a readout was trained: ``heldout_*``
    prediction errors and readout IoU and hit rate beside their chance levels, logged at the last step."""
    data = cfg.heldout_data()
    if run.readout is None or cfg.readout_from >= cfg.steps or not cfg.heldout_steps or data is None:
        return {}
    from pvm_dist.run.evaluate import evaluate

    result = evaluate(checkpoint_file, data, steps=cfg.heldout_steps, n_seq=min(cfg.n_seq, 8), data_path=cfg.data_path,
                      backend=run.engine.backend, device=cfg.device, seed=cfg.heldout_seed)
    scores = {f"heldout_{k}": v for k, v in result["metrics"].items()}
    if run.tracker is not None:
        run.tracker.log_metrics(scores, step=run.engine.step_index)
    return scores
