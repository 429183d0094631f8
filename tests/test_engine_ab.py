"""dev/engine_ab.py, the engine A/B tool: variants parsed, each run under its own switches only, the environment
left as it was, the summary against the first variant (also of rows from earlier runs), bad arguments refused before
any engine is built; dev/engine_ab_builds.sh refuses bad arguments before building anything."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from pvm_dist.engine.native import native_module

ROOT = Path(__file__).resolve().parents[1]


def engine_ab():
    spec = importlib.util.spec_from_file_location("engine_ab", ROOT / "dev" / "engine_ab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_variants_parse():
    ab = engine_ab()
    assert ab.parse_variant("base:") == ("base", {})
    assert ab.parse_variant("fma:PVM_CUDA_FMA=U,PVM_CUDA_CHAIN=0") == ("fma", {"PVM_CUDA_FMA": "U", "PVM_CUDA_CHAIN": "0"})
    for bad in ("base", ":A=1", "x:A", "x:=1"):
        with pytest.raises(ValueError):
            ab.parse_variant(bad)


def test_each_run_sees_only_its_variants_switches(monkeypatch):
    ab = engine_ab()
    monkeypatch.setenv("PVM_AB_A", "outside")
    monkeypatch.delenv("PVM_AB_B", raising=False)
    seen = []

    def fake_bench(spec, n, **kw):
        seen.append((n, ab.os.environ.get("PVM_AB_A"), ab.os.environ.get("PVM_AB_B")))
        rate = {None: 100.0, "1": 110.0}[ab.os.environ.get("PVM_AB_A")] * (2 if ab.os.environ.get("PVM_AB_B") else 1)
        return SimpleNamespace(frames_per_s=rate * n, ratio_to_floor=0.5, phases_ms={"deltas": 0.0125}, device="fake")

    monkeypatch.setattr(ab, "run_bench", fake_bench)
    variants = [ab.parse_variant(v) for v in ("base:", "a:PVM_AB_A=1", "b:PVM_AB_B=x")]
    rows = ab.run(variants, ["tiny"], [2, 4], rounds=2, steps=1, device="cpu", frames="device", out=io.StringIO())
    assert seen[:3] == [(2, None, None), (2, "1", None), (2, None, "x")]
    assert len(seen) == 12 and rows[0]["phases_us"] == {"deltas": 12.5}
    assert ab.os.environ["PVM_AB_A"] == "outside" and "PVM_AB_B" not in ab.os.environ
    lines = ab.summary(rows, ["base", "a", "b"])
    assert lines[0] == "tiny n2: base 200 (+0.0%)  a 220 (+10.0%)  b 400 (+100.0%)"
    assert lines[1].startswith("tiny n4: base 400 ")


@pytest.mark.parametrize("argv, says", [
    (["base"], "NAME:KEY=VALUE"),
    (["a:", "a:X=1"], "repeat"),
    (["a:", "--n-seq", "0"], "at least 1"),
    (["a:", "--specs", "no-such-spec"], "no-such-spec"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, says, capsys):
    ab = engine_ab()
    with pytest.raises(SystemExit) as e:
        ab.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert says in err and "Traceback" not in err


def row(variant, n, rate):
    return {"round": 0, "spec": "small", "n_seq": n, "variant": variant, "frames_per_s": rate, "phases_us": {}}


def test_summarize_reads_the_rows_of_earlier_runs(tmp_path, capsys):
    ab = engine_ab()
    files = []
    for i, rows in enumerate(([row("base", 64, 100.0), row("base", 256, 400.0)], [row("this", 64, 112.0), row("this", 256, 380.0)],
                              [row("base", 64, 104.0), row("base", 256, 390.0)], [row("this", 64, 110.0), row("this", 256, 396.0)])):
        files.append(tmp_path / f"{i}.json")
        files[-1].write_text(json.dumps(rows))
    assert ab.main(["--summarize", *map(str, files)]) == 0
    assert capsys.readouterr().out.splitlines() == ["small n64: base 104 (+0.0%)  this 112 (+7.7%)",
                                                    "small n256: base 400 (+0.0%)  this 396 (-1.0%)"]


@pytest.mark.parametrize("content, argv_extra, says", [
    (None, [], "No such file"),
    ("{not json", [], "rows.json"),
    ('{"spec": "small"}', [], "not the rows"),
    ("[]", [], "no rows"),
    ("[]", ["base:"], "takes files, not variants"),
])
def test_bad_summaries_are_one_line_and_exit_2(tmp_path, capsys, content, argv_extra, says):
    ab = engine_ab()
    path = tmp_path / "rows.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as e:
        ab.main([*argv_extra, "--summarize", str(path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert says in err and "Traceback" not in err


def test_no_variants_and_no_files_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        engine_ab().main([])
    assert e.value.code == 2 and "at least one variant" in capsys.readouterr().err


@pytest.mark.parametrize("args, env, says", [
    ([], {}, "usage:"),
    (["{missing}", "{out}"], {}, "is not a checkout"),
    ([".", "{out}"], {"AB_ROUNDS": "two"}, "AB_ROUNDS must be a positive integer"),
])
def test_builds_script_refuses_bad_arguments_before_building(tmp_path, args, env, says):
    argv = [a.format(missing=tmp_path / "nowhere", out=tmp_path / "out") for a in args]
    done = subprocess.run(["bash", str(ROOT / "dev" / "engine_ab_builds.sh"), *argv], cwd=ROOT, capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", **env}, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and says in done.stderr
    assert not (tmp_path / "out" / "base-site").exists()


@pytest.mark.skipif(native_module() is None, reason="the native module is not built")
def test_runs_the_native_engine(tmp_path, capsys):
    ab = engine_ab()
    out = tmp_path / "rows.json"
    assert ab.main(["base:", "nochain:PVM_CUDA_CHAIN=0", "--specs", "tiny", "--n-seq", "2", "--rounds", "1",
                    "--steps", "3", "--device", "cpu", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"engine: {native_module().__file__}\n")
    assert "summary" in printed and "tiny n2: base" in printed
    rows = json.loads(out.read_text())
    assert [r["variant"] for r in rows] == ["base", "nochain"] and all(r["frames_per_s"] > 0 for r in rows)
