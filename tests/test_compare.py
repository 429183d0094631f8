"""`pvm-dist compare` on a real SQLite MLflow store."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
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


def test_compare_table_and_errors(store):
    out = run("compare", "cmp", "--mlflow", store)
    assert out.returncode == 0 and "lr" in out.stdout and "0.02" in out.stdout
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
