"""Memory budgets: a model too big for this machine is refused with its size before anything is allocated.

:func:`graph_bytes` is a lower bound, in closed form from the spec alone, of what building the graph
(:class:`~pvm_dist.model.topology.Topology`) and one model's weights and momentum take, so a spec of
terabytes fails in microseconds with "needs at least X; this machine has Y" instead of swapping for minutes
and dying of ``MemoryError``. The engines add their per-sequence state on top (``engine/budget.py``).
"""

from __future__ import annotations

import os

import numpy as np

from pvm_dist.model.spec import Spec

_EMPTY_LIST_BYTES = 56  # a Python list object: the graph keeps three per unit
_UNITS = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


class MemoryBudgetError(ValueError):
    """A model, or a batch of sequences of it, needs more memory than the machine (or device) has."""


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units, three significant digits (``525 TiB``)."""
    i = 0
    while n >= 1024 and i < len(_UNITS) - 1:
        n, i = n / 1024, i + 1
    return f"{n:,.0f} {_UNITS[i]}" if i == 0 or n >= 100 else f"{n:.3g} {_UNITS[i]}"


def host_memory_bytes() -> int | None:
    """This machine's physical memory (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def _kept_fan_in(q: int, radius: float) -> int:
    """A lower bound of the cells of the q×q fan-in square within ``radius`` of its centre (§2.3), in O(q):
    per row, the cells within the chord, one fewer for rounding at its ends."""
    offsets = np.arange(q, dtype=np.float64) - (q - 1) / 2
    half = np.sqrt(np.maximum(radius**2 - offsets**2, 0.0))
    inside = np.searchsorted(offsets, half, side="right") - np.searchsorted(offsets, -half, side="left")
    return int(np.maximum(inside - 1, 0)[offsets**2 <= radius**2].sum())


def graph_bytes(spec: Spec) -> int:
    """A lower bound of the bytes the graph and one copy of weights plus momentum (fp32) take.

    Counts only what every spec has: each unit's new and previous signal, its bias, and as context at
    least the units it feeds (lateral and extra context only add); the per-unit index lists of the
    graph (three Python lists per unit, 8 bytes per projection in each) and the int64 input gather map.
    """
    shapes, hidden = spec.layer_shapes, spec.hidden
    units = [s * s for s in shapes]
    kept = _kept_fan_in(spec["fan_in_square_size"], spec["fan_in_radius"]) if len(shapes) > 1 else 0
    signal = [spec.block * spec.block * spec.channels] + [hidden * kept] * (len(shapes) - 1)
    projections = kept * sum(units[1:])
    signal_total = sum(u * p for u, p in zip(units, signal))
    inputs_total = 2 * signal_total + hidden * projections + sum(units)  # Σ(N+1)
    weights = hidden * inputs_total + 2 * signal_total * (hidden + 1)  # W0 + W1
    return 8 * weights + 8 * inputs_total + 3 * 8 * projections + 3 * _EMPTY_LIST_BYTES * sum(units)


def check_graph(spec: Spec, available: int | None = None) -> None:
    """Raise :class:`MemoryBudgetError` if the spec's graph and weights cannot fit in host memory."""
    available = host_memory_bytes() if available is None else available
    need = graph_bytes(spec)
    if available is not None and need > available:
        raise MemoryBudgetError(f"spec {spec.source}: {spec.name} needs at least {format_bytes(need)} for its graph, "
                                f"weights and momentum (layer_shapes {list(spec.layer_shapes)}, hidden_block_size "
                                f"{spec['hidden_block_size']}); this machine has {format_bytes(available)}")
