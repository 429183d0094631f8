"""Tests for pvm_dist.io.checkpoint: round trip, on-disk layout, damage detection, atomic writes.

Truncation policy under test: a file that ends early is reported as "truncated",
including an empty file and one holding only part of the magic; only a file whose
first 8 bytes are something else is "not a pvm-dist checkpoint".
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import struct
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest


from pvm_dist.io import checkpoint as ckpt  # noqa: E402
CheckpointError = ckpt.CheckpointError

SPEC = {
    "name": "pvm-small",
    "layers": [{"size": 16, "hidden": 49}, {"size": 4, "hidden": 49}],
    "input": {"height": 96, "width": 96, "channels": 3},
    "activation": "sigmoid",
    "lr": 0.01,
}
META = {"spec": SPEC, "seed": 1234, "backend": "numpy", "n_seq": 8, "notes": {"tags": ["a", "b"]}}


def realistic_state(step: int = 4200) -> dict:
    rng = np.random.default_rng(0)
    weights = rng.standard_normal(100_003).astype(np.float32)
    weights[7] = np.nan  # NaN must survive bit-exactly
    weights[8] = -np.inf
    return {
        "step": step,
        "weights": weights,
        "momentum": (rng.standard_normal(100_003) * 1e-3).astype(np.float32),
        "frame": rng.integers(0, 256, size=(96, 96, 3), dtype=np.uint8),
        "indices": rng.integers(-(2**31), 2**31 - 1, size=(17, 3), dtype=np.int32),
        "counters": np.array([0, 2**62, -(2**63)], dtype=np.int64),
        "mask": rng.random(33) > 0.5,
        "lr_scale": np.array(0.5, dtype=np.float64),  # 0-d array
        "empty": np.zeros((0, 5), dtype=np.float32),
        "f16": np.array([1.5, -2.25], dtype=np.float16),
        "np_scalar": np.float32(3.25),
        "np_int": np.int64(-7),
        "py_int": 2**70,
        "py_float": 0.1,
        "py_inf": float("-inf"),
        "py_nan": float("nan"),
        "py_bool": True,
        "py_str": "héllo ✓",
        "py_none": None,
    }


def assert_same_state(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for name, w in want.items():
        g = got[name]
        assert type(g) is type(w), name
        if isinstance(w, np.ndarray):
            assert g.dtype == w.dtype and g.shape == w.shape, name
            assert g.tobytes() == w.tobytes(), name
        elif isinstance(w, np.generic):
            assert g.dtype == w.dtype and g.tobytes() == w.tobytes(), name
        elif isinstance(w, float) and w != w:
            assert g != g, name
        else:
            assert g == w, name


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, dict]:
    state = realistic_state()
    path = ckpt.save(tmp_path / "run" / "ckpt.pvmckpt", state, META)
    return path, state


def layout(path: Path) -> dict:
    """Offsets of the parts of a checkpoint file, read independently of the module."""
    raw = path.read_bytes()
    magic, version, header_len = struct.unpack_from("<8sIQ", raw, 0)
    data_start = (20 + header_len + 63) // 64 * 64
    return {
        "raw": raw,
        "magic": magic,
        "version": version,
        "header_len": header_len,
        "header": json.loads(raw[20 : 20 + header_len]),
        "data_start": data_start,
        "trailer": len(raw) - 40,
    }


def rewrite_with_checksum(path: Path, raw: bytes) -> None:
    """Write ``raw`` (everything before the trailer) plus a valid trailer."""
    path.write_bytes(raw + hashlib.sha256(raw).digest() + ckpt.END_MAGIC)


def replace_header(path: Path, header_bytes: bytes) -> None:
    """Swap in a new header, keep the data, and re-sign the file (a well-formed but foreign file)."""
    lay = layout(path)
    raw = lay["raw"]
    data = raw[lay["data_start"] : lay["trailer"]]
    prefix = struct.pack("<8sIQ", ckpt.MAGIC, 1, len(header_bytes))
    head = prefix + header_bytes
    head += bytes(-len(head) % 64)
    rewrite_with_checksum(path, head + data)


# --------------------------------------------------------------------------- round trip


def test_round_trip_realistic_state(saved):
    path, state = saved
    loaded = ckpt.load(path)
    assert_same_state(loaded.state, state)
    assert loaded.state["lr_scale"].ndim == 0
    assert loaded.state["empty"].shape == (0, 5)


def test_header_fields_and_meta(saved):
    path, _ = saved
    before = datetime.now(timezone.utc)
    loaded = ckpt.load(path, expect_spec=SPEC)
    assert loaded.step == 4200
    assert loaded.seed == 1234
    assert loaded.spec == SPEC
    assert loaded.meta == META
    assert loaded.version == ckpt.FORMAT_VERSION == 1
    assert isinstance(loaded.pvm_dist_version, str) and loaded.pvm_dist_version
    created = datetime.fromisoformat(loaded.created)
    assert created.utcoffset() == timedelta(0)
    assert before - created < timedelta(minutes=5)
    assert loaded.path == path

    header = ckpt.read_header(path)
    assert header["format"] == ckpt.FORMAT_NAME
    assert header["step"] == 4200 and header["seed"] == 1234 and header["spec"] == SPEC
    assert header["spec_sha256"] == ckpt.spec_digest(SPEC)
    table = {e["name"]: e for e in header["arrays"]}
    assert table["weights"]["dtype"] == "<f4" and table["weights"]["shape"] == [100_003]
    assert table["frame"]["dtype"] == "|u1" and table["frame"]["nbytes"] == 96 * 96 * 3
    assert table["np_scalar"]["scalar"] is True and table["np_scalar"]["shape"] == []
    assert header["scalars"]["py_none"] == {"type": "none"}


def test_on_disk_layout(saved):
    path, state = saved
    lay = layout(path)
    raw = lay["raw"]
    assert lay["magic"] == b"PVMCKPT\x00" and lay["version"] == 1
    assert raw[-8:] == ckpt.END_MAGIC
    assert raw[lay["trailer"] : lay["trailer"] + 32] == hashlib.sha256(raw[: lay["trailer"]]).digest()
    assert lay["data_start"] % 64 == 0
    assert set(raw[20 + lay["header_len"] : lay["data_start"]]) <= {0}  # zero padding
    for entry in lay["header"]["arrays"]:
        start = lay["data_start"] + entry["offset"]
        assert start % 64 == 0
        want = np.asarray(state[entry["name"]])
        assert raw[start : start + entry["nbytes"]] == want.tobytes(order="C")


def test_spec_digest_is_canonical_sha256():
    a = {"b": 1, "a": [1, 2, {"y": 2, "x": 1}]}
    b = {"a": [1, 2, {"x": 1, "y": 2}], "b": 1}
    assert ckpt.spec_digest(a) == ckpt.spec_digest(b)
    canonical = json.dumps(a, sort_keys=True, separators=(",", ":")).encode()
    assert ckpt.spec_digest(a) == hashlib.sha256(canonical).hexdigest()
    assert ckpt.spec_digest(a) != ckpt.spec_digest({**a, "b": 2})


def test_loaded_arrays_are_writable_independent_copies(saved):
    path, state = saved
    loaded = ckpt.load(path)
    w, m = loaded.state["weights"], loaded.state["momentum"]
    assert w.flags.writeable and m.flags.writeable and loaded.state["empty"].flags.writeable
    assert not isinstance(w, np.memmap)
    w += 1.0
    m[:] = 0
    assert not np.shares_memory(w, m)
    np.testing.assert_array_equal(ckpt.load(path).state["momentum"], state["momentum"])


def test_big_endian_and_non_contiguous_inputs_are_stored_little_endian_c_order(tmp_path):
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    state = {"step": np.int64(3), "be": np.arange(5, dtype=">i4"), "strided": base[:, ::2], "fortran": np.asfortranarray(base)}
    loaded = ckpt.load(ckpt.save(tmp_path / "c", state, {"spec": {}}))
    assert loaded.step == 3 and type(loaded.state["step"]) is np.int64
    assert loaded.state["be"].dtype == np.dtype("<i4")
    np.testing.assert_array_equal(loaded.state["be"], np.arange(5))
    np.testing.assert_array_equal(loaded.state["strided"], base[:, ::2])
    np.testing.assert_array_equal(loaded.state["fortran"], base)
    assert loaded.seed is None


def test_overwrite_replaces_previous_checkpoint(tmp_path):
    path = tmp_path / "c.pvmckpt"
    ckpt.save(path, {"step": 1, "w": np.zeros(3, np.float32)}, {"spec": SPEC})
    ckpt.save(path, {"step": 2, "w": np.ones(4, np.float32)}, {"spec": SPEC})
    loaded = ckpt.load(path)
    assert loaded.step == 2 and loaded.state["w"].tolist() == [1, 1, 1, 1]
    assert os.listdir(tmp_path) == ["c.pvmckpt"]


# --------------------------------------------------------------------------- damage


def _truncation_points(path: Path) -> dict[str, int]:
    lay = layout(path)
    return {
        "empty": 0,
        "inside magic": 5,
        "inside prefix": 15,
        "inside header": 20 + lay["header_len"] // 2,
        "inside data": lay["data_start"] + 1000,
        "end of data": lay["trailer"],
        "inside trailer": lay["trailer"] + 20,
        "last byte missing": len(lay["raw"]) - 1,
    }


@pytest.mark.parametrize(
    "where",
    ["empty", "inside magic", "inside prefix", "inside header", "inside data", "end of data", "inside trailer", "last byte missing"],
)
def test_truncated_file_says_truncated(saved, where):
    path, _ = saved
    cut = _truncation_points(path)[where]
    path.write_bytes(path.read_bytes()[:cut])
    with pytest.raises(CheckpointError, match="truncated") as info:
        ckpt.load(path)
    assert str(path) in str(info.value)
    with pytest.raises(CheckpointError, match="truncated"):
        ckpt.read_header(path)


def _flip(path: Path, pos: int, mask: int = 0x01) -> None:
    raw = bytearray(path.read_bytes())
    raw[pos] ^= mask
    path.write_bytes(bytes(raw))


def test_flipped_byte_in_data_is_corrupt(saved):
    path, _ = saved
    lay = layout(path)
    weights = next(e for e in lay["header"]["arrays"] if e["name"] == "weights")
    _flip(path, lay["data_start"] + weights["offset"] + 4001)
    with pytest.raises(CheckpointError, match="corrupt") as info:
        ckpt.load(path)
    assert str(path) in str(info.value)


def test_flipped_byte_in_header_is_corrupt_even_if_json_stays_valid(saved):
    path, _ = saved
    raw = path.read_bytes()
    pos = raw.index(b'"sigmoid"') + 1  # "sigmoid" -> "rigmoid": still valid JSON
    _flip(path, pos)
    json.loads(layout(path)["raw"][20 : 20 + layout(path)["header_len"]])
    with pytest.raises(CheckpointError, match="corrupt"):
        ckpt.load(path)


@pytest.mark.parametrize("where", ["header json syntax", "header length field", "trailer digest", "padding", "end magic"])
def test_other_flips_are_corrupt(saved, where):
    path, _ = saved
    lay = layout(path)
    pos = {
        "header json syntax": 20,  # the opening brace
        "header length field": 12,
        "trailer digest": lay["trailer"] + 3,
        "padding": lay["data_start"] - 1,
        "end magic": len(lay["raw"]) - 2,
    }[where]
    _flip(path, pos, 0x40)
    with pytest.raises(CheckpointError, match="corrupt"):
        ckpt.load(path)


def test_trailing_garbage_is_corrupt(saved):
    path, _ = saved
    with open(path, "ab") as f:
        f.write(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="corrupt"):
        ckpt.load(path)


def test_wrong_magic_is_not_a_checkpoint(saved, tmp_path):
    path, _ = saved
    raw = bytearray(path.read_bytes())
    raw[0:8] = b"PK\x03\x04\x00\x00\x00\x00"
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="not a pvm-dist checkpoint"):
        ckpt.load(path)
    text = tmp_path / "notes.txt"
    text.write_text("just some text that is long enough to have a prefix and more\n")
    with pytest.raises(CheckpointError, match="not a pvm-dist checkpoint"):
        ckpt.read_header(text)
    with pytest.raises(CheckpointError, match="not a pvm-dist checkpoint"):
        ckpt.load(text)


def test_unknown_version_is_unsupported(saved):
    path, _ = saved
    raw = bytearray(path.read_bytes())
    struct.pack_into("<I", raw, 8, 2)
    rewrite_with_checksum(path, bytes(raw[:-40]))
    for reader in (ckpt.load, ckpt.read_header):
        with pytest.raises(CheckpointError, match=r"unsupported checkpoint format version 2 .*reads version 1"):
            reader(path)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.pvmckpt"
    with pytest.raises(CheckpointError, match="file not found") as info:
        ckpt.load(path)
    assert str(path) in str(info.value)
    with pytest.raises(CheckpointError, match="file not found"):
        ckpt.read_header(path)


def test_directory_is_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError):
        ckpt.load(tmp_path)


def test_malformed_header_with_valid_checksum(saved):
    path, _ = saved
    replace_header(path, b'{"format": "pvm-dist-checkpoint", "version": 1')
    with pytest.raises(CheckpointError, match="malformed header"):
        ckpt.load(path)
    with pytest.raises(CheckpointError, match="malformed header"):
        ckpt.read_header(path)


def test_object_dtype_in_a_signed_header_is_refused_on_load(saved):
    """A file claiming an object (pickle) dtype is never interpreted, even with a valid checksum."""
    path, _ = saved
    header = layout(path)["header"]
    next(e for e in header["arrays"] if e["name"] == "counters")["dtype"] = "|O"
    replace_header(path, json.dumps(header).encode())
    with pytest.raises(CheckpointError, match="malformed header: .*disallowed dtype"):
        ckpt.load(path)


# --------------------------------------------------------------------------- spec check


def test_spec_mismatch_lists_differing_keys(saved):
    path, _ = saved
    expected = json.loads(json.dumps(SPEC))
    expected["lr"] = 0.02
    expected["input"]["width"] = 128
    del expected["activation"]
    expected["extra"] = True
    with pytest.raises(CheckpointError, match="spec mismatch") as info:
        ckpt.load(path, expect_spec=expected)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg
    assert "lr: 0.01 vs 0.02" in msg
    assert "input.width: 96 vs 128" in msg
    assert 'activation: "sigmoid" vs <absent>' in msg
    assert "extra: <absent> vs true" in msg
    assert "layers" not in msg and "name" not in msg


def test_spec_mismatch_caps_the_list(saved):
    path, _ = saved
    expected = {f"k{i}": i for i in range(9)}
    with pytest.raises(CheckpointError, match=r"spec mismatch in 14 key\(s\).*; and 9 more$"):
        ckpt.load(path, expect_spec=expected)


def test_equal_spec_in_another_spelling_is_accepted(saved):
    path, _ = saved
    reordered = {k: SPEC[k] for k in reversed(list(SPEC))}
    reordered["layers"] = tuple(SPEC["layers"])  # tuples are JSON lists
    assert ckpt.load(path, expect_spec=reordered).step == 4200


# --------------------------------------------------------------------------- atomic write


def _assert_only(directory: Path, names: list[str]) -> None:
    assert sorted(os.listdir(directory)) == sorted(names), "temp files left behind"


@pytest.mark.parametrize("exc", [OSError("disk full"), KeyboardInterrupt()])
def test_crash_mid_data_keeps_previous_checkpoint(saved, monkeypatch, exc):
    path, state = saved
    real_write = ckpt._write_array
    calls = []

    def crash_on_third_array(writer, array, dtype):
        calls.append(writer.pos)
        if len(calls) == 3:
            writer.write(b"\xff" * 100)  # some bytes of the new file did reach the disk
            raise exc
        real_write(writer, array, dtype)

    monkeypatch.setattr(ckpt, "_write_array", crash_on_third_array)
    with pytest.raises(type(exc)):
        ckpt.save(path, realistic_state(step=9999), META)
    assert len(calls) == 3
    _assert_only(path.parent, [path.name])
    loaded = ckpt.load(path)
    assert loaded.step == 4200
    assert_same_state(loaded.state, state)


def test_crash_at_fsync_or_rename_keeps_previous_checkpoint(saved, monkeypatch):
    path, _ = saved
    for name in ("fsync", "replace"):
        with monkeypatch.context() as m:
            m.setattr(ckpt.os, name, lambda *a, **k: (_ for _ in ()).throw(OSError(f"{name} failed")))
            with pytest.raises(OSError, match=f"{name} failed"):
                ckpt.save(path, {"step": 1}, META)
        _assert_only(path.parent, [path.name])
        assert ckpt.load(path).step == 4200


def test_save_creates_parent_directories_and_returns_path(tmp_path):
    target = tmp_path / "a" / "b" / "c.pvmckpt"
    out = ckpt.save(str(target), {"step": 0}, {"spec": {}})
    assert out == target and target.is_file()
    assert ckpt.load(target).state == {"step": 0}


# --------------------------------------------------------------------------- rejected inputs


@pytest.mark.parametrize(
    "bad, error",
    [
        ({"step": 1, "objs": np.array([{}, None], dtype=object)}, ValueError),
        ({"step": 1, "names": np.array(["a", "b"])}, ValueError),
        ({"step": 1, "raw": np.array([b"x"])}, ValueError),
        ({"step": 1, "when": np.array(["2024-01-01"], dtype="datetime64[D]")}, ValueError),
        ({"step": 1, "rec": np.zeros(2, dtype=[("a", "<f4")])}, ValueError),
        ({"step": 1, "s": np.str_("x")}, ValueError),
        ({"step": 1, "lst": [1, 2]}, TypeError),
        ({"step": 1, 3: 4}, TypeError),
        ({"weights": np.zeros(3)}, ValueError),
        ({"step": 1.0}, ValueError),
        ({"step": True}, ValueError),
    ],
)
def test_unsupported_state_is_rejected_and_nothing_written(tmp_path, bad, error):
    with pytest.raises(error):
        ckpt.save(tmp_path / "c.pvmckpt", bad, {"spec": {}})
    _assert_only(tmp_path, [])


@pytest.mark.parametrize(
    "meta",
    [{}, {"spec": "nope"}, {"spec": {}, "seed": "1"}, {"spec": {}, "x": object()}, {"spec": {"lr": float("nan")}}],
)
def test_bad_meta_is_rejected(tmp_path, meta):
    with pytest.raises(ValueError):
        ckpt.save(tmp_path / "c.pvmckpt", {"step": 1}, meta)
    _assert_only(tmp_path, [])


def test_error_is_one_line_and_picklable(tmp_path):
    err = CheckpointError(tmp_path / "x", "corrupt:\n  details")
    assert str(err) == f"{tmp_path / 'x'}: corrupt: details"
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is CheckpointError and str(again) == str(err) and again.path == err.path
