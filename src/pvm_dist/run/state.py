"""A run's state, nested as ``{engine, readout, run, metrics}``, and its checkpoint files.

In a file the engine's, the readout's and the metric accumulators' arrays sit side by side (the
readout's names start with ``readout_``, the accumulators' with ``metrics_``) and the run configuration
is the header's meta, so checkpoints of earlier releases, whose meta held the same fields flat and
which kept no accumulators, load unchanged.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pvm_dist.io import checkpoint
from pvm_dist.run.config import RunConfig

READOUT_PREFIX = "readout_"  # how a readout's arrays are told from the engine's in a file
METRICS_PREFIX = "metrics_"  # ... and the metrics interval's sums under way at the checkpoint


@dataclasses.dataclass
class RunState:
    """Everything a run continues from: engine arrays, readout arrays (empty without one), the config, and
    the metrics interval under way (:meth:`pvm_dist.run.session.Session.state`; empty in older checkpoints)."""

    engine: dict[str, Any]
    readout: dict[str, Any]
    run: RunConfig
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def step(self) -> int:
        return int(self.engine["step"])

    def to_dict(self) -> dict[str, Any]:
        """Arrays and plain values only (what crosses Ray's object store)."""
        return {"engine": self.engine, "readout": self.readout, "run": self.run.to_dict(), "metrics": self.metrics}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunState:
        return cls(dict(d["engine"]), dict(d.get("readout") or {}), RunConfig.from_dict(d["run"]),
                   dict(d.get("metrics") or {}))


#: Checkpoints of a run past this many bytes in all get their disk use announced before the run starts.
LARGE_DISK_BYTES = 2**30


def checkpoint_bytes(config: RunConfig) -> int:
    """About how large one checkpoint of ``config`` is: weights and momentum (fp32), each sequence's unit
    state, and the readout's weights and momentum when it trains one (within a few % of the files)."""
    from pvm_dist.model.topology import build_topology

    t = build_topology(config.spec)
    readout = 8 * t.readout_weights if config.readout is not False else 0
    background = 16 * config.n_seq * int(np.prod(config.spec.image_shape))  # its two running means, float64
    return 8 * t.n_weights + 12 * config.n_seq * (t.x_total + t.y_total) + readout + background


def disk_note(config: RunConfig, kept: int, runs: int, where: str) -> str | None:
    """One line on the disk ``runs`` runs keeping ``kept`` checkpoints each will take, when that is large."""
    total = checkpoint_bytes(config) * kept * runs
    if total < LARGE_DISK_BYTES:
        return None
    each = f"{runs} runs × " if runs > 1 else ""
    return (f"checkpoints will take up to {total / 1e9:.1f} GB under {where} ({each}{kept} kept × "
            f"{checkpoint_bytes(config) / 1e6:,.0f} MB)")


def save(path: str | os.PathLike[str], state: RunState, extra: Mapping[str, Any] | None = None) -> Path:
    """Write ``state`` atomically to ``path`` (see :func:`pvm_dist.io.checkpoint.save`); ``extra`` goes into the meta."""
    meta = {**state.run.to_dict(), **(extra or {})}
    accumulators = {METRICS_PREFIX + k: v for k, v in state.metrics.items()}
    return checkpoint.save(path, {**state.engine, **state.readout, **accumulators}, meta)


def load(path: str | os.PathLike[str]) -> tuple[RunState, checkpoint.Checkpoint]:
    """Read a checkpoint as a RunState (CheckpointError names any damage), and the file's header."""
    ck = checkpoint.load(path)
    _check_finite(path, ck)
    engine = {k: v for k, v in ck.state.items() if not k.startswith((READOUT_PREFIX, METRICS_PREFIX))}
    readout = {k: v for k, v in ck.state.items() if k.startswith(READOUT_PREFIX)}
    metrics = {k[len(METRICS_PREFIX):]: v for k, v in ck.state.items() if k.startswith(METRICS_PREFIX)}
    meta = {"seed": ck.seed or 0, **ck.meta, "spec": ck.spec}
    meta.setdefault("steps", ck.step)
    return RunState(engine, readout, RunConfig.from_dict(meta), metrics), ck


def _check_finite(path: str | os.PathLike[str], ck: checkpoint.Checkpoint) -> None:
    """A diverged model (NaN or Inf in its weights, momentum or readout) is refused: evaluating it reports
    nothing, and resuming it trains nothing."""
    for name, value in ck.state.items():
        if name.endswith("_ring"):  # rings are activations, rebuilt from weights every step
            continue
        arr = np.asarray(value)
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise checkpoint.CheckpointError(path, f"'{name}' holds NaN or Inf: the run had diverged by step "
                                                   f"{ck.step:,}; it cannot be evaluated or resumed")
