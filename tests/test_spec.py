"""Spec loading and validation (pvm-algorithm.md §1, architecture.md §2)."""

from __future__ import annotations

import json

import pytest
from conftest import ZOO, ZOO_NAMES

from pvm_dist.model.spec import INERT_KEYS, SpecError, load_spec, zoo_names


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_original_files_load_unchanged_and_match_project_zoo(original_zoo, name):
    original = load_spec(original_zoo / f"{name}.json")
    ours = load_spec(ZOO / f"{name}.json")
    assert original.to_dict() == ours.to_dict()
    # Every key the original ignores is listed, none silently dropped.
    raw = json.loads((original_zoo / f"{name}.json").read_text())
    assert set(original.ignored) == {k for k in raw if k in INERT_KEYS}
    assert set(raw) == set(original.ignored) | {k for k in raw if k in original.values}
    assert original.unknown_keys == ()


def test_string_values_are_typed(original_zoo):
    s = load_spec(original_zoo / "small.json")
    assert s.layer_shapes == (12, 8, 6, 4, 2, 1)
    assert s["initial_learning_rate"] == 0.002 and isinstance(s["initial_learning_rate"], float)
    assert s["intermediate_learning_rate"] == 0.001  # the one numeric value in the original zoo
    assert s["send_context_two_layers_back"] is True and s["context_exclude_self"] is False
    assert s.hidden == 49 and s.image_shape == (60, 60, 3) and s["derivative"] == "original"


def test_classic_has_no_intermediate_rate(original_zoo):
    s = load_spec(original_zoo / "classic.json")
    assert s["intermediate_learning_rate"] is None and s["delay_intermediate_learning_rate"] is None


def test_zoo_names_resolve_and_include_tiny():
    assert set(ZOO_NAMES) | {"tiny"} <= set(zoo_names())
    assert load_spec("tiny").name == "tiny"
    assert load_spec("small").layer_shapes == (12, 8, 6, 4, 2, 1)


def test_unknown_keys_are_kept_and_reported():
    raw = {**json.loads((ZOO / "tiny.json").read_text()), "lateral_radus": 3, "steps": "10"}
    s = load_spec(raw)
    assert s.ignored == {"lateral_radus": 3, "steps": "10"}
    assert s.unknown_keys == ("lateral_radus",)


def test_context_exclude_self_only_exact_string_one():
    base = json.loads((ZOO / "tiny.json").read_text())
    assert load_spec({**base, "context_exclude_self": "1"})["context_exclude_self"] is True
    assert load_spec({**base, "context_exclude_self": "01"})["context_exclude_self"] is False
    assert load_spec({**base, "context_exclude_self": "2"})["context_exclude_self"] is False


def _write(tmp_path, raw, name="bad.json"):
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    return path


BAD_CASES = [
    ("missing", lambda r: r.pop("hidden_block_size"), "hidden_block_size", "is missing"),
    ("non-numeric", lambda r: r.update(initial_learning_rate="fast"), "initial_learning_rate", "must be a number"),
    ("negative", lambda r: r.update(input_block_size="-5"), "input_block_size", "positive integer"),
    ("zero size", lambda r: r.update(hidden_block_size=0), "hidden_block_size", "positive integer"),
    ("zero layer", lambda r: r.update(layer_shapes=["4", "0", "1"]), "layer_shapes", "positive integers"),
    ("empty layers", lambda r: r.update(layer_shapes=[]), "layer_shapes", "non-empty list"),
    ("negative rate", lambda r: r.update(momentum=-0.1), "momentum", "non-negative"),
    ("fan-in too big", lambda r: r.update(fan_in_square_size=3), "fan_in_square_size", "does not fit"),
    ("fan-in radius empty", lambda r: r.update(fan_in_radius=0.5), "fan_in_radius", "keeps no cell"),
    ("derivative", lambda r: r.update(derivative="approx"), "derivative", "unknown derivative mode"),
    ("precision", lambda r: r.update(precision="fp16"), "precision", "unknown precision"),
    ("feed context", lambda r: r.update(feed_context_in_complex_layer="yes"), "feed_context_in_complex_layer", "0 or 1"),
    ("delay zero", lambda r: r.update(delay_each_layer_learning="0"), "delay_each_layer_learning", "positive"),
    ("half pair", lambda r: r.pop("delay_intermediate_learning_rate"), "delay_intermediate_learning_rate", "missing"),
]


@pytest.mark.parametrize("label,mutate,key,text", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_invalid_spec_names_key_and_file(tmp_path, label, mutate, key, text):
    raw = json.loads((ZOO / "tiny.json").read_text())
    mutate(raw)
    path = _write(tmp_path, raw)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    msg = str(err.value)
    assert err.value.key == key
    assert f"'{key}'" in msg and str(path) in msg and text in msg
    assert "\n" not in msg


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "nope.json")
    bad = tmp_path / "broken.json"
    bad.write_text('{"layer_shapes": [1,}')
    with pytest.raises(SpecError, match=r"broken.json.*not valid JSON.*line 1"):
        load_spec(bad)
    arr = _write(tmp_path, [1, 2], "list.json")
    with pytest.raises(SpecError, match="must be a JSON object"):
        load_spec(arr)


def test_overrides_are_parsed_and_validated():
    s = load_spec("tiny").with_overrides({"delay_each_layer_learning": "5", "derivative": "exact", "layer_shapes": "[2, 1]"})
    assert s["delay_each_layer_learning"] == 5 and s["derivative"] == "exact" and s.layer_shapes == (2, 1)
    with pytest.raises(SpecError, match="'lateral_radus'.*not a spec key"):
        load_spec("tiny").with_overrides({"lateral_radus": "1"})
    with pytest.raises(SpecError, match="'momentum'"):
        load_spec("tiny").with_overrides({"momentum": "-1"})
