"""`pvm-dist compare` on a real SQLite MLflow store."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from cli_inprocess import run_cli
from conftest import cli_command

mlflow = pytest.importorskip("mlflow")


@pytest.fixture
def store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("cmp", artifact_location=str(tmp_path / "art"))
    finals = {"a": 0.9, "b": 0.5, "c": 0.7}
    for name, final in finals.items():
        run = client.create_run(exp, run_name=name)
        client.log_param(run.info.run_id, "spec", "tiny")
        client.log_param(run.info.run_id, "lr", {"a": "0.01", "b": "0.02", "c": "0.03"}[name])
        for step in range(1, 6):
            client.log_metric(run.info.run_id, "ratio_two_step", 1.0 - (1.0 - final) * step / 5, step=step)
        client.log_metric(run.info.run_id, "frames_per_s", 100.0 * (1 + ord(name) - ord("a")), step=5)
        client.set_terminated(run.info.run_id)
    return uri


def run(*args):
    env = {**os.environ, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    return subprocess.run([*cli_command(), *args], capture_output=True, text=True, timeout=180, env=env)


def test_compare_json_sorts_and_shows_differing_params(store, tmp_path):
    out = run("compare", "cmp", "--mlflow", store, "--json", "--plot", str(tmp_path / "curves.png"))
    assert out.returncode == 0, out.stderr
    js = json.loads(out.stdout)
    assert [r["name"] for r in js["runs"]] == ["b", "c", "a"]  # ratio: lower is better
    assert js["differing_params"] == ["lr"] and js["runs"][0]["params"] == {"lr": "0.02"}
    assert js["runs"][0]["frames_per_s"] == 200.0
    png = tmp_path / "curves.png"
    assert png.exists() and png.stat().st_size > 5000 and png.read_bytes()[:4] == b"\x89PNG"
    out = run("compare", "cmp", "--mlflow", store, "--metric", "frames_per_s", "--json")
    assert [r["name"] for r in json.loads(out.stdout)["runs"]] == ["c", "b", "a"]  # rates: higher is better
    # where the MLflow UI shows them: the experiment's runs and each run's charts, in the model-training view
    eid = mlflow.MlflowClient(tracking_uri=store).get_experiment_by_name("cmp").experiment_id
    assert js["mlflow_page"] == f"http://127.0.0.1:5000/#/experiments/{eid}/runs?workflowType=machine_learning"
    b = js["runs"][0]
    assert b["mlflow_page"] == f"http://127.0.0.1:5000/#/experiments/{eid}/runs/{b['run_id']}/model-metrics?workflowType=machine_learning"


def test_compare_table_and_errors(store):
    out = run("compare", "cmp", "--mlflow", store)
    assert out.returncode == 0 and "lr" in out.stdout and "0.02" in out.stdout
    assert "runs   http://127.0.0.1:5000/#/experiments/" in out.stdout and f"(after mlflow ui --backend-store-uri {store})" in out.stdout
    out = run("compare", "nope", "--mlflow", store)
    assert out.returncode == 2 and "no experiment named 'nope'" in out.stderr and "cmp" in out.stderr
    out = run("compare", "cmp", "--mlflow", store, "--metric", "iou")
    assert out.returncode == 2 and "no run of 'cmp' has metric 'iou'" in out.stderr


def test_a_value_logged_under_several_names_is_shown_once():
    from pvm_dist.tracking.compare import RunRow, differing_params

    def row(lr: str, seed: str) -> RunRow:
        return RunRow("id", "n", "FINISHED", {"varied.lr": lr, "spec.lr": lr, "overrides.lr": lr, "seed": seed,
                                              "spec.momentum": "0.9"}, {}, 0)

    assert differing_params([row("0.1", "1"), row("0.2", "2")]) == ["seed", "varied.lr"]
    # Under one name only when the values agree.
    odd = RunRow("id", "n", "FINISHED", {"varied.lr": "0.3", "spec.lr": "0.4", "seed": "3"}, {}, 0)
    assert "spec.lr" in differing_params([row("0.1", "1"), odd])


@pytest.fixture
def sweep_store(tmp_path):
    """Trials as a sweep leaves them: finished, stopped early by ASHA, failed, killed, resumed."""
    uri = f"sqlite:///{tmp_path / 'sweep.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("sw", artifact_location=str(tmp_path / "art"))
    trials = {  # name: (lr, seed, steps logged, final ratio, status, tags)
        "full": ("0.01", "0", range(1, 11), 0.8, "FINISHED", {"sweep_status": "FINISHED"}),
        "resumed": ("0.02", "0", [*range(1, 4), *range(4, 7)], 0.7, "FINISHED", {}),
        "stopped": ("0.03", "0", range(1, 6), 0.5, "FINISHED", {"sweep_status": "STOPPED", "status_reason": "early stop"}),
        "failed": ("0.04", "0", range(1, 4), 0.6, "FAILED", {"sweep_status": "FAILED", "status_reason": "diverged by step 3"}),
        "killed": ("0.01", "1", range(1, 5), 0.9, "KILLED", {}),
    }
    for name, (lr, seed, steps, final, status, tags) in trials.items():
        run = client.create_run(exp, run_name=name, tags=tags)
        for k, v in {"varied.initial_learning_rate": lr, "spec.initial_learning_rate": lr, "seed": seed,
                     "spec_name": "tiny", "spec.momentum": "0.1", "steps": "3" if name == "resumed" else "10"}.items():
            client.log_param(run.info.run_id, k, v)
        for step in steps:
            client.log_metric(run.info.run_id, "ratio_two_step", final + 0.01 * (10 - step), step=step)
        client.set_terminated(run.info.run_id, status=status)
    return uri


def test_compare_says_how_each_trial_ended_and_ranks_whole_runs_first(sweep_store):
    out = run("compare", "sw", "--mlflow", sweep_store, "--json")
    assert out.returncode == 0, out.stderr
    js = json.loads(out.stdout)
    runs = {r["name"]: r for r in js["runs"]}
    assert [r["name"] for r in js["runs"]][:2] == ["resumed", "full"]  # the stopped trial's lower ratio is at step 5
    assert runs["full"]["ended"] == "finished" and runs["full"]["step"] == 10
    assert runs["resumed"]["step"] == 6  # its last logged step, not the steps it was first asked for
    assert runs["stopped"]["ended"] == "stopped by ASHA at step 5"
    assert runs["failed"]["ended"] == "failed at step 3: diverged by step 3"
    assert runs["killed"]["ended"] == "killed at step 4"
    # Only what varies, under short names; momentum is tiny's own value in every run, so no column.
    assert js["columns"] == {"seed": "seed", "steps": "steps", "varied.initial_learning_rate": "lr"}
    assert runs["full"]["label"] == "seed=0 steps=10 lr=0.01"


def test_group_by_seed_gives_mean_and_std():
    from pvm_dist.tracking.compare import group_by

    runs = [{"params": {"seed": s, "varied.initial_learning_rate": lr}, "metric": m, "name": f"r{i}", "run_id": str(i)}
            for i, (s, lr, m) in enumerate([("0", "0.1", 1.0), ("1", "0.1", 3.0), ("0", "0.2", 5.0)])]
    groups = {g["params"]["varied.initial_learning_rate"]: g for g in group_by(runs, "seed")}
    assert groups["0.1"]["runs"] == 2 and groups["0.1"]["metric_mean"] == 2.0
    assert groups["0.1"]["metric_std"] == pytest.approx(2 ** 0.5)
    assert groups["0.2"]["runs"] == 1 and groups["0.2"]["metric_std"] == 0.0


@pytest.fixture
def lr_matters_store(tmp_path, migrated_db):
    """Twelve finished trials (lr × momentum × seed) where the learning rate decides the ratio and momentum
    and seed move it by less than a hundredth; one more trial stopped early by ASHA, which must not count."""
    shutil.copy(migrated_db, tmp_path / "imp.db")  # the schema made once per session
    from mlflow.entities import Metric, Param

    uri = f"sqlite:///{tmp_path / 'imp.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("imp", artifact_location=str(tmp_path / "art"))

    def log(run_id: str, params: dict[str, str], ratio: float) -> None:
        client.log_batch(run_id, metrics=[Metric("ratio_two_step", ratio, 0, 10)],
                         params=[Param(k, v) for k, v in params.items()])
        client.set_terminated(run_id)

    ratio = {"0.1": 1.6, "0.2": 1.3, "0.4": 1.0}
    trials = [(lr, mom, seed) for lr in ratio for mom in ("0.1", "0.5") for seed in ("0", "1")]
    for i, (lr, mom, seed) in enumerate([*trials, ("0.1", "0.1", "2")]):
        stopped = i == len(trials)
        run = client.create_run(exp, run_name=f"t{i:03d}", tags={"sweep_status": "STOPPED" if stopped else "FINISHED"})
        value = 0.2 if stopped else ratio[lr] + 0.004 * float(mom) + 0.003 * int(seed)
        log(run.info.run_id, {"varied.initial_learning_rate": lr, "varied.momentum": mom, "seed": seed}, value)
    few = client.create_experiment("few", artifact_location=str(tmp_path / "art"))
    for lr in ("0.1", "0.2", "0.3"):
        run = client.create_run(few, run_name=f"lr{lr}")
        log(run.info.run_id, {"varied.initial_learning_rate": lr}, float(lr))
    return uri


def test_importance_finds_the_parameter_that_decides_the_ratio(lr_matters_store, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "compare", "imp", "--mlflow", lr_matters_store, "--importance", "--json")
    assert code == 0, err
    imp = json.loads(out)["importance"]
    assert imp["finished"] == 12  # the stopped trial's ratio is from another step: left out
    params = {p["name"]: p for p in imp["params"]}
    assert [p["name"] for p in imp["params"]][0] == "lr" and params["lr"]["best_value"] == "0.4"
    assert params["lr"]["importance"] > 0.6 > params["mom"]["importance"] and params["seed"]["importance"] < 0.3
    assert sum(p["importance"] for p in imp["params"]) == pytest.approx(1.0)
    code, out, _ = run_cli(monkeypatch, capsys, "compare", "imp", "--mlflow", lr_matters_store, "--importance")
    assert code == 0 and "PED-ANOVA" in out and "12 finished runs" in out
    lines = {line.split()[1]: line for line in out.splitlines() if line.strip().startswith("│ ") and "0." in line}
    assert set(lines) >= {"lr", "mom", "seed"}
    # Too few finished runs: one line saying how many it needs, and the comparison still printed.
    code, out, _ = run_cli(monkeypatch, capsys, "compare", "few", "--mlflow", lr_matters_store, "--importance")
    assert code == 0 and "importance: needs 8 finished runs, this experiment has 3" in out and "lr0.2" in out
