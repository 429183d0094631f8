"""Turn gpu_run.sh's JSON into the committed results table (markdown on stdout)."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path


def main(out_dir: str) -> None:
    out = Path(out_dir)
    rows = [r for f in ("bench_nseq1.json", "bench_nseq1_device.json", "bench_batch.json") if (out / f).exists() for r in json.loads((out / f).read_text())]
    gpu = (out / "gpu.txt").read_text().strip() if (out / "gpu.txt").exists() else "unknown GPU"
    commit = os.environ.get("PVM_COMMIT", "")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        except OSError:
            commit = ""
    lines = (out / "gpu_tests.txt").read_text().strip().splitlines() if (out / "gpu_tests.txt").exists() else []
    tests = [x for x in lines if " passed" in x or " failed" in x]
    racecheck = [x.strip("= ") for x in lines if "RACECHECK SUMMARY" in x]
    print(f"# pvm-dist native engine on {gpu.split(',')[0]}\n")
    print(f"- GPU, driver, memory, max SM clock: {gpu}")
    print(f"- commit: {commit or 'unknown'}; date: {datetime.date.today()}")
    if rows:
        print(f"- measured copy bandwidth: {rows[0]['bandwidth_gb_per_s']:,.0f} GB/s (read + write)")
    if tests:
        print(f"- GPU tests: {tests[-1]}")
    if racecheck:
        print(f"- compute-sanitizer on the fused passes: {racecheck[-1]}")
    print("\n| spec | frames | n_seq | steps/s | frames/s | GB/s | GFLOP/s | roofline frames/s | ratio | bound | phases (µs) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        phases = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in r.get("phases_ms", {}).items())
        print(f"| {r['spec']} | {r.get('frames', 'host')} | {r['n_seq']} | {r['steps_per_s']:,.1f} | {r['frames_per_s']:,.0f} | {r['achieved_gb_per_s']:,.0f} | "
              f"{r['achieved_gflop_per_s']:,.0f} | {r['floor_steps_per_s'] * r['n_seq']:,.0f} | {r['ratio_to_floor']:.1%} | {r['bound']} | {phases} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/out")
