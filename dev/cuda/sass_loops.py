"""The slab loops of kernels in SASS, counted by opcode: a product change's first check, in seconds on a machine
without a GPU, before the workbench and the engine A/B (benchmarks/NOTES.md: the W1 forward is near the issue limit,
so instructions per slab are what its changes move).

    nvcc -std=c++17 -O3 -arch=sm_90a -fmad=false -Inative/include -cubin \\
        -o /tmp/products.cubin dev/cuda/product_kernels.cu
    python3 dev/cuda/sass_loops.py /tmp/products.cubin [--match W1Forward] [--json]

A .cubin or .o is disassembled with cuobjdump -sass (CUDA's binary utilities); any other file is read as its text.
A function's slab loop is the first loop, in address order, that closes with a backward branch over a block barrier
(BAR.SYNC); its instructions are counted by opcode (the part before the first dot)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)", re.MULTILINE)
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", re.MULTILINE)
_TARGET = re.compile(r"0x([0-9a-f]+)")
# Opcodes summed as integer and address work in the summary line (the uniform datapath's too).
INTEGER = ("IADD3", "IMAD", "LEA", "ISETP", "SEL", "VIADD", "LOP3", "SHF", "PLOP3", "MOV", "IABS", "UIADD3", "UIMAD",
           "UISETP", "ULOP3", "USHF", "UMOV", "USEL", "ULEA")

Instruction = tuple[int, str, str]  # address, opcode, operands


def functions(sass: str) -> dict[str, list[Instruction]]:
    """Each function of cuobjdump's SASS listing with its instructions in address order."""
    heads = list(_FUNCTION.finditer(sass))
    out: dict[str, list[Instruction]] = {}
    for head, nxt in zip(heads, [*heads[1:], None]):
        body = sass[head.end():nxt.start() if nxt else len(sass)]
        out[head.group(1)] = [(int(m.group(1), 16), m.group(2), m.group(3)) for m in _INSTRUCTION.finditer(body)]
    return out


def slab_loop(instructions: list[Instruction]) -> tuple[int, int] | None:
    """(first, last address) of the first loop closed by a backward branch with a BAR.SYNC inside, or None."""
    barriers = [a for a, op, _ in instructions if op.startswith("BAR.SYNC")]
    for address, op, operands in instructions:
        if op.split(".")[0] != "BRA":
            continue
        target = _TARGET.search(operands)
        if target is None:
            continue
        head = int(target.group(1), 16)
        if head < address and any(head <= b < address for b in barriers):
            return head, address
    return None


def loop_mix(instructions: list[Instruction]) -> Counter[str] | None:
    """The slab loop's instructions counted by opcode, or None where the function has no such loop."""
    loop = slab_loop(instructions)
    if loop is None:
        return None
    return Counter(op.split(".")[0] for a, op, _ in instructions if loop[0] <= a <= loop[1])


def summary(mix: Counter[str]) -> str:
    integer = sum(mix[op] for op in INTEGER)
    return (f"{sum(mix.values())} instructions: HMMA {mix['HMMA']}, LDS {mix['LDS']}, LDGSTS {mix['LDGSTS']}, "
            f"FADD {mix['FADD']}, integer {integer}")


def read_sass(path: Path) -> str:
    """path's SASS: cuobjdump's for a .cubin or .o, else the file's text. ValueError says what is wrong."""
    if not path.is_file():
        raise ValueError(f"no such file: {path}")
    if path.suffix not in (".cubin", ".o"):
        return path.read_text(errors="replace")
    tool = shutil.which("cuobjdump")
    if tool is None:
        raise ValueError("cuobjdump is not on PATH (CUDA's binary utilities; pip's nvidia-cuda-cuobjdump has it)")
    done = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        raise ValueError(f"cuobjdump could not read {path}: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path, help="a .cubin or .o (disassembled with cuobjdump), or SASS text")
    parser.add_argument("--match", default="", help="only functions whose (mangled) name this regular expression finds")
    parser.add_argument("--json", action="store_true", help="one object per function: name, loop [first, last], mix")
    args = parser.parse_args(argv)
    try:
        pattern = re.compile(args.match)
    except re.error as e:
        print(f"sass_loops: --match is not a regular expression: {e}", file=sys.stderr)
        return 2
    try:
        listing = functions(read_sass(args.file))
    except ValueError as e:
        print(f"sass_loops: {e}", file=sys.stderr)
        return 2
    if not listing:
        print(f"sass_loops: no SASS functions in {args.file}", file=sys.stderr)
        return 2
    rows = []
    for name, instructions in listing.items():
        if not pattern.search(name):
            continue
        mix = loop_mix(instructions)
        rows.append({"name": name, "loop": list(slab_loop(instructions) or ()), "mix": dict(mix or {})})
        if not args.json:
            print(f"{name}\n    {summary(mix) if mix is not None else 'no loop with a barrier'}")
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
