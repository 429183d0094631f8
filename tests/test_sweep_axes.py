"""Sweeps over run settings (issue 14): n_seq, data and steps vary per trial like spec keys, and a frames budget
gives trials of different n_seq equal work. The same sweep on Ray is in tests/test_sweep_faults.py."""

from __future__ import annotations

import json

import pytest

from pvm_dist.sweep.plan import SweepError, Trial, load_sweep
from pvm_dist.sweep.progress import rows


def sweep(**extra) -> dict:
    return {"name": "a", "spec": "tiny", "checkpoint_every": 50, "metrics_every": 25, **extra}


def test_varied_run_settings_reach_each_trial_config_and_not_the_spec():
    s = load_sweep(sweep(steps=400, vary={"n_seq": [1, 2], "data": ["synthetic:balls", "synthetic:bar"],
                                          "momentum": [0.5]}))
    trials = s.plan()
    configs = [s.trial_config(t) for t in trials]
    assert [(c.n_seq, c.data, c.steps) for c in configs] == [
        (1, "synthetic:balls", 400), (1, "synthetic:bar", 400), (2, "synthetic:balls", 400), (2, "synthetic:bar", 400)]
    assert all(t.overrides == {"momentum": 0.5} for t in trials)  # run settings are not spec overrides
    assert all(c.spec["momentum"] == 0.5 for c in configs)
    again = load_sweep(json.loads(json.dumps(s.to_dict())))
    assert again.plan() == trials
    assert Trial.from_dict(json.loads(json.dumps(trials[3].to_dict()))) == trials[3]


def test_a_frames_budget_gives_every_trial_the_same_frames():
    s = load_sweep(sweep(frames=1200, vary={"n_seq": [1, 3, 4]}))
    configs = [s.trial_config(t) for t in s.plan()]
    assert [c.steps for c in configs] == [1200, 400, 300]
    assert {c.steps * c.n_seq for c in configs} == {1200}
    assert s.steps == 1200  # the longest trial
    again = load_sweep(json.loads(json.dumps(s.to_dict())))
    assert [again.trial_config(t).steps for t in again.plan()] == [1200, 400, 300]
    # The table shows each trial's own steps.
    state_rows = rows(_state(s), [t.to_dict() for t in s.plan()], s.steps)
    assert [r["steps"] for r in state_rows] == [1200, 400, 300]


def test_varied_steps_run_each_trial_its_own_length():
    s = load_sweep(sweep(vary={"steps": [100, 300]}))
    assert [s.trial_config(t).steps for t in s.plan()] == [100, 300]
    assert s.run.checkpoint_every == 50


@pytest.mark.parametrize("extra, problem", [
    ({"frames": 1000, "vary": {"n_seq": [1, 3]}}, "frames: 1000 is not a multiple of n_seq 3"),
    ({"frames": 400, "steps": 100}, "frames: give a frames budget or steps"),
    ({"vary": {"n_seq": {"uniform": [1, 4]}}, "steps": 100}, "vary.n_seq: n_seq are integers"),
    ({"vary": {"n_seq": [0, 2]}, "steps": 100}, "vary.n_seq: n_seq must be integers at least 1"),
    ({"vary": {"data": [3, "synthetic:bar"]}, "steps": 100}, "vary.data: data varies as a list of sources"),
    ({"vary": {"momentum": [0.5]}}, "steps: is required"),
    ({"vary": {"steps": [100, 200]}, "checkpoint_every": 150}, "checkpoint_every: 150 is more than the shortest"),
    ({"frames": 400, "vary": {"n_seq": [1, 2]}, "early_stopping": {"grace_steps": 50}},
     "early_stopping: ASHA compares trials at equal steps"),
])
def test_bad_axes_get_one_problem_each(extra, problem):
    with pytest.raises(SweepError) as info:
        load_sweep(sweep(**extra))
    assert len(info.value.problems) == 1 and info.value.problems[0].startswith(problem), info.value.problems


def _state(s):
    from pvm_dist.sweep.journal import SweepState, TrialState

    return SweepState({t.trial_id: TrialState(t.trial_id) for t in s.plan()})
