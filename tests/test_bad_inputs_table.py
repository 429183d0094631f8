"""The bad-input table (issue 16, "Done when": bad inputs tried / clean): every class of the audit's defect list
in several variants, each refused with one line naming the problem and exit 2, before any training, and
nothing created where it was refused. ``test_bad_inputs.py`` holds the cases that need more than one command
(timings, fixtures, monkeypatched writes); the Hypothesis fuzzer (``test_fuzz_inputs.py``) counts apart.

A case is (arguments, files to write first, words the error line must hold); ``{d}`` in an argument is the
case's working folder. Train cases stop at three steps, so a case that slipped through would not run long.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from cli_inprocess import error_lines, run_cli
from conftest import ZOO

TINY = json.loads((ZOO / "tiny.json").read_text())
T = ("train", "--steps", "3", "--no-track", "-q", "--heldout-steps", "0", "--picture-every", "0")
SWEEP_OK = "spec: tiny\nsteps: 10\n"


def spec(**changes) -> str:
    return json.dumps({**TINY, **changes})


def alias_bomb(levels: int, width: int) -> str:
    return SWEEP_OK + "".join(f"x{i}: &c{i} [{', '.join([f'*c{i - 1}' if i else '1'] * width)}]\n"
                              for i in range(levels)) + f"overrides: {{momentum: *c{levels - 1}}}\n"


def grid(keys: int, n: int) -> str:
    names = ["momentum", "initial_learning_rate", "final_learning_rate", "seed"][:keys]
    values = ", ".join(str(i + 1) for i in range(n))
    return SWEEP_OK + "vary: {" + ", ".join(f"{k}: [{values}]" for k in names) + "}\n"


def png_header(width: int, height: int) -> bytes:
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


def case(name: str, args: tuple[str, ...], *needles: str, files: dict[str, str | bytes] | None = None):
    return pytest.param(args, files or {}, needles, id=name)


USAGE = [  # defect 6: usage errors name the option, whatever click typer bundles
    *(case(f"train {opt} {v}", (*T, opt, v), opt) for opt, values in {
        "--steps": ["0", "-5", "abc", "1.5", "1e3"], "--n-seq": ["0", "-1", "two", "1.5"],
        "--seed": ["-1", "x", "0.5"], "--keep": ["0", "-3", "many"], "--checkpoint-every": ["-1", "ten"],
        "--keep-every": ["-1", "x"], "--metrics-every": ["0", "-2", "z"], "--picture-every": ["-1", "p"],
        "--readout-from": ["-1", "soon"], "--readout-lr": ["-0.1", "fast"], "--heldout-steps": ["-1", "h"],
        "--log-every": ["-1", "often"]}.items() for v in values),
    case("train unknown option", (*T, "--no-such-option"), "--no-such-option"),
    case("train missing value", ("train", "--steps"), "--steps"),
    case("eval --steps 2", ("eval", "ck.pvmckpt", "--steps", "2"), "--steps"),
    case("eval --steps -1", ("eval", "ck.pvmckpt", "--steps", "-1"), "--steps"),
    case("eval --n-seq 0", ("eval", "ck.pvmckpt", "--n-seq", "0"), "--n-seq"),
    case("eval no checkpoint", ("eval",), "Missing argument"),
    case("info --bandwidth 0", ("info", "tiny", "--bandwidth", "0"), "--bandwidth"),
    case("info --bandwidth -1", ("info", "tiny", "--bandwidth", "-1"), "--bandwidth"),
    case("info --bandwidth x", ("info", "tiny", "--bandwidth", "x"), "--bandwidth"),
    case("no command", (), "no command"),
    case("unknown command", ("trian",), "trian"),
    case("sweep no subcommand", ("sweep",), "sweep"),
    case("sweep run --max-concurrent 0", ("sweep", "run", "s.yaml", "--max-concurrent", "0"), "--max-concurrent"),
    case("bench --n-seq x", ("bench", "--n-seq", "x"), "--n-seq"),
    case("bench --n-seq 0", ("bench", "--n-seq", "0"), "n-seq"),
]

TRAIN_VALUES = [  # defects 7, 8, 11: values no run can use
    case("backend nope", (*T, "--backend", "nope"), "backend"),
    case("reference on cuda", (*T, "--backend", "reference", "--device", "cuda"), "CPU only"),
    case("device gpu0", (*T, "--device", "gpu0"), "gpu0"),
    case("device cuda:x", (*T, "--device", "cuda:x"), "cuda:x"),
    case("-O without =", (*T, "-O", "momentum"), "key=value"),
    case("-O unknown key", (*T, "-O", "no_such_key=1"), "no_such_key"),
    case("-O momentum text", (*T, "-O", "momentum=fast"), "momentum"),
    case("-O layer_shapes text", (*T, "-O", "layer_shapes=big"), "layer_shapes"),
    case("-O hidden_block_size 0", (*T, "-O", "hidden_block_size=0"), "hidden_block_size"),
    case("-O initial_learning_rate nan", (*T, "-O", "initial_learning_rate=nan"), "initial_learning_rate"),
    case("-O initial_learning_rate inf", (*T, "-O", "initial_learning_rate=inf"), "initial_learning_rate"),
    case("spec missing", (*T, "--spec", "no_such_model"), "no_such_model"),
    case("spec a folder", (*T, "--spec", "{d}"), "spec"),
    case("spec empty file", (*T, "--spec", "{d}/e.json"), "e.json", files={"e.json": ""}),
    case("spec /dev/null", (*T, "--spec", "/dev/null"), "null"),
    case("data missing file", (*T, "--data", "{d}/none.avi"), "none.avi"),
    case("data ,,,", (*T, "--data", ",,,"), "empty data string"),
    case("data pickle", (*T, "--data", "{d}/f.pkl"), "f.pkl", files={"f.pkl": b"\x80\x04K\x01."}),
    case("data npy", (*T, "--data", "{d}/f.npy"), "f.npy", files={"f.npy": b"\x93NUMPY"}),
    case("data synthetic unknown", (*T, "--data", "synthetic:cats"), "cats"),
    case("data text as video", (*T, "--data", "{d}/v.avi"), "v.avi", files={"v.avi": "not a video"}),
    case("data empty folder", (*T, "--data", "{d}/imgs"), "imgs", files={"imgs/.keep": ""}),
    case("data huge png", (*T, "--data", "{d}/big"), "pixels", files={"big/0000.png": png_header(40000, 40000)}),
    case("data bad zip", (*T, "--data", "{d}/d.zip"), "d.zip", files={"d.zip": b"PK\x03\x04 broken"}),
    case("data set without path", (*T, "--data", "green_ball_training"), "green_ball_training"),
    case("n-seq too big", (*T, "--spec", "small", "--n-seq", "100000000"), "needs", "this machine has"),
    # counts past 2^53 (not exact as floats in MLflow and JSON; a train of them would never end)
    *(case(f"train {opt} 1e20", (*T, opt, str(10**20)), name, "2^53") for opt, name in (
        ("--steps", "steps"), ("--checkpoint-every", "checkpoint_every"), ("--metrics-every", "metrics_every"),
        ("--readout-from", "readout_from"), ("--heldout-steps", "heldout_steps"))),
    case("eval --steps 1e20", ("eval", "ck.pvmckpt", "--steps", str(10**20)), "--steps", "9007199254740992"),
    case("bench --steps 1e20", ("bench", "--steps", str(10**20)), "--steps", "9007199254740992"),
    case("bench --warmup 1e20", ("bench", "--warmup", str(10**20)), "--warmup", "9007199254740992"),
    # bench checks every configuration before it times the first (the first one timed would print its progress)
    case("bench second n-seq too big", ("bench", "--spec", "tiny", "--n-seq", "1,100000000000", "--steps", "1"),
         "n_seq=100000000000", "needs"),
    case("bench reference on cuda", ("bench", "--spec", "tiny", "--n-seq", "1", "--steps", "1", "--backend",
                                     "reference", "--device", "cuda"), "CPU only"),
    case("run-dir is a file", (*T, "--run-dir", "{d}/f"), "is a file", files={"f": "x"}),
    case("run-dir under a file", (*T, "--run-dir", "{d}/f/r"), "is a file", files={"f": "x"}),
    case("resume missing", (*T, "--resume", "{d}/none.pvmckpt"), "none.pvmckpt"),
    case("resume a folder", (*T, "--resume", "{d}"), "is a directory"),
    case("resume text", (*T, "--resume", "{d}/t.pvmckpt"), "t.pvmckpt", files={"t.pvmckpt": "hello"}),
    case("heldout missing", (*T, "--heldout", "{d}/none.avi", "--heldout-steps", "5"), "none.avi"),
    case("mlflow folder as sqlite", ("train", "--steps", "3", "-q", "--mlflow", "sqlite:///{d}"), "is a folder"),
    case("mlflow sqlite no folder", ("train", "--steps", "3", "-q", "--mlflow", "sqlite:///{d}/no/x.db"),
         "does not exist"),
    case("mlflow file store", ("train", "--steps", "3", "-q", "--mlflow", "file://{d}/mlruns"), "file store"),
    case("mlflow plain path", ("train", "--steps", "3", "-q", "--mlflow", "{d}/mlruns"), "file store"),
    case("mlflow scheme typo", ("train", "--steps", "3", "-q", "--mlflow", "htp://127.0.0.1:5000"), "'htp' URIs"),
    case("mlflow sqlite in memory", ("train", "--steps", "3", "-q", "--mlflow", "sqlite:///"), "no database file"),
    case("mlflow sqlite :memory:", ("train", "--steps", "3", "-q", "--mlflow", "sqlite:///:memory:"),
         "no database file"),
    case("experiment empty", ("train", "--steps", "3", "-q", "--experiment", ""), "--experiment"),
]

SPECS = [  # defects 1, 7, 11: spec files, checked by `info` (which sizes and builds nothing)
    *(case(f"spec {k}={v!r}", ("info", "{d}/s.json"), k, files={"s.json": spec(**{k: v})}) for k, v in [
        ("layer_shapes", "abc"), ("layer_shapes", []), ("layer_shapes", [0]), ("layer_shapes", [-2, 1]),
        ("layer_shapes", [3.5, 1]), ("hidden_block_size", 0), ("hidden_block_size", -1),
        ("hidden_block_size", 1.5), ("hidden_block_size", "x"), ("momentum", "x"), ("momentum", None),
        ("input_block_size", 0), ("fan_in_square_size", -1), ("derivative", "sideways"),
        ("precision", "fp64"), ("polynomial", "maybe"), ("initial_learning_rate", -1.0), ("initial_learning_rate", [1])]),
    case("spec name lone surrogate", ("info", "{d}/s.json"), "not valid Unicode",
         files={"s.json": spec(name="\ud800")}),
    case("spec top-level list", ("info", "{d}/s.json"), "s.json", files={"s.json": "[1, 2]"}),
    case("spec top-level number", ("info", "{d}/s.json"), "s.json", files={"s.json": "42"}),
    case("spec not JSON", ("info", "{d}/s.json"), "s.json", files={"s.json": "{name: tiny"}),
    case("spec non-UTF-8", ("info", "{d}/s.json"), "s.json", files={"s.json": b'{"name": "\xff"}'}),
    case("spec binary", ("info", "{d}/s.json"), "s.json", files={"s.json": os.urandom(0) + bytes(range(256))}),
    case("spec NaN token", ("info", "{d}/s.json"), "s.json", files={"s.json": spec()[:-1] + ', "momentum": NaN}'}),
    case("spec duplicate key", ("info", "{d}/s.json"), "appears twice",
         files={"s.json": spec()[:-1] + ', "momentum": 0.1}'}),
    case("spec deep nesting", ("info", "{d}/s.json"), "nested deeper",
         files={"s.json": '{"a": ' + "[" * 5000 + "]" * 5000 + "}"}),
    case("spec huge layers", ("info", "{d}/s.json"), "needs at least",
         files={"s.json": spec(layer_shapes=[2000, 1000, 1], hidden_block_size=20, fan_in_square_size=2)}),
    case("spec huge image", ("info", "{d}/s.json"), "needs",
         files={"s.json": spec(layer_shapes=[100000, 1], input_block_size=100)}),
    case("validate missing", ("validate", "{d}/none.json"), "none.json"),
    case("validate one bad of two", ("validate", "tiny", "{d}/s.json"), "s.json", files={"s.json": "[]"}),
]

SWEEPS = [  # defects 1, 11: sweep files, checked by a dry run (which starts no Ray)
    *(case(f"sweep {name}", ("sweep", "run", "{d}/s.yaml", "--dry-run"), *needles, files={"s.yaml": text})
      for name, text, needles in [
        ("alias bomb 9x9", alias_bomb(9, 9), ("aliases",)),
        ("alias bomb 20x2", alias_bomb(20, 2), ("aliases",)),
        ("alias bomb 4x100", alias_bomb(4, 100), ("aliases",)),
        ("grid 1e6", grid(2, 1000), ("1,000,000 trials",)),
        ("grid 1e9", grid(3, 1000), ("1,000,000,000 trials",)),
        ("grid 1e12", grid(4, 1000), ("trials", "at most")),
        ("duplicate key", "name: a\nname: b\n" + SWEEP_OK, ("'name' appears twice",)),
        ("duplicate nested key", SWEEP_OK + "overrides: {momentum: 0.1, momentum: 0.2}\n",
         ("'momentum' appears twice",)),
        ("deep nesting", SWEEP_OK + "vary: " + "[" * 300 + "]" * 300 + "\n", ("nested deeper",)),
        ("empty", "", ("s.yaml",)),
        ("a list", "- 1\n- 2\n", ("s.yaml",)),
        ("a string", "hello\n", ("s.yaml",)),
        ("YAML syntax", "spec: [tiny\n", ("s.yaml",)),
        ("tab indent", "spec: tiny\n\tsteps: 10\n", ("s.yaml",)),
        ("non-UTF-8", b"spec: tiny\nsteps: 10\nname: \xff\xfe\n", ("s.yaml",)),
        ("python tag", SWEEP_OK + "x: !!python/object/apply:os.system ['true']\n", ("s.yaml",)),
        ("unknown key", SWEEP_OK + "stepz: 3\n", ("stepz",)),
        ("steps 0", "spec: tiny\nsteps: 0\n", ("steps",)),
        ("steps -1", "spec: tiny\nsteps: -1\n", ("steps",)),
        ("steps text", "spec: tiny\nsteps: many\n", ("steps",)),
        ("steps 1e30", "spec: tiny\nsteps: 1e30\n", ("steps",)),
        ("steps 1e20 integer", "spec: tiny\nsteps: 100000000000000000000\n", ("steps", "2^53")),
        ("no spec", "steps: 10\n", ("spec",)),
        ("spec missing", "spec: no_such_model\nsteps: 10\n", ("no_such_model",)),
        ("metric layer99", SWEEP_OK + "metric: layer99_mse_two_step\n", ("names layer 99",)),
        ("metric unknown", SWEEP_OK + "metric: accuracy\n", ("accuracy",)),
        ("n_seq 1e11", SWEEP_OK + "n_seq: 100000000000\n", ("needs",)),
        ("n_seq 0", SWEEP_OK + "n_seq: 0\n", ("n_seq",)),
        ("data pkl", SWEEP_OK + "data: frames.pkl\n", ("never loaded",)),
        ("data ,,,", SWEEP_OK + "data: ',,,'\n", ("empty data string",)),
        ("vary empty list", SWEEP_OK + "vary: {momentum: []}\n", ("momentum",)),
        ("vary unknown key", SWEEP_OK + "vary: {no_such_key: [1, 2]}\n", ("no_such_key",)),
        ("vary not a mapping", SWEEP_OK + "vary: [1, 2]\n", ("vary",)),
        ("overrides bad value", SWEEP_OK + "overrides: {momentum: fast}\n", ("momentum",)),
        ("checkpoint_every -1", SWEEP_OK + "checkpoint_every: -1\n", ("checkpoint_every",)),
        ("metrics_every 0", SWEEP_OK + "metrics_every: 0\n", ("metrics_every",)),
        ("backend nope", SWEEP_OK + "backend: nope\n", ("backend",)),
        ("name lone surrogate", SWEEP_OK + 'name: "\\ud800"\n', ("not valid Unicode",)),
    ]),
    case("sweep file missing", ("sweep", "run", "{d}/none.yaml", "--dry-run"), "none.yaml"),
    case("sweep file a folder", ("sweep", "run", "{d}", "--dry-run"), "folder"),
    case("sweep root a file", ("sweep", "run", "{d}/s.yaml", "--root", "{d}/f"), "--root", "is a file",
         files={"s.yaml": SWEEP_OK, "f": "x"}),
    case("sweep address bad", ("sweep", "run", "{d}/s.yaml", "--address", "no-such-host:1"), "no-such-host",
         files={"s.yaml": SWEEP_OK}),
    case("sweep mlflow file store", ("sweep", "run", "{d}/s.yaml", "--mlflow", "file://{d}/m"), "file store",
         files={"s.yaml": SWEEP_OK}),
    case("sweep resume unknown", ("sweep", "resume", "nope", "--root", "{d}"), "nope"),
    case("sweep status unknown", ("sweep", "status", "nope", "--root", "{d}"), "nope"),
    case("sweep resume root a file", ("sweep", "resume", "x", "--root", "{d}/f/sub"), "--root", files={"f": "x"}),
]

STORES = [  # defects 7, 11: trackers that cannot be used fail at once, and create nothing
    case("compare no store", ("compare", "quickstart"), "no MLflow store"),
    case("compare dead server", ("compare", "quickstart", "--mlflow", "http://127.0.0.1:1"), "cannot reach MLflow"),
    case("compare sqlite folder", ("compare", "quickstart", "--mlflow", "sqlite:///{d}"), "is a folder"),
    case("compare missing db", ("compare", "quickstart", "--mlflow", "sqlite:///{d}/none.db"), "does not exist"),
    case("compare file store", ("compare", "quickstart", "--mlflow", "file://{d}/m"), "file store"),
    case("compare unknown scheme", ("compare", "quickstart", "--mlflow", "postgres://h/db"), "'postgres' URIs"),
    case("sweep unknown scheme", ("sweep", "run", "{d}/s.yaml", "--mlflow", "garbage://x"), "'garbage' URIs",
         files={"s.yaml": SWEEP_OK}),
    case("sync missing path", ("sync", "{d}/none"), "none"),
]

CASES = USAGE + TRAIN_VALUES + SPECS + SWEEPS + STORES


@pytest.mark.parametrize("args,files,needles", CASES)
def test_bad_input_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path, args, files, needles):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("PVM_MLFLOW_URI", raising=False)
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
    before = sorted(p.name for p in tmp_path.iterdir())
    code, _, err = run_cli(monkeypatch, capsys, *(a.replace("{d}", str(tmp_path)) for a in args))
    lines = error_lines(err)
    assert code == 2 and len(lines) == 1, err[-2000:]
    assert "internal error" not in lines[0] and "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing created: no runs/, mlflow.db, sweeps


def test_the_table_covers_every_class_several_times():
    """The figure the issue asks for counts these; keep the classes broad, not one case each."""
    assert len(CASES) >= 150
    assert min(len(USAGE), len(TRAIN_VALUES), len(SPECS), len(SWEEPS)) >= 20 and len(STORES) >= 5
