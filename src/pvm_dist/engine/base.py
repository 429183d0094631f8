"""What every engine is (the :class:`Engine` protocol) and what engines share: frame checks, the
schedule, the run loops and the metrics dictionary."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

import numpy as np

from pvm_dist.model.schedule import ScheduleEvent, apply_events, events_at
from pvm_dist.model.spec import Spec
from pvm_dist.model.topology import Topology

RING = 3  # ring slots s mod 3: the update at s needs s−2, the input assembly s−1


class Engine(Protocol):
    """The engine API of architecture.md §2, as the run layer uses it."""

    backend: str
    spec: Spec
    topo: Topology
    n_seq: int

    @property
    def step_index(self) -> int: ...

    @property
    def device_label(self) -> str: ...

    @property
    def chained_launches(self) -> bool: ...

    @property
    def wgmma_products(self) -> bool: ...

    def step(self, frames: np.ndarray) -> None: ...

    def set_dataset(self, frames: Any, first_step: int | None = None) -> None: ...

    def run_dataset(self, n_steps: int) -> None: ...

    def metrics(self) -> dict[str, Any]: ...

    def take_metric_sums(self) -> tuple[np.ndarray, np.ndarray, int]: ...

    def hidden(self) -> np.ndarray: ...

    def prediction(self, seq: int | None = None) -> np.ndarray: ...

    def state(self) -> dict[str, Any]: ...

    def state_later(self) -> Callable[[], dict[str, Any]]: ...

    def load_state(self, state: dict[str, Any]) -> None: ...

    def freeze(self) -> None: ...

    def synchronize(self) -> None: ...


class EngineBase:
    """The engine API of architecture.md §2, less the step itself."""

    backend = "base"

    def __init__(self, spec: Spec, topology: Topology, n_seq: int, seed: int) -> None:
        self.spec, self.topo, self.n_seq, self.seed = spec, topology, n_seq, seed
        self.unit_lr = np.zeros(topology.n_units, np.float32)
        self.unit_momentum = np.zeros(topology.n_units, np.float32)
        self.events: list[ScheduleEvent] = []
        self.frozen = False
        self._dataset: np.ndarray | None = None  # set_dataset's frames, for the generic run_dataset
        self._dataset_first = 0
        arrays = topology.native_arrays()
        self._metric_count = np.bincount(arrays["y_bin"], minlength=2 * spec.n_layers).astype(np.float64)
        self._frame_entries = int(np.prod(spec.image_shape))  # the baseline's terms per sequence and step

    def run(self, n_steps: int, source: Iterable[np.ndarray] | Callable[[int], np.ndarray]) -> None:
        """Train ``n_steps`` steps on frames from an iterator, or a callable taking the step index."""
        if callable(source):
            for _ in range(n_steps):
                self.step(source(self.step_index))
            return
        frames_iter = iter(source)
        for _ in range(n_steps):
            self.step(next(frames_iter))

    def set_dataset(self, frames: Any, first_step: int | None = None) -> None:
        """Hold frames [T, n_seq, D, D, C] for :meth:`run_dataset`: step s trains on block (s − first_step) mod T."""
        frames = np.asarray(frames)
        if frames.ndim != 5 or frames.shape[0] < 1:
            raise ValueError(f"a dataset is [T, n_seq, D, D, C], got shape {frames.shape}")
        self._check_frames(frames[0])
        self._dataset, self._dataset_first = frames, self.step_index if first_step is None else int(first_step)

    def run_dataset(self, n_steps: int) -> None:
        """Train ``n_steps`` steps on the dataset of :meth:`set_dataset`."""
        frames = self._dataset
        if frames is None:
            raise RuntimeError("run_dataset() needs set_dataset() first")
        for _ in range(n_steps):
            self.step(frames[(self.step_index - self._dataset_first) % len(frames)])

    @property
    def device_label(self) -> str:
        """Where the engine computes: ``cpu`` unless an engine says otherwise."""
        return "cpu"

    @property
    def chained_launches(self) -> bool:
        """Whether a step's GPU kernels launch chained (programmatic dependent launch): only the CUDA engine's."""
        return False

    @property
    def wgmma_products(self) -> bool:
        """Whether the W0 products run on Hopper's wgmma: only the CUDA engine's."""
        return False

    def synchronize(self) -> None:
        """Wait until queued steps have run (engines that queue work override this)."""

    def step(self, frames: np.ndarray) -> None:  # pragma: no cover - every engine defines it
        raise NotImplementedError

    @property
    def step_index(self) -> int:  # pragma: no cover
        raise NotImplementedError

    def state_later(self) -> Callable[[], dict[str, Any]]:
        """The state as of now, as a function that hands its host copy over later (from another thread, while
        training goes on). Here the copy is made now; a GPU engine copies on the device first (see NativeEngine)."""
        state = self.state()
        return lambda: state

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes of the state arrays every backend reads and writes (the layout of architecture.md §2)."""
        T, n = self.topo, self.n_seq
        return {"weights": (T.n_weights,), "momentum": (T.n_weights,), "unit_learning_rate": (T.n_units,),
                "unit_momentum": (T.n_units,), "x_ring": (RING, n, T.x_total), "h_ring": (RING, n, T.h_total),
                "y_ring": (RING, n, T.y_total)}

    def _check_state(self, state: dict[str, Any]) -> None:
        """Raise ValueError unless ``state`` has every array of :meth:`state_shapes`, shaped for this engine."""
        for key, shape in self.state_shapes().items():
            if key not in state:
                raise ValueError(f"engine state lacks '{key}'")
            if np.shape(state[key]) != shape:
                raise ValueError(f"engine state '{key}' has shape {np.shape(state[key])}, this engine needs {shape}")

    def _check_frames(self, frames: np.ndarray) -> np.ndarray:
        frames = np.asarray(frames)
        want = (self.n_seq, *self.spec.image_shape)
        if frames.shape != want:
            raise ValueError(f"frames have shape {frames.shape}, this engine needs {want} ([n_seq, D, D, C])")
        if frames.dtype not in (np.uint8, np.float32):
            raise TypeError(f"frames must be uint8 (BGR) or float32 in [0, 1], got {frames.dtype}")
        return frames

    def freeze(self) -> None:
        """Stop learning (for evaluation): every rate and momentum 0, the schedule ignored.

        With η = μ = 0 a step leaves the weights unchanged and zeroes the velocity (§3.7), so a frozen
        engine still runs forward passes, fills its rings and measures its prediction error.
        """
        self.frozen = True
        self.unit_lr[:] = 0
        self.unit_momentum[:] = 0
        self._rates_changed()

    def _rates_changed(self) -> None:
        """Hook for engines that keep the per-unit rates elsewhere (the native engine)."""

    def _advance_schedule(self, step: int) -> bool:
        """Apply the schedule events of ``step``; True if any rate changed."""
        if self.frozen:
            return False
        fired = events_at(self.spec, step)
        apply_events(fired, self.topo.layer, self.unit_lr, self.unit_momentum)
        self.events.extend(fired)
        return bool(fired)

    def metrics(self) -> dict[str, Any]:
        """Per-layer mean squared prediction error and the copy-last-frame baseline since the last call
        (see :meth:`metrics_from`), then reset."""
        return self.metrics_from(*self.take_metric_sums())

    def take_metric_sums(self) -> tuple[np.ndarray, np.ndarray, int]:  # pragma: no cover - every engine defines it
        """The raw sums behind :meth:`metrics` (per (layer, half) squared errors, the baseline's two-step and
        one-step, the steps covered, all float64 but the count) since the last call; then reset. A caller that
        keeps a partial interval across a checkpoint adds these up itself (:class:`~pvm_dist.run.session.Session`)."""
        raise NotImplementedError

    def metrics_from(self, sums: np.ndarray, baseline_sums: np.ndarray, steps: int) -> dict[str, Any]:
        """Per-layer mean squared error of the two-step and one-step predictions, and the same for the
        copy-last-frame baseline (``baseline_two_step``, ``baseline_one_step``: the frame of step s−2
        as the prediction of frames s and s−1, over the frame's entries).

        Errors are in the compressed units the network trains on ([0.1, 0.9]); steps 0 and 1,
        which compare against the initial all-ones rings, are not counted.
        """
        n_layers = self.spec.n_layers
        if not steps:
            nan = np.full(n_layers, np.nan)
            return {"steps": 0, "step": self.step_index, "mse_two_step": nan, "mse_one_step": nan.copy(),
                    "baseline_two_step": float("nan"), "baseline_one_step": float("nan")}
        mse = (np.asarray(sums, np.float64) / (self._metric_count * self.n_seq * steps)).reshape(-1, 2)
        base = np.asarray(baseline_sums, np.float64) / (self._frame_entries * self.n_seq * steps)
        return {"steps": int(steps), "step": self.step_index, "mse_two_step": mse[:, 0], "mse_one_step": mse[:, 1],
                "baseline_two_step": float(base[0]), "baseline_one_step": float(base[1])}
