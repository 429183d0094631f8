"""The native engine against the reference engine (architecture.md §3, issue: native engine).

Relative error ‖native − reference‖ / ‖reference‖ of weights, momentum and rings after many
steps across layer-enable and learning-rate transitions: ≤ 1e-5 on the CPU, ≤ 1e-4 on a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_frames

from pvm_dist import build_engine, checkpoint, load_spec
from pvm_dist.engine.native import native_module

pytestmark = pytest.mark.skipif(native_module() is None, reason="the native module is not built")

COMPARED = ("weights", "momentum", "x_ring", "h_ring", "y_ring")


def transitions(name: str, steps: int):
    """``name`` with every layer enabled, then the final and the intermediate rate, within ``steps``."""
    spec = load_spec(name)
    delay = max(1, (steps // 2) // spec.n_layers)
    return spec.with_overrides({
        "delay_each_layer_learning": delay, "delay_final_learning_rate": int(steps * 0.6),
        "delay_intermediate_learning_rate": int(steps * 0.8)})


def relative_errors(ref_state, nat_state):
    return {k: float(np.linalg.norm(nat_state[k] - ref_state[k]) / np.linalg.norm(ref_state[k])) for k in COMPARED}


def run_pair(spec, n_seq, steps, device, seed=0):
    frames = random_frames(spec, steps, n_seq=n_seq, seed=seed + 1)
    ref = build_engine(spec, backend="reference", n_seq=n_seq, seed=seed)
    nat = build_engine(spec, backend="native", n_seq=n_seq, seed=seed, device=device)
    assert np.array_equal(ref.weights, nat.weights)  # same seed, same initial weights
    for f in frames:
        ref.step(f)
        nat.step(f)
    return ref, nat


CPU_CASES = [
    ("tiny", 1, 200, "original"), ("tiny", 1, 200, "exact"), ("tiny", 4, 200, "original"),
    ("tiny", 4, 200, "exact"), ("tiny", 64, 200, "original"), ("tiny", 64, 200, "exact"),
    pytest.param("small", 1, 200, "original", marks=pytest.mark.slow),
    pytest.param("small", 1, 200, "exact", marks=pytest.mark.slow),
    pytest.param("small", 4, 60, "original", marks=pytest.mark.slow),
    pytest.param("med", 1, 100, "original", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name,n_seq,steps,derivative", CPU_CASES)
def test_native_cpu_matches_reference(name, n_seq, steps, derivative):
    spec = transitions(name, steps).with_overrides({"derivative": derivative})
    ref, nat = run_pair(spec, n_seq, steps, "cpu")
    errs = relative_errors(ref.state(), nat.state())
    assert max(errs.values()) <= 1e-5, errs
    assert nat.state()["step"] == steps and [e.kind for e in nat.events] == [e.kind for e in ref.events]
    np.testing.assert_allclose(nat.metrics()["mse_two_step"], ref.metrics()["mse_two_step"], rtol=1e-4)


def test_native_feed_context_and_opt_abs_diff_match_reference():
    spec = transitions("tiny", 80).with_overrides({"feed_context_in_complex_layer": "1", "opt_abs_diff": "1"})
    ref, nat = run_pair(spec, 2, 80, "cpu")
    assert max(relative_errors(ref.state(), nat.state()).values()) <= 1e-5


def test_native_cpu_is_deterministic():
    spec = transitions("tiny", 60)
    frames = random_frames(spec, 60, n_seq=4)
    states = []
    for _ in range(2):
        eng = build_engine(spec, backend="native", n_seq=4, device="cpu")
        eng.run(60, iter(frames))
        states.append(eng.state())
    for key in COMPARED:
        assert np.array_equal(states[0][key], states[1][key]), key


def test_checkpoints_move_between_backends(tmp_path):
    spec = transitions("tiny", 60)
    frames = random_frames(spec, 60, n_seq=2)
    nat = build_engine(spec, backend="native", n_seq=2, device="cpu")
    nat.run(30, iter(frames[:30]))
    path = checkpoint.save(tmp_path / "n.pvmckpt", nat.state(), {"spec": spec.to_dict(), "seed": 0})
    ref = build_engine(spec, backend="reference", n_seq=2)
    ref.load_state(checkpoint.load(path, expect_spec=spec.to_dict()).state)
    for f in frames[30:]:
        ref.step(f)
        nat.step(f)
    assert max(relative_errors(ref.state(), nat.state()).values()) <= 1e-5


def test_native_rejects_bad_devices():
    with pytest.raises(ValueError, match="unknown device"):
        build_engine("tiny", backend="native", device="tpu")
    from pvm_dist.engine.native import build_info

    if not build_info().get("devices"):
        with pytest.raises((RuntimeError, ValueError), match="CUDA|cuda"):
            build_engine("tiny", backend="native", device="cuda")


# --- on a GPU ---------------------------------------------------------------------------------
# The oracle is the reference engine where numpy is quick enough (tiny; small and med at n_seq = 1)
# and otherwise the native CPU engine, which the CPU tests above hold to 1e-5 of the reference.
GPU_CASES = [(name, n, d) for name in ("tiny", "small", "med") for n in (1, 4, 64) for d in ("original", "exact")]


def gpu_oracle(name: str, n_seq: int) -> str:
    return "reference" if name == "tiny" or n_seq == 1 else "native-cpu"


@pytest.mark.gpu
@pytest.mark.parametrize("name,n_seq,derivative", GPU_CASES)
def test_native_cuda_matches_oracle(name, n_seq, derivative):
    steps = 200 if (name == "tiny" or n_seq < 64) else 60
    spec = transitions(name, steps).with_overrides({"derivative": derivative})
    frames = random_frames(spec, steps, n_seq=n_seq, seed=1)
    oracle = gpu_oracle(name, n_seq)
    ref = (build_engine(spec, backend="reference", n_seq=n_seq) if oracle == "reference"
           else build_engine(spec, backend="native", n_seq=n_seq, device="cpu"))
    gpu = build_engine(spec, backend="native", n_seq=n_seq, device="cuda")
    for f in frames:
        ref.step(f)
        gpu.step(f)
    errs = relative_errors(ref.state(), gpu.state())
    print(f"{name} n_seq={n_seq} {derivative} vs {oracle}: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
    assert max(errs.values()) <= 1e-4, errs
    np.testing.assert_allclose(gpu.metrics()["mse_two_step"], ref.metrics()["mse_two_step"], rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("n_seq", [1, 4, 64])
def test_native_cuda_is_bit_identical(n_seq):
    spec = transitions("small", 50)
    frames = random_frames(spec, 50, n_seq=n_seq)
    states = []
    for _ in range(2):
        eng = build_engine(spec, backend="native", n_seq=n_seq, device="cuda")
        eng.run(50, iter(frames))
        states.append(eng.state())
    for key in COMPARED:
        assert np.array_equal(states[0][key], states[1][key]), key


@pytest.mark.gpu
def test_cuda_out_of_memory_says_how_much():
    with pytest.raises(RuntimeError, match=r"needs about .* GiB on cuda:0.*free"):
        build_engine("LARGE", backend="native", n_seq=100_000, device="cuda")
