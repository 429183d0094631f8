"""The pvm-dist command line, run as a user would (a subprocess of the installed entry point)."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import ZOO, cli_command

CLI = cli_command()


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def test_help_lists_commands():
    out = run("--help")
    assert out.returncode == 0
    for cmd in ("info", "validate", "doctor"):
        assert cmd in out.stdout


def test_info_small_text_and_json():
    out = run("info", str(ZOO / "small.json"))
    assert out.returncode == 0, out.stderr
    assert "265" in out.stdout and "17,538,806" in out.stdout and "60×60×3" in out.stdout
    js = json.loads(run("info", "small", "--json", "--bandwidth", "4.3").stdout)
    assert js["units"] == 265 and js["weights"] == 17_538_806 and js["image"] == [60, 60, 3]
    assert [ly["units"] for ly in js["layers"]] == [144, 64, 36, 16, 4, 1]
    assert round(js["floor_steps_per_s"]) == round(4.3e12 / 294_427_296)


def test_info_med_exp_feed_context():
    js = json.loads(run("info", "med_exp", "--json").stdout)
    assert js["weights"] == 157_803_994 and js["units"] == 521


def test_validate_ok_and_ignored_keys(original_zoo):
    out = run("validate", str(original_zoo / "small.json"), str(ZOO / "tiny.json"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("ok  ") == 2 and "ignored: autoencoder" in out.stdout


@pytest.mark.parametrize("content,needle", [
    ('{"layer_shapes": ["4", "x"]}', "key 'layer_shapes'"),
    ("{nope", "not valid JSON"),
])
def test_bad_spec_is_one_line_no_traceback(tmp_path, content, needle):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    for cmd in ("validate", "info"):
        out = run(cmd, str(bad))
        assert out.returncode == 2
        assert needle in out.stderr and str(bad) in out.stderr
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_missing_spec_and_debug_traceback(tmp_path):
    out = run("info", str(tmp_path / "missing.json"))
    assert out.returncode == 2 and "no such file" in out.stderr and "Traceback" not in out.stderr
    out = run("--debug", "info", str(tmp_path / "missing.json"))
    assert out.returncode != 0 and "Traceback" in out.stderr


def test_doctor_reports_versions():
    out = run("doctor", "--json")
    assert out.returncode == 0, out.stderr
    js = json.loads(out.stdout)
    assert js["numpy"] and js["python"] and "available" in js["native_module"]
    assert {"ray", "mlflow", "gpus_seen"} <= js.keys()


@pytest.mark.slow
def test_a_local_ray_is_started_even_where_ray_recorded_a_cluster_that_died():
    """Without --address pvm-dist starts a local Ray. A plain ray.init() joins the last `ray start` cluster recorded in
    Ray's temp folder instead, and failed where that cluster had died (a `ray start` killed without `ray stop`)."""
    import os
    import shutil
    import tempfile

    temp = tempfile.mkdtemp(prefix="rt-", dir="/tmp")  # short: Ray's socket paths must fit
    try:
        os.makedirs(os.path.join(temp, "ray"))
        with open(os.path.join(temp, "ray", "ray_current_cluster"), "w") as f:
            f.write("127.0.0.1:1")  # nothing listens there
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        out = subprocess.run([*CLI, "doctor", "--json"], capture_output=True, text=True, timeout=180,
                             env={**env, "RAY_TMPDIR": temp, "RAY_USAGE_STATS_ENABLED": "0"})
        assert out.returncode == 0, out.stderr
        worker = json.loads(out.stdout)["ray_worker"]
        assert "error" not in worker and worker["backend"] in ("native", "reference"), worker
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def test_doctor_names_the_distribution_that_provides_a_package(monkeypatch):
    """CuPy built for CUDA 13 or mlflow-skinny count as installed, and say which distribution it is."""
    import importlib.metadata

    from pvm_dist.cli.doctor import _version

    present = {"cupy-cuda13x": "14.0.1", "mlflow-skinny": "3.17.2", "ray": "2.60.0"}

    def version(dist):
        if dist not in present:
            raise importlib.metadata.PackageNotFoundError(dist)
        return present[dist]

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert _version("cupy-cuda12x", "cupy-cuda13x", "cupy") == "14.0.1 (cupy-cuda13x)"
    assert _version("mlflow", "mlflow-skinny") == "3.17.2 (mlflow-skinny)"
    assert _version("ray") == "2.60.0"
    assert _version("opencv-python-headless", "opencv-python") == "not installed"


def test_doctor_says_whether_a_hopper_gpu_gets_wgmma():
    from pvm_dist.cli.doctor import wgmma_note

    assert wgmma_note("80-real;90a-real;90-virtual").startswith("yes")
    assert wgmma_note("90a").startswith("yes")
    for archs in ("80-real;90", "90-real;90-virtual", ""):
        note = wgmma_note(archs)
        assert note.startswith("no") and "CMAKE_CUDA_ARCHITECTURES=90a" in note


def test_bench_table_is_whole_off_a_terminal():
    """Piped into a log, the table keeps every header and cell (Rich's 80 columns cut them to '…')."""
    out = run("bench", "--spec", "tiny", "--n-seq", "1", "--steps", "3", "--warmup", "1", "--backend", "reference")
    assert out.returncode == 0, out.stderr
    assert "roofline steps/s" in out.stdout and "reference" in out.stdout and "…" not in out.stdout


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_bench_reports_rates_and_floor(backend):
    out = run("bench", "--spec", "tiny", "--n-seq", "1,2", "--steps", "4", "--warmup", "3", "--backend", backend, "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["spec"], r["n_seq"]) for r in rows] == [("tiny", 1), ("tiny", 2)]
    for r in rows:
        assert r["steps_per_s"] > 0 and r["frames_per_s"] == pytest.approx(r["steps_per_s"] * r["n_seq"])
        assert r["ratio_to_floor"] == pytest.approx(r["steps_per_s"] / r["floor_steps_per_s"])
        assert r["bandwidth_gb_per_s"] > 0 and r["bound"] in ("memory", "compute")
        if not r["device"].startswith("cuda"):
            assert r["chained_launches"] is False  # only the CUDA engine chains its kernels
            assert r["wgmma_products"] is False  # and only it has wgmma products
    if backend == "auto" and rows[0]["backend"] == "native":
        assert set(rows[0]["phases_ms"]) == {"gather", "forward", "backward+update"}


def test_bench_bad_input_is_one_line():
    out = run("bench", "--spec", "tiny", "--n-seq", "two")
    assert out.returncode == 2 and "--n-seq takes integers" in out.stderr and "Traceback" not in out.stderr
    out = run("bench", "--spec", "tiny", "-O", "precision=fp16")
    assert out.returncode == 2 and "unknown precision 'fp16'" in out.stderr and "Traceback" not in out.stderr


def test_bench_takes_spec_overrides_and_reports_the_precision():
    out = run("bench", "--spec", "tiny", "--n-seq", "1", "--steps", "2", "--warmup", "1", "--backend", "reference",
              "-O", "precision=tf32", "--json")
    assert out.returncode == 0, out.stderr
    assert [r["precision"] for r in json.loads(out.stdout)] == ["tf32"]
    table = run("bench", "--spec", "tiny", "--n-seq", "1", "--steps", "2", "--warmup", "1", "--backend", "reference",
                "-O", "precision=bf16")
    assert table.returncode == 0, table.stderr
    assert "tiny (bf16)" in table.stdout
