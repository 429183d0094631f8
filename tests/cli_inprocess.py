"""The ``pvm-dist`` entry point run inside the test process (no interpreter start: ~1 s saved per call)."""

from __future__ import annotations

import sys

import pytest


def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``pvm-dist ARGS`` through :func:`pvm_dist.cli.main.main`."""
    from pvm_dist.cli.main import main

    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["pvm-dist", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out = capsys.readouterr()
    code = exit_info.value.code
    return (0 if code is None else int(code)), out.out, out.err


def error_lines(err: str) -> list[str]:
    """The non-empty lines of ``err``."""
    return [line for line in err.splitlines() if line.strip()]
