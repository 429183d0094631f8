"""Property-based fuzzing of what users hand pvm-dist: spec JSON, sweep YAML, checkpoint bytes, CLI values.

The property, for every input: the command exits 0, or exits 2 with one line that says what is wrong
(a sweep file's problems may follow it as ``  - key: problem`` items), never a traceback or an internal
error, no file that existed before is changed, and this process's peak memory rises no more than
``MEMORY_HEADROOM`` above what it was when the fuzzer started (every size is checked before allocating;
``test_bad_inputs.py`` has the worst cases).

CI runs a few derandomized examples per input kind, in-process; ``PVM_FUZZ_EXAMPLES=500`` runs more, with
fresh random examples each time.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import tempfile
from pathlib import Path

import pytest
import yaml
from cli_inprocess import error_lines, run_cli
from conftest import ZOO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("PVM_FUZZ_EXAMPLES", "0"))
#: numpy's RuntimeWarnings would be more lines on a user's stderr: here they fail the example.
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")
FUZZ = settings(max_examples=EXAMPLES or 6, derandomize=not EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

#: How far the process's peak resident memory may rise while fuzzing (an unbounded allocation goes far past it).
MEMORY_HEADROOM = 1 << 30


def _peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


@pytest.fixture(scope="module", autouse=True)
def peak_at_start() -> None:
    """The process's peak before this module's first example (earlier tests may have raised it)."""
    global PEAK_AT_START
    PEAK_AT_START = _peak_bytes()


PEAK_AT_START = 0

#: Strings that broke something once, or that look like what a parser special-cases.
ODD_TEXT = ["", " ", "0", "-1", "1e999", "nan", "-inf", "[]", "{}", "null", "true", ",,,", "synthetic:",
            "\ud800", "\udcff", "\u202e", "a\nb", "../..", "/", "x" * 300, "cuda:99", "1" * 40]
#: Integers at the edges: zero, negatives, huge (sizes past any memory), past int64.
ODD_INTS = [0, 1, 2, 3, -1, -(2**31), 2**31, 10**6, 10**9, 10**12, 2**63, 10**30]


def _scalar() -> st.SearchStrategy:
    return st.one_of(st.none(), st.booleans(), st.sampled_from(ODD_INTS), st.integers(-5, 50),
                     st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(ODD_TEXT), st.text(max_size=6))


ODD_VALUE = st.recursive(_scalar(), lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                         max_leaves=6)


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def _assert_clean(code: int, err: str, before: dict[str, str], folder: Path, creates_nothing: bool = True) -> None:
    lines = error_lines(err)
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    assert code in (0, 2), (code, err[-2000:])
    if code == 2:
        assert lines and lines[0].startswith("pvm-dist: "), err
        assert all(line.startswith("  - ") for line in lines[1:]), err
    after = _snapshot(folder)
    assert {k: v for k, v in after.items() if k in before} == before, "an existing file changed"
    peak = _peak_bytes()
    assert peak <= PEAK_AT_START + MEMORY_HEADROOM, f"peak memory rose by {(peak - PEAK_AT_START) / 2**20:,.0f} MiB"
    if code == 2 and creates_nothing:
        assert after.keys() == before.keys(), f"a refused input left files: {sorted(after.keys() - before.keys())}"


@pytest.fixture
def cli(monkeypatch, capsys):
    return lambda *args: run_cli(monkeypatch, capsys, *args)


@pytest.fixture
def workdir(monkeypatch):
    """A fresh folder per example (hypothesis reuses function-scoped fixtures across examples)."""
    def enter() -> tempfile.TemporaryDirectory:
        holder = tempfile.TemporaryDirectory(prefix="pvm-fuzz-")
        monkeypatch.chdir(holder.name)
        return holder
    return enter


# --- spec JSON -----------------------------------------------------------------------------------------------
SPEC_KEYS = [*json.loads((ZOO / "tiny.json").read_text()), "name", "description", "bogus_key"]
#: Layer shapes are either small or absurd: absurd ones must be refused by the memory budget in microseconds.
SHAPES = st.lists(st.one_of(st.integers(-1, 6), st.sampled_from([10**6, 10**9, 10**15])), min_size=0, max_size=4)


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(SPEC_KEYS), ODD_VALUE, max_size=3), shapes=st.none() | SHAPES,
       raw_tail=st.sampled_from(["", "", "}", "]]]]", "\x00", "\ufeff"]))
def test_fuzz_spec_json(cli, workdir, changes, shapes, raw_tail):
    with workdir() as folder:
        spec = {**json.loads((ZOO / "tiny.json").read_text()), **changes}
        if shapes is not None:
            spec["layer_shapes"] = shapes
        path = Path(folder) / "spec.json"
        path.write_text(json.dumps(spec) + raw_tail)
        before = _snapshot(Path(folder))
        for command in ("validate", "info"):
            code, _, err = cli(command, str(path))
            _assert_clean(code, err, before, Path(folder))


# --- sweep YAML --------------------------------------------------------------------------------------------------
SWEEP_KEYS = ["name", "spec", "vary", "samples", "seed", "overrides", "metric", "mode", "steps", "checkpoint_every",
              "metrics_every", "n_seq", "data", "backend", "device", "readout_lr", "resources", "max_failures",
              "early_stopping", "bogus"]
VARY = st.dictionaries(st.sampled_from(["momentum", "initial_learning_rate", "seed", "layer_shapes", "hidden_block_size",
                                        "nope"]),
                       st.one_of(st.lists(ODD_VALUE, max_size=4),
                                 st.fixed_dictionaries({}, optional={"uniform": ODD_VALUE, "loguniform": ODD_VALUE,
                                                                     "randint": ODD_VALUE, "choice": ODD_VALUE})),
                       max_size=3)


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(SWEEP_KEYS), ODD_VALUE, max_size=4), vary=st.none() | VARY,
       text_tail=st.sampled_from(["", "", "\nx: &a [1]\ny: *a\n", "\nname: again\n", "\n\t- :", "\n" + "[" * 50]))
def test_fuzz_sweep_yaml(cli, workdir, changes, vary, text_tail):
    with workdir() as folder:
        sweep = {"name": "fuzz", "spec": "tiny", "steps": 20, **changes}
        if vary is not None:
            sweep["vary"] = vary
        if isinstance(sweep.get("samples"), int) and sweep["samples"] > 64:
            sweep["samples"] = 10**9  # absurd, or small: a real plan of thousands only costs time
        try:
            text = yaml.safe_dump(sweep, allow_unicode=True)
        except (yaml.YAMLError, UnicodeEncodeError):
            text = json.dumps(sweep)
        path = Path(folder) / "sweep.yaml"
        path.write_text(text + text_tail, encoding="utf-8", errors="surrogateescape")
        before = _snapshot(Path(folder))
        code, _, err = cli("sweep", "run", str(path), "--dry-run", "--json")
        _assert_clean(code, err, before, Path(folder))


# --- checkpoint bytes ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint_bytes(tmp_path_factory) -> bytes:
    from pvm_dist.model.spec import load_spec
    from pvm_dist.run.config import RunConfig
    from pvm_dist.run.train import train

    folder = tmp_path_factory.mktemp("fuzz-ck")
    cfg = RunConfig(spec=load_spec("tiny"), steps=6, track=False, picture_every=0, heldout_steps=0,
                    animation_frames=0)
    return train(cfg, folder / "run").checkpoint.read_bytes()


@FUZZ
@given(edit=st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 10**6)),
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("splice"), st.integers(0, 10**6), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("header"), st.integers(0, 2**32 - 1)),
))
def test_fuzz_checkpoint_bytes(cli, workdir, checkpoint_bytes, edit):
    data = bytearray(checkpoint_bytes)
    kind, at = edit[0], edit[1] % len(data)
    if kind == "truncate":
        data = data[:at]
    elif kind == "flip":
        data[at] ^= edit[2]
    elif kind == "splice":
        data[at : at + len(edit[2])] = edit[2]
    else:  # the header length field (after the 8-byte magic and the 4-byte version)
        data[12:16] = edit[1].to_bytes(4, "little")
    with workdir() as folder:
        path = Path(folder) / "ck.pvmckpt"
        path.write_bytes(bytes(data))
        before = _snapshot(Path(folder))
        for args in (["eval", str(path), "--steps", "3"], ["train", "--resume", str(path), "--steps", "8", "--no-track",
                                                             "-q", "--heldout-steps", "0"]):
            code, _, err = cli(*args)
            _assert_clean(code, err, before, Path(folder), creates_nothing=args[0] == "eval")


# --- CLI values ----------------------------------------------------------------------------------------------------
#: Options and values whose accepted range costs little (a 3-step tiny run); others get absurd or odd values.
TRAIN_OPTIONS = {
    "--n-seq": st.one_of(st.integers(-3, 4), st.sampled_from([10**9, 10**18])).map(str),
    "--seed": st.one_of(st.sampled_from(ODD_INTS), st.integers(-5, 5)).map(str),
    "--data": st.sampled_from(ODD_TEXT + ["synthetic:bar", "synthetic:noise", "x.pkl", "a.zip", "clip.mp4"]),
    "--backend": st.sampled_from(ODD_TEXT + ["reference", "native", "auto"]),
    "--device": st.sampled_from(ODD_TEXT + ["cpu", "cuda", "cuda:0", "gpu"]),
    "--keep": st.sampled_from(ODD_INTS).map(str),
    "--checkpoint-every": st.sampled_from(ODD_INTS).map(str),
    "--metrics-every": st.sampled_from(ODD_INTS).map(str),
    "--readout-lr": st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(str), st.sampled_from(ODD_TEXT)),
    "--readout-from": st.sampled_from(ODD_INTS).map(str),
    "-O": st.builds(lambda k, v: f"{k}={v}", st.sampled_from(SPEC_KEYS + ["", "=", "seed"]),
                    st.sampled_from(ODD_TEXT + ["1e300", "0.5", "[1,1]", "[100000000]"])),
    "--run-dir": st.sampled_from(["r", "", ".", "spec.json/r", "\udcff"]),
}


@FUZZ
@given(options=st.dictionaries(st.sampled_from(sorted(TRAIN_OPTIONS)), st.just(None), min_size=1, max_size=3).flatmap(
    lambda chosen: st.fixed_dictionaries({k: TRAIN_OPTIONS[k] for k in chosen})))
def test_fuzz_train_values(cli, workdir, options):
    with workdir() as folder:
        Path(folder, "spec.json").write_text((ZOO / "tiny.json").read_text())
        args = ["train", "--steps", "3", "--no-track", "-q", "--heldout-steps", "0", "--picture-every", "0"]
        for option, value in options.items():
            args += [option, value]
        before = _snapshot(Path(folder))
        code, _, err = cli(*args)
        _assert_clean(code, err, before, Path(folder), creates_nothing=False)
