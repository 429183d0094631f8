"""The sweep driver: wires a scheduling policy to an executor and records everything a sweep does.

- :mod:`pvm_dist.sweep.executor` runs trials on Ray worker actors (one per GPU, or CPU workers) and
  reports typed events; :mod:`pvm_dist.sweep.scheduler` decides, result by result, whether a trial
  goes on (FIFO, or ASHA early stopping) and where chunks must end; :mod:`pvm_dist.sweep.source` gives
  new trials (an adaptive search asks Optuna as workers free up). The driver's loop gives free workers
  the next pending trial, else a new one from the trial source, and acts on each event;
- it writes every event to the sweep journal (:mod:`pvm_dist.sweep.journal`) before acting on it, so a
  killed driver loses nothing that ``pvm-dist sweep resume`` cannot continue;
- it keeps each trial's checkpoints in the sweep folder (the state comes back from the worker through
  Ray's object store; :mod:`pvm_dist.sweep.checkpoints` writes it on a thread, the last few and the best,
  one copy each) and logs metrics, pictures and the checkpoint's path to the trial's nested MLflow run;
  the driver is the only MLflow writer, and its trackers write one at a time (one SQLite writer); trials'
  runs open on a thread beside the loop, so a slow store never holds up scheduling;
- PBT (:mod:`pvm_dist.sweep.pbt`): a member the policy tells to exploit continues from a copy of its
  donor's checkpoint with the explored values (journaled first, lineage tagged on its MLflow run); one
  told to pause gives its worker to the member furthest behind (its MLflow run stays open meanwhile);
- a lost worker's trial goes back to the queue, to continue from its last checkpoint on a replacement
  worker; a failing trial (it diverged) fails with its reason; every failure counts against the
  sweep's failure budget, which, once spent, stops the sweep;
- on Ctrl-C (SIGINT/SIGTERM) it checkpoints the running trials, closes their runs as KILLED and returns
  INTERRUPTED so the CLI prints the resume command.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

from pvm_dist.io import checkpoint
from pvm_dist.run import state as run_state
from pvm_dist.run.config import RunConfig
from pvm_dist.run.signals import stop_on_signals
from pvm_dist.run.state import RunState
from pvm_dist.sweep import pbt
from pvm_dist.sweep.executor import (ChunkDone, EngineUnavailable, Event, Executor, FinalState, SweepRunError, TrialError,
                                     TrialStarted, WorkerLost, cluster_resources, connect)
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
from pvm_dist.sweep import pool
from pvm_dist.sweep.lineage import population_history
from pvm_dist.sweep.pool import Demand
from pvm_dist.sweep.checkpoints import BEST, CheckpointStore
from pvm_dist.sweep.plan import SweepSpec, Trial, load_sweep
from pvm_dist.sweep.scheduler import Action, ChunkPlan, Decision, make_scheduler
from pvm_dist.sweep.source import make_source
from pvm_dist.tracking.compare import label
from pvm_dist.tracking.images import log_image_series
from pvm_dist.tracking.keep_once import keep_once
from pvm_dist.tracking.owner import LOCK_FILE, holding
from pvm_dist.tracking.sync import end_if_running, sync_paths
from pvm_dist.tracking.tracker import Tracker, default_tracking_uri, run_tags

POLL_S = 0.25
OPENING_POLL_S = 0.02  # while trials' runs open: take them up soon after
def run_opener() -> futures.Executor:
    """Where trials' MLflow runs open: one thread beside the loop (tests swap in one that runs them at once)."""
    return futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pvm-open")


#: Pending trials but no worker up for this long: give up. Generous: a GPU node's boot, image pull and
#: build take minutes on a cloud autoscaler (``--worker-wait`` changes it).
NO_WORKER_TIMEOUT_S = 1800.0
WAIT_NOTICE_S = 10.0  # no worker up for this long: say what the sweep waits for

__all__ = ["Driver", "DriverOptions", "SweepOutcome", "SweepRunError", "resume_sweep", "run_sweep"]


@dataclasses.dataclass
class DriverOptions:
    """How to run a sweep (the sweep file says what to run)."""

    address: str | None = None  # Ray cluster; None: start a local one
    mlflow_uri: str | None = None
    experiment: str | None = None  # default: the sweep's name
    max_concurrent: int | None = None
    root: Path = DEFAULT_ROOT
    no_worker_timeout_s: float = NO_WORKER_TIMEOUT_S
    retry_failed: bool = False  # resume: FAILED trials run again (from their last checkpoint) in their runs
    on_update: Callable[[Driver], None] | None = None  # called about every POLL_S (the live table)
    on_notice: Callable[[str], None] | None = None  # one-line news: the pool's kind, what it waits for


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
    longest_block_s: float = 0.0  # the scheduling loop's longest stretch of work between waits for results
    longest_block_parts: str = ""  # its three longest parts, e.g. "ChunkDone 12 ms, assign 3 ms, ..."
    longest_run_open_s: float = 0.0  # the longest opening of a trial's MLflow run (on a thread, off the loop)
    checkpoints_dropped: int = 0  # superseded by a newer state of the trial before they were written
    experiment_id: str | None = None  # the MLflow experiment of the sweep's runs (None: the tracker never reached)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["folder"] = str(self.folder)
        return out


@dataclasses.dataclass
class _Live:
    """A started trial: its run configuration and its open MLflow run."""

    trial: Trial
    config: RunConfig
    tracker: Tracker
    stopping: bool = False  # the sweep stops: its final state is asked for


class Driver:
    """Runs one sweep to the end (or until stopped); see the module docstring."""

    def __init__(self, folder: SweepFolder, sweep: SweepSpec, trials: list[Trial], opts: DriverOptions,
                 state: SweepState) -> None:
        self.folder, self.sweep, self.opts = folder, sweep, opts
        self.trials = {t.trial_id: t for t in trials}
        self.state = state
        self.live: dict[str, _Live] = {}
        self.queue: deque[str] = deque(t for t in self.trials if state.trials[t].status not in FINAL_STATUSES)
        for t in self.queue:  # RUNNING in the journal = unfinished when the driver died
            state.trials[t].status, state.trials[t].step = PENDING, state.trials[t].checkpoint_step
        if sweep.search is not None and sweep.search.type == "pbt":
            pbt.finish_copies(folder, state)
            self.scheduler = pbt.PopulationBasedTraining(
                sweep, {t: tr.varied for t, tr in self.trials.items()}, state.rungs,
                lambda t: self.state.trials[t].status not in FINAL_STATUSES,
                lambda step: any(self.state.trials[t].step <= step for t in self.queue), len(state.exploits))
        else:
            self.scheduler = make_scheduler(sweep, state.rungs)
        self.source = make_source(sweep, folder.path, self.trials, state)
        self.executor = Executor(sweep, ChunkPlan.of(sweep, self.scheduler))
        self.session_failures = 0
        self.stop_reason: str | None = None
        self.interrupted = False
        self.frames = 0
        self.t0 = time.perf_counter()
        self.first_start: float | None = None  # when the first trial of this session started training
        self.mlflow_uri = opts.mlflow_uri or state.mlflow_uri or default_tracking_uri()
        self.experiment = opts.experiment or state.experiment or sweep.name
        self.parent: Tracker | None = None
        self._waiting_since: float | None = None
        self._waiting_said = False  # the wait for a first worker was announced
        self.demand: Demand | None = None
        self.waiting: str | None = None  # what the sweep waits for (no worker up yet), for the live table
        best = {t: (s.best_step, s.best_metric) for t, s in state.trials.items() if s.best_metric is not None}
        self.checkpoints = CheckpointStore(folder.trial_dir, sweep.run.keep_checkpoints, sweep.better, best)
        self._closing: dict[str, threading.Thread] = {}  # trial -> its run being closed
        self._parked: dict[str, _Live] = {}  # PBT members waiting for a worker, their runs open
        self._pictures: dict[str, list[futures.Future[None]]] = {}  # trial -> its pictures being logged
        # Trials' MLflow runs open on a thread (store round trips, a data digest), one at a time as the store
        # creates them: trial -> (its opening, its start event, its config).
        self._opener = run_opener()
        self._opening: dict[str, tuple[futures.Future[Tracker], TrialStarted, RunConfig, bool]] = {}  # ..., new run
        self.longest_block_s = 0.0  # the loop's longest stretch of work between waits for results
        self.longest_block_parts = ""  # what took longest in it (for a benchmark's reader)
        self.longest_run_open_s = 0.0  # the longest opening of a trial's run (off the loop)

    # ---- the loop ---------------------------------------------------------------------------------
    def run(self) -> SweepOutcome:
        """Run until every trial is final, the failure budget is spent, or a stop signal arrives."""
        self._plan_pool()
        self._start_tracking()
        with stop_on_signals() as should_stop:
            try:
                while True:
                    t0 = time.perf_counter()
                    self.interrupted = self.interrupted or should_stop()
                    if not self._busy():
                        break
                    parts: list[tuple[str, float]] = []
                    synced = self.folder.fsync_s
                    for step in (self._journal_checkpoints, self._take_opened, self._assign, self._size_pool,
                                 self._check_stalled):
                        parts.append(_timed(step.__name__.lstrip("_"), step))
                    t1 = time.perf_counter()
                    events = self.executor.poll(OPENING_POLL_S if self._opening else POLL_S)
                    t2 = time.perf_counter()
                    for event in events:
                        parts.append(_timed(type(event).__name__, lambda: self._handle(event)))
                    if self.opts.on_update:
                        parts.append(_timed("on_update", lambda: self.opts.on_update(self)))
                    parts.append(("of which journal fsyncs", self.folder.fsync_s - synced))
                    block = max(t1 - t0, time.perf_counter() - t2)
                    if block > self.longest_block_s:
                        self.longest_block_s = block
                        self.longest_block_parts = ", ".join(f"{name} {1e3 * sec:.0f} ms" for name, sec in
                                                             sorted(parts, key=lambda p: -p[1])[:3])
            finally:
                self._shutdown()
        return self._outcome()

    def _stopping(self) -> bool:
        return self.interrupted or self.stop_reason is not None

    def _busy(self) -> bool:
        if self._stopping():
            return self.executor.has_trials()  # drain: wait for the running trials' final states
        return bool(self.queue) or self.executor.has_trials() or self.source.remaining() > 0

    def _assign(self) -> None:
        """Give idle workers the next pending trials; on a stop, ask running trials for their state instead."""
        if self._stopping():
            for live in self.live.values():
                if not live.stopping:
                    live.stopping = True
                    self.executor.request_state(live.trial.trial_id)
            return
        for index in self.executor.idle_workers():
            if not self.queue and not self._add_trial():
                return
            self._start_trial(self._next_queued(), index)

    def _next_queued(self) -> str:
        """The next pending trial: the queue's first, or for PBT the member furthest behind (members take turns)."""
        if not isinstance(self.scheduler, pbt.PopulationBasedTraining):
            return self.queue.popleft()
        pick = min(self.queue, key=lambda t: self.state.trials[t].step)  # the first of equals: queue order
        self.queue.remove(pick)
        return pick

    def _add_trial(self) -> bool:
        """Ask the trial source for a new trial; journal it (before it starts) and queue it."""
        trial = self.source.ask()
        if trial is None:
            return False
        self.trials[trial.trial_id] = trial
        self.state.apply(self.folder.append("trial_added", trial=trial.trial_id, definition=trial.to_dict()))
        self.queue.append(trial.trial_id)
        return True

    def _plan_pool(self) -> None:
        """Decide what a worker claims (:mod:`pvm_dist.sweep.pool`); say up front when the sweep runs on CPUs."""
        cluster = self.executor.cluster_resources()
        try:
            self.demand = pool.decide(self.sweep.resources, cluster, local=self.opts.address is None)
        except ValueError as exc:
            raise SweepRunError(str(exc)) from None
        self.executor.use(self.demand)
        run = self.sweep.run  # the last keep_checkpoints and the best of each trial
        note = run_state.disk_note(run, run.keep_checkpoints + 1, len(self.trials), str(self.folder.path))
        if note:
            self._notice(note)
        d = self.demand
        note = run.readout_note("each trial") if d.gpus else None
        if note:
            self._notice(note)
        self.folder.append("pool", gpus=d.gpus, cpus=d.cpus, limit=d.limit, asked=d.asked, cluster=cluster)
        if not d.gpus:
            self._notice(f"no GPU in the cluster: trials run on up to {d.limit} CPU worker(s) of {d.cpus:g} CPU; on an "
                         f"autoscaling cluster whose GPU nodes start at 0, set resources.gpus_per_actor (or "
                         f"trials_per_gpu) so the sweep asks for them")
        self._size_pool()  # the first workers (Ray exports the worker class with the first: ~0.2 s) before the loop

    def _size_pool(self) -> None:
        """Keep one worker per trial that could run (pending actors ask the autoscaler for nodes); release
        the rest, those not placed yet first, then idle ones."""
        if self._stopping() or self.demand is None:
            return
        alive = self.executor.alive()
        running = sum(1 for w in alive if w.busy)
        want = pool.wanted(self.demand, self.opts.max_concurrent or self.sweep.max_concurrent,
                           len(self.queue) + self.source.remaining(), running)
        for _ in range(want - len(alive)):
            self.executor.add_worker()
        spare = sorted((w for w in alive if not w.up or w.idle), key=lambda w: w.up)  # not placed yet first
        for w in spare[:max(len(alive) - want, 0)]:
            self.executor.retire(w.index)

    def _check_stalled(self) -> None:
        """Pending trials and no worker up: say what the sweep waits for; after the wait, stop with a reason."""
        if not (self.queue or self.source.remaining()) or self.live or self.executor.workers_up():
            self._waiting_since, self.waiting, self._waiting_said = None, None, False
            return
        now = time.monotonic()
        self._waiting_since = self._waiting_since or now
        what = self.demand.describe() if self.demand else "a worker"
        self.waiting = (f"waiting for a node with {what} free for a pvm-dist worker "
                        f"({now - self._waiting_since:.0f} s of {self.opts.no_worker_timeout_s:.0f} s"
                        + ("; pending workers ask the autoscaler for GPU nodes)" if self.demand and self.demand.gpus
                           else ")"))
        if not self._waiting_said and now - self._waiting_since >= WAIT_NOTICE_S:
            self._waiting_said = True
            self._notice(self.waiting)
        if now - self._waiting_since > self.opts.no_worker_timeout_s:
            self.stop_reason = (f"no worker could start for {self.opts.no_worker_timeout_s:.0f} s: no node of the "
                                f"cluster had {what} free for a pvm-dist worker")

    def _notice(self, line: str) -> None:
        if self.opts.on_notice:
            self.opts.on_notice(line)

    def _handle(self, event: Event) -> None:
        match event:
            case TrialStarted():
                self._on_started(event)
            case ChunkDone():
                self._on_chunk(event)
            case FinalState():
                self._on_final(event)
            case TrialError():
                self._end_trial(event.trial_id, FAILED, event.reason, failure=True)
            case EngineUnavailable():
                self.stop_reason = self.stop_reason or f"{event.reason}; no trial was started with it"
            case WorkerLost():
                self._on_worker_lost(event)

    # ---- trial events -----------------------------------------------------------------------------
    def _start_trial(self, trial_id: str, worker: int) -> None:
        state = None
        self.checkpoints.wait(trial_id)  # a lost trial's last checkpoint may still be on its way to disk
        self._journal_checkpoints()
        if self.state.trials[trial_id].checkpoint_step:
            try:
                state = run_state.load(self.folder.checkpoint_file(trial_id))[0].to_dict()
            except (checkpoint.CheckpointError, OSError) as exc:
                self._end_trial(trial_id, FAILED, f"cannot continue from its checkpoint: {exc}", failure=True)
                return
        self.executor.start_trial(worker, self.trials[trial_id], state)

    def _on_started(self, ev: TrialStarted) -> None:
        """Open (or reopen) the trial's MLflow run on a thread; :meth:`_take_opened` goes on once it is open."""
        trial, ts, w = self.trials[ev.trial_id], self.state.trials[ev.trial_id], ev.worker
        where = {"sweep_id": self.folder.sweep_id, "trial_id": trial.trial_id, "node": w.node, "worker_host": w.host,
                 "gpu": w.gpu}
        closing = self._closing.pop(trial.trial_id, None)
        parked = self._parked.pop(trial.trial_id, None)
        config = self.sweep.trial_config(trial)
        run_id, parent_run_id = ts.run_id, self.parent.run_id
        params = self._trial_params(trial, config) if run_id is None else None

        def open_run() -> Tracker:
            t0 = time.perf_counter()
            if parked is not None:  # a PBT member back from a pause: its run is still open
                parked.tracker.set_tags(where)
                return parked.tracker
            if closing is not None:  # reopened after a loss: its last session ends first
                closing.join()
            tracker = Tracker.start(self.mlflow_uri, self.experiment,
                                    run_name=f"{label(trial.varied)} ({trial.trial_id})".strip(), run_id=run_id,
                                    parent_run_id=parent_run_id,
                                    tags=run_tags(ev.backend, ev.device, {**where, "pvm_dist.command": config.command()}),
                                    fallback_dir=self.folder.trial_dir(trial.trial_id) / "tracking-fallback",
                                    run_key=f"{self.folder.sweep_id}/{trial.trial_id}", inputs=config.datasets())
            if params is not None:
                tracker.log_params(params)
            else:
                tracker.set_tags(where)
            self.longest_run_open_s = max(self.longest_run_open_s, time.perf_counter() - t0)
            return tracker

        self._opening[trial.trial_id] = (self._opener.submit(open_run), ev, config, parked is None)

    def _take_opened(self) -> None:
        """Trials whose runs are open: journal their start and feed them chunks."""
        for trial_id, (opening, ev, config, opened) in list(self._opening.items()):
            if opening.done():
                del self._opening[trial_id]
                self._opened(ev, config, opening.result(), opened)

    def _abandon_opening(self, trial_id: str) -> _Live | None:
        """A trial that ends or loses its worker while its run opens: its run, once open, to be closed."""
        entry = self._opening.pop(trial_id, None)
        if entry is None:
            return None
        opening, _, config, _ = entry
        return _Live(self.trials[trial_id], config, opening.result())

    def _opened(self, ev: TrialStarted, config: RunConfig, tracker: Tracker, opened: bool) -> None:
        """``opened``: the tracker is new (not a paused member's, which has delivered what it logged)."""
        trial, ts, w = self.trials[ev.trial_id], self.state.trials[ev.trial_id], ev.worker
        if ts.run_id is None and tracker.run_id:
            self.folder.append("trial_run", trial=trial.trial_id, run_id=tracker.run_id)
            ts.run_id = tracker.run_id
        for step, (stamp, metrics) in ts.logged.items() if opened else ():  # a restart: what the last tracker may
            tracker.log_metrics(metrics, step=step, timestamp=stamp)  # not have delivered (MLflow keeps one copy)
        tracker.set_tags({"checkpoint": str(self.folder.checkpoint_file(trial.trial_id)),  # the file, not a copy
                          "checkpoint_best": str(self.folder.trial_dir(trial.trial_id) / BEST)})
        self.state.apply(self.folder.append(
            "trial_started", trial=trial.trial_id, step=ev.step, node=w.node, host=w.host, gpu=w.gpu, actor=w.actor,
            pid=w.pid, start_cost_s=ev.start_cost_s, warm=ev.warm, round_trip_s=ev.round_trip_s, device=ev.device))
        self.live[trial.trial_id] = _Live(trial, config, tracker)
        self.first_start = self.first_start or time.perf_counter()
        if not self._stopping():  # stopping: _assign asks for its state instead
            self.executor.feed(trial.trial_id)

    def _trial_params(self, trial: Trial, config: RunConfig) -> dict[str, Any]:
        """What ``train`` logs for the same run configuration, plus what the sweep varied."""
        return {**config.params(), "varied": trial.varied or "none", "sweep_id": self.folder.sweep_id}

    def _on_chunk(self, ev: ChunkDone) -> None:
        """Log and journal the chunk's metrics, keep its checkpoint, then finish, stop or feed the trial."""
        live, trial_id, step = self.live[ev.trial_id], ev.trial_id, ev.step
        self.frames += ev.n_steps * live.config.n_seq
        redone = step in self.state.trials[trial_id].logged  # a restarted trial redoes the steps after its checkpoint
        record = self.folder.append(
            "progress", durable=False, trial=trial_id, step=step, metric=ev.metrics.get(self.sweep.metric),
            steps_per_s=ev.metrics.get("steps_per_s"), frames_per_s=ev.metrics.get("frames_per_s"),
            metrics=ev.metrics)
        self.state.apply(record)
        if ev.metrics and not redone:  # redone steps were sent again (as first logged) when the trial restarted
            live.tracker.log_metrics(ev.metrics, step=step, timestamp=int(record["time"] * 1000))
        if ev.earlier is not None:  # a checkpoint the worker handed over while it trained on
            at, fetch = ev.earlier
            logged = self.state.trials[trial_id].logged.get(at)
            self._save_checkpoint(live, at, fetch, logged[1].get(self.sweep.metric) if logged else None)
        if ev.state is not None:
            self._save_checkpoint(live, step, ev.state, ev.metrics.get(self.sweep.metric))
        if ev.picture:
            self._keep_picture(live, step, ev.picture)
        if ev.heldout:
            live.tracker.log_metrics(ev.heldout, step=step)
        if ev.gif:
            self._keep_artifact(live, "prediction.gif", ev.gif, None)
        if step >= live.config.steps:
            self._end_trial(trial_id, FINISHED, None)
            return
        decision = self.scheduler.on_result(trial_id, step, ev.metrics)
        if decision.recorded is not None:
            self.state.apply(self.folder.append("milestone", trial=trial_id, step=step, value=decision.recorded))
            self.source.report(trial_id, step, decision.recorded)
        if decision.action is Action.STOP:
            self._end_trial(trial_id, STOPPED, decision.reason)
        elif decision.action is Action.EXPLOIT:
            self._exploit(trial_id, step, decision)
        elif decision.action is Action.PAUSE:
            self._pause(trial_id, step, decision.reason)
        elif not self._stopping():
            self.executor.feed(trial_id)

    def _exploit(self, trial_id: str, step: int, decision: Decision) -> None:
        """PBT: the member's copy of the donor's checkpoint is staged, the exploit journaled, the copy put in place
        of the member's checkpoint, and the member queued to continue from it with its new values."""
        assert decision.donor is not None and decision.values is not None
        for written in (decision.donor, trial_id):  # on disk and journaled first: the copy is the donor's latest,
            self.checkpoints.wait(written)  # and no queued write of the member's lands over it afterwards
        self._journal_checkpoints()
        live, ts = self.live.pop(trial_id), self.state.trials[trial_id]
        trial = self.sweep.make_trial(trial_id, live.trial.spec, decision.values)
        config = self.sweep.trial_config(trial).replace(track=True, mlflow_uri=self.mlflow_uri,
                                                        experiment=self.experiment, run_id=ts.run_id)
        donor_step = pbt.stage_copy(self.folder, trial_id, decision.donor, config)
        self.state.apply(self.folder.append("exploit", trial=trial_id, donor=decision.donor, step=donor_step,
                                            at_step=step, values=trial.varied, definition=trial.to_dict(),
                                            reason=decision.reason))
        pbt.put_copy_in_place(self.folder, trial_id)
        self.trials[trial_id] = trial
        lineage = [{k: e[k] for k in ("at_step", "donor", "step", "values")} for e in self.state.exploits
                   if e["trial"] == trial_id]
        live.tracker.set_tags({"pbt_exploits": len(lineage), "pbt_donor": decision.donor, "pbt_values": trial.varied,
                               "pbt_lineage": json.dumps(lineage)})
        self._parked[trial_id] = dataclasses.replace(live, trial=trial, config=config)  # its run goes on with the copy
        self.executor.release(trial_id)
        if not self._stopping():
            self.queue.appendleft(trial_id)

    def _pause(self, trial_id: str, step: int, reason: str | None) -> None:
        """PBT: the member's worker goes to a waiting member; it continues from this step's checkpoint (handed to
        the writer with this chunk) when its turn comes, in the same, still open, MLflow run."""
        self._parked[trial_id] = self.live.pop(trial_id)
        self.state.apply(self.folder.append("trial_paused", trial=trial_id, step=step, reason=reason))
        self.executor.release(trial_id)
        if not self._stopping():
            self.queue.append(trial_id)

    def _on_final(self, ev: FinalState) -> None:
        """The state asked for at a stop: keep it as the checkpoint, close the run KILLED, trial pending."""
        live = self.live.pop(ev.trial_id)
        if ev.step > self.state.trials[ev.trial_id].checkpoint_step:
            self._save_checkpoint(live, ev.step, ev.state)
        self._close_run(live, "KILLED")
        self.state.apply(self.folder.append("trial_lost", trial=ev.trial_id, reason="sweep stopped"))
        self.executor.release(ev.trial_id)

    def _save_checkpoint(self, live: _Live, step: int, state: dict[str, Any] | Callable[[], dict[str, Any]],
                         metric: float | None = None) -> None:
        """Hand the trial's checkpoint (with its run configuration and MLflow run) to the writer thread, which
        journals nothing: :meth:`_journal_checkpoints` does once it is on disk. ``state`` may be a function that
        fetches it (a state handed over later): the writer calls it, so its bytes never cross the loop."""
        trial = live.trial
        ts = self.state.trials[trial.trial_id]
        config = live.config.replace(track=True, mlflow_uri=self.mlflow_uri, experiment=self.experiment, run_id=ts.run_id)

        def kept(d: dict[str, Any]) -> RunState:
            return RunState(d["engine"], d["readout"], config, d.get("metrics") or {})

        extra = {"sweep_id": self.folder.sweep_id, "trial_id": trial.trial_id}
        self.checkpoints.submit(trial.trial_id, step, (lambda: kept(state())) if callable(state) else kept(state),
                                extra, metric)

    def _keep_picture(self, live: _Live, step: int, picture: bytes) -> None:
        """The picture of a checkpoint step: kept in the trial's folder, logged to its run as an image series (its
        files made on the runs' thread: tens of milliseconds that the loop does not wait for)."""
        self._keep_artifact(live, f"step_{step:09d}.png", picture, "pictures")
        trial_id, folder = live.trial.trial_id, self.folder.trial_dir(live.trial.trial_id)
        logging = self._opener.submit(log_image_series, live.tracker, folder / "pictures" / f"step_{step:09d}.png", step,
                                      folder / "tracking-images")
        self._pictures[trial_id] = [f for f in self._pictures.get(trial_id, []) if not f.done()] + [logging]

    def _close_run(self, live: _Live, status: str, publish: bool = False) -> None:
        """End the trial's MLflow run on a thread: delivering its last metrics to a slow server takes seconds
        that the scheduling loop must not wait for (joined when the sweep ends). ``publish``: first put the
        trial's final checkpoint among the run's artifacts, once (a hard link where the store is local)."""
        trial_id, tracker = live.trial.trial_id, live.tracker
        pictures = self._pictures.pop(trial_id, [])

        def close() -> None:
            futures.wait(pictures)  # its last pictures are logged before the run ends
            if publish and self.checkpoints.wait(trial_id) and self.folder.checkpoint_file(trial_id).exists():
                keep_once(tracker, self.folder.checkpoint_file(trial_id), "checkpoints")
            tracker.close(status)

        thread = threading.Thread(target=close, name=f"pvm-close-{trial_id}")
        thread.start()
        self._closing[trial_id] = thread

    def _journal_checkpoints(self) -> None:
        """Journal the checkpoints the writer thread has finished (the journal names only complete files)."""
        for w in self.checkpoints.take_written():
            if w.error:
                self.folder.append("checkpoint_failed", trial=w.trial_id, step=w.step, reason=w.error)
                self._notice(f"trial {w.trial_id}: checkpoint at step {w.step:,} not written: {w.error}")
                continue
            self.state.apply(self.folder.append("checkpoint", trial=w.trial_id, step=w.step, path=str(w.path),
                                                best=w.best, metric=w.metric, seconds=round(w.seconds, 3)))

    def _keep_artifact(self, live: _Live, name: str, data: bytes, artifact_path: str | None) -> None:
        """A file the worker sent, kept in the trial's folder and logged to its run."""
        path = self.folder.trial_dir(live.trial.trial_id) / (artifact_path or "") / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        live.tracker.log_artifact(path, artifact_path)

    def _end_trial(self, trial_id: str, status: str, reason: str | None, failure: bool = False) -> None:
        """Close the trial's run, journal its final status, free its worker; a failure counts."""
        live = self.live.pop(trial_id, None) or self._abandon_opening(trial_id) or self._parked.pop(trial_id, None)
        ts = self.state.trials[trial_id]
        if live is not None:
            live.tracker.set_tags({"status_reason": reason or "", "sweep_status": status})
            self._close_run(live, FAILED if status == FAILED else "FINISHED", publish=status != FAILED)
        self.state.apply(self.folder.append("trial_ended", trial=trial_id, status=status, reason=reason, step=ts.step,
                                            metric=ts.metric))
        self.source.tell(trial_id, status, ts.metric)
        self.executor.release(trial_id)
        if failure:
            self._count_failure(f"trial {trial_id}: {reason}")

    def _on_worker_lost(self, ev: WorkerLost) -> None:
        """A worker died (process killed, node gone): its trial goes back to the queue; start a replacement."""
        if ev.trial_id is not None:
            self.checkpoints.wait(ev.trial_id)  # rare: the journal then names the checkpoint it continues from
            self._journal_checkpoints()
            live = self.live.pop(ev.trial_id, None) or self._abandon_opening(ev.trial_id)
            if live is not None:
                self._close_run(live, "KILLED")  # reopened (same run) when the trial continues
            ts = self.state.trials[ev.trial_id]
            self.state.apply(self.folder.append("trial_lost", trial=ev.trial_id, reason=f"worker lost: {ev.reason}",
                                                step=ts.step, checkpoint_step=ts.checkpoint_step))
            if not self._stopping():
                self.queue.appendleft(ev.trial_id)
        self._count_failure(f"worker {ev.index} on {ev.where} lost: {ev.reason}")  # _size_pool replaces it

    def _count_failure(self, what: str) -> None:
        self.session_failures += 1
        self.state.apply(self.folder.append("failure", what=what))
        if self.session_failures > self.sweep.max_failures and self.stop_reason is None:
            self.stop_reason = (f"failure budget spent: {self.session_failures} failures > max_failures "
                                f"{self.sweep.max_failures} (last: {what})")

    # ---- tracking and the end ---------------------------------------------------------------------
    def _start_tracking(self) -> None:
        """Open (or, on a resume, reopen) the sweep's parent MLflow run and journal the driver's start."""
        resuming = self.state.parent_run_id is not None
        self.parent = Tracker.start(self.mlflow_uri, self.experiment, run_name=self.folder.sweep_id,
                                    run_id=self.state.parent_run_id,
                                    tags=run_tags(extra={"sweep_id": self.folder.sweep_id, "pvm_dist.role": "sweep",
                                                         "mlflow.note.content": self.sweep.description or self.sweep.name}),
                                    fallback_dir=self.folder.path / "tracking-fallback", run_key=self.folder.sweep_id)
        if not resuming:
            self.parent.log_params({"sweep": self.sweep.to_dict(), "n_trials": len(self.trials)})
            self.parent.log_dict(self.folder.definition(), "sweep.json")
        self.folder.append("sweep_started", parent_run_id=self.parent.run_id, mlflow_uri=self.mlflow_uri,
                           experiment=self.experiment, host=socket.gethostname(), pid=os.getpid())
        self.state.parent_run_id = self.parent.run_id
        for trial_id, ts in self.state.trials.items() if resuming else ():
            if ts.status in FINAL_STATUSES and ts.run_id:  # ended, but the driver died before the run's close
                end_if_running(self.mlflow_uri, ts.run_id, self.folder.trial_dir(trial_id) / "tracking-fallback",
                               FAILED if ts.status == FAILED else "FINISHED")

    def _shutdown(self) -> None:
        self.checkpoints.close()  # every state handed over is on disk and journaled before the sweep ends
        self._journal_checkpoints()
        for trial_id in list(self._opening):  # runs still opening: closed once open
            self.live[trial_id] = self._abandon_opening(trial_id)
        self._opener.shutdown()
        for live in [*self.live.values(), *self._parked.values()]:  # paused members; on an error, what is open
            self._close_run(live, "KILLED")
        self.live.clear()
        self._parked.clear()
        for thread in self._closing.values():
            thread.join()
        self.executor.shutdown()

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
        if self.state.exploits:
            self.parent.log_dict(self.state.exploits, "pbt_lineage.json")
            picture = population_history(self.state, self.sweep.metric, self.folder.path / "pbt_population.png")
            if picture is not None:
                self.parent.log_artifact(picture)
        sync_paths([self.folder.path / "trials"])  # trial runs that ended while MLflow was away
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
            frames_per_s=self.frames / training_s if training_s > 0 else 0.0,
            warm_start_s=sum(warm) / len(warm) if warm else None, workers=self.executor.summary(),
            longest_block_s=self.longest_block_s, longest_block_parts=self.longest_block_parts,
            longest_run_open_s=self.longest_run_open_s, checkpoints_dropped=self.checkpoints.dropped,
            experiment_id=self.parent.experiment_id)

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


def _timed(name: str, work: Callable[[], Any]) -> tuple[str, float]:
    """Do ``work``; its name and the seconds it took."""
    t0 = time.perf_counter()
    work()
    return name, time.perf_counter() - t0


# ---- entry points -----------------------------------------------------------------------------------

def _driving(folder: SweepFolder) -> contextlib.AbstractContextManager[None]:
    """Hold the sweep's folder while this driver runs it: a second driver of the same sweep (a resume while it
    runs) would train its trials again beside the first, into the same checkpoints, journal and MLflow runs."""
    busy = SweepRunError(f"sweep {folder.sweep_id} is being run by another driver (it holds {LOCK_FILE} in "
                         f"{folder.path}); see pvm-dist sweep status {folder.sweep_id}")
    return holding(folder.path, busy)


def run_sweep(sweep: SweepSpec, opts: DriverOptions, sweep_id: str | None = None) -> SweepOutcome:
    """Start a new sweep: connect, create its folder and journal, then run it."""
    trials = sweep.plan()
    connect(opts.address)
    tracking = {"mlflow_uri": opts.mlflow_uri or default_tracking_uri(), "experiment": opts.experiment or sweep.name}
    try:  # GPUs asked for where none can ever come: one line before the sweep's folder exists
        pool.decide(sweep.resources, cluster_resources(), local=opts.address is None)
    except ValueError as exc:
        raise SweepRunError(str(exc)) from None
    folder = SweepFolder.create(opts.root, sweep_id or new_sweep_id(sweep.name), sweep.to_dict(),
                                [t.to_dict() for t in trials], tracking)
    with _driving(folder):
        return Driver(folder, sweep, trials, opts, folder.state()).run()


def resume_sweep(sweep_id: str, opts: DriverOptions) -> SweepOutcome:
    """Continue a sweep from its journal: finished trials stay, the rest continue from their checkpoints."""
    folder = SweepFolder.open(opts.root, sweep_id)
    with _driving(folder):
        sweep = load_sweep(folder.definition()["sweep"])
        state = folder.state()
        failed = [t for t, s in state.trials.items() if s.status == FAILED]
        if opts.retry_failed:
            for trial_id in failed:
                state.apply(folder.append("trial_retry", trial=trial_id, after=state.trials[trial_id].reason))
        driver = Driver(folder, sweep, [Trial.from_dict(t) for t in folder.trials(state)], opts, state)
        if not (driver.queue or driver.source.remaining()):
            more = f"; {len(failed)} failed: rerun them with --retry-failed" if failed else ""
            raise SweepRunError(f"sweep {sweep_id} has no unfinished trials (it ended {state.status}{more}); "
                                f"see pvm-dist sweep status {sweep_id}")
        for trial_dir in (folder.path / "trials").glob("*"):  # temp files of checkpoints written when it was killed
            checkpoint.remove_stale_temps(trial_dir)
        connect(opts.address)
        return driver.run()
