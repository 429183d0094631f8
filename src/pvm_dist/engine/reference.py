"""The numpy reference engine: the executable specification of one PVM training step (§3).

Written for clarity and exactness, not speed. Every sum has a fixed order (numpy's pairwise sum
along a contiguous row for dot products, a sequential sum over outputs for W1ᵀδ, a float64 sum
over sequences for batch means), so two runs are bit-identical, and a batch of k identical
sequences reproduces ``n_seq = 1`` exactly. Other engines are checked against this one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pvm_dist.model import numerics as nx
from pvm_dist.engine.base import RING, EngineBase
from pvm_dist.model.spec import Spec
from pvm_dist.model.topology import Topology, build_topology

F32 = np.float32


class ReferenceEngine(EngineBase):
    """Trains ``n_seq`` independent sequences with shared weights, one frame per sequence per step."""

    backend = "reference"

    def __init__(self, spec: Spec, n_seq: int = 1, seed: int = 0, topology: Topology | None = None) -> None:
        super().__init__(spec, topology or build_topology(spec), n_seq, seed)
        T = self.topo
        self.weights = nx.initial_weights(T.n_weights, seed)
        self.velocity = np.zeros(T.n_weights, F32)
        # Rings start all ones (§3.2): bias entries stay 1, the first two updates see ones.
        self.x = np.ones((RING, n_seq, T.x_total), F32)
        self.h = np.ones((RING, n_seq, T.h_total), F32)
        self.y = np.ones((RING, n_seq, T.y_total), F32)
        self.step_count = 0
        arrays = T.native_arrays()
        self._target_src = arrays["target_src"]
        self._metric_bin = arrays["y_bin"].astype(np.int64)  # layer·2 + half (0: two-step, 1: one-step)
        # The copy-last-frame baseline's terms: layer-0 outputs, their targets and their x(s−2) entries.
        baseline_out = np.flatnonzero(arrays["baseline_src"] >= 0)
        self._baseline_target = self._target_src[baseline_out]
        self._baseline_src = arrays["baseline_src"][baseline_out]
        self._baseline_bin = self._metric_bin[baseline_out]  # 0: two-step, 1: one-step
        self._reset_metrics()

    # --- public API (architecture.md §2) ----------------------------------------------------
    @property
    def step_index(self) -> int:
        """Steps trained so far (the next step's s)."""
        return self.step_count

    def step(self, frames: np.ndarray) -> None:
        """Train one step on ``frames`` shaped [n_seq, D, D, C] (uint8 BGR or float32 in [0, 1])."""
        frames = self._check_frames(frames)
        s = self.step_count
        self._advance_schedule(s)
        cur, prev, old = s % RING, (s - 1) % RING, (s - 2) % RING
        # A diverging run overflows to Inf and NaN, which the run's divergence check names in one line; numpy's
        # warnings about it would be more lines on stderr, as the native engines give none.
        with np.errstate(all="ignore"):
            self._assemble_inputs(nx.compress_frame(frames).reshape(self.n_seq, -1), cur, prev)
            self._forward(cur)
            self._learn(cur, old, measure=s >= 2)
        self.step_count = s + 1

    def state(self) -> dict[str, Any]:
        """A copy of everything training depends on: resuming from it is bit-identical."""
        return {
            "step": int(self.step_count),
            "n_seq": int(self.n_seq),
            "seed": int(self.seed),
            "weights": self.weights.copy(),
            "momentum": self.velocity.copy(),
            "unit_learning_rate": self.unit_lr.copy(),
            "unit_momentum": self.unit_momentum.copy(),
            "x_ring": self.x.copy(),
            "h_ring": self.h.copy(),
            "y_ring": self.y.copy(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state` (checked against this engine's sizes)."""
        self._check_state(state)
        self.weights = np.array(state["weights"], F32)
        self.velocity = np.array(state["momentum"], F32)
        self.unit_lr = np.array(state["unit_learning_rate"], F32)
        self.unit_momentum = np.array(state["unit_momentum"], F32)
        self.x = np.array(state["x_ring"], F32)
        self.h = np.array(state["h_ring"], F32)
        self.y = np.array(state["y_ring"], F32)
        self.step_count = int(state["step"])
        self.seed = int(state.get("seed", self.seed))
        self._reset_metrics()

    def take_metric_sums(self) -> tuple[np.ndarray, np.ndarray, int]:
        """The raw metric sums since the last call (see EngineBase), then reset."""
        out = (self._metric_sums, self._baseline_sums, self._metric_steps)
        self._reset_metrics()
        return out

    def hidden(self) -> np.ndarray:
        """Hidden activations [n_seq, ΣH] of the last step (for pictures and readouts)."""
        return self.h[(self.step_count - 1) % RING][:, self.topo.h_act].copy()

    def prediction(self, seq: int | None = None) -> np.ndarray:
        """Outputs [n_seq, ΣM] of the last step's forward pass (first half of each: frame s+2), or
        [ΣM] of sequence ``seq``."""
        y = self.y[(self.step_count - 1) % RING]
        return (y if seq is None else y[seq]).copy()

    # --- one step, in the order of §3.3 -----------------------------------------------------
    def _assemble_inputs(self, frame: np.ndarray, cur: int, prev: int) -> None:
        """x(s) from the new frame, κ(h(s−1)) and x(s−1)'s new signal (§3.4)."""
        T = self.topo
        x, h, h_prev = self.x[cur], self.h[cur], self.h[prev]
        x[:, T.frame_dst] = frame[:, T.frame_src]
        x[:, T.hidden_dst] = nx.kappa(h_prev[:, T.hidden_src])
        x[:, T.shift_dst] = self.x[prev][:, T.shift_src]
        x[:, T.x_bias] = 1.0
        h[:, T.h_bias] = 1.0
        if self.spec.feed_context:  # raw (uncompressed) context appended to the hidden vector (§3.10)
            h[:, T.raw_context_dst] = h_prev[:, T.raw_context_src]

    def _forward(self, cur: int) -> None:
        """h = φ(W0·x), y = φ(W1·h) for every unit; each dot product summed along its row."""
        T, H, poly = self.topo, self.topo.hidden, self.spec["polynomial"]
        x, h, y = self.x[cur], self.h[cur], self.y[cur]
        for u in range(T.n_units):
            xu = x[:, T.x_off[u] : T.x_off[u + 1]]
            a = (T.w0_view(self.weights, u)[None] * xu[:, None, :]).sum(axis=-1)
            ho = T.h_off[u]
            h[:, ho : ho + H] = nx.activation(a, poly)
            hu = h[:, ho : T.h_off[u + 1]]
            z = (T.w1_view(self.weights, u)[None] * hu[:, None, :]).sum(axis=-1)
            y[:, T.y_off[u] : T.y_off[u + 1]] = nx.activation(z, poly)

    def _learn(self, cur: int, old: int, measure: bool) -> None:
        """Error of y(s−2) against x(s), backward through W1, momentum update of W0 and W1 (§3.6–3.7)."""
        T, H, spec = self.topo, self.topo.hidden, self.spec
        poly, deriv = spec["polynomial"], spec["derivative"]
        y_old, h_old, x_old = self.y[old], self.h[old], self.x[old]
        err = self.x[cur][:, self._target_src] - y_old  # (0 − y) + x is exactly x − y
        if measure:
            self._metric_sums += np.bincount(
                np.tile(self._metric_bin, self.n_seq), weights=(err.astype(np.float64) ** 2).ravel(), minlength=self._metric_sums.size
            )
            # Copying frame s−2 (x(s−2)[0:P] of the layer-0 units) for frames s and s−1, differences in float64.
            base = self.x[cur][:, self._baseline_target].astype(np.float64) - x_old[:, self._baseline_src].astype(np.float64)
            self._baseline_sums += np.bincount(np.tile(self._baseline_bin, self.n_seq), weights=(base**2).ravel(), minlength=2)
            self._metric_steps += 1
        if spec["opt_abs_diff"]:
            # §3.11 bug kept: the sign kernel covers only the first n_units entries of the error array.
            err[:, : T.n_units] = np.sign(err[:, : T.n_units])
        d_out = nx.delta(y_old, err, poly, deriv)
        for u in range(T.n_units):
            lr, mu = self.unit_lr[u], self.unit_momentum[u]
            W0, V0 = T.w0_view(self.weights, u), T.w0_view(self.velocity, u)
            W1, V1 = T.w1_view(self.weights, u), T.w1_view(self.velocity, u)
            if lr == 0 and mu == 0:  # a unit not yet enabled: its update is zero
                V0.fill(0)
                V1.fill(0)
                continue
            do = d_out[:, T.y_off[u] : T.y_off[u + 1]]  # [n, M]
            hu = h_old[:, T.h_off[u] : T.h_off[u + 1]]  # [n, K]
            xu = x_old[:, T.x_off[u] : T.x_off[u + 1]]  # [n, N+1]
            # εh_k = Σ_j W1[j,k]·δo_j, summed over j in order, with the current (pre-update) W1.
            eps = (W1[None, :, :H] * do[:, :, None]).sum(axis=1)
            dh = nx.delta(hu[:, :H], eps, poly, deriv)
            g1 = nx.mean_over_sequences((lr * do)[:, :, None] * hu[:, None, :])
            g0 = nx.mean_over_sequences((lr * dh)[:, :, None] * xu[:, None, :])
            V1[...] = nx.momentum_update(V1, mu, g1)
            V0[...] = nx.momentum_update(V0, mu, g0)
            W1 += V1
            W0 += V0

    def _reset_metrics(self) -> None:
        self._metric_sums = np.zeros(2 * self.spec.n_layers, np.float64)
        self._baseline_sums = np.zeros(2, np.float64)  # copy-last-frame: two-step, one-step
        self._metric_steps = 0
