"""The reference engine against hand computation and the rules of pvm-algorithm.md §3."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import STEPPED_STATE, random_frames

from pvm_dist import build_engine, load_spec
from pvm_dist.model.numerics import initial_weights

# One unit, one pixel, one hidden neuron: input [σ(s), σ(s−1), κ(h(s−1)), 1], hidden [h, 1],
# outputs [two-step, one-step]. Small enough to compute by hand.
MICRO = {
    "layer_shapes": [1], "input_block_size": 1, "hidden_block_size": 1, "input_channels": 1,
    "lateral_radius": 0, "fan_in_square_size": 1, "fan_in_radius": 0, "last_layer_context_to_all": 1,
    "initial_learning_rate": 0.5, "momentum": 0.25, "delay_each_layer_learning": 1000,
    "final_learning_rate": 0.1, "delay_final_learning_rate": 100000,
}


def phi(a: float) -> float:
    return a / (2 * (1 + abs(a))) + 0.5


def g_original(y: float) -> float:
    """§3.6 closed form of the CUDA kernel's factor: (1+|u|)² / (2(1+2|u|)²), u = 2y − 1."""
    u = abs(2 * y - 1)
    return (1 + u) ** 2 / (2 * (1 + 2 * u) ** 2)


def g_exact(y: float) -> float:
    return (1 - abs(2 * y - 1)) ** 2 / 2


def hand_steps(w0, w1, pixels, lr, mu, g):
    """Unrolled float64 arithmetic of §3.3–3.7 for the MICRO spec; returns (W0, W1, y) per step."""
    w0, w1 = [float(v) for v in w0], [[float(v) for v in row] for row in w1]
    v0, v1 = [0.0] * 4, [[0.0, 0.0], [0.0, 0.0]]
    xs, hs, ys = {-2: [1.0] * 4, -1: [1.0] * 4}, {-2: [1.0, 1.0], -1: [1.0, 1.0]}, {-2: [1.0, 1.0], -1: [1.0, 1.0]}
    out = []
    for s, p in enumerate(pixels):
        c = p / 255 * 0.8 + 0.1
        x = [c, xs[s - 1][0], 0.8 * hs[s - 1][0] + 0.1, 1.0]
        h = [phi(sum(w * xi for w, xi in zip(w0, x))), 1.0]
        y = [phi(sum(w * hi for w, hi in zip(row, h))) for row in w1]
        xs[s], hs[s], ys[s] = x, h, y
        x2, h2, y2 = xs[s - 2], hs[s - 2], ys[s - 2]
        err = [x[0] - y2[0], x[1] - y2[1]]
        d_out = [g(y2[j]) * err[j] for j in range(2)]
        eps = sum(w1[j][0] * d_out[j] for j in range(2))  # current W1, before this step's update
        d_h = g(h2[0]) * eps
        v1 = [[mu * v1[j][k] + lr * d_out[j] * h2[k] for k in range(2)] for j in range(2)]
        v0 = [mu * v0[i] + lr * d_h * x2[i] for i in range(4)]
        w1 = [[w1[j][k] + v1[j][k] for k in range(2)] for j in range(2)]
        w0 = [w0[i] + v0[i] for i in range(4)]
        out.append((list(w0), [list(r) for r in w1], list(y)))
    return out


@pytest.mark.parametrize("derivative,g", [("original", g_original), ("exact", g_exact)])
def test_hand_computed_steps(derivative, g):
    spec = load_spec({**MICRO, "derivative": derivative})
    engine = build_engine(spec, seed=3)
    assert engine.topo.n_weights == 4 + 4
    w0 = engine.weights[:4].copy()
    w1 = engine.weights[4:].reshape(2, 2).copy()
    pixels = [200, 17, 90, 255]
    expected = hand_steps(w0, w1, pixels, 0.5, 0.25, g)
    for s, p in enumerate(pixels):
        engine.step(np.full((1, 1, 1, 1), p, np.uint8))
        want_w0, want_w1, want_y = expected[s]
        np.testing.assert_allclose(engine.weights[:4], want_w0, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(engine.weights[4:], np.ravel(want_w1), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(engine.prediction()[0], want_y, rtol=1e-6)
    if derivative == "exact":
        # g(1) = 0, so the two early updates computed from the all-ones rings change nothing.
        assert np.array_equal(expected[1][0], w0)


def test_bias_stays_one_and_ring_shift():
    spec = load_spec("tiny")
    eng = build_engine(spec, n_seq=2)
    frames = random_frames(spec, 7, n_seq=2)
    T = eng.topo
    u = T.unit_id(0, 1, 2)
    off, P = T.x_off[u], T.signal[u]
    eng.step(frames[0])
    x0 = eng.x[0]
    # s = 0: previous-signal half is the initial 1.0; every context block is κ(1) = fl32(0.9).
    assert np.all(x0[:, off + P : off + 2 * P] == 1.0)
    assert np.all(x0[:, off + 2 * P : T.x_off[u + 1] - 1] == np.float32(0.9))
    for s in range(1, 7):
        eng.step(frames[s])
        cur, prev = eng.x[s % 3], eng.x[(s - 1) % 3]
        assert np.array_equal(cur[:, off + P : off + 2 * P], prev[:, off : off + P])
    assert np.all(eng.x[:, :, T.x_bias] == 1.0) and np.all(eng.h[:, :, T.h_bias] == 1.0)
    # The new signal of a layer-0 unit is its compressed 3×3×3 patch, in (row, col, channel) order.
    patch = frames[6][:, 3:6, 6:9, :].reshape(2, -1).astype(np.float32) / np.float32(255)
    assert np.array_equal(eng.x[6 % 3][:, off : off + P], patch * np.float32(0.8) + np.float32(0.1))


@pytest.mark.parametrize("n", [1, 7, 8, 9, 100])
def test_initial_weights_drawn_in_chunks_equal_one_draw(n):
    """The chunked draw is the formula of §3.2 on the stream one call to the RNG gives, at any chunk size."""
    u = np.random.default_rng(3).random(n, dtype=np.float64).astype(np.float32)
    want = (u - np.float32(0.5)) * np.float32(0.03)
    for chunk in (1, 3, 8, 1 << 22):
        got = initial_weights(n, 3, chunk=chunk)
        assert got.dtype == np.float32 and np.array_equal(got, want), chunk


def test_initial_weights_are_seeded_and_in_range():
    a, b, c = initial_weights(1000, 1), initial_weights(1000, 1), initial_weights(1000, 2)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert a.dtype == np.float32 and -0.015 < a.min() and a.max() < 0.015
    assert np.array_equal(build_engine("tiny", seed=5).weights, initial_weights(build_engine("tiny").topo.n_weights, 5))


def test_determinism_bit_identical():
    spec = load_spec("tiny")
    frames = random_frames(spec, 60, n_seq=3)
    runs = []
    for _ in range(2):
        eng = build_engine(spec, n_seq=3, seed=11)
        eng.run(60, iter(frames))
        runs.append(eng.state())
    for key in STEPPED_STATE:
        assert np.array_equal(runs[0][key], runs[1][key]), key


@pytest.mark.parametrize("k", [2, 3, 5])
def test_identical_sequences_equal_single_sequence(k):
    spec = load_spec("tiny")
    frames = random_frames(spec, 60)
    one = build_engine(spec, n_seq=1, seed=4)
    many = build_engine(spec, n_seq=k, seed=4)
    for f in frames:
        one.step(f)
        many.step(np.repeat(f, k, axis=0))
    assert np.array_equal(one.weights, many.weights)
    assert np.array_equal(one.velocity, many.velocity)
    assert np.array_equal(np.repeat(one.y, k, axis=1), many.y)


def test_batch_update_is_mean_of_sequence_updates():
    spec = load_spec("tiny")
    frames = random_frames(spec, 1, n_seq=2)
    a, b, both = (build_engine(spec, n_seq=n, seed=0) for n in (1, 1, 2))
    a.step(frames[0][:1])
    b.step(frames[0][1:])
    both.step(frames[0])
    # After one step from V = 0, each velocity is that step's update.
    want = ((a.velocity.astype(np.float64) + b.velocity.astype(np.float64)) / 2).astype(np.float32)
    assert np.array_equal(both.velocity, want)
    assert not np.array_equal(a.velocity, b.velocity)


def test_derivative_option_changes_results():
    spec = load_spec("tiny")
    frames = random_frames(spec, 30)
    engines = [build_engine(spec.with_overrides({"derivative": d})) for d in ("original", "exact")]
    for e in engines:
        e.run(30, iter(frames))
    assert not np.allclose(engines[0].weights, engines[1].weights, rtol=1e-3)


def test_float32_frames_equal_uint8_frames():
    spec = load_spec("tiny")
    frames = random_frames(spec, 10)
    u8, f32 = build_engine(spec), build_engine(spec)
    u8.run(10, iter(frames))
    f32.run(10, iter(frames.astype(np.float32) / np.float32(255)))
    assert np.array_equal(u8.weights, f32.weights)


def _layer_rates(eng):
    return [(float(eng.unit_lr[eng.topo.layer == k][0]), float(eng.unit_momentum[eng.topo.layer == k][0]))
            for k in range(eng.spec.n_layers)]


def test_schedule_enables_layers_and_intermediate_overrides_final():
    # small-like: final and intermediate fire at the same step; the intermediate rate wins (§8.1 #2).
    spec = load_spec("tiny").with_overrides({
        "delay_each_layer_learning": 3, "initial_learning_rate": 0.01, "momentum": 0.1,
        "delay_final_learning_rate": 8, "final_learning_rate": 0.0005,
        "delay_intermediate_learning_rate": 8, "intermediate_learning_rate": 0.002})
    eng = build_engine(spec)
    frames = random_frames(spec, 9)
    seen = []
    for f in frames:
        eng.step(f)
        seen.append(_layer_rates(eng))
    f32 = lambda v: float(np.float32(v))  # noqa: E731
    on, off = (f32(0.01), f32(0.1)), (0.0, 0.0)
    assert seen[0] == [on, off, off] and seen[2] == [on, off, off]
    assert seen[3] == [on, on, off] and seen[6] == [on, on, on]
    assert seen[8] == [(f32(0.002), f32(0.1))] * 3
    # Layers not yet enabled get a zero update: layer 2's weights are untouched until step 6.
    eng2 = build_engine(spec)
    l2 = slice(eng2.topo.w0_off[eng2.topo.layer_offsets[2]], eng2.topo.w0_off[-1])
    w_before = eng2.weights[l2].copy()
    eng2.run(6, iter(frames))
    assert np.array_equal(eng2.weights[l2], w_before)
    eng2.step(frames[6])
    assert not np.array_equal(eng2.weights[l2], w_before)


def test_final_rate_reaches_disabled_units_and_enable_resets_it():
    # classic_medium-like (§3.8): at step 4 layer 1 is enabled, then every unit gets the final rate;
    # layer 2 (enabled at 8) trains with μ = 0 meanwhile and is reset to the initial rate later.
    spec = load_spec("tiny").with_overrides({
        "delay_each_layer_learning": 4, "initial_learning_rate": 0.01, "momentum": 0.5,
        "delay_final_learning_rate": 4, "final_learning_rate": 0.001,
        "delay_intermediate_learning_rate": 50, "intermediate_learning_rate": 0.02})
    eng = build_engine(spec)
    frames = random_frames(spec, 9)
    f32 = lambda v: float(np.float32(v))  # noqa: E731
    eng.run(5, iter(frames))
    assert _layer_rates(eng) == [(f32(0.001), f32(0.5)), (f32(0.001), f32(0.5)), (f32(0.001), 0.0)]
    l2 = slice(eng.topo.w0_off[eng.topo.layer_offsets[2]], eng.topo.w0_off[-1])
    before = eng.weights[l2].copy()
    eng.step(frames[5])
    assert not np.array_equal(eng.weights[l2], before)  # η ≠ 0 with μ = 0 still updates
    eng.run(3, iter(frames[6:]))
    assert _layer_rates(eng) == [(f32(0.001), f32(0.5)), (f32(0.001), f32(0.5)), (f32(0.01), f32(0.5))]
    assert [e.kind for e in eng.events] == ["enable_layer", "enable_layer", "final", "enable_layer"]


def test_metrics_per_layer_and_reset():
    spec = load_spec("tiny")
    eng = build_engine(spec, n_seq=2)
    eng.run(12, iter(random_frames(spec, 12, n_seq=2)))
    m = eng.metrics()
    assert m["steps"] == 10 and m["step"] == 12  # steps 0 and 1 compare against the initial ones
    assert m["mse_two_step"].shape == (3,) and np.all(m["mse_two_step"] > 0)
    assert np.all(np.isfinite(m["mse_one_step"]))
    assert eng.metrics()["steps"] == 0


def test_bad_frames_are_rejected():
    eng = build_engine("tiny", n_seq=2)
    with pytest.raises(ValueError, match=r"shape \(1, 12, 12, 3\).*needs \(2, 12, 12, 3\)"):
        eng.step(np.zeros((1, 12, 12, 3), np.uint8))
    with pytest.raises(TypeError, match="uint8.*float64"):
        eng.step(np.zeros((2, 12, 12, 3), np.float64))
    with pytest.raises(ValueError, match="n_seq"):
        build_engine("tiny", n_seq=0)
    with pytest.raises(ValueError, match="backend"):
        build_engine("tiny", backend="gpu")


@pytest.mark.slow
def test_small_trains_on_random_frames():
    spec = load_spec("small")
    eng = build_engine(spec)
    w = eng.weights.copy()
    eng.run(3, iter(random_frames(spec, 3)))
    changed = eng.weights != w
    layer0 = eng.topo.w0_off[eng.topo.layer_offsets[1]]
    assert changed[:layer0].mean() > 0.99 and not changed[layer0 : eng.topo.w0_total].any()
    assert np.all(np.isfinite(eng.weights)) and eng.metrics()["steps"] == 1
