"""Where runs are tracked unless the caller says otherwise, and the standard tags that say where a run came
from (code version, host, backend, device)."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pvm_dist._version import __version__
from pvm_dist.tracking.normalize import stringify


def default_tracking_uri() -> str:
    """``PVM_MLFLOW_URI``, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///<cwd>/mlflow.db``.

    With the SQLite default, artifacts go to ``<cwd>/mlartifacts/<experiment>`` next to the database.
    """
    for name in ("PVM_MLFLOW_URI", "MLFLOW_TRACKING_URI"):
        if os.environ.get(name):
            return os.environ[name]
    return f"sqlite:///{(Path.cwd() / 'mlflow.db').resolve()}"


#: Where ``mlflow ui`` serves unless told otherwise.
LOCAL_UI = "http://127.0.0.1:5000"


def ui_command(uri: str) -> str | None:
    """The command that serves the MLflow UI over the store at ``uri``; None for a tracking server (http(s)),
    which serves its own."""
    return None if uri.startswith(("http://", "https://")) else f"mlflow ui --backend-store-uri {uri}"


def experiment_page(uri: str, experiment_id: str) -> str:
    """The address of an experiment's runs in the MLflow UI: the tracking server itself, else the local ``mlflow ui``
    (:data:`LOCAL_UI`). It names the model-training view: MLflow 3.17's UI opens in its GenAI view whatever the
    experiment's kind tag says, where runs are "evaluations" without their charts."""
    base = LOCAL_UI if ui_command(uri) else uri.rstrip("/")
    return f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def run_page(uri: str, experiment_id: str, run_id: str) -> str:
    """The address of a run's metric charts in the MLflow UI's model-training view (as :func:`experiment_page`)."""
    return experiment_page(uri, experiment_id).replace("/runs?", f"/runs/{run_id}/model-metrics?")


def page_line(uri: str, page: str) -> str:
    """``page``, and the command that serves it where a local ``mlflow ui`` must (:func:`ui_command`)."""
    command = ui_command(uri)
    return page + (f" (after {command})" if command else "")


def run_tags(backend: str | None = None, device_name: str | None = None,
             extra: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The standard tags of a training run: git commit (when the package runs from a checkout), host,
    pvm_dist version, backend, device, plus ``extra``."""
    tags: dict[str, str] = {"host": socket.gethostname(), "pvm_dist.version": __version__,
                            "mlflow.user": _user(), "mlflow.source.name": "pvm-dist", "mlflow.source.type": "LOCAL"}
    commit = _git_commit(Path(__file__).resolve().parent.parent)
    if commit:
        tags["git.commit"] = commit
        tags["mlflow.source.git.commit"] = commit  # the MLflow UI shows this one
    if backend is not None:
        tags["backend"] = str(backend)
    if device_name is not None:
        tags["device"] = str(device_name)
    for key, value in (extra or {}).items():
        tags[str(key)] = stringify(value)
    return tags


def _user() -> str:
    """The login name the MLflow UI shows as the run's user."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _git_commit(directory: Path) -> str | None:
    """HEAD of the checkout ``directory`` is the package folder of; None when it is not one."""
    try:
        top = subprocess.run(["git", "-C", str(directory), "rev-parse", "--show-toplevel", "HEAD"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = top.stdout.split()
    if top.returncode != 0 or len(lines) != 2:
        return None
    # Only our own checkout counts (not, say, a site-packages folder inside someone else's repository).
    if (Path(lines[0]) / directory.name).resolve() != directory:
        return None
    return lines[1]
