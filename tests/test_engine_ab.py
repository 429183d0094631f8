"""dev/engine_ab.py, the engine A/B tool: variants parsed, each run under its own switches only, the environment
left as it was, the summary against the first variant, bad arguments refused before any engine is built."""

from __future__ import annotations

import importlib.util
import io
import json
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


@pytest.mark.skipif(native_module() is None, reason="the native module is not built")
def test_runs_the_native_engine(tmp_path, capsys):
    ab = engine_ab()
    out = tmp_path / "rows.json"
    assert ab.main(["base:", "nochain:PVM_CUDA_CHAIN=0", "--specs", "tiny", "--n-seq", "2", "--rounds", "1",
                    "--steps", "3", "--device", "cpu", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "summary" in printed and "tiny n2: base" in printed
    rows = json.loads(out.read_text())
    assert [r["variant"] for r in rows] == ["base", "nochain"] and all(r["frames_per_s"] > 0 for r in rows)
