"""Third-party log lines a user cannot act on, kept off the terminal.

MLflow announces at INFO that it creates and upgrades the tables of a new SQLite store (every first
run of a folder); those stay quiet. Warnings and errors of every library still show.
"""

from __future__ import annotations

import logging

#: Loggers whose INFO lines say nothing a user can act on.
CHATTY = ("mlflow.store.db.utils", "alembic.runtime.migration", "alembic")


def quiet_third_party() -> None:
    """Raise the chatty loggers to WARNING (before MLflow configures its own handlers: levels persist)."""
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.WARNING)
