"""The trial worker: a Ray actor that owns one GPU (or some CPUs) and runs trials on it in chunks.

The driver creates one per GPU with ``num_gpus=1``. A worker keeps its data sources (decoded frames,
the synthetic generators) between trials, so starting the next trial costs only building the engine
and, for a resumed trial, loading its checkpoint state; :meth:`TrialWorker.start` measures that cost.

A chunk (:meth:`TrialWorker.advance`) trains a number of steps and returns the metrics of the
interval, and, when asked, the engine state (for the driver to keep as the trial's checkpoint) and a
picture. Checkpoint state travels through Ray's object store, so workers need no shared filesystem.
A chunk whose prediction errors are not finite reports the trial as diverged.
"""

from __future__ import annotations

import os
import socket
import time
from collections import OrderedDict
from typing import Any

import numpy as np

from pvm_dist.run.metrics import CopyLastFrameBaseline, summarize

#: Data sources a worker keeps between trials (least recently used dropped first).
SOURCES_KEPT = 4


class TrialDiverged(RuntimeError):
    """The trial's prediction error became NaN or infinite."""


class TrialWorker:
    """One engine at a time on this actor's device; see the module docstring."""

    def __init__(self) -> None:
        self._sources: OrderedDict[tuple, Any] = OrderedDict()
        self._engine: Any = None
        self._source: Any = None
        self._baseline = CopyLastFrameBaseline()
        self._trial: dict[str, Any] | None = None
        self.trials_started = 0

    def describe(self) -> dict[str, Any]:
        """Where this worker runs: node, host, pid, the GPU ids Ray gave it and the engine's device."""
        import ray

        ctx = ray.get_runtime_context()
        return {"node": ctx.get_node_id()[:12], "host": socket.gethostname(), "pid": os.getpid(),
                "actor": ctx.get_actor_id()[:12] if ctx.get_actor_id() else None,
                "gpus": [str(g) for g in ray.get_gpu_ids()]}

    def start(self, trial: dict[str, Any], settings: dict[str, Any], state: dict[str, Any] | None) -> dict[str, Any]:
        """Set up ``trial`` (a ``Trial.to_dict()``) with the sweep's ``settings``; continue from ``state`` if given.

        Returns the step it starts at, the engine's backend and device, and the seconds setup took.
        """
        from pvm_dist.engine import build_engine
        from pvm_dist.model.spec import load_spec

        t0 = time.perf_counter()
        warm = self.trials_started > 0
        self._engine = None  # free the previous trial's device memory before allocating the next
        spec = load_spec(trial["spec"]).with_overrides(trial.get("overrides") or {})
        seed = int(trial.get("seed", 0))
        engine = build_engine(spec, backend=settings.get("backend", "auto"), n_seq=int(settings["n_seq"]), seed=seed)
        if state is not None:
            engine.load_state(state)
        self._source = self._get_source(settings["data"], settings.get("data_path"), spec.image_shape,
                                        int(settings["n_seq"]), seed)
        self._engine, self._trial = engine, trial
        self._baseline = CopyLastFrameBaseline()
        self.trials_started += 1
        return {"step": engine.step_index, "backend": engine.backend,
                "device": getattr(engine, "device_label", "cpu"), "start_cost_s": time.perf_counter() - t0,
                "warm": warm}

    def advance(self, n_steps: int, want_state: bool = False, want_picture: bool = False) -> dict[str, Any]:
        """Train ``n_steps`` steps; return the interval's metrics, and the state/picture when asked.

        Raises :class:`TrialDiverged` when the prediction error is NaN or infinite.
        """
        engine, source, baseline = self._engine, self._source, self._baseline
        if engine is None:
            raise RuntimeError("advance() before start()")
        t0 = time.perf_counter()
        with np.errstate(all="ignore"):  # a diverging trial overflows; it is reported below, not warned about
            for _ in range(n_steps):
                frames = source.frames(engine.step_index)
                baseline.update(frames)
                engine.step(frames)
            raw = engine.metrics()
        seconds = time.perf_counter() - t0
        step = engine.step_index
        if raw.get("steps"):
            bad = [i for i, (a, b) in enumerate(zip(raw["mse_two_step"], raw["mse_one_step"]))
                   if not (np.isfinite(a) and np.isfinite(b))]
            if bad:
                raise TrialDiverged(f"diverged by step {step:,}: prediction error is NaN/Inf in layer(s) "
                                    f"{', '.join(map(str, bad))}")
        rate = n_steps / max(seconds, 1e-9)
        metrics = summarize(raw, baseline.take()) if raw.get("steps") else {}
        metrics.update({"steps_per_s": rate, "frames_per_s": rate * engine.n_seq})
        out: dict[str, Any] = {"step": step, "metrics": metrics, "seconds": seconds}
        if want_state:
            out["state"] = engine.state()
        if want_picture:
            out["picture"] = self._picture()
        return out

    def _picture(self) -> bytes:
        """The display of §6 for sequence 0 as PNG bytes."""
        import cv2

        from pvm_dist.io.pictures import picture_grid, predicted_frame

        engine = self._engine
        s = engine.step_index
        with np.errstate(all="ignore"):
            predicted = predicted_frame(engine.topo, engine.prediction()[0], ahead=2)
            image = picture_grid(self._source.frames(s + 1)[0], predicted, engine.topo, engine.hidden()[0],
                                 caption={"step": s, "spec": engine.spec.name, "trial": self._trial["trial_id"]})
        ok, buf = cv2.imencode(".png", image)
        return buf.tobytes() if ok else b""

    def _get_source(self, data: str, data_path: str | None, shape: tuple[int, int, int], n_seq: int, seed: int) -> Any:
        from pvm_dist.data import make_source

        key = (data, data_path, shape, n_seq, seed)
        if key in self._sources:
            self._sources.move_to_end(key)
            return self._sources[key]
        source = make_source(data, shape, n_seq, seed, data_path=data_path)
        self._sources[key] = source
        while len(self._sources) > SOURCES_KEPT:
            self._sources.popitem(last=False)
        return source
