"""Adaptive search (issue 14): the ``search`` block's checks, and a TPE search driven through the driver with the
scripted executor of tests/test_sweep_driver.py (a trial's metric is its seed): trials asked for as workers free
up, the study told every result, and a driver that dies between two of its writes resumed without asking a trial
twice. The same search on Ray, killed with SIGKILL, is in tests/test_sweep_faults.py."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState
from sweep_helpers import run, sweep_file
from test_sweep_driver import ScriptedExecutor

from pvm_dist.sweep import driver as driver_module
from pvm_dist.sweep import optuna_search
from pvm_dist.sweep.driver import Driver, DriverOptions, resume_sweep
from pvm_dist.sweep.journal import SweepFolder
from pvm_dist.sweep.plan import SweepError, load_sweep

TRIALS, CONCURRENT = 7, 2


def tpe(**extra) -> dict:
    return {"name": "s", "spec": "tiny", "steps": 600, "checkpoint_every": 200, "metrics_every": 100,
            "vary": {"seed": {"randint": [0, 1000]}, "momentum": {"uniform": [0.5, 0.95]}},
            "search": {"type": "tpe", "trials": TRIALS, "startup_trials": 3}, "max_concurrent": CONCURRENT, **extra}


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setattr(driver_module, "Executor", ScriptedExecutor)
    monkeypatch.setattr(driver_module, "connect", lambda address: None)
    monkeypatch.setattr(ScriptedExecutor, "lose", set())
    monkeypatch.setattr(ScriptedExecutor, "fail", False)
    return ScriptedExecutor


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


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
    ({"type": "bayes"}, "search.type: unknown type 'bayes'; known: tpe, gp, random, grid"),
    ({"type": "tpe"}, "search.trials: is required for a tpe search"),
    ({"type": "tpe", "trials": 4, "budget": 3}, "search.budget: unknown key"),
    ({"type": "grid"}, "vary.seed: a grid search takes lists of values, not a distribution"),
    ({"type": "random", "trials": 2, "startup_trials": 1}, "search.startup_trials: only tpe and gp"),
])
def test_bad_search_blocks_get_one_problem_each(search, problem):
    with pytest.raises(SweepError) as info:
        load_sweep(tpe(search=search))
    assert len(info.value.problems) == 1 and info.value.problems[0].startswith(problem)


def test_a_bad_search_block_is_one_line_and_exit_2_in_a_dry_run(tmp_path):
    res = run(tmp_path, "run", str(sweep_file(tmp_path, "bad", search={"type": "cmaes"})), "--dry-run")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == ["pvm-dist: error: " + str(tmp_path / "bad.yaml")
                                               + ": search.type: unknown type 'cmaes'; known: tpe, gp, random, grid"]
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
