"""Shared fixtures. Tests that read ../shared skip cleanly where it is absent (a user's clone)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("PVM_SHARED_DIR", REPO.parent / "shared"))
ORIGINAL_ZOO = SHARED / "data" / "original_model_zoo"
ZOO = REPO / "model_zoo"
ZOO_NAMES = ["small", "med", "med_exp", "LARGE", "classic", "classic_medium",
             "experiment1_green_ball", "experiment1_stop_sign", "experiment2"]


@pytest.fixture
def original_zoo() -> Path:
    if not ORIGINAL_ZOO.is_dir():
        pytest.skip(f"{ORIGINAL_ZOO} not present (../shared is only beside the developers' checkout)")
    return ORIGINAL_ZOO


@pytest.fixture(scope="session")
def migrated_db(tmp_path_factory) -> Path:
    """A SQLite MLflow store with its schema made once (seconds on a small machine); tests copy it."""
    mlflow = pytest.importorskip("mlflow")
    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


# The state arrays a step changes, which two engines (or two runs) given the same frames must agree on.
STEPPED_STATE = ("weights", "momentum", "x_ring", "h_ring", "y_ring")


def random_frames(spec, n_steps: int, n_seq: int = 1, seed: int = 0) -> np.ndarray:
    """uint8 BGR frames [n_steps, n_seq, D, D, C], never all zeros."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n_steps, n_seq, *spec.image_shape), dtype=np.uint8)


def cli_command() -> list[str]:
    """The installed ``pvm-dist`` script beside this Python, else ``python -m pvm_dist.cli.main``.

    The script does not put the working directory on sys.path, so tests run from the checkout
    still exercise the installed package (with its native module).
    """
    import sys

    script = Path(sys.executable).parent / "pvm-dist"
    return [str(script)] if script.exists() else [sys.executable, "-m", "pvm_dist.cli.main"]


@pytest.fixture
def mlflow_offline_env(monkeypatch):
    """Fast failure against a dead server, and no tracking URI leaking in from the environment."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("PVM_MLFLOW_URI", raising=False)


@pytest.fixture
def scripted(monkeypatch):
    """The driver runs on tests/scripted_executor.py's stand-in for Ray (no cluster, no workers)."""
    from scripted_executor import InlineOpener, ScriptedExecutor

    from pvm_dist.sweep import driver as driver_module

    monkeypatch.setattr(driver_module, "Executor", ScriptedExecutor)
    monkeypatch.setattr(driver_module, "run_opener", InlineOpener)
    monkeypatch.setattr(driver_module, "connect", lambda address: None)
    monkeypatch.setattr(driver_module, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(ScriptedExecutor, "lose", set())
    monkeypatch.setattr(ScriptedExecutor, "fail", False)
    return ScriptedExecutor


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory) -> str:
    """One SQLite MLflow store per test module."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def native_cuda_available() -> bool:
    """True when the native module is built with CUDA and sees a GPU."""
    from pvm_dist.engine.native import build_info

    info = build_info()
    return bool(info.get("available") and info.get("cuda_compiled") and info.get("devices"))


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the tests marked exhaustive (the whole fault-injection suite, the long engine comparisons)")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``exhaustive`` run only with ``--slow``; tests marked ``gpu`` skip cleanly where there is
    no CUDA GPU (and native CUDA build)."""
    if not config.getoption("--slow"):
        skip_heavy = pytest.mark.skip(reason="exhaustive: run with pytest --slow")
        for item in items:
            if "exhaustive" in item.keywords:
                item.add_marker(skip_heavy)
    if native_cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and the native engine built with CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
