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

from pvm_dist.model.spec import FLOAT32_MAX, Spec, load_spec

#: The most steps a run, an eval or a bench may ask for: every integer below it is exact as a float (MLflow's
#: params and metrics, JSON readers) and as the engines' int64 step counter. (2^53 steps would take 14,000 years at
#: 20,000 steps/s: a larger count is a typo, and a train of it would never end.)
MAX_STEPS = 2**53


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
        problems = []
        for name, low, high in (("steps", 1, MAX_STEPS), ("n_seq", 1, None), ("metrics_every", 1, MAX_STEPS),
                                ("picture_every", 0, MAX_STEPS), ("animation_frames", 0, MAX_STEPS),
                                ("checkpoint_every", 0, MAX_STEPS), ("keep_checkpoints", 1, None),
                                ("keep_every", 0, MAX_STEPS), ("readout_from", 0, MAX_STEPS),
                                ("heldout_steps", 0, MAX_STEPS)):  # (a field, its least, its most: step counts)
            value = getattr(self, name)
            if value < low:
                problems.append(f"{name} must be >= {low}, got {value}")
            elif high is not None and value > high:
                problems.append(f"{name} must be <= {high:,} (2^53), got {value:,}")
        if self.readout_lr is not None and not 0 <= self.readout_lr <= FLOAT32_MAX:
            problems.append(f"readout_lr must be a number from 0 to {FLOAT32_MAX:.4g} (float32), got {self.readout_lr}")
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

    def datasets(self) -> list[dict[str, str]]:
        """The MLflow dataset input of the training data: its source and a digest of its content (or, for a
        synthetic source, of the generator's parameters), so runs on the same data can be found as such."""
        from pvm_dist.data.identity import dataset_input

        return [dataset_input(self.data, self.spec.image_shape, self.n_seq, self.seed, self.data_path)]

    def command(self) -> str:
        """The ``pvm-dist train`` command line that reproduces this run (a model-zoo spec by name, else the
        spec file it came from; every setting a run's result depends on spelled out)."""
        import shlex

        spec = self.spec.name if self.spec.source.startswith(("model_zoo", "<")) or "/model_zoo/" in self.spec.source \
            else self.spec.source.removesuffix(" with overrides")
        args = ["pvm-dist", "train", "--spec", spec, "--steps", str(self.steps), "--n-seq", str(self.n_seq),
                "--seed", str(self.seed), "--data", self.data, "--metrics-every", str(self.metrics_every)]
        args += ["--data-path", self.data_path] if self.data_path else []
        for key, value in self.overrides.items():
            args += ["-O", f"{key}={value}"]
        if not self.readout:
            args.append("--no-readout")
        else:
            args += ["--readout-from", str(self.readout_from)]
            args += ["--readout-lr", str(self.readout_lr)] if self.readout_lr is not None else []
        return shlex.join(args)

    def readout_note(self, what: str = "this run") -> str | None:
        """One line for a GPU engine that will wait on the host's readout, or None where it will not.

        The readout is numpy on the host and trains at every labelled step from ``readout_from``: on a GPU
        that, not the engine, sets the speed (an H200 trains tiny at ~550 steps/s and small at ~16 with it,
        against thousands without it), so say so before a long run starts.
        """
        if not self.readout or self.readout_from >= self.steps:
            return None
        return (f"{what} trains the readout on the host at every step from step {self.readout_from:,} (labelled "
                f"data): the GPU engine waits for it, far below its own speed; --no-readout (readout: false in "
                f"a sweep file) or a late --readout-from (readout_from) keeps the GPU busy")

    @property
    def heldout_seed(self) -> int:
        """Seed of the held-out data: synthetic scenes training never saw."""
        return self.seed + 1

    def heldout_data(self) -> str | None:
        """The data the readout is scored on at the end: ``heldout``, else synthetic scenes of another seed."""
        if self.heldout:
            return self.heldout
        return self.data if self.data.startswith("synthetic:") else None


#: What ``pvm-dist train`` runs when it is given no spec: the README's first run, the model and rates
#: ``experiments/first_run.yaml`` found to learn fastest on a 2-core CPU, for about two minutes there.
#: The readout is off: its steps each need the host, and it needs a recipe of its own (README).
FIRST_RUN = {"steps": 120_000, "metrics_every": 1000, "picture_every": 40_000, "readout": False}
FIRST_RUN_SPEC = "first"


def first_run(given: Mapping[str, Any]) -> RunConfig:
    """The first run's configuration with what was ``given`` (None: not given) applied over it."""
    return RunConfig(spec=load_spec(FIRST_RUN_SPEC), **FIRST_RUN).replace(**given)
