"""A large file (a checkpoint) in a run's artifacts without a second copy on the same disk.

MLflow's local artifact store copies what is logged, so a checkpoint kept in a run folder and logged
would be on disk twice. :func:`keep_once` hard-links the file into the run's artifact folder when the
store is a local path, and logs it the usual way (an upload, through the tracker's durable outbox)
when it is a server or object store, whose copy lives elsewhere.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from pvm_dist.tracking.tracker import Tracker

log = logging.getLogger(__name__)


def keep_once(tracker: Tracker, path: Path, artifact_path: str) -> str:
    """Put ``path`` among the run's artifacts under ``artifact_path``; returns "linked" or "logged"."""
    local = _local_artifact_dir(tracker)
    if local is not None:
        target = local / artifact_path / path.name
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".link")
            tmp.unlink(missing_ok=True)
            os.link(path, tmp)
            os.replace(tmp, target)
            return "linked"
        except OSError as exc:  # another filesystem: the copy MLflow makes is on another disk anyway
            log.debug("cannot link %s into %s (%s); logging it", path, target, exc)
    tracker.log_artifact(path, artifact_path)
    return "logged"


def _local_artifact_dir(tracker: Tracker) -> Path | None:
    """The run's artifact folder when its store is a local path, else None (a server, an object store, away)."""
    if tracker.run_id is None:
        return None
    try:
        from mlflow import MlflowClient

        uri = MlflowClient(tracking_uri=tracker.uri).get_run(tracker.run_id).info.artifact_uri
    except Exception as exc:  # noqa: BLE001 - the store is away: fall back to logging through the outbox
        log.debug("cannot read the artifact location of run %s: %s", tracker.run_id, exc)
        return None
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" and uri.startswith("/"):
        return Path(uri)
    return None
