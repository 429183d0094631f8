"""The executor: everything of a sweep that talks to Ray. No MLflow, no journal, no decisions.

It connects to the cluster (:func:`connect`), creates :class:`~pvm_dist.sweep.worker.TrialWorker` actors
claiming what the pool's :class:`~pvm_dist.sweep.pool.Demand` says (the driver decides how many, and
which to release), starts trials on them and feeds each
running trial chunks of steps (:class:`~pvm_dist.sweep.scheduler.ChunkPlan`), two queued ahead so the
device never waits for the driver. :meth:`Executor.poll` waits on the workers' calls and turns every
result that is ready into a typed event: :class:`TrialStarted`, :class:`ChunkDone`,
:class:`FinalState`, :class:`TrialError` or :class:`WorkerLost` (its process killed, its node gone).
What to do about an event (journal it, log it, stop the trial, start a replacement worker) is the
driver's call.

A worker's calls run in submission order, so the executor waits only on the oldest call of each
worker. When a trial ends, results of the chunks still queued for it are dropped (an epoch per worker).
A checkpoint that the trial needs at no decision (not its last step, not a scheduler milestone) is asked
for ``later``: the worker hands it over with the next chunk's result while it trains on, and the event
carries a function that fetches it (for the driver's checkpoint writer to call, off the loop).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from pvm_dist.sweep.plan import SweepSpec, Trial
from pvm_dist.sweep.pool import Demand
from pvm_dist.sweep.scheduler import ChunkPlan
from pvm_dist.sweep.worker import BackendUnavailable, TrialWorker

PIPELINE_DEPTH = 2  # chunks queued on a worker ahead of the one running
CLIENT_CONNECT_ATTEMPTS = 3
LOCAL_HOST = "127.0.0.1"  # where a local Ray started here listens (see _loopback_node)


class SweepRunError(RuntimeError):
    """The sweep cannot run (no cluster, no resources); a user-facing message."""


# ---- events -----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """Where a worker runs (its ``describe()``)."""

    node: str
    host: str
    pid: int | None
    actor: str | None
    gpus: tuple[str, ...]

    @property
    def gpu(self) -> str:
        return ",".join(self.gpus) or "cpu"

    @property
    def where(self) -> str:
        return f"{self.host}/{self.node[:6]} " + (f"gpu {self.gpu}" if self.gpus else "cpu")


@dataclasses.dataclass(frozen=True)
class TrialStarted:
    """A trial is set up on a worker and continues from ``step``; ``round_trip_s``: as the driver saw it."""

    trial_id: str
    worker: WorkerInfo
    step: int
    backend: str
    device: str
    start_cost_s: float
    warm: bool  # the worker had run a trial before
    round_trip_s: float


@dataclasses.dataclass(frozen=True)
class ChunkDone:
    """A chunk of ``n_steps`` ended at ``step``; ``state``/``picture`` when the chunk plan keeps them, and at
    the trial's last step its animation (GIF bytes) and held-out scores."""

    trial_id: str
    n_steps: int
    step: int
    metrics: dict[str, float]
    state: dict[str, Any] | None
    picture: bytes | None
    gif: bytes | None = None
    heldout: dict[str, float] = dataclasses.field(default_factory=dict)
    earlier: tuple[int, Callable[[], dict[str, Any]]] | None = None  # a state asked for later: (its step, fetch)


@dataclasses.dataclass(frozen=True)
class FinalState:
    """The state asked for by :meth:`Executor.request_state` (the sweep is stopping)."""

    trial_id: str
    step: int
    state: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class TrialError:
    """A trial's call raised (it diverged, its data is missing): one line saying why."""

    trial_id: str
    reason: str


@dataclasses.dataclass(frozen=True)
class EngineUnavailable:
    """A worker cannot build the engine the sweep asks for: no trial can run, the sweep must stop."""

    reason: str


@dataclasses.dataclass(frozen=True)
class WorkerLost:
    """A worker died; ``trial_id``: the trial it was running, if any."""

    index: int
    where: str
    trial_id: str | None
    reason: str


Event = TrialStarted | ChunkDone | FinalState | TrialError | EngineUnavailable | WorkerLost


# ---- the executor -----------------------------------------------------------------------------------

class PoolWorker(NamedTuple):
    """A live worker as the pool sees it."""

    index: int
    up: bool  # placed on a node and described itself
    idle: bool  # up, no trial, no calls left
    busy: bool  # has a trial (its start may still be under way)


@dataclasses.dataclass
class _Call:
    ref: Any
    kind: str  # "start", "chunk" or "final"
    epoch: int
    n_steps: int = 0
    submitted: float = dataclasses.field(default_factory=time.perf_counter)


@dataclasses.dataclass
class _Worker:
    index: int
    handle: Any
    ready_ref: Any  # describe() until the worker is up
    info: WorkerInfo | None = None
    trial: str | None = None
    epoch: int = 0  # bumped when its trial ends: results of older calls are then dropped
    calls: deque[_Call] = dataclasses.field(default_factory=deque)  # in submission order
    submitted_to: int = 0  # the current trial's chunks are queued up to this step
    chunks: ChunkPlan | None = None  # where the current trial's chunks end
    dead: bool = False
    retired: bool = False  # released by the pool (not a loss)

    @property
    def where(self) -> str:
        return self.info.where if self.info else "starting"


class Executor:
    """Runs a sweep's trials on Ray worker actors; see the module docstring."""

    def __init__(self, sweep: SweepSpec, chunks: ChunkPlan) -> None:
        self.sweep, self.chunks = sweep, chunks
        self.workers: list[_Worker] = []
        self._worker_class: Any = None

    # ---- workers ----------------------------------------------------------------------------------
    def cluster_resources(self) -> dict[str, float]:
        return cluster_resources()

    def use(self, demand: Demand) -> None:
        """Workers from now on claim what ``demand`` says (:mod:`pvm_dist.sweep.pool` decides it)."""
        import ray

        self._worker_class = ray.remote(TrialWorker).options(num_gpus=demand.gpus, num_cpus=demand.cpus,
                                                             max_restarts=0)

    def add_worker(self) -> None:
        """Start one more worker; it waits in Ray until a node can place it, and is idle once it has
        described itself."""
        handle = self._worker_class.remote()
        # describe() also builds the sweep's engine once, so a worker that cannot is known before any trial.
        self.workers.append(_Worker(len(self.workers), handle, handle.describe.remote(self.sweep.run.to_dict())))

    def idle_workers(self) -> list[int]:
        """Workers that are up, have no trial and no calls left of their last one."""
        return [w.index for w in self.workers if not w.dead and w.info and w.trial is None and not w.calls]

    def retire(self, index: int) -> None:
        """Release a worker the sweep no longer needs (idle, or not placed yet) so its node can scale down."""
        import ray

        w = self.workers[index]
        w.dead = w.retired = True
        with contextlib.suppress(Exception):  # already gone
            ray.kill(w.handle)

    def alive(self) -> list[PoolWorker]:
        """Every worker not dead or retired."""
        return [PoolWorker(w.index, w.info is not None, w.info is not None and w.trial is None and not w.calls,
                           w.trial is not None) for w in self.workers if not w.dead]

    def workers_up(self) -> int:
        """How many workers are up and alive (0 for long: no node can host one)."""
        return sum(1 for w in self.workers if w.info and not w.dead)

    def has_trials(self) -> bool:
        """Whether a live worker has a trial (its start call may still be under way)."""
        return any(w.trial is not None and not w.dead for w in self.workers)

    def summary(self) -> list[dict[str, Any]]:
        """Every worker this session started, for the sweep's outcome."""
        return [{"index": w.index, "where": w.where, "dead": w.dead and not w.retired, "retired": w.retired}
                for w in self.workers]

    def shutdown(self) -> None:
        """Kill every worker actor: the sweep ended (or the driver failed). The calls still queued are dropped;
        those already finished are read first, as Ray prints every failure never read as an "Unhandled error"
        traceback when the driver exits (a failed trial's queued chunk fails too; killed calls print nothing)."""
        import ray

        refs = [c.ref for w in self.workers for c in w.calls] + [w.ready_ref for w in self.workers if w.info is None]
        done = ray.wait(refs, num_returns=len(refs), timeout=0)[0] if refs else []
        for ref in done:
            with contextlib.suppress(Exception):  # its failure, read and dropped
                ray.get(ref, timeout=0)
        for w in self.workers:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(w.handle)

    # ---- trials -----------------------------------------------------------------------------------
    def start_trial(self, index: int, trial: Trial, state: dict[str, Any] | None) -> None:
        """Set ``trial`` up on idle worker ``index``, continuing from checkpoint ``state`` if given."""
        import ray

        w = self.workers[index]
        w.trial = trial.trial_id
        config = self.sweep.trial_config(trial).to_dict()
        w.chunks = self.chunks.for_steps(config["steps"])
        ref = w.handle.start.remote(trial.trial_id, config, None if state is None else ray.put(state))
        w.calls.append(_Call(ref, "start", w.epoch))

    def feed(self, trial_id: str) -> None:
        """Queue the trial's next chunks until PIPELINE_DEPTH are queued or its last step is."""
        w = self._running(trial_id)
        chunks = w.chunks or self.chunks
        while (sum(1 for c in w.calls if c.kind == "chunk" and c.epoch == w.epoch) < PIPELINE_DEPTH
               and w.submitted_to < chunks.steps):
            end = chunks.end_after(w.submitted_to)
            keep = chunks.keeps_state(end)
            later = keep and end < chunks.steps and end not in chunks.milestones
            self._advance(w, "chunk", end - w.submitted_to, keep, keep, later)
            w.submitted_to = end

    def request_state(self, trial_id: str) -> None:
        """Ask for the trial's state after its queued chunks (a :class:`FinalState`)."""
        self._advance(self._running(trial_id), "final", 0, True, False)

    def release(self, trial_id: str) -> None:
        """The trial ended: its worker is free once its queued calls are done (their results dropped)."""
        for w in self.workers:
            if w.trial == trial_id:
                w.trial = None
                w.epoch += 1

    def _running(self, trial_id: str) -> _Worker:
        return next(w for w in self.workers if w.trial == trial_id and not w.dead)

    def _advance(self, w: _Worker, kind: str, n_steps: int, want_state: bool, want_picture: bool,
                 later: bool = False) -> None:
        ref = w.handle.advance.remote(n_steps, want_state, want_picture, later)
        w.calls.append(_Call(ref, kind, w.epoch, n_steps))

    # ---- results ----------------------------------------------------------------------------------
    def poll(self, timeout_s: float) -> list[Event]:
        """Wait up to ``timeout_s`` for a result, then turn every result that is ready into its event."""
        import ray

        heads = {w.ready_ref if w.info is None else w.calls[0].ref: w for w in self.workers
                 if not w.dead and (w.info is None or w.calls)}
        if not heads:
            time.sleep(timeout_s)
            return []
        refs = list(heads)
        first, _ = ray.wait(refs, num_returns=1, timeout=timeout_s)  # returns at the first result, not at timeout_s
        if not first:
            return []
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        done = set(first) | set(ready)
        events = [self._collect(heads[ref], ref) for ref in refs if ref in done]
        return [ev for ev in events if ev is not None]

    def _collect(self, w: _Worker, ref: Any) -> Event | None:
        """The event of ``w``'s finished oldest call (None for a worker coming up or a dropped result)."""
        import ray

        if w.info is None:
            try:
                d = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, BackendUnavailable):
                    w.dead = True
                    return EngineUnavailable(str(cause))
                return self._lost(w, exc)
            except ray.exceptions.RayError as exc:
                return self._lost(w, exc)
            w.info = WorkerInfo(d["node"], d["host"], d.get("pid"), d.get("actor"), tuple(d.get("gpus") or ()))
            return None
        call = w.calls.popleft()
        try:
            result = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            return self._lost(w, exc)
        except ray.exceptions.RayTaskError as exc:
            if call.epoch != w.epoch or w.trial is None:
                return None
            cause = getattr(exc, "cause", None) or exc
            return TrialError(w.trial, f"{type(cause).__name__}: {cause}".splitlines()[0][:500])
        if call.epoch != w.epoch or w.trial is None:
            return None  # a call queued before its trial ended
        step = int(result["step"])
        if call.kind == "start":
            w.submitted_to = step
            return TrialStarted(w.trial, w.info, step, result["backend"], result["device"], result["start_cost_s"],
                                result["warm"], time.perf_counter() - call.submitted)
        if call.kind == "chunk":
            earlier = result.get("earlier_state")
            return ChunkDone(w.trial, call.n_steps, step, result["metrics"], result.get("state"), result.get("picture"),
                             result.get("gif") or None, result.get("heldout") or {},
                             None if earlier is None else (int(earlier["step"]), functools.partial(ray.get, earlier["ref"])))
        return FinalState(w.trial, step, result["state"])

    def _lost(self, w: _Worker, exc: Exception) -> WorkerLost:
        w.dead = True
        w.calls.clear()
        trial_id, w.trial = w.trial, None
        text = str(exc).strip()
        return WorkerLost(w.index, w.where, trial_id, text.splitlines()[0][:300] if text else type(exc).__name__)


# ---- the cluster ------------------------------------------------------------------------------------

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
            if address is None:  # "local": a new instance, not the last `ray start` cluster Ray finds on this machine
                with _loopback_node():  # (which a plain ray.init() joins, or fails on where it has since died)
                    ray.init(address="local", include_dashboard=False, dashboard_host=LOCAL_HOST,
                             _node_ip_address=LOCAL_HOST, **kwargs)
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


@contextlib.contextmanager
def _loopback_node() -> Iterator[None]:
    """Let a local Ray keep 127.0.0.1 as its node address, so that every process it starts (GCS, raylet,
    agents, workers, the driver's own server) listens on the loopback interface only.

    Ray swaps a loopback ``_node_ip_address`` for the machine's outward address
    (``services.resolve_ip_for_localhost``); for a one-machine Ray nothing outside needs to reach it, so
    that swap is turned off while ``ray.init`` starts the node. Token authentication stays as Ray sets it
    (on by default for a new local cluster unless ``RAY_AUTH_MODE=disabled``).
    """
    from ray._private import services

    original = getattr(services, "resolve_ip_for_localhost", None)
    if original is None:  # a Ray without the swap: nothing to undo
        yield
        return
    services.resolve_ip_for_localhost = lambda host: LOCAL_HOST if services.is_localhost(host) else original(host)
    try:
        yield
    finally:
        services.resolve_ip_for_localhost = original


def cluster_resources() -> dict[str, float]:
    """What the cluster holds now (it may grow: an autoscaler adds nodes for pending workers)."""
    import ray

    return dict(ray.cluster_resources())


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
