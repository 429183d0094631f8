"""The sweep's scheduling policy on its own: no Ray, no files. FIFO never stops a trial; ASHA stops the trials
outside the best fraction of a rung, says why, reports what it recorded and takes the journal's rungs back;
the chunk plan ends chunks at every step the driver or the scheduler needs."""

from __future__ import annotations

import math

import pytest

from pvm_dist.sweep.plan import load_sweep
from pvm_dist.sweep.scheduler import (CONTINUE, Action, AshaScheduler, ChunkPlan, FIFOScheduler, make_scheduler)


def sweep(**fields):
    body = {"name": "s", "spec": "tiny", "steps": 1000, "checkpoint_every": 300, "metrics_every": 100,
            "metric": {"name": "ratio_two_step", "mode": "min"}, **fields}
    return load_sweep(body)


def test_fifo_never_stops_and_needs_no_milestones():
    fifo = FIFOScheduler()
    assert fifo.milestones() == []
    assert fifo.on_result("t0", 100, {"ratio_two_step": math.inf}) is CONTINUE


def test_asha_stops_the_worse_trial_of_a_rung_with_a_reason():
    asha = AshaScheduler([100, 200], reduction_factor=2, metric="m", mode="min")
    assert asha.milestones() == [100, 200]
    first = asha.on_result("a", 100, {"m": 5.0})
    assert first.action is Action.CONTINUE and first.recorded == 5.0  # recorded: the driver journals it
    worse = asha.on_result("b", 100, {"m": 6.0})
    assert worse.action is Action.STOP and worse.recorded == 6.0
    assert worse.reason == "early stop at step 100: m = 6 not in the best 1/2 of 2 trials there"
    assert asha.on_result("c", 150, {"m": 9.0}) is CONTINUE  # not a milestone: nothing recorded
    assert asha.on_result("c", 100, {"other": 9.0}) is CONTINUE  # no value of the metric: nothing recorded
    assert asha.on_result("x", 200, {"m": math.nan}).action is Action.STOP


def test_asha_replays_the_journal_rungs_before_deciding():
    recorded = [("a", 100, 1.0), ("b", 100, 2.0), ("a", 999, 0.5)]  # 999 is no milestone (another plan): ignored
    asha = AshaScheduler([100, 200], reduction_factor=2, metric="m", mode="max", recorded=recorded)
    assert asha.halving.rungs == {100: {"a": 1.0, "b": 2.0}, 200: {}}
    assert asha.on_result("c", 100, {"m": 1.5}).action is Action.STOP  # three values, one goes on: 2.0
    assert asha.on_result("d", 100, {"m": 3.0}).action is Action.CONTINUE


def test_make_scheduler_follows_the_sweep_file():
    assert isinstance(make_scheduler(sweep()), FIFOScheduler)
    asha = make_scheduler(sweep(early_stopping={"type": "asha", "grace_steps": 100, "reduction_factor": 3}),
                          recorded=[("t0", 300, 0.5)])
    assert isinstance(asha, AshaScheduler)
    assert asha.milestones() == [100, 300, 900] and asha.metric == "ratio_two_step"
    assert asha.halving.rungs[300] == {"t0": 0.5}


@pytest.mark.parametrize("milestones, ends", [
    ((), [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000]),
    ((150, 450), [100, 150, 200, 300, 400, 450, 500, 600, 700, 800, 900, 1000]),
])
def test_chunks_end_at_metrics_checkpoints_milestones_and_the_last_step(milestones, ends):
    plan = ChunkPlan(steps=1000, metrics_every=100, checkpoint_every=300, milestones=milestones)
    got, step = [], 0
    while step < plan.steps:
        step = plan.end_after(step)
        got.append(step)
    assert got == ends
    assert [e for e in ends if plan.keeps_state(e)] == [300, 600, 900, 1000]  # checkpoints and the end
    assert plan.end_after(950) == 1000 and plan.end_after(120) == (150 if milestones else 200)


def test_chunk_plan_of_a_sweep_takes_the_scheduler_milestones():
    s = sweep(steps=700, early_stopping={"type": "asha", "grace_steps": 250, "reduction_factor": 2})
    plan = ChunkPlan.of(s, make_scheduler(s))
    assert plan == ChunkPlan(steps=700, metrics_every=100, checkpoint_every=300, milestones=(250, 500))
