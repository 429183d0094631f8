"""Engines: the numpy reference (the executable specification) and the native C++/CUDA engine.

Both implement the same API (architecture.md §2); :func:`build_engine` picks one by name.
"""

from __future__ import annotations

from typing import Any

BACKENDS = ("auto", "reference", "native")


def build_engine(spec: Any, backend: str = "reference", n_seq: int = 1, seed: int = 0, device: Any = None) -> Any:
    """Build an engine for ``spec`` (a Spec, a path, a zoo name or a dict) training ``n_seq`` sequences."""
    from pvm_dist.spec import load_spec

    spec = load_spec(spec)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if isinstance(n_seq, bool) or not isinstance(n_seq, int) or n_seq < 1:
        raise ValueError(f"n_seq must be a positive integer, got {n_seq!r}")
    if backend == "native" or (backend == "auto" and _native_engine_available()):
        raise NotImplementedError("the native engine is not built yet (issue: native C++/CUDA engine)")
    from pvm_dist.engine.reference import ReferenceEngine

    return ReferenceEngine(spec, n_seq=n_seq, seed=seed)


def _native_engine_available() -> bool:
    return False
