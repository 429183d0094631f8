"""A/B of the native engine under its environment switches, all arms in one process and one build.

    python3 -P dev/engine_ab.py base: fma:PVM_CUDA_FMA=U --specs small,med,LARGE --n-seq 48,64 --rounds 2

A variant is NAME:KEY=VALUE,KEY=VALUE (nothing after the colon: the engine's defaults). The engine reads its
switches (PVM_CUDA_*) when it is built, so each run sets its variant's keys after clearing every key that any
variant sets. Rounds alternate the variants, so that drift (clocks, heat) falls on all of them alike; each run is
``run_bench`` with frames on the device. One line per run (frames/s, share of the roofline, the phases in µs), then
per spec and n_seq each variant's best round against the first variant's. ``--json PATH`` writes every run's row.
This is how the engine A/Bs in ``benchmarks/`` are taken.

``--summarize FILE ...`` prints the same summary from rows written by earlier runs (``--json``), the first file's
first variant the baseline: how ``dev/engine_ab_builds.sh`` compares two builds, one process per build and round.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pvm_dist.engine.native import native_module
from pvm_dist.model.spec import load_spec
from pvm_dist.run.bench import run_bench


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """``NAME:KEY=VALUE,...`` -> (name, environment)."""
    name, colon, rest = text.partition(":")
    if not name or not colon:
        raise ValueError(f"variant {text!r}: expected NAME:KEY=VALUE,... (NAME: for the defaults)")
    env = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not key or not eq:
            raise ValueError(f"variant {text!r}: {item!r} is not KEY=VALUE")
        env[key] = value
    return name, env


def run(variants: Sequence[tuple[str, dict[str, str]]], specs: Sequence[str], n_seqs: Sequence[int], rounds: int,
        steps: int, device: str, frames: str, out=sys.stdout) -> list[dict]:
    """Every (round, spec, n_seq, variant) run in that order; the environment is as it was afterwards."""
    keys = {k for _, env in variants for k in env}
    saved = {k: os.environ.get(k) for k in keys}
    rows = []
    try:
        for r in range(rounds):
            for spec in specs:
                for n in n_seqs:
                    for name, env in variants:
                        for k in keys:
                            os.environ.pop(k, None)
                        os.environ.update(env)
                        res = run_bench(load_spec(spec), n, backend="native", device=device, steps=steps, warmup=10,
                                        frames=frames)
                        phases = {k: round(v * 1000, 1) for k, v in res.phases_ms.items()}
                        rows.append({"round": r, "spec": spec, "n_seq": n, "variant": name,
                                     "frames_per_s": res.frames_per_s, "ratio_to_floor": res.ratio_to_floor,
                                     "phases_us": phases, "device": res.device})
                        shown = " ".join(f"{k}={v}" for k, v in phases.items())
                        print(f"r{r} {spec} n{n} {name:12s} {res.frames_per_s:12,.0f} f/s {100 * res.ratio_to_floor:5.1f}%"
                              f"  [{shown}] us", file=out, flush=True)
                        del res
                        gc.collect()  # (the engine's device memory goes before the next one is built)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return rows


def summary(rows: Sequence[dict], names: Sequence[str]) -> list[str]:
    """Per spec and n_seq: each variant's best frames/s, and its change against the first variant's best."""
    best: dict[tuple[str, int, str], float] = {}
    for row in rows:
        key = (row["spec"], row["n_seq"], row["variant"])
        best[key] = max(best.get(key, 0.0), row["frames_per_s"])
    lines = []
    for spec, n in dict.fromkeys((row["spec"], row["n_seq"]) for row in rows):
        base = best[(spec, n, names[0])]
        cells = [f"{name} {best[(spec, n, name)]:,.0f} ({100 * (best[(spec, n, name)] / base - 1):+.1f}%)" for name in names]
        lines.append(f"{spec} n{n}: " + "  ".join(cells))
    return lines


def rows_of(paths: Sequence[Path]) -> list[dict]:
    """The rows that ``--json`` wrote to each file, in order; ValueError names a file it cannot read as such rows."""
    rows = []
    for path in paths:
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: {e}") from None
        if not isinstance(found, list) or not all(
                isinstance(r, dict) and {"spec", "n_seq", "variant", "frames_per_s"} <= r.keys() for r in found):
            raise ValueError(f"{path}: not the rows of dev/engine_ab.py --json")
        rows += found
    if not rows:
        raise ValueError("no rows in " + ", ".join(map(str, paths)))
    return rows


def positive_ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be at least 1")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="*", help="NAME:KEY=VALUE,... (the first is the baseline)")
    parser.add_argument("--summarize", type=Path, nargs="+", metavar="FILE",
                        help="print the summary of rows written by earlier --json runs instead of running")
    parser.add_argument("--specs", default="small", help="comma-separated zoo names or spec files (default: small)")
    parser.add_argument("--n-seq", type=positive_ints, default=[64, 256, 1024], help="comma-separated (default: 64,256,1024)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over all variants (default: 2)")
    parser.add_argument("--steps", type=int, default=200, help="timed steps a run (default: 200)")
    parser.add_argument("--device", default="cuda", help="the native engine's device (default: cuda)")
    parser.add_argument("--frames", choices=("device", "host"), default="device", help="where the frames live (default: device)")
    parser.add_argument("--json", type=Path, help="write every run's row here")
    args = parser.parse_args(argv)
    if args.summarize:
        if args.variants:
            parser.error("--summarize takes files, not variants")
        try:
            rows = rows_of(args.summarize)
        except ValueError as e:
            parser.error(str(e))
        for line in summary(rows, list(dict.fromkeys(row["variant"] for row in rows))):
            print(line)
        return 0
    if not args.variants:
        parser.error("give at least one variant NAME:KEY=VALUE,... (or --summarize FILE ...)")
    try:
        variants = [parse_variant(v) for v in args.variants]
    except ValueError as e:
        parser.error(str(e))
    names = [name for name, _ in variants]
    if len(set(names)) != len(names):
        parser.error(f"variant names repeat: {', '.join(names)}")
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be at least 1")
    specs = [s for s in args.specs.split(",") if s]
    for s in specs:
        try:
            load_spec(s)
        except Exception as e:  # a bad spec is one line, before any engine is built
            parser.error(f"spec {s!r}: {e}")
    module = native_module()
    print(f"engine: {module.__file__ if module is not None else 'not built'}")  # which build runs (engine_ab_builds.sh)
    rows = run(variants, specs, args.n_seq, args.rounds, args.steps, args.device, args.frames)
    print("summary (best of rounds, against the first variant)")
    for line in summary(rows, names):
        print(line)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
