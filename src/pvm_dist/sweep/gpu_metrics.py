"""A worker's GPU utilisation, memory and power, under the ``system/`` metric names MLflow's System
Metrics tab shows (``system/gpu_<id>_utilization_percentage``, ...), read through NVML (nvidia-ml-py)
where it is installed; nothing where it is not, or on a CPU worker.

NVML numbers devices as the driver does, whatever ``CUDA_VISIBLE_DEVICES`` says, so the ids are the ones
Ray assigned the worker (``ray.get_gpu_ids()``): trials sharing a GPU report the same device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Sampler = Callable[[], dict[str, float]]


def gpu_sampler(gpu_ids: Sequence[str | int]) -> Sampler | None:
    """A function returning the GPUs' current figures, or None without NVML or GPUs."""
    ids = [int(g) for g in gpu_ids if str(g).isdigit()]
    if not ids:
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in ids}
    except Exception:  # noqa: BLE001 - no NVML library, no driver: the worker just reports no GPU figures
        return None

    def sample() -> dict[str, float]:
        out: dict[str, float] = {}
        for i, h in handles.items():
            out.update(_device(pynvml, h, f"system/gpu_{i}_"))
        return out

    return sample


def _device(nvml: Any, handle: Any, prefix: str) -> dict[str, float]:
    """One device's figures; a query the device does not support is left out."""
    out: dict[str, float] = {}
    try:
        out[prefix + "utilization_percentage"] = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except Exception:  # noqa: BLE001
        pass
    try:
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        out[prefix + "memory_usage_megabytes"] = mem.used / 2**20
        out[prefix + "memory_usage_percentage"] = 100.0 * mem.used / mem.total
    except Exception:  # noqa: BLE001
        pass
    try:
        watts = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # milliwatts
        out[prefix + "power_usage_watts"] = watts
        out[prefix + "power_usage_percentage"] = 100.0 * watts / (nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0)
    except Exception:  # noqa: BLE001
        pass
    return out
