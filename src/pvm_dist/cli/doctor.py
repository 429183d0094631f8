"""``pvm-dist doctor``: what this installation can do, gathered without importing heavy packages."""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import subprocess
import sys
from typing import Any

from pvm_dist._version import __version__


def _version(*dists: str) -> str:
    """The version of the first of ``dists`` that is installed, named when it is not the first, or "not installed".

    One import name ships under several distributions (cupy-cuda12x or cupy-cuda13x, mlflow or mlflow-skinny):
    a GPU host with CUDA 13's CuPy was told "cupy: not installed"."""
    for i, dist in enumerate(dists):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        return version if i == 0 else f"{version} ({dist})"
    return "not installed"


def _nvidia_smi_gpus() -> list[str] | str:
    """GPU names as the driver reports them, or why none could be listed."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "nvidia-smi not found (no NVIDIA driver)"
    try:
        out = subprocess.run([exe, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi failed: {exc}"
    if out.returncode != 0:
        return f"nvidia-smi failed: {(out.stderr or out.stdout).strip().splitlines()[:1]}"
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def wgmma_note(architectures: str) -> str:
    """Whether an H100/H200 gets the products on wgmma from a build for ``architectures`` (CMake's list, e.g.
    ``80-real;90a-real;90-virtual``): they need sm_90a code."""
    if any(a.split("-")[0] == "90a" for a in architectures.split(";")):
        return "yes (sm_90a in the build)"
    return ("no: this build has no sm_90a code; reinstall with nvcc 12+ and CMake 3.26+, or set "
            "CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=90a, for the faster many-sequence products")


def collect() -> dict[str, Any]:
    """A JSON-able report: versions, native module status, GPUs seen."""
    from pvm_dist.engine.native import build_info

    native = build_info()
    native_view: dict[str, Any] = {"available": native.get("available", False)}
    if native_view["available"]:
        native_view["compiler"] = native.get("compiler")
        native_view["cuda_compiled"] = native.get("cuda_compiled")
        native_view["cuda_architectures"] = native.get("cuda_architectures")
        native_view["cuda_runtime"] = native.get("cuda_runtime_version")
        native_view["cuda_devices"] = [f"{d['index']}: {d['name']} (sm {d['compute_capability']})" for d in native.get("devices", [])]
        if any(d["compute_capability"] == "9.0" for d in native.get("devices", [])):
            native_view["hopper_wgmma"] = wgmma_note(str(native.get("cuda_architectures") or ""))
        if native.get("cuda_error") and shutil.which("nvidia-smi") is not None:  # without a driver: "gpu" says so
            native_view["cuda_error"] = native["cuda_error"]
    else:
        native_view["error"] = native.get("error")
        native_view["note"] = "the reference (numpy) engine still works; reinstall with a C++ compiler to build it"
    gpus = _nvidia_smi_gpus()
    devices = native_view.get("cuda_devices") or []
    if devices:
        gpu = f"{len(devices)} usable by the native engine"
    elif isinstance(gpus, list) and gpus:
        gpu = f"{len(gpus)} seen by the driver, none usable by the native engine (see cuda_error)"
    else:
        gpu = "none: training runs on the CPU" + ("" if shutil.which("nvidia-smi") else " (no NVIDIA driver on this machine)")
    return {
        "gpu": gpu,
        "pvm_dist": __version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        "numpy": _version("numpy"),
        "native_module": native_view,
        "gpus_seen": gpus,
        "cupy": _version("cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x", "cupy"),
        "ray": _version("ray"),
        "mlflow": _version("mlflow", "mlflow-skinny"),
        "opencv": _version("opencv-python-headless", "opencv-python", "opencv-contrib-python-headless", "opencv-contrib-python"),
        "typer": _version("typer"),
    }


def ray_worker_engine() -> dict[str, Any]:
    """What a sweep's worker on this machine imports and which engine it builds (``backend: auto``),
    asked of a real worker actor on a local Ray instance; or why none could be asked."""
    try:
        import ray

        from pvm_dist.model.spec import load_spec
        from pvm_dist.run.config import RunConfig
        from pvm_dist.sweep.executor import connect
        from pvm_dist.sweep.worker import TrialWorker

        connect(None)
        try:
            worker = ray.remote(TrialWorker).options(num_cpus=0).remote()
            info = ray.get(worker.describe.remote(RunConfig(spec=load_spec("tiny")).to_dict()), timeout=120)
        finally:
            ray.shutdown()
    except Exception as exc:  # noqa: BLE001 - a diagnosis reports what went wrong, whatever it was
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    return {"package": info["package"], "backend": info["backend"], "device": info["device"]}
