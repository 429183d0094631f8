#!/usr/bin/env python3
"""Several trials per GPU: aggregate frames/s of k trials sharing one GPU (``trials_per_gpu: k``).

For each spec and k it runs a sweep of k trials (seeds 1..k, the same steps each) on one local Ray with one
GPU, so all k run at once on that GPU, and records the sweep's aggregate frames/s (frames over the time from
the first trial's start to the end) and the median trial's own frames/s. Writes ``packing.md`` and
``packing.json`` to OUT_DIR. The readout is off: it trains on the host at every step, and with it a trial's
rate is the host's (tiny ~550 frames/s on an H200), not the GPU's.

Build the native engine with CUDA first (``PVM_DIST_CUDA=ON pip install --no-build-isolation .``: without it a
GPU host quietly builds the CPU engine, and the rates are the CPU's).

    python3 benchmarks/packing.py OUT_DIR [--specs tiny,small] [--ks 1,2,4,8] [--steps tiny=40000,small=20000]
        [--large STEPS] [--large-every STEPS]       (--specs '' --large STEPS: the LARGE run alone)

``--large STEPS`` then runs two LARGE trials one after the other (one GPU each), checkpointing every
``--large-every`` steps (default STEPS/2), and records the aggregate against the trials' own frames/s, the driver loop's longest
block and each checkpoint's write time (``large.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--specs", default="tiny,small")
    ap.add_argument("--ks", default="1,2,4,8")
    ap.add_argument("--steps", default="tiny=40000,small=20000")
    ap.add_argument("--large", type=int, default=0)
    ap.add_argument("--large-every", type=int, default=0)
    args = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from pvm_dist.sweep.driver import DriverOptions, run_sweep
    from pvm_dist.sweep.plan import load_sweep

    steps = {k: int(v) for k, v in (item.split("=") for item in args.steps.split(","))}
    work = Path(tempfile.mkdtemp(prefix="pvm-packing-"))
    rows = []
    for spec in filter(None, args.specs.split(",")):  # --specs '': the LARGE run alone
        for k in (int(x) for x in args.ks.split(",")):
            sweep = load_sweep({"name": f"pack-{spec}-{k}", "spec": spec, "steps": steps[spec],
                                "checkpoint_every": steps[spec], "metrics_every": steps[spec] // 10,
                                "data": "synthetic:balls", "backend": "native", "vary": {"seed": list(range(1, k + 1))},
                                "heldout_steps": 0, "animation_frames": 0, "readout": False,
                                "resources": {"trials_per_gpu": k}})
            t0 = time.perf_counter()
            out = run_sweep(sweep, DriverOptions(mlflow_uri=f"sqlite:///{work / 'mlflow.db'}", root=work / "sweeps"))
            per_trial = [t["frames_per_s"] for t in out.trials if t["frames_per_s"]]
            row = {"spec": spec, "k": k, "status": out.status, "aggregate_frames_per_s": out.frames_per_s,
                   "median_trial_frames_per_s": statistics.median(per_trial) if per_trial else None,
                   "gpus": sorted({t["gpu"] for t in out.trials}), "wall_s": time.perf_counter() - t0,
                   "longest_block_s": out.longest_block_s, "system_metrics": _system_metrics(out.folder),
                   "devices": _devices(out.folder)}
            print(json.dumps(row), flush=True)
            rows.append(row)
            if "cpu" in row["devices"]:  # a build without CUDA: its rates are the CPU's, not worth recording
                print(f"trials ran on {row['devices']}: build with PVM_DIST_CUDA=ON", file=sys.stderr)
                return 1
            args.out_dir.mkdir(parents=True, exist_ok=True)  # after each sweep: a run cut short keeps its rows
            (args.out_dir / "packing.json").write_text(json.dumps(rows, indent=2) + "\n")
    base = {r["spec"]: r["aggregate_frames_per_s"] for r in rows if r["k"] == 1}
    lines = ["| spec | trials per GPU | aggregate frames/s | × k=1 | median trial frames/s |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        gain = r["aggregate_frames_per_s"] / base[r["spec"]] if base.get(r["spec"]) else float("nan")
        lines.append(f"| {r['spec']} | {r['k']} | {r['aggregate_frames_per_s']:,.0f} | {gain:.2f} | "
                     f"{(r['median_trial_frames_per_s'] or 0):,.0f} |")
    ok = all(r["status"] == "FINISHED" for r in rows)
    if rows:
        (args.out_dir / "packing.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    if args.large:
        ok = _large(args.large, args.large_every or args.large // 2, work, args.out_dir) and ok
    return 0 if ok else 1


def _large(steps: int, every: int, work: Path, out_dir: Path) -> bool:
    from pvm_dist.sweep.driver import DriverOptions, run_sweep
    from pvm_dist.sweep.plan import load_sweep

    sweep = load_sweep({"name": "large-ckpt", "spec": "LARGE", "steps": steps, "checkpoint_every": every,
                        "metrics_every": min(steps // 10, every), "data": "synthetic:balls", "backend": "native",
                        "vary": {"seed": [1, 2]}, "heldout_steps": 0, "animation_frames": 0, "readout": False,
                        "max_concurrent": 1,
                        "resources": {"gpus_per_actor": 1}})
    out = run_sweep(sweep, DriverOptions(mlflow_uri=f"sqlite:///{work / 'mlflow.db'}", root=work / "sweeps"))
    events = [json.loads(line) for line in (out.folder / "journal.jsonl").read_text().splitlines()]
    per_trial = [t["frames_per_s"] for t in out.trials if t["frames_per_s"]]
    row = {"status": out.status, "aggregate_frames_per_s": out.frames_per_s,
           "median_trial_frames_per_s": statistics.median(per_trial) if per_trial else None,
           "longest_block_s": out.longest_block_s, "longest_block_parts": out.longest_block_parts,
           "longest_run_open_s": out.longest_run_open_s,
           "checkpoints_dropped": out.checkpoints_dropped,
           "checkpoint_write_s": [e["seconds"] for e in events if e["event"] == "checkpoint"],
           "checkpoint_steps": [[e["trial"], e["step"]] for e in events if e["event"] == "checkpoint"],
           "start_cost_s": [round(e["start_cost_s"], 3) for e in events if e["event"] == "trial_started"],
           "trial_wall_s": _trial_wall(events),
           "checkpoint_bytes": sorted(p.stat().st_size for p in out.folder.rglob("step_*.pvmckpt"))[-1:],
           "seconds": out.seconds, "steps": steps, "checkpoint_every": every, "devices": _devices(out.folder)}
    print(json.dumps(row), flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "large.json").write_text(json.dumps(row, indent=2) + "\n")
    return out.status == "FINISHED"


def _trial_wall(events: list[dict]) -> dict[str, float]:
    """Each trial's time from its start event to its end event (the driver's view)."""
    started = {e["trial"]: e["time"] for e in events if e["event"] == "trial_started"}
    return {e["trial"]: round(e["time"] - started[e["trial"]], 2) for e in events
            if e["event"] == "trial_ended" and e["trial"] in started}


def _devices(folder: Path) -> list[str]:
    """Where the trials' engines ran (``cuda:0``, ``cpu``): a build without CUDA shows here, not in the rates."""
    events = [json.loads(line) for line in (folder / "journal.jsonl").read_text().splitlines()]
    return sorted({str(e.get("device")) for e in events if e.get("event") == "trial_started"})


def _system_metrics(folder: Path) -> dict:
    """The last GPU figures (``system/...``) a trial reported, from the sweep's journal."""
    last: dict = {}
    for line in (folder / "journal.jsonl").read_text().splitlines():
        ev = json.loads(line)
        if ev.get("event") == "progress":
            last = {k: round(v, 1) for k, v in (ev.get("metrics") or {}).items() if k.startswith("system/")} or last
    return last


if __name__ == "__main__":
    sys.exit(main())
