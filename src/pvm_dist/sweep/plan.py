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
import importlib.util
import itertools
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pvm_dist.data.errors import DataError
from pvm_dist.data.loader import data_entries
from pvm_dist.engine import BACKENDS
from pvm_dist.engine.budget import check_engine
from pvm_dist.model.budget import MemoryBudgetError, check_graph
from pvm_dist.model.topology import build_topology
from pvm_dist.model.safe_load import TextFormatError, parse_yaml, read_text
from pvm_dist.model.spec import FIELDS, Spec, SpecError, load_spec
from pvm_dist.run.config import RunConfig
from pvm_dist.run.metrics import LAYER_METRIC, METRICS, SPEED_METRICS

DEFAULT_METRIC = "ratio_two_step"
#: The most trials one sweep plans; counted before any trial is built (a grid multiplies fast).
MAX_TRIALS = 10_000
#: A trial's engine must fit in this much memory: more than any one GPU or host a worker runs on (the
#: worker checks its own device again before allocating).
MAX_TRIAL_BYTES = 2 << 40
RANDOM_KINDS = ("uniform", "loguniform", "randint", "choice")
SEED_PARAM = "seed"
#: Run settings a sweep file may give (every trial's RunConfig; pvm_dist.run.config has their meaning).
RUN_KEYS = ("steps", "checkpoint_every", "keep_checkpoints", "metrics_every", "picture_every", "n_seq", "data", "data_path", "backend",
            "device", "readout", "readout_from", "readout_lr", "heldout", "heldout_steps", "animation_frames")
#: Run settings that may also vary per trial, like spec keys.
VARIED_RUN_KEYS = ("n_seq", "data", "steps")
TOP_KEYS = ("name", "description", "spec", "vary", "samples", "seed", "overrides", "metric", "mode", *RUN_KEYS,
            "frames", "resources", "max_failures", "max_concurrent", "early_stopping", "search")
_RESOURCE_KEYS = ("gpus_per_actor", "trials_per_gpu", "cpus_per_actor", "cpu_workers")
_EARLY_STOPPING_KEYS = ("type", "grace_steps", "reduction_factor")
#: Search types: adaptive ones ask Optuna for each trial as a worker frees up; the others plan every trial up front
#: (pbt: its population, whose members then copy each other's checkpoints).
ADAPTIVE_SEARCHES = ("tpe", "gp")
SEARCH_TYPES = (*ADAPTIVE_SEARCHES, "random", "grid", "pbt")
_SEARCH_KEYS = ("type", "trials", "startup_trials", "population", "interval_steps", "quantile", "explore")
#: Spec keys a PBT member may change mid-run: they set the learning schedule, not the model's shape.
EXPLORABLE = ("initial_learning_rate", "intermediate_learning_rate", "final_learning_rate", "momentum",
              "delay_each_layer_learning", "delay_intermediate_learning_rate", "delay_final_learning_rate")
_SIGNIFICANT_DIGITS = 6


class SweepError(ValueError):
    """An invalid sweep file; ``problems`` lists every problem found, each naming its key."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source, self.problems = _printable(source), [_printable(p) for p in problems]
        if len(self.problems) == 1:
            message = f"{source}: {self.problems[0]}"
        else:
            lines = [f"{source}: {len(self.problems)} problems", *(f"  - {p}" for p in self.problems)]
            message = "\n".join(lines)
        super().__init__(message)


def _printable(text: str) -> str:
    """``text`` with control characters escaped (a key may hold a newline): one problem stays one line."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(text))


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
class Explore:
    """How PBT changes one copied value: times one of ``factors`` (``perturb``), or drawn again (``resample``)."""

    kind: str
    factors: tuple[float, ...] = ()

    def to_raw(self) -> Any:
        return {"perturb": list(self.factors)} if self.kind == "perturb" else "resample"


@dataclasses.dataclass(frozen=True)
class Search:
    """How trials are chosen: ``tpe``/``gp`` ask Optuna for each one as a worker frees up (``trials`` in all,
    the first ``startup_trials`` sampled at random); ``random``/``grid`` are the deterministic plan; ``pbt``
    plans ``population`` members that every ``interval_steps`` copy a top ``quantile`` member when they are in
    the bottom one, and change its ``explore`` values."""

    type: str
    trials: int | None = None
    startup_trials: int = 10
    population: int | None = None
    interval_steps: int | None = None
    quantile: float = 0.25
    explore: dict[str, Explore] = dataclasses.field(default_factory=dict)

    @property
    def adaptive(self) -> bool:
        return self.type in ADAPTIVE_SEARCHES


@dataclasses.dataclass(frozen=True)
class Trial:
    """One training run: a spec, its overrides (fixed and varied), its seed, and the run settings it varies
    (``run``: n_seq, data, steps; the steps a frames budget gives it)."""

    trial_id: str
    spec: str
    overrides: dict[str, Any]
    seed: int
    varied: dict[str, Any]
    run: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"trial_id": self.trial_id, "spec": self.spec, "overrides": dict(self.overrides),
                "seed": self.seed, "varied": dict(self.varied), "run": dict(self.run)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Trial:
        return cls(trial_id=str(d["trial_id"]), spec=str(d["spec"]), overrides=dict(d["overrides"]),
                   seed=int(d["seed"]), varied=dict(d["varied"]), run=dict(d.get("run") or {}))


def trial_steps(trial: Mapping[str, Any], default: int) -> int:
    """The steps of a trial given as its ``to_dict()`` (``default``: the sweep's)."""
    return int((trial.get("run") or {}).get("steps", default))


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
    frames: int | None = None  # a frames budget: each trial trains frames / n_seq steps
    search: Search | None = None  # None: the plan (grid points × random samples)

    @property
    def adaptive(self) -> bool:
        """Whether trials are asked of a search as workers free up (no plan up front)."""
        return self.search is not None and self.search.adaptive

    def plan(self) -> list[Trial]:
        """Every trial, in a fixed order: spec, then grid point (file order), then sample; none for an
        adaptive search (its trials are asked for while it runs).

        Random values come from one ``default_rng(seed)`` drawn in that order, parameters in file
        order, so the same sweep always plans the same trials.
        """
        if self.adaptive:
            return []
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
                    trials.append(self.make_trial(f"t{len(trials):0{width}d}", spec, values))
        return trials

    def make_trial(self, trial_id: str, spec: str, values: Mapping[str, Any]) -> Trial:
        """The trial of ``spec`` with one value per varied parameter: spec keys become overrides, n_seq/data/steps
        its run settings (a frames budget sets its steps), ``seed`` its seed."""
        varied = {k: _plain(values[k]) for k in self.vary}
        overrides = {**self.overrides, **{k: v for k, v in varied.items() if k in FIELDS}}
        run = {k: varied[k] for k in VARIED_RUN_KEYS if k in varied}
        if self.frames is not None:
            run["steps"] = self.frames // run.get("n_seq", self.run.n_seq)
        if len(self.specs) > 1:
            varied = {"spec": spec, **varied}
        return Trial(trial_id=trial_id, spec=spec, overrides=overrides, seed=int(values.get(SEED_PARAM, self.seed)),
                     varied=varied, run=run)

    @property
    def steps(self) -> int:
        """The steps of the longest trial (every trial's, unless steps vary or a frames budget splits them)."""
        return self.run.steps

    def trial_config(self, trial: Trial) -> RunConfig:
        """The run configuration of one trial: the shared settings, its spec, overrides, seed and run settings."""
        spec = load_spec(trial.spec).with_overrides(trial.overrides)
        return dataclasses.replace(self.run, spec=spec, seed=trial.seed, run_name=trial.trial_id,
                                   overrides={k: str(v) for k, v in trial.overrides.items()}, **trial.run)

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
            **({"steps": None, "frames": self.frames} if self.frames is not None else {}),
            "resources": dataclasses.asdict(self.resources),
            "max_failures": self.max_failures, "max_concurrent": self.max_concurrent,
            "early_stopping": None if es is None else {"type": "asha", "grace_steps": es.grace_steps,
                                                       "reduction_factor": es.reduction_factor},
            **({"search": _search_raw(self.search)} if self.search is not None else {}),
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
    if path.is_dir():
        raise SweepError(str(path), ["is a folder, not a sweep file"])
    try:
        return parse_yaml(read_text(path))  # bounded: no aliases, no repeated keys, limited depth and size
    except OSError as exc:
        raise SweepError(str(path), [f"cannot be read ({exc.strerror or exc})"]) from None
    except UnicodeDecodeError:
        raise SweepError(str(path), ["is not a UTF-8 text file"]) from None
    except TextFormatError as exc:
        raise SweepError(str(path), [str(exc)]) from None


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
    search = _search(c, raw, vary, specs)
    samples = c.integer("samples", raw.get("samples", 1), 1)
    if search is not None and search.type == "pbt" and search.population is not None:
        samples = search.population
    elif search is not None and search.type == "random" and search.trials is not None:
        if "samples" in raw and samples != search.trials:
            c.add("samples", f"{samples} differs from search.trials ({search.trials}); give one of them")
        samples = search.trials
    if (samples is not None and samples > 1 and not any(d.is_random for d in vary.values())
            and not (search and search.adaptive)):
        c.problems.append(f"samples > 1 needs a random distribution in vary ({', '.join(RANDOM_KINDS)})")
    seed = c.integer("seed", raw.get("seed", 0), 0)
    overrides = _overrides(c, raw.get("overrides"))
    metric, mode = _metric(c, raw)
    _metric_layer(c, metric, bases)
    frames = c.optional_integer("frames", raw.get("frames"), 1)
    steps = None if raw.get("steps") is None else c.integer("steps", raw["steps"], 1)
    step_counts = _step_counts(c, raw, vary, steps, frames)
    shortest = None if not step_counts else min(step_counts)
    checkpoint_every = _at_most(c, "checkpoint_every", raw.get("checkpoint_every"),
                                None if shortest is None else max(shortest // 4, 1), shortest,
                                "steps" if len(set(step_counts or ())) < 2 else "the shortest trial's steps")
    metrics_every = _at_most(c, "metrics_every", raw.get("metrics_every"),
                             None if checkpoint_every is None else min(100, checkpoint_every),
                             checkpoint_every, "checkpoint_every")
    run = _run_config(c, raw, bases, steps or (max(step_counts) if step_counts else None), checkpoint_every,
                      metrics_every)
    resources = _resources(c, raw.get("resources"))
    max_failures = c.integer("max_failures", raw.get("max_failures", 3), 0)
    max_concurrent = c.optional_integer("max_concurrent", raw.get("max_concurrent"), 1)
    early_stopping = _early_stopping(c, raw.get("early_stopping"), shortest, checkpoint_every)
    if search is not None and search.interval_steps is not None and steps is not None and checkpoint_every:
        if search.interval_steps >= steps:
            c.add("search.interval_steps", f"{search.interval_steps} is not less than steps ({steps})")
        elif search.interval_steps % checkpoint_every:
            c.add("search.interval_steps", f"must be a multiple of checkpoint_every ({checkpoint_every}): "
                                           "members copy each other's checkpoints")
    if early_stopping is not None and step_counts and len(set(step_counts)) > 1:
        c.add("early_stopping", "ASHA compares trials at equal steps; it cannot stop trials whose steps differ "
                                "(varied steps, or a frames budget over varied n_seq)")
    if c.problems:
        raise SweepError(label, c.problems)
    sweep = SweepSpec(
        name=name, source=label, specs=specs, vary=vary, samples=samples, seed=seed, overrides=overrides,
        metric=metric, mode=mode, run=run, resources=resources,
        max_failures=max_failures, max_concurrent=max_concurrent, early_stopping=early_stopping,
        description=description, frames=frames, search=search,
    )
    problems = _plan_size_problems(sweep) or _trial_problems(sweep, bases)
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
    for key in ("data", "heldout"):
        if values.get(key):
            try:
                data_entries(values[key])
            except DataError as exc:
                c.add(key, str(exc))
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
    try:
        return RunConfig(spec=next(iter(bases.values())), track=False).replace(**values)
    except ValueError as exc:  # RunConfig's own bounds (each names its key)
        c.problems.append(str(exc))
        return None


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
    known = [*FIELDS, SEED_PARAM, *VARIED_RUN_KEYS]
    for param, value in raw.items():
        key = f"vary.{param}"
        if param not in known:
            c.add(key, f"is not a spec key, '{SEED_PARAM}' or one of {', '.join(VARIED_RUN_KEYS)}"
                       f"{_did_you_mean(str(param), known)}")
            continue
        dist = _distribution(c, key, value)
        if dist is None:
            continue
        if param == SEED_PARAM:
            ok = _integers_ok(c, key, dist, 0, "seeds")
        elif param in ("n_seq", "steps"):
            ok = _integers_ok(c, key, dist, 1, param)
        elif param == "data":
            ok = _sources_ok(c, key, dist)
        else:
            ok = True
        if ok:
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


def _integers_ok(c: _Checker, key: str, dist: Distribution, minimum: int, what: str) -> bool:
    """Seeds, n_seq and steps are integers of at least ``minimum``: a grid, randint or choice of them."""
    if dist.kind in ("uniform", "loguniform"):
        c.add(key, f"{what} are integers: use a list, randint or choice")
        return False
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in dist.values):
        kind = "non-negative" if minimum == 0 else f"at least {minimum}"
        c.add(key, f"{what} must be integers {kind}, got {list(dist.values)!r}")
        return False
    return True


def _sources_ok(c: _Checker, key: str, dist: Distribution) -> bool:
    """Data sources vary as a list (or choice) of source strings, as ``--data`` takes them."""
    if dist.kind not in ("grid", "choice") or not all(isinstance(v, str) and v for v in dist.values):
        c.add(key, f"data varies as a list of sources such as [synthetic:balls, synthetic:bar], got {dist.to_raw()!r}")
        return False
    return True


def _int_values(dist: Distribution) -> list[int]:
    """Every integer an integer distribution can give."""
    return list(range(dist.values[0], dist.values[1] + 1)) if dist.kind == "randint" else list(dist.values)


def _step_counts(c: _Checker, raw: Mapping[str, Any], vary: Mapping[str, Distribution], steps: int | None,
                 frames: int | None) -> list[int] | None:
    """Every step count a trial can get: the steps, the varied steps, or a frames budget over each n_seq."""
    if frames is not None:
        if steps is not None or "steps" in vary:
            c.add("frames", "give a frames budget or steps (fixed or varied), not both")
            return None
        base = raw.get("n_seq", 1)
        n_seqs = _int_values(vary["n_seq"]) if "n_seq" in vary else [base] if isinstance(base, int) and base >= 1 else []
        uneven = [n for n in n_seqs if frames % n]
        if uneven:
            c.add("frames", f"{frames} is not a multiple of n_seq {uneven[0]} (each trial trains frames / n_seq steps)")
            return None
        return [frames // n for n in n_seqs] or None
    if "steps" in vary:
        return _int_values(vary["steps"])
    if steps is not None:
        return [steps]
    if raw.get("steps") is None:
        c.add("steps", "is required (the steps each trial trains; or vary steps, or give a frames budget)")
    return None


def _search(c: _Checker, top: Mapping[str, Any], vary: Mapping[str, Distribution], specs: tuple[str, ...]) -> Search | None:
    """The ``search`` block: its type, and for an adaptive search the trials to ask for."""
    raw = top.get("search")
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        c.add("search", f"must be a mapping such as {{type: tpe, trials: 20}}, got {raw!r}")
        return None
    c.known_keys("search.", raw, _SEARCH_KEYS)
    kind = raw.get("type")
    if kind not in SEARCH_TYPES:
        c.add("search.type", f"unknown type {kind!r}; known: {', '.join(SEARCH_TYPES)}{_did_you_mean(str(kind), SEARCH_TYPES)}")
        return None
    if kind != "pbt":
        for key in ("population", "interval_steps", "quantile", "explore"):
            if key in raw:
                c.add(f"search.{key}", f"belongs to a pbt search, not {kind}")
    trials = c.optional_integer("search.trials", raw.get("trials"), 1)
    startup = c.integer("search.startup_trials", raw.get("startup_trials", 10), 1)
    if kind == "pbt":
        return _pbt(c, raw, top, vary, specs)
    if kind in ADAPTIVE_SEARCHES:
        if not vary:
            c.add("search", f"a {kind} search needs parameters to vary")
        if len(specs) > 1:
            c.add("search.type", f"a {kind} search tunes one spec; a model-zoo sweep (a list of specs) takes "
                                 "search type random or grid")
        if raw.get("trials") is None:
            c.add("search.trials", f"is required for a {kind} search (how many trials to ask for)")
        if top.get("samples", 1) != 1:
            c.add("samples", f"a {kind} search counts its trials in search.trials, not samples")
        for param, dist in vary.items():
            if dist.kind in ("grid", "choice") and not all(v is None or isinstance(v, (bool, int, float, str))
                                                            for v in dist.values):
                c.add(f"vary.{param}", f"a {kind} search chooses among numbers and strings, got {dist.to_raw()!r}")
        if kind == "gp" and not all(importlib.util.find_spec(m) for m in ("torch", "scipy")):
            c.add("search.type", "a gp search needs PyTorch and SciPy on the driver's machine "
                                 "(pip install 'pvm-dist[gp]'); tpe needs nothing more")
    else:
        if "startup_trials" in raw:
            c.add("search.startup_trials", f"only tpe and gp searches have startup trials, not {kind}")
        if kind == "grid":
            drawn = [k for k, d in vary.items() if d.is_random]
            if drawn:
                c.add(f"vary.{drawn[0]}", "a grid search takes lists of values, not a distribution")
            if raw.get("trials") is not None:
                c.add("search.trials", "a grid search runs every grid point; leave trials out")
        elif not any(d.is_random for d in vary.values()):
            c.add("search.type", f"a random search needs a random distribution in vary ({', '.join(RANDOM_KINDS)})")
    return Search(type=kind, trials=trials, startup_trials=startup or 10)


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


def _metric_layer(c: _Checker, metric: Any, bases: Mapping[str, Spec]) -> None:
    """A per-layer metric must name a layer every spec of the sweep has."""
    match = LAYER_METRIC.fullmatch(metric) if isinstance(metric, str) else None
    if match is None or not bases:
        return
    layer, fewest = int(metric[len("layer"):].split("_")[0]), min(b.n_layers for b in bases.values())
    if layer >= fewest:
        c.add("metric", f"{metric!r} names layer {layer}, but a spec of this sweep has layers 0 to {fewest - 1}")


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


def _probe_trials(sweep: SweepSpec) -> list[Trial]:
    """For a search without a plan: one trial per value (a range: both bounds) of each parameter, the others at
    their first, named ``param=value``, so what the model rejects is known before any trial is asked for."""
    first = {k: d.values[0] for k, d in sweep.vary.items()}
    return [sweep.make_trial(f"{k}={v}", sweep.specs[0], {**first, k: v})
            for k, d in sweep.vary.items() for v in d.values]


def _pbt(c: _Checker, raw: Mapping[str, Any], top: Mapping[str, Any], vary: Mapping[str, Distribution],
         specs: tuple[str, ...]) -> Search:
    """``search: {type: pbt, population, interval_steps, quantile, explore}``; the intervals are checked against
    the steps in :func:`_pbt_intervals`."""
    for key in ("trials", "startup_trials"):
        if key in raw:
            c.add(f"search.{key}", "a pbt search has a population, not trials")
    population = raw.get("population")
    if isinstance(population, bool) or not isinstance(population, int) or population < 2:
        c.add("search.population", f"must be an integer of at least 2 (members copy each other), got {population!r}")
        population = None
    interval = c.integer("search.interval_steps", raw.get("interval_steps"), 1) if "interval_steps" in raw else None
    if "interval_steps" not in raw:
        c.add("search.interval_steps", "is required (how many steps between two exploit decisions)")
    quantile = raw.get("quantile", 0.25)
    if not _is_number(quantile) or not 0 < quantile <= 0.5:
        c.add("search.quantile", f"must be a fraction in (0, 0.5] (the bottom that copies the top), got {quantile!r}")
        quantile = 0.25
    if len(specs) > 1:
        c.add("search.type", "a pbt population trains one spec; a model-zoo sweep takes search type random or grid")
    for key in (*VARIED_RUN_KEYS, SEED_PARAM):
        if key in vary:
            c.add(f"vary.{key}", "pbt members copy each other's state: they share their seed, n_seq, data and steps")
    if top.get("frames") is not None:
        c.add("frames", "pbt members share their steps; give steps")
    if top.get("early_stopping") is not None:
        c.add("early_stopping", "a pbt population replaces its worst members instead of stopping them")
    if top.get("samples", 1) not in (1, population):
        c.add("samples", "a pbt search counts its members in search.population, not samples")
    for param, dist in vary.items():
        if not dist.is_random:
            c.add(f"vary.{param}", "pbt draws its members' first values: use a distribution (choice for a list)")
    return Search(type="pbt", population=population, interval_steps=interval, quantile=float(quantile),
                  explore=_explore(c, raw.get("explore"), vary))


def _explore(c: _Checker, raw: Any, vary: Mapping[str, Distribution]) -> dict[str, Explore]:
    """``explore: {param: {perturb: [0.8, 1.2]} | resample}``, over varied schedule keys only."""
    if not isinstance(raw, Mapping) or not raw:
        c.add("search.explore", f"must name the varied values to explore, such as {{momentum: {{perturb: [0.8, 1.2]}}}}, "
                                f"got {raw!r}")
        return {}
    out: dict[str, Explore] = {}
    for param, how in raw.items():
        key = f"search.explore.{param}"
        if param not in vary:
            c.add(key, f"is not varied; explore changes values that vary draws ({', '.join(vary) or 'none'})")
        elif param not in EXPLORABLE:
            c.add(key, f"cannot change mid-run; pbt explores {', '.join(EXPLORABLE)}")
        elif how == "resample":
            out[param] = Explore("resample")
        elif (isinstance(how, Mapping) and list(how) == ["perturb"] and isinstance(how["perturb"], list)
              and how["perturb"] and all(_is_number(f) and f > 0 for f in how["perturb"])):
            if vary[param].kind == "choice":
                c.add(key, "a choice is resampled, not perturbed")
            else:
                out[param] = Explore("perturb", tuple(float(f) for f in how["perturb"]))
        else:
            c.add(key, f"must be resample or {{perturb: [factors > 0]}}, got {how!r}")
    return out


def _search_raw(search: Search) -> dict[str, Any]:
    """The sweep-file form of a search block."""
    if search.type == "pbt":
        return {"type": "pbt", "population": search.population, "interval_steps": search.interval_steps,
                "quantile": search.quantile, "explore": {k: e.to_raw() for k, e in search.explore.items()}}
    if search.adaptive:
        return {"type": search.type, "trials": search.trials, "startup_trials": search.startup_trials}
    return {"type": search.type, "trials": search.trials}


def _plan_size_problems(sweep: SweepSpec) -> list[str]:
    """More than MAX_TRIALS planned trials, counted as a product before any is built."""
    grid = [len(d.values) for d in sweep.vary.values() if not d.is_random]
    count = len(sweep.specs) * math.prod(grid) * sweep.samples
    if count <= MAX_TRIALS:
        return []
    factors = " × ".join([f"{len(sweep.specs)} spec(s)", *(f"{n:,}" for n in grid), f"{sweep.samples:,} sample(s)"])
    return [f"vary: plans {count:,} trials ({factors}); a sweep plans at most {MAX_TRIALS:,}"]


def _memory_problem(spec: Spec, n_seq: int) -> str | None:
    """Why ``n_seq`` sequences of ``spec`` fit on no worker (its graph on this host first), or None."""
    try:
        check_graph(spec)
        check_engine(build_topology(spec), n_seq, None, available=MAX_TRIAL_BYTES, where="a sweep trial may use at most")
    except MemoryBudgetError as exc:
        return f"n_seq: {exc}"
    return None


def _trial_problems(sweep: SweepSpec, bases: Mapping[str, Spec]) -> list[str]:
    """Build every planned trial's spec; each distinct rejection once, with the trials it hits."""
    hits: dict[str, list[str]] = {}
    sized: dict[str, str | None] = {}  # each distinct model's memory problem, checked once
    for trial in sweep.plan() or _probe_trials(sweep):
        try:
            spec = bases[trial.spec].with_overrides(trial.overrides)
            n_seq = int(trial.run.get("n_seq", sweep.run.n_seq))
            key = json.dumps([spec.to_dict(), n_seq], sort_keys=True)
            if key not in sized:
                sized[key] = _memory_problem(spec, n_seq)
            if sized[key]:
                hits.setdefault(sized[key], []).append(trial.trial_id)
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
