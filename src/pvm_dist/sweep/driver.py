"""The sweep driver: schedules a sweep's trials over Ray worker actors and records everything.

One :class:`~pvm_dist.sweep.worker.TrialWorker` actor per GPU (``num_gpus`` from the sweep file), or CPU
workers where the cluster has no GPU. The driver

- gives each free worker the next pending trial, then feeds it chunks of steps, two ahead so the
  device never waits for the driver; chunks end at metric, checkpoint and ASHA milestone steps;
- keeps each trial's latest checkpoint in the sweep folder (the state comes back from the worker
  through Ray's object store) and logs it, its metrics and pictures to the trial's nested MLflow run;
  the driver is the only MLflow writer, and its trackers write one at a time (one SQLite writer);
- writes every event to the sweep journal (:mod:`pvm_dist.sweep.journal`) before acting on it, so a
  killed driver loses nothing that ``pvm-dist sweep resume`` cannot continue;
- on a dead worker (process killed, node gone) puts the trial back in the queue to continue from its
  last checkpoint and starts a replacement worker; a diverging trial fails with its reason; every
  failure is counted against the sweep's failure budget, which, once spent, stops the sweep;
- on Ctrl-C (SIGINT/SIGTERM) checkpoints the running trials, closes their runs as KILLED and returns
  INTERRUPTED so the CLI prints the resume command.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pvm_dist.io import checkpoint
from pvm_dist.sweep.asha import SuccessiveHalving
from pvm_dist.sweep.journal import (
    DEFAULT_ROOT,
    FAILED,
    FINAL_STATUSES,
    FINISHED,
    PENDING,
    STOPPED,
    SweepFolder,
    SweepState,
    new_sweep_id,
)
from pvm_dist.sweep.plan import SweepSpec, Trial, load_sweep
from pvm_dist.model.spec import Spec, load_spec
from pvm_dist.run.signals import stop_on_signals
from pvm_dist.tracking.tracker import Tracker, default_tracking_uri, run_tags

PIPELINE_DEPTH = 2  # chunks queued on a worker ahead of the one running
POLL_S = 0.25
NO_WORKER_TIMEOUT_S = 300.0  # pending trials but no worker could start for this long: give up
CLIENT_CONNECT_ATTEMPTS = 3


class SweepRunError(RuntimeError):
    """The sweep cannot run (no cluster, no resources); a user-facing message."""


@dataclasses.dataclass
class DriverOptions:
    """How to run a sweep (the sweep file says what to run)."""

    address: str | None = None  # Ray cluster; None: start a local one
    mlflow_uri: str | None = None
    experiment: str | None = None  # default: the sweep's name
    max_concurrent: int | None = None
    root: Path = DEFAULT_ROOT
    no_worker_timeout_s: float = NO_WORKER_TIMEOUT_S
    on_update: Callable[[Driver], None] | None = None  # called about every POLL_S (the live table)


@dataclasses.dataclass
class SweepOutcome:
    sweep_id: str
    folder: Path
    status: str  # FINISHED, FAILED or INTERRUPTED
    reason: str | None
    best: dict[str, Any] | None
    trials: list[dict[str, Any]]
    parent_run_id: str | None
    mlflow_uri: str
    experiment: str
    seconds: float
    frames: int  # trained in this driver session
    frames_per_s: float  # aggregate: frames / time from the first trial's start to the end
    warm_start_s: float | None  # mean trial start cost on a worker that had run a trial before
    workers: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["folder"] = str(self.folder)
        return out


@dataclasses.dataclass
class _Worker:
    index: int
    handle: Any
    ready_ref: Any  # describe() until the worker is up
    info: dict[str, Any] | None = None
    trial: str | None = None
    epoch: int = 0  # bumped when its trial ends: results of older chunks are then ignored
    calls: deque = dataclasses.field(default_factory=deque)  # (ref, kind, epoch, payload) in submission order
    dead: bool = False

    @property
    def where(self) -> str:
        if not self.info:
            return "starting"
        gpus = ",".join(self.info.get("gpus") or [])
        return f"{self.info['host']}/{self.info['node'][:6]} " + (f"gpu {gpus}" if gpus else "cpu")


@dataclasses.dataclass
class _Live:
    """A trial running on a worker."""

    trial: Trial
    spec: Spec  # the trial's effective spec
    worker: _Worker
    tracker: Any
    submitted_to: int  # chunks are queued up to this step
    started_step: int
    stopping: bool = False  # Ctrl-C: waiting for its final state


class Driver:
    """Runs one sweep to the end (or until stopped); see the module docstring."""

    def __init__(self, folder: SweepFolder, sweep: SweepSpec, trials: list[Trial], opts: DriverOptions,
                 state: SweepState) -> None:
        self.folder, self.sweep, self.opts = folder, sweep, opts
        self.trials = {t.trial_id: t for t in trials}
        self.state = state
        self.workers: list[_Worker] = []
        self.live: dict[str, _Live] = {}
        self.queue: deque[str] = deque(t for t in self.trials if state.trials[t].status not in FINAL_STATUSES)
        for t in self.queue:  # RUNNING in the journal = unfinished when the driver died
            state.trials[t].status, state.trials[t].step = PENDING, state.trials[t].checkpoint_step
        self.asha = self._make_asha()
        self.session_failures = 0
        self.stop_reason: str | None = None
        self.interrupted = False
        self.frames = 0
        self.t0 = time.perf_counter()
        self.first_start: float | None = None  # when the first trial of this session started training
        self.mlflow_uri = opts.mlflow_uri or state.mlflow_uri or default_tracking_uri()
        self.experiment = opts.experiment or state.experiment or sweep.name
        self.parent: Any = None
        self._worker_class: Any = None
        self._waiting_since: float | None = None

    # ---- setup ------------------------------------------------------------------------------------
    def _make_asha(self) -> SuccessiveHalving | None:
        es = self.sweep.early_stopping
        if es is None:
            return None
        asha = SuccessiveHalving(es.milestones(self.sweep.steps), es.reduction_factor, self.sweep.mode)
        for trial_id, step, value in self.state.rungs:
            if asha.is_milestone(step):
                asha.rungs[step][trial_id] = value
        return asha

    def _start_tracking(self) -> None:
        resuming = self.state.parent_run_id is not None
        self.parent = Tracker.start(self.mlflow_uri, self.experiment, run_name=self.folder.sweep_id,
                                    run_id=self.state.parent_run_id,
                                    tags=run_tags(extra={"sweep_id": self.folder.sweep_id, "pvm_dist.role": "sweep"}),
                                    fallback_dir=self.folder.path / "tracking-fallback")
        if not resuming:
            self.parent.log_params({"sweep": self.sweep.to_dict(), "n_trials": len(self.trials)})
            self.parent.log_dict(self.folder.definition(), "sweep.json")
        self.folder.append("sweep_started", parent_run_id=self.parent.run_id, mlflow_uri=self.mlflow_uri,
                           experiment=self.experiment, host=socket.gethostname(), pid=os.getpid())
        self.state.parent_run_id = self.parent.run_id

    def _start_workers(self) -> None:
        import ray

        from pvm_dist.sweep.worker import TrialWorker

        res = self.sweep.resources
        gpus = ray.cluster_resources().get("GPU", 0.0)
        if gpus >= res.gpus_per_actor:
            count, num_gpus = int(gpus // res.gpus_per_actor), res.gpus_per_actor
        else:
            cpus = ray.cluster_resources().get("CPU", 1.0)
            count, num_gpus = res.cpu_workers or max(1, int(cpus // res.cpus_per_actor)), 0
        count = min(count, self.opts.max_concurrent or self.sweep.max_concurrent or count, max(len(self.queue), 1))
        self._worker_class = ray.remote(TrialWorker).options(num_gpus=num_gpus, num_cpus=res.cpus_per_actor,
                                                             max_restarts=0)
        for _ in range(count):
            self._add_worker()

    def _add_worker(self) -> None:
        handle = self._worker_class.remote()
        self.workers.append(_Worker(len(self.workers), handle, handle.describe.remote()))

    # ---- main loop --------------------------------------------------------------------------------
    def run(self) -> SweepOutcome:
        """Run until every trial is final, the failure budget is spent, or a stop signal arrives."""
        import ray

        self._start_tracking()
        with stop_on_signals() as should_stop:
            try:
                self._start_workers()
                while True:
                    self.interrupted = self.interrupted or should_stop()
                    if not self._busy():
                        break
                    self._assign()
                    self._check_stalled()
                    heads = {w.ready_ref if w.info is None else w.calls[0][0]: w for w in self.workers
                             if not w.dead and (w.info is None or w.calls)}
                    if heads:
                        ready, _ = ray.wait(list(heads), num_returns=1, timeout=POLL_S)
                        for ref in ready:
                            self._on_ready(heads[ref], ref)
                    else:
                        time.sleep(POLL_S)
                    if self.opts.on_update:
                        self.opts.on_update(self)
            finally:
                self._shutdown()
        return self._outcome()

    def _busy(self) -> bool:
        # A trial whose start call is under way is on a worker but not live yet: it counts.
        assigned = any(w.trial is not None and not w.dead for w in self.workers)
        if self.stop_reason is not None or self.interrupted:
            return assigned  # drain: wait for the running trials' final checkpoints
        return bool(self.queue) or assigned

    def _assign(self) -> None:
        """Give free, ready workers the next pending trial; on a stop, ask running trials for their state."""
        if self.interrupted or self.stop_reason is not None:
            for live in list(self.live.values()):
                if not live.stopping:
                    live.stopping = True
                    self._submit(live.worker, "final", live.worker.handle.advance.remote(0, True, False), None)
            return
        for w in self.workers:
            if w.dead or w.info is None or w.trial is not None or w.calls or not self.queue:
                continue
            self._start_trial(self.queue.popleft(), w)

    def _check_stalled(self) -> None:
        """Pending trials that no worker can take for too long (every node gone): stop with a reason."""
        waiting = bool(self.queue) and not self.live and not any(w.info and not w.dead for w in self.workers)
        if not waiting:
            self._waiting_since = None
            return
        self._waiting_since = self._waiting_since or time.monotonic()
        if time.monotonic() - self._waiting_since > self.opts.no_worker_timeout_s:
            self.stop_reason = (f"no worker could start for {self.opts.no_worker_timeout_s:.0f} s: the cluster has no "
                                f"free {'GPU' if self._wants_gpu() else 'CPU'} for a pvm-dist worker")

    def _wants_gpu(self) -> bool:
        return bool(self._worker_class and self._worker_class._default_options.get("num_gpus"))

    def _submit(self, w: _Worker, kind: str, ref: Any, payload: Any) -> None:
        w.calls.append((ref, kind, w.epoch, payload))

    def _start_trial(self, trial_id: str, w: _Worker) -> None:
        import ray

        trial, ts = self.trials[trial_id], self.state.trials[trial_id]
        state = None
        if ts.checkpoint_step:
            try:
                state = ray.put(checkpoint.load(self.folder.checkpoint_file(trial_id)).state)
            except (checkpoint.CheckpointError, OSError) as exc:
                self._end_trial(trial_id, FAILED, f"cannot continue from its checkpoint: {exc}", failure=True)
                return
        w.trial = trial_id
        settings = {"backend": self.sweep.backend, "n_seq": self.sweep.n_seq, "data": self.sweep.data,
                    "data_path": self.sweep.data_path}
        self._submit(w, "start", w.handle.start.remote(trial.to_dict(), settings, state), time.perf_counter())

    def _on_ready(self, w: _Worker, ref: Any) -> None:
        import ray

        if w.info is None:  # a worker came up
            try:
                w.info = ray.get(ref)
            except ray.exceptions.RayError as exc:
                self._worker_lost(w, exc)
            return
        _, kind, epoch, payload = w.calls.popleft()
        try:
            result = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            self._worker_lost(w, exc)
            return
        except ray.exceptions.RayTaskError as exc:
            if epoch == w.epoch and w.trial is not None:
                self._trial_error(w, exc)
            return
        if epoch != w.epoch or w.trial is None:
            return  # a chunk queued before its trial ended
        if kind == "start":
            self._on_started(w, result, payload)
        elif kind == "chunk":
            self._on_chunk(w, result, payload)
        elif kind == "final":
            self._on_final(w, result)

    # ---- trial events ------------------------------------------------------------------------------
    def _on_started(self, w: _Worker, result: dict[str, Any], submitted: float) -> None:
        trial = self.trials[w.trial]
        ts = self.state.trials[trial.trial_id]
        gpu = ",".join(w.info.get("gpus") or []) or "cpu"
        where = {"sweep_id": self.folder.sweep_id, "trial_id": trial.trial_id, "node": w.info["node"],
                 "worker_host": w.info["host"], "gpu": gpu}
        tracker = Tracker.start(self.mlflow_uri, self.experiment, run_name=f"{trial.trial_id}", run_id=ts.run_id,
                                parent_run_id=self.parent.run_id,
                                tags=run_tags(result["backend"], result["device"], where),
                                fallback_dir=self.folder.trial_dir(trial.trial_id) / "tracking-fallback")
        spec = load_spec(trial.spec).with_overrides(trial.overrides)
        if ts.run_id is None:
            tracker.log_params(self._trial_params(trial, spec, result["backend"]))
            if tracker.run_id:
                self.folder.append("trial_run", trial=trial.trial_id, run_id=tracker.run_id)
                ts.run_id = tracker.run_id
        else:
            tracker.set_tags(where)
        ev = self.folder.append("trial_started", trial=trial.trial_id, step=result["step"], node=w.info["node"],
                                host=w.info["host"], gpu=gpu, actor=w.info.get("actor"), pid=w.info.get("pid"),
                                start_cost_s=result["start_cost_s"], warm=result["warm"],
                                round_trip_s=time.perf_counter() - submitted, device=result["device"])
        self.state.apply(ev)
        self.live[trial.trial_id] = _Live(trial, spec, w, tracker, result["step"], result["step"])
        self.first_start = self.first_start or time.perf_counter()
        if not (self.interrupted or self.stop_reason):  # stopping: _assign asks for its state instead
            for _ in range(PIPELINE_DEPTH):
                self._submit_chunk(self.live[trial.trial_id])

    def _trial_params(self, trial: Trial, spec: Spec, backend: str) -> dict[str, Any]:
        return {"spec": spec.to_dict(), "spec_name": spec.name, "overrides": trial.overrides or "none",
                "varied": trial.varied or "none", "seed": trial.seed, "n_seq": self.sweep.n_seq, "backend": backend,
                "data": self.sweep.data, "steps": self.sweep.steps, "sweep_id": self.folder.sweep_id}

    def _next_boundary(self, step: int) -> int:
        sw = self.sweep
        ends = [(step // sw.metrics_every + 1) * sw.metrics_every, (step // sw.checkpoint_every + 1) * sw.checkpoint_every,
                sw.steps]
        if self.asha is not None:
            ends += [m for m in self.asha.milestones if m > step]
        return min(ends)

    def _submit_chunk(self, live: _Live) -> None:
        start = live.submitted_to
        if start >= self.sweep.steps or live.stopping:
            return
        end = self._next_boundary(start)
        keep = end % self.sweep.checkpoint_every == 0 or end == self.sweep.steps
        ref = live.worker.handle.advance.remote(end - start, keep, keep)
        self._submit(live.worker, "chunk", ref, (start, end))
        live.submitted_to = end

    def _on_chunk(self, w: _Worker, result: dict[str, Any], span: tuple[int, int]) -> None:
        live = self.live[w.trial]
        trial_id, step, metrics = live.trial.trial_id, int(result["step"]), result["metrics"]
        self.frames += (span[1] - span[0]) * self.sweep.n_seq
        value = metrics.get(self.sweep.metric)
        if metrics:
            live.tracker.log_metrics(metrics, step=step)
        self.state.apply(self.folder.append(
            "progress", durable=False, trial=trial_id, step=step, metric=value, steps_per_s=metrics.get("steps_per_s"),
            frames_per_s=metrics.get("frames_per_s"),
            metrics={k: v for k, v in metrics.items() if not k.startswith("layer")}))
        if "state" in result:
            self._save_checkpoint(live, step, result["state"], result.get("picture"))
        if step >= self.sweep.steps:
            self._end_trial(trial_id, FINISHED, None)
            return
        if self.asha is not None and self.asha.is_milestone(step) and value is not None:
            self.state.apply(self.folder.append("milestone", trial=trial_id, step=step, value=value))
            if not self.asha.record(trial_id, step, value):
                n = len(self.asha.rungs[step])
                self._end_trial(trial_id, STOPPED, f"early stop at step {step:,}: {self.sweep.metric} = {value:.4g} "
                                                   f"not in the best 1/{self.asha.rf} of {n} trials there")
                return
        if not live.stopping:
            self._submit_chunk(live)

    def _on_final(self, w: _Worker, result: dict[str, Any]) -> None:
        """The state asked for at a stop: keep it as the checkpoint, close the run KILLED, trial pending."""
        live = self.live.pop(w.trial)
        step = int(result["step"])
        if step > self.state.trials[live.trial.trial_id].checkpoint_step:
            self._save_checkpoint(live, step, result["state"], None)
        live.tracker.close("KILLED")
        self.state.apply(self.folder.append("trial_lost", trial=live.trial.trial_id, reason="sweep stopped"))
        self._free(w)

    def _save_checkpoint(self, live: _Live, step: int, state: dict[str, Any], picture: bytes | None) -> None:
        from pvm_dist.run.train import TrainConfig

        trial = live.trial
        path = self.folder.checkpoint_file(trial.trial_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        ts = self.state.trials[trial.trial_id]
        cfg = TrainConfig(spec=live.spec, steps=self.sweep.steps,
                          run_dir=self.folder.trial_dir(trial.trial_id), n_seq=self.sweep.n_seq, seed=trial.seed,
                          backend=self.sweep.backend, data=self.sweep.data, data_path=self.sweep.data_path,
                          mlflow_uri=self.mlflow_uri, experiment=self.experiment, run_name=trial.trial_id,
                          run_id=ts.run_id, overrides={k: str(v) for k, v in trial.overrides.items()},
                          metrics_every=self.sweep.metrics_every)
        checkpoint.save(path, state, {**cfg.meta(), "sweep_id": self.folder.sweep_id, "trial_id": trial.trial_id})
        self.state.apply(self.folder.append("checkpoint", trial=trial.trial_id, step=step, path=str(path)))
        live.tracker.log_artifact(path, "checkpoints")
        if picture:
            pic = self.folder.trial_dir(trial.trial_id) / "pictures" / f"step_{step:09d}.png"
            pic.parent.mkdir(parents=True, exist_ok=True)
            pic.write_bytes(picture)
            live.tracker.log_artifact(pic, "pictures")

    def _trial_error(self, w: _Worker, exc: Exception) -> None:
        cause = getattr(exc, "cause", None) or exc
        reason = f"{type(cause).__name__}: {cause}".splitlines()[0][:500]
        self._end_trial(w.trial, FAILED, reason, failure=True)

    def _end_trial(self, trial_id: str, status: str, reason: str | None, failure: bool = False) -> None:
        live = self.live.pop(trial_id, None)
        ts = self.state.trials[trial_id]
        if live is not None:
            if reason:
                live.tracker.set_tags({"status_reason": reason, "sweep_status": status})
            else:
                live.tracker.set_tags({"sweep_status": status})
            live.tracker.close(FAILED if status == FAILED else "FINISHED")
        self.state.apply(self.folder.append("trial_ended", trial=trial_id, status=status, reason=reason, step=ts.step,
                                            metric=ts.metric))
        for w in self.workers:
            if w.trial == trial_id:
                self._free(w)
        if failure:
            self._count_failure(f"trial {trial_id}: {reason}")

    def _free(self, w: _Worker) -> None:
        w.trial = None
        w.epoch += 1

    def _worker_lost(self, w: _Worker, exc: Exception) -> None:
        """A worker died (process killed, node gone): its trial goes back to the queue; start a replacement."""
        w.dead = True
        w.calls.clear()
        trial_id = w.trial
        first_line = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        if trial_id is not None:
            live = self.live.pop(trial_id, None)
            if live is not None:
                live.tracker.close("KILLED")  # reopened (same run) when the trial continues
            ts = self.state.trials[trial_id]
            self.state.apply(self.folder.append("trial_lost", trial=trial_id, reason=f"worker lost: {first_line}",
                                                step=ts.step, checkpoint_step=ts.checkpoint_step))
            if not (self.interrupted or self.stop_reason):
                self.queue.appendleft(trial_id)
        w.trial = None
        self._count_failure(f"worker {w.index} on {w.where} lost: {first_line}")
        if self.stop_reason is None and not self.interrupted:
            self._add_worker()

    def _count_failure(self, what: str) -> None:
        self.session_failures += 1
        self.state.apply(self.folder.append("failure", what=what))
        if self.session_failures > self.sweep.max_failures and self.stop_reason is None:
            self.stop_reason = (f"failure budget spent: {self.session_failures} failures > max_failures "
                                f"{self.sweep.max_failures} (last: {what})")

    # ---- the end ----------------------------------------------------------------------------------
    def _shutdown(self) -> None:
        import ray

        for live in list(self.live.values()):  # an unexpected error: close what is open
            live.tracker.close("KILLED")
        self.live.clear()
        for w in self.workers:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(w.handle)

    def _outcome(self) -> SweepOutcome:
        st = self.state
        if self.interrupted:
            status, reason = "INTERRUPTED", "stopped by a signal"
        elif self.stop_reason is not None:
            status, reason = "FAILED", self.stop_reason
        else:
            status, reason = "FINISHED", None
        best = self.best()
        self.folder.append("sweep_ended", status=status, reason=reason, best=best and best["trial_id"])
        st.status, st.reason = status, reason
        if best is not None:
            self.parent.log_metrics({f"best_{self.sweep.metric}": best["metric"]}, step=self.sweep.steps)
            self.parent.set_tags({"best_trial": best["trial_id"], "best_run_id": best.get("run_id") or ""})
        self.parent.close({"FINISHED": "FINISHED", "FAILED": "FAILED"}.get(status, "KILLED"))
        now = time.perf_counter()
        seconds, training_s = now - self.t0, now - (self.first_start or now)
        warm = [c for t in st.trials.values() for c in t.start_cost_s]
        return SweepOutcome(
            sweep_id=self.folder.sweep_id, folder=self.folder.path, status=status, reason=reason, best=best,
            trials=[self.trial_row(t) for t in self.trials], parent_run_id=self.parent.run_id,
            mlflow_uri=self.mlflow_uri, experiment=self.experiment, seconds=seconds, frames=self.frames,
            frames_per_s=self.frames / training_s if training_s > 0 else 0.0, warm_start_s=sum(warm) / len(warm) if warm else None,
            workers=[{"index": w.index, "where": w.where, "dead": w.dead} for w in self.workers])

    def best(self) -> dict[str, Any] | None:
        done = [t for t in self.state.trials.values() if t.status == FINISHED and t.metric is not None
                and math.isfinite(t.metric)]
        if not done:
            return None
        pick = min(done, key=lambda t: t.metric if self.sweep.mode == "min" else -t.metric)
        return self.trial_row(pick.trial_id)

    def trial_row(self, trial_id: str) -> dict[str, Any]:
        t, ts = self.trials[trial_id], self.state.trials[trial_id]
        return {"trial_id": trial_id, "varied": t.varied, "status": ts.status, "step": ts.step, "metric": ts.metric,
                "frames_per_s": ts.frames_per_s, "run_id": ts.run_id, "checkpoint_step": ts.checkpoint_step,
                "starts": ts.starts, "gpu": ts.gpu, "node": ts.node, "reason": ts.reason}


# ---- entry points -----------------------------------------------------------------------------------

def connect(address: str | None) -> None:
    """Join the Ray cluster at ``address`` (``auto``, ``host:port``, ``ray://host:port``) or start a local one."""
    import ray

    if ray.is_initialized():
        return
    if address not in (None, "auto"):
        _probe(address)
    kwargs: dict[str, Any] = {"logging_level": "WARNING", "log_to_driver": False}
    # A Ray Client server starts a server process per client; on a busy head that can fail once.
    attempts = CLIENT_CONNECT_ATTEMPTS if address and address.startswith("ray://") else 1
    for attempt in range(1, attempts + 1):
        try:
            if address is None:
                ray.init(include_dashboard=False, **kwargs)
            else:
                ray.init(address=address, **kwargs)
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises many kinds here; the user needs one line
            if attempt < attempts and isinstance(exc, ConnectionError):
                time.sleep(2.0 * attempt)
                continue
            where = address or "a local Ray instance"
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            said = lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}"  # the cause is often last
            raise SweepRunError(f"cannot connect to Ray at {where}: {type(exc).__name__}: {said}") from None


def _probe(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, with one line, when nothing listens at a cluster address (Ray itself retries for minutes)."""
    hostport = address.removeprefix("ray://").rsplit("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise SweepRunError(f"--address {address!r}: expected auto, HOST:PORT or ray://HOST:PORT")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise SweepRunError(f"cannot reach a Ray cluster at {address}: {exc.strerror or exc}") from None


def run_sweep(sweep: SweepSpec, opts: DriverOptions, sweep_id: str | None = None) -> SweepOutcome:
    """Start a new sweep: connect, create its folder and journal, then run it."""
    trials = sweep.plan()
    connect(opts.address)
    folder = SweepFolder.create(opts.root, sweep_id or new_sweep_id(sweep.name), sweep.to_dict(),
                                [t.to_dict() for t in trials])
    driver = Driver(folder, sweep, trials, opts, folder.state())
    return driver.run()


def resume_sweep(sweep_id: str, opts: DriverOptions) -> SweepOutcome:
    """Continue a sweep from its journal: finished trials stay, the rest continue from their checkpoints."""
    folder = SweepFolder.open(opts.root, sweep_id)
    definition = folder.definition()
    sweep = load_sweep(definition["sweep"])
    trials = [Trial.from_dict(t) for t in definition["trials"]]
    state = folder.state()
    if not state.unfinished():
        raise SweepRunError(f"sweep {sweep_id} has no unfinished trials (it ended {state.status}); "
                            f"see pvm-dist sweep status {sweep_id}")
    connect(opts.address)
    driver = Driver(folder, sweep, trials, opts, state)
    return driver.run()
