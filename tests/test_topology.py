"""Graph construction: counts of pvm-algorithm.md §2.6/§7 and the worked examples."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ZOO

from pvm_dist.model.spec import load_spec
from pvm_dist.model.topology import build_topology

# name: (units, W0, W1, Σ(N+1), ΣM, readout weights), from the table of §7.
TABLE = {
    "small": (265, 14_087_206, 3_451_600, 287_494, 69_032, 8_619_800),
    "med": (521, 29_376_970, 7_114_000, 599_530, 142_280, 20_218_100),
    "med_exp": (521, 29_376_970, 128_427_024, 599_530, 142_280, 20_218_100),
    "LARGE": (1497, 96_757_458, 22_371_600, 1_974_642, 447_432, 80_117_800),
    **{n: (350, 14_794_521, 3_762_400, 301_929, 75_248, 11_334_400)
       for n in ["classic", "classic_medium", "experiment1_green_ball", "experiment1_stop_sign", "experiment2"]},
}
TOTAL_WEIGHTS = {"small": 17_538_806, "med": 36_490_970, "med_exp": 157_803_994, "LARGE": 119_129_058, "classic": 18_556_921}
FLOPS_M = {"small": 112.1, "med": 233.2, "LARGE": 759.5, "classic": 118.9, "med_exp": 1203.7}
BYTES_MB = {"small": 294.4, "med": 612.3, "LARGE": 1995.6, "classic": 312.0, "med_exp": 3038.6}
ACT_MB = {"small": 5.3, "med": 10.9, "LARGE": 35.9, "classic": 5.5, "med_exp": 10.9}


def _check_counts(topo, name):
    units, w0, w1, xin, ym, readout = TABLE[name]
    assert topo.n_units == units
    assert (topo.w0_total, topo.w1_total) == (w0, w1)
    assert (topo.x_total, topo.y_total) == (xin, ym)
    assert topo.readout_weights == readout
    if name in TOTAL_WEIGHTS:
        assert topo.n_weights == TOTAL_WEIGHTS[name]
        assert round(topo.flops_per_step / 1e6, 1) == FLOPS_M[name]
        assert round(topo.weight_bytes_per_step / 1e6, 1) == BYTES_MB[name]
        # The doc rounds small's 5.246 MB up to 5.3 (double rounding); the rest match to 0.1 MB.
        assert abs(topo.activation_bytes_per_step / 1e6 - ACT_MB[name]) <= 0.06


@pytest.mark.parametrize("name", list(TABLE))
def test_project_zoo_counts(name):
    _check_counts(build_topology(load_spec(ZOO / f"{name}.json")), name)


@pytest.mark.parametrize("name", list(TABLE))
def test_original_zoo_counts(original_zoo, name):
    _check_counts(build_topology(load_spec(original_zoo / f"{name}.json")), name)


@pytest.fixture(scope="module")
def small():
    return build_topology(load_spec("small"))


def test_small_layer_table(small):
    # §2.6: units, P, M, context min/max/mean, N min/max/mean, weights per layer.
    want = [
        (144, 75, 150, 9, 34, 18.1, 591, 1816, 1038.8, 8_416_868),
        (64, 196, 392, 9, 34, 17.8, 833, 2058, 1264.8, 5_223_988),
        (36, 196, 392, 9, 22, 14.3, 833, 1470, 1094.3, 2_637_768),
        (16, 196, 392, 8, 13, 10.2, 784, 1029, 894.2, 1_015_476),
        (4, 196, 392, 5, 5, 5.0, 637, 637, 637.0, 203_448),
        (1, 196, 392, 1, 1, 1.0, 441, 441, 441.0, 41_258),
    ]
    got = [(s.units, s.signal, s.outputs, s.context_min, s.context_max, round(s.context_mean, 1),
            s.input_min, s.input_max, round(s.input_mean, 1), s.weights) for s in small.layer_stats()]
    assert got == want
    assert (small.n_primary_projections, small.n_context_projections) == (484, 4453)
    assert small.n_context_duplicates == 237
    assert sum(1 for c in small.context if len(c) != len(set(c))) == 113


def names(topo, units):
    return [topo.unit_name(u) for u in units]


def test_worked_examples(small):
    u = small.unit_id(0, 0, 0)
    assert names(small, small.context[u]) == ["L0(0,0)", "L0(0,1)", "L0(0,2)", "L0(1,0)", "L0(1,1)", "L0(2,0)",
                                              "L1(0,0)", "L2(0,0)", "L5(0,0)"]
    assert small.inputs[u] == 591 and small.x_off[u + 1] - small.x_off[u] == 592
    u = small.unit_id(0, 5, 5)
    ctx = names(small, small.context[u])
    assert len(ctx) == 34 and small.inputs[u] == 1816
    assert len(set(ctx[:13])) == 13 and all(c.startswith("L0") for c in ctx[:13])
    assert all(c.startswith("L1") for c in ctx[13:17])
    assert all(c.startswith("L2") for c in ctx[17:33]) and len(set(ctx[17:33])) == 9
    assert ctx[17:33].count("L2(3,3)") == 4 and ctx[33] == "L5(0,0)"
    u = small.unit_id(4, 0, 0)
    assert names(small, small.primary[u]) == ["L3(0,0)", "L3(0,1)", "L3(1,0)", "L3(1,1)"]
    assert names(small, small.context[u]) == ["L4(0,0)", "L4(0,1)", "L4(1,0)", "L4(1,1)", "L5(0,0)"]
    assert small.inputs[u] == 637
    top = small.n_units - 1
    assert names(small, small.primary[top]) == ["L4(0,0)", "L4(0,1)", "L4(1,0)", "L4(1,1)"]
    assert names(small, small.context[top]) == ["L5(0,0)"] and small.inputs[top] == 441
    # L1(3,3) receives L3(2,2) four times (§2.4c).
    assert names(small, small.context[small.unit_id(1, 3, 3)]).count("L3(2,2)") == 4


def test_fan_in_rows_small(small):
    # §2.3: 12→8 upper row r reads lower rows {⌊10r/7⌋, +1}.
    rows = [sorted({int(small.row[v]) for v in small.primary[small.unit_id(1, r, 0)]}) for r in range(8)]
    assert rows == [[0, 1], [1, 2], [2, 3], [4, 5], [5, 6], [7, 8], [8, 9], [10, 11]]


@pytest.mark.parametrize("name", ["tiny", "small", "med_exp"])
def test_gather_maps_fill_every_input_once(name):
    topo = build_topology(load_spec(name))
    written = np.concatenate([topo.frame_dst, topo.hidden_dst, topo.shift_dst, topo.x_bias])
    assert np.array_equal(np.sort(written), np.arange(topo.x_total))
    h_written = np.concatenate([topo.h_act, topo.h_bias, topo.raw_context_dst])
    assert np.array_equal(np.sort(h_written), np.arange(topo.h_total))
    assert topo.frame_src.max() < np.prod(topo.spec.image_shape)
    assert set(np.unique(topo.hidden_src)) <= set(topo.h_act)


def test_exclude_self_and_feed_context_change_sizes():
    tiny = load_spec("tiny")
    base, no_self = build_topology(tiny), build_topology(tiny.with_overrides({"context_exclude_self": "1"}))
    assert all(u not in no_self.context[u] or no_self.layer[u] == tiny.n_layers - 1 for u in range(base.n_units))
    assert no_self.n_context_projections < base.n_context_projections
    fed = build_topology(tiny.with_overrides({"feed_context_in_complex_layer": "1"}))
    assert fed.w0_total == base.w0_total
    assert fed.w1_total == int((base.outputs * (tiny.hidden + 1 + tiny.hidden * base.n_context)).sum())


def test_roofline_of_each_regime_matches_the_algorithm_doc():
    """pvm-algorithm.md §7: small on an H200 (4.24 TB/s copy, 66.9 TFLOP/s FP32), frames/s at the limit."""
    topo = build_topology(load_spec("small"))
    assert round(topo.flops_per_frame / 1e6, 1) == 77.1 and round(topo.flops_per_update / 1e6) == 53
    want = {1: 14_135, 4: 53_720, 16: 179_130, 64: 430_210, 256: 662_280, 1024: 765_520}
    for n_seq, frames_per_s in want.items():
        steps_per_s, bound = topo.roofline(n_seq, 4.24e12, 66.9e12)
        assert steps_per_s * n_seq == pytest.approx(frames_per_s, rel=0.005), n_seq
        assert bound == "memory"  # activations grow with n as fast as the FLOPs: memory sets every limit here
    steps_per_s, bound = topo.roofline(256, 4.24e12, 10e12)  # a chip with a sixth of the FP32 rate
    assert bound == "compute" and steps_per_s == pytest.approx(10e12 / (256 * 77.1e6 + 52.6e6), rel=0.002)
