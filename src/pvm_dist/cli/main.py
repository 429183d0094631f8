"""The ``pvm-dist`` command line (typer).

Every user error (bad spec, bad checkpoint, bad argument) prints one line to stderr and exits
non-zero; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from pvm_dist._version import __version__
from pvm_dist.run.config import MAX_STEPS

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
    from pvm_dist.engine.budget import DeviceUnavailable
    from pvm_dist.engine.native_engine import NativeEngineUnavailable
    from pvm_dist.io.checkpoint import CheckpointError
    from pvm_dist.model.budget import MemoryBudgetError
    from pvm_dist.model.spec import SpecError
    from pvm_dist.run.session import RunDiverged
    from pvm_dist.run.train import CheckpointWriteError, RunFolderBusy
    from pvm_dist.sweep.driver import SweepRunError
    from pvm_dist.sweep.plan import SweepError
    from pvm_dist.tracking.reach import TrackingStoreError

    return (UserError, SpecError, CheckpointError, DataError, SweepError, SweepRunError, RunDiverged,
            MemoryBudgetError, DeviceUnavailable, NativeEngineUnavailable, CheckpointWriteError, RunFolderBusy,
            TrackingStoreError,
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
        float | None, typer.Option("--bandwidth", help="Memory bandwidth in TB/s for the floor step rate. [default: 4.3, an H200's measured copy]", min=0.001)
    ] = None,
) -> None:
    """Sizes and costs of a model: units, weights, image, per-layer sizes, FLOPs and bytes per step, memory floor."""
    from pvm_dist.model.spec import load_spec
    from pvm_dist.model.topology import build_topology

    s = load_spec(spec)
    summary = build_topology(s).summary((bandwidth or DEFAULT_BANDWIDTH_TBS) * 1e12)
    summary["bandwidth_source"] = ("given with --bandwidth" if bandwidth is not None else
                                   "assumed: an H200's measured device copy, not this machine; --bandwidth sets it, "
                                   "pvm-dist bench measures it")
    summary["ignored_keys"] = sorted(s.ignored)
    summary["unknown_keys"] = list(s.unknown_keys)
    summary["spec"] = s.to_dict()
    if as_json:
        _print_json(summary)
        return
    _print_info(summary, s.source)


def _print_info(sm: dict, source: str) -> None:
    from pvm_dist.cli.console import console
    from rich.table import Table

    con = console()
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
        f"at {sm['bandwidth_bytes_per_s'] / 1e12:g} TB/s, one sequence ({sm['bandwidth_source']})"
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
    spec: Annotated[str | None, typer.Option("--spec", "-s", help="Spec file or model-zoo name (on resume: the checkpoint's; default: the first run: spec 'first', 120,000 steps, no readout).")] = None,
    data: Annotated[str | None, typer.Option("--data", "-d", help="Frames: synthetic:balls|bar|noise, a video, a folder of images, a PVM .zip (or a comma list), or a set name with --data-path. [default: synthetic:balls]")] = None,
    data_path: Annotated[str | None, typer.Option("--data-path", help="Folder holding the original PVM data zips (for set names).")] = None,
    steps: Annotated[int | None, typer.Option("--steps", "-n", help="Train until this step (also when resuming). [default: 120,000 without --spec, else 1,000]", min=1)] = None,
    n_seq: Annotated[int | None, typer.Option("--n-seq", help="Independent sequences trained together (shared weights). [default: 1]", min=1)] = None,
    backend: Annotated[str | None, typer.Option("--backend", help="auto (native where built), reference or native. [default: auto]")] = None,
    device: Annotated[str | None, typer.Option("--device", help="Native engine device: cpu, cuda or cuda:N (default: a GPU if visible).")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed of the initial weights and synthetic data. [default: 0]", min=0)] = None,
    overrides: Annotated[list[str], typer.Option("-O", help="Spec override key=value (repeatable), e.g. -O derivative=exact.")] = [],  # noqa: B006
    checkpoint_every: Annotated[int | None, typer.Option("--checkpoint-every", help="Save a checkpoint every N steps (0: at the end only). [default: 0]", min=0)] = None,
    keep: Annotated[int | None, typer.Option("--keep", help="How many of the newest checkpoints to keep. [default: 2]", min=1)] = None,
    keep_every: Annotated[int | None, typer.Option("--keep-every", help="Also keep every checkpoint whose step is a multiple of N (0: none). [default: 0]", min=0)] = None,
    metrics_every: Annotated[int | None, typer.Option("--metrics-every", help="Read and log metrics every N steps. [default: 1,000 without --spec, else 50]", min=1)] = None,
    picture_every: Annotated[int | None, typer.Option("--picture-every", help="Save a picture every N steps (0: at the end only). [default: 40,000 without --spec, else 500]", min=0)] = None,
    readout: Annotated[bool | None, typer.Option("--readout/--no-readout", help="Train the heatmap readout on labelled data. [default: on with --spec, off for the first run]")] = None,
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
    log_every: Annotated[float | None, typer.Option("--log-every", help="Plain progress lines every N seconds instead of the bar (the default off a terminal, every 10 s).", min=0)] = None,
) -> None:
    """Train one model locally (native engine where built, else the numpy reference), tracked in MLflow.

    Logs every effective spec value, errors against the copy-last-frame baseline, fps, pictures,
    an animation and checkpoints. Ctrl-C saves a checkpoint and prints the command that resumes it.
    """
    import time as _time

    from pvm_dist.data import DataError
    from pvm_dist.data.errors import recorded_data_error
    from pvm_dist.model.spec import load_spec
    from pvm_dist.run import state as run_state
    from pvm_dist.run.config import RunConfig
    from pvm_dist.run.train import finished_at
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
        _check_resume(state.run, given, spec)
        cfg = _configured(state.run, given)
        if (cfg.data, cfg.data_path) != (state.run.data, state.run.data_path):  # honoured, and said
            typer.echo(f"pvm-dist: note: resuming at step {ck.step:,} on {cfg.data}, not on {state.run.data} as "
                       f"trained so far; its checkpoints record the new data" + (" and its MLflow run lists both as "
                       "inputs" if cfg.track and cfg.run_id else ""), err=True)
        folder = run_dir or Path(resume).resolve().parent.parent
        if ck.step > cfg.steps or (ck.step == cfg.steps and finished_at(folder) == ck.step):
            raise UserError(f"{resume} is already at step {ck.step:,}; ask for more with --steps")
        # at cfg.steps and not finished: killed after its last checkpoint; train() does the end-of-run work
    else:
        from pvm_dist.run.config import FIRST_RUN_SPEC, first_run

        parsed = _parse_overrides(overrides)
        s = load_spec(spec or FIRST_RUN_SPEC)
        if parsed:
            s = s.with_overrides(parsed)
        base = RunConfig(spec=s, overrides=parsed) if spec else first_run({}).replace(spec=s, overrides=parsed)
        cfg = _configured(base, given)
        folder = run_dir or _new_folder(Path("runs") / f"{_folder_name(s.name)}-{_time.strftime('%Y%m%d-%H%M%S')}")
    _check_run_dir(folder, new_run=resume is None)
    if cfg.track:
        if not cfg.experiment.strip():
            raise UserError("--experiment: an MLflow experiment needs a name (got an empty one)")
        from pvm_dist.tracking.reach import check_store
        from pvm_dist.tracking.tracker import default_tracking_uri

        check_store(cfg.mlflow_uri or default_tracking_uri(), write=True)
    try:
        result = _train_with_progress(cfg, folder, state, show=not (quiet or as_json), run=run_training,
                                      log_every=log_every)
    except DataError as exc:
        if resume is not None and data is None:
            exc = recorded_data_error(exc, cfg.data)
        raise UserError(str(exc)) from None
    cfg = result.config
    from pvm_dist.tracking.defaults import run_page, ui_command

    page = (run_page(cfg.mlflow_uri, result.experiment_id, cfg.run_id)
            if cfg.run_id and cfg.mlflow_uri and result.experiment_id else None)
    summary = {
        "step": result.step, "interrupted": result.interrupted, "checkpoint": str(result.checkpoint),
        "run_dir": str(result.run_dir), "seconds": round(result.seconds, 3), "steps_per_s": result.steps_per_s,
        "frames_per_s": result.frames_per_s, "metrics": result.final_metrics,
        "picture": str(result.picture) if result.picture else None,
        "animation": str(result.animation) if result.animation else None,
        "mlflow_run_id": cfg.run_id, "mlflow_uri": cfg.mlflow_uri, "mlflow_page": page, "heldout": result.heldout,
    }
    if as_json:
        _print_json(summary)
    else:
        m = result.final_metrics
        typer.echo(f"step {result.step:,} in {result.seconds:.1f} s ({result.steps_per_s:,.1f} steps/s, "
                   f"{result.frames_per_s:,.1f} frames/s)")
        if "l0_two_step_px" in m:
            from pvm_dist.run.metrics import verdict

            typer.echo(f"baselines: copy-last-frame {m.get('baseline_two_step_px', float('nan')):.2f} px RMSE, "
                       f"background (running mean) {m.get('background_two_step_px', float('nan')):.2f} px RMSE")
            typer.echo(verdict(m))
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
            typer.echo(f"MLflow run {cfg.run_id} in experiment '{cfg.experiment}' at {cfg.mlflow_uri}")
            if cfg.mlflow_uri and (command := ui_command(cfg.mlflow_uri)):
                typer.echo(f"browse     {command}")
            if page:
                typer.echo(f"charts     {page}")
    if result.interrupted:
        typer.echo(f"interrupted; resume with: pvm-dist train --resume {result.checkpoint} --steps {cfg.steps}", err=True)
        raise typer.Exit(130)


def _configured(base: Any, given: dict[str, Any]) -> Any:
    """``base`` (a RunConfig) with the options given; a value it refuses (a NaN rate, say) is a user error."""
    try:
        return base.replace(**given)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _check_resume(ck: Any, given: dict[str, Any], spec: str | None) -> None:
    """What a resumed run cannot honour is refused (data, cadence, steps and a first tracker are honoured).

    The model (--spec) and the sequences (--n-seq) are the checkpoint's state: its weights and rings have
    their shape. A run tracked in MLflow continues in that run, which lives in one store and experiment.
    """
    from pvm_dist.model.spec import load_spec

    if spec is not None and load_spec(spec).to_dict() != ck.spec.to_dict():
        raise UserError(f"--spec {spec} is not the checkpoint's model ({ck.spec.name}); a resumed run keeps its spec")
    if given["n_seq"] is not None and given["n_seq"] != ck.n_seq:
        raise UserError(f"--n-seq {given['n_seq']} differs from the checkpoint's {ck.n_seq} sequences, whose rings "
                        f"it holds; resume without --n-seq")
    if ck.run_id and ck.track:
        for option, key in (("--mlflow", "mlflow_uri"), ("--experiment", "experiment")):
            if given[key] is not None and given[key] != getattr(ck, key):
                raise UserError(f"{option} {given[key]} differs from the checkpoint's ({getattr(ck, key)}), where its "
                                f"MLflow run {ck.run_id} continues; resume without {option}, or with --no-track")


#: What a run writes in its folder (run/train.py); a new run never writes over them.
RUN_FILES = ("spec.json", "metrics.jsonl", "checkpoints", "pictures", "prediction.gif")


def _check_run_dir(folder: Path, new_run: bool) -> None:
    """The run folder, or the nearest folder above it that exists, must be a writable folder, named in UTF-8
    (it is printed and drawn), and a new run's must hold no other run's files (checked before training, so a
    typo does not cost a run or overwrite one)."""
    import os

    try:
        str(folder).encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"--run-dir {ascii(str(folder))}: the name is not valid UTF-8") from None
    taken = [name for name in RUN_FILES if (folder / name).exists()] if new_run and folder.is_dir() else []
    if taken:
        raise UserError(f"--run-dir {folder} already holds a run ({', '.join(taken)}); resume it with --resume, "
                        f"or give a new folder")
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"--run-dir {folder}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"--run-dir {folder}: {existing} is not writable")


def _new_folder(base: Path) -> Path:
    """``base``, or ``base-2``, ``base-3``, ... where runs started in the same second already took it."""
    folder, n = base, 1
    while folder.exists():
        n += 1
        folder = base.with_name(f"{base.name}-{n}")
    return folder


def _folder_name(name: str) -> str:
    """A spec name as one folder name: letters, digits, '.', '_' and '-' only (no '/', '..' or control
    characters reach the file system), at most 64 characters."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in name).strip(".")[:64]
    return safe or "run"


def _train_with_progress(cfg: Any, folder: Path, state: Any, show: bool, run: Any, log_every: float | None = None) -> Any:
    if not show:
        # Keep stdout for the JSON summary: MLflow prints "View run ..." lines there for HTTP trackers.
        import contextlib

        with contextlib.redirect_stdout(sys.stderr):
            return run(cfg, folder, state)
    from pvm_dist.cli.progress import progress_reporter

    with progress_reporter(cfg.spec.name, cfg.steps, state.step if state else 0, log_every) as update:
        return run(cfg, folder, state, on_progress=update)


def _split_list(values: list[str]) -> list[str]:
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


@app.command()
def bench(
    specs: Annotated[list[str], typer.Option("--spec", "-s", help="Spec(s) to time; repeat or comma-separate.")] = ["small"],  # noqa: B006
    n_seqs: Annotated[list[str], typer.Option("--n-seq", help="Batch sizes; repeat or comma-separate, e.g. 1,4,16.")] = ["1"],  # noqa: B006
    backend: Annotated[str, typer.Option("--backend", help="auto, reference or native.")] = "auto",
    device: Annotated[str | None, typer.Option("--device", help="cpu, cuda or cuda:N (default: a GPU if visible).")] = None,
    steps: Annotated[int, typer.Option("--steps", help="Timed steps per configuration.", min=1, max=MAX_STEPS)] = 200,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed steps first.", min=0, max=MAX_STEPS)] = 20,
    frames: Annotated[str, typer.Option("--frames", help="host: frames uploaded every step; device: a dataset held on the GPU (native engine).")] = "host",
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list of results.")] = False,
    overrides: Annotated[list[str], typer.Option("-O", help="Spec override key=value (repeatable), e.g. -O precision=tf32.")] = [],  # noqa: B006
) -> None:
    """Steps/s and frames/s against each regime's roofline (memory or FP32 compute for that n_seq, pvm-algorithm.md §7), with a per-phase breakdown."""
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
    parsed = _parse_overrides(overrides)
    loaded = [load_spec(s).with_overrides(parsed) if parsed else load_spec(s) for s in _split_list(specs)]
    from pvm_dist.engine import check_engine_build

    for spec in loaded:  # every configuration's device and memory, before the first one is timed
        for n in batch_sizes:
            try:
                check_engine_build(spec, backend, n, device)
            except ValueError as exc:
                raise UserError(f"{spec.name} n_seq={n}: {exc}") from None
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
    from pvm_dist.cli.console import console
    from rich.table import Table

    table = Table(title=f"pvm-dist bench on {results[0].device}" if results else "pvm-dist bench")
    for col in ("spec", "backend", "frames", "n_seq", "steps/s", "frames/s", "GB/s", "GFLOP/s", "roofline steps/s", "ratio", "bound"):
        table.add_column(col, justify="right")
    for r in results:
        spec = r.spec if r.precision == "fp32" else f"{r.spec} ({r.precision})"
        table.add_row(spec, r.backend, r.frames, str(r.n_seq), f"{r.steps_per_s:,.1f}", f"{r.frames_per_s:,.0f}",
                      f"{r.achieved_gb_per_s:,.1f}", f"{r.achieved_gflop_per_s:,.1f}", f"{r.floor_steps_per_s:,.0f}",
                      f"{r.ratio_to_floor:.1%}", r.bound)
    con = console()
    con.print(table)
    if results:
        con.print(f"roofline: memory at {results[0].bandwidth_gb_per_s:,.0f} GB/s measured copy bandwidth (read + write), "
                  "or FP32 compute where that binds (bound)")
    for r in results:
        if r.phases_ms:
            phases = ", ".join(f"{k} {v * 1e3:,.1f} µs" for k, v in r.phases_ms.items())
            con.print(f"  {r.spec} n_seq={r.n_seq} phases: {phases}")


@app.command()
def sync(
    paths: Annotated[list[Path] | None, typer.Argument(help="Folders (searched for tracking_fallback.jsonl) or spool files. [default: ./runs, ./pvm-sweeps, ./tracking_fallback]")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print what was done as JSON.")] = False,
) -> None:
    """Deliver what MLflow missed: runs whose process ended (or was killed) while the tracker was away.

    Every undelivered metric, param, tag and artifact in the spools found goes to its run (created if it never
    was), once, and the run ends FINISHED, FAILED or KILLED as its process meant. Spools of live runs are left alone.
    """
    from pvm_dist.tracking.sync import end_if_running, sync_paths

    targets = paths or [p for p in (Path("runs"), Path("pvm-sweeps"), Path("tracking_fallback")) if p.exists()]
    missing = [str(p) for p in targets if not p.exists()]
    if missing:
        raise UserError(f"sync: no such file or folder: {', '.join(missing)}")
    import contextlib

    with contextlib.redirect_stdout(sys.stderr):  # MLflow prints "View run ..." lines there for HTTP trackers
        result = sync_paths(targets)
        killed = sum(end_if_running(uri, run_id, owner) for uri, run_id, owner in _tracked_runs(targets))
    if as_json:
        _print_json({"runs": result.runs, "metrics": result.metrics, "killed": killed, "left": result.left,
                     "busy": result.busy})
    else:
        typer.echo(f"synced {result.runs} run(s), {result.metrics:,} metric value(s) delivered; {killed} run(s) "
                   f"left RUNNING by a killed process closed as KILLED"
                   + (f"; {len(result.busy)} spool(s) in use by a live run left alone" if result.busy else ""))
        for line in result.left:
            typer.echo(f"not delivered: {line}", err=True)
    if result.left:
        raise typer.Exit(3)


def _tracked_runs(paths: list[Path]) -> list[tuple[str, str, Path]]:
    """(store, run id, folder its process tracked from) of the runs under ``paths``: each run folder's or sweep
    trial's newest checkpoint, and each sweep's parent run (from its journal)."""
    from pvm_dist.io.checkpoint import CheckpointError, read_header
    from pvm_dist.sweep.journal import SweepFolder

    newest: dict[Path, Path] = {}
    for path in paths:
        for ck in sorted(Path(path).rglob("*.pvmckpt")) if Path(path).is_dir() else []:
            owner = ck.parent.parent if ck.parent.name == "checkpoints" else ck.parent
            newest[owner] = ck
    out = []
    for owner, ck in newest.items():
        try:
            meta = read_header(ck)["meta"]
        except (CheckpointError, OSError):
            continue
        if meta.get("track", True) and meta.get("run_id") and meta.get("mlflow_uri"):
            out.append((meta["mlflow_uri"], meta["run_id"], owner))
    for path in paths:
        for journal in sorted(Path(path).rglob("journal.jsonl")) if Path(path).is_dir() else []:
            try:
                state = SweepFolder.open(journal.parent.parent, journal.parent.name).state()
            except (OSError, ValueError, KeyError):
                continue
            if state.parent_run_id and state.mlflow_uri:
                out.append((state.mlflow_uri, state.parent_run_id, journal.parent))
    return out


@app.command()
def compare(
    experiment: Annotated[str, typer.Argument(help="MLflow experiment name (a sweep's experiment works too).")],
    mlflow_uri: Annotated[str | None, typer.Option("--mlflow", help="Tracking URI (default: ./mlflow.db).")] = None,
    metric: Annotated[str, typer.Option("--metric", "-m", help="Metric to sort by.")] = "ratio_two_step",
    order: Annotated[str, typer.Option("--order", help="auto (errors ascending, rates/IoU descending), asc or desc.")] = "auto",
    top: Annotated[int, typer.Option("--top", help="Rows to show (and curves to plot).", min=1)] = 20,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write learning curves of the top runs to this PNG.")] = None,
    group: Annotated[str | None, typer.Option("--group-by", help="Merge runs that differ only in this param (e.g. seed): mean ± std.")] = None,
    importance: Annotated[bool, typer.Option("--importance", help="Which varied params matter (Optuna's PED-ANOVA over the finished runs; needs 8).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Compare an experiment's runs: the params that differ, the last step, how each ended, final metrics and fps, best first."""
    from pvm_dist.tracking.compare import CompareError, comparison, group_by, plot_curves
    from pvm_dist.tracking.reach import check_store
    from pvm_dist.tracking.tracker import default_tracking_uri

    if order not in ("auto", "asc", "desc"):
        raise UserError(f"--order must be auto, asc or desc, got {order!r}")
    uri = mlflow_uri or default_tracking_uri()
    check_store(uri, write=False)
    try:
        result = comparison(uri, experiment, metric, None if order == "auto" else order == "desc")
    except CompareError as exc:
        raise UserError(str(exc)) from None
    except Exception as exc:  # an unreachable or broken tracking store
        raise UserError(f"cannot read MLflow at {uri}: {type(exc).__name__}: {exc}") from None
    runs = result["runs"][:top]
    if group is not None:
        if group not in result["columns"].values():
            raise UserError(f"--group-by {group}: not a param that differs between runs "
                            f"(those: {', '.join(result['columns'].values()) or 'none'})")
        result["groups"] = group_by(result["runs"], group)
    if importance:
        from pvm_dist.tracking.importance import importances

        result["importance"] = importances(result["runs"], result["columns"], result["descending"])
    if plot is not None:
        result["plot"] = str(plot_curves(uri, [r["run_id"] for r in runs], [r["label"] for r in runs], metric, plot))
    if as_json:
        _print_json({**result, "runs": runs})
        return
    _print_comparison(result, runs)
    if importance:
        _print_importance(result["importance"], result["metric"])


def _print_comparison(result: dict, runs: list[dict]) -> None:
    from pvm_dist.cli.console import console
    from rich.table import Table

    direction = "higher is better" if result["descending"] else "lower is better"
    con = console()
    if "groups" in result:
        cols = [k for k, short in result["columns"].items() if k in result["groups"][0]["params"]] if result["groups"] else []
        table = Table(title=f"{result['experiment']}: {len(result['groups'])} groups, {result['metric']} mean ± std ({direction})")
        for col in (*[result["columns"][k] for k in cols], "runs", result["metric"]):
            table.add_column(col, justify="right")
        for g in result["groups"]:
            value = "–" if g["metric_mean"] is None else f"{g['metric_mean']:.4g} ± {g['metric_std']:.2g}"
            table.add_row(*[str(g["params"].get(k, "–")) for k in cols], str(g["runs"]), value)
        con.print(table)
        _print_runs_page(result)
        return
    table = Table(title=f"{result['experiment']}: {len(result['runs'])} runs, by {result['metric']} ({direction}; "
                        "runs that went the whole way first)")
    for col in ("run", "ended", "step", *result["columns"].values(), result["metric"], "frames/s"):
        table.add_column(col, justify="right")
    for r in runs:
        value = "–" if r["metric"] is None else f"{r['metric']:.5g}"
        fps = "–" if r["frames_per_s"] is None else f"{r['frames_per_s']:,.0f}"
        step = "–" if r["step"] is None else f"{r['step']:,}"
        table.add_row(r["name"], r["ended"], step, *[str(r["params"].get(k, "–")) for k in result["differing_params"]],
                      value, fps)
    con.print(table)
    if not result["differing_params"]:
        con.print("(every run has the same parameters)")
    if "plot" in result:
        con.print(f"learning curves: {result['plot']}")
    _print_runs_page(result)


def _print_runs_page(result: dict) -> None:
    """Where the MLflow UI shows the experiment's runs (each run's charts: ``--json``'s ``mlflow_page``)."""
    from pvm_dist.tracking.defaults import page_line

    typer.echo(f"runs   {page_line(result['mlflow_uri'], result['mlflow_page'])}")


def _print_importance(imp: dict, metric: str) -> None:
    """The importance table, or the one line saying how many finished runs it needs."""
    from pvm_dist.cli.console import console
    from rich.table import Table

    con = console()
    if imp["finished"] < imp["needed"]:
        con.print(f"importance: needs {imp['needed']} finished runs, this experiment has {imp['finished']}")
        return
    table = Table(title=f"which params matter for {metric}: {imp['method']}, {imp['finished']} finished runs, "
                        f"best {imp['target_quantile']:.0%} against all")
    for col in ("param", "importance", "values", "in the best run"):
        table.add_column(col, justify="right")
    for p in imp["params"]:
        share = "same in all" if p["importance"] is None else f"{p['importance']:.2f}"
        table.add_row(p["name"], share, str(p["values"]), str(p["best_value"]))
    con.print(table)


@app.command(name="eval")
def evaluate_checkpoint(
    checkpoint_file: Annotated[Path, typer.Argument(help="A .pvmckpt written by pvm-dist train.")],
    data: Annotated[str | None, typer.Option("--data", "-d", help="Frames to score on (same forms as train --data). [default: the data the checkpoint records]")] = None,
    data_path: Annotated[str | None, typer.Option("--data-path", help="Folder holding the original PVM data zips.")] = None,
    steps: Annotated[int, typer.Option("--steps", "-n", help="Frames per sequence to evaluate.", min=3, max=MAX_STEPS)] = 300,
    n_seq: Annotated[int, typer.Option("--n-seq", help="Sequences evaluated together.", min=1)] = 1,
    backend: Annotated[str, typer.Option("--backend", help="auto, reference or native.")] = "auto",
    device: Annotated[str | None, typer.Option("--device", help="cpu, cuda or cuda:N.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of synthetic held-out data (training used --seed, default 0).", min=0)] = 1,
    log: Annotated[bool, typer.Option("--log", help="Also log the results to the checkpoint's MLflow run (as eval_*).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Prediction error vs the copy-last-frame baseline (and readout IoU) of a checkpoint on held-out data.

    A long eval prints a progress line (step, speed, ETA) on stderr every 10 s; stdout holds only the report.
    """
    from pvm_dist.cli.progress import EvalLines
    from pvm_dist.data import DataError
    from pvm_dist.run.evaluate import evaluate

    _check_backend(backend)
    try:
        result = evaluate(checkpoint_file, data, steps=steps, n_seq=n_seq, data_path=data_path, backend=backend,
                          device=device, seed=seed, progress=EvalLines())
    except DataError as exc:
        raise UserError(str(exc)) from None
    if log:
        if not result["mlflow_run_id"]:
            raise UserError(f"{checkpoint_file} records no MLflow run to log to")
        from pvm_dist.tracking.defaults import run_page
        from pvm_dist.tracking.tracker import Tracker

        tracker = Tracker.start(result["mlflow_uri"], experiment="", run_id=result["mlflow_run_id"],
                                fallback_dir=Path(checkpoint_file).resolve().parent / "tracking-fallback")
        tracker.log_metrics({f"eval_{k}": v for k, v in result["metrics"].items()}, step=result["trained_steps"])
        experiment_id = tracker.experiment_id
        tracker.close("FINISHED")
        # (where the UI charts the run, eval_* beside its training curves)
        result["mlflow_page"] = run_page(result["mlflow_uri"], experiment_id, result["mlflow_run_id"]) if experiment_id else None
    if as_json:
        _print_json(result)
        return
    from pvm_dist.run.metrics import verdict

    source = "the data the checkpoint records" if result["data_from"] == "checkpoint" else "--data"
    typer.echo(f"{result['spec']} at step {result['trained_steps']:,} on {result['data']} ({source}; {steps} steps × {n_seq}):")
    if result["wraps"]:
        typer.echo(f"note: {result['data']} has {result['period']:,} frames per stream; {result['warmup'] + steps:,} steps "
                   f"(warm-up included) go round it {result['wraps']} more time(s), so frames repeat in the score", err=True)
    for key, value in result["metrics"].items():
        typer.echo(f"  {key:<32} {value:.5g}")
    typer.echo(verdict(result["metrics"]))
    if result.get("mlflow_page"):
        from pvm_dist.tracking.defaults import page_line

        typer.echo(f"charts {page_line(result['mlflow_uri'], result['mlflow_page'])}")


def _one_line(exc: BaseException) -> str:
    """The message with control characters escaped (user text may hold newlines); a sweep's list of
    problems keeps its one line per problem."""
    from pvm_dist.sweep.plan import SweepError

    text = str(exc)
    if isinstance(exc, SweepError):
        return text  # each problem already printable (SweepError)
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def main() -> None:
    """Console-script entry point: run the app and turn user errors into one line + exit 2."""
    from pvm_dist.cli.usage import click_types, usage_line

    from pvm_dist.cli.quiet import quiet_third_party

    quiet_third_party()
    try:
        rc = app(standalone_mode=False)
    except click_types("Abort"):
        typer.echo("pvm-dist: aborted", err=True)
        sys.exit(130)
    except click_types("UsageError") as exc:
        typer.echo(usage_line(exc), err=True)
        sys.exit(2)
    except click_types("ClickException") as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click_types("Exit") as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:
        if _debug or not isinstance(exc, _user_errors()):
            if not _debug:
                typer.echo(f"pvm-dist: internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", err=True)
                sys.exit(1)
            raise
        typer.echo(f"pvm-dist: error: {_one_line(exc)}", err=True)
        sys.exit(2)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
