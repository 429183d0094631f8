"""``pvm-dist sweep``: run, resume and watch sweeps (the typer sub-app the main CLI mounts)."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer

from pvm_dist.cli import sweep_jobs
from pvm_dist.sweep.journal import DEFAULT_ROOT

#: As in pvm_dist.sweep.driver (not imported here: the CLI imports Ray and MLflow only when a sweep runs).
NO_WORKER_TIMEOUT_S = 1800.0

sweep_app = typer.Typer(help="Hyperparameter and model-zoo sweeps on Ray (local, or a cluster with --address).",
                        no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]})

ROOT_HELP = "Folder of sweep journals and trial checkpoints."
#: Exit codes: 0 every trial finished (or was stopped early by ASHA); EXIT_FAILED some trials failed or the
#: sweep stopped short (failure budget, no worker); EXIT_ALL_FAILED every trial failed; EXIT_INTERRUPTED Ctrl-C.
EXIT_INTERRUPTED, EXIT_FAILED, EXIT_ALL_FAILED = 130, 3, 4
WORKER_WAIT_HELP = ("Seconds to wait for the first worker when none can start (a GPU node booting on an "
                    "autoscaling cluster) before giving up.")


def _echo_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


def plan_rows(sweep: Any) -> list[dict[str, Any]]:
    """The trial plan as printable rows (what ``--dry-run`` and ``validate`` show)."""
    from pvm_dist.model.spec import load_spec
    from pvm_dist.model.topology import build_topology

    weights: dict[str, int] = {}
    out = []
    for t in sweep.plan():
        if t.spec not in weights:
            weights[t.spec] = build_topology(load_spec(t.spec)).n_weights
        config = sweep.trial_config(t)
        out.append({"trial_id": t.trial_id, "spec": t.spec, "varied": t.varied, "seed": t.seed,
                    "steps": config.steps, "n_seq": config.n_seq, "frames": config.steps * config.n_seq,
                    "weights": weights[t.spec]})
    return out


def print_plan(sweep: Any, as_json: bool) -> None:
    rows = plan_rows(sweep)
    search = sweep.search and {"type": sweep.search.type, "trials": sweep.search.trials,
                               "space": {k: d.to_raw() for k, d in sweep.vary.items()}}
    frames = sum(r["frames"] for r in rows)
    if as_json:
        _echo_json({"sweep": sweep.name, "source": sweep.source, "trials": rows, "steps_per_trial": sweep.steps,
                    "n_seq": sweep.run.n_seq, "frames_budget": sweep.frames, "total_frames": frames,
                    "metric": sweep.metric, "mode": sweep.mode, "search": search,
                    "early_stopping": sweep.early_stopping and sweep.early_stopping.milestones(sweep.steps)})
        return
    from pvm_dist.cli.console import console
    from rich.table import Table

    con = console()
    if sweep.adaptive:
        tab = Table(title=f"{sweep.name}: {sweep.search.type} search, {sweep.search.trials} trials asked for as "
                          f"workers free up ({sweep.search.startup_trials} at random first)", show_edge=False)
        for col in ("parameter", "distribution"):
            tab.add_column(col)
        for k, d in sweep.vary.items():
            tab.add_row(k, str(d.to_raw()))
        con.print(tab)
    else:
        keys = list(dict.fromkeys(k for r in rows for k in r["varied"]))
        shown = [k for k in ("steps", "n_seq") if k not in keys and len({r[k] for r in rows}) > 1]
        n_seq = "" if "n_seq" in sweep.vary else f" × n_seq {sweep.run.n_seq}"
        tab = Table(title=f"{sweep.name}: {len(rows)} trials × {_steps_title(sweep)}{n_seq}", show_edge=False)
        for col in ["trial", "spec", *keys, *shown, "seed", "weights"]:
            tab.add_column(col, justify="left" if col in ("trial", "spec") else "right")
        for r in rows:
            tab.add_row(r["trial_id"], r["spec"], *[str(r["varied"].get(k, "")) for k in keys],
                        *[f"{r[k]:,}" for k in shown], str(r["seed"]), f"{r['weights']:,}")
        con.print(tab)
    es = sweep.early_stopping
    con.print(f"metric {sweep.metric} ({sweep.mode}); checkpoints every {sweep.run.checkpoint_every:,} steps; "
              f"data {'varied' if 'data' in sweep.vary else sweep.run.data}; backend {sweep.run.backend}; failure budget {sweep.max_failures}"
              + (f"; ASHA at steps {', '.join(f'{m:,}' for m in es.milestones(sweep.steps))} (keep 1/{es.reduction_factor})"
                 if es else ""))
    if sweep.search is not None and sweep.search.type == "pbt":
        explore = ", ".join(f"{k} {e.to_raw()}" for k, e in sweep.search.explore.items())
        con.print(f"PBT every {sweep.search.interval_steps:,} steps: the bottom {sweep.search.quantile:g} continue from "
                  f"a copy of a top {sweep.search.quantile:g} member, exploring {explore}")
    if not sweep.adaptive:
        con.print(f"{frames:,} frames in all")


def _steps_title(sweep: Any) -> str:
    """How long each trial trains, for the plan's title."""
    if sweep.frames is not None:
        return f"{sweep.frames:,} frames (steps = frames / n_seq)"
    return "varied steps" if "steps" in sweep.vary else f"{sweep.steps:,} steps"


def check_root(root: Path) -> None:
    """``--root`` (or the nearest folder above it that exists) must be a folder: checked before Ray starts."""
    existing = Path(root)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise typer.BadParameter(f"{existing} is a file, not a folder", param_hint="'--root'")


@sweep_app.command("run")
def run(
    file: Annotated[Path, typer.Argument(help="Sweep file (YAML), e.g. experiments/quickstart.yaml.")],
    address: Annotated[str | None, typer.Option("--address", help="Ray cluster: auto, HOST:PORT or ray://HOST:10001 (default: start a local one).")] = None,
    mlflow_uri: Annotated[str | None, typer.Option("--mlflow", help="MLflow tracking URI (default: ./mlflow.db).")] = None,
    experiment: Annotated[str | None, typer.Option("--experiment", help="MLflow experiment (default: the sweep's name).")] = None,
    max_concurrent: Annotated[int | None, typer.Option("--max-concurrent", help="At most this many trials at once (workers).", min=1)] = None,
    worker_wait: Annotated[float, typer.Option("--worker-wait", help=WORKER_WAIT_HELP, min=1)] = NO_WORKER_TIMEOUT_S,
    root: Annotated[Path, typer.Option("--root", help=ROOT_HELP)] = DEFAULT_ROOT,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the trial plan and exit.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="No live table; print the outcome as JSON.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No live table.")] = False,
    sweep_id: Annotated[str | None, typer.Option("--sweep-id", hidden=True, help="The id `sweep submit` chose.")] = None,
) -> None:
    """Run a sweep: one Ray worker per GPU (CPU workers without GPUs), a nested MLflow run per trial.

    Shows a live table of trials. Ctrl-C checkpoints the running trials and prints the resume command;
    `pvm-dist sweep status ID` watches from another terminal.
    """
    from pvm_dist.sweep.driver import DriverOptions, run_sweep
    from pvm_dist.sweep.plan import load_sweep

    sweep = load_sweep(file)
    if dry_run:
        print_plan(sweep, as_json)
        return
    check_root(root)
    if sweep_id is not None:  # a submitted driver: its default MLflow store lives in the root it may create first
        from pvm_dist.sweep.jobs import check_sweep_id

        check_sweep_id(sweep_id)
        root.mkdir(parents=True, exist_ok=True)
    from pvm_dist.tracking.reach import check_store
    from pvm_dist.tracking.tracker import default_tracking_uri

    check_store(mlflow_uri or default_tracking_uri(), write=True)
    opts = DriverOptions(address=address, mlflow_uri=mlflow_uri, experiment=experiment, max_concurrent=max_concurrent,
                         root=root, no_worker_timeout_s=worker_wait, on_notice=_notice)
    _finish(_with_live_table(lambda: run_sweep(sweep, opts, sweep_id), opts, show=not (as_json or quiet)), as_json, root)


@sweep_app.command("resume")
def resume(
    sweep_id: Annotated[str, typer.Argument(help="The sweep's id (its folder name under --root).")],
    address: Annotated[str | None, typer.Option("--address", help="Ray cluster (default: start a local one); its dashboard, http://HEAD:8265, resumes the sweep there as a Ray Job.")] = None,
    mlflow_uri: Annotated[str | None, typer.Option("--mlflow", help="MLflow tracking URI (default: the one the sweep used).")] = None,
    max_concurrent: Annotated[int | None, typer.Option("--max-concurrent", help="At most this many trials at once.", min=1)] = None,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="Run FAILED trials again, from their last checkpoint (or from scratch), in their own MLflow runs.")] = False,
    worker_wait: Annotated[float, typer.Option("--worker-wait", help=WORKER_WAIT_HELP, min=1)] = NO_WORKER_TIMEOUT_S,
    root: Annotated[Path, typer.Option("--root", help=ROOT_HELP)] = DEFAULT_ROOT,
    as_json: Annotated[bool, typer.Option("--json", help="No live table; print the outcome as JSON.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No live table.")] = False,
) -> None:
    """Continue a sweep after its driver stopped: finished trials are kept, the others continue from their
    last checkpoints in the same MLflow runs (FAILED ones too with --retry-failed)."""
    from pvm_dist.sweep.driver import DriverOptions, resume_sweep
    from pvm_dist.sweep.jobs import is_jobs_address

    if is_jobs_address(address):
        args = [*(["--mlflow", mlflow_uri] if mlflow_uri else []), *(["--retry-failed"] if retry_failed else []),
                *(["--max-concurrent", str(max_concurrent)] if max_concurrent else []), "--worker-wait", f"{worker_wait:g}"]
        sweep_jobs.remote_resume(sweep_id, address, None if root == DEFAULT_ROOT else str(root), args,
                                 sweep_jobs.STOP_WAIT_S, as_json)
        return
    check_root(root)
    opts = DriverOptions(address=address, mlflow_uri=mlflow_uri, max_concurrent=max_concurrent, root=root,
                         retry_failed=retry_failed, no_worker_timeout_s=worker_wait, on_notice=_notice)
    _deliver_spools(Path(root) / sweep_id)
    _finish(_with_live_table(lambda: resume_sweep(sweep_id, opts), opts, show=not (as_json or quiet)), as_json, root)


@sweep_app.command("status")
def status(
    sweep_id: Annotated[str | None, typer.Argument(help="The sweep's id (default: the newest under --root).")] = None,
    root: Annotated[Path, typer.Option("--root", help=ROOT_HELP)] = DEFAULT_ROOT,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    address: Annotated[str | None, typer.Option("--address", help="A cluster's dashboard (http://HEAD:8265): the status of a sweep submitted there.")] = None,
) -> None:
    """A sweep's trials (status, step, fps, metric, ETA, where) from its journal; works while it runs."""
    if address is not None:
        if sweep_id is None:
            raise typer.BadParameter("give the sweep's id with --address", param_hint="'SWEEP_ID'")
        sweep_jobs.remote_status(sweep_id, address, None if root == DEFAULT_ROOT else str(root), as_json)
        return
    from pvm_dist.sweep import progress
    from pvm_dist.sweep.journal import SweepFolder, SweepNotFound
    from pvm_dist.sweep.plan import load_sweep

    if sweep_id is None:
        found = sorted(Path(root).glob("*/sweep.json"), key=lambda p: p.stat().st_mtime)
        if not found:
            raise SweepNotFound(f"no sweeps under {Path(root).resolve()}")
        sweep_id = found[-1].parent.name
    folder = SweepFolder.open(root, sweep_id)
    _deliver_spools(folder.path)
    definition = folder.definition()
    sweep = load_sweep(definition["sweep"])
    state = folder.state()
    trials = folder.trials(state)
    if as_json:
        _echo_json({"sweep_id": sweep_id, **progress.summary(state, trials, sweep.steps, sweep.metric, sweep.mode)})
        return
    from pvm_dist.cli.console import console

    console().print(progress.table(state, trials, sweep.steps, sweep.metric, f"{sweep_id} · {state.status}"))
    if state.reason:
        typer.echo(f"reason: {state.reason}")


sweep_jobs.register(sweep_app)


def _deliver_spools(folder: Path) -> None:
    """Deliver what the sweep's runs left in their spools while MLflow was away, when no driver is running it
    (a live driver holds the sweep folder and delivers its own)."""
    from pvm_dist.tracking.owner import claim
    from pvm_dist.tracking.sync import sync_paths

    if not folder.is_dir():
        return
    lock = claim(folder)
    if lock is None:
        return
    lock.release()
    result = sync_paths([folder])
    if result.runs:
        typer.echo(f"delivered {result.metrics:,} metric value(s) of {result.runs} run(s) the tracker had missed",
                   err=True)
    for line in result.left:
        typer.echo(f"not delivered yet: {line}", err=True)


def _with_live_table(start: Any, opts: Any, show: bool) -> Any:
    if not show:
        # Keep stdout for the JSON outcome: MLflow prints "View run ..." lines there for HTTP trackers.
        with contextlib.redirect_stdout(sys.stderr):
            return start()
    from rich.live import Live

    from pvm_dist.sweep import progress

    if not sys.stdout.isatty():  # a job log: a live table would show nothing until the end
        from pvm_dist.cli.progress import LOG_EVERY_S

        last = [-LOG_EVERY_S]

        def log(driver: Any) -> None:
            if time.monotonic() - last[0] >= LOG_EVERY_S:
                last[0] = time.monotonic()
                trials = [t.to_dict() for t in driver.trials.values()]
                print(progress.log_line(driver.state, trials, driver.sweep.steps, driver.sweep.metric), flush=True)

        opts.on_update = log
        return start()
    with Live(refresh_per_second=4, transient=False) as live:
        def update(driver: Any) -> None:
            trials = [t.to_dict() for t in driver.trials.values()]
            live.update(progress.table(driver.state, trials, driver.sweep.steps, driver.sweep.metric,
                                       f"{driver.folder.sweep_id} · {driver.experiment}", driver.source.remaining(),
                                       waiting=driver.waiting))

        opts.on_update = update
        outcome = start()
    typer.echo("")
    return outcome


def _notice(line: str) -> None:
    typer.echo(f"pvm-dist: {line}", err=True)


def _finish(outcome: Any, as_json: bool, root: Path) -> None:
    resume_cmd = f"pvm-dist sweep resume {outcome.sweep_id}" + ("" if Path(root) == DEFAULT_ROOT else f" --root {root}")
    failed = [t for t in outcome.trials if t["status"] == "FAILED"]
    retry_cmd = f"{resume_cmd} --retry-failed"
    if as_json:
        _echo_json({**outcome.to_dict(), "resume_command": resume_cmd if outcome.status != "FINISHED" else None,
                    "retry_command": retry_cmd if failed else None})
    else:
        counts = Counter(t["status"] for t in outcome.trials)
        typer.echo(f"sweep {outcome.sweep_id}: {outcome.status.lower()}; "
                   + ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))
                   + f"; {outcome.seconds:.1f} s, {outcome.frames_per_s:,.0f} frames/s aggregate"
                   + (f"; warm trial start {outcome.warm_start_s * 1e3:.0f} ms" if outcome.warm_start_s else ""))
        from pvm_dist.tracking.defaults import experiment_page, page_line, run_page

        eid = outcome.experiment_id
        if outcome.best:
            b = outcome.best
            varied = ", ".join(f"{k}={v}" for k, v in b["varied"].items()) or "no varied values"
            typer.echo(f"best trial {b['trial_id']} ({varied}): metric {b['metric']:.4g} at step {b['step']:,}; "
                       f"MLflow run {b['run_id']}")
            if eid and b.get("run_id"):
                typer.echo(f"  charts {run_page(outcome.mlflow_uri, eid, b['run_id'])}")
        typer.echo(f"parent run {outcome.parent_run_id} in experiment '{outcome.experiment}' at {outcome.mlflow_uri}")
        if eid:
            typer.echo(f"  runs   {page_line(outcome.mlflow_uri, experiment_page(outcome.mlflow_uri, eid))}")
        typer.echo(f"compare: pvm-dist compare '{outcome.experiment}' --mlflow {outcome.mlflow_uri}")
        typer.echo(f"journal and checkpoints: {outcome.folder}")
        for t in failed:
            typer.echo(f"  {t['trial_id']} FAILED at step {t['step']:,}: {t['reason']}")
    if outcome.status == "INTERRUPTED":
        typer.echo(f"interrupted; resume with: {resume_cmd}", err=True)
        raise typer.Exit(EXIT_INTERRUPTED)
    every = bool(failed) and len(failed) == len(outcome.trials)
    if outcome.status == "FAILED":
        typer.echo(f"pvm-dist: sweep failed: {outcome.reason}; after fixing the cause, resume with: "
                   f"{retry_cmd if failed else resume_cmd}", err=True)
    elif failed:
        typer.echo(f"pvm-dist: {'every trial' if every else f'{len(failed)} of {len(outcome.trials)} trials'} "
                   f"failed (reasons above); after fixing the cause, rerun them with: {retry_cmd}", err=True)
    if every:
        raise typer.Exit(EXIT_ALL_FAILED)
    if failed or outcome.status == "FAILED":
        raise typer.Exit(EXIT_FAILED)
