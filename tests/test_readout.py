"""Tests for pvm_dist.model.readout: sizes, initialisation, pixel layout, the gradient step, state,
batch semantics, the evaluation and schedule helpers, and that it learns from real PVM states."""

from __future__ import annotations

import numpy as np
import pytest

import pvm_dist
from pvm_dist.io import checkpoint
from pvm_dist.model.readout import Readout, chance_scores, decode, hit_rate, iou, readout_learning_rate, readout_trains


@pytest.fixture(scope="module")
def tiny():
    spec = pvm_dist.load_spec("tiny")
    return spec, pvm_dist.build_topology(spec)


@pytest.fixture(scope="module")
def small():
    spec = pvm_dist.load_spec("small")
    return spec, pvm_dist.build_topology(spec)


def _hidden(topo, n, seed=0):
    """Hidden activations shaped like engine.hidden(): [n, ΣH] in (0, 1)."""
    return np.random.default_rng(seed).random((n, topo.n_units * topo.hidden), dtype=np.float32)


def _label(spec, n, seed=0):
    return (np.random.default_rng(seed).random((n, spec.image_side, spec.image_side)) > 0.6).astype(np.float32)


# --- sizes and initialisation ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny", "small"])
def test_weight_count_matches_topology(name):
    spec = pvm_dist.load_spec(name)
    topo = pvm_dist.build_topology(spec)
    ro = Readout(topo)
    assert ro.n_weights == topo.readout_weights
    assert ro.state()["readout_weights"].shape == (topo.readout_weights,)
    assert list(ro.input_sizes) == [spec.hidden * len(u) for u in topo.readout_inputs]
    if name == "small":
        assert ro.n_weights == 8_619_800  # pvm-algorithm.md §4


def test_init_ranges_dtype_and_seed(tiny):
    spec, topo = tiny
    ro = Readout(topo, seed=3)
    st = ro.state()
    w = st["readout_weights"]
    assert w.dtype == np.float32 and not st["readout_velocity"].any()
    split = int(ro.w_in_off[-1])
    hidden_bound, out_bound = 1 / np.sqrt(100 - 0.9), 1 / np.sqrt(spec.block**2 - 0.9)
    assert round(hidden_bound, 4) == 0.1005 and round(1 / np.sqrt(25 - 0.9), 4) == 0.2037
    for part, bound in ((w[:split], hidden_bound), (w[split:], out_bound)):
        assert np.abs(part).max() <= bound
        assert np.abs(part).max() > 0.99 * bound  # uses the whole range
        assert abs(part.mean()) < 0.02 * bound  # symmetric
    assert np.array_equal(Readout(topo, seed=3).state()["readout_weights"], w)
    assert not np.array_equal(Readout(topo, seed=4).state()["readout_weights"], w)
    assert ro.momentum == np.float32(spec["momentum"]) and ro.learning_rate == np.float32(0.01)


def test_four_layer_readout_is_refused():
    spec = pvm_dist.load_spec("tiny").with_overrides({"4_layer_readout": 1})
    with pytest.raises(pvm_dist.model.spec.SpecError, match="4_layer_readout"):  # a user error: one line, exit 2
        Readout(pvm_dist.build_topology(spec))


# --- forward and pixel layout -------------------------------------------------------------------
def test_forward_shape_range_and_validation(tiny):
    spec, topo = tiny
    ro = Readout(topo)
    heat = ro.forward(_hidden(topo, 3))
    assert heat.shape == (3, spec.image_side, spec.image_side) and heat.dtype == np.float32
    assert ((heat > 0) & (heat < 1)).all()
    with pytest.raises(ValueError):
        ro.forward(np.zeros((3, 5), np.float32))
    with pytest.raises(ValueError):
        ro.train(_hidden(topo, 2), np.zeros((2, 5, 5), np.float32))


@pytest.mark.parametrize("name,cases", [("tiny", [((1, 2), 5), ((3, 0), 1)]), ("small", [((2, 7), 13), ((11, 4), 21)])])
def test_output_k_of_position_is_pixel(name, cases):
    """Output k·b + j of position (r, c) is pixel (r·b + k, c·b + j): perturb one output bias."""
    spec = pvm_dist.load_spec(name)
    topo = pvm_dist.build_topology(spec)
    ro, b, S = Readout(topo), spec.block, spec.layer_shapes[0]
    hidden = _hidden(topo, 2)
    base = ro.forward(hidden)
    for (r, c), out in cases:
        st = ro.state()
        ro.w_out_view(st["readout_weights"], r * S + c)[out, -1] += 2.0
        probe = Readout(topo)
        probe.load_state(st)
        changed = np.argwhere((probe.forward(hidden) != base).any(axis=0))
        assert changed.tolist() == [[r * b + out // b, c * b + out % b]]


# --- the gradient step, checked by hand -----------------------------------------------------------
def _position_mlp(ro, topo, flat, p, hidden):
    """Explicit float64 forward of position p: input x, hidden h (with bias), output y."""
    H = topo.hidden
    x = np.concatenate([hidden[u * H : (u + 1) * H] for u in topo.readout_inputs[p]] + [[1.0]]).astype(np.float64)
    w_in = ro.w_in_view(flat, p).astype(np.float64)
    w_out = ro.w_out_view(flat, p).astype(np.float64)
    h = np.append(1 / (1 + np.exp(-w_in @ x)), 1.0)
    y = 1 / (1 + np.exp(-w_out @ h))
    return x, h, y, w_in, w_out


def test_gradient_step_one_position(tiny):
    spec, topo = tiny
    b, S = spec.block, spec.layer_shapes[0]
    r, c = 2, 1
    p = r * S + c
    ro = Readout(topo, seed=1, learning_rate=0.05)
    hidden, label = _hidden(topo, 1, seed=2), _label(spec, 1, seed=3)
    w0 = ro.state()["readout_weights"]
    x, h, y, w_in, w_out = _position_mlp(ro, topo, w0, p, hidden[0])
    t = 0.8 * label[0, r * b : (r + 1) * b, c * b : (c + 1) * b].ravel() + 0.1  # κ(label), output k·b + j

    heat = ro.train(hidden, label)
    np.testing.assert_allclose(heat[0, r * b : (r + 1) * b, c * b : (c + 1) * b].ravel(), y, rtol=1e-5)

    # Backprop by hand: δo = y(1−y)(t−y); δh = h(1−h)·(W_outᵀδo) over the non-bias hidden units.
    d_out = y * (1 - y) * (t - y)
    d_hid = h[:-1] * (1 - h[:-1]) * (w_out[:, :-1].T @ d_out)
    st = ro.state()
    v_in, v_out = ro.w_in_view(st["readout_velocity"], p), ro.w_out_view(st["readout_velocity"], p)
    np.testing.assert_allclose(v_out, 0.05 * np.outer(d_out, h), rtol=1e-4, atol=1e-9)
    np.testing.assert_allclose(v_in, 0.05 * np.outer(d_hid, x), rtol=1e-4, atol=1e-10)
    np.testing.assert_array_equal(st["readout_weights"], w0 + st["readout_velocity"])  # first step: W += v, v = η·δ⊗x

    # The update is gradient descent on L = ½Σ(t − y)²: check a few weights by central differences.
    def loss(wi, wo):
        hh = np.append(1 / (1 + np.exp(-wi @ x)), 1.0)
        return 0.5 * np.sum((t - 1 / (1 + np.exp(-wo @ hh))) ** 2)

    eps = 1e-6
    for (i, j) in [(0, 0), (7, 3), (99, x.size - 1)]:
        wp, wm = w_in.copy(), w_in.copy()
        wp[i, j] += eps
        wm[i, j] -= eps
        grad = (loss(wp, w_out) - loss(wm, w_out)) / (2 * eps)
        np.testing.assert_allclose(v_in[i, j], -0.05 * grad, rtol=1e-3, atol=1e-10)
    for (i, j) in [(0, 0), (b * b - 1, 100), (4, 50)]:
        wp, wm = w_out.copy(), w_out.copy()
        wp[i, j] += eps
        wm[i, j] -= eps
        grad = (loss(w_in, wp) - loss(w_in, wm)) / (2 * eps)
        np.testing.assert_allclose(v_out[i, j], -0.05 * grad, rtol=1e-3, atol=1e-10)

    # Second step: v ← μ·v + η·δ⊗input, from the updated weights.
    x2, h2, y2, _, w_out2 = _position_mlp(ro, topo, st["readout_weights"], p, hidden[0])
    d_out2 = y2 * (1 - y2) * (t - y2)
    ro.train(hidden, label)
    v_out2 = ro.w_out_view(ro.state()["readout_velocity"], p)
    np.testing.assert_allclose(v_out2, spec["momentum"] * v_out + 0.05 * np.outer(d_out2, h2), rtol=1e-4, atol=1e-9)


def test_positions_are_independent(tiny):
    """A label change in one patch moves only that position's weights."""
    spec, topo = tiny
    b, S = spec.block, spec.layer_shapes[0]
    hidden, label = _hidden(topo, 1), _label(spec, 1)
    a, other = Readout(topo), Readout(topo)
    flipped = label.copy()
    flipped[0, 1 * b, 3 * b + 2] = 1 - flipped[0, 1 * b, 3 * b + 2]  # pixel of position (1, 3)
    a.train(hidden, label)
    other.train(hidden, flipped)
    wa, wo = a.state()["readout_weights"], other.state()["readout_weights"]
    for p in range(S * S):
        same = np.array_equal(a.w_in_view(wa, p), a.w_in_view(wo, p)) and np.array_equal(a.w_out_view(wa, p), a.w_out_view(wo, p))
        assert same == (p != 1 * S + 3)


# --- state and batches ----------------------------------------------------------------------------
def test_state_round_trip_exact(tiny, small, tmp_path):
    spec, topo = tiny
    ro = Readout(topo, seed=0, learning_rate=0.2)
    for k in range(3):
        ro.train(_hidden(topo, 2, seed=k), _label(spec, 2, seed=k))
    st = ro.state()
    assert all(isinstance(v, np.ndarray) for v in st.values())
    path = checkpoint.save(tmp_path / "ro.ckpt", {"step": 3, **st}, {"spec": spec.to_dict()})
    loaded = checkpoint.load(path).state
    twin = Readout(topo, seed=9)
    twin.load_state({k: v for k, v in loaded.items() if k != "step"})
    assert twin.learning_rate == np.float32(0.2)
    for key, value in twin.state().items():
        np.testing.assert_array_equal(value, st[key])
    hid, lab = _hidden(topo, 2, seed=7), _label(spec, 2, seed=7)
    np.testing.assert_array_equal(twin.train(hid, lab), ro.train(hid, lab))
    np.testing.assert_array_equal(twin.state()["readout_weights"], ro.state()["readout_weights"])
    with pytest.raises(ValueError):
        Readout(small[1]).load_state(st)


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_identical_sequences_equal_one_sequence(name):
    """n_seq = 2 identical sequences reproduce n_seq = 1 bit for bit (outputs, weights, velocities)."""
    spec = pvm_dist.load_spec(name)
    topo = pvm_dist.build_topology(spec)
    one, two = Readout(topo, seed=5, learning_rate=0.3), Readout(topo, seed=5, learning_rate=0.3)
    for k in range(3):
        hid, lab = _hidden(topo, 1, seed=k), _label(spec, 1, seed=k)
        h1 = one.train(hid, lab)
        h2 = two.train(np.repeat(hid, 2, axis=0), np.repeat(lab, 2, axis=0))
        np.testing.assert_array_equal(h2[0], h1[0])
        np.testing.assert_array_equal(h2[1], h1[0])
    for key in ("readout_weights", "readout_velocity"):
        np.testing.assert_array_equal(two.state()[key], one.state()[key])


def test_batch_update_is_mean_of_sequence_updates(tiny):
    spec, topo = tiny
    hid, lab = _hidden(topo, 2, seed=1), _label(spec, 2, seed=1)
    batch = Readout(topo, seed=2)
    batch.train(hid, lab)
    singles = []
    for i in range(2):
        ro = Readout(topo, seed=2)
        ro.train(hid[i : i + 1], lab[i : i + 1])
        singles.append(ro.state()["readout_velocity"].astype(np.float64))
    want = (singles[0] + singles[1]) / 2
    np.testing.assert_allclose(batch.state()["readout_velocity"], want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


# --- evaluation helpers ---------------------------------------------------------------------------
def test_decode_iou_hit_rate():
    np.testing.assert_allclose(decode(np.array([0.0, 0.1, 0.5, 0.9, 1.0], np.float32)), [0, 0, 0.5, 1, 1], atol=1e-6)
    mask = np.zeros((3, 4, 4), np.float32)
    mask[0, :2, :2] = 1
    mask[1, 1:3, 1:3] = 1
    heat = np.full((3, 4, 4), 0.1, np.float32)
    heat[0, :2, :2] = 0.9  # exact
    heat[1, 2:4, 2:4] = 0.9  # overlaps 1 of 7 pixels; peak (2, 2) inside the box
    # frame 2: empty label, empty prediction → IoU 1, excluded from hit rate
    assert iou(heat[0], mask[0]) == 1.0
    assert iou(heat[1], mask[1]) == pytest.approx(1 / 7)
    assert iou(heat[2], mask[2]) == 1.0
    assert iou(heat, mask) == pytest.approx((1 + 1 / 7 + 1) / 3)
    assert iou(np.full((4, 4), 0.9, np.float32), np.zeros((4, 4))) == 0.0
    assert hit_rate(heat, mask) == 1.0
    heat[1, 3, 3] = 0.95  # peak moves outside the box
    assert hit_rate(heat, mask) == 0.5
    assert np.isnan(hit_rate(heat[2:], mask[2:]))


def test_chance_scores_match_brute_force():
    rng = np.random.default_rng(5)
    masks = np.zeros((6, 12, 12), np.float32)
    for m in masks[:5]:
        y, x = rng.integers(0, 10, 2)
        m[y : y + 3, x : x + 2] = 1  # a 3×2 box
    # masks[5] is empty: "no target"

    def box_iou(a, b):
        return (a & b).sum() / (a | b).sum()

    want = []
    for m in masks > 0.5:
        if not m.any():
            want.append(0.0)
            continue
        placements = []
        for y in range(12 - 3 + 1):
            for x in range(12 - 2 + 1):
                box = np.zeros_like(m)
                box[y : y + 3, x : x + 2] = True
                placements.append(box_iou(box, m))
        want.append(np.mean(placements))
    got = chance_scores(masks)
    assert got["readout_iou_chance"] == pytest.approx(np.mean(want))
    assert got["readout_hit_rate_chance"] == pytest.approx(6 / 144)
    same = np.broadcast_to(masks[0], (4, 12, 12))  # a target that never moves: the fixed heatmap finds it
    assert chance_scores(same)["readout_iou_position_blind"] == 1.0
    assert chance_scores(same)["readout_hit_rate_position_blind"] == 1.0


# --- schedule -------------------------------------------------------------------------------------
def test_readout_learning_rate_schedule():
    small = pvm_dist.load_spec("small")
    assert readout_learning_rate(small, 0) == 0.01
    assert readout_learning_rate(small, 999_999) == 0.01
    assert readout_learning_rate(small, 1_000_000) == pytest.approx(10 * 0.001)  # intermediate wins over final
    tiny = pvm_dist.load_spec("tiny")  # intermediate 0.002 @ 200, final 0.0005 @ 300
    assert [readout_learning_rate(tiny, s) for s in (0, 199, 200, 299, 300, 10**6)] == pytest.approx([0.01, 0.01, 0.02, 0.02, 0.005, 0.005])
    classic = pvm_dist.load_spec("classic")  # no intermediate rate
    assert readout_learning_rate(classic, 10**6) == pytest.approx(10 * 5e-5)
    assert readout_learning_rate(tiny.with_overrides({"readout_multiplier": 4}), 200) == pytest.approx(0.008)


def test_readout_trains():
    small = pvm_dist.load_spec("small")
    assert readout_trains(small, 0)  # pvm-dist default: from step 0
    assert not readout_trains(small, 99, readout_from=100) and readout_trains(small, 100, readout_from=100)
    assert not readout_trains(small, 1_000_000, readout_from=None)  # the original: only after 10⁶
    assert readout_trains(small, 1_000_001, readout_from=None)
    with pytest.raises(ValueError):
        readout_trains(pvm_dist.load_spec("classic"), 5, readout_from=None)


# --- learning from a real PVM -------------------------------------------------------------------
def _moving_square(n, side, image, seed):
    """Frames [n, 1, D, D, 3] of a bright side×side square bouncing on black, and its masks [n, D, D]."""
    rng = np.random.default_rng(seed)
    pos, vel = rng.integers(0, image - side + 1, size=2), rng.choice([-1, 1], size=2)
    frames = np.zeros((n, 1, image, image, 3), np.float32)
    masks = np.zeros((n, image, image), np.float32)
    for i in range(n):
        r, c = pos
        frames[i, 0, r : r + side, c : c + side] = 1.0
        masks[i, r : r + side, c : c + side] = 1.0
        for k in range(2):
            if rng.random() < 0.05:
                vel[k] = -vel[k]
            if not 0 <= pos[k] + vel[k] <= image - side:
                vel[k] = -vel[k]
            pos[k] += vel[k]
    return frames, masks


def test_readout_learns_from_pvm_hidden_states():
    """Train tiny on a moving square, the readout on its hidden states; held-out frames beat chance.

    tiny's own schedule (lr 0.01, down to 0.002/0.0005 at steps 200/300) leaves the hidden states
    almost constant after a few hundred steps (±0.005 around ~0.8), and neither the readout nor
    any baseline separates them then; a constant PVM rate of 0.1 gives informative states in 400.
    The readout's own η = 0.01 is meant for millions of steps; 0.5 converges in 40 epochs here.
    """
    spec = pvm_dist.load_spec("tiny").with_overrides(
        {"delay_each_layer_learning": 10, "initial_learning_rate": 0.1,
         "delay_final_learning_rate": 10**6, "delay_intermediate_learning_rate": 10**6}
    )
    n_pvm, n_train, n_test = 400, 400, 200
    frames, masks = _moving_square(n_pvm + n_train + n_test, side=4, image=spec.image_side, seed=100)
    engine = pvm_dist.build_engine(spec, backend="reference", n_seq=1, seed=0)
    hidden = []
    for f in frames:
        engine.step(f)
        hidden.append(engine.hidden()[0])
    hidden = np.asarray(hidden)
    train_h, train_m = hidden[n_pvm : n_pvm + n_train], masks[n_pvm : n_pvm + n_train]
    test_h, test_m = hidden[n_pvm + n_train :], masks[n_pvm + n_train :]

    ro = Readout(engine.topo, seed=0, learning_rate=0.5)
    order = np.random.default_rng(0)
    for _ in range(40):
        for i in order.permutation(n_train):
            ro.train(train_h[i : i + 1], train_m[i : i + 1])
    heat = ro.forward(test_h)

    # Chance: a readout that always predicts the mean training mask (its best threshold, its peak).
    mean = np.broadcast_to(0.8 * train_m.mean(axis=0) + 0.1, test_m.shape)
    chance_iou = max(iou(mean, test_m, th) for th in np.linspace(0.01, 0.99, 99))
    chance_hit = hit_rate(mean, test_m)
    got_iou, got_hit = iou(heat, test_m), hit_rate(heat, test_m)
    print(f"IoU {got_iou:.3f} (chance {chance_iou:.3f}), hit rate {got_hit:.3f} (chance {chance_hit:.3f})")
    assert got_iou > chance_iou + 0.15
    assert got_hit > chance_hit + 0.4
