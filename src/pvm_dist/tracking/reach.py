"""A tracking store checked in well under a second before a command relies on it.

MLflow retries an unreachable server for minutes and an unusable SQLite path (a folder, a read-only
folder) for about as long before it fails, so a typo in ``--mlflow`` cost minutes. :func:`check_store`
looks first: a SQLite file must be a file in a writable folder (or, for reading, exist: ``compare`` must
not create an empty ``mlflow.db``), and an HTTP server read from must accept a TCP connection within
:data:`CONNECT_TIMEOUT_S` (one logged to may be away: the tracker spools). MLflow's file store (``file:``
URIs and plain paths) is refused for logging: MLflow 3 keeps it in maintenance mode and refuses it unless
``MLFLOW_ALLOW_FILE_STORE=true``, and it stores a metric point again each time it is sent, so the points a
resumed run or a restarted trial sends again (which SQL stores keep once) would be doubled. It is read
(``compare``) where MLflow is allowed to. A scheme MLflow has no store for (a typo) and a SQLite URI without a
file are refused; other schemes (``databricks``, ``postgresql``) are left to MLflow.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

CONNECT_TIMEOUT_S = 3.0


class TrackingStoreError(ValueError):
    """A tracking URI that names no usable store; one line naming the URI and the problem."""


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for other schemes or in-memory databases)."""
    if not uri.startswith("sqlite:"):
        return None
    rest = uri[len("sqlite:"):]
    if not rest.startswith("///") or rest[3:] in ("", ":memory:"):
        return None
    return Path(rest[3:])  # sqlite:///rel/path, sqlite:////abs/path


def check_store(uri: str, write: bool) -> None:
    """Raise :class:`TrackingStoreError` if ``uri`` cannot be used (``write``: logged to; else read)."""
    db = sqlite_path(uri)
    if db is not None:
        _check_sqlite(uri, db, write)
        return
    if uri.startswith("sqlite:"):  # sqlite:// or sqlite:///:memory: (SQLAlchemy's in-memory database)
        raise TrackingStoreError(f"MLflow store {uri}: names no database file (in memory, nothing would be kept); "
                                 f"use sqlite:///PATH/mlflow.db")
    parts = urlsplit(uri)
    known = _store_schemes()
    scheme = parts.scheme.split("+", 1)[0]  # postgresql+psycopg2: the dialect and its driver
    if known is not None and scheme not in known:
        raise TrackingStoreError(f"MLflow store {uri}: MLflow has no tracking store for {parts.scheme or uri!r} URIs "
                                 f"(it knows {', '.join(sorted(k for k in known if k))}); e.g. sqlite:///PATH/mlflow.db "
                                 f"or http://HOST:PORT")
    file_store = parts.scheme in ("", "file") and not uri.startswith("databricks")
    if file_store and (write or os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() != "true"):
        raise TrackingStoreError(
            f"MLflow store {uri}: MLflow's file store is not supported"
            + (" for logging: it would keep twice the metric points a resumed run sends again" if write else "")
            + "; use sqlite:///PATH/mlflow.db (`mlflow migrate-filestore` moves an existing one)")
    if parts.scheme in ("http", "https") and not write:  # writers spool while a server is away (tracker.py)
        _check_server(uri, parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))


def _store_schemes() -> set[str] | None:
    """The URI schemes MLflow has a tracking store for, its plugins' included; None where this MLflow does not say
    (the registry is MLflow's own, not public: an MLflow without it leaves every scheme to MLflow, as before)."""
    try:
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry

        return set(_tracking_store_registry._registry)
    except Exception:  # noqa: BLE001 - any MLflow that does not have it
        return None


def _check_sqlite(uri: str, db: Path, write: bool) -> None:
    if db.is_dir():
        raise TrackingStoreError(f"MLflow store {uri}: {db} is a folder, not a SQLite file")
    if not write:
        if not db.is_file():
            raise TrackingStoreError(f"no MLflow store at {uri} ({db} does not exist; give --mlflow URI)")
        return
    folder = db.parent
    if not folder.is_dir():
        raise TrackingStoreError(f"MLflow store {uri}: folder {folder} does not exist")
    writable = os.access(db, os.W_OK) if db.exists() else os.access(folder, os.W_OK | os.X_OK)
    if not writable:
        raise TrackingStoreError(f"MLflow store {uri}: {db if db.exists() else folder} is not writable")


def _check_server(uri: str, host: str, port: int) -> None:
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise TrackingStoreError(f"cannot reach MLflow at {uri} ({reason})") from None
