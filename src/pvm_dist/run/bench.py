"""``pvm-dist bench``: measured speed next to the floor of pvm-algorithm.md §7, as a ratio.

The memory floor uses the bandwidth this device really achieves (a large device-to-device copy,
measured once per device), the fused weight traffic 16·W0 + 20·W1 plus n_seq times the activation
traffic, and, where the FP32 peak of the GPU is known, the compute time of n_seq·(4·W0 + 6·W1) + 3·W
FLOPs (shared weights: 6·W0 + 8·W1 per frame holds only at one sequence); the larger term names the bound.
"""

from __future__ import annotations

import dataclasses
import time
from functools import cache
from typing import Any

import numpy as np

from pvm_dist.engine import build_engine
from pvm_dist.model.spec import Spec

#: Nominal dense FP32 (non-tensor) peaks, FLOP/s, by device-name fragment. Used only for the ratio.
FP32_PEAKS = {"H200": 67e12, "H100 80GB HBM3": 67e12, "H100 PCIe": 51e12, "H100 NVL": 60e12, "A100": 19.5e12}


@dataclasses.dataclass
class BenchResult:
    spec: str
    backend: str
    device: str
    n_seq: int
    steps: int
    seconds: float
    steps_per_s: float
    frames_per_s: float
    achieved_gb_per_s: float
    achieved_gflop_per_s: float
    bandwidth_gb_per_s: float
    floor_steps_per_s: float
    ratio_to_floor: float
    bound: str  # "memory" or "compute": which term sets the floor
    phases_ms: dict[str, float]
    frames: str = "host"  # "host": uploaded every step; "device": a dataset held on the device
    chained_launches: bool = False  # a step's kernels launched as programmatic dependents (CUDA, sm_90+)
    wgmma_products: bool = False  # per-unit products on wgmma (CUDA, sm_90a build, from 9 sequences)
    precision: str = "fp32"  # the spec's tensor-core arithmetic (the CUDA engine from 5 sequences)


def _cuda_index(device: str) -> int:
    return 0 if device in ("cuda", "") else int(device.split(":", 1)[1])


@cache
def device_bandwidth(device_label: str) -> float:
    """Bytes/s (read + written) of a large copy on this device; measured once per process."""
    if device_label.startswith("cuda"):
        from pvm_dist.engine.native import native_module

        return float(native_module().measure_copy_bandwidth(_cuda_index(device_label.split(" ")[0]), 1 << 30, 20))
    src = np.ones(1 << 26, np.float32)  # 256 MB
    dst = np.empty_like(src)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    return 2 * src.nbytes / sorted(times)[len(times) // 2]


def fp32_peak(device_name: str) -> float | None:
    for fragment, peak in FP32_PEAKS.items():
        if fragment in device_name:
            return peak
    return None


def run_bench(spec: Spec, n_seq: int, backend: str = "auto", device: str | None = None, steps: int = 200,
              warmup: int = 20, seed: int = 0, frames: str = "host") -> BenchResult:
    """Time ``steps`` training steps after ``warmup`` ones, on a pool of random uint8 frames.

    ``frames="host"`` hands the engine each step's frames from host memory; ``"device"`` gives the pool
    to the native engine once (:meth:`NativeEngine.set_dataset`) and runs with no per-step host work.
    """
    if frames not in ("host", "device"):
        raise ValueError(f"frames must be 'host' or 'device', got {frames!r}")
    # Layer k starts learning at step k, so after the warm-up every unit trains: the steady state.
    steady = spec.with_overrides({"delay_each_layer_learning": 1})
    engine = build_engine(steady, backend=backend, n_seq=n_seq, seed=seed, device=device)
    warmup = max(warmup, spec.n_layers)
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 256, size=(8, n_seq, *spec.image_shape), dtype=np.uint8)
    sync = engine.synchronize
    if frames == "device":
        engine.set_dataset(pool)
        engine.run_dataset(warmup)
        sync()
        t0 = time.perf_counter()
        engine.run_dataset(steps)
    else:
        for i in range(warmup):
            engine.step(pool[i % len(pool)])
        sync()
        t0 = time.perf_counter()
        for i in range(steps):
            engine.step(pool[i % len(pool)])
    sync()
    seconds = time.perf_counter() - t0
    phases = engine.profile_step(pool[0]) if engine.backend == "native" else {}
    label = engine.device_label
    topo = engine.topo
    rate = steps / seconds
    bytes_per_step = topo.weight_bytes_per_step + n_seq * topo.activation_bytes_per_step
    flops_per_step = n_seq * topo.flops_per_frame + topo.flops_per_update
    bandwidth = device_bandwidth(label)
    floor, bound = topo.roofline(n_seq, bandwidth, fp32_peak(label))
    return BenchResult(
        spec=spec.name, backend=engine.backend, device=label, n_seq=n_seq, steps=steps, seconds=seconds,
        steps_per_s=rate, frames_per_s=rate * n_seq, achieved_gb_per_s=rate * bytes_per_step / 1e9,
        achieved_gflop_per_s=rate * flops_per_step / 1e9, bandwidth_gb_per_s=bandwidth / 1e9,
        floor_steps_per_s=floor, ratio_to_floor=rate / floor,
        bound=bound, phases_ms=phases, frames=frames, chained_launches=engine.chained_launches,
        wgmma_products=engine.wgmma_products, precision=spec["precision"])


def as_row(r: BenchResult) -> dict[str, Any]:
    return dataclasses.asdict(r)
