"""The native build skeleton: pvm_dist._native's build_info(), the pure-Python fallback when the module
is missing, and the CMake build itself (CPU-only, PVM_DIST_CUDA option handling)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pvm_dist.engine import native

REPO_ROOT = Path(__file__).resolve().parents[1]

# key -> allowed types of its value
BUILD_INFO_TYPES: dict[str, tuple[type, ...]] = {
    "version": (str,),
    "compiler": (str,),
    "cxx_standard": (int,),
    "cuda_compiled": (bool,),
    "cuda_runtime_version": (str, type(None)),
    "cuda_architectures": (str, type(None)),
    "devices": (list,),
    "cuda_error": (str, type(None)),
}
DEVICE_TYPES: dict[str, type] = {
    "index": int,
    "name": str,
    "compute_capability": str,
    "total_memory_bytes": int,
    "multiprocessor_count": int,
}

requires_native = pytest.mark.skipif(
    native.native_module() is None, reason=f"pvm_dist._native not built: {native.native_import_error()}"
)


def _pyproject_version() -> str:
    match = re.search(r'^version\s*=\s*"([^"]+)"', (REPO_ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert match, "pyproject.toml has no version"
    return match.group(1)


def _build_info_in_subprocess(module_path: Path, env_overrides: dict[str, str]) -> dict[str, Any]:
    """Load the extension file `module_path` in a fresh interpreter and return its build_info().

    A fresh process is needed because the CUDA runtime reads CUDA_VISIBLE_DEVICES once, at its first call.
    The file is loaded directly, so this works for a module outside any pvm_dist package too.
    """
    code = textwrap.dedent(
        """
        import importlib.machinery, importlib.util, json, sys
        loader = importlib.machinery.ExtensionFileLoader("_native", sys.argv[1])
        spec = importlib.util.spec_from_file_location("_native", sys.argv[1], loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        print(json.dumps(module.build_info()))
        """
    )
    env = {**os.environ, **env_overrides}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(module_path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, f"loading {module_path} failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout)


def _check_build_info(info: dict[str, Any]) -> None:
    for key, types in BUILD_INFO_TYPES.items():
        assert key in info, f"build_info() lacks {key!r}"
        assert isinstance(info[key], types), f"build_info()[{key!r}] = {info[key]!r}, expected {types}"
    assert info["version"] == _pyproject_version()
    assert info["compiler"].strip()
    assert info["cxx_standard"] >= 17
    # Architectures are recorded exactly when CUDA code was compiled.
    assert (info["cuda_architectures"] is not None) == info["cuda_compiled"]
    assert (info["cuda_runtime_version"] is not None) == info["cuda_compiled"]
    if info["cuda_compiled"]:
        assert info["cuda_architectures"].strip()
        assert re.fullmatch(r"\d+\.\d+", info["cuda_runtime_version"])
    else:
        assert info["devices"] == []
        assert info["cuda_error"] == "CUDA not compiled in"
    for device in info["devices"]:
        for key, typ in DEVICE_TYPES.items():
            assert isinstance(device[key], typ) and not isinstance(device[key], bool), (key, device)
        assert re.fullmatch(r"\d+\.\d+", device["compute_capability"])
        assert device["total_memory_bytes"] > 0 and device["multiprocessor_count"] > 0
    # Devices, or the reason there are none: never both, never neither.
    assert (info["cuda_error"] is None) == bool(info["devices"])
    if info["cuda_error"] is not None:
        assert info["cuda_error"].strip()


@pytest.fixture
def fresh_native_cache():
    """Forget the cached import result before and after a test that fakes the module's absence."""
    native._load.cache_clear()
    yield
    native._load.cache_clear()


# --- the built module -------------------------------------------------------------------------------


@requires_native
def test_build_info_keys_and_types() -> None:
    info = native.build_info()
    assert info["available"] is True
    _check_build_info(info)
    assert native.native_import_error() is None


@requires_native
def test_build_info_matches_module() -> None:
    module = native.native_module()
    direct = module.build_info()
    wrapped = native.build_info()
    assert wrapped == {**direct, "available": True}
    assert module.__version__ == direct["version"]
    assert issubclass(module.CudaError, RuntimeError)


@requires_native
def test_without_a_gpu_devices_are_empty_and_error_is_reported() -> None:
    """Hiding every GPU (CUDA_VISIBLE_DEVICES="") must give no devices and the CUDA reason, not a crash."""
    info = _build_info_in_subprocess(Path(native.native_module().__file__), {"CUDA_VISIBLE_DEVICES": ""})
    _check_build_info(info)
    assert info["devices"] == []
    assert isinstance(info["cuda_error"], str) and info["cuda_error"].strip()


@pytest.mark.gpu
@requires_native
def test_visible_gpus_are_listed() -> None:
    info = native.build_info()
    if not info["cuda_compiled"] or not info["devices"]:
        pytest.skip(f"no CUDA device visible: {info['cuda_error']}")
    assert info["cuda_error"] is None
    assert [d["index"] for d in info["devices"]] == list(range(len(info["devices"])))


# --- the pure-Python fallback ------------------------------------------------------------------------


@pytest.mark.skipif(native.native_module() is not None, reason="pvm_dist._native is built")
def test_build_info_when_module_is_not_built() -> None:
    info = native.build_info()
    assert info["available"] is False
    assert isinstance(info["error"], str) and info["error"]
    assert native.native_module() is None
    assert native.native_import_error() == info["error"]


def test_missing_module_falls_back_cleanly(monkeypatch: pytest.MonkeyPatch, fresh_native_cache: None) -> None:
    monkeypatch.setitem(sys.modules, "pvm_dist._native", None)  # makes the import raise ImportError
    assert native.native_module() is None
    error = native.native_import_error()
    assert error is not None and error.startswith(("ImportError", "ModuleNotFoundError"))
    assert native.build_info() == {"available": False, "error": error}


# --- the CMake build ---------------------------------------------------------------------------------


def _cmake_or_skip() -> tuple[str, str]:
    """Return (cmake executable, pybind11 CMake dir), or skip when the build tools are missing."""
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake not found")
    version = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"(\d+)\.(\d+)", version)
    if not match or (int(match.group(1)), int(match.group(2))) < (3, 24):
        pytest.skip(f"cmake >= 3.24 needed, found: {version.splitlines()[:1]}")
    pybind11 = pytest.importorskip("pybind11")
    return cmake, pybind11.get_cmake_dir()


def _configure(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    cmake, pybind11_dir = _cmake_or_skip()
    full_env = {k: v for k, v in os.environ.items() if k != "PVM_DIST_CUDA"}
    full_env.update(env or {})
    proc = subprocess.run(
        [
            cmake, "-S", str(REPO_ROOT), "-B", str(tmp_path / "build"),
            f"-Dpybind11_DIR={pybind11_dir}", f"-DPython_EXECUTABLE={sys.executable}", *args,
        ],
        capture_output=True, text=True, env=full_env, timeout=300,
    )  # fmt: skip
    if check:
        assert proc.returncode == 0, f"cmake configure failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.slow
def test_cpu_only_cmake_build_installs_and_imports(tmp_path: Path) -> None:
    """Configure, build and install CPU-only with plain CMake; the installed module must say so."""
    cmake, _ = _cmake_or_skip()
    _configure(tmp_path, "-DPVM_DIST_CUDA=OFF", "-DCMAKE_BUILD_TYPE=Release")
    for step in (
        [cmake, "--build", str(tmp_path / "build"), "--parallel", str(os.cpu_count() or 2)],
        [cmake, "--install", str(tmp_path / "build"), "--prefix", str(tmp_path / "prefix")],
    ):
        proc = subprocess.run(step, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"{step[1]} failed:\n{proc.stdout}\n{proc.stderr}"

    installed = sorted((tmp_path / "prefix" / "pvm_dist").glob("_native*"))
    assert len(installed) == 1, installed
    info = _build_info_in_subprocess(installed[0], {})
    _check_build_info(info)
    assert info["cuda_compiled"] is False
    assert info["cuda_architectures"] is None and info["cuda_runtime_version"] is None
    assert info["devices"] == [] and info["cuda_error"] == "CUDA not compiled in"

    zoo = sorted(p.name for p in (REPO_ROOT / "model_zoo").glob("*.json"))
    installed_zoo = sorted(p.name for p in (tmp_path / "prefix" / "pvm_dist" / "model_zoo").glob("*.json"))
    assert installed_zoo == zoo


@pytest.mark.slow
def test_environment_variable_selects_cpu_only(tmp_path: Path) -> None:
    proc = _configure(tmp_path, env={"PVM_DIST_CUDA": "off"})
    assert "PVM_DIST_CUDA=OFF (from environment variable PVM_DIST_CUDA)" in proc.stdout
    assert "native engine CPU-only" in proc.stdout


@pytest.mark.slow
def test_cmake_option_wins_over_environment(tmp_path: Path) -> None:
    proc = _configure(tmp_path, "-DPVM_DIST_CUDA=OFF", env={"PVM_DIST_CUDA": "bogus"})
    assert "PVM_DIST_CUDA=OFF (from -DPVM_DIST_CUDA)" in proc.stdout


@pytest.mark.slow
def test_invalid_cuda_mode_fails_configure(tmp_path: Path) -> None:
    proc = _configure(tmp_path, "-DPVM_DIST_CUDA=maybe", check=False)
    assert proc.returncode != 0
    assert "PVM_DIST_CUDA must be AUTO, ON or OFF" in proc.stderr
