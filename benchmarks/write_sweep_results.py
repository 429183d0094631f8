"""Turn the outcomes of benchmarks/sweep_gpu.sh into a markdown table (one GPU worker vs one per GPU).

    python3 benchmarks/write_sweep_results.py OUT_DIR 1 2
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path


def journal(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def row(out: Path, workers: str) -> dict:
    outcome = json.loads((out / f"sweep-{workers}.json").read_text())
    events = journal(out / f"journal-{workers}.jsonl")
    started = [e for e in events if e["event"] == "trial_started"]
    warm = [e for e in started if e.get("warm")]
    chunk_fps = [e["frames_per_s"] for e in events if e["event"] == "progress" and e.get("frames_per_s")]
    return {
        "workers": int(workers), "trials": len(outcome["trials"]), "status": outcome["status"],
        "wall_s": outcome["seconds"], "frames": outcome["frames"], "frames_per_s": outcome["frames_per_s"],
        "trial_fps_median": statistics.median(chunk_fps) if chunk_fps else None,
        "warm_start_ms": 1e3 * statistics.mean(e["start_cost_s"] for e in warm) if warm else None,
        "warm_round_trip_ms": 1e3 * statistics.mean(e["round_trip_s"] for e in warm) if warm else None,
        "cold_start_ms": 1e3 * statistics.mean(e["start_cost_s"] for e in started if not e.get("warm")) if started else None,
        "gpus": sorted({e.get("gpu") for e in started}), "best": outcome.get("best"),
    }


def main() -> None:
    out, counts = Path(sys.argv[1]), sys.argv[2:]
    rows = [row(out, c) for c in counts]
    gpus = (out / "gpus.txt").read_text().strip().splitlines() if (out / "gpus.txt").exists() else ["?"]
    base = rows[0]["frames_per_s"]
    lines = [f"# Sweep on {len(gpus)} × {gpus[0].split(',')[0]}", "",
             f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; commit: {os.environ.get('PVM_COMMIT', 'unknown')}",
             f"- GPUs: {'; '.join(gpus)}",
             "- sweep: experiments/gpu_small_4trials.yaml (small.json, native engine, n_seq 1, MLflow on SQLite)", "",
             "| GPU workers | trials | wall s | frames trained | aggregate frames/s | × one worker | per-trial frames/s (median chunk) "
             "| warm trial start (worker) | warm start round trip (driver) | cold start |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fmt = lambda v, f: "–" if v is None else format(v, f)  # noqa: E731
        lines.append(f"| {r['workers']} | {r['trials']} | {r['wall_s']:.1f} | {r['frames']:,} | {r['frames_per_s']:,.0f} | "
                     f"{r['frames_per_s'] / base:.2f} | {fmt(r['trial_fps_median'], ',.0f')} | {fmt(r['warm_start_ms'], '.0f')} ms | "
                     f"{fmt(r['warm_round_trip_ms'], '.0f')} ms | {fmt(r['cold_start_ms'], '.0f')} ms |")
    lines += ["", "Aggregate frames/s counts the frames of every trial from the first trial's start to the sweep's end "
              "(checkpoints, pictures and MLflow logging included). Warm start: building the engine (and loading a "
              "checkpoint, if any) on a worker that already ran a trial; round trip adds the Ray call as the driver sees it.",
              "", "```json", json.dumps(rows, indent=1), "```"]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
