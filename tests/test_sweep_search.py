"""Search policies (issue 14) through the driver, without Ray: the scripted executor of tests/test_sweep_driver.py
stands in for the Ray one.

- TPE (a trial's metric is its seed): trials asked for as workers free up, the study told every result, and a
  driver that dies between two of its writes resumed without asking a trial twice (the same search on Ray, killed
  with SIGKILL, is in tests/test_sweep_faults.py);
- PBT on real tiny engines (native, CPU, in this process; a member's metric is its learning rate, so the ranking
  is known): the donor's state copied bit for bit (but the per-unit rates, which the member's own schedule sets
  at that step), the explored values applied, lineage journaled and tagged, and a driver dying mid-population;
- the ``search`` block's checks."""

from __future__ import annotations

import importlib.util
import json

import cv2
import mlflow
import numpy as np
import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState
from sweep_helpers import run, sweep_file
from scripted_executor import InlineOpener, ScriptedExecutor

from pvm_dist.data import make_source
from pvm_dist.engine import build_engine
from pvm_dist.sweep import driver as driver_module
from pvm_dist.sweep import optuna_search
from pvm_dist.sweep.driver import Driver, DriverOptions, resume_sweep
from pvm_dist.model.spec import load_spec
from pvm_dist.sweep.executor import ChunkDone, WorkerLost
from pvm_dist.sweep.pbt import schedule_rates
from pvm_dist.sweep.journal import SweepFolder
from pvm_dist.sweep.plan import SweepError, load_sweep

TRIALS, CONCURRENT = 7, 2


def tpe(**extra) -> dict:
    return {"name": "s", "spec": "tiny", "steps": 600, "checkpoint_every": 200, "metrics_every": 100,
            "vary": {"seed": {"randint": [0, 1000]}, "momentum": {"uniform": [0.5, 0.95]}},
            "search": {"type": "tpe", "trials": TRIALS, "startup_trials": 3}, "max_concurrent": CONCURRENT, **extra}


def new_driver(tmp_path, mlflow_uri, **extra) -> Driver:
    sweep = load_sweep(tpe(**extra))
    folder = SweepFolder.create(tmp_path, "s", sweep.to_dict(), [])
    return Driver(folder, sweep, [], options(tmp_path, mlflow_uri), folder.state())


def options(tmp_path, mlflow_uri) -> DriverOptions:
    return DriverOptions(mlflow_uri=mlflow_uri, experiment=f"s-{tmp_path.name}", root=tmp_path)


def study_of(folder: SweepFolder) -> optuna.Study:
    storage = JournalStorage(JournalFileBackend(str(folder.path / optuna_search.STUDY_FILE)))
    return optuna.load_study(study_name=optuna_search.STUDY_NAME, storage=storage)


def most_open(events: list[dict]) -> int:
    """The most trials asked for and not yet ended at any point of the journal."""
    open_, most = set(), 0
    for e in events:
        if e["event"] == "trial_added":
            open_.add(e["trial"])
        elif e["event"] == "trial_ended":
            open_.discard(e["trial"])
        most = max(most, len(open_))
    return most


def test_tpe_asks_as_workers_free_up_and_tells_the_study_every_result(tmp_path, mlflow_uri, scripted):
    out = new_driver(tmp_path, mlflow_uri).run()
    assert out.status == "FINISHED" and len(out.trials) == TRIALS
    events = SweepFolder(tmp_path, "s").events()
    added = [e["trial"] for e in events if e["event"] == "trial_added"]
    assert len(added) == len(set(added)) == TRIALS
    assert most_open(events) == CONCURRENT and len(scripted.last.workers) == CONCURRENT
    assert {t["status"] for t in out.trials} == {"FINISHED"}
    study = study_of(SweepFolder(tmp_path, "s"))
    told = {f"t{t.number:03d}": (t.value, t.params) for t in study.trials}
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    # The study learnt each trial's metric (the scripted metric is the seed) with the values it trained.
    assert told == {t["trial_id"]: (t["metric"], t["varied"]) for t in out.trials}
    assert all(t["metric"] == t["varied"]["seed"] for t in out.trials)
    assert out.best["metric"] == min(t["metric"] for t in out.trials)


class Died(BaseException):
    """The driver process dying at a given write (a BaseException: nothing in the driver catches it)."""


@pytest.mark.parametrize("dies_at", ["after the ask, before the journal", "after the journal, before the tell"])
def test_a_driver_dying_between_its_writes_resumes_without_asking_a_trial_twice(tmp_path, mlflow_uri, scripted,
                                                                                 monkeypatch, dies_at):
    d = new_driver(tmp_path, mlflow_uri)
    if dies_at.startswith("after the ask"):
        append = d.folder.append

        def dying_append(event: str, **fields):
            if event == "trial_added" and fields["trial"] == "t003":
                raise Died
            return append(event, **fields)

        d.folder.append = dying_append
    else:
        def dying_tell(self, trial_id, status, metric):
            raise Died

        monkeypatch.setattr(optuna_search.OptunaSearch, "tell", dying_tell)
    with pytest.raises(Died):
        d.run()
    monkeypatch.undo()
    monkeypatch.setattr(driver_module, "Executor", ScriptedExecutor)
    monkeypatch.setattr(driver_module, "run_opener", InlineOpener)
    monkeypatch.setattr(driver_module, "connect", lambda address: None)

    out = resume_sweep("s", options(tmp_path, mlflow_uri))
    assert out.status == "FINISHED" and len(out.trials) == TRIALS
    events = SweepFolder(tmp_path, "s").events()
    added = [e["trial"] for e in events if e["event"] == "trial_added"]
    assert len(added) == len(set(added)) == TRIALS
    ended = [e["trial"] for e in events if e["event"] == "trial_ended"]
    assert sorted(ended) == sorted(added)  # each trial ended once: none redone
    study = study_of(SweepFolder(tmp_path, "s"))
    states = [t.state for t in study.trials]
    assert states.count(TrialState.COMPLETE) == TRIALS
    if dies_at.startswith("after the ask"):
        # The trial asked for but never journaled is failed in the study, not asked again nor trained.
        assert states.count(TrialState.FAIL) == 1 and study.trials[3].state == TrialState.FAIL
        assert "t003" not in added
    else:
        assert len(states) == TRIALS  # the ended trial the study missed was told on resume
    assert most_open(events) <= CONCURRENT


@pytest.mark.parametrize("search, problem", [
    ({"type": "bayes"}, "search.type: unknown type 'bayes'; known: tpe, gp, random, grid, pbt"),
    ({"type": "tpe"}, "search.trials: is required for a tpe search"),
    ({"type": "tpe", "trials": 4, "budget": 3}, "search.budget: unknown key"),
    ({"type": "grid"}, "vary.seed: a grid search takes lists of values, not a distribution"),
    ({"type": "random", "trials": 2, "startup_trials": 1}, "search.startup_trials: only tpe and gp"),
])
def test_bad_search_blocks_get_one_problem_each(search, problem):
    with pytest.raises(SweepError) as info:
        load_sweep(tpe(search=search))
    assert len(info.value.problems) == 1 and info.value.problems[0].startswith(problem)


HAS_GP = all(importlib.util.find_spec(m) for m in ("torch", "scipy"))


@pytest.mark.skipif(HAS_GP, reason="PyTorch and SciPy are installed here")
def test_gp_without_pytorch_says_so_before_anything_runs():
    with pytest.raises(SweepError) as info:
        load_sweep(tpe(search={"type": "gp", "trials": 4}))
    assert info.value.problems == ["search.type: a gp search needs PyTorch and SciPy on the driver's machine "
                                   "(pip install 'pvm-dist[gp]'); tpe needs nothing more"]


@pytest.mark.skipif(not HAS_GP, reason="a gp search needs the gp extra (PyTorch, SciPy)")
def test_a_gp_sweep_runs_with_the_gp_extra(tmp_path, mlflow_uri, scripted):
    search = {"type": "gp", "trials": 5, "startup_trials": 2}
    assert isinstance(optuna_search._sampler(load_sweep(tpe(search=search)), 0), optuna.samplers.GPSampler)
    out = new_driver(tmp_path, mlflow_uri, search=search).run()
    assert out.status == "FINISHED" and [t["status"] for t in out.trials] == ["FINISHED"] * 5
    study = study_of(SweepFolder(tmp_path, "s"))
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 5
    # Past its 2 random trials the GP proposed the rest, inside the space.
    assert all(0 <= t.params["seed"] <= 1000 and 0.5 <= t.params["momentum"] <= 0.95 for t in study.trials)
    assert {f"t{t.number:03d}": t.value for t in study.trials} == {t["trial_id"]: t["metric"] for t in out.trials}


def test_a_bad_search_block_is_one_line_and_exit_2_in_a_dry_run(tmp_path):
    res = run(tmp_path, "run", str(sweep_file(tmp_path, "bad", search={"type": "cmaes"})), "--dry-run")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == ["pvm-dist: error: " + str(tmp_path / "bad.yaml")
                                               + ": search.type: unknown type 'cmaes'; known: tpe, gp, random, grid, pbt"]
    ok = run(tmp_path, "run", str(sweep_file(tmp_path, "ok", **{k: v for k, v in tpe().items() if k != "name"})),
             "--dry-run", "--json")
    assert ok.returncode == 0, ok.stderr
    plan = json.loads(ok.stdout)
    assert plan["trials"] == [] and plan["search"]["type"] == "tpe" and plan["search"]["trials"] == TRIALS


def test_a_tpe_sweep_round_trips_and_checks_the_model_at_its_bounds():
    sweep = load_sweep(tpe())
    again = load_sweep(json.loads(json.dumps(sweep.to_dict())))
    assert again.search == sweep.search and again.vary == sweep.vary and again.plan() == []
    with pytest.raises(SweepError) as info:  # the model rejects a learning rate below 0 at the lower bound
        load_sweep(tpe(vary={"initial_learning_rate": {"uniform": [-1.0, 0.1]}}))
    assert "vary.initial_learning_rate" in str(info.value)


# ---- population-based training ------------------------------------------------------------------------

FACTORS = (0.8, 1.25)
RATES = ("unit_learning_rate", "unit_momentum")
LR = (0.001, 0.1)


def pbt(**search) -> dict:
    return {"name": "p", "spec": "tiny", "steps": 300, "checkpoint_every": 100, "metrics_every": 50, "seed": 2,
            "backend": "native", "device": "cpu", "overrides": {"delay_each_layer_learning": 10},
            "vary": {"initial_learning_rate": {"loguniform": list(LR)}, "momentum": {"uniform": [0.5, 0.95]}},
            "search": {"type": "pbt", "population": 4, "interval_steps": 100, "quantile": 0.25,
                       "explore": {"initial_learning_rate": {"perturb": list(FACTORS)}, "momentum": "resample"},
                       **search}}


class EngineExecutor(ScriptedExecutor):
    """Trains each trial's tiny engine for real; every state it hands back is kept, by (trial, step)."""

    kept: dict[tuple[str, int], dict] = {}
    trial_of: dict[tuple[str, int], object] = {}  # the Trial (its values) that trained each kept state
    starts: list[tuple[str, object, dict | None]] = []  # (trial, Trial, state it started from)

    def __init__(self, sweep, chunks) -> None:
        super().__init__(sweep, chunks)
        self.sweep, self.engines, self.trials = sweep, {}, {}

    def start_trial(self, index, trial, state) -> None:
        super().start_trial(index, trial, state)
        self.value[trial.trial_id] = trial.varied["initial_learning_rate"]  # smaller is better
        config = self.sweep.trial_config(trial)
        engine = build_engine(config.spec, backend="native", n_seq=1, seed=config.seed, device="cpu")
        if state is not None:
            engine.load_state(state["engine"])
        source = make_source(config.data, config.spec.image_shape, 1, config.seed)
        self.engines[trial.trial_id] = (engine, source)
        self.trials[trial.trial_id] = trial
        EngineExecutor.starts.append((trial.trial_id, trial, state))

    def feed(self, trial_id: str) -> None:
        engine, source = self.engines[trial_id]
        while self._queued(trial_id) < 2 and self.at[trial_id] < self.chunks.steps:
            start = self.at[trial_id]
            end = self.at[trial_id] = self.chunks.end_after(start)
            if (trial_id, end) in self.lose:  # its worker dies when this chunk's result would come (see poll)
                index = next(i for i, t in self.workers.items() if t == trial_id)
                self.events.append(WorkerLost(index, "host/node00 cpu", trial_id, "ActorDiedError: killed"))
                return
            engine.run(end - start, source.frames)
            state = None
            if self.chunks.keeps_state(end):
                state = {"engine": engine.state(), "readout": {}, "run": {}}
                EngineExecutor.kept[(trial_id, end)] = {k: np.copy(v) for k, v in state["engine"].items()
                                                        if isinstance(v, np.ndarray)}
                EngineExecutor.trial_of[(trial_id, end)] = self.trials[trial_id]
            self.events.append(ChunkDone(trial_id, end - start, end, {"ratio_two_step": self.value[trial_id]},
                                         state, None))

    def poll(self, timeout_s: float) -> list:
        """A loss is spent when it is reported: one queued behind an exploit (which drops the member's queued
        chunks) comes when the member trains that chunk again."""
        out = super().poll(timeout_s)
        for e in out:
            if isinstance(e, WorkerLost):
                self.lose = {lost for lost in self.lose if lost[0] != e.trial_id}
        return out


@pytest.fixture
def engines(monkeypatch):
    monkeypatch.setattr(driver_module, "Executor", EngineExecutor)
    monkeypatch.setattr(driver_module, "run_opener", InlineOpener)
    monkeypatch.setattr(driver_module, "connect", lambda address: None)
    monkeypatch.setattr(EngineExecutor, "kept", {})
    monkeypatch.setattr(EngineExecutor, "trial_of", {})
    monkeypatch.setattr(EngineExecutor, "starts", [])
    monkeypatch.setattr(EngineExecutor, "lose", set())
    return EngineExecutor


def new_population(tmp_path, mlflow_uri) -> Driver:
    sweep = load_sweep(pbt())
    trials = sweep.plan()
    folder = SweepFolder.create(tmp_path, "s", sweep.to_dict(), [t.to_dict() for t in trials])
    return Driver(folder, sweep, trials, options(tmp_path, mlflow_uri), folder.state())


def check_exploits(folder: SweepFolder) -> list[dict]:
    """Every exploit: the member restarted from the donor's state bit for bit, with the donor's values explored."""
    events = folder.events()
    exploits = [e for e in events if e["event"] == "exploit"]
    values = {t["trial_id"]: t["varied"] for t in folder.definition()["trials"]}
    for ev in exploits:
        # Ranked among the values reported at the same step before it (quantile 1/4 of 4: the worst copies the best).
        rung = {e["trial"]: e["value"] for e in events[:events.index(ev)]
                if e["event"] == "milestone" and e["step"] == ev["at_step"]}
        assert len(rung) >= 2 and rung[ev["trial"]] == max(rung.values()) and rung[ev["donor"]] == min(rung.values())
        assert ev["step"] >= ev["at_step"]  # the donor's checkpoint is as far on: a member never goes back
        donor_values = values[ev["donor"]]
        lr, donor_lr = ev["values"]["initial_learning_rate"], donor_values["initial_learning_rate"]
        assert lr in {float(f"{min(max(donor_lr * f, LR[0]), LR[1]):.6g}") for f in FACTORS}
        assert 0.5 <= ev["values"]["momentum"] <= 0.95
        values[ev["trial"]] = ev["values"]
        restart = next(s for s in EngineExecutor.starts if s[0] == ev["trial"] and s[2] is not None
                       and s[2]["engine"]["step"] == ev["step"] and s[1].varied == ev["values"])
        _, trial, state = restart
        assert trial.overrides["initial_learning_rate"] == lr  # it continues with the explored values
        donor_arrays = EngineExecutor.kept[(ev["donor"], ev["step"])]
        assert donor_arrays.keys() <= state["engine"].keys()
        for key, array in donor_arrays.items():
            if key in RATES:
                continue
            assert array.dtype == state["engine"][key].dtype
            assert array.tobytes() == np.asarray(state["engine"][key]).tobytes(), key  # bit for bit
        # The rates are those the schedule gives at the donor's step: the donor's own values replayed give back the
        # donor's arrays, the member's explored values give the member's.
        donor_spec = load_spec("tiny").with_overrides(EngineExecutor.trial_of[(ev["donor"], ev["step"])].overrides)
        for key, array in zip(RATES, schedule_rates(donor_spec, ev["step"])):
            assert array.tobytes() == donor_arrays[key].tobytes()
        member_spec = load_spec("tiny").with_overrides(trial.overrides)
        for key, array in zip(RATES, schedule_rates(member_spec, ev["step"])):
            assert array.tobytes() == np.asarray(state["engine"][key]).tobytes()
        assert np.float32(lr) in state["engine"]["unit_learning_rate"]
    return exploits


def test_the_worst_member_copies_the_best_bit_for_bit_with_explored_values(tmp_path, mlflow_uri, engines):
    d = new_population(tmp_path, mlflow_uri)
    out = d.run()
    assert out.status == "FINISHED" and {t["status"] for t in out.trials} == {"FINISHED"}
    assert {t["step"] for t in out.trials} == {300}
    exploits = check_exploits(d.folder)
    assert exploits and all(e["at_step"] in (100, 200) for e in exploits)
    first = exploits[0]
    # Lineage: tags on the member's own MLflow run, the whole history in the parent run.
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    run = client.get_run(d.state.trials[first["trial"]].run_id)
    assert run.data.tags["pbt_exploits"] == str(sum(e["trial"] == first["trial"] for e in exploits))
    assert '"donor": "%s"' % first["donor"] in run.data.tags["pbt_lineage"]
    parent = client.list_artifacts(d.state.parent_run_id)
    assert {"pbt_lineage.json", "pbt_population.png"} <= {a.path for a in parent}
    picture = cv2.imread(str(d.folder.path / "pbt_population.png"))
    assert picture is not None and picture.shape[0] > 100 and picture.std() > 0  # drawn, not blank


def test_a_population_larger_than_its_workers_takes_turns_interval_by_interval(tmp_path, mlflow_uri, engines):
    # 4 members, 2 workers (the scripted cluster has 2 CPUs): a member that reaches an interval while another
    # waits pauses there, so the population reaches each interval together and later members find live donors.
    d = new_population(tmp_path, mlflow_uri)
    out = d.run()
    assert out.status == "FINISHED" and {t["step"] for t in out.trials} == {300}
    events = d.folder.events()
    reached = {k: [i for i, e in enumerate(events) if e["event"] == "milestone" and e["step"] == k] for k in (100, 200)}
    assert len(reached[100]) == len(reached[200]) == 4
    assert max(reached[100]) < min(reached[200])  # no member went past 100 before every member had reached it
    assert any(e["event"] == "exploit" and e["at_step"] == 200 for e in events)  # donors were there to copy
    paused = [(e["trial"], e["step"]) for e in events if e["event"] == "trial_paused"]
    assert len(paused) >= 4
    for trial_id, step in paused:  # each went on from its own state at that step, bit for bit
        state = next(s for t, _, s in engines.starts if t == trial_id and s is not None and s["engine"]["step"] == step)
        for key, array in EngineExecutor.kept[(trial_id, step)].items():
            assert array.tobytes() == np.asarray(state["engine"][key]).tobytes(), key
    check_exploits(d.folder)
    # One MLflow run per member, opened once and kept open through its pauses and copies.
    assert sorted(e["trial"] for e in events if e["event"] == "trial_run") == sorted(d.trials)
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    runs = client.search_runs(
        [client.get_experiment_by_name(f"s-{tmp_path.name}").experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{d.state.parent_run_id}'")
    assert sorted(r.data.tags["trial_id"] for r in runs) == sorted(d.trials)
    assert {r.info.status for r in runs} == {"FINISHED"}


def test_the_population_picture_needs_a_reported_metric(tmp_path):
    from pvm_dist.sweep.journal import SweepState, TrialState
    from pvm_dist.sweep.lineage import population_history

    state = SweepState(trials={})
    state.trials["t000"] = TrialState("t000")
    assert population_history(state, "ratio_two_step", tmp_path / "p.png") is None
    state.trials["t000"].logged = {100: (0, {"ratio_two_step": 2.0}), 200: (0, {"ratio_two_step": 1.5})}
    state.trials["t001"] = TrialState("t001")
    state.trials["t001"].logged = {100: (0, {"ratio_two_step": 3.0})}
    state.exploits.append({"trial": "t001", "donor": "t000", "step": 100, "at_step": 100, "values": {"lr": 0.1}})
    assert population_history(state, "ratio_two_step", tmp_path / "p.png") == tmp_path / "p.png"
    assert cv2.imread(str(tmp_path / "p.png")) is not None


def test_a_driver_dying_right_after_an_exploit_resumes_the_population(tmp_path, mlflow_uri, engines):
    d = new_population(tmp_path, mlflow_uri)
    append = d.folder.append

    def dying_append(event: str, **fields):
        record = append(event, **fields)
        if event == "exploit":
            raise Died  # journaled, the copy not yet in place
        return record

    d.folder.append = dying_append
    with pytest.raises(Died):
        d.run()
    died = SweepFolder(tmp_path, "s").events()
    exploit = next(e for e in died if e["event"] == "exploit")
    assert (d.folder.trial_dir(exploit["trial"]) / "exploit.pvmckpt").exists()

    out = resume_sweep("s", options(tmp_path, mlflow_uri))
    assert out.status == "FINISHED" and {t["status"] for t in out.trials} == {"FINISHED"}
    assert not (d.folder.trial_dir(exploit["trial"]) / "exploit.pvmckpt").exists()
    check_exploits(d.folder)  # the exploit journaled before the death was carried out from the donor's copy
    events = SweepFolder(tmp_path, "s").events()
    kept = {e["trial"]: e["step"] for e in died if e["event"] in ("checkpoint", "exploit")}
    restarts: dict[str, int] = {}
    for e in events[len(died):]:
        if e["event"] == "trial_started":
            restarts.setdefault(e["trial"], e["step"])
    assert restarts == {t: kept.get(t, 0) for t in restarts}  # each member went on from what it had kept
    assert restarts[exploit["trial"]] == exploit["step"] > 0  # the exploited one from the donor's copy
    row = {t["trial_id"]: t for t in out.trials}[exploit["trial"]]
    assert row["varied"] == [e for e in events if e["event"] == "exploit" and e["trial"] == exploit["trial"]][-1]["values"]


def test_a_lost_workers_member_continues_from_its_last_checkpoint_with_its_explored_values(tmp_path, mlflow_uri,
                                                                                           engines):
    # The worst member (largest learning rate) copies the best at step 100; its worker dies at step 150, before
    # its next checkpoint: the member's last checkpoint is that copy, with the values it explored.
    plan = load_sweep(pbt()).plan()
    worst = max(plan, key=lambda t: t.varied["initial_learning_rate"]).trial_id
    engines.lose = {(worst, 150)}
    d = new_population(tmp_path, mlflow_uri)
    out = d.run()
    assert out.status == "FINISHED" and {t["status"] for t in out.trials} == {"FINISHED"}
    events = d.folder.events()
    lost = [e for e in events if e["event"] == "trial_lost"]
    assert [(e["trial"], e["step"], e["reason"]) for e in lost] == [(worst, 100, "worker lost: ActorDiedError: killed")]
    before = events[:events.index(lost[0])]
    exploit = [e for e in before if e["event"] == "exploit" and e["trial"] == worst][-1]
    assert exploit["step"] == lost[0]["checkpoint_step"] == 100
    # Two starts from that checkpoint: after the copy, and on the replacement worker; the same state bit for bit,
    # the same explored values (not the plan's).
    starts = [(t, s) for w, t, s in engines.starts if w == worst and s is not None and s["engine"]["step"] == 100]
    assert len(starts) == 2
    (copied, first), (replaced, second) = starts
    assert copied.varied == replaced.varied == exploit["values"] != next(t.varied for t in plan if t.trial_id == worst)
    assert first["engine"].keys() == second["engine"].keys()
    for key, array in first["engine"].items():
        assert np.asarray(array).tobytes() == np.asarray(second["engine"][key]).tobytes(), key
    assert [e["step"] for e in events if e["event"] == "trial_started" and e["trial"] == worst][1:3] == [100, 100]
    assert {t["step"] for t in out.trials} == {300} and d.state.failures == 1
    row = {t["trial_id"]: t for t in out.trials}[worst]
    assert row["varied"] == [e for e in events if e["event"] == "exploit" and e["trial"] == worst][-1]["values"]
    check_exploits(d.folder)  # every exploit still copied its donor bit for bit


@pytest.mark.parametrize("search, problem", [
    ({"population": 1}, "search.population: must be an integer of at least 2"),
    ({"quantile": 0.0}, "search.quantile: must be a fraction in (0, 0.5]"),
    ({"quantile": 0.75}, "search.quantile: must be a fraction in (0, 0.5]"),
    ({"explore": {"final_learning_rate": "resample"}}, "search.explore.final_learning_rate: is not varied"),
    ({"explore": {"momentum": {"perturb": [0]}}}, "search.explore.momentum: must be resample or {perturb"),
    ({"interval_steps": 150}, "search.interval_steps: must be a multiple of checkpoint_every (100)"),
    ({"trials": 3}, "search.trials: a pbt search has a population"),
])
def test_bad_pbt_blocks_get_one_problem_each(search, problem):
    with pytest.raises(SweepError) as info:
        load_sweep(pbt(**search))
    assert len(info.value.problems) == 1 and info.value.problems[0].startswith(problem), info.value.problems


def test_pbt_checks_what_cannot_be_copied():
    raw = pbt()
    raw["vary"]["n_seq"] = {"choice": [1, 2]}
    with pytest.raises(SweepError, match="vary.n_seq: pbt members copy each other's state"):
        load_sweep(raw)
    raw = pbt(explore={"layer_shapes": "resample"})
    with pytest.raises(SweepError, match="search.explore.layer_shapes: is not varied"):
        load_sweep(raw)
