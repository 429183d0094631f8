"""The original's float32 arithmetic, element by element (pvm-algorithm.md §3.2–3.7, §3.12).

Every engine must reproduce these roundings; the native engine's per-unit math mirrors them
(compiled with floating-point contraction off). Arrays in, arrays out, no state.
"""

from __future__ import annotations

import numpy as np

F32, F64 = np.float32, np.float64
_HALF, _ONE, _TWO = F32(0.5), F32(1.0), F32(2.0)


def initial_weights(n_weights: int, seed: int, *, chunk: int = 1 << 22) -> np.ndarray:
    """U[0,1) in float64 → float32, minus 0.5, times 0.03 in float32 (§3.2), from a seeded RNG.

    Every backend takes its initial weights from here, so the same seed means the same weights. The
    draws go through a float64 buffer of ``chunk`` values (the stream is the one a single call gives):
    for LARGE's 119M weights one call took 1.1–2.4 s and peaked at 1.4 GB on a 2-core machine, chunked
    0.7–1.1 s and 0.5 GB.
    """
    rng = np.random.default_rng(seed)
    out = np.empty(n_weights, dtype=F32)
    buf = np.empty(min(chunk, n_weights), dtype=F64)
    for i in range(0, n_weights, chunk):
        u = buf[:min(chunk, n_weights - i)]
        rng.random(out=u)
        w = out[i:i + len(u)]
        w[...] = u  # float64 → float32, rounded to nearest
        w -= _HALF
        w *= F32(0.03)
    return out


def frames_to_unit_float(frames: np.ndarray) -> np.ndarray:
    """uint8 BGR → float32 in [0, 1] by dividing by 255 in float32; float32 passes through."""
    if frames.dtype == np.uint8:
        return frames.astype(F32) / F32(255.0)
    if frames.dtype == F32:
        return frames
    raise TypeError(f"frames must be uint8 or float32, got {frames.dtype}")


def compress_frame(frames: np.ndarray) -> np.ndarray:
    """c = fl32(fl32(F·0.8f) + 0.1f): two float32 roundings, so 1.0 → 0.90000004 (§3.3)."""
    f = frames_to_unit_float(frames)
    return f * F32(0.8) + F32(0.1)


def kappa(h: np.ndarray) -> np.ndarray:
    """Context compression 0.8·h + 0.1 in double, rounded once to float32: 1.0 → 0.89999998 (§3.4)."""
    return (h.astype(F64) * 0.8 + 0.1).astype(F32)


def activation(a: np.ndarray, polynomial: bool) -> np.ndarray:
    """φ: the rational sigmoid a / (2(1+|a|)) + 1/2 with the original's roundings, or the logistic."""
    if polynomial:
        return a / (_TWO * (np.abs(a) + _ONE)) + _HALF
    return _ONE / (_ONE + np.exp(-a))


def delta(y: np.ndarray, e: np.ndarray, polynomial: bool, derivative: str) -> np.ndarray:
    """δ = g(y)·e, g the derivative factor in terms of the output y (§3.6, §3.12).

    ``original``: the CUDA kernel's g = 1 / (2·(1 + |u|/(1+|u|))²), u = 2y − 1 (a sign bug:
    the true factor has 1 − |u|). ``exact``: g = (1 − |u|)² / 2. The logistic uses y(1−y).
    """
    if not polynomial:
        return y * (_ONE - y) * e
    u = _TWO * y - _ONE  # 2y is exact, so this is fma(2, y, -1) rounded once
    if derivative == "original":
        r = u / (_ONE + np.abs(u))
        z = np.abs(r) + _ONE
        return ((1.0 / (2.0 * (z * z).astype(F64))) * e.astype(F64)).astype(F32)
    w = (_ONE - np.abs(u)).astype(F64)
    return (0.5 * (w * w) * e.astype(F64)).astype(F32)


def momentum_update(velocity: np.ndarray, mu: np.float32, grad: np.ndarray) -> np.ndarray:
    """V ← fma(μ, V, G), emulated in float64 and rounded once to float32 (§3.12)."""
    return (F64(mu) * velocity.astype(F64) + grad.astype(F64)).astype(F32)


def mean_over_sequences(products: np.ndarray) -> np.ndarray:
    """Mean of per-sequence float32 updates along axis 0, summed in float64 in sequence order.

    k identical sequences give back exactly the single-sequence value, so n_seq = k with equal
    streams reproduces n_seq = 1 bit for bit.
    """
    if products.shape[0] == 1:
        return products[0]
    return (products.astype(F64).sum(axis=0) / products.shape[0]).astype(F32)
