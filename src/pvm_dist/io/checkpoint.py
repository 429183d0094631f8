"""Checkpoints: one self-describing, pickle-free file holding an engine's state.

Why this format and not ``np.savez``/pickle: training runs for days on
preemptible machines, so a checkpoint must survive a crash mid-write (atomic
replace), prove it is intact (SHA-256 trailer), say what produced it (JSON
header with the effective spec, seed, versions) so a resume can refuse a
mismatched model, be inspectable without loading the arrays (``read_header``),
and never execute code when loaded (no pickle, plain numeric dtypes only).

File layout (every integer little-endian)::

    offset 0      8 bytes   magic  b"PVMCKPT\\x00"
    offset 8      uint32    format version (1)
    offset 12     uint64    header length H
    offset 20     H bytes   UTF-8 JSON header (see ``save``)
                  zero padding up to the next multiple of 64: the data start D
    D + offset    raw C-order little-endian bytes of each array (offsets 64-aligned)
    size - 40     32 bytes  SHA-256 of every byte before the trailer
    size - 8      8 bytes   end magic b"PVMCKEND"

How damage is reported on load (each a one-line ``CheckpointError``):

* The file ends early (its end magic is missing): "truncated". This includes
  an empty file and a file holding only the first bytes of the magic.
* The end magic is present but the checksum, or the sizes recorded in the
  prefix/header, disagree with the bytes: "corrupt".
* The first 8 bytes are something else: "not a pvm-dist checkpoint".
* The checksum matches but the header is not what this module writes:
  "malformed header" (a file written by a buggy or foreign tool).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import struct
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO, Mapping

import numpy as np

from pvm_dist._version import __version__

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "END_MAGIC",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAGIC",
    "load",
    "read_header",
    "save",
    "spec_digest",
]

MAGIC = b"PVMCKPT\x00"
END_MAGIC = b"PVMCKEND"
FORMAT_NAME = "pvm-dist-checkpoint"
FORMAT_VERSION = 1
ALIGN = 64

_PREFIX = struct.Struct("<8sIQ")  # magic, format version, header length
_DIGEST_LEN = 32
_TRAILER_LEN = _DIGEST_LEN + len(END_MAGIC)
_CHUNK = 8 << 20  # bytes per read/write/hash step; keeps memory flat for 500 MB+ states

# dtype.str of every dtype a checkpoint may hold. Anything else (object, strings,
# datetimes, structured, platform-dependent long double) is refused both ways.
_ALLOWED_DTYPES = frozenset(
    ["|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8", "<c8", "<c16"]
)
_MISSING = object()


class CheckpointError(Exception):
    """A checkpoint file cannot be used; the message names the file and the problem.

    Kept to one line so it reads well in CLI output and logs. Picklable, so it
    survives being raised inside a Ray worker.
    """

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = str(path)
        self.problem = " ".join(str(problem).split())  # force a single line
        super().__init__(f"{self.path}: {self.problem}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.problem))


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """A loaded checkpoint: the engine state plus what produced it.

    ``state`` holds writable numpy arrays owned by the caller (fresh copies, not
    views of the file), numpy scalars of their saved dtype, and plain Python
    scalars of their saved type.
    """

    state: dict[str, Any] = field(repr=False)
    meta: dict[str, Any] = field(repr=False)
    spec: dict[str, Any] = field(repr=False)
    step: int
    seed: int | None
    version: int
    pvm_dist_version: str
    created: str
    path: Path


# --------------------------------------------------------------------------- helpers


def _canonical_json(obj: Any) -> str:
    """The one JSON spelling used for digests and comparisons (sorted keys, no spaces)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def spec_digest(spec: Mapping[str, Any]) -> str:
    """SHA-256 hex of the spec's canonical JSON, so two runs can tell "same model" cheaply."""
    return hashlib.sha256(_canonical_json(spec).encode("utf-8")).hexdigest()


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _storable_dtype(dtype: np.dtype, name: str) -> np.dtype:
    """The little-endian dtype ``name`` is stored as; ValueError if not plain numeric/bool."""
    if dtype.kind in "biufc" and dtype.fields is None and dtype.subdtype is None:
        stored = dtype.newbyteorder("<")
        if stored.str in _ALLOWED_DTYPES:
            return stored
    raise ValueError(
        f"engine_state[{name!r}] has dtype {dtype} ({dtype.str}); checkpoints hold only "
        f"plain numeric/bool dtypes ({', '.join(sorted(_ALLOWED_DTYPES))}) and never pickle"
    )


def _encode_scalar(name: str, value: Any) -> dict[str, Any]:
    """Header entry for a Python scalar (bool before int: bool is an int subclass)."""
    if value is None:
        return {"type": "none"}
    if isinstance(value, bool):
        return {"type": "bool", "value": value}
    if isinstance(value, int):
        return {"type": "int", "value": int(value)}
    if isinstance(value, float):
        value = float(value)
        if math.isfinite(value):
            return {"type": "float", "value": value}
        return {"type": "float", "value": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, str):
        return {"type": "str", "value": str(value)}
    raise TypeError(
        f"engine_state[{name!r}] is a {type(value).__name__}; expected a numpy array, "
        "a numpy scalar, or a Python int/float/bool/str/None"
    )


def _decode_scalar(name: str, entry: Any) -> Any:
    """Inverse of ``_encode_scalar``; ValueError on anything it would not have written."""
    if not isinstance(entry, dict):
        raise ValueError(f"scalar {name!r} is not an object")
    kind, value = entry.get("type"), entry.get("value", _MISSING)
    if kind == "none":
        return None
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "int" and _is_int(value):
        return value
    if kind == "float":
        if isinstance(value, float) or _is_int(value):
            return float(value)
        if value in ("nan", "inf", "-inf"):
            return float(value)
    if kind == "str" and isinstance(value, str):
        return value
    raise ValueError(f"scalar {name!r} has an invalid entry {_short(entry)}")


def _short(value: Any, limit: int = 60) -> str:
    """A compact one-line rendering of a JSON value for error messages."""
    if value is _MISSING:
        return "<absent>"
    text = json.dumps(value, sort_keys=True, default=repr)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _HashingWriter:
    """Writes to a file while feeding every byte to a SHA-256, tracking the position."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.hasher = hashlib.sha256()
        self.pos = 0

    def write(self, data: Any) -> None:
        self.hasher.update(data)
        self.file.write(data)
        self.pos += memoryview(data).nbytes

    def pad_to(self, pos: int) -> None:
        if pos < self.pos:  # pragma: no cover - layout bug guard
            raise AssertionError("checkpoint layout went backwards")
        self.write(bytes(pos - self.pos))


def _write_array(writer: _HashingWriter, array: np.ndarray, dtype: np.dtype) -> None:
    """Stream one array's C-order bytes in chunks (one contiguous copy only if needed)."""
    flat = np.ascontiguousarray(array, dtype=dtype).reshape(-1).view(np.uint8)
    view = memoryview(flat)
    for start in range(0, flat.size, _CHUNK):
        writer.write(view[start : start + _CHUNK])


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable; best effort (not all platforms can open a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- save


def save(path: str | os.PathLike[str], engine_state: Mapping[str, Any], meta: Mapping[str, Any]) -> Path:
    """Atomically write ``engine_state`` and ``meta`` to ``path``; return the path.

    ``engine_state`` maps names to numpy arrays, numpy scalars, or Python
    int/float/bool/str/None, and must contain an integer ``"step"``. ``meta``
    must be JSON-serialisable and contain ``"spec"`` (a dict, the effective model
    spec); ``meta["seed"]``, if present, must be an int or None.

    The file is written to a temporary sibling, fsynced, and renamed over
    ``path``, so a crash leaves either the old file or the new one, never a mix.
    Arrays are streamed (and hashed) chunk by chunk, so memory stays flat.

    Raises ValueError for object/string/other non-numeric dtypes, a missing or
    non-integer step, or bad meta; TypeError for unsupported value types.
    Nothing is written when the inputs are rejected.
    """
    target = Path(path)
    if not isinstance(engine_state, Mapping):
        raise TypeError(f"engine_state must be a mapping, got {type(engine_state).__name__}")
    if not isinstance(meta, Mapping):
        raise TypeError(f"meta must be a mapping, got {type(meta).__name__}")

    # --- validate and plan everything before touching the disk
    if "step" not in engine_state:
        raise ValueError("engine_state must contain 'step' (the training step, an int)")
    step = engine_state["step"]
    if not (_is_int(step) or isinstance(step, np.integer)):
        raise ValueError(f"engine_state['step'] must be an int, got {type(step).__name__}")

    spec = meta.get("spec", _MISSING)
    if not isinstance(spec, Mapping):
        raise ValueError("meta must contain 'spec', a dict holding the effective model spec")
    seed = meta.get("seed")
    if seed is not None and not _is_int(seed):
        raise ValueError(f"meta['seed'] must be an int or None, got {type(seed).__name__}")
    rest = {k: v for k, v in meta.items() if k != "spec"}
    try:
        spec_json = json.loads(json.dumps(dict(spec), allow_nan=False))
        meta_json = json.loads(json.dumps(rest, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"meta (including spec) must be JSON-serialisable: {exc}") from exc

    order: list[str] = []
    scalars: dict[str, Any] = {}
    arrays: list[tuple[np.ndarray, np.dtype]] = []
    table: list[dict[str, Any]] = []
    offset = 0
    for name, value in engine_state.items():
        if not isinstance(name, str):
            raise TypeError(f"engine_state keys must be str, got {name!r}")
        order.append(name)
        # np.generic first: np.float64 is also a Python float.
        if isinstance(value, (np.ndarray, np.generic)):
            array = np.asarray(value)
            dtype = _storable_dtype(array.dtype, name)
            offset = _align(offset)
            nbytes = int(array.size) * dtype.itemsize
            table.append(
                {
                    "name": name,
                    "dtype": dtype.str,
                    "shape": [int(n) for n in array.shape],
                    "offset": offset,
                    "nbytes": nbytes,
                    "scalar": isinstance(value, np.generic),
                }
            )
            arrays.append((array, dtype))
            offset += nbytes
        else:
            scalars[name] = _encode_scalar(name, value)

    header = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "pvm_dist_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "step": int(step),
        "seed": seed,
        "spec": spec_json,
        "spec_sha256": spec_digest(spec_json),
        "meta": meta_json,
        "order": order,
        "scalars": scalars,
        "arrays": table,
        "data_nbytes": offset,
    }
    header_bytes = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("utf-8")
    data_start = _align(_PREFIX.size + len(header_bytes))

    # --- write a temp sibling, then rename it over the target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    file = open(tmp, "xb")  # noqa: SIM115 - closed below on every path
    try:
        with file:
            writer = _HashingWriter(file)
            writer.write(_PREFIX.pack(MAGIC, FORMAT_VERSION, len(header_bytes)))
            writer.write(header_bytes)
            for entry, (array, dtype) in zip(table, arrays):
                writer.pad_to(data_start + entry["offset"])
                _write_array(writer, array, dtype)
            writer.pad_to(data_start + offset)
            file.write(writer.hasher.digest())
            file.write(END_MAGIC)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(target.parent)
    return target


def remove_stale_temps(folder: str | os.PathLike[str]) -> list[Path]:
    """Delete the temp files that :func:`save` left in ``folder`` when its process was killed mid-write
    (``.<name>.tmp-<pid>-<hex>`` of a pid no longer running); the files removed. A live writer's are kept."""
    removed = []
    for tmp in Path(folder).glob(".*.tmp-*-*"):
        try:
            pid = int(tmp.name.rsplit("-", 2)[1])
        except (IndexError, ValueError):
            continue
        if pid != os.getpid() and not _running(pid):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, not ours
        return True
    return True


# --------------------------------------------------------------------------- load


def _open(path: Path) -> BinaryIO:
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise CheckpointError(path, "file not found") from None
    except IsADirectoryError:
        raise CheckpointError(path, "is a directory, not a checkpoint file") from None
    except OSError as exc:
        raise CheckpointError(path, f"cannot open: {exc.strerror or exc}") from None


def _read_exact(file: BinaryIO, n: int) -> bytes:
    data = file.read(n)
    return data if data is not None else b""


def _hash_span(file: BinaryIO, hasher: Any, n: int) -> None:
    """Feed the next ``n`` bytes of ``file`` to ``hasher`` in chunks."""
    while n > 0:
        chunk = file.read(min(n, _CHUNK))
        if not chunk:
            raise EOFError
        hasher.update(chunk)
        n -= len(chunk)


def _checksum_ok(file: BinaryIO, size: int) -> bool:
    """Whether the trailer's SHA-256 matches every byte before it (streams the file)."""
    hasher = hashlib.sha256()
    file.seek(0)
    try:
        _hash_span(file, hasher, size - _TRAILER_LEN)
    except EOFError:
        return False
    return _read_exact(file, _DIGEST_LEN) == hasher.digest()


def _validate_header(raw: bytes) -> dict[str, Any]:
    """Parse and check the header JSON; ValueError naming the first problem found."""
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"invalid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    if header.get("format") != FORMAT_NAME:
        raise ValueError(f"format is {_short(header.get('format', _MISSING))}, expected {FORMAT_NAME!r}")
    if header.get("version") != FORMAT_VERSION:
        raise ValueError(f"header version {_short(header.get('version', _MISSING))} != prefix version 1")
    for key, ok in (
        ("step", _is_int(header.get("step"))),
        ("seed", header.get("seed") is None or _is_int(header.get("seed"))),
        ("spec", isinstance(header.get("spec"), dict)),
        ("spec_sha256", isinstance(header.get("spec_sha256"), str)),
        ("meta", isinstance(header.get("meta"), dict)),
        ("scalars", isinstance(header.get("scalars"), dict)),
        ("arrays", isinstance(header.get("arrays"), list)),
        ("order", isinstance(header.get("order"), list)),
        ("data_nbytes", _is_int(header.get("data_nbytes")) and header["data_nbytes"] >= 0),
        ("pvm_dist_version", isinstance(header.get("pvm_dist_version"), str)),
        ("created", isinstance(header.get("created"), str)),
    ):
        if not ok:
            raise ValueError(f"field {key!r} is missing or has the wrong type")
    if spec_digest(header["spec"]) != header["spec_sha256"]:
        raise ValueError("spec_sha256 does not match the stored spec")

    names: list[str] = list(header["scalars"])
    end = 0
    for entry in sorted(header["arrays"], key=lambda e: e.get("offset", -1) if isinstance(e, dict) else -1):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ValueError("an array table entry has no name")
        name = entry["name"]
        if entry.get("dtype") not in _ALLOWED_DTYPES:
            raise ValueError(f"array {name!r} has disallowed dtype {_short(entry.get('dtype', _MISSING))}")
        shape = entry.get("shape")
        if not isinstance(shape, list) or not all(_is_int(n) and n >= 0 for n in shape):
            raise ValueError(f"array {name!r} has an invalid shape {_short(shape)}")
        if not isinstance(entry.get("scalar"), bool) or (entry["scalar"] and shape):
            raise ValueError(f"array {name!r} has an invalid 'scalar' flag")
        offset, nbytes = entry.get("offset"), entry.get("nbytes")
        if not (_is_int(offset) and _is_int(nbytes)) or offset % ALIGN or offset < end:
            raise ValueError(f"array {name!r} has an invalid or overlapping offset")
        if nbytes != math.prod(shape) * np.dtype(entry["dtype"]).itemsize:
            raise ValueError(f"array {name!r}: nbytes {nbytes} does not match its shape and dtype")
        end = offset + nbytes
        names.append(name)
    if end > header["data_nbytes"]:
        raise ValueError("the array table runs past the data region")
    if len(set(names)) != len(names) or sorted(names) != sorted(header["order"]):
        raise ValueError("the entry names are duplicated or disagree with 'order'")
    return header


def _examine(file: BinaryIO, path: Path) -> tuple[dict[str, Any], int, int]:
    """Check magic, version, sizes and header; return (header, data start, file size).

    The trailer checksum is only computed here on the error path, to tell a
    corrupt file from a malformed one; callers that need the data verify it.
    """
    size = os.fstat(file.fileno()).st_size
    prefix = _read_exact(file, _PREFIX.size)
    if len(prefix) < len(MAGIC):
        if MAGIC.startswith(prefix):
            raise CheckpointError(path, f"truncated: only {size} bytes, shorter than the file prefix")
        raise CheckpointError(path, "not a pvm-dist checkpoint (bad magic bytes)")
    if prefix[: len(MAGIC)] != MAGIC:
        raise CheckpointError(path, "not a pvm-dist checkpoint (bad magic bytes)")
    if len(prefix) < _PREFIX.size:
        raise CheckpointError(path, f"truncated: only {size} bytes, shorter than the file prefix")
    _, version, header_len = _PREFIX.unpack(prefix)
    if version != FORMAT_VERSION:
        raise CheckpointError(
            path, f"unsupported checkpoint format version {version} (this pvm-dist reads version {FORMAT_VERSION})"
        )

    file.seek(max(size - len(END_MAGIC), 0))
    has_end = size >= _PREFIX.size + _TRAILER_LEN and file.read(len(END_MAGIC)) == END_MAGIC
    if _PREFIX.size + header_len + _TRAILER_LEN > size:
        if has_end:
            raise CheckpointError(path, f"corrupt: header length {header_len} does not fit in a {size}-byte file")
        raise CheckpointError(path, f"truncated: header length is {header_len} but the file has only {size} bytes")

    file.seek(_PREFIX.size)
    try:
        header = _validate_header(_read_exact(file, header_len))
    except ValueError as exc:
        if not has_end:
            raise CheckpointError(path, "truncated: the end-of-file marker is missing") from None
        if not _checksum_ok(file, size):
            raise CheckpointError(path, "corrupt: SHA-256 checksum mismatch") from None
        raise CheckpointError(path, f"malformed header: {exc}") from None

    data_start = _align(_PREFIX.size + header_len)
    expected = data_start + header["data_nbytes"] + _TRAILER_LEN
    if size < expected and not has_end:
        raise CheckpointError(path, f"truncated: {size} bytes, the header says {expected}")
    if size != expected:
        raise CheckpointError(path, f"corrupt: the file has {size} bytes but its header says {expected}")
    if not has_end:
        raise CheckpointError(path, "corrupt: the end-of-file marker is damaged")
    return header, data_start, size


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Return the JSON header only (for ``pvm-dist`` inspection), without reading the arrays.

    Validates magic, version, sizes and header structure like ``load``, but
    does not hash the whole file when everything looks fine; use ``load`` to
    verify the checksum.
    """
    p = Path(path)
    with _open(p) as file:
        header, _, _ = _examine(file, p)
    return header


def _spec_mismatches(stored: Any, expected: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """Keys (dotted into nested dicts) whose canonical JSON differs: (key, stored, expected)."""
    out: list[tuple[str, Any, Any]] = []
    for key in sorted(set(stored) | set(expected)):
        a, b = stored.get(key, _MISSING), expected.get(key, _MISSING)
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out.extend(_spec_mismatches(a, b, name + "."))
        elif a is _MISSING or b is _MISSING or _canonical_json(a) != _canonical_json(b):
            out.append((name, a, b))
    return out


def load(path: str | os.PathLike[str], expect_spec: Mapping[str, Any] | None = None) -> Checkpoint:
    """Read and verify a checkpoint; with ``expect_spec``, refuse one saved for a different spec.

    Arrays are read straight into fresh, writable numpy arrays while the whole
    file is hashed; nothing is returned unless the SHA-256 trailer matches.
    Every failure is a one-line ``CheckpointError`` naming the file.
    """
    p = Path(path)
    with _open(p) as file:
        header, data_start, size = _examine(file, p)
        hasher = hashlib.sha256()
        state_arrays: dict[str, Any] = {}
        try:
            file.seek(0)
            _hash_span(file, hasher, data_start)
            pos = data_start
            for entry in sorted(header["arrays"], key=lambda e: e["offset"]):
                _hash_span(file, hasher, data_start + entry["offset"] - pos)
                array = np.empty(entry["shape"], dtype=np.dtype(entry["dtype"]))
                view = memoryview(array.reshape(-1).view(np.uint8))
                for start in range(0, entry["nbytes"], _CHUNK):
                    chunk = view[start : start + _CHUNK]
                    if file.readinto(chunk) != chunk.nbytes:
                        raise EOFError
                    hasher.update(chunk)
                pos = data_start + entry["offset"] + entry["nbytes"]
                state_arrays[entry["name"]] = array[()] if entry["scalar"] else array
            _hash_span(file, hasher, size - _TRAILER_LEN - pos)
            digest = _read_exact(file, _DIGEST_LEN)
        except EOFError:
            raise CheckpointError(p, "truncated: the file shrank while being read") from None
        if digest != hasher.digest():
            raise CheckpointError(p, "corrupt: SHA-256 checksum mismatch")

    try:
        scalars = {name: _decode_scalar(name, entry) for name, entry in header["scalars"].items()}
    except ValueError as exc:
        raise CheckpointError(p, f"malformed header: {exc}") from None
    state = {name: state_arrays[name] if name in state_arrays else scalars[name] for name in header["order"]}
    spec = header["spec"]

    if expect_spec is not None:
        expected = json.loads(json.dumps(dict(expect_spec)))
        diffs = _spec_mismatches(spec, expected)
        if diffs:
            shown = "; ".join(f"{k}: {_short(a)} vs {_short(b)}" for k, a, b in diffs[:5])
            more = f"; and {len(diffs) - 5} more" if len(diffs) > 5 else ""
            raise CheckpointError(
                p, f"spec mismatch in {len(diffs)} key(s) (stored vs expected): {shown}{more}"
            )

    return Checkpoint(
        state=state,
        meta={**header["meta"], "spec": spec},
        spec=spec,
        step=header["step"],
        seed=header["seed"],
        version=header["version"],
        pvm_dist_version=header["pvm_dist_version"],
        created=header["created"],
        path=p,
    )
