"""The training session: the only place frames are fed to an engine and metrics, pictures, animations
and readout updates are taken. ``train``, ``eval`` and the sweep worker are thin wrappers (``bench`` times
the bare engine on random frames instead).

The engine accumulates its prediction errors and the copy-last-frame baseline itself, from the frames
it already holds; the session collects its sums after every :meth:`Session.advance` and reports them every
metrics interval (:meth:`Session.take_metrics`), beside the background baseline it computes from the same
frames as the feed hands them over. An interval under way at a checkpoint is part of the run's state, and
its sums are added up at the same steps whether or not the run was resumed there, so a resumed run logs
exactly (to the bit) the metrics of an unbroken one.
Between reads the session only hands frames over (:mod:`pvm_dist.run.feed`), unless a step needs the
host: the readout training or scoring on a step's hidden state, or the last steps' animation.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from pvm_dist.data import FrameSource, make_source
from pvm_dist.engine import build_engine
from pvm_dist.io import pictures
from pvm_dist.model.readout import Readout, decode, hit_rate, iou, readout_learning_rate, readout_trains
from pvm_dist.run.background import PRIME_STEPS, BackgroundBaseline
from pvm_dist.run.config import RunConfig
from pvm_dist.run.feed import FrameFeed
from pvm_dist.run.metrics import diverged_layers, summarize
from pvm_dist.run.state import RunState


# Host steps take their labels (float32 [k, n_seq, H, W]) at most this many bytes at a time: an eval is one advance
# of all its steps, which at 100,000 steps of 8 sequences on small asked for 11.5 GB of labels at once.
HOST_LABEL_BYTES = 64 << 20


class RunDiverged(RuntimeError):
    """The model's prediction error became NaN or infinite."""


class Session:
    """One model on one frame source (see the module docstring).

    ``learn=False`` evaluates: the engine is frozen and a readout, if any, is scored on every step
    instead of trained. ``source`` lets a caller keep decoded data between sessions (the sweep worker).
    """

    def __init__(self, config: RunConfig, state: RunState | None = None, source: FrameSource | None = None,
                 learn: bool = True) -> None:
        self.config, self.learn = config, learn
        self.engine = build_engine(config.spec, backend=config.backend, n_seq=config.n_seq, seed=config.seed,
                                   device=config.device)
        self.source = source or make_source(config.data, config.spec.image_shape, config.n_seq, config.seed,
                                            data_path=config.data_path)
        self.readout: Readout | None = None
        wanted = config.readout if learn else state is not None and bool(state.readout)
        if wanted and self.source.labels(0) is not None:
            self.readout = Readout(self.engine.topo, seed=config.seed, momentum=config.spec["momentum"])
        self.background = BackgroundBaseline()
        self._sums = self._no_sums()  # the metrics interval under way: engine sums collected after each advance
        if state is not None:
            self._restore(state)
        if not learn:
            self.engine.freeze()
        self.on_gpu = self.engine.device_label.startswith("cuda")
        if self.step > 0 and not (state is not None and self._restore_interval(state.metrics)):
            # a checkpoint without the interval (an older release): the running mean as an unbroken run would have it
            first = max(0, self.step - PRIME_STEPS)
            self._observe(first, self.source.frames_block(first, self.step - first))
            self.background.take()
        self.feed = FrameFeed(self.engine, self.source, observe=self._observe)
        self.animation: pictures.Animation | None = None
        self._pending: deque[np.ndarray] = deque(maxlen=2)  # predictions made at steps s−2, s−1
        self._scores: dict[str, list[Any]] = {"iou": [], "hit": [], "masks": []}
        self._seconds, self._steps = 0.0, 0  # time spent training since the last take_metrics

    def _restore(self, state: RunState) -> None:
        if self.learn:
            self.engine.load_state(state.engine)
        else:  # trained weights into fresh rings: n_seq may differ from training
            fresh = self.engine.state()
            fresh["weights"] = state.engine["weights"]
            self.engine.load_state(fresh)
        if self.readout is not None and state.readout:
            self.readout.load_state(state.readout)

    def _no_sums(self) -> tuple[np.ndarray, np.ndarray, int]:
        return np.zeros(2 * self.config.spec.n_layers), np.zeros(2), 0

    def _restore_interval(self, saved: dict[str, Any]) -> bool:
        """Continue the metrics interval a checkpoint was taken in; False if it kept none that fits this run."""
        background = {k.removeprefix("background_"): v for k, v in saved.items() if k.startswith("background_")}
        entries = self.engine.n_seq * int(np.prod(self.config.spec.image_shape))
        fits = (np.shape(saved.get("errors")) == (2 * self.config.spec.n_layers,)
                and np.shape(saved.get("baseline")) == (2,) and np.shape(background.get("mean")) == (entries,))
        if not (self.learn and fits):
            return False
        self._sums = (np.array(saved["errors"], np.float64), np.array(saved["baseline"], np.float64),
                      int(saved["steps"]))
        self.background.load_state(background, self.source.frames_block(self.step - 1, 1)[0])
        return True

    def _collect_sums(self) -> None:
        """Add the engine's sums since the last call to the interval's (at every advance's end: the same steps
        in a resumed run as in an unbroken one, so the float64 additions round alike)."""
        errors, baseline, steps = self.engine.take_metric_sums()
        if steps:
            self._sums = (self._sums[0] + errors, self._sums[1] + baseline, self._sums[2] + int(steps))

    def _observe(self, first_step: int, frames: Any) -> None:
        """The frames the engine trains on, into the background baseline (on the engine's GPU if it has one)."""
        if self.on_gpu and isinstance(frames, np.ndarray):
            import cupy

            frames = cupy.asarray(frames)
        self.background.update(first_step, frames)

    @property
    def step(self) -> int:
        return self.engine.step_index

    # --- training ----------------------------------------------------------------------------------
    def advance(self, n_steps: int) -> None:
        """Train (or, frozen, run) ``n_steps`` steps."""
        t0 = time.perf_counter()
        end = self.step + n_steps
        while self.step < end:
            host_from = self._host_from()
            if self.step >= host_from:
                self._host_steps(min(end - self.step, self._host_block()))
            else:
                self.feed.run(min(end, host_from) - self.step)
        self.engine.synchronize()
        self._collect_sums()
        self._seconds += time.perf_counter() - t0
        self._steps += n_steps

    def _host_from(self) -> float:
        """The first step that needs the host, which every later step needs too: the readout's first
        training (or, frozen, scoring) step, or the animation's first frame; infinite if neither."""
        c = self.config
        starts = [c.steps - c.animation_frames] if self.learn and c.animation_frames > 0 else []
        if self.readout is not None:
            starts.append(c.readout_from if self.learn else 0)
        return min(starts, default=math.inf)

    def _host_block(self) -> int:
        """The most host steps whose labels stay within HOST_LABEL_BYTES (at least one)."""
        h, w = self.config.spec.image_shape[:2]
        return max(1, HOST_LABEL_BYTES // (4 * self.engine.n_seq * h * w))

    def _wants_readout(self, step: int) -> bool:
        """Whether the readout trains (or, frozen, is scored) at ``step``."""
        return self.readout is not None and (not self.learn or readout_trains(self.config.spec, step, self.config.readout_from))

    def _animates(self, step: int) -> bool:
        c = self.config
        return self.learn and c.animation_frames > 0 and step >= c.steps - c.animation_frames

    def _host_steps(self, k: int) -> None:
        """``k`` steps one at a time, with the readout and the animation between them."""
        step = self.step
        labels = self.source.labels_block(step, k) if self.readout is not None else None
        for i in range(k):
            if self.animation is None and self._animates(step + i):
                self.animation = pictures.Animation(min_side=96)
            self.feed.run(1)
            if labels is not None and self._wants_readout(step + i):
                self._readout_step(step + i, labels[i])
            if self.animation is not None:
                if len(self._pending) == 2:  # the prediction made two steps ago is of this step's frame
                    self.animation.add(self.feed.last_frame(0), self._pending[0])
                self._pending.append(self.predicted_frame())

    def _readout_step(self, step: int, labels: np.ndarray) -> None:
        hidden = self.engine.hidden()
        if self.learn:
            c = self.config
            lr = c.readout_lr if c.readout_lr is not None else readout_learning_rate(c.spec, step)
            self.readout.set_learning_rate(lr)
            self.readout.train(hidden, labels)
            return
        heat = self.readout.forward(hidden)
        self._scores["masks"].append(labels > 0.5)  # kept for the chance scores: a byte a pixel, not four
        for q in range(self.engine.n_seq):
            self._scores["iou"].append(iou(heat[q], labels[q]))
            h = hit_rate(heat[q : q + 1], labels[q : q + 1])
            if np.isfinite(h):
                self._scores["hit"].append(h)

    # --- what a run reports ------------------------------------------------------------------------
    def take_metrics(self) -> dict[str, float]:
        """Errors, baseline and speed since the last call (flat names for logs and MLflow).

        Raises :class:`RunDiverged` when a layer's error is NaN or infinite.
        """
        self._collect_sums()
        with np.errstate(all="ignore"):
            raw = self.engine.metrics_from(*self._sums)
        self._sums = self._no_sums()
        bad = diverged_layers(raw)
        if bad:
            raise RunDiverged(f"diverged by step {self.step:,}: prediction error is NaN/Inf in layer(s) "
                              f"{', '.join(map(str, bad))}")
        out = summarize(raw, self.background.take())
        rate = self._steps / max(self._seconds, 1e-9)
        out.update({"steps_per_s": rate, "frames_per_s": rate * self.engine.n_seq})
        self._seconds, self._steps = 0.0, 0
        return out

    def take_scores(self) -> dict[str, float]:
        """Readout IoU and hit rate (with their chance levels) over the frozen steps since the last call."""
        from pvm_dist.model.readout import chance_scores

        s, out = self._scores, {}
        if s["iou"]:
            out["readout_iou"] = float(np.mean(s["iou"]))
        if s["hit"]:
            out["readout_hit_rate"] = float(np.mean(s["hit"]))
        if s["masks"]:
            out.update(chance_scores(np.concatenate(s["masks"])))
        self._scores = {"iou": [], "hit": [], "masks": []}
        return out

    def predicted_frame(self) -> np.ndarray:
        """Sequence 0's two-step prediction of the last step, as a uint8 frame."""
        return pictures.predicted_frame(self.engine.topo, self.engine.prediction(0), ahead=2)

    def picture(self, **caption: Any) -> np.ndarray:
        """The display of §6 for sequence 0 (frame, prediction, error, readout, hidden tiles), BGR."""
        s = self.step
        frame = self.source.frames_block(s + 1, 1)[0, 0]  # the last step (s−1) predicted frame s+1
        hidden = self.engine.hidden()
        heatmap, box = None, None
        if self.readout is not None:
            heatmap = decode(self.readout.forward(hidden))[0]
            boxes = self.source.boxes(max(s - 1, 0))
            box = None if boxes is None else tuple(int(v) for v in boxes[0])
        with np.errstate(all="ignore"):
            return pictures.picture_grid(frame, self.predicted_frame(), self.engine.topo, hidden[0], heatmap=heatmap,
                                         label_box=box, caption={"step": s, "spec": self.config.spec.name,
                                                                 "backend": self.engine.backend, **caption})

    def state(self) -> RunState:
        """Host copies of everything the run continues from."""
        return RunState(self.engine.state(), *self._host_parts())

    def state_later(self) -> Callable[[], RunState]:
        """Everything the run continues from as of now, as a function that makes the engine's host copy later
        (on another thread, while the session trains on; valid until the next call: :meth:`EngineBase.state_later`);
        the readout and the metrics interval are copied now."""
        engine, parts = self.engine.state_later(), self._host_parts()
        return lambda: RunState(engine(), *parts)

    def _host_parts(self) -> tuple[dict[str, Any], RunConfig, dict[str, Any]]:
        """The readout's state, the run configuration and the metrics interval under way (copies)."""
        readout = self.readout.state() if self.readout is not None else {}
        interval: dict[str, Any] = {}
        background = self.background.state()
        if self.learn and background:
            self._collect_sums()
            errors, baseline, steps = self._sums
            interval = {"errors": errors.copy(), "baseline": baseline.copy(), "steps": steps,
                        **{f"background_{k}": v for k, v in background.items()}}
        return readout, self.config, interval
