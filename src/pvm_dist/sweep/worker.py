"""The trial worker: a Ray actor that owns one GPU (or some CPUs) and runs trials on it in chunks.

The driver creates one per GPU with ``num_gpus=1`` (or 1/k with ``trials_per_gpu: k``; a trial that does
not fit its share of the device fails before it allocates). A trial is a :class:`~pvm_dist.run.session.Session`
built from the trial's :class:`~pvm_dist.run.config.RunConfig`, so it gets everything a local run has:
metrics against the baseline, readout training on labelled data, pictures, the animation and the
held-out score. The worker keeps its data sources (decoded frames, the synthetic generators) between
trials, so starting the next trial costs only building the engine and, for a resumed trial, loading
its state; :meth:`TrialWorker.start` measures that cost.

A chunk (:meth:`TrialWorker.advance`) trains a number of steps and returns the interval's metrics (with its GPU's
``system/`` figures, :mod:`pvm_dist.sweep.gpu_metrics`) and,
when asked, the run state (for the driver to keep as the trial's checkpoint), a picture (PNG bytes)
and, at the trial's last step, the animation (GIF bytes) and held-out scores. State travels through
Ray's object store, so workers need no shared filesystem. A diverging trial raises ``RunDiverged``.

A checkpoint need not stop the training: asked for the state ``later``, the worker takes it as of that step
(on a GPU a copy on the device, :meth:`~pvm_dist.run.session.Session.state_later`) and a thread copies it
to the host and into the object store while the next chunk trains; the next chunk's result carries its
reference (``earlier_state``). LARGE's 983 MB of state every 5,000 steps would otherwise idle the GPU
for the copies at every checkpoint.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
from collections import OrderedDict
from concurrent import futures
from pathlib import Path
from typing import Any

import cv2

from pvm_dist.data import FrameSource, make_source
from pvm_dist.engine import build_engine
from pvm_dist.engine.native import build_info
from pvm_dist.model.spec import load_spec
from pvm_dist.model.topology import build_topology
from pvm_dist.run.config import RunConfig
from pvm_dist.run.evaluate import score_heldout
from pvm_dist.run.session import Session
from pvm_dist.run.state import RunState
from pvm_dist.sweep.gpu_metrics import Sampler, gpu_sampler
from pvm_dist.sweep.pool import memory_problem, trial_device_bytes

#: Data sources a worker keeps between trials (least recently used dropped first).
SOURCES_KEPT = 4


class TrialTooLarge(RuntimeError):
    """The trial does not fit its share of the GPU (several trials per GPU): it fails before allocating."""


class BackendUnavailable(RuntimeError):
    """This worker cannot build the engine the sweep asks for (the whole sweep stops, not one trial)."""


class TrialWorker:
    """One session at a time on this actor's device; see the module docstring."""

    def __init__(self) -> None:
        self._sources: OrderedDict[tuple, FrameSource] = OrderedDict()
        self._session: Session | None = None
        self._trial_id = ""
        self.trials_started = 0
        self._gpu_sampler: Sampler | None = None  # set by describe() on a GPU worker with NVML
        self._handing = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pvm-state")
        self._later: tuple[int, futures.Future[Any]] | None = None  # a state on its way into the object store

    def describe(self, config: dict[str, Any] | None = None) -> dict[str, Any]:
        """Where this worker runs (node, host, pid, Ray's GPU ids) and, given a run config, which engine
        it builds for it; raises :class:`BackendUnavailable` if it cannot build that engine."""
        import ray

        ctx = ray.get_runtime_context()
        package = str(Path(sys.modules["pvm_dist"].__file__).parent)
        out: dict[str, Any] = {"node": ctx.get_node_id()[:12], "host": socket.gethostname(), "pid": os.getpid(),
                               "actor": ctx.get_actor_id()[:12] if ctx.get_actor_id() else None,
                               "gpus": [str(g) for g in ray.get_gpu_ids()], "package": package}
        self._gpu_sampler = gpu_sampler(out["gpus"])
        if config is not None:
            cfg = RunConfig.from_dict(config)
            try:  # the smallest model on the run's backend and device: the check costs no memory to speak of
                engine = build_engine(load_spec("tiny"), backend=cfg.backend, n_seq=1, seed=0, device=cfg.device)
            except Exception as exc:  # a missing module, a device this build cannot serve, ...
                raise BackendUnavailable(f"a worker on {out['host']} cannot build the '{cfg.backend}' engine: {exc} "
                                         f"(it imports pvm_dist from {package}; is pvm-dist installed with its "
                                         f"native module where the workers run?)") from None
            out.update(backend=engine.backend, device=engine.device_label)
        return out

    def start(self, trial_id: str, config: dict[str, Any], state: dict[str, Any] | None) -> dict[str, Any]:
        """Set up a trial from its run config (``RunConfig.to_dict()``), continuing from ``state`` if given.

        Returns the step it starts at, the engine's backend and device, and the seconds setup took.
        """
        t0 = time.perf_counter()
        warm = self.trials_started > 0
        if self._later is not None:  # the previous trial's state in flight is no one's now: wait, drop it
            futures.wait([self._later[1]])
            self._later = None
        self._session = None  # free the previous trial's device memory before allocating the next
        cfg = RunConfig.from_dict(config)
        _check_device_memory(cfg)
        run_state = RunState.from_dict(state) if state is not None else None
        session = Session(cfg, run_state, source=self._source(cfg))
        self._session, self._trial_id = session, trial_id
        self.trials_started += 1
        return {"step": session.step, "backend": session.engine.backend, "device": session.engine.device_label,
                "start_cost_s": time.perf_counter() - t0, "warm": warm}

    def advance(self, n_steps: int, want_state: bool = False, want_picture: bool = False,
                later: bool = False) -> dict[str, Any]:
        """Train ``n_steps`` steps; return the interval's metrics, and the state/picture when asked.

        ``later``: the state is handed over by the next call's result (``earlier_state``: its step and object
        reference) instead of this one's, so training goes on while it is copied. The trial's last step always
        hands its state over at once. At the last step the result also holds the animation (``gif``) and
        ``heldout`` scores.
        """
        session = self._session
        if session is None:
            raise RuntimeError("advance() before start()")
        t0 = time.perf_counter()
        session.advance(n_steps)
        out: dict[str, Any] = {"step": session.step, "metrics": session.take_metrics() if n_steps else {},
                               "seconds": time.perf_counter() - t0}
        if n_steps and self._gpu_sampler is not None:
            out["metrics"].update(self._gpu_sampler())
        earlier = self._handed_over()
        if earlier is not None:
            out["earlier_state"] = earlier
        last = session.step >= session.config.steps
        if want_state and later and not last:
            self._hand_over_later(session)
            want_state = False
        state = session.state() if want_state or last else None
        if want_state:
            out["state"] = state.to_dict()
        if want_picture:
            ok, png = cv2.imencode(".png", session.picture(trial=self._trial_id))
            out["picture"] = png.tobytes() if ok else b""
        if session.step >= session.config.steps and n_steps:
            out["gif"] = self._animation_bytes(session)
            out["heldout"] = score_heldout(state, session.engine.backend)
        return out

    def _hand_over_later(self, session: Session) -> None:
        """Take the state as of now; a thread puts its host copy into the object store."""
        import ray

        make = session.state_later()
        self._later = (session.step, self._handing.submit(lambda: ray.put(make().to_dict())))

    def _handed_over(self) -> dict[str, Any] | None:
        """The state handed over by the thread (its step and object reference), once it is in the object store."""
        if self._later is None:
            return None
        (step, put), self._later = self._later, None
        return {"step": step, "ref": put.result()}

    @staticmethod
    def _animation_bytes(session: Session) -> bytes:
        if session.animation is None or len(session.animation) < 2:
            return b""
        with tempfile.TemporaryDirectory() as tmp:
            return session.animation.save(Path(tmp) / "prediction.gif").read_bytes()

    def _source(self, cfg: RunConfig) -> FrameSource:
        key = (cfg.data, cfg.data_path, cfg.spec.image_shape, cfg.n_seq, cfg.seed)
        if key in self._sources:
            self._sources.move_to_end(key)
            return self._sources[key]
        source = make_source(cfg.data, cfg.spec.image_shape, cfg.n_seq, cfg.seed, data_path=cfg.data_path)
        self._sources[key] = source
        while len(self._sources) > SOURCES_KEPT:
            self._sources.popitem(last=False)
        return source


def _check_device_memory(cfg: RunConfig) -> None:
    """On a GPU, check the trial's memory against this actor's share of the device before it allocates."""
    import ray

    if cfg.backend == "reference" or (cfg.device or "cuda").startswith("cpu"):
        return
    devices = build_info().get("devices") or []
    index = int(cfg.device.split(":")[1]) if cfg.device and ":" in cfg.device else 0
    if index >= len(devices):
        return  # no GPU visible: the engine runs on the CPU
    share = float(ray.get_runtime_context().get_assigned_resources().get("GPU", 1.0)) or 1.0
    need = trial_device_bytes(build_topology(cfg.spec), cfg.n_seq)
    problem = memory_problem(need, int(devices[index]["total_memory_bytes"]), share)
    if problem:
        raise TrialTooLarge(problem)
