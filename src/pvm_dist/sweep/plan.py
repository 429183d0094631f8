"""Sweep files: what a distributed sweep trains, and the exact trials it plans (architecture.md §5).

A sweep file is YAML (``experiments/*.yaml``). It names the base spec(s), the values to vary (grids
and random distributions), the metric and its direction, the steps per trial and how often to
checkpoint, the data and the resources. :func:`load_sweep` checks all of it in one pass and raises
one :class:`SweepError` listing every problem, each naming its key; it also builds every planned
trial's spec, so a value the model rejects is reported before any GPU is claimed.
:meth:`SweepSpec.plan` is deterministic: the same file always gives the same trials, which is what
lets a resumed sweep match its journal.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from pvm_dist.engine import BACKENDS
from pvm_dist.model.spec import FIELDS, Spec, SpecError, load_spec
from pvm_dist.run.config import RunConfig
from pvm_dist.run.metrics import LAYER_METRIC, METRICS, SPEED_METRICS

DEFAULT_METRIC = "ratio_two_step"
RANDOM_KINDS = ("uniform", "loguniform", "randint", "choice")
SEED_PARAM = "seed"
#: Run settings a sweep file may give (every trial's RunConfig; pvm_dist.run.config has their meaning).
RUN_KEYS = ("steps", "checkpoint_every", "keep_checkpoints", "metrics_every", "picture_every", "n_seq", "data", "data_path", "backend",
            "device", "readout", "readout_from", "readout_lr", "heldout", "heldout_steps", "animation_frames")
TOP_KEYS = ("name", "description", "spec", "vary", "samples", "seed", "overrides", "metric", "mode", *RUN_KEYS,
            "resources", "max_failures", "max_concurrent", "early_stopping")
_RESOURCE_KEYS = ("gpus_per_actor", "trials_per_gpu", "cpus_per_actor", "cpu_workers")
_EARLY_STOPPING_KEYS = ("type", "grace_steps", "reduction_factor")
_SIGNIFICANT_DIGITS = 6


class SweepError(ValueError):
    """An invalid sweep file; ``problems`` lists every problem found, each naming its key."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source, self.problems = source, list(problems)
        if len(self.problems) == 1:
            message = f"{source}: {self.problems[0]}"
        else:
            lines = [f"{source}: {len(self.problems)} problems", *(f"  - {p}" for p in self.problems)]
            message = "\n".join(lines)
        super().__init__(message)


@dataclasses.dataclass(frozen=True)
class Distribution:
    """How one parameter varies: ``grid``/``choice`` hold the values, the others ``(lo, hi)``."""

    kind: str
    values: tuple

    @property
    def is_random(self) -> bool:
        return self.kind != "grid"

    def draw(self, rng: np.random.Generator) -> Any:
        """One random value; floats rounded to 6 significant digits so they print and round-trip."""
        if self.kind == "choice":
            return self.values[int(rng.integers(len(self.values)))]
        lo, hi = self.values
        if self.kind == "randint":
            return int(rng.integers(lo, hi + 1))
        if self.kind == "uniform":
            x = float(rng.uniform(lo, hi))
        else:
            x = math.exp(float(rng.uniform(math.log(lo), math.log(hi))))
        return min(max(float(f"{x:.{_SIGNIFICANT_DIGITS}g}"), lo), hi)

    def to_raw(self) -> Any:
        """The sweep-file form: a list for a grid, ``{kind: [...]}`` for the rest."""
        return list(self.values) if self.kind == "grid" else {self.kind: list(self.values)}


@dataclasses.dataclass(frozen=True)
class Resources:
    """What one worker actor claims (one worker runs one trial at a time).

    ``gpus_per_actor`` (or ``trials_per_gpu``, its inverse) given: the sweep asks for GPUs and never runs on
    CPU workers; neither given: GPU workers where the cluster has GPUs when the sweep starts, else CPU
    workers. ``cpu_workers`` sizes a GPU-less pool (None: the cluster's CPUs / ``cpus_per_actor``).
    """

    gpus_per_actor: float | None = None
    cpus_per_actor: float = 1.0
    cpu_workers: int | None = None

    @property
    def wants_gpu(self) -> bool:
        """Whether the sweep file asked for GPUs (then a GPU-less pool is an error, not a fallback)."""
        return self.gpus_per_actor is not None


@dataclasses.dataclass(frozen=True)
class EarlyStopping:
    """ASHA: trials are compared at ``grace_steps · reduction_factor^k`` steps (see dist/asha.py)."""

    grace_steps: int
    reduction_factor: int

    def milestones(self, steps: int) -> list[int]:
        """The comparison points before the end of a ``steps``-long trial."""
        out, milestone = [], self.grace_steps
        while milestone < steps:
            out.append(milestone)
            milestone *= self.reduction_factor
        return out


@dataclasses.dataclass(frozen=True)
class Trial:
    """One planned training run: a spec, its overrides (fixed and varied) and its seed."""

    trial_id: str
    spec: str
    overrides: dict[str, Any]
    seed: int
    varied: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"trial_id": self.trial_id, "spec": self.spec, "overrides": dict(self.overrides),
                "seed": self.seed, "varied": dict(self.varied)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Trial:
        return cls(trial_id=str(d["trial_id"]), spec=str(d["spec"]), overrides=dict(d["overrides"]),
                   seed=int(d["seed"]), varied=dict(d["varied"]))


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """A validated sweep file. ``specs`` hold zoo names as written and spec files as absolute paths;
    ``run`` holds the run settings every trial shares (its spec is the first spec's, replaced per trial)."""

    name: str
    source: str
    specs: tuple[str, ...]
    vary: dict[str, Distribution]
    samples: int
    seed: int
    overrides: dict[str, Any]
    metric: str
    mode: str
    run: RunConfig
    resources: Resources
    max_failures: int
    max_concurrent: int | None
    early_stopping: EarlyStopping | None
    description: str = ""

    def plan(self) -> list[Trial]:
        """Every trial, in a fixed order: spec, then grid point (file order), then sample.

        Random values come from one ``default_rng(seed)`` drawn in that order, parameters in file
        order, so the same sweep always plans the same trials.
        """
        grid = [(k, d) for k, d in self.vary.items() if not d.is_random]
        random = [(k, d) for k, d in self.vary.items() if d.is_random]
        points = list(itertools.product(*(d.values for _, d in grid)))
        rng = np.random.default_rng(self.seed)
        width = max(3, len(str(len(self.specs) * len(points) * self.samples - 1)))
        trials: list[Trial] = []
        for spec in self.specs:
            for point in points:
                for _ in range(self.samples):
                    values = dict(zip((k for k, _ in grid), point))
                    values.update((k, d.draw(rng)) for k, d in random)
                    varied = {k: values[k] for k in self.vary}
                    overrides = {**self.overrides, **{k: v for k, v in varied.items() if k != SEED_PARAM}}
                    if len(self.specs) > 1:
                        varied = {"spec": spec, **varied}
                    trials.append(Trial(trial_id=f"t{len(trials):0{width}d}", spec=spec, overrides=overrides,
                                        seed=int(values.get(SEED_PARAM, self.seed)), varied=varied))
        return trials

    @property
    def steps(self) -> int:
        """The steps every trial trains."""
        return self.run.steps

    def trial_config(self, trial: Trial) -> RunConfig:
        """The run configuration of one trial: the shared settings, its spec, overrides and seed."""
        spec = load_spec(trial.spec).with_overrides(trial.overrides)
        return dataclasses.replace(self.run, spec=spec, seed=trial.seed, run_name=trial.trial_id,
                                   overrides={k: str(v) for k, v in trial.overrides.items()})

    def to_dict(self) -> dict[str, Any]:
        """A plain JSON-able sweep mapping; :func:`load_sweep` takes it back and plans the same trials."""
        es = self.early_stopping
        return {
            "name": self.name, "description": self.description,
            "spec": self.specs[0] if len(self.specs) == 1 else list(self.specs),
            "vary": {k: d.to_raw() for k, d in self.vary.items()},
            "samples": self.samples, "seed": self.seed, "overrides": dict(self.overrides),
            "metric": {"name": self.metric, "mode": self.mode},
            **{key: getattr(self.run, key) for key in RUN_KEYS},
            "resources": dataclasses.asdict(self.resources),
            "max_failures": self.max_failures, "max_concurrent": self.max_concurrent,
            "early_stopping": None if es is None else {"type": "asha", "grace_steps": es.grace_steps,
                                                       "reduction_factor": es.reduction_factor},
        }

    def better(self, a: float, b: float) -> bool:
        """Whether metric value ``a`` is strictly better than ``b``; NaN is worse than any number."""
        if math.isnan(a):
            return False
        if math.isnan(b):
            return True
        return a < b if self.mode == "min" else a > b


# ---------------------------------------------------------------------------------------------
# Loading


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``1e-4`` as a float (YAML 1.1 wants ``1.0e-4``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+|\.[0-9_]+[eE][-+]?[0-9]+)$"),
    list("-+0123456789."),
)


def load_sweep(source: str | Path | Mapping[str, Any], base_dir: Path | None = None) -> SweepSpec:
    """Read, check and return a sweep from a YAML file or a mapping; raise :class:`SweepError`.

    Relative spec paths resolve against ``base_dir`` (default: the sweep file's folder), then the
    working directory, then as model-zoo names.
    """
    if isinstance(source, Mapping):
        name = source.get("name")
        label = f"sweep '{name}'" if isinstance(name, str) else "sweep"
        return _parse(source, label, "sweep", base_dir)
    path = Path(source)
    return _parse(_read_yaml(path), str(path), path.stem, path.parent if base_dir is None else base_dir)


def _read_yaml(path: Path) -> Any:
    if not path.exists():
        raise SweepError(str(path), ["no such sweep file"])
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SweepError(str(path), [f"cannot be read ({exc.strerror or exc})"]) from None
    except UnicodeDecodeError:
        raise SweepError(str(path), ["is not a UTF-8 text file"]) from None
    try:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: no Python objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SweepError(str(path), [f"is not valid YAML ({problem}{where})"]) from None


class _Checker:
    """Collects every problem of one sweep, each prefixed by the key it is about."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, key: str, problem: str) -> None:
        self.problems.append(f"{key}: {problem}")

    def integer(self, key: str, value: Any, minimum: int) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.add(key, f"must be an integer of at least {minimum}, got {value!r}")
            return None
        return value

    def optional_integer(self, key: str, value: Any, minimum: int) -> int | None:
        return None if value is None else self.integer(key, value, minimum)

    def positive_number(self, key: str, value: Any) -> float | None:
        if not _is_number(value) or value <= 0:
            self.add(key, f"must be a number greater than 0, got {value!r}")
            return None
        return float(value)

    def text(self, key: str, value: Any, allow_empty: bool = False) -> str | None:
        if not isinstance(value, str) or not (value or allow_empty):
            self.add(key, f"must be a{'' if allow_empty else ' non-empty'} string, got {value!r}")
            return None
        return value

    def known_keys(self, prefix: str, raw: Mapping[str, Any], known: tuple[str, ...]) -> None:
        for key in raw:
            if key not in known:
                self.add(f"{prefix}{key}", f"unknown key{_did_you_mean(str(key), known)}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _did_you_mean(word: str, known: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(word, known, n=3, cutoff=0.6)
    return f" (did you mean: {', '.join(close)}?)" if close else ""


def _plain(value: Any) -> Any:
    """JSON-able Python values: numpy scalars unwrapped, tuples as lists."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _parse(raw: Any, label: str, default_name: str, base_dir: Path | None) -> SweepSpec:
    """Check every key, then every planned trial's spec; one :class:`SweepError` for all problems."""
    if raw is None:
        raise SweepError(label, ["is empty; a sweep needs at least spec and steps"])
    if not isinstance(raw, Mapping):
        raise SweepError(label, [f"the top level must be a mapping of sweep keys, got {type(raw).__name__}"])
    c = _Checker()
    c.known_keys("", raw, TOP_KEYS)
    name = c.text("name", raw.get("name", default_name))
    description = c.text("description", raw.get("description", ""), allow_empty=True)
    specs, bases = _specs(c, raw.get("spec"), base_dir)
    vary = _vary(c, raw.get("vary"))
    samples = c.integer("samples", raw.get("samples", 1), 1)
    if samples is not None and samples > 1 and not any(d.is_random for d in vary.values()):
        c.problems.append(f"samples > 1 needs a random distribution in vary ({', '.join(RANDOM_KINDS)})")
    seed = c.integer("seed", raw.get("seed", 0), 0)
    overrides = _overrides(c, raw.get("overrides"))
    metric, mode = _metric(c, raw)
    steps = None
    if "steps" in raw:
        steps = c.integer("steps", raw["steps"], 1)
    else:
        c.add("steps", "is required (the steps each trial trains)")
    checkpoint_every = _at_most(c, "checkpoint_every", raw.get("checkpoint_every"),
                                None if steps is None else max(steps // 4, 1), steps, "steps")
    metrics_every = _at_most(c, "metrics_every", raw.get("metrics_every"),
                             None if checkpoint_every is None else min(100, checkpoint_every),
                             checkpoint_every, "checkpoint_every")
    run = _run_config(c, raw, bases, steps, checkpoint_every, metrics_every)
    resources = _resources(c, raw.get("resources"))
    max_failures = c.integer("max_failures", raw.get("max_failures", 3), 0)
    max_concurrent = c.optional_integer("max_concurrent", raw.get("max_concurrent"), 1)
    early_stopping = _early_stopping(c, raw.get("early_stopping"), steps, checkpoint_every)
    if c.problems:
        raise SweepError(label, c.problems)
    sweep = SweepSpec(
        name=name, source=label, specs=specs, vary=vary, samples=samples, seed=seed, overrides=overrides,
        metric=metric, mode=mode, run=run, resources=resources,
        max_failures=max_failures, max_concurrent=max_concurrent, early_stopping=early_stopping,
        description=description,
    )
    problems = _trial_problems(sweep, bases)
    if problems:
        raise SweepError(label, problems)
    return sweep


def _run_config(c: _Checker, raw: Mapping[str, Any], bases: Mapping[str, Spec], steps: int | None,
                checkpoint_every: int | None, metrics_every: int | None) -> RunConfig | None:
    """The run settings every trial shares; RunConfig's defaults for what the file leaves out."""
    values: dict[str, Any] = {"steps": steps, "checkpoint_every": checkpoint_every, "metrics_every": metrics_every}
    for key in ("n_seq", "keep_checkpoints", "picture_every", "readout_from", "heldout_steps", "animation_frames"):
        if key in raw:
            values[key] = c.integer(key, raw[key], 1 if key in ("n_seq", "keep_checkpoints") else 0)
    for key in ("data", "data_path", "heldout", "device"):
        if raw.get(key) is not None:
            values[key] = c.text(key, raw[key])
    if "readout" in raw and not isinstance(raw["readout"], bool):
        c.add("readout", f"must be true or false, got {raw['readout']!r}")
    values["readout"] = raw.get("readout")
    if raw.get("readout_lr") is not None:
        values["readout_lr"] = c.positive_number("readout_lr", raw["readout_lr"])
    backend = raw.get("backend", "auto")
    if backend not in BACKENDS:
        c.add("backend", f"must be one of {', '.join(BACKENDS)}, got {backend!r}")
    values["backend"] = backend
    if c.problems or not bases:
        return None
    return RunConfig(spec=next(iter(bases.values())), track=False).replace(**values)


def _specs(c: _Checker, raw: Any, base_dir: Path | None) -> tuple[tuple[str, ...], dict[str, Spec]]:
    """The specs to train (files resolved to absolute paths) and each one's loaded :class:`Spec`."""
    if raw is None:
        c.add("spec", "is required (a model-zoo name such as small, a spec file, or a list of them)")
        return (), {}
    entries = raw if isinstance(raw, list) else [raw]
    if not entries:
        c.add("spec", "the list of specs is empty")
    specs: list[str] = []
    bases: dict[str, Spec] = {}
    for entry in entries:
        if not isinstance(entry, str) or not entry:
            c.add("spec", f"must be a model-zoo name or a spec file path, got {entry!r}")
            continue
        resolved = _resolve_spec(entry, base_dir)
        if resolved in bases:
            c.add("spec", f"'{entry}' is listed twice")
            continue
        try:
            bases[resolved] = load_spec(resolved)
        except SpecError as exc:
            reason = f"key '{exc.key}': {exc.problem}" if exc.key else exc.problem
            c.add(f"spec '{entry}'", reason)
            continue
        except OSError as exc:
            c.add(f"spec '{entry}'", str(exc))
            continue
        specs.append(resolved)
    return tuple(specs), bases


def _resolve_spec(entry: str, base_dir: Path | None) -> str:
    """A spec file as an absolute path (sweep folder first, then the working directory); else as written."""
    path = Path(entry).expanduser()
    candidates = [path] if path.is_absolute() or base_dir is None else [base_dir / path, path]
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate.resolve())
    return entry


def _vary(c: _Checker, raw: Any) -> dict[str, Distribution]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        c.add("vary", f"must be a mapping of parameter to values, got {raw!r}")
        return {}
    out: dict[str, Distribution] = {}
    known = [*FIELDS, SEED_PARAM]
    for param, value in raw.items():
        key = f"vary.{param}"
        if param not in known:
            c.add(key, f"is not a spec key or '{SEED_PARAM}'{_did_you_mean(str(param), known)}")
            continue
        dist = _distribution(c, key, value)
        if dist is not None and (param != SEED_PARAM or _seed_distribution_ok(c, key, dist)):
            out[param] = dist
    return out


def _distribution(c: _Checker, key: str, value: Any) -> Distribution | None:
    if isinstance(value, list):
        if not value:
            c.add(key, "the list of values is empty")
            return None
        values = tuple(_plain(v) for v in value)
        repeated = [v for i, v in enumerate(values) if v in values[:i]]
        if repeated:
            c.add(key, f"{repeated[0]!r} is listed twice (each grid value runs once)")
            return None
        return Distribution("grid", values)
    if not (isinstance(value, Mapping) and len(value) == 1):
        c.add(key, f"must be a list of values or a one-key mapping such as {{uniform: [lo, hi]}}, got {value!r}")
        return None
    ((kind, args),) = value.items()
    if kind not in RANDOM_KINDS:
        c.add(key, f"unknown distribution {kind!r}; known: {', '.join(RANDOM_KINDS)}{_did_you_mean(str(kind), RANDOM_KINDS)}")
        return None
    if kind == "choice":
        if not isinstance(args, list) or not args:
            c.add(key, f"choice needs a non-empty list of values, got {args!r}")
            return None
        return Distribution("choice", tuple(_plain(v) for v in args))
    if not isinstance(args, list) or len(args) != 2:
        c.add(key, f"{kind} needs [lo, hi], got {args!r}")
        return None
    lo, hi = args
    if kind == "randint":
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in args):
            c.add(key, f"randint needs integer bounds [lo, hi], got {args!r}")
            return None
        if lo > hi:
            c.add(key, f"randint needs lo <= hi, got {args!r}")
            return None
        return Distribution(kind, (lo, hi))
    if not (_is_number(lo) and _is_number(hi)):
        c.add(key, f"{kind} needs numeric bounds [lo, hi], got {args!r}")
        return None
    if lo >= hi:
        c.add(key, f"{kind} needs lo < hi, got {args!r}")
        return None
    if kind == "loguniform" and lo <= 0:
        c.add(key, f"loguniform needs lo > 0, got {args!r}")
        return None
    return Distribution(kind, (float(lo), float(hi)))


def _seed_distribution_ok(c: _Checker, key: str, dist: Distribution) -> bool:
    """Seeds are non-negative integers: a grid, randint or choice of them."""
    if dist.kind in ("uniform", "loguniform"):
        c.add(key, "seeds are integers: use a list, randint or choice")
        return False
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in dist.values):
        c.add(key, f"seeds must be non-negative integers, got {list(dist.values)!r}")
        return False
    return True


def _overrides(c: _Checker, raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        c.add("overrides", f"must be a mapping of spec key to value, got {raw!r}")
        return {}
    for key in raw:
        if key == SEED_PARAM:
            c.add("overrides.seed", "the seed is not a spec key: set the top-level seed, or vary seed")
        elif key not in FIELDS:
            c.add(f"overrides.{key}", f"is not a spec key{_did_you_mean(str(key), list(FIELDS))}")
    return {str(k): _plain(v) for k, v in raw.items()}


def _metric(c: _Checker, raw: Mapping[str, Any]) -> tuple[str, str]:
    """The metric name and mode, from ``metric: name`` (+ ``mode:``) or ``metric: {name, mode}``."""
    metric = raw.get("metric", DEFAULT_METRIC)
    mode, mode_key = raw.get("mode"), "mode"
    if isinstance(metric, Mapping):
        c.known_keys("metric.", metric, ("name", "mode"))
        if "mode" in raw:
            c.add("mode", "give the mode once: as metric.mode, or as mode beside a metric name")
        mode, mode_key = metric.get("mode"), "metric.mode"
        metric = metric.get("name", DEFAULT_METRIC)
    if not isinstance(metric, str):
        c.add("metric", f"must be a metric name or a mapping {{name: ..., mode: min|max}}, got {metric!r}")
    elif not (metric in METRICS or LAYER_METRIC.fullmatch(metric)):
        c.add("metric", f"unknown metric {metric!r}{_did_you_mean(metric, METRICS)}; known: {', '.join(METRICS)}, "
                        "layerN_mse_two_step, layerN_mse_one_step")
    if mode is None:
        mode = "max" if isinstance(metric, str) and metric in SPEED_METRICS else "min"
    elif mode not in ("min", "max"):
        c.add(mode_key, f"must be min or max, got {mode!r}")
    return metric, mode


def _at_most(c: _Checker, key: str, value: Any, default: int | None, limit: int | None, limit_key: str) -> int | None:
    """An interval of at least 1 and at most ``limit`` (another interval); ``default`` if absent."""
    if value is None:
        return default
    n = c.integer(key, value, 1)
    if n is not None and limit is not None and n > limit:
        c.add(key, f"{n} is more than {limit_key} ({limit})")
        return None
    return n


def _resources(c: _Checker, raw: Any) -> Resources:
    if raw is None:
        return Resources()
    if not isinstance(raw, Mapping):
        c.add("resources", f"must be a mapping ({', '.join(_RESOURCE_KEYS)}), got {raw!r}")
        return Resources()
    c.known_keys("resources.", raw, _RESOURCE_KEYS)
    gpus = raw.get("gpus_per_actor")
    if gpus is not None:
        gpus = c.positive_number("resources.gpus_per_actor", gpus)
        if gpus is not None and gpus > 1 and gpus != int(gpus):
            c.add("resources.gpus_per_actor", f"above 1 must be a whole number of GPUs, got {gpus:g}")
    if raw.get("trials_per_gpu") is not None:
        per_gpu = c.integer("resources.trials_per_gpu", raw["trials_per_gpu"], 1)
        if "gpus_per_actor" in raw:
            c.add("resources.trials_per_gpu", "give either trials_per_gpu or gpus_per_actor, not both")
        elif per_gpu is not None:
            gpus = 1.0 / per_gpu
    return Resources(
        gpus_per_actor=gpus,
        cpus_per_actor=c.positive_number("resources.cpus_per_actor", raw.get("cpus_per_actor", 1.0)),
        cpu_workers=c.optional_integer("resources.cpu_workers", raw.get("cpu_workers"), 1),
    )


def _early_stopping(c: _Checker, raw: Any, steps: int | None, checkpoint_every: int | None) -> EarlyStopping | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        c.add("early_stopping", f"must be a mapping such as {{type: asha, grace_steps: 1000}}, got {raw!r}")
        return None
    c.known_keys("early_stopping.", raw, _EARLY_STOPPING_KEYS)
    if raw.get("type", "asha") != "asha":
        c.add("early_stopping.type", f"unknown type {raw['type']!r}; known: asha")
    grace = _at_most(c, "early_stopping.grace_steps", raw.get("grace_steps"), checkpoint_every, steps, "steps")
    factor = c.integer("early_stopping.reduction_factor", raw.get("reduction_factor", 2), 2)
    if grace is None or factor is None:
        return None
    return EarlyStopping(grace_steps=grace, reduction_factor=factor)


def _trial_problems(sweep: SweepSpec, bases: Mapping[str, Spec]) -> list[str]:
    """Build every planned trial's spec; each distinct rejection once, with the trials it hits."""
    hits: dict[str, list[str]] = {}
    for trial in sweep.plan():
        try:
            bases[trial.spec].with_overrides(trial.overrides)
        except SpecError as exc:
            if exc.key in sweep.vary:
                where = f"vary.{exc.key}"
            elif exc.key in sweep.overrides:
                where = f"overrides.{exc.key}"
            else:
                where = f"spec '{trial.spec}' with {trial.varied}: key '{exc.key}'"
            hits.setdefault(f"{where}: {exc.problem}", []).append(trial.trial_id)
    problems = []
    for problem, ids in hits.items():
        shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        problems.append(f"{problem} (trial{'s' if len(ids) > 1 else ''} {shown})")
    return problems
