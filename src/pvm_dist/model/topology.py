"""The PVM graph (pvm-algorithm.md §2), built once from a spec and handed to every engine.

Units are numbered layer by layer, row-major inside a layer. Each unit is a 2-layer perceptron
whose input vector is [new signal, previous signal, context blocks, bias]. This module computes,
for every unit, its primary sources, its context list (duplicates kept, as the original does),
its sizes and offsets in the flat layouts (§2.7), and the flat gather maps that assemble all
input vectors of a step from the previous step's hidden states and the new frame. The engines
never re-derive the graph: they index these arrays.
"""

from __future__ import annotations

import dataclasses
from functools import cached_property

import numpy as np

from pvm_dist.model.budget import check_graph
from pvm_dist.model.spec import Spec

#: Hidden neurons of the readout MLP and the readout's output patch side = input_block_size (§4).
READOUT_HIDDEN = 100
I64 = np.int64


@dataclasses.dataclass(frozen=True)
class LayerStats:
    """Per-layer sizes, as in the table of pvm-algorithm.md §2.6."""

    index: int
    side: int
    units: int
    signal: int  # P: new-signal size of one unit
    outputs: int  # M = 2P
    context_min: int
    context_max: int
    context_mean: float
    input_min: int  # N (without bias)
    input_max: int
    input_mean: float
    weights: int


def _lower_indices(upper: int, lower_side: int, upper_side: int, q: int) -> list[int]:
    """Rows (or columns) of the lower layer read by upper row ``upper`` (§2.3), exact integers."""
    if upper_side > 1:
        base = (upper * (lower_side - q)) // (upper_side - 1)
    else:
        base = (lower_side - q) // 2
    return [base + i for i in range(q)]


class Topology:
    """The graph of one spec: per-unit lists, sizes, flat offsets and gather maps."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        shapes = spec.layer_shapes
        self.hidden = spec.hidden
        self.layer_offsets = np.cumsum([0] + [s * s for s in shapes]).astype(I64)
        self.n_units = int(self.layer_offsets[-1])
        self.layer = np.repeat(np.arange(len(shapes)), [s * s for s in shapes]).astype(I64)
        local = np.arange(self.n_units) - self.layer_offsets[self.layer]
        side = np.asarray(shapes, dtype=I64)[self.layer]
        self.row, self.col = local // side, local % side
        self.primary = self._build_primary()
        self.dest = self._build_dest()
        self.context = self._build_context()
        self._build_sizes()
        self._build_gather_maps()

    # --- graph ------------------------------------------------------------------------------
    def unit_id(self, layer: int, row: int, col: int) -> int:
        side = self.spec.layer_shapes[layer]
        if not (0 <= row < side and 0 <= col < side):
            raise IndexError(f"L{layer}({row},{col}) is outside the {side}×{side} layer")
        return int(self.layer_offsets[layer]) + row * side + col

    def unit_name(self, u: int) -> str:
        return f"L{self.layer[u]}({self.row[u]},{self.col[u]})"

    def _build_primary(self) -> list[list[int]]:
        spec, shapes = self.spec, self.spec.layer_shapes
        q, rho = spec["fan_in_square_size"], spec["fan_in_radius"]
        centre = (q - 1) / 2
        kept = [(i, j) for i in range(q) for j in range(q) if (i - centre) ** 2 + (j - centre) ** 2 <= rho**2]
        primary: list[list[int]] = [[] for _ in range(self.n_units)]
        for u in range(int(self.layer_offsets[1]) if len(shapes) > 1 else self.n_units, self.n_units):
            level, r, c = int(self.layer[u]), int(self.row[u]), int(self.col[u])
            lower, upper = shapes[level - 1], shapes[level]
            rows = _lower_indices(r, lower, upper, q)
            cols = _lower_indices(c, lower, upper, q)
            primary[u] = sorted(self.unit_id(level - 1, rows[i], cols[j]) for i, j in kept)
        return primary

    def _build_dest(self) -> list[list[int]]:
        dest: list[list[int]] = [[] for _ in range(self.n_units)]
        for u, sources in enumerate(self.primary):
            for v in sources:
                dest[v].append(u)  # u ascends, so every list stays sorted
        return dest

    def _lateral(self, u: int) -> list[int]:
        radius = self.spec["lateral_radius"]
        exclude_self = self.spec["context_exclude_self"]
        level, r, c = int(self.layer[u]), int(self.row[u]), int(self.col[u])
        side = self.spec.layer_shapes[level]
        out = []
        # Offsets that leave the layer are never kept: iterate only inside it (a radius of 10^6 costs nothing).
        for dr in range(max(-radius, -r), min(radius, side - 1 - r) + 1):
            for dc in range(max(-radius, -c), min(radius, side - 1 - c) + 1):
                if dr * dr + dc * dc > radius * radius or (exclude_self and dr == 0 and dc == 0):
                    continue
                out.append(self.unit_id(level, r + dr, c + dc))
        return out

    def _build_context(self) -> list[list[int]]:
        spec = self.spec
        top = range(int(self.layer_offsets[-2]), self.n_units)
        context = []
        for u in range(self.n_units):
            ctx = self._lateral(u) + list(self.dest[u])
            if spec["send_context_two_layers_back"]:
                for d in self.dest[u]:
                    ctx.extend(self.dest[d])  # no de-duplication, as in the original
            if spec["last_layer_context_to_all"]:
                for t in top:
                    if t not in ctx:
                        ctx.append(t)
            context.append(ctx)
        return context

    # --- sizes and flat offsets (§2.5, §2.7) -------------------------------------------------
    def _build_sizes(self) -> None:
        spec, H = self.spec, self.hidden
        patch = spec.block * spec.block * spec.channels
        n_prim = np.array([len(p) for p in self.primary], dtype=I64)
        self.n_context = np.array([len(c) for c in self.context], dtype=I64)
        self.signal = np.where(self.layer == 0, patch, H * n_prim).astype(I64)  # P
        self.inputs = 2 * self.signal + H * self.n_context  # N, without the bias
        self.outputs = 2 * self.signal  # M
        ctx_cols = H * self.n_context if spec.feed_context else np.zeros_like(self.n_context)
        self.hidden_len = H + 1 + ctx_cols  # K: hidden segment, with bias (and raw context)
        self.x_off = np.concatenate([[0], np.cumsum(self.inputs + 1)]).astype(I64)
        self.y_off = np.concatenate([[0], np.cumsum(self.outputs)]).astype(I64)
        self.h_off = np.concatenate([[0], np.cumsum(self.hidden_len)]).astype(I64)
        w0 = H * (self.inputs + 1)
        w1 = self.outputs * self.hidden_len
        self.w0_off = np.concatenate([[0], np.cumsum(w0)]).astype(I64)
        self.w1_off = (self.w0_off[-1] + np.concatenate([[0], np.cumsum(w1)])).astype(I64)
        self.n_primary_projections = int(n_prim.sum())
        self.n_context_projections = int(self.n_context.sum())

    @property
    def w0_total(self) -> int:
        return int(self.w0_off[-1])

    @property
    def w1_total(self) -> int:
        return int(self.w1_off[-1] - self.w0_off[-1])

    @property
    def n_weights(self) -> int:
        return int(self.w1_off[-1])

    @property
    def x_total(self) -> int:
        """Σ(N+1): one sequence's input vectors, bias included."""
        return int(self.x_off[-1])

    @property
    def y_total(self) -> int:
        return int(self.y_off[-1])

    @property
    def h_total(self) -> int:
        return int(self.h_off[-1])

    def w0_view(self, weights: np.ndarray, u: int) -> np.ndarray:
        """Unit u's W0 as an [H, N+1] view into a flat weight (or momentum) vector."""
        return weights[self.w0_off[u] : self.w0_off[u + 1]].reshape(self.hidden, -1)

    def w1_view(self, weights: np.ndarray, u: int) -> np.ndarray:
        """Unit u's W1 as an [M, K] view into a flat weight (or momentum) vector."""
        return weights[self.w1_off[u] : self.w1_off[u + 1]].reshape(int(self.outputs[u]), -1)

    # --- gather maps: how every input vector of step s is assembled (§3.4) -------------------
    def _build_gather_maps(self) -> None:
        spec, H = self.spec, self.hidden
        D, C, b = spec.image_side, spec.channels, spec.block
        frame_dst, frame_src, hid_dst, hid_src, shift_dst, shift_src = [], [], [], [], [], []
        ctx_dst, ctx_src = [], []
        patch_i, patch_j, patch_ch = np.meshgrid(np.arange(b), np.arange(b), np.arange(C), indexing="ij")
        patch_i, patch_j, patch_ch = patch_i.ravel(), patch_j.ravel(), patch_ch.ravel()
        hk = np.arange(H, dtype=I64)
        for u in range(self.n_units):
            off, P = int(self.x_off[u]), int(self.signal[u])
            if self.layer[u] == 0:
                pix_r, pix_c = self.row[u] * b + patch_i, self.col[u] * b + patch_j
                frame_dst.append(off + np.arange(P, dtype=I64))
                frame_src.append((pix_r * D + pix_c) * C + patch_ch)
            else:
                for p, v in enumerate(self.primary[u]):
                    hid_dst.append(off + p * H + hk)
                    hid_src.append(self.h_off[v] + hk)
            shift_dst.append(off + P + np.arange(P, dtype=I64))
            shift_src.append(off + np.arange(P, dtype=I64))
            for k, v in enumerate(self.context[u]):
                hid_dst.append(off + 2 * P + k * H + hk)
                hid_src.append(self.h_off[v] + hk)
                if spec.feed_context:
                    ctx_dst.append(self.h_off[u] + H + 1 + k * H + hk)
                    ctx_src.append(self.h_off[v] + hk)

        def cat(parts: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(parts).astype(I64) if parts else np.zeros(0, dtype=I64)

        #: x positions filled from the compressed frame (flat [D, D, C] index).
        self.frame_dst, self.frame_src = cat(frame_dst), cat(frame_src)
        #: x positions filled with κ(h(s−1)) (flat hidden index): primary signals and context.
        self.hidden_dst, self.hidden_src = cat(hid_dst), cat(hid_src)
        #: x positions that take the previous step's new signal (x(s−1)[0:P]).
        self.shift_dst, self.shift_src = cat(shift_dst), cat(shift_src)
        #: the bias entry of every input vector.
        self.x_bias = self.x_off[1:] - 1
        #: hidden positions holding the constant 1 (index H of every segment).
        self.h_bias = self.h_off[:-1] + H
        #: feed-context mode: hidden positions filled with raw h(s−1) context.
        self.raw_context_dst, self.raw_context_src = cat(ctx_dst), cat(ctx_src)
        #: flat hidden index of each unit's H activations (excluding bias and raw context).
        self.h_act = (self.h_off[:-1, None] + hk[None, :]).ravel()

    # --- what the native engine is handed (native/include/pvm/topology.h) ----------------------
    #: Source kinds of an input entry, as the native engine numbers them.
    X_FROM_FRAME, X_FROM_HIDDEN, X_FROM_PREVIOUS, X_BIAS = 0, 1, 2, 3

    def native_arrays(self) -> dict:
        """Flat, contiguous arrays describing the graph for the C++/CUDA engine.

        ``x_kind[i]``/``x_src[i]`` say where input entry i of step s comes from: the compressed
        frame, κ of a step s−1 hidden activation, step s−1's input entry, or the constant 1.
        ``target_src[j]`` is the input entry that output j is trained against; ``y_bin[j]`` is
        ``layer·2 + half`` (half 0: two-step prediction, 1: one-step) for the error metrics, and
        ``y_unit[j]`` the unit that output j belongs to. ``baseline_src[j]`` is, for a layer-0 output,
        the input entry of step s−2 that the copy-last-frame baseline predicts it with (both halves:
        ``x(s−2)[0:P]``, the frame of step s−2), and −1 for outputs of higher layers.
        """
        x_kind = np.full(self.x_total, -1, np.int8)
        x_src = np.zeros(self.x_total, I64)
        for kind, dst, src in ((self.X_FROM_FRAME, self.frame_dst, self.frame_src),
                               (self.X_FROM_HIDDEN, self.hidden_dst, self.hidden_src),
                               (self.X_FROM_PREVIOUS, self.shift_dst, self.shift_src),
                               (self.X_BIAS, self.x_bias, np.zeros_like(self.x_bias))):
            x_kind[dst], x_src[dst] = kind, src
        assert (x_kind >= 0).all(), "every input entry has a source"
        target_src = np.concatenate([np.arange(self.x_off[u], self.x_off[u] + self.outputs[u]) for u in range(self.n_units)])
        half = np.concatenate([np.repeat([0, 1], self.signal[u]) for u in range(self.n_units)])
        y_bin = np.repeat(self.layer, self.outputs) * 2 + half
        # Layer-0 patches tile the image (D = S0·b), so the baseline's layer-0 outputs cover every frame
        # entry exactly once per half, and its sums are over the frame's entries.
        assert np.array_equal(np.sort(self.frame_src), np.arange(int(np.prod(self.spec.image_shape)))), \
            "layer-0 patches tile the frame"
        baseline_src = np.concatenate([
            self.x_off[u] + np.tile(np.arange(self.signal[u], dtype=I64), 2) if self.layer[u] == 0
            else np.full(self.outputs[u], -1, I64) for u in range(self.n_units)])
        c = np.ascontiguousarray
        return {
            "n_units": self.n_units, "hidden": self.hidden, "n_layers": self.spec.n_layers,
            "image_size": int(np.prod(self.spec.image_shape)), "x_total": self.x_total, "y_total": self.y_total,
            "h_total": self.h_total, "n_weights": self.n_weights,
            "x_off": c(self.x_off), "y_off": c(self.y_off), "h_off": c(self.h_off),
            "w0_off": c(self.w0_off), "w1_off": c(self.w1_off), "unit_layer": c(self.layer),
            "x_kind": x_kind, "x_src": x_src, "h_bias": c(self.h_bias),
            "raw_context_dst": c(self.raw_context_dst), "raw_context_src": c(self.raw_context_src),
            "target_src": c(target_src.astype(I64)), "y_bin": c(y_bin.astype(np.int32)),
            "y_unit": c(np.repeat(np.arange(self.n_units), self.outputs).astype(np.int32)),
            "baseline_src": c(baseline_src.astype(I64)),
        }

    # --- receptive fields (§2.5), used by the readout ----------------------------------------
    @cached_property
    def receptive_rows(self) -> list[frozenset[int]]:
        return self._receptive(self.row)

    @cached_property
    def receptive_cols(self) -> list[frozenset[int]]:
        return self._receptive(self.col)

    def _receptive(self, coord: np.ndarray) -> list[frozenset[int]]:
        out: list[frozenset[int]] = []
        for u in range(self.n_units):
            if self.layer[u] == 0:
                out.append(frozenset([int(coord[u])]))
            else:
                out.append(frozenset().union(*(out[v] for v in self.primary[u])))
        return out

    @cached_property
    def readout_inputs(self) -> list[list[int]]:
        """For each layer-0 position (row-major), the units whose receptive field covers it."""
        S0 = self.spec.layer_shapes[0]
        return [
            [u for u in range(self.n_units) if r in self.receptive_rows[u] and c in self.receptive_cols[u]]
            for r in range(S0)
            for c in range(S0)
        ]

    @cached_property
    def readout_weights(self) -> int:
        out = self.spec.block**2
        return sum(READOUT_HIDDEN * (self.hidden * len(units) + 1) + out * (READOUT_HIDDEN + 1) for units in self.readout_inputs)

    # --- sizes and costs (§2.6, §7) ----------------------------------------------------------
    @property
    def n_context_duplicates(self) -> int:
        return int(sum(len(c) - len(set(c)) for c in self.context))

    def layer_stats(self) -> list[LayerStats]:
        stats = []
        weights = self.hidden * (self.inputs + 1) + self.outputs * self.hidden_len
        for level, side in enumerate(self.spec.layer_shapes):
            sel = self.layer == level
            ctx, n = self.n_context[sel], self.inputs[sel]
            stats.append(
                LayerStats(
                    index=level,
                    side=side,
                    units=int(sel.sum()),
                    signal=int(self.signal[sel][0]),
                    outputs=int(self.outputs[sel][0]),
                    context_min=int(ctx.min()),
                    context_max=int(ctx.max()),
                    context_mean=float(ctx.mean()),
                    input_min=int(n.min()),
                    input_max=int(n.max()),
                    input_mean=float(n.mean()),
                    weights=int(weights[sel].sum()),
                )
            )
        return stats

    @property
    def flops_per_step(self) -> int:
        """Multiply-adds counted as 2; forward + W1ᵀδ + update ≈ 6·W0 + 8·W1 (§7's table, one sequence)."""
        return 6 * self.w0_total + 8 * self.w1_total

    @property
    def flops_per_frame(self) -> int:
        """What each sequence of a step adds with shared weights: forward, W1ᵀδ, outer products = 4·W0 + 6·W1 (§7)."""
        return 4 * self.w0_total + 6 * self.w1_total

    @property
    def flops_per_update(self) -> int:
        """The momentum step and the weight add, once per step whatever n_seq: 3·W."""
        return 3 * (self.w0_total + self.w1_total)

    def roofline(self, n_seq: int, bandwidth_bytes_per_s: float, flops_per_s: float | None) -> tuple[float, str]:
        """Steps/s at the limit for ``n_seq`` sequences, and which limit it is (``memory`` or ``compute``):
        weight traffic plus n_seq sequences' activations over the bandwidth against the FLOPs over the rate."""
        memory = (self.weight_bytes_per_step + n_seq * self.activation_bytes_per_step) / bandwidth_bytes_per_s
        compute = (n_seq * self.flops_per_frame + self.flops_per_update) / flops_per_s if flops_per_s else 0.0
        return 1.0 / max(memory, compute), "compute" if compute > memory else "memory"

    @property
    def weight_bytes_per_step(self) -> int:
        """Fused lower bound of weight traffic, fp32, one sequence: 16·W0 + 20·W1 (§7)."""
        return 16 * self.w0_total + 20 * self.w1_total

    @property
    def activation_bytes_per_step(self) -> int:
        """x, y and target traffic plus gather reads, fp32, one sequence (§7)."""
        projections = self.n_primary_projections + self.n_context_projections
        return 4 * (3 * self.x_total + 3 * self.y_total) + 4 * self.hidden * projections

    def floor_steps_per_second(self, bandwidth_bytes_per_s: float) -> float:
        """The memory-bandwidth floor: steps/s if only the weight traffic had to move."""
        return bandwidth_bytes_per_s / self.weight_bytes_per_step

    def summary(self, bandwidth_bytes_per_s: float | None = None) -> dict:
        """Everything ``pvm-dist info`` prints, as JSON-able values."""
        out = {
            "name": self.spec.name,
            "units": self.n_units,
            "weights": self.n_weights,
            "weights_w0": self.w0_total,
            "weights_w1": self.w1_total,
            "weights_mb_fp32": round(self.n_weights * 4 / 1e6, 1),
            "image": list(self.spec.image_shape),
            "input_memory": self.x_total,
            "output_memory": self.y_total,
            "primary_projections": self.n_primary_projections,
            "context_projections": self.n_context_projections,
            "context_duplicates": self.n_context_duplicates,
            "readout_weights": self.readout_weights,
            "flops_per_step": self.flops_per_step,
            "flops_per_frame": self.flops_per_frame,
            "flops_per_update": self.flops_per_update,
            "weight_bytes_per_step": self.weight_bytes_per_step,
            "activation_bytes_per_step": self.activation_bytes_per_step,
            "bytes_per_step": self.weight_bytes_per_step + self.activation_bytes_per_step,
            "layers": [dataclasses.asdict(s) for s in self.layer_stats()],
        }
        if bandwidth_bytes_per_s:
            out["bandwidth_bytes_per_s"] = bandwidth_bytes_per_s
            out["floor_steps_per_s"] = self.floor_steps_per_second(bandwidth_bytes_per_s)
            out["floor_step_us"] = 1e6 / out["floor_steps_per_s"]
        return out


def build_topology(spec: Spec) -> Topology:
    """Build the graph of ``spec`` (a few ms for small, ~0.5 s for LARGE); a graph that cannot fit in
    this machine's memory is refused first (:func:`~pvm_dist.model.budget.check_graph`)."""
    check_graph(spec)
    return Topology(spec)
