"""Engines: the numpy reference (the executable specification) and the native C++/CUDA engine.

Both implement the same API (architecture.md §2); :func:`build_engine` picks one by name.
"""

from __future__ import annotations

from typing import Any

BACKENDS = ("auto", "reference", "native")


def build_engine(spec: Any, backend: str = "reference", n_seq: int = 1, seed: int = 0, device: Any = None) -> Any:
    """Build an engine for ``spec`` (a Spec, a path, a zoo name or a dict) training ``n_seq`` sequences.

    ``backend="auto"`` takes the native engine where it is built (on ``device``, default: a CUDA GPU
    if one is visible, else the CPU) and the numpy reference engine otherwise.
    """
    spec, kind, device, topology = check_engine_build(spec, backend, n_seq, device)  # before anything is allocated
    if kind == "native":
        from pvm_dist.engine.native_engine import NativeEngine

        return NativeEngine(spec, n_seq=n_seq, seed=seed, device=device, topology=topology)
    from pvm_dist.engine.reference import ReferenceEngine

    return ReferenceEngine(spec, n_seq=n_seq, seed=seed, topology=topology)


def check_engine_build(spec: Any, backend: str = "reference", n_seq: int = 1, device: Any = None) -> tuple[Any, str, Any, Any]:
    """Every check :func:`build_engine` makes before it allocates (backend, n_seq, device, memory), without
    building: (the spec, "native" or "reference", the device, the topology), or the error the build would raise.
    A caller with several engines to build (``bench``) checks them all before the first one runs."""
    from pvm_dist.model.spec import load_spec

    spec = load_spec(spec)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if isinstance(n_seq, bool) or not isinstance(n_seq, int) or n_seq < 1:
        raise ValueError(f"n_seq must be a positive integer, got {n_seq!r}")
    from pvm_dist.engine.budget import DeviceUnavailable, check_device, check_engine
    from pvm_dist.model.topology import build_topology

    if backend == "native" or (backend == "auto" and _native_available()):
        device = check_device(device)
        topology = build_topology(spec)
        check_engine(topology, n_seq, device)
        return spec, "native", device, topology
    if device not in (None, "cpu"):
        raise DeviceUnavailable(f"the reference engine runs on the CPU only, not on device {device!r}")
    topology = build_topology(spec)
    check_engine(topology, n_seq, "cpu")
    return spec, "reference", device, topology


def _native_available() -> bool:
    from pvm_dist.engine.native import native_module

    return native_module() is not None
