"""The native C++/CUDA engine behind the engine API (architecture.md §2–3).

The arithmetic runs in ``pvm_dist._native`` (CPU or CUDA); this wrapper hands it the topology and
the seeded initial weights, applies the learning-rate schedule (writing the per-unit rates into
the engine only at the steps where they change), and converts state to and from the reference
engine's layout, so checkpoints are interchangeable between backends.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pvm_dist.engine.base import RING, EngineBase
from pvm_dist.engine.native import build_info, native_import_error, native_module
from pvm_dist.model.numerics import initial_weights
from pvm_dist.model.schedule import event_steps
from pvm_dist.model.spec import DERIVATIVE_MODES, PRECISIONS, Spec
from pvm_dist.model.topology import Topology, build_topology

RING_BUFFERS = ("x_ring", "h_ring", "y_ring")


class NativeEngineUnavailable(RuntimeError):
    """The native module is not built or cannot serve the requested device."""


def default_device() -> str:
    """``cuda`` when this build has CUDA and sees a GPU, otherwise ``cpu``."""
    info = build_info()
    return "cuda" if info.get("available") and info.get("cuda_compiled") and info.get("devices") else "cpu"


class NativeEngine(EngineBase):
    """Trains ``n_seq`` sequences with the native engine on ``device`` ("cpu", "cuda", "cuda:N")."""

    backend = "native"

    def __init__(self, spec: Spec, n_seq: int = 1, seed: int = 0, device: str | None = None,
                 topology: Topology | None = None) -> None:
        module = native_module()
        if module is None:
            raise NativeEngineUnavailable(f"the native engine is not built: {native_import_error()}")
        super().__init__(spec, topology or build_topology(spec), n_seq, seed)
        self.device = device or default_device()
        # Device views (CuPy) let reads of one ring slot copy only that slot off the GPU.
        self._cupy_views = self.device.startswith("cuda") and importlib.util.find_spec("cupy") is not None
        self._snapshot: dict[str, Any] | None = None  # state_later's device copy (CuPy arrays)
        self._engine = module.Engine(
            self.topo.native_arrays(), polynomial=bool(spec["polynomial"]),
            derivative=DERIVATIVE_MODES.index(spec["derivative"]), opt_abs_diff=bool(spec["opt_abs_diff"]),
            n_seq=n_seq, device=self.device, precision=PRECISIONS.index(spec["precision"]))
        self._engine.write("weights", initial_weights(self.topo.n_weights, seed))

    @property
    def step_index(self) -> int:
        return int(self._engine.step_index)

    def step(self, frames: np.ndarray) -> None:
        """Train one step on ``frames`` [n_seq, D, D, C] (uint8 BGR or float32 in [0, 1])."""
        frames = self._check_frames(frames)
        if self._advance_schedule(self.step_index):
            self._rates_changed()
        self._engine.step(np.ascontiguousarray(frames))

    def _rates_changed(self) -> None:
        self._engine.write("unit_learning_rate", self.unit_lr)
        self._engine.write("unit_momentum", self.unit_momentum)

    def state(self) -> dict[str, Any]:
        """A host copy of the engine's state in the reference engine's layout."""
        out: dict[str, Any] = {"step": self.step_index, "n_seq": int(self.n_seq), "seed": int(self.seed),
                               "weights": self._engine.read("weights"), "momentum": self._engine.read("momentum"),
                               "unit_learning_rate": self.unit_lr.copy(), "unit_momentum": self.unit_momentum.copy()}
        shapes = self.state_shapes()
        for name in RING_BUFFERS:
            out[name] = self._engine.read(name).reshape(shapes[name])
        return out

    def state_later(self) -> Callable[[], dict[str, Any]]:
        """The state as of now, its host copy made later (see EngineBase). On a GPU with CuPy the buffers are
        first copied on the device (about 2 ms for LARGE's 983 MB) into a snapshot, so that the next steps can
        run while the function copies the snapshot into pinned host buffers on a stream of its own, waiting
        without holding the GIL (a plain copy holds it for a quarter of a second for LARGE, and the training
        thread waits for it). Snapshot and host buffers are kept for the next call: what the function returns
        is valid until then, and it must have returned before the next call. Where the device has no room for
        the snapshot, or there is no GPU, the host copy is made now."""
        names = ("weights", "momentum", *RING_BUFFERS)
        shapes = self.state_shapes()
        if not self._cupy_views:
            return super().state_later()
        import cupy
        import cupyx

        if self._snapshot is None:
            need = sum(4 * int(np.prod(shapes[n])) for n in names)
            if cupy.cuda.runtime.memGetInfo()[0] < 2 * need:  # the snapshot, and room left for the training
                return super().state_later()
            self._snapshot = {n: (cupy.empty(shapes[n], cupy.float32), cupyx.empty_pinned(shapes[n], np.float32))
                              for n in names}
        buffers = self._snapshot
        for n in names:
            cupy.copyto(buffers[n][0], self.device_view(n))  # device_view waits for the engine's queued steps
        cupy.cuda.get_current_stream().synchronize()  # copied before the engine's next step writes
        fixed = {"step": self.step_index, "n_seq": int(self.n_seq), "seed": int(self.seed),
                 "unit_learning_rate": self.unit_lr.copy(), "unit_momentum": self.unit_momentum.copy()}

        def host() -> dict[str, Any]:
            stream = cupy.cuda.Stream(non_blocking=True)  # beside the engine's stream, not behind it
            for device, pinned in buffers.values():
                device.get(stream=stream, out=pinned, blocking=False)
            while not stream.done:
                time.sleep(0.002)
            return {**fixed, **{n: pinned for n, (_, pinned) in buffers.items()}}

        return host

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore a state written by any backend (shapes are checked)."""
        self._check_state(state)
        for key in self.state_shapes():
            self._engine.write(key, np.ascontiguousarray(state[key], np.float32).ravel())
        self.unit_lr = np.array(state["unit_learning_rate"], np.float32)
        self.unit_momentum = np.array(state["unit_momentum"], np.float32)
        self._engine.step_index = int(state["step"])
        self.seed = int(state.get("seed", self.seed))
        self._engine.take_metrics()  # the sums restart with the loaded state

    def take_metric_sums(self) -> tuple[np.ndarray, np.ndarray, int]:
        """The raw metric sums since the last call (see EngineBase), then reset."""
        sums, baseline_sums, steps = self._engine.take_metrics()
        return np.asarray(sums, np.float64), np.asarray(baseline_sums, np.float64), int(steps)

    def hidden(self) -> np.ndarray:
        """Hidden activations [n_seq, ΣH] of the last step (on a GPU with CuPy, only that ring slot is copied)."""
        if self._cupy_views:
            return self.hidden_view()[:, self.topo.h_act].get()
        h = self._engine.read("h_ring").reshape(self.state_shapes()["h_ring"])
        return h[(self.step_index - 1) % RING][:, self.topo.h_act]

    def prediction(self, seq: int | None = None) -> np.ndarray:
        """Outputs [n_seq, ΣM] of the last step's forward pass, or [ΣM] of sequence ``seq``."""
        if self._cupy_views:
            view = self.prediction_view()
            return (view if seq is None else view[seq]).get()
        y = self._engine.read("y_ring").reshape(self.state_shapes()["y_ring"])[(self.step_index - 1) % RING]
        return (y if seq is None else y[seq]).copy()

    @property
    def device_label(self) -> str:
        """The device as the engine names it, e.g. ``cuda:0 (NVIDIA H200)`` or ``cpu``."""
        return str(self._engine.device)

    @property
    def chained_launches(self) -> bool:
        """Whether a step's kernels launch chained (CUDA, sm_90+, up to 16 sequences; ``PVM_CUDA_CHAIN=0``: off, ``=all``: at every n_seq)."""
        return bool(self._engine.chained_launches)

    @property
    def wgmma_products(self) -> bool:
        """Whether per-unit products run on wgmma (CUDA, sm_90a build, from 9 sequences; ``PVM_CUDA_WGMMA=0``: off)."""
        return bool(self._engine.wgmma_products)

    def synchronize(self) -> None:
        """Wait until the queued steps have run (for timing; state reads synchronise anyway)."""
        self._engine.synchronize()

    def profile_step(self, frames: np.ndarray) -> dict[str, float]:
        """Train one step (uint8 frames) and return milliseconds per phase, from device timers."""
        frames = self._check_frames(frames)
        if frames.dtype != np.uint8:
            raise TypeError("profile_step takes uint8 frames")
        if self._advance_schedule(self.step_index):
            self._rates_changed()
        return dict(self._engine.profile_step(np.ascontiguousarray(frames)))

    # ---- a dataset held by the engine -----------------------------------------------------------

    def set_dataset(self, frames: Any, first_step: int | None = None) -> None:
        """Hold frames [T, n_seq, D, D, C] uint8 for :meth:`run_dataset`: step s trains on block
        (s − first_step) mod T (default first_step: the current step).

        A numpy array is copied to the device once (CPU engine: kept in the engine); an array already on
        this engine's GPU (a CuPy array, anything with ``__cuda_array_interface__``) is used in place,
        without a copy, and must not change while it is in use (the engine keeps a reference to it).
        """
        first = self.step_index if first_step is None else int(first_step)
        want = (self.n_seq, *self.spec.image_shape)
        cai = getattr(frames, "__cuda_array_interface__", None)
        shape = tuple(cai["shape"]) if cai is not None else np.shape(frames)
        if len(shape) != 5 or shape[1:] != want or shape[0] < 1:
            raise ValueError(f"a dataset is [T, {', '.join(map(str, want))}] uint8, got shape {shape}")
        if cai is not None:
            if np.dtype(cai["typestr"]) != np.uint8:
                raise TypeError(f"a dataset is uint8, got {np.dtype(cai['typestr'])}")
            if cai.get("strides") is not None and cai["strides"] != _c_strides(shape, 1):
                raise ValueError("a device dataset must be C-contiguous")
            self._engine.set_dataset_device(int(cai["data"][0]), int(shape[0]), first)
        else:
            array = np.asarray(frames)
            if array.dtype != np.uint8:
                raise TypeError(f"a dataset is uint8, got {array.dtype}")
            self._engine.set_dataset(np.ascontiguousarray(array), first)
        self._dataset = frames if cai is not None else None  # a device array must outlive its use

    def run_dataset(self, n_steps: int) -> None:
        """Train ``n_steps`` steps on the dataset of :meth:`set_dataset`.

        Between the schedule's events the steps are queued back to back with no host work but a graph
        launch each (no frame upload, no sync); at an event step the new rates are written first.
        """
        if not self._engine.dataset_frames:
            raise RuntimeError("run_dataset() needs set_dataset() first")
        end = self.step_index + int(n_steps)
        while self.step_index < end:
            s = self.step_index
            if self._advance_schedule(s):
                self._rates_changed()
            upcoming = [e for e in event_steps(self.spec) if e > s] if not self.frozen else []
            self._engine.run_dataset(min([end, *upcoming]) - s)

    # ---- zero-copy CuPy views of device state (CUDA engines) ------------------------------------

    def device_view(self, name: str) -> Any:
        """A CuPy array viewing a state buffer (``weights``, ``momentum``, ``x_ring``, ``h_ring``, ``y_ring``,
        ``unit_learning_rate``, ``unit_momentum``) or ``error`` [n_seq, ΣM] in place on the GPU.

        The engine is synchronised first, so the view shows every queued step; after more steps call
        :meth:`synchronize` before reading it again. ``error`` is the exception: it is rebuilt from the rings
        only when asked for, so ask again (:meth:`error_view`) after more steps. So is ``x_ring`` from 2
        sequences, where the engine keeps each step's sources rather than x, and so are ``weights`` and
        ``momentum``, whose W0 rows the engine keeps padded to 16 bytes (writing those views changes
        nothing). The view stays valid while the engine lives.
        """
        shapes = {**self.state_shapes(), "error": (self.n_seq, self.topo.y_total)}
        if name not in shapes:
            raise ValueError(f"unknown buffer {name!r}; one of {', '.join(shapes)}")
        address = self._engine.device_pointer(name)  # a CPU engine says so here
        import cupy

        self.synchronize()
        shape = shapes[name]
        nbytes = int(np.prod(shape)) * 4
        device_id = int(self.device.partition(":")[2] or 0) if self.device.startswith("cuda") else 0
        memory = cupy.cuda.UnownedMemory(address, nbytes, self, device_id)
        return cupy.ndarray(shape, cupy.float32, cupy.cuda.MemoryPointer(memory, 0))

    def hidden_view(self) -> Any:
        """The last step's hidden ring slot [n_seq, h_total] on the GPU (activations at ``topo.h_act``)."""
        return self.device_view("h_ring")[(self.step_index - 1) % RING]

    def prediction_view(self) -> Any:
        """The last step's outputs [n_seq, ΣM] on the GPU."""
        return self.device_view("y_ring")[(self.step_index - 1) % RING]

    def error_view(self) -> Any:
        """The last step's output errors [n_seq, ΣM] (target − prediction) on the GPU, computed by this call
        (training does not store them): call it again after more steps."""
        return self.device_view("error")

    @property
    def weights(self) -> np.ndarray:
        return self._engine.read("weights")

    @property
    def velocity(self) -> np.ndarray:
        return self._engine.read("momentum")


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))
