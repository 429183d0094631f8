"""The supervised heatmap readout (pvm-algorithm.md §4), numpy reference.

One independent 2-layer logistic MLP per layer-0 grid position (r, c). Its input is the
concatenation, over ``topology.readout_inputs[pos]`` (the units whose receptive field covers
(r, c), id order), of each unit's H uncompressed hidden activations of the current step, then a
bias 1; a hidden layer of 100 logistic neurons plus a bias; b² logistic outputs forming the b×b
heatmap patch at (r, c): output ``k·b + j`` is pixel ``(r·b + k, c·b + j)``. Targets are κ(label)
= 0.8·label + 0.1; training is plain backprop with momentum SGD and never reaches the PVM.

Positions with the same number of input units are stacked, so a step is a few batched matrix
products per input size (15 sizes for small.json), not a loop over positions.

Flat layout of ``state()`` (for checkpoints, pickle-free): all hidden-layer matrices in position
order, each row-major ``[100, In_p + 1]`` (last column = bias), then all output-layer matrices in
position order, each row-major ``[b², 101]`` (last column = bias). Velocities use the same layout.
Keys carry a ``readout_`` prefix so they can sit beside an engine's own state in one checkpoint.

With ``n_seq > 1`` sequences the update is the mean over sequences of the per-sequence updates,
summed in float64, so ``n_seq = k`` identical sequences reproduce ``n_seq = 1`` bit for bit (as
the engines do, architecture.md §2).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pvm_dist.model.numerics import kappa
from pvm_dist.model.spec import Spec, SpecError
from pvm_dist.model.topology import READOUT_HIDDEN, Topology

F32, F64, I64 = np.float32, np.float64, np.int64

#: The readout's hard-coded initial learning rate (§4).
INITIAL_READOUT_LEARNING_RATE = 0.01

__all__ = [
    "INITIAL_READOUT_LEARNING_RATE",
    "Readout",
    "decode",
    "hit_rate",
    "iou",
    "readout_learning_rate",
    "readout_trains",
]


def _logistic(a: np.ndarray) -> np.ndarray:
    """1/(1+e^−a) in float32 (e^−a may overflow to inf for a < −88: the result is then 0)."""
    with np.errstate(over="ignore"):
        return F32(1.0) / (F32(1.0) + np.exp(-a))


def _init_range(n_out: int) -> float:
    """Half-width of the uniform initialisation: 1/sqrt(n_out − 0.9), n_out = fan-out (§4)."""
    return 1.0 / np.sqrt(n_out - 0.9)


class _Group:
    """Positions with equal input length, stacked: W_in [G, 100, I+1], W_out [G, b², 101]."""

    def __init__(self, positions: np.ndarray, gather: np.ndarray, n_in: int, n_out: int) -> None:
        G = len(positions)
        self.positions = positions  # [G] layer-0 positions (row-major)
        self.gather = gather  # [G, I] columns of the hidden array forming each input
        self.w_in = np.zeros((G, READOUT_HIDDEN, n_in + 1), F32)
        self.w_out = np.zeros((G, n_out, READOUT_HIDDEN + 1), F32)
        self.v_in = np.zeros_like(self.w_in)
        self.v_out = np.zeros_like(self.w_out)


class Readout:
    """Per-position 2-layer logistic MLPs mapping a step's hidden states to a D×D heatmap (§4)."""

    def __init__(
        self,
        topology: Topology,
        seed: int = 0,
        learning_rate: float = INITIAL_READOUT_LEARNING_RATE,
        momentum: float | None = None,
    ) -> None:
        """Build and seed the readout; ``momentum`` defaults to the spec's ``momentum`` (§4)."""
        spec = topology.spec
        if spec["4_layer_readout"]:
            raise SpecError(spec.source, "4_layer_readout", "a second readout hidden layer is not implemented; "
                                                            "set it to 0, or train without the readout (--no-readout)")
        self.topo, self.spec = topology, spec
        self.seed = seed
        self.block, self.image_side, self.side = spec.block, spec.image_side, spec.layer_shapes[0]
        self.n_positions = self.side * self.side
        self.n_outputs = spec.block**2
        self.n_hidden = READOUT_HIDDEN
        H = spec.hidden
        self.learning_rate = F32(learning_rate)
        self.momentum = F32(spec["momentum"] if momentum is None else momentum)

        units = topology.readout_inputs
        #: Input length of each position's MLP, without the bias (H · number of covering units).
        self.input_sizes = np.array([H * len(u) for u in units], I64)
        w_in = self.n_hidden * (self.input_sizes + 1)
        w_out = np.full(self.n_positions, self.n_outputs * (self.n_hidden + 1), I64)
        #: Offsets of each position's hidden-layer / output-layer matrix in the flat layout.
        self.w_in_off = np.concatenate([[0], np.cumsum(w_in)]).astype(I64)
        self.w_out_off = (self.w_in_off[-1] + np.concatenate([[0], np.cumsum(w_out)])).astype(I64)

        hk = np.arange(H, dtype=I64)
        self._groups: list[_Group] = []
        for n_in in np.unique(self.input_sizes):
            positions = np.flatnonzero(self.input_sizes == n_in).astype(I64)
            gather = np.stack([(np.asarray(units[p], I64)[:, None] * H + hk).ravel() for p in positions])
            self._groups.append(_Group(positions, gather, int(n_in), self.n_outputs))

        # Initial weights: U[0,1) in float64 for the whole flat vector, scaled to ±1/sqrt(n_out − 0.9)
        # per layer (fan-out: 100 for the hidden layer, b² for the output layer), then float32.
        flat = np.random.default_rng(seed).random(self.n_weights, dtype=F64)
        split = int(self.w_in_off[-1])
        flat[:split] = (2.0 * flat[:split] - 1.0) * _init_range(self.n_hidden)
        flat[split:] = (2.0 * flat[split:] - 1.0) * _init_range(self.n_outputs)
        self._scatter(flat.astype(F32), velocity=False)

    # --- sizes and layout ---------------------------------------------------------------------
    @property
    def n_weights(self) -> int:
        """Total weight count, biases included (small.json: 8,619,800 = topology.readout_weights)."""
        return int(self.w_out_off[-1])

    def w_in_view(self, flat: np.ndarray, position: int) -> np.ndarray:
        """Position's hidden-layer matrix [100, In+1] as a view into a flat weight/velocity vector."""
        return flat[self.w_in_off[position] : self.w_in_off[position + 1]].reshape(self.n_hidden, -1)

    def w_out_view(self, flat: np.ndarray, position: int) -> np.ndarray:
        """Position's output-layer matrix [b², 101] as a view into a flat weight/velocity vector."""
        return flat[self.w_out_off[position] : self.w_out_off[position + 1]].reshape(self.n_outputs, -1)

    def _flatten(self, velocity: bool) -> np.ndarray:
        flat = np.empty(self.n_weights, F32)
        for g in self._groups:
            w_in, w_out = (g.v_in, g.v_out) if velocity else (g.w_in, g.w_out)
            for i, p in enumerate(g.positions):
                self.w_in_view(flat, p)[...] = w_in[i]
                self.w_out_view(flat, p)[...] = w_out[i]
        return flat

    def _scatter(self, flat: np.ndarray, velocity: bool) -> None:
        for g in self._groups:
            w_in, w_out = (g.v_in, g.v_out) if velocity else (g.w_in, g.w_out)
            for i, p in enumerate(g.positions):
                w_in[i] = self.w_in_view(flat, p)
                w_out[i] = self.w_out_view(flat, p)

    # --- forward and training -----------------------------------------------------------------
    def _check_hidden(self, hidden: np.ndarray) -> np.ndarray:
        hidden = np.asarray(hidden)
        want = self.topo.n_units * self.spec.hidden
        if hidden.ndim != 2 or hidden.shape[1] != want:
            raise ValueError(f"hidden has shape {hidden.shape}, the readout needs [n_seq, {want}]")
        return hidden.astype(F32, copy=False)

    def _inputs(self, hidden: np.ndarray, g: _Group) -> np.ndarray:
        """Input vectors [n, G, I+1] (bias last) of a group's positions."""
        x = np.empty((hidden.shape[0], len(g.positions), g.gather.shape[1] + 1), F32)
        x[..., :-1] = hidden[:, g.gather]
        x[..., -1] = 1.0
        return x

    @staticmethod
    def _matvec(w: np.ndarray, v: np.ndarray) -> np.ndarray:
        """w [G, R, C] times each sequence's v [n, G, C] → [n, G, R].

        One stacked matrix-vector product per sequence, so a sequence's result does not depend on
        how many others share the batch (a matrix-matrix product may sum in another order).
        """
        out = np.empty((v.shape[0], w.shape[0], w.shape[1]), F32)
        for s in range(v.shape[0]):
            out[s] = np.matmul(w, v[s, :, :, None])[..., 0]
        return out

    def _to_heatmap(self, patches: np.ndarray) -> np.ndarray:
        """[n, positions, b²] → [n, D, D]: output k·b + j of (r, c) is pixel (r·b + k, c·b + j)."""
        n, S, b = patches.shape[0], self.side, self.block
        return patches.reshape(n, S, S, b, b).transpose(0, 1, 3, 2, 4).reshape(n, S * b, S * b)

    def _to_patches(self, image: np.ndarray) -> np.ndarray:
        """[n, D, D] → [n, positions, b²] (inverse of ``_to_heatmap``)."""
        n, S, b = image.shape[0], self.side, self.block
        return image.reshape(n, S, b, S, b).transpose(0, 1, 3, 2, 4).reshape(n, S * S, b * b)

    def _pass(self, hidden: np.ndarray, label_mask: np.ndarray | None) -> np.ndarray:
        """Forward every group; with a label, also backprop and apply the momentum update."""
        hidden = self._check_hidden(hidden)
        n = hidden.shape[0]
        patches = np.empty((n, self.n_positions, self.n_outputs), F32)
        targets = None
        if label_mask is not None:
            label_mask = np.asarray(label_mask, F32)
            if label_mask.shape != (n, self.image_side, self.image_side):
                raise ValueError(f"label_mask has shape {label_mask.shape}, the readout needs {(n, self.image_side, self.image_side)}")
            targets = kappa(self._to_patches(label_mask))  # [n, P, b²]
        for g in self._groups:
            x = self._inputs(hidden, g)  # [n, G, I+1]
            h = np.empty((n, len(g.positions), self.n_hidden + 1), F32)
            h[..., :-1] = _logistic(self._matvec(g.w_in, x))
            h[..., -1] = 1.0
            y = _logistic(self._matvec(g.w_out, h))  # [n, G, b²]
            patches[:, g.positions, :] = y
            if targets is not None:
                self._learn(g, x, h, y, targets[:, g.positions, :])
        return self._to_heatmap(patches)

    def _learn(self, g: _Group, x: np.ndarray, h: np.ndarray, y: np.ndarray, t: np.ndarray) -> None:
        """Backprop one group (both deltas from the pre-update weights), then momentum SGD."""
        one, lr, mu = F32(1.0), self.learning_rate, self.momentum
        d_out = y * (one - y) * (t - y)  # [n, G, b²]
        w_out_t = np.ascontiguousarray(g.w_out[:, :, :-1].transpose(0, 2, 1))  # [G, 100, b²]
        hid = h[..., :-1]
        d_hid = hid * (one - hid) * self._matvec(w_out_t, d_out)  # h(1−h)·W_outᵀδ, [n, G, 100]
        for w, v, delta, inp in ((g.w_out, g.v_out, d_out, h), (g.w_in, g.v_in, d_hid, x)):
            grad = self._mean_outer(lr * delta, inp)
            np.multiply(v, mu, out=v)
            np.add(v, grad, out=v)
            np.add(w, v, out=w)

    @staticmethod
    def _mean_outer(delta: np.ndarray, inp: np.ndarray) -> np.ndarray:
        """Mean over sequences of δ⊗input: [n, G, R] × [n, G, C] → [G, R, C] float32.

        One sequence: the float32 products. Several: summed in float64 (exact products), divided
        by n and rounded once, so k identical sequences equal one sequence exactly.
        """
        n = delta.shape[0]
        if n == 1:
            return delta[0, :, :, None] * inp[0, :, None, :]
        d = np.ascontiguousarray(delta.transpose(1, 2, 0), F64)  # [G, R, n]
        i = np.ascontiguousarray(inp.transpose(1, 0, 2), F64)  # [G, n, C]
        total = np.matmul(d, i)
        return (total / n).astype(F32)

    def forward(self, hidden: np.ndarray) -> np.ndarray:
        """Heatmap float32 [n_seq, D, D] in (0, 1) (compressed: 0.1 ≈ no target, 0.9 ≈ target)."""
        return self._pass(hidden, None)

    def train(self, hidden: np.ndarray, label_mask: np.ndarray) -> np.ndarray:
        """One momentum-SGD step towards κ(label_mask) [n_seq, D, D]; returns the pre-update heatmap.

        Sequences whose label is absent should be left out by the caller (the original does not
        train without a label); an all-zero mask means "no target in view" and trains towards 0.1.
        """
        return self._pass(hidden, label_mask)

    def set_learning_rate(self, learning_rate: float) -> None:
        """Set η (float32) for the following updates."""
        self.learning_rate = F32(learning_rate)

    # --- state ----------------------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """Copies of weights and velocities (flat layout, module docstring), rates and sizes."""
        return {
            "readout_weights": self._flatten(velocity=False),
            "readout_velocity": self._flatten(velocity=True),
            "readout_input_sizes": self.input_sizes.copy(),
            "readout_hidden": np.asarray(self.n_hidden, I64),
            "readout_outputs": np.asarray(self.n_outputs, I64),
            "readout_learning_rate": np.asarray(self.learning_rate, F32),
            "readout_momentum": np.asarray(self.momentum, F32),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state` exactly; ValueError if it was saved for other sizes."""
        for key in ("readout_weights", "readout_velocity", "readout_input_sizes", "readout_hidden", "readout_outputs"):
            if key not in state:
                raise ValueError(f"readout state lacks '{key}'")
        sizes = np.asarray(state["readout_input_sizes"])
        if (
            int(state["readout_hidden"]) != self.n_hidden
            or int(state["readout_outputs"]) != self.n_outputs
            or sizes.shape != self.input_sizes.shape
            or not np.array_equal(sizes, self.input_sizes)
        ):
            raise ValueError("readout state was saved for a different topology (input sizes, hidden or output count differ)")
        for key in ("readout_weights", "readout_velocity"):
            if np.shape(state[key]) != (self.n_weights,):
                raise ValueError(f"readout state '{key}' has shape {np.shape(state[key])}, expected ({self.n_weights},)")
        self._scatter(np.asarray(state["readout_weights"], F32), velocity=False)
        self._scatter(np.asarray(state["readout_velocity"], F32), velocity=True)
        if "readout_learning_rate" in state:
            self.learning_rate = F32(state["readout_learning_rate"])
        if "readout_momentum" in state:
            self.momentum = F32(state["readout_momentum"])


# --- evaluation -------------------------------------------------------------------------------
def decode(heatmap: np.ndarray) -> np.ndarray:
    """Undo κ: (v − 0.1)/0.8 clipped to [0, 1], as the original's display does."""
    return np.clip((np.asarray(heatmap, F32) - F32(0.1)) / F32(0.8), 0.0, 1.0)


def _frames(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim < 2:
        raise ValueError(f"expected [D, D] or [n, D, D], got shape {a.shape}")
    return a.reshape(-1, a.shape[-2] * a.shape[-1])


def iou(heatmap: np.ndarray, label_mask: np.ndarray, threshold: float = 0.5) -> float:
    """Mean over frames of IoU(decode(heatmap) ≥ threshold, label_mask > 0.5).

    Accepts [D, D] or [n, D, D]. A frame where both the prediction and the label are empty counts
    as IoU 1 (correctly reporting "no target"); empty vs non-empty gives 0.
    """
    pred = _frames(decode(heatmap)) >= threshold
    true = _frames(label_mask) > 0.5
    if pred.shape != true.shape:
        raise ValueError(f"heatmap {np.shape(heatmap)} and label_mask {np.shape(label_mask)} differ")
    inter = (pred & true).sum(axis=1)
    union = (pred | true).sum(axis=1)
    return float(np.mean(np.where(union == 0, 1.0, inter / np.maximum(union, 1))))


def hit_rate(heatmap: np.ndarray, label_mask: np.ndarray) -> float:
    """Fraction of labelled frames whose heatmap peak (first argmax) lies inside the labelled box.

    Frames with an empty (absent) label are excluded; NaN if no frame has a label.
    """
    heat, true = _frames(heatmap), _frames(label_mask) > 0.5
    if heat.shape != true.shape:
        raise ValueError(f"heatmap {np.shape(heatmap)} and label_mask {np.shape(label_mask)} differ")
    present = true.any(axis=1)
    if not present.any():
        return float("nan")
    peak = np.argmax(heat, axis=1)
    hits = true[np.arange(len(peak)), peak]
    return float(hits[present].mean())


def chance_scores(label_masks: np.ndarray) -> dict[str, float]:
    """What ``iou`` and ``hit_rate`` give without looking at the frames, over labels [n, D, D].

    ``*_chance``: a box of the labelled box's size placed uniformly at random (exact expectation), and a
    peak at a uniformly random pixel. ``*_position_blind``: one fixed heatmap, the labels' own mean
    (κ-compressed) at its best threshold; it knows where targets tend to be in these very frames, so it
    is the stronger baseline.
    """
    masks = np.asarray(label_masks)
    masks = (masks if masks.dtype == bool else masks > 0.5).reshape(-1, *masks.shape[-2:])
    ious = []
    for m in masks:
        rows, cols = np.flatnonzero(m.any(axis=1)), np.flatnonzero(m.any(axis=0))
        if not len(rows):
            ious.append(0.0)  # a random box is never empty, so it never matches "no target"
            continue
        h, w = rows[-1] - rows[0] + 1, cols[-1] - cols[0] + 1
        ii = np.pad(m.cumsum(0).cumsum(1), ((1, 0), (1, 0)))
        inter = ii[h:, w:] - ii[:-h, w:] - ii[h:, :-w] + ii[:-h, :-w]  # overlap of every placement
        ious.append(float(np.mean(inter / (h * w + m.sum() - inter))))
    out = {"readout_iou_chance": float(np.mean(ious))}
    present = masks.any(axis=(1, 2))
    if present.any():
        out["readout_hit_rate_chance"] = float(masks[present].mean())
    prior = np.broadcast_to(0.8 * masks.mean(axis=0, dtype=np.float32) + 0.1, masks.shape)
    out["readout_iou_position_blind"] = max(iou(prior, masks, th) for th in np.linspace(0.01, 0.99, 99))
    if present.any():
        out["readout_hit_rate_position_blind"] = hit_rate(prior, masks)
    return out


# --- schedule -----------------------------------------------------------------------------------
def readout_learning_rate(spec: Spec, step: int) -> float:
    """Readout η in force at ``step`` (§4): 0.01, then readout_multiplier × the final / intermediate
    PVM rate from ``delay_final_learning_rate`` / ``delay_intermediate_learning_rate`` on.

    Changes apply in step order; when both delays are equal the intermediate rate wins, as in the
    PVM schedule (§3.8). Steps count frames per sequence.
    """
    mult = spec["readout_multiplier"]
    changes = [(spec["delay_final_learning_rate"], 0, mult * spec["final_learning_rate"])]
    if spec["delay_intermediate_learning_rate"] is not None:
        changes.append((spec["delay_intermediate_learning_rate"], 1, mult * spec["intermediate_learning_rate"]))
    lr = INITIAL_READOUT_LEARNING_RATE
    for at, _, rate in sorted(changes):
        if step >= at:
            lr = rate
    return float(lr)


def readout_trains(spec: Spec, step: int, readout_from: int | None = 0) -> bool:
    """Whether the readout trains at ``step``.

    The original trains only when ``step > delay_intermediate_learning_rate`` (10⁶ for the zoo
    specs; a KeyError where the key is missing). pvm-dist instead trains from ``readout_from``
    on (default 0: from the start; the readout never affects the PVM, so early training only
    costs time). ``readout_from=None`` applies the original's rule, and raises ValueError for
    specs without ``delay_intermediate_learning_rate``. Steps without a label never train.
    """
    if readout_from is None:
        delay = spec["delay_intermediate_learning_rate"]
        if delay is None:
            raise ValueError(f"spec {spec.name} has no delay_intermediate_learning_rate, which the original's readout gate needs")
        return step > delay
    return step >= readout_from
