"""What a device has, checked before an engine is built on it: whether it exists at all, and whether an
engine of ``n_seq`` sequences fits in its memory.

Weights and momentum (fp32) are held once; every sequence adds its input, hidden and output rings
(``RING`` slots of ``x_total``, ``h_total`` and ``y_total`` floats, from the topology) and one frame.
A CUDA device is measured by its total memory (from the native module), the CPU by the host's.
"""

from __future__ import annotations

from pvm_dist.engine.base import RING
from pvm_dist.model.budget import MemoryBudgetError, format_bytes, host_memory_bytes
from pvm_dist.model.topology import Topology


class DeviceUnavailable(ValueError):
    """A device this machine, build or backend cannot give (``--device cuda`` without a GPU, say)."""


def check_device(device: str | None) -> str:
    """``device`` (default: a GPU if one is visible, else the CPU) if this build and machine have it; else
    one :class:`DeviceUnavailable` naming what is missing."""
    from pvm_dist.engine.native import build_info
    from pvm_dist.engine.native_engine import default_device

    if device is None:
        return default_device()
    kind, _, index = device.partition(":")
    if device == "cpu":
        return device
    if kind != "cuda" or (index and not index.isdigit()):
        raise DeviceUnavailable(f"unknown device {device!r}; expected cpu, cuda or cuda:N")
    info = build_info()
    if not info.get("cuda_compiled"):
        raise DeviceUnavailable(f"device {device!r}: this build of the native engine has no CUDA")
    indices = [d.get("index") for d in info.get("devices") or []]
    if int(index or 0) not in indices:
        seen = f"GPUs seen: {indices}" if indices else f"no CUDA GPU is visible ({info.get('cuda_error') or 'none found'})"
        raise DeviceUnavailable(f"device {device!r} is not available: {seen}")
    return device


def engine_bytes(topo: Topology, n_seq: int) -> tuple[int, int]:
    """(bytes held once: weights and momentum; bytes per sequence: rings and a frame)."""
    per_seq = 4 * RING * (topo.x_total + topo.h_total + topo.y_total) + 4 * topo.spec.image_side**2 * topo.spec.channels
    return 8 * topo.n_weights, per_seq


def device_memory_bytes(device: str | None) -> int | None:
    """Total memory of ``device`` (``cpu``/None: the host; ``cuda``/``cuda:N``: that GPU; None if unknown)."""
    if device is None or device == "cpu":
        return host_memory_bytes()
    from pvm_dist.engine.native import build_info

    index = int(device.partition(":")[2] or 0)
    for d in build_info().get("devices") or []:
        if d.get("index") == index:
            return int(d["total_memory_bytes"])
    return None


def check_engine(topo: Topology, n_seq: int, device: str | None, available: int | None = None,
                 where: str | None = None) -> None:
    """Raise :class:`MemoryBudgetError` naming the need and what ``device`` has (or ``where`` says, e.g.
    "a trial may use at most"), if the engine cannot fit in ``available`` bytes (default: the device's)."""
    available = device_memory_bytes(device) if available is None else available
    fixed, per_seq = engine_bytes(topo, n_seq)
    need = fixed + n_seq * per_seq
    if available is not None and need > available:
        where = where or ("this machine has" if device in (None, "cpu") else f"device {device} has")
        raise MemoryBudgetError(f"{topo.spec.name} at n_seq {n_seq:,} needs {format_bytes(need)} "
                                f"({format_bytes(n_seq * per_seq)} of activations, {format_bytes(fixed)} of weights "
                                f"and momentum); {where} {format_bytes(available)}")
