"""Third-party log lines a user cannot act on, kept off the terminal.

MLflow announces at INFO that it creates and upgrades the tables of a new SQLite store (every first
run of a folder), and Ray warns on every local start that it turned token authentication on (its
secure default, nothing to do). Those stay quiet; every other warning and error of every library
still shows, Ray's warning that authentication is *off* included.
"""

from __future__ import annotations

import logging

#: Loggers whose INFO lines say nothing a user can act on.
CHATTY = ("mlflow.store.db.utils", "alembic.runtime.migration", "alembic")
RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


class _DropMessage(logging.Filter):
    """Drops records whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


def quiet_third_party() -> None:
    """Raise the chatty loggers to WARNING and drop Ray's token-auth-enabled notice (levels and filters
    set before the libraries log persist when they configure their own handlers)."""
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.WARNING)
    ray_auth = logging.getLogger(RAY_AUTH_LOGGER)
    if not any(isinstance(f, _DropMessage) for f in ray_auth.filters):
        ray_auth.addFilter(_DropMessage("Token authentication is enabled"))
