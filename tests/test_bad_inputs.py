"""Bad input is refused with one line and exit 2, decided before any large allocation (issue 16, input side).

Each test is one defect of the issue's audit: bounds before work (YAML aliases, repeated keys, nesting,
trial counts, model and batch sizes against memory, zip members, image pixels) and clean errors
(usage errors, divergence, NaN checkpoints, full disks, unusable stores and folders, odd strings).
Most run the entry point in-process (``cli_inprocess``); the ones that could crash the interpreter run
it as a subprocess.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from cli_inprocess import error_lines, run_cli
from conftest import ZOO, cli_command, native_cuda_available


@pytest.fixture
def cli(monkeypatch, capsys, tmp_path):
    """``cli(*args)`` → (code, out, err), run in a fresh working folder."""
    monkeypatch.chdir(tmp_path)
    return lambda *args: run_cli(monkeypatch, capsys, *args)


def one_error(code: int, err: str, *needles: str) -> str:
    lines = error_lines(err)
    assert code == 2, err
    assert len(lines) == 1, err
    assert "internal error" not in lines[0] and "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def tiny_spec(**changes) -> dict:
    return {**json.loads((ZOO / "tiny.json").read_text()), **changes}


@pytest.fixture
def checkpoint(cli, tmp_path) -> Path:
    """A 10-step untracked tiny run's final checkpoint."""
    code, _, err = cli("train", "--spec", "tiny", "--steps", "10", "--no-track", "-q", "--run-dir", str(tmp_path / "run"),
                       "--picture-every", "0", "--heldout-steps", "0")
    assert code == 0, err
    return tmp_path / "run" / "checkpoints" / "step_000000010.pvmckpt"


# --- usage errors: one line naming the option, exit 2, whichever click typer bundles -----------------------
@pytest.mark.parametrize("args,needle", [
    (["train", "--n-seq", "0"], "--n-seq"),
    (["train", "--steps", "-5"], "--steps"),
    (["train", "--keep", "0"], "--keep"),
    (["train", "--seed", "-1"], "--seed"),
    (["eval", "ck.pvmckpt", "--steps", "2"], "--steps"),
    (["info", "tiny", "--bandwidth", "0"], "--bandwidth"),
    (["train", "--no-such-option"], "--no-such-option"),
    ([], "no command"),
])
def test_usage_errors_are_one_line_naming_the_option(cli, args, needle):
    code, _, err = cli(*args)
    one_error(code, err, needle, "usage error")


# --- bounded reading of YAML and JSON -----------------------------------------------------------------------
ALIAS_BOMB = "name: bomb\nspec: tiny\nsteps: 10\n" + "".join(
    f"x{i}: &c{i} [{', '.join([f'*c{i - 1}' if i else '1'] * 9)}]\n" for i in range(9)) + "overrides: {momentum: *c8}\n"


@pytest.mark.parametrize("text,needle", [
    (ALIAS_BOMB, "aliases"),
    ("name: a\nname: b\nspec: tiny\nsteps: 10\n", "'name' appears twice"),
    ("spec: tiny\nsteps: 10\nvary: " + "[" * 200 + "]" * 200 + "\n", "nested deeper"),
])
def test_sweep_yaml_is_bounded(cli, tmp_path, text, needle):
    f = tmp_path / "s.yaml"
    f.write_text(text)
    t0 = time.perf_counter()
    code, _, err = cli("sweep", "run", str(f), "--dry-run")
    one_error(code, err, needle, "s.yaml")
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize("text,needle", [
    ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested deeper"),
    (json.dumps(tiny_spec())[:-1] + ', "momentum": 0.1}', "'momentum' appears twice"),
])
def test_spec_json_is_bounded(cli, tmp_path, text, needle):
    f = tmp_path / "s.json"
    f.write_text(text)
    one_error(*cli("info", str(f))[::2], needle)


# --- plans and models are sized before they are built ---------------------------------------------------------
@pytest.mark.parametrize("lists,trials", [(2, "1,000,000"), (3, "1,000,000,000")])
def test_trial_count_is_capped_before_planning(cli, tmp_path, lists, trials):
    values = ", ".join(str(i) for i in range(1, 1001))
    keys = ["momentum", "initial_learning_rate", "final_learning_rate"][:lists]
    f = tmp_path / "grid.yaml"
    f.write_text("spec: tiny\nsteps: 10\nvary: {" + ", ".join(f"{k}: [{values}]" for k in keys) + "}\n")
    t0 = time.perf_counter()
    code, _, err = cli("sweep", "run", str(f), "--dry-run")
    one_error(code, err, f"plans {trials} trials", "at most 10,000")
    assert time.perf_counter() - t0 < 5


def test_spec_too_big_for_the_machine_is_refused_before_building(cli, tmp_path):
    f = tmp_path / "big.json"
    f.write_text(json.dumps(tiny_spec(layer_shapes=[2000, 1000, 1], hidden_block_size=20, fan_in_square_size=2)))
    t0 = time.perf_counter()
    for command in (["info", str(f)], ["train", "--spec", str(f), "--no-track", "-q"]):
        one_error(*cli(*command)[::2], "needs at least", "TiB", "this machine has")
    assert time.perf_counter() - t0 < 10
    assert not (tmp_path / "runs").exists()


def test_n_seq_too_big_names_the_activations_and_the_memory(cli):
    line = one_error(*cli("train", "--spec", "small", "--n-seq", "100000000", "--no-track", "-q")[::2])
    assert "small at n_seq 100,000,000 needs" in line and "of activations" in line and "this machine has" in line


def test_engine_budget_uses_the_topology_sizes():
    from pvm_dist.engine.budget import check_engine, engine_bytes
    from pvm_dist.model.budget import MemoryBudgetError
    from pvm_dist.model.spec import load_spec
    from pvm_dist.model.topology import build_topology

    topo = build_topology(load_spec("small"))
    fixed, per_seq = engine_bytes(topo, 1)
    assert fixed == 8 * topo.n_weights and per_seq > 4 * topo.x_total
    check_engine(topo, 4, "cpu", available=fixed + 4 * per_seq)
    with pytest.raises(MemoryBudgetError, match="device cuda:0 has 24 GiB"):
        check_engine(topo, 10**8, "cuda:0", available=24 << 30)


@pytest.mark.parametrize("line,needle", [
    ("metric: layer99_mse_two_step", "names layer 99"),
    ("n_seq: 100000000000", "needs"),
    ("data: frames.pkl", "never loaded"),
    ("data: ',,,'", "empty data string"),
])
def test_dry_run_refuses_what_no_trial_could_run(cli, tmp_path, line, needle):
    f = tmp_path / "s.yaml"
    f.write_text(f"spec: tiny\nsteps: 10\n{line}\n")
    one_error(*cli("sweep", "run", str(f), "--dry-run")[::2], needle)


# --- data files are sized before they are decoded -----------------------------------------------------------
def test_zip_member_that_expands_past_the_limit_is_refused(tmp_path, monkeypatch):
    """A member is refused by the size it declares, before it is inflated (limit lowered to keep this fast)."""
    import cv2

    from pvm_dist.data import DataError, limits, make_source

    monkeypatch.setattr(limits, "MAX_MEMBER_BYTES", 4 << 20)
    path = tmp_path / "bomb.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("clip/img/0000.jpg", cv2.imencode(".jpg", np.zeros((8, 8, 3), np.uint8))[1].tobytes())
        z.writestr("clip/groundtruth_rect.txt", b"0,0,1,1\n" * (1 << 20))  # 8 MiB, a few kB compressed
    assert path.stat().st_size < 64 << 10
    with pytest.raises(DataError, match="expands to 8,388,608 bytes"):
        make_source(str(path), (8, 8, 3), 1, 0)


def _png_header(width: int, height: int) -> bytes:
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


def test_image_with_too_many_pixels_is_refused_before_decoding(tmp_path):
    from pvm_dist.data import DataError, make_source

    folder = tmp_path / "frames"
    folder.mkdir()
    (folder / "0000.png").write_bytes(_png_header(20000, 20000))
    with pytest.raises(DataError, match="20,000×20,000 pixels"):
        make_source(str(folder), (8, 8, 3), 1, 0)


def test_a_video_ffmpeg_cannot_parse_is_one_line_on_the_real_stderr(tmp_path):
    """FFmpeg logs to file descriptor 2 beneath Python ("moov atom not found" for an MP4 without its index), which
    an in-process run cannot see: a subprocess shows what the terminal gets."""
    clip = tmp_path / "cut.mp4"
    clip.write_bytes((24).to_bytes(4, "big") + b"ftypisom" + bytes(4) + b"isommp42" + bytes(200))
    env = {k: v for k, v in os.environ.items() if k != "OPENCV_FFMPEG_LOGLEVEL"}
    done = subprocess.run([*cli_command(), "train", "--data", str(clip), "--spec", "tiny", "--steps", "3",
                           "--no-track", "-q"], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    one_error(done.returncode, done.stderr, "cut.mp4", "not a video OpenCV can open")


# --- odd strings, stores, folders ----------------------------------------------------------------------------
def test_lone_surrogate_in_a_spec_name_is_refused(cli, tmp_path):
    spec = tmp_path / "odd.json"
    spec.write_text(json.dumps(tiny_spec(name="\ud800 odd")))  # JSON escapes it: "\ud800"
    for command in (["info", str(spec)], ["train", "--spec", str(spec), "--steps", "3", "--no-track", "-q"]):
        one_error(*cli(*command)[::2], "key 'name'", "not valid Unicode")


def test_pictures_draw_any_caption_text(tmp_path):
    """OpenCV's text drawing crashes the interpreter on a lone surrogate: run it where a crash shows."""
    code = ("import numpy as np; from pvm_dist.io import pictures; from pvm_dist.model.spec import load_spec; "
            "from pvm_dist.model.topology import build_topology; t = build_topology(load_spec('tiny')); "
            "D = t.spec.image_side; f = np.zeros((D, D, 3), np.uint8); "
            "img = pictures.picture_grid(f, f, t, np.zeros(t.n_units * t.hidden, np.float32), "
            "caption={'spec': '\\ud800\\u202e' + 'x' * 500}); print(img.shape[2])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "3", out.stderr[-500:]


def test_unusable_sqlite_store_fails_at_once(cli, tmp_path):
    (tmp_path / "dbdir").mkdir()
    t0 = time.perf_counter()
    one_error(*cli("train", "--steps", "3", "-q", "--mlflow", f"sqlite:///{tmp_path / 'dbdir'}")[::2], "is a folder")
    one_error(*cli("train", "--steps", "3", "-q", "--mlflow", f"sqlite:///{tmp_path / 'no' / 'x.db'}")[::2],
              "does not exist")
    assert time.perf_counter() - t0 < 10


def test_mlflow_file_store_is_refused_for_logging(cli, tmp_path, monkeypatch):
    """MLflow's file store keeps a metric point once per delivery (a resumed run's re-sent points would be
    doubled) and MLflow 3 refuses it by default: refused with one line naming the way out, nothing created."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # even where MLflow would allow it
    sweep = Path(__file__).resolve().parent.parent / "experiments" / "quickstart.yaml"
    for uri in (f"file://{tmp_path / 'mlruns'}", str(tmp_path / "mlruns"), "mlruns"):
        one_error(*cli("train", "--steps", "3", "-q", "--mlflow", uri)[::2], "file store", "sqlite:///")
        one_error(*cli("sweep", "run", str(sweep), "--mlflow", uri)[::2], "file store", "sqlite:///")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    one_error(*cli("compare", "quickstart", "--mlflow", f"file://{tmp_path / 'mlruns'}")[::2], "file store")
    assert sorted(os.listdir(tmp_path)) == []


def test_compare_fails_fast_and_creates_no_store(cli, tmp_path):
    t0 = time.perf_counter()
    one_error(*cli("compare", "quickstart", "--mlflow", "http://127.0.0.1:1")[::2], "cannot reach MLflow")
    assert time.perf_counter() - t0 < 10
    one_error(*cli("compare", "quickstart")[::2], "no MLflow store")
    assert sorted(os.listdir(tmp_path)) == []


def test_sweep_root_that_is_a_file_fails_at_once(cli, tmp_path):
    (tmp_path / "afile").write_text("x")
    sweep = Path(__file__).resolve().parent.parent / "experiments" / "quickstart.yaml"
    t0 = time.perf_counter()
    one_error(*cli("sweep", "run", str(sweep), "--root", str(tmp_path / "afile"))[::2], "--root", "is a file")
    one_error(*cli("sweep", "resume", "x", "--root", str(tmp_path / "afile" / "sub"))[::2], "--root")
    assert time.perf_counter() - t0 < 10


def test_run_dir_that_cannot_be_a_folder_fails_at_once(cli, tmp_path):
    (tmp_path / "afile").write_text("x")
    one_error(*cli("train", "--steps", "3", "--no-track", "-q", "--run-dir", str(tmp_path / "afile"))[::2], "is a file")
    one_error(*cli("train", "--steps", "3", "--no-track", "-q", "--run-dir", str(tmp_path / "afile" / "r"))[::2],
              "is a file")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_run_dir_fails_at_once(cli, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    one_error(*cli("train", "--steps", "3", "--no-track", "-q", "--run-dir", str(ro / "r"))[::2], "not writable")


def test_bad_data_string_and_missing_gpu_are_one_line(cli):
    one_error(*cli("train", "--data", ",,,", "--no-track", "-q")[::2], "empty data string")
    one_error(*cli("train", "--backend", "reference", "--device", "cuda", "--no-track", "-q")[::2], "CPU only")
    if not native_cuda_available():
        one_error(*cli("train", "--device", "cuda", "--no-track", "-q")[::2], "cuda")


# --- divergence and NaN checkpoints ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_divergence_names_step_and_layer_on_one_line(cli, tmp_path, backend):
    import warnings

    with warnings.catch_warnings():  # numpy's overflow and cast warnings would be more lines on stderr
        warnings.simplefilter("error", RuntimeWarning)
        code, _, err = cli("train", "-O", "initial_learning_rate=1e30", "--steps", "100", "--no-track", "-q",
                           "--backend", backend, "--run-dir", str(tmp_path / "r"))
    line = one_error(code, err, "diverged by step")
    assert "layer" in line


def test_nan_checkpoint_is_refused_by_eval_and_resume(cli, checkpoint, tmp_path):
    from pvm_dist.run import state as run_state

    state, _ = run_state.load(checkpoint)
    state.engine["weights"][5] = np.nan
    bad = run_state.save(tmp_path / "nan.pvmckpt", state)
    one_error(*cli("eval", str(bad), "--steps", "5")[::2], "NaN", "nan.pvmckpt")
    one_error(*cli("train", "--resume", str(bad), "--steps", "20", "--no-track", "-q")[::2], "NaN")


# --- writes that fail -------------------------------------------------------------------------------------------
def test_full_disk_keeps_the_last_good_checkpoint(cli, tmp_path, monkeypatch):
    from pvm_dist.io import checkpoint as ck_io
    from pvm_dist.run import state as run_state

    real, calls = ck_io.save, []

    def save(path, *args, **kwargs):
        calls.append(path)
        if len(calls) >= 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(ck_io, "save", save)
    run = tmp_path / "run"
    code, _, err = cli("train", "--steps", "20", "--checkpoint-every", "10", "--no-track", "-q", "--run-dir", str(run),
                       "--picture-every", "0")
    kept = run / "checkpoints" / "step_000000010.pvmckpt"
    one_error(code, err, "No space left on device", str(kept))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [kept.name]
    monkeypatch.setattr(ck_io, "save", real)
    assert run_state.load(kept)[0].step == 10


def test_picture_write_failure_is_reported(cli, tmp_path, monkeypatch, caplog):
    real = Path.write_bytes

    def write_bytes(self, data):
        if self.suffix == ".png":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    code, _, err = cli("train", "--steps", "10", "--picture-every", "5", "--no-track", "-q", "--run-dir",
                       str(tmp_path / "r"), "--heldout-steps", "0")
    assert code == 0, err
    warned = [r.getMessage() for r in caplog.records if "cannot write picture" in r.getMessage()]
    assert len(warned) == 2 and "step_000000005.png" in warned[0] and "No space left" in warned[0]


# --- resume options that the checkpoint cannot honour -----------------------------------------------------------
def test_an_eval_whose_readout_masks_cannot_fit_is_refused_before_it_runs(cli, checkpoint):
    code, _, err = cli("eval", str(checkpoint), "--steps", "100000000000")  # was an internal MemoryError
    one_error(code, err, "100,000,000,000 steps", "label mask", "this machine has")


def test_sync_skips_the_damaged_lines_of_a_spool(cli, tmp_path):
    spool = tmp_path / "run" / "tracking_fallback"
    spool.mkdir(parents=True)
    (spool / "tracking_fallback.jsonl").write_bytes(b'\xff\xfe\n{"kind": "metric"}\n[1]\n')  # was KeyError, decode error
    code, out, err = cli("sync", str(tmp_path / "run"))
    assert code == 0 and "synced 0 run(s)" in out and "internal error" not in err, err


def test_a_run_folder_another_process_trains_into_is_refused(cli, checkpoint):
    """The resume command run twice (two terminals): both trained into one folder, their checkpoints and metrics
    interleaved, and both logged to one MLflow run."""
    from pvm_dist.tracking.owner import LOCK_FILE, take

    folder = checkpoint.parent.parent
    before = sorted(p.name for p in (folder / "checkpoints").iterdir())
    held = take(folder / LOCK_FILE)  # flock: a second descriptor conflicts as another process's would
    try:
        line = one_error(*cli("train", "--resume", str(checkpoint), "--steps", "20", "--no-track", "-q")[::2],
                         str(folder), "another pvm-dist process is training into it")
    finally:
        held.release()
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == before, line
    code, _, err = cli("train", "--resume", str(checkpoint), "--steps", "20", "--no-track", "-q")
    assert code == 0, err  # free again


def test_data_a_checkpoint_records_that_moved_is_named_as_the_checkpoints(cli, tmp_path):
    from test_data_video import write_video

    clip = write_video(tmp_path / "clip.avi")
    code, _, err = cli("train", "--spec", "tiny", "--data", str(clip), "--steps", "10", "--no-track", "-q",
                       "--run-dir", str(tmp_path / "run"), "--picture-every", "0", "--heldout-steps", "0")
    assert code == 0, err
    ck = tmp_path / "run" / "checkpoints" / "step_000000010.pvmckpt"
    clip.rename(tmp_path / "moved.avi")
    for command in (("train", "--resume", str(ck), "--steps", "20", "--no-track", "-q"), ("eval", str(ck))):
        one_error(*cli(*command)[::2], "clip.avi", "the data the checkpoint records", "--data")
    line = one_error(*cli("eval", str(ck), "--data", str(tmp_path / "gone.avi"))[::2], "gone.avi")
    assert line.endswith("gone.avi: no such file or folder"), line  # given with --data: as it is
    code, _, err = cli("train", "--resume", str(ck), "--steps", "20", "--no-track", "-q", "--data",
                       str(tmp_path / "moved.avi"))
    assert code == 0, err
    assert f"note: resuming at step 10 on {tmp_path / 'moved.avi'}, not on {tmp_path / 'clip.avi'}" in err  # said


def test_a_file_system_without_flock_does_not_make_every_run_busy(tmp_path, monkeypatch):
    """Some network mounts answer flock with ENOLCK: that is no lock to hold, not a folder in use."""
    import errno
    import fcntl

    from pvm_dist.tracking.owner import claim, hold, take

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert take(tmp_path / "lock") is not None
    # nor every spool busy to `pvm-dist sync` (claim), nor a tracker's hold an error
    assert claim(tmp_path / "spool") is not None and hold(tmp_path / "spool") is not None


def test_folder_locks_tell_held_from_free(tmp_path):
    from pvm_dist.tracking.owner import claim, hold, take

    tracker = hold(tmp_path / "spool")
    assert claim(tmp_path / "spool") is None  # a live tracker's spool is not synced
    tracker.release()
    mine = claim(tmp_path / "spool")
    assert mine is not None
    mine.release()
    run = take(tmp_path / "lock")
    assert run is not None and take(tmp_path / "lock") is None  # (a second descriptor: as another process)
    run.release()
    assert take(tmp_path / "lock") is not None


def test_resume_refuses_options_that_conflict_with_the_checkpoint(cli, checkpoint, tmp_path):
    from pvm_dist.run import state as run_state

    state, _ = run_state.load(checkpoint)
    state.run = state.run.replace(track=True, run_id="0123abcd", mlflow_uri=f"sqlite:///{tmp_path / 'a.db'}")
    tracked = run_state.save(tmp_path / "tracked.pvmckpt", state)
    resume = ("train", "--resume", str(tracked), "--steps", "20", "-q")
    one_error(*cli(*resume, "--n-seq", "2")[::2], "--n-seq 2", "1 sequences")
    one_error(*cli(*resume, "--spec", "small")[::2], "--spec small", "keeps its spec")
    one_error(*cli(*resume, "--mlflow", f"sqlite:///{tmp_path / 'b.db'}")[::2], "--mlflow", "0123abcd")
    one_error(*cli(*resume, "--experiment", "other")[::2], "--experiment other", "0123abcd")
    assert not (tmp_path / "b.db").exists() and not (tmp_path / "a.db").exists()
    code, out, err = cli("train", "--resume", str(checkpoint), "--steps", "12", "--no-track", "--json",
                         "--spec", "tiny", "--data", "synthetic:bar", "--heldout-steps", "0")
    assert code == 0, err
    assert json.loads(out)["step"] == 12
    assert run_state.load(json.loads(out)["checkpoint"])[0].run.data == "synthetic:bar"  # honoured


def test_runs_started_in_the_same_second_get_their_own_folders(cli, monkeypatch):
    import time as time_module

    monkeypatch.setattr(time_module, "strftime", lambda *args: "20260101-000000")
    folders = []
    for _ in range(2):
        code, out, err = cli("train", "--spec", "tiny", "--steps", "3", "--no-track", "--json", "--picture-every", "0", "--heldout-steps", "0")
        assert code == 0, err
        folders.append(json.loads(out)["run_dir"])
    assert folders == ["runs/tiny-20260101-000000", "runs/tiny-20260101-000000-2"]
