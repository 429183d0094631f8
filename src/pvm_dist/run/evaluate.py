"""``pvm-dist eval`` and the held-out score at the end of training: a trained model's prediction error
(and readout IoU) on data it did not train on.

The trained weights go into a frozen engine with fresh rings (so ``n_seq`` may differ from training);
a :class:`~pvm_dist.run.session.Session` runs it over the data without learning, measuring its errors
against the copy-last-frame baseline on the same frames and scoring a stored readout on labelled data.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pvm_dist.data import DataError
from pvm_dist.data.errors import recorded_data_error
from pvm_dist.model.budget import MemoryBudgetError, format_bytes, host_memory_bytes
from pvm_dist.run import state as run_state
from pvm_dist.run.config import RunConfig
from pvm_dist.run.session import Session
from pvm_dist.run.state import RunState

HELDOUT_SEQUENCES = 8  # at most this many sequences score a run's final model
# A long eval runs in blocks of about this many weight-frames (weights x sequences x steps: on the order of a second's
# work of a CPU core, or of a GPU: an H200 runs about 3e12 a second), at most EVAL_BLOCK_STEPS steps, and reports its
# progress after each. The blocks follow from the model, n_seq and the device only, not from timing, so two evals of
# one checkpoint add their error sums in the same blocks and print the same numbers.
EVAL_BLOCK_WORK = {"cpu": 2 * 10**9, "gpu": 10**12}
EVAL_BLOCK_STEPS = 10_000

#: ``progress(done, total)``: steps run so far of an eval's ``total`` (its warm-up included).
Progress = Callable[[int, int], None]


def evaluate_state(state: RunState, data: str, steps: int = 300, n_seq: int = 1, data_path: str | None = None,
                   backend: str = "auto", device: str | None = None, seed: int = 1,
                   warmup: int | None = None, progress: Progress | None = None) -> dict[str, float]:
    """Run ``steps`` frozen steps of ``state``'s model on ``data``; return named metrics.

    The first ``warmup`` steps (default 2·L: fresh rings start all ones and layer ℓ sees the frame ℓ
    steps late) run but are not scored. ``progress`` is told the steps run after each block.
    """
    return _frozen_run(state, data, steps, n_seq, data_path, backend, device, seed, warmup, progress)[0]


def eval_block(n_weights: int, n_seq: int, on_gpu: bool) -> int:
    """Steps an eval runs between progress reports (see EVAL_BLOCK_WORK)."""
    work = EVAL_BLOCK_WORK["gpu" if on_gpu else "cpu"]
    return max(1, min(EVAL_BLOCK_STEPS, work // max(1, n_weights * n_seq)))


def _frozen_run(state: RunState, data: str, steps: int, n_seq: int, data_path: str | None, backend: str,
                device: str | None, seed: int, warmup: int | None,
                progress: Progress | None = None) -> tuple[dict[str, float], str, int | None]:
    """:func:`evaluate_state`'s metrics, the backend that computed them and the data's period (None: no repeat)."""
    config = state.run.replace(data=data, data_path=data_path, n_seq=n_seq, backend=backend, device=device, seed=seed)
    session = Session(config, state, learn=False)
    warmup = 2 * config.spec.n_layers if warmup is None else warmup
    if session.readout is not None:
        _check_score_masks(config, max(warmup, steps))
    block, total, start = eval_block(session.engine.topo.n_weights, n_seq, session.on_gpu), warmup + steps, session.step

    def run(n: int) -> None:
        for first in range(0, n, block):
            session.advance(min(block, n - first))
            if progress is not None:
                progress(session.step - start, total)

    run(warmup)
    session.take_metrics(), session.take_scores()  # the transient is not scored
    run(steps)
    metrics = {k: v for k, v in session.take_metrics().items() if k not in ("steps_per_s", "frames_per_s")}
    return {**metrics, **session.take_scores()}, session.engine.backend, session.source.period


def _check_score_masks(config: RunConfig, steps: int) -> None:
    """Scoring a readout keeps every scored frame's label mask (a byte a pixel) for its chance levels: refuse a run
    whose masks cannot fit the host's memory before it starts."""
    h, w = config.spec.image_shape[:2]
    need, available = steps * config.n_seq * h * w, host_memory_bytes()
    if available is not None and need > available:
        raise MemoryBudgetError(f"scoring the readout over {steps:,} steps × {config.n_seq:,} sequences keeps a "
                                f"{w}×{h} label mask a frame: needs {format_bytes(need)}; this machine has "
                                f"{format_bytes(available)}")


def evaluate(path: Path, data: str | None = None, steps: int = 300, n_seq: int = 1, data_path: str | None = None,
             backend: str = "auto", device: str | None = None, seed: int = 1, warmup: int | None = None,
             progress: Progress | None = None) -> dict[str, Any]:
    """:func:`evaluate_state` of a checkpoint file, with what the report says about it.

    Without ``data`` the model is scored on the data its checkpoint records (synthetic data: scenes of
    ``seed``, which training did not see unless it is the training seed). ``wraps`` says how many times
    each stream went round a repeating source's frames (0: every scored frame was new to the score).
    ``progress``: as :func:`evaluate_state`'s.
    """
    state, ck = run_state.load(path)
    recorded = data is None
    if recorded:
        data, data_path = state.run.data, data_path or state.run.data_path
    warm = 2 * state.run.spec.n_layers if warmup is None else warmup
    try:
        metrics, used, period = _frozen_run(state, data, steps, n_seq, data_path, backend, device, seed, warmup, progress)
    except DataError as exc:
        raise (recorded_data_error(exc, data) if recorded else exc) from None
    return {"checkpoint": str(path), "trained_steps": ck.step, "spec": state.run.spec.name, "data": data,
            "data_from": "checkpoint" if recorded else "--data", "trained_on": state.run.data,
            "steps": steps, "warmup": warm, "n_seq": n_seq, "period": period,
            "wraps": 0 if period is None else (warm + steps - 1) // period,
            "backend": used, "metrics": metrics, "mlflow_run_id": state.run.run_id, "mlflow_uri": state.run.mlflow_uri}


def score_heldout(state: RunState, backend: str) -> dict[str, float]:
    """The final model on held-out data, when a readout was trained: ``heldout_*`` prediction errors and
    readout IoU and hit rate beside their chance levels; empty when there is nothing to score."""
    cfg = state.run
    data = cfg.heldout_data()
    if not state.readout or cfg.readout_from >= cfg.steps or not cfg.heldout_steps or data is None:
        return {}
    metrics = evaluate_state(state, data, steps=cfg.heldout_steps, n_seq=min(cfg.n_seq, HELDOUT_SEQUENCES),
                             data_path=cfg.data_path, backend=backend, device=cfg.device, seed=cfg.heldout_seed)
    return {f"heldout_{k}": v for k, v in metrics.items()}
