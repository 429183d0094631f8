"""Model specs: load, type and validate a PVM spec (pvm-algorithm.md §1).

Original PVM_cuda files hold every value as a string (``"0.002"``, ``["12", "8"]``) and load
unchanged; the project's own ``model_zoo/*.json`` use typed JSON. Keys that the original code
ignores, and keys nobody knows, are kept in ``Spec.ignored`` and reported, never silently dropped.
Any invalid value raises one :class:`SpecError` naming the key and the file.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pvm_dist.model.safe_load import TextFormatError, parse_json, read_text

DERIVATIVE_MODES = ("original", "exact")
#: The CUDA engine's tensor-core arithmetic (issue 12 item 3): fp32 is 3xTF32, within FP32 tolerances; tf32 and
#: bf16 round the products' operands to TF32 or BF16 for speed. The index is the native engine's pvm::Precision.
PRECISIONS = ("fp32", "tf32", "bf16")
FLOAT32_MAX = 3.4028234663852886e38  # numpy.finfo(numpy.float32).max

#: Keys the original code reads but that do nothing there (pvm-algorithm.md §1.2).
INERT_KEYS = frozenset(
    """autoencoder backpropagate_readout_error bias_free bias_free_readout dataset disable_feedback
    disable_lateral enable_feedback_at enable_lateral_at enable_readout ex_module model_type new_name
    normalize_output only_one_channel predict_two_steps readout_block_size readout_depth reverse
    save_source_files steps stereo supervised supervised_rate tau unit_type use_derivative use_error
    use_global_backprop use_integral use_t_minus_2_block version_major version_minor""".split()
)

#: Descriptive keys of the project's own specs: kept, never part of the model's semantics.
METADATA_KEYS = frozenset({"name", "description"})


class SpecError(ValueError):
    """An invalid spec; the message names the file (or source) and the key."""

    def __init__(self, source: str, key: str | None, problem: str) -> None:
        self.source, self.key, self.problem = source, key, problem
        where = f"key '{key}': " if key else ""
        super().__init__(f"spec {source}: {where}{problem}")


# ---------------------------------------------------------------------------------------------
# Value parsers. Each takes the raw JSON value and returns the typed one, or raises ValueError
# with a short description of what was expected.


def _integer(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())  # the original uses int(), so "2.0" is invalid there too
        except ValueError:
            pass
    raise ValueError(f"must be an integer, got {value!r}")


def _positive_int(value: Any) -> int:
    n = _integer(value)
    if n <= 0:
        raise ValueError(f"must be a positive integer, got {value!r}")
    return n


def _non_negative_int(value: Any) -> int:
    n = _integer(value)
    if n < 0:
        raise ValueError(f"must be a non-negative integer, got {value!r}")
    return n


def _non_negative_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"must be a number, got {value!r}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"must be a number, got {value!r}") from None
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"must be a finite non-negative number, got {value!r}")
    if x > FLOAT32_MAX:
        raise ValueError(f"must be at most {FLOAT32_MAX:.4g} (the engines compute in float32), got {value!r}")
    return x


def _switch(value: Any) -> bool:
    """Enabled iff ``int(value) > 0``, as the original reads most switches."""
    if isinstance(value, bool):
        return value
    return _integer(value) > 0


def _switch_exact_one(value: Any) -> bool:
    """``context_exclude_self``: the original enables it only for the exact string ``"1"``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value == "1"
    return _integer(value) == 1


def _switch_zero_or_one(value: Any) -> bool:
    """``feed_context_in_complex_layer`` must be 0 or 1 (the original tests it both ways)."""
    if isinstance(value, bool):
        return value
    if value in ("0", "1", 0, 1):
        return int(value) == 1
    raise ValueError(f"must be 0 or 1, got {value!r}")


def _layer_shapes(value: Any) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"must be a non-empty list of positive integers, got {value!r}")
    try:
        return tuple(_positive_int(v) for v in value)
    except ValueError:
        raise ValueError(f"must be a non-empty list of positive integers, got {value!r}") from None


def _derivative(value: Any) -> str:
    if value not in DERIVATIVE_MODES:
        raise ValueError(f"unknown derivative mode {value!r}; expected one of {', '.join(DERIVATIVE_MODES)}")
    return value


def _precision(value: Any) -> str:
    if value not in PRECISIONS:
        raise ValueError(f"unknown precision {value!r}; expected one of {', '.join(PRECISIONS)}")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be a string, got {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800" in JSON): no file, log or picture can hold it
        raise ValueError(f"is not valid Unicode text (character {exc.start}: {value[exc.start]!r})") from None
    return value


_REQUIRED = object()


@dataclasses.dataclass(frozen=True)
class _Field:
    parse: Callable[[Any], Any]
    default: Any = _REQUIRED

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


#: Every key with a meaning, in the order they are documented and printed.
FIELDS: dict[str, _Field] = {
    "layer_shapes": _Field(_layer_shapes),
    "input_block_size": _Field(_positive_int),
    "hidden_block_size": _Field(_positive_int),
    "input_channels": _Field(_positive_int, 3),
    "lateral_radius": _Field(_non_negative_int),
    "context_exclude_self": _Field(_switch_exact_one, False),
    "fan_in_square_size": _Field(_positive_int),
    "fan_in_radius": _Field(_non_negative_float),
    "send_context_two_layers_back": _Field(_switch, False),
    "last_layer_context_to_all": _Field(_switch, False),
    "feed_context_in_complex_layer": _Field(_switch_zero_or_one, False),
    "polynomial": _Field(_switch, True),
    "initial_learning_rate": _Field(_non_negative_float),
    "momentum": _Field(_non_negative_float),
    "delay_each_layer_learning": _Field(_positive_int),
    "final_learning_rate": _Field(_non_negative_float),
    "delay_final_learning_rate": _Field(_non_negative_int),
    "intermediate_learning_rate": _Field(_non_negative_float, None),
    "delay_intermediate_learning_rate": _Field(_non_negative_int, None),
    "opt_abs_diff": _Field(_switch, False),
    "readout_multiplier": _Field(_non_negative_float, 10.0),
    "4_layer_readout": _Field(_switch, False),
    "ignore_depth": _Field(_switch, False),
    "derivative": _Field(_derivative, "original"),
    "precision": _Field(_precision, "fp32"),
}


@dataclasses.dataclass(frozen=True)
class Spec:
    """A validated PVM model spec with typed values (see ``FIELDS`` for the keys)."""

    name: str
    source: str
    values: Mapping[str, Any]
    ignored: Mapping[str, Any]
    description: str = ""

    # --- typed access to the values that shape the model -----------------------------------
    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def layer_shapes(self) -> tuple[int, ...]:
        return self.values["layer_shapes"]

    @property
    def n_layers(self) -> int:
        return len(self.layer_shapes)

    @property
    def block(self) -> int:
        """Pixels per side of one layer-0 unit's patch (``input_block_size``)."""
        return self.values["input_block_size"]

    @property
    def channels(self) -> int:
        return self.values["input_channels"]

    @property
    def hidden(self) -> int:
        """Hidden neurons per unit, H = hidden_block_size²."""
        return self.values["hidden_block_size"] ** 2

    @property
    def image_side(self) -> int:
        """D = S_0 · b: the side of the square input image."""
        return self.layer_shapes[0] * self.block

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.image_side, self.image_side, self.channels)

    @property
    def feed_context(self) -> bool:
        return self.values["feed_context_in_complex_layer"]

    @property
    def unknown_keys(self) -> tuple[str, ...]:
        """Ignored keys that the original does not know either (likely typos)."""
        return tuple(k for k in self.ignored if k not in INERT_KEYS)

    def to_dict(self) -> dict[str, Any]:
        """The effective model semantics as typed JSON values (no name, no ignored keys).

        Two specs with equal ``to_dict()`` train identically; checkpoints store and compare it.
        """
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.values.items()}

    def with_overrides(self, overrides: Mapping[str, Any]) -> Spec:
        """A new spec with some values replaced (strings are parsed like file values)."""
        unknown = [k for k in overrides if k not in FIELDS]
        if unknown:
            raise SpecError(f"{self.source} override", unknown[0], f"is not a spec key (known: {', '.join(FIELDS)})")
        raw = {**self.to_dict(), **{k: _parse_override_value(v) for k, v in overrides.items()}}
        return spec_from_mapping(raw, name=self.name, source=f"{self.source} with overrides")


def _parse_override_value(value: Any) -> Any:
    """``-O key=value`` gives strings; JSON-looking ones (lists, true) are decoded."""
    if isinstance(value, str) and (value[:1] in ("[", "{") or value in ("true", "false", "null")):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def spec_from_mapping(raw: Mapping[str, Any], name: str = "spec", source: str | None = None) -> Spec:
    """Type and validate a spec given as a mapping (the body of a spec file)."""
    source = source or f"'{name}'"
    if not isinstance(raw, Mapping):
        raise SpecError(source, None, f"must be a JSON object, got {type(raw).__name__}")
    values: dict[str, Any] = {}
    for key, field in FIELDS.items():
        if key not in raw:
            if field.required:
                raise SpecError(source, key, "is missing")
            values[key] = field.default
            continue
        try:
            values[key] = None if raw[key] is None and field.default is None else field.parse(raw[key])
        except ValueError as exc:
            raise SpecError(source, key, str(exc)) from None
    ignored = {k: v for k, v in raw.items() if k not in FIELDS and k not in METADATA_KEYS}
    meta_name = raw.get("name", name)
    description = raw.get("description", "")
    for key, val in (("name", meta_name), ("description", description)):
        try:
            _text(val)
        except ValueError as exc:
            raise SpecError(source, key, str(exc)) from None
    _check_pairs(values, source)
    _check_fan_in(values, source)
    return Spec(name=meta_name, source=source, values=values, ignored=ignored, description=description)


def _check_pairs(values: Mapping[str, Any], source: str) -> None:
    """The intermediate rate and its delay come together or not at all."""
    rate, delay = values["intermediate_learning_rate"], values["delay_intermediate_learning_rate"]
    if (rate is None) != (delay is None):
        missing = "intermediate_learning_rate" if rate is None else "delay_intermediate_learning_rate"
        raise SpecError(source, missing, "is missing (the intermediate rate and its delay go together)")
    if values["input_channels"] > 4:
        raise SpecError(source, "input_channels", f"must be 1 to 4, got {values['input_channels']}")


def _check_fan_in(values: Mapping[str, Any], source: str) -> None:
    """Every upper unit must read a q×q square inside the lower layer, with some cell kept."""
    shapes, q, rho = values["layer_shapes"], values["fan_in_square_size"], values["fan_in_radius"]
    for level in range(1, len(shapes)):
        lower = shapes[level - 1]
        if q > lower:
            raise SpecError(
                source,
                "fan_in_square_size",
                f"{q} does not fit layer {level - 1} ({lower}×{lower}) feeding layer {level}",
            )
    # The cell nearest the centre is the centre itself (odd q) or 0.5 off in both directions (even q):
    # some cell is kept iff that one is (a closed form: q may be huge in a bad spec).
    nearest = 0.0 if q % 2 else 0.5
    if len(shapes) > 1 and not nearest <= rho**2:
        raise SpecError(source, "fan_in_radius", f"{rho} keeps no cell of the {q}×{q} fan-in square")


def model_zoo_dir() -> Path | None:
    """The folder of bundled specs: inside the installed package, or the source checkout's."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "model_zoo", package.parent.parent / "model_zoo"):
        if candidate.is_dir() and any(candidate.glob("*.json")):
            return candidate
    return None


def zoo_names() -> list[str]:
    """Names of the bundled model-zoo specs (``small``, ``med``, ...)."""
    zoo = model_zoo_dir()
    return sorted(p.stem for p in zoo.glob("*.json")) if zoo else []


def resolve_spec_path(name_or_path: str | Path) -> Path:
    """A spec file path: an existing path, or a model-zoo name like ``small``."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    zoo = model_zoo_dir()
    if zoo is not None and (zoo / f"{path.name}.json").is_file() and path.suffix == "":
        return zoo / f"{path.name}.json"
    known = ", ".join(zoo_names()) or "none bundled"
    raise SpecError(str(name_or_path), None, f"no such file, and not a model-zoo name (known: {known})")


def load_spec(spec: str | Path | Mapping[str, Any] | Spec, name: str | None = None) -> Spec:
    """Return a typed, validated :class:`Spec` from a file path, a zoo name, a dict or a Spec."""
    if isinstance(spec, Spec):
        return spec
    if isinstance(spec, Mapping):
        return spec_from_mapping(spec, name=name or str(spec.get("name", "spec")))
    path = resolve_spec_path(spec)
    try:
        raw = parse_json(read_text(path))  # bounded: size, depth, no repeated keys
    except OSError as exc:
        raise SpecError(str(path), None, f"cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise SpecError(str(path), None, "is not a UTF-8 text file") from None
    except TextFormatError as exc:
        raise SpecError(str(path), None, str(exc)) from None
    return spec_from_mapping(raw, name=name or path.stem, source=str(path))
