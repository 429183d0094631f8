"""The Rich console the CLI prints tables with: the terminal's width on a terminal, and wide enough off one
(a pipe, a log file, a CI job) that no cell of a table is cut to "…" at Rich's default of 80 columns."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

OFF_TERMINAL_WIDTH = 200


def console() -> Console:
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=OFF_TERMINAL_WIDTH)
