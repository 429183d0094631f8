"""The ``pvm-dist`` command line (typer).

Every user error (bad spec, bad checkpoint, bad argument) prints one line to stderr and exits
non-zero; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import click
import typer

from pvm_dist._version import __version__

app = typer.Typer(
    name="pvm-dist",
    help="Train Predictive Vision Models (PVM) fast: one GPU, a CPU, or a Ray cluster.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_debug = False


def _mount_sweep_commands() -> None:
    from pvm_dist.cli.sweep import sweep_app

    app.add_typer(sweep_app, name="sweep")


_mount_sweep_commands()

#: What ``pvm-dist info`` assumes when no bandwidth is given: an H200's measured device copy.
DEFAULT_BANDWIDTH_TBS = 4.3


class UserError(Exception):
    """A problem with what the user asked for; shown as one line, no traceback."""


def _user_errors() -> tuple[type[BaseException], ...]:
    from pvm_dist.data import DataError
    from pvm_dist.io.checkpoint import CheckpointError
    from pvm_dist.model.spec import SpecError
    from pvm_dist.run.session import RunDiverged
    from pvm_dist.sweep.driver import SweepRunError
    from pvm_dist.sweep.plan import SweepError

    return (UserError, SpecError, CheckpointError, DataError, SweepError, SweepRunError, RunDiverged,
            FileNotFoundError, PermissionError, IsADirectoryError)


def _print_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=_json_default))


def _json_default(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks for errors.")] = False,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    global _debug
    _debug = debug
    if version:
        typer.echo(f"pvm-dist {__version__}")
        raise typer.Exit(0)


@app.command()
def info(
    spec: Annotated[str, typer.Argument(help="Spec file, or a model-zoo name (small, med, LARGE, tiny, ...).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    bandwidth: Annotated[
        float, typer.Option("--bandwidth", help="Memory bandwidth in TB/s for the floor step rate.", min=0.001)
    ] = DEFAULT_BANDWIDTH_TBS,
) -> None:
    """Sizes and costs of a model: units, weights, image, per-layer sizes, FLOPs and bytes per step, memory floor."""
    from pvm_dist.model.spec import load_spec
    from pvm_dist.model.topology import build_topology

    s = load_spec(spec)
    summary = build_topology(s).summary(bandwidth * 1e12)
    summary["ignored_keys"] = sorted(s.ignored)
    summary["unknown_keys"] = list(s.unknown_keys)
    summary["spec"] = s.to_dict()
    if as_json:
        _print_json(summary)
        return
    _print_info(summary, s.source)


def _print_info(sm: dict, source: str) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    D = sm["image"]
    con.print(f"[bold]{sm['name']}[/bold]  ({source})")
    con.print(f"  units              {sm['units']:,}")
    con.print(f"  weights            {sm['weights']:,}  (W0 {sm['weights_w0']:,} + W1 {sm['weights_w1']:,}; {sm['weights_mb_fp32']} MB fp32)")
    con.print(f"  image              {D[0]}×{D[1]}×{D[2]}")
    con.print(f"  projections        {sm['primary_projections']:,} primary, {sm['context_projections']:,} context ({sm['context_duplicates']:,} duplicates)")
    con.print(f"  input memory       Σ(N+1) = {sm['input_memory']:,}; outputs ΣM = {sm['output_memory']:,}")
    con.print(f"  readout weights    {sm['readout_weights']:,}")
    con.print(f"  FLOPs per step     {sm['flops_per_step'] / 1e6:,.1f} M (6·W0 + 8·W1); with n sequences: "
              f"n × {sm['flops_per_frame'] / 1e6:,.1f} M (4·W0 + 6·W1) + {sm['flops_per_update'] / 1e6:,.1f} M (3·W)")
    con.print(
        f"  bytes per step     {sm['weight_bytes_per_step'] / 1e6:,.1f} MB weights (16·W0 + 20·W1) + "
        f"{sm['activation_bytes_per_step'] / 1e6:,.1f} MB activations"
    )
    con.print(
        f"  memory floor       {sm['floor_steps_per_s']:,.0f} steps/s ({sm['floor_step_us']:.1f} µs/step) "
        f"at {sm['bandwidth_bytes_per_s'] / 1e12:g} TB/s, one sequence"
    )
    table = Table(title="layers", show_edge=False)
    for col in ("layer", "grid", "units", "P", "M", "context (mean)", "N (mean)", "weights"):
        table.add_column(col, justify="right")
    for ly in sm["layers"]:
        table.add_row(
            str(ly["index"]),
            f"{ly['side']}×{ly['side']}",
            str(ly["units"]),
            str(ly["signal"]),
            str(ly["outputs"]),
            f"{ly['context_min']}–{ly['context_max']} ({ly['context_mean']:.1f})",
            f"{ly['input_min']}–{ly['input_max']} ({ly['input_mean']:.1f})",
            f"{ly['weights']:,}",
        )
    con.print(table)
    if sm["ignored_keys"]:
        con.print(f"  ignored keys       {', '.join(sm['ignored_keys'])}")
    if sm["unknown_keys"]:
        con.print(f"  [yellow]unknown keys (typos?)  {', '.join(sm['unknown_keys'])}[/yellow]")


@app.command()
def validate(
    files: Annotated[list[str], typer.Argument(help="Spec files (or model-zoo names) to check.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object per file.")] = False,
) -> None:
    """Check spec files (JSON) or sweep files (YAML: prints the trial plan). Exits 2 on the first invalid one."""
    from pvm_dist.model.spec import load_spec
    from pvm_dist.model.topology import build_topology

    results = []
    for f in files:
        if f.endswith((".yaml", ".yml")):
            from pvm_dist.cli.sweep import print_plan
            from pvm_dist.sweep.plan import load_sweep

            print_plan(load_sweep(f), as_json)
            continue
        s = load_spec(f)
        topo = build_topology(s)
        results.append(
            {
                "file": s.source,
                "name": s.name,
                "valid": True,
                "units": topo.n_units,
                "weights": topo.n_weights,
                "ignored_keys": sorted(s.ignored),
                "unknown_keys": list(s.unknown_keys),
            }
        )
    if as_json and results:
        _print_json(results if len(results) > 1 else results[0])
        return
    for r in results:
        line = f"ok  {r['file']}: {r['name']}, {r['units']:,} units, {r['weights']:,} weights"
        if r["ignored_keys"]:
            line += f"; ignored: {', '.join(r['ignored_keys'])}"
        typer.echo(line)
        if r["unknown_keys"]:
            typer.echo(f"    warning: unknown keys (typos?): {', '.join(r['unknown_keys'])}", err=True)


@app.command()
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    ray_worker: Annotated[bool, typer.Option("--ray/--no-ray", help="Also start a local Ray worker and report which engine it gets (a few seconds).")] = True,
) -> None:
    """What this installation has: Python, numpy, the native module and its CUDA status, GPUs, Ray, MLflow,
    and the engine a sweep's Ray worker on this machine gets."""
    from pvm_dist.cli.doctor import collect, ray_worker_engine

    report = collect()
    if ray_worker:
        report["ray_worker"] = ray_worker_engine()
    if as_json:
        _print_json(report)
        return
    for key, value in report.items():
        if isinstance(value, dict):
            typer.echo(f"{key}:")
            for k, v in value.items():
                typer.echo(f"  {k:<22} {v}")
        else:
            typer.echo(f"{key:<24} {value}")


def _check_backend(backend: str) -> None:
    from pvm_dist.engine import BACKENDS

    if backend not in BACKENDS:
        raise UserError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")


def _parse_overrides(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UserError(f"-O expects key=value, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


@app.command()
def train(
    spec: Annotated[str, typer.Option("--spec", "-s", help="Spec file or model-zoo name.")] = "tiny",
    data: Annotated[str | None, typer.Option("--data", "-d", help="Frames: synthetic:balls|bar|noise, a video, a folder of images, a PVM .zip (or a comma list), or a set name with --data-path. [default: synthetic:balls]")] = None,
    data_path: Annotated[str | None, typer.Option("--data-path", help="Folder holding the original PVM data zips (for set names).")] = None,
    steps: Annotated[int | None, typer.Option("--steps", "-n", help="Train until this step (also when resuming). [default: 1000]", min=1)] = None,
    n_seq: Annotated[int | None, typer.Option("--n-seq", help="Independent sequences trained together (shared weights). [default: 1]", min=1)] = None,
    backend: Annotated[str | None, typer.Option("--backend", help="auto (native where built), reference or native. [default: auto]")] = None,
    device: Annotated[str | None, typer.Option("--device", help="Native engine device: cpu, cuda or cuda:N (default: a GPU if visible).")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed of the initial weights and synthetic data. [default: 0]")] = None,
    overrides: Annotated[list[str], typer.Option("-O", help="Spec override key=value (repeatable), e.g. -O derivative=exact.")] = [],  # noqa: B006
    checkpoint_every: Annotated[int | None, typer.Option("--checkpoint-every", help="Save a checkpoint every N steps (0: at the end only). [default: 0]", min=0)] = None,
    keep: Annotated[int | None, typer.Option("--keep", help="How many of the newest checkpoints to keep. [default: 2]", min=1)] = None,
    keep_every: Annotated[int | None, typer.Option("--keep-every", help="Also keep every checkpoint whose step is a multiple of N (0: none). [default: 0]", min=0)] = None,
    metrics_every: Annotated[int | None, typer.Option("--metrics-every", help="Read and log metrics every N steps. [default: 50]", min=1)] = None,
    picture_every: Annotated[int | None, typer.Option("--picture-every", help="Save a picture every N steps (0: at the end only). [default: 500]", min=0)] = None,
    readout: Annotated[bool | None, typer.Option("--readout/--no-readout", help="Train the heatmap readout on labelled data. [default: on]")] = None,
    readout_from: Annotated[int | None, typer.Option("--readout-from", help="Train the readout from this step on (the original waits 1,000,000). [default: 0]", min=0)] = None,
    readout_lr: Annotated[float | None, typer.Option("--readout-lr", help="Readout learning rate (default: the original's schedule, 0.01 then 10× the PVM rate).", min=0)] = None,
    heldout: Annotated[str | None, typer.Option("--heldout", help="Data to score the final readout on (IoU, hit rate; default: synthetic data of seed+1, none for files).")] = None,
    heldout_steps: Annotated[int | None, typer.Option("--heldout-steps", help="Frames per sequence of that score (0: skip it). [default: 300]", min=0)] = None,
    mlflow_uri: Annotated[str | None, typer.Option("--mlflow", help="MLflow tracking URI (default: ./mlflow.db, no server needed).")] = None,
    experiment: Annotated[str | None, typer.Option("--experiment", help="MLflow experiment name. [default: pvm-dist]")] = None,
    run_name: Annotated[str | None, typer.Option("--run-name", help="MLflow run name (default: the run folder's name).")] = None,
    no_track: Annotated[bool, typer.Option("--no-track", help="Do not log to MLflow.")] = False,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Run folder (default: runs/<spec>-<time>; on resume, the checkpoint's).")] = None,
    resume: Annotated[Path | None, typer.Option("--resume", help="Continue bit-identically (and in the same MLflow run) from this checkpoint, with its data, cadence and tracking unless given here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final summary as JSON.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Train one model locally (native engine where built, else the numpy reference), tracked in MLflow.

    Logs every effective spec value, errors against the copy-last-frame baseline, fps, pictures,
    an animation and checkpoints. Ctrl-C saves a checkpoint and prints the command that resumes it.
    """
    import time as _time

    from pvm_dist.data import DataError
    from pvm_dist.model.spec import load_spec
    from pvm_dist.run import state as run_state
    from pvm_dist.run.config import RunConfig
    from pvm_dist.run.train import train as run_training

    if backend is not None:
        _check_backend(backend)
    given = {"steps": steps, "n_seq": n_seq, "seed": seed, "data": data, "data_path": data_path, "backend": backend,
             "device": device, "metrics_every": metrics_every, "picture_every": picture_every,
             "checkpoint_every": checkpoint_every, "keep_checkpoints": keep, "keep_every": keep_every,
             "readout": readout, "readout_from": readout_from, "readout_lr": readout_lr, "heldout": heldout,
             "heldout_steps": heldout_steps, "mlflow_uri": mlflow_uri, "experiment": experiment, "run_name": run_name,
             "track": False if no_track else None}
    state = None
    if resume is not None:
        state, ck = run_state.load(resume)
        if overrides:
            raise UserError("-O cannot change the spec of a resumed run")
        cfg = state.run.replace(**given)
        if ck.step >= cfg.steps:
            raise UserError(f"{resume} is already at step {ck.step:,}; ask for more with --steps")
        folder = run_dir or Path(resume).resolve().parent.parent
    else:
        parsed = _parse_overrides(overrides)
        s = load_spec(spec)
        if parsed:
            s = s.with_overrides(parsed)
        cfg = RunConfig(spec=s, overrides=parsed).replace(**given)
        folder = run_dir or Path("runs") / f"{s.name}-{_time.strftime('%Y%m%d-%H%M%S')}"
    kept = cfg.keep_checkpoints + (cfg.steps // cfg.keep_every if cfg.keep_every else 0)
    note = run_state.disk_note(cfg, kept, 1, str(folder))
    if note:
        typer.echo(f"pvm-dist: {note}", err=True)
    try:
        result = _train_with_progress(cfg, folder, state, show=not (quiet or as_json), run=run_training)
    except DataError as exc:
        raise UserError(str(exc)) from None
    cfg = result.config
    summary = {
        "step": result.step, "interrupted": result.interrupted, "checkpoint": str(result.checkpoint),
        "run_dir": str(result.run_dir), "seconds": round(result.seconds, 3), "steps_per_s": result.steps_per_s,
        "frames_per_s": result.frames_per_s, "metrics": result.final_metrics,
        "picture": str(result.picture) if result.picture else None,
        "animation": str(result.animation) if result.animation else None,
        "mlflow_run_id": cfg.run_id, "mlflow_uri": cfg.mlflow_uri, "heldout": result.heldout,
    }
    if as_json:
        _print_json(summary)
    else:
        m = result.final_metrics
        typer.echo(f"step {result.step:,} in {result.seconds:.1f} s ({result.steps_per_s:,.1f} steps/s, "
                   f"{result.frames_per_s:,.1f} frames/s)")
        if "l0_two_step_px" in m:
            typer.echo(f"layer-0 two-step error {m['l0_two_step_px']:.2f} px RMSE; copy-last-frame "
                       f"{m.get('baseline_two_step_px', float('nan')):.2f} px; ratio (MSE) {m.get('ratio_two_step', float('nan')):.3f}")
        h = result.heldout
        if "heldout_readout_iou" in h:
            typer.echo(f"held-out readout IoU {h['heldout_readout_iou']:.3f} (chance {h['heldout_readout_iou_chance']:.3f}, "
                       f"best fixed heatmap {h['heldout_readout_iou_position_blind']:.3f}); hit rate "
                       f"{h.get('heldout_readout_hit_rate', float('nan')):.3f} "
                       f"(chance {h.get('heldout_readout_hit_rate_chance', float('nan')):.3f})")
        typer.echo(f"checkpoint {result.checkpoint}")
        if result.picture:
            typer.echo(f"picture    {result.picture}")
        if result.animation:
            typer.echo(f"animation  {result.animation}")
        if cfg.run_id:
            typer.echo(f"MLflow run {cfg.run_id} in experiment '{cfg.experiment}' at {cfg.mlflow_uri} "
                       f"(browse: mlflow ui --backend-store-uri {cfg.mlflow_uri})")
    if result.interrupted:
        typer.echo(f"interrupted; resume with: pvm-dist train --resume {result.checkpoint} --steps {cfg.steps}", err=True)
        raise typer.Exit(130)


def _train_with_progress(cfg: Any, folder: Path, state: Any, show: bool, run: Any) -> Any:
    if not show:
        # Keep stdout for the JSON summary: MLflow prints "View run ..." lines there for HTTP trackers.
        import contextlib

        with contextlib.redirect_stdout(sys.stderr):
            return run(cfg, folder, state)
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    columns = [TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("step {task.completed:,.0f}/{task.total:,.0f}"),
               TextColumn("{task.fields[rate]}"), TextColumn("err {task.fields[err]}"), TimeRemainingColumn()]
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task(cfg.spec.name, total=cfg.steps, completed=state.step if state else 0, rate="", err="–")

        def update(p: Any) -> None:
            err = "–" if p.error is None else f"{p.error:.2f} px" + ("" if p.baseline is None else f" (copy-last {p.baseline:.2f} px)")
            bar.update(task, completed=p.step, rate=f"{p.steps_per_s:,.1f} steps/s {p.frames_per_s:,.1f} fr/s", err=err)

        return run(cfg, folder, state, on_progress=update)


def _split_list(values: list[str]) -> list[str]:
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


@app.command()
def bench(
    specs: Annotated[list[str], typer.Option("--spec", "-s", help="Spec(s) to time; repeat or comma-separate.")] = ["small"],  # noqa: B006
    n_seqs: Annotated[list[str], typer.Option("--n-seq", help="Batch sizes; repeat or comma-separate, e.g. 1,4,16.")] = ["1"],  # noqa: B006
    backend: Annotated[str, typer.Option("--backend", help="auto, reference or native.")] = "auto",
    device: Annotated[str | None, typer.Option("--device", help="cpu, cuda or cuda:N (default: a GPU if visible).")] = None,
    steps: Annotated[int, typer.Option("--steps", help="Timed steps per configuration.", min=1)] = 200,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed steps first.", min=0)] = 20,
    frames: Annotated[str, typer.Option("--frames", help="host: frames uploaded every step; device: a dataset held on the GPU (native engine).")] = "host",
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list of results.")] = False,
) -> None:
    """Steps/s and frames/s next to the memory floor (pvm-algorithm.md §7), with a per-phase breakdown."""
    from pvm_dist.run.bench import as_row, run_bench
    from pvm_dist.model.spec import load_spec

    _check_backend(backend)
    if frames not in ("host", "device"):
        raise UserError(f"--frames must be host or device, got {frames!r}")
    try:
        batch_sizes = [int(v) for v in _split_list(n_seqs)]
    except ValueError:
        raise UserError(f"--n-seq takes integers, got {n_seqs}") from None
    if any(b < 1 for b in batch_sizes):
        raise UserError("--n-seq values must be positive")
    loaded = [load_spec(s) for s in _split_list(specs)]
    results = []
    for spec in loaded:
        for n in batch_sizes:
            if not as_json:
                typer.echo(f"timing {spec.name} n_seq={n} ...", err=True)
            try:
                results.append(run_bench(spec, n, backend=backend, device=device, steps=steps, warmup=warmup,
                                           frames=frames))
            except (RuntimeError, ValueError, TypeError) as exc:
                raise UserError(f"{spec.name} n_seq={n}: {exc}") from None
    if as_json:
        _print_json([as_row(r) for r in results])
        return
    _print_bench(results)


def _print_bench(results: list[Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"pvm-dist bench on {results[0].device}" if results else "pvm-dist bench")
    for col in ("spec", "backend", "frames", "n_seq", "steps/s", "frames/s", "GB/s", "GFLOP/s", "floor steps/s", "ratio", "bound"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(r.spec, r.backend, r.frames, str(r.n_seq), f"{r.steps_per_s:,.1f}", f"{r.frames_per_s:,.0f}",
                      f"{r.achieved_gb_per_s:,.1f}", f"{r.achieved_gflop_per_s:,.1f}", f"{r.floor_steps_per_s:,.0f}",
                      f"{r.ratio_to_floor:.1%}", r.bound)
    con = Console()
    con.print(table)
    if results:
        con.print(f"floor: {results[0].bandwidth_gb_per_s:,.0f} GB/s measured copy bandwidth (read + write)")
    for r in results:
        if r.phases_ms:
            phases = ", ".join(f"{k} {v * 1e3:,.1f} µs" for k, v in r.phases_ms.items())
            con.print(f"  {r.spec} n_seq={r.n_seq} phases: {phases}")


@app.command()
def compare(
    experiment: Annotated[str, typer.Argument(help="MLflow experiment name (a sweep's experiment works too).")],
    mlflow_uri: Annotated[str | None, typer.Option("--mlflow", help="Tracking URI (default: ./mlflow.db).")] = None,
    metric: Annotated[str, typer.Option("--metric", "-m", help="Metric to sort by.")] = "ratio_two_step",
    order: Annotated[str, typer.Option("--order", help="auto (errors ascending, rates/IoU descending), asc or desc.")] = "auto",
    top: Annotated[int, typer.Option("--top", help="Rows to show (and curves to plot).", min=1)] = 20,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write learning curves of the top runs to this PNG.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Compare an experiment's runs: the params that differ, final metrics and fps, best first."""
    from pvm_dist.tracking.compare import CompareError, comparison, plot_curves
    from pvm_dist.tracking.tracker import default_tracking_uri

    if order not in ("auto", "asc", "desc"):
        raise UserError(f"--order must be auto, asc or desc, got {order!r}")
    uri = mlflow_uri or default_tracking_uri()
    try:
        result = comparison(uri, experiment, metric, None if order == "auto" else order == "desc")
    except CompareError as exc:
        raise UserError(str(exc)) from None
    except Exception as exc:  # an unreachable or broken tracking store
        raise UserError(f"cannot read MLflow at {uri}: {type(exc).__name__}: {exc}") from None
    runs = result["runs"][:top]
    if plot is not None:
        result["plot"] = str(plot_curves(uri, [r["run_id"] for r in runs], [r["name"] for r in runs], metric, plot))
    if as_json:
        _print_json({**result, "runs": runs})
        return
    _print_comparison(result, runs)


def _print_comparison(result: dict, runs: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    direction = "higher is better" if result["descending"] else "lower is better"
    table = Table(title=f"{result['experiment']}: {len(result['runs'])} runs, by {result['metric']} ({direction})")
    for col in ("run", "status", *result["differing_params"], result["metric"], "frames/s"):
        table.add_column(col, justify="right")
    for r in runs:
        value = "–" if r["metric"] is None else f"{r['metric']:.5g}"
        fps = "–" if r["frames_per_s"] is None else f"{r['frames_per_s']:,.0f}"
        table.add_row(r["name"], r["status"], *[str(r["params"].get(k, "–")) for k in result["differing_params"]], value, fps)
    con = Console()
    con.print(table)
    if not result["differing_params"]:
        con.print("(every run has the same parameters)")
    if "plot" in result:
        con.print(f"learning curves: {result['plot']}")


@app.command(name="eval")
def evaluate_checkpoint(
    checkpoint_file: Annotated[Path, typer.Argument(help="A .pvmckpt written by pvm-dist train.")],
    data: Annotated[str, typer.Option("--data", "-d", help="Held-out frames (same forms as train --data).")] = "synthetic:balls",
    data_path: Annotated[str | None, typer.Option("--data-path", help="Folder holding the original PVM data zips.")] = None,
    steps: Annotated[int, typer.Option("--steps", "-n", help="Frames per sequence to evaluate.", min=3)] = 300,
    n_seq: Annotated[int, typer.Option("--n-seq", help="Sequences evaluated together.", min=1)] = 1,
    backend: Annotated[str, typer.Option("--backend", help="auto, reference or native.")] = "auto",
    device: Annotated[str | None, typer.Option("--device", help="cpu, cuda or cuda:N.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of synthetic held-out data (training used --seed, default 0).")] = 1,
    log: Annotated[bool, typer.Option("--log", help="Also log the results to the checkpoint's MLflow run (as eval_*).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Prediction error vs the copy-last-frame baseline (and readout IoU) of a checkpoint on held-out data."""
    from pvm_dist.data import DataError
    from pvm_dist.run.evaluate import evaluate

    _check_backend(backend)
    try:
        result = evaluate(checkpoint_file, data, steps=steps, n_seq=n_seq, data_path=data_path, backend=backend,
                          device=device, seed=seed)
    except DataError as exc:
        raise UserError(str(exc)) from None
    if log:
        if not result["mlflow_run_id"]:
            raise UserError(f"{checkpoint_file} records no MLflow run to log to")
        from pvm_dist.tracking.tracker import Tracker

        tracker = Tracker.start(result["mlflow_uri"], experiment="", run_id=result["mlflow_run_id"],
                                fallback_dir=Path(checkpoint_file).resolve().parent / "tracking-fallback")
        tracker.log_metrics({f"eval_{k}": v for k, v in result["metrics"].items()}, step=result["trained_steps"])
        tracker.close("FINISHED")
    if as_json:
        _print_json(result)
        return
    typer.echo(f"{result['spec']} at step {result['trained_steps']:,} on {result['data']} ({steps} steps × {n_seq}):")
    for key, value in result["metrics"].items():
        typer.echo(f"  {key:<32} {value:.5g}")


def main() -> None:
    """Console-script entry point: run the app and turn user errors into one line + exit 2."""
    try:
        rc = app(standalone_mode=False)
    except click.exceptions.Abort:
        typer.echo("pvm-dist: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:
        if _debug or not isinstance(exc, _user_errors()):
            if not _debug:
                typer.echo(f"pvm-dist: internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", err=True)
                sys.exit(1)
            raise
        typer.echo(f"pvm-dist: error: {exc}", err=True)
        sys.exit(2)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
