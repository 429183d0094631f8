"""Sweep files: loading, checking and planning (architecture.md §5)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import REPO, ZOO

from pvm_dist.sweep.plan import EarlyStopping, SweepError, Trial, load_sweep

EXPERIMENTS = sorted((REPO / "experiments").glob("*.yaml"))


def write(tmp_path: Path, text: str, name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems_of(source, tmp_path: Path | None = None) -> list[str]:
    if tmp_path is not None:
        source = write(tmp_path, source)
    with pytest.raises(SweepError) as info:
        load_sweep(source)
    return info.value.problems


def base(**extra) -> dict:
    return {"spec": "tiny", "steps": 100, **extra}


def test_every_experiment_loads_and_plans():
    assert {p.name for p in EXPERIMENTS} >= {"quickstart.yaml", "lr_random_search.yaml", "model_zoo.yaml",
                                              "gpu_small_4trials.yaml"}
    for path in EXPERIMENTS:
        sweep = load_sweep(path)
        trials = sweep.plan()
        assert (trials or sweep.adaptive) and len({t.trial_id for t in trials}) == len(trials), path
        assert sweep.run.checkpoint_every <= sweep.steps and sweep.run.metrics_every <= sweep.run.checkpoint_every
        for t in trials:
            for key, dist in sweep.vary.items():
                value = t.varied[key]
                if dist.kind in ("grid", "choice"):
                    assert value in dist.values
                else:
                    assert dist.values[0] <= value <= dist.values[1]


def test_quickstart_is_the_documented_grid():
    sweep = load_sweep(REPO / "experiments" / "quickstart.yaml")
    assert sweep.name == "quickstart" and sweep.specs == ("first",) and sweep.steps == 80000
    assert (sweep.run.checkpoint_every, sweep.run.metrics_every, sweep.metric, sweep.mode) == (40000, 1000, "ratio_two_step", "min")
    trials = sweep.plan()
    assert [t.trial_id for t in trials] == ["t000", "t001"]
    assert [t.overrides for t in trials] == [{"initial_learning_rate": 0.15, "momentum": m} for m in (0.1, 0.3)]


def test_lr_random_search_has_asha_milestones():
    sweep = load_sweep(REPO / "experiments" / "lr_random_search.yaml")
    assert len(sweep.plan()) == 8 and sweep.seed == 7
    assert sweep.early_stopping.milestones(sweep.steps) == [2000, 4000, 8000, 16000]


def test_grid_count_is_the_product_and_order_is_file_order():
    sweep = load_sweep(base(vary={"momentum": [0.1, 0.2, 0.3], "seed": [1, 2], "lateral_radius": [0, 1]}))
    trials = sweep.plan()
    assert len(trials) == 12
    assert trials[0].varied == {"momentum": 0.1, "seed": 1, "lateral_radius": 0}
    assert trials[1].varied == {"momentum": 0.1, "seed": 1, "lateral_radius": 1}
    assert trials[2].seed == 2 and "seed" not in trials[2].overrides
    assert len({json.dumps(t.varied, sort_keys=True) for t in trials}) == 12


def test_random_draws_in_range_deterministic_and_seeded():
    raw = base(vary={"initial_learning_rate": {"loguniform": [1e-5, 1e-1]}, "momentum": {"uniform": [0.3, 0.9]},
                     "lateral_radius": {"randint": [0, 2]}, "derivative": {"choice": ["original", "exact"]}},
               samples=40, seed=3)
    trials = load_sweep(raw).plan()
    assert len(trials) == 40
    lrs = [t.overrides["initial_learning_rate"] for t in trials]
    assert all(1e-5 <= x <= 1e-1 for x in lrs)
    logs = [math.log10(x) for x in lrs]
    assert min(logs) < -4 and max(logs) > -2  # spread over the decades, not bunched at the top
    assert all(0.3 <= t.overrides["momentum"] <= 0.9 for t in trials)
    assert {t.overrides["lateral_radius"] for t in trials} == {0, 1, 2}
    assert all(type(t.overrides["lateral_radius"]) is int for t in trials)
    assert {t.overrides["derivative"] for t in trials} == {"original", "exact"}
    assert all(float(f"{x:.6g}") == x for x in lrs)  # rounded to 6 significant digits
    assert load_sweep(raw).plan() == trials
    assert load_sweep({**raw, "seed": 4}).plan() != trials
    assert all(t.seed == 3 for t in trials)


def test_grid_and_samples_combine():
    raw = base(vary={"momentum": [0.1, 0.5], "initial_learning_rate": {"uniform": [0.001, 0.002]}}, samples=3)
    trials = load_sweep(raw).plan()
    assert len(trials) == 6 and [t.overrides["momentum"] for t in trials] == [0.1] * 3 + [0.5] * 3
    assert len({t.overrides["initial_learning_rate"] for t in trials}) == 6


def test_model_zoo_list_and_overrides():
    sweep = load_sweep(base(spec=["tiny", "small"], vary={"momentum": [0.2, 0.4]}, overrides={"momentum": 0.9,
                                                                                               "lateral_radius": 1}))
    trials = sweep.plan()
    assert [(t.spec, t.overrides["momentum"]) for t in trials] == [("tiny", 0.2), ("tiny", 0.4), ("small", 0.2),
                                                                   ("small", 0.4)]
    assert all(t.overrides["lateral_radius"] == 1 and t.varied["spec"] == t.spec for t in trials)


def test_relative_spec_file_resolves_against_the_sweep_folder(tmp_path, monkeypatch):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "mine.json").write_text((ZOO / "tiny.json").read_text())
    path = write(tmp_path, "spec: specs/mine.json\nsteps: 10\n")
    monkeypatch.chdir(REPO)
    sweep = load_sweep(path)
    assert sweep.specs == (str((tmp_path / "specs" / "mine.json").resolve()),)
    assert sweep.name == "sweep" and sweep.run.checkpoint_every == 2 and sweep.run.metrics_every == 2


def test_to_dict_round_trip_plans_the_same_trials():
    for path in EXPERIMENTS:
        sweep = load_sweep(path)
        again = load_sweep(json.loads(json.dumps(sweep.to_dict())))
        assert again.plan() == sweep.plan() and again.name == sweep.name, path
        assert dataclass_fields_equal(again, sweep)
    trial = load_sweep(EXPERIMENTS[0]).plan()[0]
    assert Trial.from_dict(json.loads(json.dumps(trial.to_dict()))) == trial


def dataclass_fields_equal(a, b) -> bool:
    return {k: v for k, v in vars(a).items() if k != "source"} == {k: v for k, v in vars(b).items() if k != "source"}


def test_defaults_and_better():
    sweep = load_sweep(base(steps=1000))
    assert (sweep.run.checkpoint_every, sweep.run.metrics_every, sweep.samples, sweep.run.n_seq) == (250, 100, 1, 1)
    assert (sweep.run.data, sweep.run.backend, sweep.max_failures, sweep.early_stopping) == ("synthetic:balls", "auto", 3, None)
    assert sweep.better(0.5, 0.6) and not sweep.better(0.6, 0.5) and not sweep.better(0.5, 0.5)
    assert sweep.better(1.0, math.nan) and not sweep.better(math.nan, 1.0)
    fast = load_sweep(base(metric="frames_per_s"))
    assert fast.mode == "max" and fast.better(2.0, 1.0)
    assert load_sweep(base(metric={"name": "layer2_mse_one_step", "mode": "max"})).mode == "max"


def test_scientific_notation_reads_as_numbers(tmp_path):
    sweep = load_sweep(write(tmp_path, "spec: tiny\nsteps: 10\nvary:\n  initial_learning_rate: {loguniform: [1e-4, 1e-2]}\n"))
    assert sweep.vary["initial_learning_rate"].values == (1e-4, 1e-2)


def test_milestones():
    assert EarlyStopping(grace_steps=100, reduction_factor=3).milestones(1000) == [100, 300, 900]
    assert EarlyStopping(grace_steps=100, reduction_factor=2).milestones(800) == [100, 200, 400]
    assert EarlyStopping(grace_steps=100, reduction_factor=2).milestones(100) == []
    sweep = load_sweep(base(steps=1000, checkpoint_every=200, early_stopping={"type": "asha"}))
    assert sweep.early_stopping == EarlyStopping(grace_steps=200, reduction_factor=2)


# --- errors ------------------------------------------------------------------------------------


def test_unknown_top_key_with_suggestion(tmp_path):
    problems = problems_of("spec: tiny\nsteps: 10\nstesp: 5\n", tmp_path)
    assert problems == ["stesp: unknown key (did you mean: steps?)"]


def test_unknown_vary_key_names_close_matches():
    (problem,) = problems_of(base(vary={"momentm": [0.1, 0.2]}))
    assert problem.startswith("vary.momentm: is not a spec key") and "did you mean: momentum" in problem


@pytest.mark.parametrize(("dist", "expected"), [
    ({"uniform": [0.7, 0.3]}, "vary.momentum: uniform needs lo < hi, got [0.7, 0.3]"),
    ({"loguniform": [0, 0.1]}, "vary.momentum: loguniform needs lo > 0, got [0, 0.1]"),
    ({"randint": [3, 1]}, "vary.momentum: randint needs lo <= hi, got [3, 1]"),
    ({"uniform": ["a", 1]}, "vary.momentum: uniform needs numeric bounds [lo, hi], got ['a', 1]"),
    ({"uniform": [0.1]}, "vary.momentum: uniform needs [lo, hi], got [0.1]"),
    ({"gaussian": [0, 1]}, "vary.momentum: unknown distribution 'gaussian'"),
    ([], "vary.momentum: the list of values is empty"),
    (0.5, "vary.momentum: must be a list of values or a one-key mapping"),
])
def test_bad_distributions(dist, expected):
    (problem,) = problems_of(base(vary={"momentum": dist}))
    assert problem.startswith(expected)


def test_missing_sweep_file_and_missing_spec(tmp_path):
    with pytest.raises(SweepError) as info:
        load_sweep(tmp_path / "nope.yaml")
    assert str(info.value) == f"{tmp_path / 'nope.yaml'}: no such sweep file"
    (problem,) = problems_of(base(spec="no_such_model"))
    assert problem.startswith("spec 'no_such_model': no such file, and not a model-zoo name")
    assert problems_of({"steps": 10}) == ["spec: is required (a model-zoo name such as small, a spec file, or a list of them)"]


def test_invalid_yaml_names_line_and_column(tmp_path):
    path = write(tmp_path, "spec: tiny\nsteps: [10\n")
    with pytest.raises(SweepError) as info:
        load_sweep(path)
    assert str(info.value).startswith(f"{path}: is not valid YAML") and "line 3" in str(info.value)
    assert problems_of("- just\n- a list\n", tmp_path) == ["the top level must be a mapping of sweep keys, got list"]


def test_bad_metric_and_mode():
    (problem,) = problems_of(base(metric="ratio_twostep"))
    assert problem.startswith("metric: unknown metric 'ratio_twostep' (did you mean: ratio_two_step")
    assert problems_of(base(mode="lowest")) == ["mode: must be min or max, got 'lowest'"]
    assert problems_of(base(metric={"name": "l0_two_step_px", "mode": "down"})) == [
        "metric.mode: must be min or max, got 'down'"]
    (problem,) = problems_of(base(metric={"name": "l0_two_step_px"}, mode="min"))
    assert problem.startswith("mode: give the mode once")


def test_samples_need_a_random_distribution():
    assert problems_of(base(vary={"momentum": [0.1, 0.2]}, samples=4)) == [
        "samples > 1 needs a random distribution in vary (uniform, loguniform, randint, choice)"]


def test_spec_invalid_grid_value_names_key_and_trials():
    (problem,) = problems_of(base(vary={"momentum": [0.5, -1], "seed": [0, 1]}))
    assert problem == "vary.momentum: must be a finite non-negative number, got -1 (trials t002, t003)"
    (problem,) = problems_of(base(overrides={"lateral_radius": -2}))
    assert problem == "overrides.lateral_radius: must be a non-negative integer, got -2 (trial t000)"


def test_intervals_resources_and_early_stopping_checked():
    problems = problems_of(base(steps=100, checkpoint_every=200, n_seq=0, backend="cuda",
                                resources={"gpus_per_actor": 0, "gpus_per_actr": 1}, max_failures=-1,
                                early_stopping={"type": "hyperband", "grace_steps": 500, "reduction_factor": 1}))
    assert problems == [
        "checkpoint_every: 200 is more than steps (100)",
        "n_seq: must be an integer of at least 1, got 0",
        "backend: must be one of auto, reference, native, got 'cuda'",
        "resources.gpus_per_actr: unknown key (did you mean: gpus_per_actor, cpus_per_actor?)",
        "resources.gpus_per_actor: must be a number greater than 0, got 0",
        "max_failures: must be an integer of at least 0, got -1",
        "early_stopping.type: unknown type 'hyperband'; known: asha",
        "early_stopping.grace_steps: 500 is more than steps (100)",
        "early_stopping.reduction_factor: must be an integer of at least 2, got 1",
    ]


def test_several_problems_reported_together(tmp_path):
    path = write(tmp_path, "spec: nothing_here\nvary:\n  momentum: {uniform: [0.9, 0.1]}\n  lr: [1]\nmetric: speed\n")
    with pytest.raises(SweepError) as info:
        load_sweep(path)
    err = info.value
    assert err.source == str(path) and len(err.problems) == 5
    lines = str(err).splitlines()
    assert lines[0] == f"{path}: 5 problems" and all(line.startswith("  - ") for line in lines[1:])
    assert {p.split(":")[0] for p in err.problems} == {"spec 'nothing_here'", "vary.momentum", "vary.lr", "metric",
                                                        "steps"}
