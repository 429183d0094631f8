"""dev/cuda/sass_loops.py, the SASS slab-loop count: functions split from cuobjdump's listing, the loop found by its
backward branch over a barrier (not an inner loop without one, nor a forward branch), its opcodes counted, and bad
input refused in one line with exit 2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Two functions as cuobjdump -sass prints them: the first has a forward branch, an inner loop without a barrier
# (0x0040-0x0060) inside the slab loop (0x0030-0x00b0), a predicated instruction and an instruction after the loop;
# the second has no barrier at all.
LISTING = """\
\tcode for sm_90a
\t\tFunction : _Z7productPf
\t.headerflags\t@"EF_CUDA_SM90"
        /*0000*/                   MOV R1, c[0x0][0x28] ;                 /* 0x00000a0000017a02 */
        /*0010*/              @!P0 BRA 0xc0 ;                             /* 0x000000a000008947 */
        /*0020*/                   IADD3 R2, R2, 0x1, RZ ;                /* 0x0000000102027810 */
        /*0030*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;          /* 0x0000000000007b1d */
        /*0040*/                   LDS R4, [R3] ;                         /* 0x0000000003047984 */
        /*0050*/                   HMMA.1688.F32.TF32 R8, R4, R6, R8 ;   /* 0x000000060408723c */
        /*0060*/               @P1 BRA 0x40 ;                             /* 0xfffffffc00d01947 */
        /*0070*/                   LOP3.LUT R5, R4, 0xffffe000, RZ, 0xc0, !PT ;
        /*0080*/                   FADD R6, R4, -R5 ;                     /* 0x8000000504067221 */
        /*0090*/                   LDGSTS.E [R7], desc[UR4][R10.64], P2 ; /* 0x0000000a07007fae */
        /*00a0*/                   ISETP.GE.AND P0, PT, R2, R9, PT ;      /* 0x000000090200720c */
        /*00b0*/              @!P0 BRA 0x30 ;                             /* 0xffffff7000008947 */
        /*00c0*/                   EXIT ;                                 /* 0x000000000000794d */
\t\tFunction : _Z4fillPf
        /*0000*/                   MOV R1, c[0x0][0x28] ;                 /* 0x00000a0000017a02 */
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;                /* 0x0000000102027810 */
        /*0020*/              @!P0 BRA 0x10 ;                             /* 0xfffffff000008947 */
        /*0030*/                   EXIT ;                                 /* 0x000000000000794d */
"""


def sass_loops():
    spec = importlib.util.spec_from_file_location("sass_loops", ROOT / "dev" / "cuda" / "sass_loops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_slab_loop_is_the_branch_back_over_a_barrier():
    sl = sass_loops()
    listing = sl.functions(LISTING)
    assert list(listing) == ["_Z7productPf", "_Z4fillPf"]
    product, fill = listing.values()
    assert len(product) == 13 and product[1][1] == "BRA"  # the predicate is not taken for the opcode
    assert sl.slab_loop(product) == (0x30, 0xB0)
    mix = sl.loop_mix(product)
    assert mix == {"BAR": 1, "LDS": 1, "HMMA": 1, "BRA": 2, "LOP3": 1, "FADD": 1, "LDGSTS": 1, "ISETP": 1}
    assert sl.summary(mix) == "9 instructions: HMMA 1, LDS 1, LDGSTS 1, FADD 1, integer 2"
    assert sl.slab_loop(fill) is None and sl.loop_mix(fill) is None


def test_the_command_reads_sass_text_filters_and_writes_json(tmp_path, capsys):
    sl = sass_loops()
    path = tmp_path / "products.sass"
    path.write_text(LISTING)
    assert sl.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "_Z7productPf\n    9 instructions: HMMA 1" in out and "_Z4fillPf\n    no loop with a barrier" in out
    assert sl.main([str(path), "--match", "product", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["_Z7productPf"] and rows[0]["loop"] == [0x30, 0xB0]
    assert rows[0]["mix"]["HMMA"] == 1


@pytest.mark.parametrize("name, content, args, said", [
    ("missing.sass", None, [], "no such file"),
    ("empty.sass", "code for sm_90a\n", [], "no SASS functions in"),
    ("ok.sass", LISTING, ["--match", "("], "--match is not a regular expression"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, name, content, args, said):
    sl = sass_loops()
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    assert sl.main([str(path), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err, err


def test_a_binary_without_cuobjdump_is_one_line(tmp_path, capsys, monkeypatch):
    sl = sass_loops()
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"\x7fELF")
    monkeypatch.setattr(sl.shutil, "which", lambda _: None)
    assert sl.main([str(cubin)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cuobjdump is not on PATH" in err, err
