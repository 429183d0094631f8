"""``pvm-dist sweep submit | list | logs | stop`` and the cluster side of ``status`` and ``resume``: sweeps whose
driver runs on a Ray cluster as a Ray Job (:mod:`pvm_dist.sweep.jobs`), watched from a laptop."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

ADDRESS_HELP = "The cluster's Ray dashboard, http://HEAD:8265 (default: $RAY_API_SERVER_ADDRESS, or $RAY_ADDRESS if http)."
CLUSTER_ROOT_HELP = "Folder of sweep journals and checkpoints on the cluster (absolute, or under ~/)."
STOP_WAIT_HELP = "Seconds a stopped driver has to checkpoint its trials before Ray kills it."
#: As pvm_dist.sweep.jobs.STOP_WAIT_S (not imported here: that module imports Ray's job client).
STOP_WAIT_S = 300


def _echo_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


def _cluster(address: str | None) -> Any:
    from pvm_dist.sweep.jobs import Cluster, jobs_address

    return Cluster(jobs_address(address, dict(os.environ)))


def submit(
    file: Annotated[Path, typer.Argument(help="Sweep file (YAML); its spec files travel with it.")],
    address: Annotated[str | None, typer.Option("--address", help=ADDRESS_HELP)] = None,
    root: Annotated[str | None, typer.Option("--root", help=CLUSTER_ROOT_HELP + " [default: ~/pvm-sweeps]")] = None,
    mlflow_uri: Annotated[str | None, typer.Option("--mlflow", help="MLflow tracking URI as the head sees it (default: mlflow.db in the root).")] = None,
    experiment: Annotated[str | None, typer.Option("--experiment", help="MLflow experiment (default: the sweep's name).")] = None,
    max_concurrent: Annotated[int | None, typer.Option("--max-concurrent", help="At most this many trials at once.", min=1)] = None,
    worker_wait: Annotated[float | None, typer.Option("--worker-wait", help="Seconds to wait for the first worker.", min=1)] = None,
    stop_wait: Annotated[int, typer.Option("--stop-wait", help=STOP_WAIT_HELP, min=1)] = STOP_WAIT_S,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Run a sweep's driver on the cluster as a Ray Job and return its id at once.

    The laptop may then sleep: `sweep status`, `logs`, `stop` and `resume` with the same --address follow it.
    """
    from pvm_dist.sweep.jobs import DEFAULT_CLUSTER_ROOT, check_cluster_root
    from pvm_dist.sweep.plan import load_sweep

    sweep = load_sweep(file)
    root = check_cluster_root(root or DEFAULT_CLUSTER_ROOT)
    cluster = _cluster(address)
    args = ["--mlflow", mlflow_uri or f"sqlite:///{root}/mlflow.db"]
    args += ["--experiment", experiment] if experiment else []
    args += ["--max-concurrent", str(max_concurrent)] if max_concurrent else []
    args += ["--worker-wait", f"{worker_wait:g}"] if worker_wait else []
    sweep_id = cluster.submit_sweep(sweep, root, args, stop_wait)
    if as_json:
        _echo_json({"sweep_id": sweep_id, "job_id": sweep_id, "address": cluster.address, "root": root})
        return
    typer.echo(sweep_id)
    typer.echo(f"pvm-dist: the driver runs on {cluster.address} as job {sweep_id}; journal under {root} there. "
               f"Follow it with: pvm-dist sweep status {sweep_id} --address {cluster.address}", err=True)


def list_sweeps(
    address: Annotated[str | None, typer.Option("--address", help=ADDRESS_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The sweeps submitted to the cluster, each with its newest driver job's state."""
    from pvm_dist.sweep.jobs import sweeps

    cluster = _cluster(address)
    rows = list(sweeps(cluster.sweep_jobs()))
    if as_json:
        _echo_json(rows)
        return
    if not rows:
        typer.echo(f"no sweeps submitted to {cluster.address}")
        return
    width = max(len(r["sweep_id"]) for r in rows)
    typer.echo(f"{'sweep':<{width}}  {'state':<9}  jobs  {'submitted':<19}  root")
    for r in rows:
        typer.echo(f"{r['sweep_id']:<{width}}  {r['status']:<9}  {r['jobs']:>4}  {_when(r['submitted']):<19}  {r['root']}")


def remote_status(sweep_id: str, address: str | None, root: str | None, as_json: bool) -> None:
    """``sweep status`` against a cluster: the driver job's state and the journal's table (read there)."""
    from pvm_dist.sweep.jobs import ROOT, check_cluster_root, job_row, json_in

    cluster = _cluster(address)
    job = cluster.latest(sweep_id)
    ok, text = cluster.journal(sweep_id, check_cluster_root(root) if root else job.metadata[ROOT], as_json)
    row = job_row(job)
    if as_json:
        _echo_json({**(json_in(text) if ok else {"sweep_id": sweep_id, "journal": text.strip()}), "job": row})
        return
    typer.echo(f"job {row['job_id']}: {row['status']}" + (f" ({row['message']})" if row["message"] else ""))
    typer.echo(text.rstrip() if ok else f"journal not readable yet: {text.strip()[-500:]}")


def logs(
    sweep_id: Annotated[str, typer.Argument(help="The sweep's id (as submit printed it).")],
    address: Annotated[str | None, typer.Option("--address", help=ADDRESS_HELP)] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the driver ends.")] = False,
) -> None:
    """The driver's output (its newest job: the run, or the last resume)."""
    cluster = _cluster(address)
    job = cluster.latest(sweep_id)
    if follow:
        cluster.follow(job.submission_id, lambda chunk: (sys.stdout.write(chunk), sys.stdout.flush()))
        return
    sys.stdout.write(cluster.logs(job.submission_id))


def stop(
    sweep_id: Annotated[str, typer.Argument(help="The sweep's id.")],
    address: Annotated[str | None, typer.Option("--address", help=ADDRESS_HELP)] = None,
    wait: Annotated[float, typer.Option("--wait", help="Seconds to wait for the driver to end (0: do not wait).", min=0)] = 600,
) -> None:
    """Stop a submitted sweep as Ctrl-C would: the driver checkpoints its running trials and closes their runs.

    `sweep resume ID --address ...` continues it.
    """
    from pvm_dist.sweep.jobs import FINAL_JOB_STATES

    cluster = _cluster(address)
    job = cluster.latest(sweep_id)
    if str(job.status) in FINAL_JOB_STATES:
        typer.echo(f"sweep {sweep_id}: its driver (job {job.submission_id}) already ended {job.status}")
        return
    cluster.stop(job.submission_id)
    if wait <= 0:
        typer.echo(f"sweep {sweep_id}: asked job {job.submission_id} to stop")
        return
    status = cluster.wait(job.submission_id, wait, poll_s=0.5)
    typer.echo(f"sweep {sweep_id}: driver job {job.submission_id} {status}; "
               f"resume with: pvm-dist sweep resume {sweep_id} --address {cluster.address}")


def remote_resume(sweep_id: str, address: str, root: str | None, args: list[str], stop_wait: int,
                  as_json: bool) -> None:
    """``sweep resume`` against a cluster: submit the resume as a job and return at once."""
    from pvm_dist.sweep.jobs import check_cluster_root

    cluster = _cluster(address)
    job_id, used = cluster.resume_sweep(sweep_id, root and check_cluster_root(root), args, stop_wait)
    if as_json:
        _echo_json({"sweep_id": sweep_id, "job_id": job_id, "address": cluster.address, "root": used})
        return
    typer.echo(job_id)
    typer.echo(f"pvm-dist: sweep {sweep_id} resumes on {cluster.address} as job {job_id}", err=True)


def register(app: typer.Typer) -> None:
    """Mount the cluster commands on the ``sweep`` sub-app."""
    app.command("submit")(submit)
    app.command("list")(list_sweeps)
    app.command("logs")(logs)
    app.command("stop")(stop)


def _when(seconds: float | None) -> str:
    return "" if seconds is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))
