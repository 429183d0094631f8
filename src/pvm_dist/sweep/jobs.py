"""Sweeps whose driver runs on the cluster as a Ray Job, driven from a laptop through the dashboard's Jobs API.

A laptop that submits a sweep can close its lid: the driver (``pvm-dist sweep run``) runs on the head as a
Ray Job and writes its journal under a root folder on the cluster. Each job carries metadata naming the
sweep, its role (``run``, ``resume``, or ``status``: a short job that reads the journal where it lives) and
the root, so ``list``, ``status``, ``logs``, ``stop`` and ``resume`` find a sweep by its id alone.

- The sweep file travels as the job's ``working_dir``: its definition (``sweep.json``) and the spec files
  it names, never the source tree; the entrypoint calls the cluster's own ``pvm-dist``.
- Ray stops a job by sending SIGTERM to the entrypoint's processes and SIGKILL after
  ``RAY_JOB_STOP_WAIT_TIME_S`` (3 s by default). The driver treats SIGTERM as Ctrl-C (it checkpoints the
  running trials and closes their runs), so the submission sets that wait long enough for it to finish.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import shlex
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pvm_dist.sweep.executor import SweepRunError
from pvm_dist.sweep.journal import new_sweep_id
from pvm_dist.sweep.plan import SweepSpec

#: The journal's root on the cluster when none is given: a folder in the home of the user Ray runs as.
DEFAULT_CLUSTER_ROOT = "~/pvm-sweeps"
#: Seconds Ray waits after SIGTERM before SIGKILL: the driver asks every running trial for its state,
#: writes it and closes the runs (a LARGE checkpoint takes seconds per trial).
STOP_WAIT_S = 300
PROBE_TIMEOUT_S = 5.0
STATUS_JOB_TIMEOUT_S = 120.0
SWEEP_FILE = "sweep.json"
ROLE, SWEEP, ROOT = "pvm_dist_role", "pvm_dist_sweep", "pvm_dist_root"
DRIVER_ROLES = ("run", "resume")
FINAL_JOB_STATES = ("SUCCEEDED", "FAILED", "STOPPED")
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")


def jobs_address(address: str | None, env: dict[str, str]) -> str:
    """The dashboard's address (``http://HEAD:8265``): the one given, else ``RAY_API_SERVER_ADDRESS``, else
    ``RAY_ADDRESS`` when it is an http address (Ray's own ``ray job`` commands read the same)."""
    if address is None:
        address = env.get("RAY_API_SERVER_ADDRESS") or None
    if address is None and env.get("RAY_ADDRESS", "").startswith(("http://", "https://")):
        address = env["RAY_ADDRESS"]
    if address is None:
        raise SweepRunError("no cluster given: pass --address http://HEAD:8265 (the Ray dashboard; "
                            "or set RAY_API_SERVER_ADDRESS)")
    if not is_jobs_address(address):
        raise SweepRunError(f"--address {address!r} is not a Ray dashboard address: give http://HEAD:8265")
    return address.rstrip("/")


def is_jobs_address(address: str | None) -> bool:
    return bool(address) and bool(re.fullmatch(r"https?://[^\s/]+(:\d+)?/?", address or ""))


def check_sweep_id(sweep_id: str) -> str:
    if not _SAFE_ID.fullmatch(sweep_id):
        raise SweepRunError(f"{sweep_id!r} is not a sweep id (letters, digits, '-', '_' and '.')")
    return sweep_id


def check_cluster_root(root: str) -> str:
    """The journal's root on the cluster must be absolute (or under ``~``): a relative one would land in the
    job's temporary working directory, which Ray deletes."""
    if not (root.startswith("/") or root.startswith("~/")):
        raise SweepRunError(f"--root {root!r} must be an absolute path on the cluster (or start with ~/)")
    if any(c in root for c in "\n\r\0"):
        raise SweepRunError("--root holds a control character")
    return root.rstrip("/") or "/"


def shell_word(arg: str) -> str:
    """An argument as one shell word; a path under ``~/`` (also in a ``sqlite:///~/...`` URI) is left to the
    cluster's shell to expand (its ``$HOME``)."""
    for prefix in ("~/", "sqlite:///~/"):
        if arg.startswith(prefix):
            head = prefix[:-2]  # what comes before the ~
            return (shlex.quote(head) if head else "") + '"$HOME"/' + shlex.quote(arg[len(prefix):])
    return shlex.quote(arg)


class Cluster:
    """The dashboard of one Ray cluster, through Ray's ``JobSubmissionClient``."""

    def __init__(self, address: str) -> None:
        self.address = address
        _probe(address)
        from ray.job_submission import JobSubmissionClient

        for name in ("ray.dashboard.modules.dashboard_sdk", "ray._private.runtime_env.packaging"):
            logging.getLogger(name).setLevel(logging.WARNING)  # its "Uploading package ..." lines (set on import)
        try:
            self.client = JobSubmissionClient(address)
        except Exception as exc:  # noqa: BLE001 - Ray raises many kinds here; the user needs one line
            raise SweepRunError(f"no Ray Jobs API at {address}: {_first_line(exc)}") from None

    # ---- finding sweeps ------------------------------------------------------------------------------
    def sweep_jobs(self, sweep_id: str | None = None) -> list[Any]:
        """The driver jobs (run and resume) of one sweep, or of every sweep, oldest first."""
        jobs = [j for j in self.client.list_jobs()
                if (j.metadata or {}).get(ROLE) in DRIVER_ROLES
                and (sweep_id is None or j.metadata.get(SWEEP) == sweep_id)]
        return sorted(jobs, key=lambda j: (j.start_time or 0, j.submission_id or ""))

    def latest(self, sweep_id: str) -> Any:
        """The newest driver job of the sweep; an unknown id is a user error."""
        jobs = self.sweep_jobs(check_sweep_id(sweep_id))
        if not jobs:
            raise SweepRunError(f"no sweep {sweep_id} was submitted to {self.address} "
                                f"(pvm-dist sweep list --address {self.address} shows those that were)")
        return jobs[-1]

    # ---- starting drivers ----------------------------------------------------------------------------
    def submit_sweep(self, sweep: SweepSpec, root: str, args: list[str], stop_wait_s: int) -> str:
        """Submit ``pvm-dist sweep run`` as a job; return the sweep id (also the job's id) at once."""
        sweep_id = new_sweep_id(sweep.name)
        with tempfile.TemporaryDirectory(prefix="pvm-submit-") as tmp:
            package_sweep(sweep, Path(tmp))
            self._submit(sweep_id, "run", root, ["run", SWEEP_FILE, "--address", "auto", "--sweep-id", sweep_id, *args],
                         stop_wait_s,
                         working_dir=tmp, submission_id=sweep_id)
        return sweep_id

    def resume_sweep(self, sweep_id: str, root: str | None, args: list[str], stop_wait_s: int) -> tuple[str, str]:
        """Submit ``pvm-dist sweep resume`` as a job once the sweep's last driver has ended; return its job id
        and the root used (the last job's, unless given)."""
        last = self.latest(sweep_id)
        if str(last.status) not in FINAL_JOB_STATES:
            raise SweepRunError(f"sweep {sweep_id} is still {last.status} as job {last.submission_id}; "
                                f"stop it first (pvm-dist sweep stop {sweep_id})")
        root = root or last.metadata.get(ROOT, DEFAULT_CLUSTER_ROOT)
        job_id = f"{sweep_id}--resume-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        self._submit(sweep_id, "resume", root, ["resume", sweep_id, "--address", "auto", *args], stop_wait_s,
                     submission_id=job_id)
        return job_id, root

    def _submit(self, sweep_id: str, role: str, root: str, args: list[str], stop_wait_s: int,
                submission_id: str, working_dir: str | None = None) -> None:
        runtime_env: dict[str, Any] = {"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": str(stop_wait_s),
                                                    "PYTHONUNBUFFERED": "1", "COLUMNS": "160"}}
        if working_dir is not None:
            runtime_env["working_dir"] = working_dir
        try:
            self.client.submit_job(entrypoint=entrypoint(args, root), submission_id=submission_id,
                                   runtime_env=runtime_env, metadata={ROLE: role, SWEEP: sweep_id, ROOT: root})
        except Exception as exc:  # noqa: BLE001
            raise SweepRunError(f"the cluster at {self.address} refused the job: {_first_line(exc)}") from None

    # ---- watching and stopping -----------------------------------------------------------------------
    def journal(self, sweep_id: str, root: str, as_json: bool) -> tuple[bool, str]:
        """What ``pvm-dist sweep status`` prints on the cluster, where the journal is (a short job): whether it
        succeeded, and its output."""
        job_id = f"{sweep_id}--status-{secrets.token_hex(4)}"
        self.client.submit_job(entrypoint=entrypoint(["status", sweep_id, *(["--json"] if as_json else [])], root),
                               submission_id=job_id, metadata={ROLE: "status", SWEEP: sweep_id, ROOT: root},
                               runtime_env={"env_vars": {"COLUMNS": "160"}})
        status = self.wait(job_id, STATUS_JOB_TIMEOUT_S)
        text = job_output(self.client.get_job_logs(job_id))
        try:
            self.client.delete_job(job_id)
        except Exception:  # noqa: BLE001, S110 - a leftover status job is only clutter in the job list
            pass
        return status == "SUCCEEDED", text

    def wait(self, job_id: str, timeout_s: float, poll_s: float = 0.2) -> str:
        """Poll the job until it ends (or the timeout passes); return its last status."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = str(self.client.get_job_status(job_id))
            if status in FINAL_JOB_STATES or time.monotonic() > deadline:
                return status
            time.sleep(poll_s)

    def stop(self, job_id: str) -> bool:
        return bool(self.client.stop_job(job_id))

    def logs(self, job_id: str) -> str:
        return job_output(self.client.get_job_logs(job_id), keep_banner=True)

    def follow(self, job_id: str, write: Callable[[str], None]) -> None:
        """Stream the job's log until it ends."""
        async def tail() -> None:
            async for chunk in self.client.tail_job_logs(job_id):
                write(chunk)

        asyncio.run(tail())


def entrypoint(args: list[str], root: str) -> str:
    """``pvm-dist sweep ARGS --root ROOT`` as one shell command: the cluster's installed pvm-dist, a root the
    cluster's shell expands (``~``), and the cluster as Ray Jobs gives it to its drivers (``--address auto``).
    ``exec``: Ray's stop signal reaches the driver, not a shell around it."""
    return " ".join(["exec", "pvm-dist", "sweep", *(shell_word(a) for a in [*args, "--root", root])])


def package_sweep(sweep: SweepSpec, into: Path) -> None:
    """Write the sweep's definition (``sweep.json``) and the spec files it names into ``into``: what the job's
    working_dir carries to the cluster (spec files by their names; zoo names stay names)."""
    definition = sweep.to_dict()
    specs = []
    for spec in sweep.specs:
        path = Path(spec)
        if path.is_absolute() and path.is_file():
            target = into / "specs" / path.name
            target.parent.mkdir(exist_ok=True)
            if target.exists():
                raise SweepRunError(f"two spec files are named {path.name}; rename one to submit the sweep")
            shutil.copyfile(path, target)
            spec = f"specs/{path.name}"
        specs.append(spec)
    definition["spec"] = specs[0] if len(specs) == 1 else specs
    (into / SWEEP_FILE).write_text(json.dumps(definition, indent=1))


def job_output(text: str, keep_banner: bool = False) -> str:
    """A job's log without the lines Ray writes before the entrypoint runs."""
    lines = text.splitlines(keepends=True)
    if not keep_banner:
        lines = [ln for ln in lines if not ln.startswith("Running entrypoint for job ") and "INFO job_manager.py" not in ln]
    return "".join(lines)


def json_in(text: str) -> dict[str, Any]:
    """The JSON object a ``--json`` command printed, among whatever else the job logged."""
    starts = [m.start() for m in re.finditer(r"^\{", text, flags=re.MULTILINE)]
    for start in starts:
        try:
            obj, _ = json.JSONDecoder().raw_decode(text[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    raise SweepRunError(f"the cluster's answer held no JSON: {text.strip()[-300:]}")


def job_row(job: Any) -> dict[str, Any]:
    """One driver job, as ``list`` and ``status`` show it."""
    md = job.metadata or {}
    return {"sweep_id": md.get(SWEEP), "job_id": job.submission_id, "role": md.get(ROLE), "root": md.get(ROOT),
            "status": str(job.status), "message": job.message, "entrypoint": job.entrypoint,
            "start_time": _seconds(job.start_time), "end_time": _seconds(job.end_time)}


def sweeps(jobs: list[Any]) -> Iterator[dict[str, Any]]:
    """One row per sweep (its newest driver job), oldest sweep first."""
    newest: dict[str, Any] = {}
    first: dict[str, float] = {}
    for job in jobs:
        sid = job.metadata[SWEEP]
        first.setdefault(sid, _seconds(job.start_time) or 0.0)
        newest[sid] = job
    for sid in sorted(newest, key=lambda s: first[s]):
        yield {**job_row(newest[sid]), "jobs": sum(1 for j in jobs if j.metadata[SWEEP] == sid),
               "submitted": first[sid]}


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000.0


def _probe(address: str) -> None:
    """One HTTP request with a short timeout, so that a wrong address fails in seconds (Ray's client has none).
    The dashboard answers 401 without Ray's token: Ray's client then sends it, which it does only when
    ``RAY_AUTH_MODE=token`` (set here for this process when the user has not set it)."""
    try:
        with urllib.request.urlopen(f"{address}/api/version", timeout=PROBE_TIMEOUT_S) as r:  # noqa: S310 - http(s) only
            json.loads(r.read(65536))
    except urllib.error.HTTPError as exc:
        if exc.code == 401:  # token authentication: Ray's client sends the token (RAY_AUTH_TOKEN, ~/.ray/auth_token)
            os.environ.setdefault("RAY_AUTH_MODE", "token")  # and says when it has none
            return
        raise SweepRunError(f"{address} answered HTTP {exc.code}: not a Ray dashboard") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SweepRunError(f"no Ray dashboard at {address}: {reason}") from None
    except ValueError:
        raise SweepRunError(f"{address} is not a Ray dashboard (its /api/version is not JSON)") from None


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"
