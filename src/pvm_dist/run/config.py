"""One run configuration for ``train``, ``eval`` and sweep trials: what to train, on what, how often to
measure and keep it, and where it is tracked.

Its defaults live here and nowhere else. It is serialized from its own fields (:meth:`RunConfig.to_dict`)
and stored whole in every checkpoint, so a resume continues with the checkpointed data, cadence and
tracking unless it is told otherwise (:meth:`RunConfig.replace` with only what was given).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pvm_dist.model.spec import Spec, load_spec


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything that defines one run of one model (see the module docstring)."""

    spec: Spec
    steps: int = 1000  # the step to reach, also on resume
    n_seq: int = 1
    seed: int = 0
    data: str = "synthetic:balls"
    data_path: str | None = None
    backend: str = "auto"
    device: str | None = None  # native engine: "cpu", "cuda", "cuda:N" (default: a GPU if visible)
    overrides: Mapping[str, str] = dataclasses.field(default_factory=dict)  # already applied to ``spec``
    metrics_every: int = 50
    picture_every: int = 500  # 0: only at the end
    animation_frames: int = 100  # the last steps of a run, as an animation of input | prediction (0: none)
    checkpoint_every: int = 0  # 0: only at the end (and on interruption)
    keep_checkpoints: int = 2  # the newest few are kept ...
    keep_every: int = 0  # ... and every checkpoint whose step is a multiple of this (0: none)
    readout: bool = True  # train a heatmap readout when the data has labels
    readout_from: int = 0  # ... from this step on
    readout_lr: float | None = None  # None: the original's readout schedule (§4)
    heldout: str | None = None  # data scoring the readout at the end (None: synthetic data of another seed)
    heldout_steps: int = 300  # frames per sequence of that score (0: none)
    track: bool = True
    mlflow_uri: str | None = None
    experiment: str = "pvm-dist"
    run_name: str | None = None
    run_id: str | None = None  # the MLflow run this run logs to (set once it exists)
    run_key: str | None = None  # tags that run from its start, so a resume finds it before its id is known

    def __post_init__(self) -> None:
        problems = [f"{name} must be >= {low}, got {getattr(self, name)}" for name, low in
                    (("steps", 1), ("n_seq", 1), ("metrics_every", 1), ("picture_every", 0), ("animation_frames", 0),
                     ("checkpoint_every", 0), ("keep_checkpoints", 1), ("keep_every", 0), ("readout_from", 0),
                     ("heldout_steps", 0)) if getattr(self, name) < low]
        if self.readout_lr is not None and self.readout_lr < 0:
            problems.append(f"readout_lr must be >= 0, got {self.readout_lr}")
        if problems:
            raise ValueError("; ".join(problems))

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with ``changes`` applied; keys whose value is None are left as they are."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    # --- serialization ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-able: every field, the spec as its effective values plus its name."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = dict(value) if isinstance(value, Mapping) else value
        out["spec"] = self.spec.to_dict()
        out["spec_name"] = self.spec.name
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunConfig:
        """Rebuild from :meth:`to_dict` (or a checkpoint of an earlier release); unknown keys are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in d.items() if k in names and v is not None}
        values["spec"] = load_spec(d["spec"], name=d.get("spec_name") or "spec")
        return cls(**values)

    # --- what follows from the fields -------------------------------------------------------------
    def params(self) -> dict[str, Any]:
        """MLflow params: every effective spec value, the overrides, and how the run was set up."""
        return {"spec": self.spec.to_dict(), "spec_name": self.spec.name, "overrides": dict(self.overrides) or "none",
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
