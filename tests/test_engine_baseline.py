"""The copy-last-frame baseline accumulated inside every engine, against the host computation.

``metrics()`` gives ``baseline_two_step``/``baseline_one_step``: the MSE (compressed units) of
predicting frames s and s−1 by frame s−2, over the layer-0 outputs of the steps s ≥ 2. The host's
``CopyLastFrameBaseline`` takes float64 differences of the float32-compressed frames, and so do the
engines (x ring entries, float32, subtracted in double): the same terms, summed in other orders,
so the tolerance is REL = 1e-12.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_frames

from pvm_dist import build_engine, load_spec
from pvm_dist.engine.native import native_module
from baseline_oracle import CopyLastFrameBaseline
from pvm_dist.model.topology import Topology, build_topology

REL = 1e-12  # the same float64 terms as the host's, summed in a different order
STEPS = 12
KEYS = ("baseline_two_step", "baseline_one_step")
HOST_KEYS = {"baseline_two_step": "two_step", "baseline_one_step": "one_step"}

_RATES = {"initial_learning_rate": 0.05, "momentum": 0.5, "final_learning_rate": 0.01,
          "delay_final_learning_rate": 100000}
#: One layer (every unit is in layer 0), one channel, 2×2 patches.
ONE_LAYER = {"layer_shapes": [2], "input_block_size": 2, "hidden_block_size": 2, "input_channels": 1,
             "lateral_radius": 1, "fan_in_square_size": 1, "fan_in_radius": 0, "delay_each_layer_learning": 1000,
             **_RATES}
#: Three layers with the feed-context and opt_abs_diff switches, whose errors differ from the model's usual ones.
FEED_CONTEXT = {"layer_shapes": [5, 3, 1], "input_block_size": 2, "hidden_block_size": 2, "input_channels": 1,
                "lateral_radius": 1, "fan_in_square_size": 3, "fan_in_radius": 2,
                "feed_context_in_complex_layer": 1, "opt_abs_diff": 1, "delay_each_layer_learning": 3, **_RATES}
SPECS = {"tiny": "tiny", "one_layer": ONE_LAYER, "feed_context": FEED_CONTEXT}

BACKENDS = [("reference", None)] + ([("native", "cpu")] if native_module() is not None else [])


def spec_of(name: str):
    return load_spec(SPECS[name], name=name)


def make(spec, backend: str, device: str | None, n_seq: int):
    kwargs = {"device": device} if device else {}
    return build_engine(spec, backend=backend, n_seq=n_seq, seed=0, **kwargs)


def host_values(host: CopyLastFrameBaseline) -> dict[str, float]:
    """The host baseline's values (then reset) under the engine's key names."""
    got = host.take()
    return {key: got[HOST_KEYS[key]] for key in KEYS}


def run_both(engine, frames: np.ndarray) -> dict[str, float]:
    """Train ``engine`` on ``frames`` [T, n_seq, D, D, C] beside the host baseline; the host's values."""
    host = CopyLastFrameBaseline()
    for f in frames:
        engine.step(f)
        host.update(f)
    return host_values(host)


def assert_close(got: dict, want: dict, rel: float = REL) -> None:
    for key in KEYS:
        assert got[key] == pytest.approx(want[key], rel=rel), key


@pytest.mark.parametrize("name", list(SPECS))
def test_baseline_src_maps_layer0_outputs_onto_every_frame_entry(name):
    """Both halves of the layer-0 outputs read x(s−2)'s frame entries, each entry once per half."""
    topo = build_topology(spec_of(name))
    arrays = topo.native_arrays()
    base, bins = arrays["baseline_src"], arrays["y_bin"]
    layer0 = np.repeat(topo.layer, topo.outputs) == 0
    assert np.array_equal(base >= 0, layer0)
    for half in (0, 1):
        entries = base[layer0 & (bins == half)]
        assert (arrays["x_kind"][entries] == Topology.X_FROM_FRAME).all()
        assert np.array_equal(np.sort(arrays["x_src"][entries]), np.arange(arrays["image_size"]))


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("n_seq", [1, 3])
def test_engine_baseline_equals_host(backend, device, name, n_seq):
    spec = spec_of(name)
    frames = random_frames(spec, STEPS, n_seq=n_seq, seed=7)
    engine = make(spec, backend, device, n_seq)
    want = run_both(engine, frames)
    got = engine.metrics()
    assert got["steps"] == STEPS - 2
    assert all(isinstance(got[key], float) for key in KEYS)
    assert_close(got, want)


@pytest.mark.parametrize("backend,device", BACKENDS)
def test_engine_baseline_equals_host_on_float_frames(backend, device):
    spec = spec_of("tiny")
    frames = (random_frames(spec, STEPS, n_seq=2, seed=3) / np.float32(255)).astype(np.float32)
    engine = make(spec, backend, device, 2)
    want = run_both(engine, frames)
    assert_close(engine.metrics(), want)


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("name", ["tiny", "feed_context"])
def test_identical_sequences_give_the_single_sequence_values(backend, device, name):
    spec = spec_of(name)
    frames = random_frames(spec, STEPS, n_seq=1, seed=11)
    single, triple = make(spec, backend, device, 1), make(spec, backend, device, 3)
    for f in frames:
        single.step(f)
        triple.step(np.repeat(f, 3, axis=0))
    assert_close(triple.metrics(), single.metrics())


@pytest.mark.skipif(native_module() is None, reason="the native module is not built")
@pytest.mark.parametrize("name", list(SPECS))
def test_reference_and_native_cpu_agree(name):
    spec = spec_of(name)
    frames = random_frames(spec, STEPS, n_seq=3, seed=5)
    ref, cpu = make(spec, "reference", None, 3), make(spec, "native", "cpu", 3)
    for f in frames:
        ref.step(f)
        cpu.step(f)
    assert_close(cpu.metrics(), ref.metrics())


@pytest.mark.skipif(native_module() is None, reason="the native module is not built")
def test_native_cpu_baseline_is_deterministic():
    spec = spec_of("tiny")
    frames = random_frames(spec, STEPS, n_seq=3, seed=9)
    runs = []
    for _ in range(2):
        engine = make(spec, "native", "cpu", 3)
        engine.run(STEPS, iter(frames))
        runs.append(engine.metrics())
    assert all(runs[0][key] == runs[1][key] for key in KEYS)


@pytest.mark.parametrize("backend,device", BACKENDS)
def test_baseline_resets_after_metrics_and_load_state(backend, device):
    spec = spec_of("tiny")
    frames = random_frames(spec, 3 * STEPS, n_seq=2, seed=13)
    engine = make(spec, backend, device, 2)
    host = CopyLastFrameBaseline()
    for f in frames[:STEPS]:
        engine.step(f)
        host.update(f)
    host.take()
    engine.metrics()
    empty = engine.metrics()  # taken just now: nothing since
    assert empty["steps"] == 0 and all(np.isnan(empty[key]) for key in KEYS)
    # The next window counts only its own steps, as the host's does (both keep the last two frames).
    for f in frames[STEPS : 2 * STEPS]:
        engine.step(f)
        host.update(f)
    got = engine.metrics()
    assert got["steps"] == STEPS
    assert_close(got, host_values(host))

    saved = engine.state()
    engine.run(5, iter(frames[2 * STEPS :]))
    engine.load_state(saved)  # the sums of the 5 steps since are dropped
    after = engine.metrics()
    assert after["steps"] == 0 and all(np.isnan(after[key]) for key in KEYS)
    # From the loaded rings the engine goes on like a host baseline primed with the two frames before.
    primed = CopyLastFrameBaseline()
    primed.update(frames[2 * STEPS - 2])
    primed.update(frames[2 * STEPS - 1])
    for f in frames[2 * STEPS :]:
        engine.step(f)
        primed.update(f)
    got = engine.metrics()
    assert got["steps"] == STEPS
    assert_close(got, host_values(primed))


# --- on a GPU ---------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("n_seq", [1, 3, 8])  # 8: the many-sequence (tiled) path
def test_cuda_baseline_equals_host_and_reference(name, n_seq):
    spec = spec_of(name)
    frames = random_frames(spec, STEPS, n_seq=n_seq, seed=7)
    gpu, ref = make(spec, "native", "cuda", n_seq), make(spec, "reference", None, n_seq)
    want = run_both(gpu, frames)
    for f in frames:
        ref.step(f)
    got = gpu.metrics()
    assert got["steps"] == STEPS - 2
    assert_close(got, want)
    assert_close(got, ref.metrics())
    assert np.isnan(gpu.metrics()["baseline_two_step"])  # reset by the call before


@pytest.mark.gpu
@pytest.mark.parametrize("n_seq", [1, 8])
def test_cuda_baseline_from_a_held_dataset_is_bit_identical(n_seq):
    """run_dataset replays one captured graph: the step counter it reads must advance, so the values
    equal the host's; and two runs give the same bits."""
    spec = spec_of("tiny")
    blocks = random_frames(spec, 5, n_seq=n_seq, seed=21)  # fewer blocks than steps: the dataset wraps
    frames = np.stack([blocks[s % len(blocks)] for s in range(STEPS)])
    runs = []
    for _ in range(2):
        engine = make(spec, "native", "cuda", n_seq)
        engine.set_dataset(blocks, first_step=0)
        engine.run_dataset(STEPS)
        runs.append(engine.metrics())
    host = CopyLastFrameBaseline()
    for f in frames:
        host.update(f)
    assert runs[0]["steps"] == STEPS - 2
    assert_close(runs[0], host_values(host))
    assert all(runs[0][key] == runs[1][key] for key in KEYS)


@pytest.mark.gpu
def test_cuda_baseline_resets_after_load_state():
    spec = spec_of("tiny")
    frames = random_frames(spec, STEPS, n_seq=2, seed=13)
    engine = make(spec, "native", "cuda", 2)
    engine.run(STEPS, iter(frames))
    engine.load_state(engine.state())
    after = engine.metrics()
    assert after["steps"] == 0 and all(np.isnan(after[key]) for key in KEYS)
