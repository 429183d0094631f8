"""Helpers of the sweep tests: write a sweep file, start the driver as a process, read its journal and runs."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml
from conftest import cli_command

#: Ray on a test machine: no usage reports (token authentication stays as Ray sets it: on).
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}


def sweep_file(folder: Path, name: str = "t", **fields: Any) -> Path:
    """A sweep of the tiny model (overridable field by field), written to ``folder/name.yaml``."""
    body = {"name": name, "spec": "tiny", "steps": 400, "checkpoint_every": 100, "metrics_every": 50,
            "n_seq": 1, "data": "synthetic:balls", "backend": "native",
            "overrides": {"delay_each_layer_learning": 10}, **fields}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def environment(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, **RAY_ENV, "PVM_MLFLOW_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


def start(tmp_path: Path, *args: str) -> subprocess.Popen:
    """``pvm-dist sweep ARGS --root tmp/sweeps`` as a process (stdout/stderr to files in tmp_path)."""
    out = open(tmp_path / "driver.out", "a")  # noqa: SIM115 - closed with the process by the OS
    err = open(tmp_path / "driver.err", "a")  # noqa: SIM115
    return subprocess.Popen([*cli_command(), "sweep", *args, "--root", str(tmp_path / "sweeps")], cwd=tmp_path,
                            stdout=out, stderr=err, env=environment(tmp_path))


def run(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*cli_command(), "sweep", *args, "--root", str(tmp_path / "sweeps")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout, env=environment(tmp_path))


def sweep_dir(tmp_path: Path, timeout: float = 60) -> Path:
    """The (only) sweep folder under tmp/sweeps, once the driver has created it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted((tmp_path / "sweeps").glob("*/journal.jsonl"))
        if found:
            return found[0].parent
        time.sleep(0.05)
    raise TimeoutError(f"no sweep journal under {tmp_path / 'sweeps'}; driver said: {driver_output(tmp_path)}")


def events(folder: Path) -> list[dict[str, Any]]:
    path = folder / "journal.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def wait_for(folder: Path, predicate, timeout: float = 120, proc: subprocess.Popen | None = None) -> dict[str, Any]:
    """The first journal event for which ``predicate(event)`` holds (polling), else TimeoutError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ev in events(folder):
            if predicate(ev):
                return ev
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"driver exited ({proc.returncode}) first: {driver_output(folder.parent.parent)}")
        time.sleep(0.02)
    raise TimeoutError(f"no such event in {folder / 'journal.jsonl'}")


def driver_output(tmp_path: Path) -> str:
    parts = [(tmp_path / n).read_text()[-3000:] for n in ("driver.out", "driver.err") if (tmp_path / n).exists()]
    return "\n".join(parts)


def of(evs: list[dict[str, Any]], kind: str, trial: str | None = None) -> list[dict[str, Any]]:
    return [e for e in evs if e["event"] == kind and (trial is None or e.get("trial") == trial)]


def mlflow_runs(tmp_path: Path, experiment: str) -> list[Any]:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id], max_results=1000)


def trial_runs(runs: list[Any]) -> dict[str, Any]:
    """Nested trial runs by trial id (asserting there is one run per trial: no duplicates)."""
    out: dict[str, Any] = {}
    for r in runs:
        if "mlflow.parentRunId" in r.data.tags:
            tid = r.data.tags["trial_id"]
            assert tid not in out, f"two MLflow runs for trial {tid}"
            out[tid] = r
    return out
