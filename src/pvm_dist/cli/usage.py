"""Usage errors (a bad option value, a missing argument, no command) as one line, whichever click typer uses.

typer ≥ 0.12 may depend on click or vendor its own copy (``typer._click``); their exception classes are
unrelated, so catching ``click.UsageError`` alone misses every usage error of a typer that vendors it.
This module finds the classes of each copy present and turns an instance into one line naming the option.
"""

from __future__ import annotations

import importlib
from types import ModuleType

_CLICK_COPIES = ("typer._click.exceptions", "click.exceptions")


def _copies() -> list[ModuleType]:
    out = []
    for name in _CLICK_COPIES:
        try:
            out.append(importlib.import_module(name))
        except ImportError:
            continue
    return out


def click_types(name: str) -> tuple[type[BaseException], ...]:
    """The class called ``name`` (``UsageError``, ``ClickException``, ``Abort``, ``Exit``) of every click copy."""
    return tuple(getattr(m, name) for m in _copies() if isinstance(getattr(m, name, None), type))


def usage_line(exc: BaseException, prog: str = "pvm-dist") -> str:
    """One line for a usage error: the problem (naming the option or argument) and where help is."""
    ctx = getattr(exc, "ctx", None)
    path = prog
    if ctx is not None and getattr(ctx, "command_path", ""):
        path = " ".join([prog, *ctx.command_path.split()[1:]])
    if type(exc).__name__ == "NoArgsIsHelpError":
        problem = "no command given"
    else:
        problem = " ".join(str(exc.format_message()).split()) or type(exc).__name__
    return f"{prog}: usage error: {problem} (see: {path} --help)"
