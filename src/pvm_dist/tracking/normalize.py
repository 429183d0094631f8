"""Caller values made acceptable to MLflow: clean keys, values as strings cut to MLflow's limits, metric
values as finite floats. Pure functions, so a bad value is caught before it is queued."""

from __future__ import annotations

import functools
import json
import math
import posixpath
import re
from collections.abc import Mapping
from typing import Any

# MLflow's limits (mlflow.utils.validation).
MAX_KEY_LENGTH = 250
MAX_PARAM_VALUE_LENGTH = 6000
MAX_TAG_VALUE_LENGTH = 8000

_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}, "c": [1, 2]}`` -> ``{"a.b": "1", "c": "[1, 2]"}``, values cut to MLflow's 6000 chars."""
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_params(value, prefix=f"{name}."))
        else:
            out[clean_key(name)] = stringify(value)[:MAX_PARAM_VALUE_LENGTH]
    return out


def clean_tags(tags: Mapping[Any, Any]) -> dict[str, str]:
    """Tags with clean keys and string values cut to MLflow's 8000 chars."""
    return {clean_key(k): stringify(v)[:MAX_TAG_VALUE_LENGTH] for k, v in tags.items()}


def metric_items(metrics: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``(key, value)`` pairs of one ``log_metrics`` call: None skipped, a sequence value (e.g. a per-layer
    error array) spread over ``key/0``, ``key/1``, ..."""
    items: list[tuple[str, Any]] = []
    for key, value in metrics.items():
        if value is None:
            continue
        if isinstance(value, (list, tuple)) or getattr(value, "ndim", 0) > 0:
            items.extend((f"{key}/{i}", v) for i, v in enumerate(list(value)))
        else:
            items.append((key, value))
    return items


def finite_values(items: list[tuple[str, Any]]) -> tuple[list[tuple[str, float]], int]:
    """The items with clean keys and finite float values, and how many were skipped (NaN, inf, not a number)."""
    out: list[tuple[str, float]] = []
    skipped = 0
    for key, value in items:
        try:
            v = float(value)
        except (TypeError, ValueError):
            skipped += 1
            continue
        if not math.isfinite(v):
            skipped += 1
            continue
        out.append((clean_key(key), v))
    return out, skipped


def stringify(value: Any) -> str:
    """A param or tag value as MLflow stores it: JSON for containers, None and bools, else ``str``."""
    if isinstance(value, str):
        return value
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        value = value.item()  # numpy scalar
    if isinstance(value, (list, tuple, dict)) or value is None or isinstance(value, bool):
        try:
            return json.dumps(value, default=str)
        except (TypeError, ValueError):
            return str(value)
    if hasattr(value, "tolist"):
        return json.dumps(value.tolist(), default=str)
    return str(value)


@functools.lru_cache(maxsize=8192)
def clean_key(key: Any) -> str:
    """A key MLflow accepts: allowed characters only, no path tricks, at most 250 chars."""
    k = _BAD_KEY_CHARS.sub("_", str(key))[:MAX_KEY_LENGTH]
    if not k or posixpath.normpath(k) != k or k.startswith(("/", "..")) or k == ".":
        k = "/".join(part for part in k.split("/") if part not in ("", ".", "..")) or "_"
    return k


def short_error(exc: BaseException, limit: int = 300) -> str:
    """An exception as one bounded line, for logs and fallback records."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + "..."
