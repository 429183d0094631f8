"""Local training: one model, one process, checkpoints and exact resume.

A run lives in a folder: ``spec.json`` (the effective spec), ``metrics.jsonl`` (one JSON line per
metrics interval) and ``checkpoints/`` (the latest few ``step_NNNNNNNNN.pvmckpt``). SIGINT and
SIGTERM finish the current step, save a checkpoint and return, so nothing is lost on Ctrl-C.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from pvm_dist import checkpoint
from pvm_dist.data import make_source
from pvm_dist.engine import build_engine
from pvm_dist.spec import Spec, load_spec

CHECKPOINT_SUFFIX = ".pvmckpt"


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
    data: str = "synthetic:bar"
    checkpoint_every: int = 0  # 0: only at the end (and on interruption)
    keep_checkpoints: int = 2
    metrics_every: int = 50

    def meta(self) -> dict[str, Any]:
        return {"spec": self.spec.to_dict(), "spec_name": self.spec.name, "seed": self.seed, "n_seq": self.n_seq,
                "data": self.data, "backend": self.backend, "steps": self.steps}


@dataclasses.dataclass
class Progress:
    """One progress report: where training is and how fast it goes."""

    step: int
    steps: int
    steps_per_s: float
    frames_per_s: float
    error: float | None


@dataclasses.dataclass
class TrainResult:
    step: int
    interrupted: bool
    checkpoint: Path | None
    run_dir: Path
    seconds: float
    steps_per_s: float
    frames_per_s: float
    final_metrics: dict[str, Any]


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:09d}{CHECKPOINT_SUFFIX}"


def config_from_checkpoint(path: Path, steps: int | None, run_dir: Path | None) -> tuple[TrainConfig, checkpoint.Checkpoint]:
    """Rebuild the config a checkpoint was written with (its run folder unless told otherwise)."""
    ck = checkpoint.load(path)
    meta = ck.meta
    spec = load_spec(ck.spec, name=meta.get("spec_name", "spec"))
    cfg = TrainConfig(
        spec=spec, steps=steps if steps is not None else int(meta.get("steps", ck.step)),
        run_dir=run_dir or Path(path).resolve().parent.parent, n_seq=int(meta["n_seq"]), seed=int(meta["seed"]),
        backend=meta.get("backend", "auto"), data=meta.get("data", "synthetic:bar"))
    return cfg, ck


@contextmanager
def _stop_on_signals() -> Iterator[Callable[[], bool]]:
    """Turn SIGINT/SIGTERM into a flag checked between steps; restore the handlers afterwards."""
    stop = {"flag": False}

    def handler(signum: int, frame: Any) -> None:
        stop["flag"] = True

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda: stop["flag"]
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _mean_error(metrics: dict[str, Any]) -> float | None:
    if not metrics.get("steps"):
        return None
    return float(np.mean(metrics["mse_two_step"]))


def train(cfg: TrainConfig, resume: checkpoint.Checkpoint | None = None,
          on_progress: Callable[[Progress], None] | None = None) -> TrainResult:
    """Train until ``cfg.steps`` (or a stop signal), checkpointing as configured."""
    engine = build_engine(cfg.spec, backend=cfg.backend, n_seq=cfg.n_seq, seed=cfg.seed, device=cfg.device)
    if resume is not None:
        engine.load_state(resume.state)
    source = make_source(cfg.data, cfg.spec.image_shape, cfg.n_seq, cfg.seed)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    (cfg.run_dir / "spec.json").write_text(json.dumps({"name": cfg.spec.name, **cfg.spec.to_dict()}, indent=2) + "\n")
    start_step, t0 = engine.step_index, time.perf_counter()
    last_ck: Path | None = None
    interrupted = False
    metrics: dict[str, Any] = {}
    with _stop_on_signals() as should_stop, open(cfg.run_dir / "metrics.jsonl", "a") as log:
        while engine.step_index < cfg.steps:
            engine.step(source.frames(engine.step_index))
            s = engine.step_index
            if s % cfg.metrics_every == 0 or s == cfg.steps:
                metrics = engine.metrics()
                rate = (s - start_step) / max(time.perf_counter() - t0, 1e-9)
                log.write(json.dumps({"step": s, "steps_per_s": rate, "frames_per_s": rate * cfg.n_seq,
                                      "mse_two_step": _as_list(metrics.get("mse_two_step")),
                                      "mse_one_step": _as_list(metrics.get("mse_one_step"))}) + "\n")
                log.flush()
                if on_progress:
                    on_progress(Progress(s, cfg.steps, rate, rate * cfg.n_seq, _mean_error(metrics)))
            if cfg.checkpoint_every and s % cfg.checkpoint_every == 0 and s < cfg.steps:
                last_ck = _save(engine, cfg)
            if should_stop():
                interrupted = True
                break
    if last_ck is None or last_ck != checkpoint_path(cfg.run_dir, engine.step_index):
        last_ck = _save(engine, cfg)
    seconds = time.perf_counter() - t0
    rate = (engine.step_index - start_step) / max(seconds, 1e-9)
    return TrainResult(engine.step_index, interrupted, last_ck, cfg.run_dir, seconds, rate, rate * cfg.n_seq, metrics)


def _as_list(x: Any) -> Any:
    return None if x is None else [None if not np.isfinite(v) else float(v) for v in np.asarray(x)]


def _save(engine: Any, cfg: TrainConfig) -> Path:
    """Write a checkpoint atomically, then drop all but the newest ``keep_checkpoints``."""
    path = checkpoint.save(checkpoint_path(cfg.run_dir, engine.step_index), engine.state(), cfg.meta())
    existing = sorted((cfg.run_dir / "checkpoints").glob(f"step_*{CHECKPOINT_SUFFIX}"))
    for old in existing[: -max(cfg.keep_checkpoints, 1)]:
        old.unlink(missing_ok=True)
    return path
