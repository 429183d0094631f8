"""Random search, TPE and PBT on the same budget: which finds the better model? (issue 14, item 4)

Runs three sweeps of one model on synthetic balls (at the model's own input size) over the same space (the
learning rates and momentum), with the same seed, the same trial length, the same number of trials (PBT:
members) and the same concurrency, so each spends the same trial-steps; then reads their journals and writes
a Markdown report, its JSON and a PNG: the best final metric each reached, and the best-so-far final metric
against the trial-steps spent (a trial counts when it ends; for PBT steps a member copied from its donor are
not counted again). With several seeds each search runs once per seed, and the report adds the mean.

    python benchmarks/search_compare.py [--preset tiny-cpu] [--trials 8] [--steps 4000] [--n-seq 8] \
        [--seeds 11,12,13] [--out benchmarks/results-search-cpu.md]
    python benchmarks/search_compare.py --preset small-gpu --trials 8 --steps 8000 --n-seq 4 --concurrency 4 \
        --out benchmarks/results-search-h200.md      # on a GPU host with the native CUDA engine built

A preset fixes the model, the space and the schedule delays (small learns at smaller rates than tiny, and its
deeper layers would wait 1,000 steps each by default); ``small-gpu`` packs the concurrent trials on one GPU
(``resources.trials_per_gpu``: on an H200 four packed trials made 16 steps/s each, results-search-h200.md).
The sweeps, their checkpoints and MLflow store go to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

PRESETS: dict[str, dict] = {
    "tiny-cpu": {"spec": "tiny", "title": "tiny, synthetic balls, CPU", "layer_delay": 10, "intervals": 8, "extra": {},
                 "space": {"initial_learning_rate": {"loguniform": [0.005, 0.2]},
                           "intermediate_learning_rate": {"loguniform": [0.0005, 0.02]},
                           "momentum": {"uniform": [0.3, 0.95]}}},
    "small-gpu": {"spec": "small", "title": "small, synthetic balls 60x60, one GPU", "layer_delay": 200,
                  "intervals": 4, "extra": {"backend": "native", "device": "cuda", "keep_checkpoints": 1},
                  "space": {"initial_learning_rate": {"loguniform": [0.0005, 0.05]},
                            "intermediate_learning_rate": {"loguniform": [0.0001, 0.01]},
                            "momentum": {"uniform": [0.1, 0.95]}}},
}


def sweeps(preset: str, trials: int, steps: int, n_seq: int, concurrency: int, seed: int) -> dict[str, dict]:
    """The three sweep files: one space, seed, trial length, trial count and concurrency."""
    p = PRESETS[preset]
    interval = steps // p["intervals"]
    common = {"spec": p["spec"], "vary": p["space"], "seed": seed, "steps": steps, "n_seq": n_seq,
              "checkpoint_every": interval, "metrics_every": interval // 2, "max_concurrent": concurrency,
              "data": "synthetic:balls", "metric": {"name": "ratio_two_step", "mode": "min"}, "animation_frames": 0,
              "heldout_steps": 0, "readout": False, **p["extra"],
              "overrides": {"delay_each_layer_learning": p["layer_delay"], "delay_intermediate_learning_rate": steps // 2,
                            "delay_final_learning_rate": 10 * steps}}
    if p["extra"].get("device") == "cuda":
        common["resources"] = {"trials_per_gpu": concurrency}
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
    with open(work / f"{name}.err", "w") as err:  # the sweep's own progress, readable while it runs
        res = subprocess.run([sys.executable, "-m", "pvm_dist.cli.main", "sweep", "run", str(path), "--root",
                              str(root), "--mlflow", f"sqlite:///{work / 'mlflow.db'}", "--json"], stdout=subprocess.PIPE,
                             stderr=err, text=True, cwd=work, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    seconds = time.perf_counter() - t0
    if res.returncode not in (0, 3):  # 3: some trials failed (a diverging learning rate); the rest still count
        raise SystemExit(f"{name}: sweep failed ({res.returncode}): {(work / f'{name}.err').read_text()[-2000:]}")
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


def machine() -> str:
    """This host, its CPU count and GPU (if ``nvidia-smi`` answers)."""
    gpu = ""
    if shutil.which("nvidia-smi"):
        res = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
        gpu = ", " + res.stdout.strip().replace("\n", " + ") if res.returncode == 0 and res.stdout.strip() else ""
    return f"{platform.node()} ({os.cpu_count()} CPU cores{gpu})"


def command(args: argparse.Namespace) -> str:
    return (f"python benchmarks/search_compare.py --preset {args.preset} --trials {args.trials} --steps {args.steps} "
            f"--n-seq {args.n_seq} --concurrency {args.concurrency} --seeds {','.join(map(str, args.seeds))}")


def summary(results: dict[tuple[str, int], tuple[dict, list[dict], float]], args: argparse.Namespace) -> dict:
    """What the report shows, as data: per search and seed its best trial, finished count, curve and wall seconds."""
    out = {"command": command(args), "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "preset": args.preset, "sweeps": sweeps(args.preset, args.trials, args.steps, args.n_seq, args.concurrency,
                                                    args.seeds[0]), "searches": {}}
    for (name, seed), (outcome, events, seconds) in results.items():
        points = curve(events)
        out["searches"][f"{name} seed {seed}"] = {
            "search": name, "seed": seed, "best": outcome["best"], "wall_s": seconds, "curve": points,
            "trial_steps": points[-1][0] if points else 0,
            "statuses": [t["status"] for t in outcome["trials"]],
            "finals": {t["trial_id"]: t.get("metric") for t in outcome["trials"]},
            "exploits": sum(1 for e in events if e["event"] == "exploit"),
            # where the engines ran (a GPU host's build without CUDA would show cpu here, not only in the speed)
            "devices": sorted({str(e.get("device")) for e in events if e["event"] == "trial_started"})}
    return out


def report(data: dict, args: argparse.Namespace) -> str:
    budget = args.trials * args.steps
    p = PRESETS[args.preset]
    lines = [
        f"# Random search, TPE and PBT on the same budget ({p['title']})", "",
        f"Command: `{data['command']}` on {data['machine']}, {data['date']}.", "",
        f"Each search: {args.trials} trials (PBT: members) × {args.steps:,} steps × n_seq {args.n_seq}, "
        f"{args.concurrency} at a time, once per seed ({', '.join(map(str, args.seeds))}; a seed fixes the first "
        "draws, the data and the engines' initial weights), over "
        + ", ".join(f"{k} ({next(iter(v))} {v[next(iter(v))]})" for k, v in p["space"].items())
        + f": {budget:,} trial-steps each. Metric: ratio_two_step at a trial's "
        "last step (the two-step prediction error over the copy-last-frame baseline; lower is better).", "",
        "| search | seed | best ratio_two_step | its values | trials finished | trial-steps trained | PBT copies "
        "| engines on | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in data["searches"].items():
        best = r["best"] or {}
        values = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in
                           (best.get("varied") or {}).items())
        finished = r["statuses"].count("FINISHED")
        lines.append(f"| {r['search']} | {r['seed']} | {best.get('metric', float('nan')):.4f} | {values} | {finished} | "
                     f"{r['trial_steps']:,} | {r['exploits']} | {', '.join(r['devices'])} | {r['wall_s']:.0f} |")
    lines += ["", "Over the seeds (the best final metric each search reached with each seed; lower is better):", "",
              "| search | mean best | best of seeds | worst of seeds | seeds it was best on |", "|---|---|---|---|---|"]
    for name, bests in means(data).items():
        wins = sum(1 for seed in args.seeds if winner(data, seed) == name)
        lines.append(f"| {name} | {sum(bests) / len(bests):.4f} | {min(bests):.4f} | {max(bests):.4f} | "
                     f"{wins} of {len(args.seeds)} |")
    lines += ["", "Best-so-far final metric against trial-steps trained (one point per finished trial):", ""]
    for name, r in data["searches"].items():
        lines.append(f"- **{name}**: " + " → ".join(f"{s:,}: {b:.4f}" for s, b in r["curve"]))
    return "\n".join(lines) + "\n"


def means(data: dict) -> dict[str, list[float]]:
    """Per search, its best final metric for each seed (seeds where it finished a trial)."""
    out: dict[str, list[float]] = {}
    for r in data["searches"].values():
        if r["best"] is not None:
            out.setdefault(r["search"], []).append(float(r["best"]["metric"]))
    return out


def winner(data: dict, seed: int) -> str | None:
    """The search with the best final metric for ``seed``."""
    runs = [r for r in data["searches"].values() if r["seed"] == seed and r["best"] is not None]
    return min(runs, key=lambda r: r["best"]["metric"])["search"] if runs else None


def plot(data: dict, path: Path) -> None:
    """The best-so-far curves of the three searches on one figure (one line per seed, one colour per search)."""
    from pvm_dist.tracking.figures import pyplot, save_figure

    fig, ax = pyplot().subplots(figsize=(7, 4.2))
    colours: dict[str, str] = {}
    for name, r in data["searches"].items():
        if r["curve"]:
            xs, ys = zip(*r["curve"])
            first = r["search"] not in colours
            line = ax.step(xs, ys, where="post", marker="o", markersize=3, alpha=0.8,
                           color=colours.get(r["search"]), label=r["search"] if first else None)[0]
            colours.setdefault(r["search"], line.get_color())
    ax.set_xlabel("trial-steps trained")
    ax.set_ylabel("best final ratio_two_step so far (lower is better)")
    ax.set_title(f"{PRESETS[data['preset']]['title']}: best so far against budget")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny-cpu")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--n-seq", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")], default=[11],
                    help="comma-separated; each search runs once per seed")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results-search-cpu.md"),
                    help="the Markdown report; its JSON and PNG are written beside it")
    ap.add_argument("--work", type=Path, default=None, help="where the sweeps' temporary folder goes")
    args = ap.parse_args()
    if args.steps % PRESETS[args.preset]["intervals"] or args.trials < 2:
        raise SystemExit(f"--steps must be a multiple of {PRESETS[args.preset]['intervals']} and --trials at least 2")
    results = {}
    with tempfile.TemporaryDirectory(prefix="pvm-search-", dir=args.work) as tmp:
        print(f"sweeps under {tmp}", flush=True)
        for seed in args.seeds:
            for name, sweep in sweeps(args.preset, args.trials, args.steps, args.n_seq, args.concurrency,
                                      seed).items():
                outcome = results[name, seed] = run(f"{name}-{seed}", sweep, Path(tmp))
                print(f"{name} seed {seed}: best {outcome[0]['best'] and outcome[0]['best']['metric']} "
                      f"in {outcome[2]:.0f} s", flush=True)
            data = summary(results, args)  # written after each search, so a run cut short keeps what it made
            args.out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    args.out.write_text(report(data, args))
    plot(data, args.out.with_suffix(".png"))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
