"""Access to the compiled native engine, ``pvm_dist._native`` (C++17, CUDA optional).

The extension is imported lazily and at most once: importing :mod:`pvm_dist` never fails because the
module is missing (a pure-Python install, a source checkout that was not built) or broken (built for
another Python, a missing shared library). Callers ask :func:`native_module` and fall back to the
reference engine when it returns ``None``; :func:`native_import_error` says why, for error messages
and ``pvm-dist info``.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any

__all__ = ["native_module", "native_import_error", "build_info"]

_MODULE_NAME = "pvm_dist._native"


@functools.cache
def _load() -> tuple[ModuleType | None, str | None]:
    """Import the extension once; return (module, None) or (None, the reason it failed)."""
    try:
        return importlib.import_module(_MODULE_NAME), None
    except Exception as exc:  # an extension can fail in more ways than ImportError; never break the package
        return None, f"{type(exc).__name__}: {exc}"


def native_module() -> ModuleType | None:
    """Return the compiled ``pvm_dist._native`` module, or ``None`` if it cannot be imported.

    ``None`` means the native backend is unavailable and callers should use the reference engine.
    """
    return _load()[0]


def native_import_error() -> str | None:
    """Return why ``pvm_dist._native`` could not be imported (exception type and message), else ``None``."""
    return _load()[1]


def build_info() -> dict[str, Any]:
    """Describe the native build, for diagnostics and run metadata.

    With the module: its ``build_info()`` dict (version, compiler, ``cuda_compiled``, CUDA runtime,
    architectures, visible ``devices``, ``cuda_error``) plus ``"available": True``. The CUDA device
    query runs now, so the answer reflects this process (e.g. ``CUDA_VISIBLE_DEVICES``). Without the
    module: ``{"available": False, "error": <why it could not be imported>}``.
    """
    module, error = _load()
    if module is None:
        return {"available": False, "error": error}
    info = dict(module.build_info())
    info["available"] = True
    return info
