"""How much of the engine's speed reaches the user: `pvm-dist train` (and a sweep trial) against `pvm-dist bench`.

Runs, for each n_seq, the bench (random frames handed over from the host, and held on the device) and a
`train` of the same spec on synthetic balls with the readout off, in the same schedule state as the bench
(every layer learning: ``-O delay_each_layer_learning=1``), then writes a markdown table and the raw JSON.
With ``--sweep`` it also runs a one-trial sweep of the same configuration on a local Ray (needs Ray and MLflow).

    python3 benchmarks/train_vs_bench.py --spec small --n-seq 1,64,256 --out benchmarks/out
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEADY = ["-O", "delay_each_layer_learning=1"]  # what bench measures: every layer learns from step 1 on


def cli(*args: str, cwd: Path | None = None) -> str:
    """Run ``pvm-dist ARGS`` and return its stdout (the JSON summary)."""
    done = subprocess.run([sys.executable, "-m", "pvm_dist.cli.main", *args], capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        raise SystemExit(f"pvm-dist {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def bench(spec: str, n_seq: int, frames: str) -> dict:
    (row,) = json.loads(cli("bench", "--spec", spec, "--n-seq", str(n_seq), "--frames", frames, "--json"))
    return row


def train(spec: str, n_seq: int, steps: int, folder: Path) -> dict:
    out = json.loads(cli("train", "--spec", spec, "--n-seq", str(n_seq), "--steps", str(steps), "--no-readout",
                         "--no-track", "--json", "--run-dir", str(folder), *STEADY))
    rates = [json.loads(line)["frames_per_s"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
    out["interval_median_frames_per_s"] = statistics.median(rates[1:] or rates)  # the first holds the warm-up
    out["first_interval_frames_per_s"] = rates[0]
    return out


def sweep_trial(spec: str, n_seq: int, steps: int, folder: Path) -> dict:
    """One trial of the same configuration through `pvm-dist sweep run` on a local Ray."""
    import yaml

    every = max(steps // 10 // 50 * 50, 50)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "one.yaml"
    path.write_text(yaml.safe_dump({"name": "one", "spec": spec, "steps": steps, "n_seq": n_seq, "backend": "native",
                                    "checkpoint_every": steps, "metrics_every": every, "readout": False,
                                    "data": "synthetic:balls", "overrides": {"delay_each_layer_learning": 1}}))
    out = json.loads(cli("sweep", "run", str(path), "--json", "--root", str(folder / "sweeps"),
                         "--mlflow", f"sqlite:///{folder / 'mlflow.db'}"))
    journal = next((folder / "sweeps").glob("*/journal.jsonl"))
    rates = [e["frames_per_s"] for e in map(json.loads, journal.read_text().splitlines()) if e["event"] == "progress"]
    return {"interval_median_frames_per_s": statistics.median(rates[1:] or rates), "status": out["status"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="small")
    parser.add_argument("--n-seq", default="1,64,256")
    parser.add_argument("--sweep", action="store_true", help="also time a one-trial sweep (needs Ray and MLflow)")
    parser.add_argument("--seconds", type=float, default=15.0, help="about this long each train run (from bench's rate)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n_seq in map(int, args.n_seq.split(",")):
            host, device = bench(args.spec, n_seq, "host"), bench(args.spec, n_seq, "device")
            steps = max(500, int(device["steps_per_s"] * args.seconds) // 50 * 50)
            t0 = time.perf_counter()
            run = train(args.spec, n_seq, steps, Path(tmp) / f"train-{n_seq}")
            row = {"n_seq": n_seq, "steps": steps, "bench_host": host, "bench_device": device, "train": run,
                   "train_wall_s": time.perf_counter() - t0, "device": device["device"]}
            if args.sweep:
                row["sweep"] = sweep_trial(args.spec, n_seq, steps, Path(tmp) / f"sweep-{n_seq}")
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "bench_host"})[:400], flush=True)
    (args.out / "train_vs_bench.json").write_text(json.dumps(rows, indent=1))
    lines = [f"| {args.spec} n_seq | bench host frames/s | bench device frames/s | train frames/s (whole run) | "
             f"train / bench device | train interval median | sweep trial interval median | sweep / train |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tr, dev = r["train"], r["bench_device"]["frames_per_s"]
        sw = r.get("sweep", {}).get("interval_median_frames_per_s")
        lines.append(f"| {r['n_seq']} | {r['bench_host']['frames_per_s']:,.0f} | {dev:,.0f} | {tr['frames_per_s']:,.0f} | "
                     f"{tr['frames_per_s'] / dev:.1%} | {tr['interval_median_frames_per_s']:,.0f} | "
                     + (f"{sw:,.0f} | {sw / tr['interval_median_frames_per_s']:.1%} |" if sw else "– | – |"))
    (args.out / "train_vs_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
