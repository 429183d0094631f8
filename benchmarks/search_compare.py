"""Random search, TPE and PBT on the same budget: which finds the better tiny model? (issue 14, item 4)

Runs three sweeps of the tiny model on synthetic balls over the same space (the learning rates and momentum),
with the same seed, the same trial length, the same number of trials (PBT: members) and the same concurrency,
so each spends the same trial-steps; then reads their journals and writes a Markdown report: the best final
metric each reached, and the best-so-far final metric against the trial-steps spent (a trial counts when it
ends; for PBT steps a member copied from its donor are not counted again).

    python benchmarks/search_compare.py [--trials 8] [--steps 4000] [--n-seq 8] [--out benchmarks/results-search-cpu.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

SPACE = {"initial_learning_rate": {"loguniform": [0.005, 0.2]},
         "intermediate_learning_rate": {"loguniform": [0.0005, 0.02]},
         "momentum": {"uniform": [0.3, 0.95]}}


def sweeps(trials: int, steps: int, n_seq: int, concurrency: int, seed: int) -> dict[str, dict]:
    """The three sweep files: one space, seed, trial length, trial count and concurrency."""
    interval = steps // 8
    common = {"spec": "tiny", "vary": SPACE, "seed": seed, "steps": steps, "n_seq": n_seq, "checkpoint_every": interval,
              "metrics_every": interval // 2, "max_concurrent": concurrency, "data": "synthetic:balls",
              "metric": {"name": "ratio_two_step", "mode": "min"}, "animation_frames": 0, "heldout_steps": 0,
              "overrides": {"delay_each_layer_learning": 10, "delay_intermediate_learning_rate": steps // 2,
                            "delay_final_learning_rate": 10 * steps}}
    return {
        "random": {**common, "name": "cmp-random", "search": {"type": "random", "trials": trials}},
        "tpe": {**common, "name": "cmp-tpe", "search": {"type": "tpe", "trials": trials,
                                                        "startup_trials": max(2, trials // 3)}},
        "pbt": {**common, "name": "cmp-pbt", "search": {
            "type": "pbt", "population": trials, "interval_steps": interval, "quantile": 0.25,
            "explore": {"initial_learning_rate": {"perturb": [0.8, 1.25]},
                        "intermediate_learning_rate": {"perturb": [0.8, 1.25]}, "momentum": "resample"}}},
    }


def run(name: str, sweep: dict, work: Path) -> tuple[dict, list[dict], float]:
    """Run one sweep with pvm-dist; its outcome, journal and wall seconds."""
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    root = work / "sweeps"
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "pvm_dist.cli.main", "sweep", "run", str(path), "--root", str(root),
                          "--mlflow", f"sqlite:///{work / 'mlflow.db'}", "--json"], capture_output=True, text=True,
                         cwd=work, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    seconds = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{name}: sweep failed ({res.returncode}): {res.stderr[-2000:]}")
    outcome = json.loads(res.stdout)
    journal = Path(outcome["folder"]) / "journal.jsonl"
    if not journal.is_absolute():
        journal = work / journal
    return outcome, [json.loads(line) for line in journal.read_text().splitlines() if line.strip()], seconds


def curve(events: list[dict]) -> list[tuple[int, float]]:
    """(trial-steps spent, best final metric so far) at each trial's end."""
    at: dict[str, int] = {}
    spent, best, out = 0, float("inf"), []
    for e in events:
        kind, trial = e["event"], e.get("trial")
        if kind in ("trial_started", "exploit"):
            at[trial] = int(e["step"])
        elif kind == "progress":
            spent += int(e["step"]) - at.get(trial, 0)
            at[trial] = int(e["step"])
        elif kind == "trial_ended" and e["status"] == "FINISHED" and e.get("metric") is not None:
            best = min(best, float(e["metric"]))
            out.append((spent, best))
    return out


def report(results: dict[str, tuple[dict, list[dict], float]], args: argparse.Namespace) -> str:
    budget = args.trials * args.steps
    lines = [
        "# Random search, TPE and PBT on the same budget (tiny, synthetic balls, CPU)", "",
        f"Command: `python benchmarks/search_compare.py --trials {args.trials} --steps {args.steps} --n-seq {args.n_seq} "
        f"--concurrency {args.concurrency} --seed {args.seed}` on {platform.node()} "
        f"({os.cpu_count()} CPU cores, shared with other work), {time.strftime('%Y-%m-%d')}.", "",
        f"Each search: {args.trials} trials (PBT: members) × {args.steps:,} steps × n_seq {args.n_seq}, "
        f"{args.concurrency} at a time, seed {args.seed}, over initial_learning_rate, intermediate_learning_rate "
        f"(loguniform) and momentum (uniform): {budget:,} trial-steps each. Metric: ratio_two_step at a trial's "
        "last step (the two-step prediction error over the copy-last-frame baseline; lower is better).", "",
        "| search | best ratio_two_step | its values | trials finished | trial-steps trained | wall s |",
        "|---|---|---|---|---|---|",
    ]
    for name, (outcome, events, seconds) in results.items():
        best = outcome["best"] or {}
        values = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in
                           (best.get("varied") or {}).items())
        spent = curve(events)[-1][0] if curve(events) else 0
        finished = sum(1 for t in outcome["trials"] if t["status"] == "FINISHED")
        lines.append(f"| {name} | {best.get('metric', float('nan')):.4f} | {values} | {finished} | {spent:,} | "
                     f"{seconds:.0f} |")
    lines += ["", "Best-so-far final metric against trial-steps trained (one point per finished trial):", ""]
    for name, (_, events, _) in results.items():
        points = " → ".join(f"{s:,}: {b:.4f}" for s, b in curve(events))
        lines.append(f"- **{name}**: {points}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--n-seq", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results-search-cpu.md"))
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="pvm-search-") as tmp:
        for name, sweep in sweeps(args.trials, args.steps, args.n_seq, args.concurrency, args.seed).items():
            results[name] = run(name, sweep, Path(tmp))
            print(f"{name}: best {results[name][0]['best'] and results[name][0]['best']['metric']}", flush=True)
        text = report(results, args)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
