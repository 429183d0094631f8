"""Bounded reading of user JSON and YAML (spec files, sweep files): parsing costs at most what the text is.

A few hundred bytes of YAML aliases expand to gigabytes (each level repeating the one below), and deeply
nested brackets exhaust the parser's recursion; duplicate keys silently keep the last value. So user
text is refused, with one line naming the problem and where it is, when it is larger than
:data:`MAX_BYTES`, nested deeper than :data:`MAX_DEPTH`, uses YAML anchors or aliases (no sweep or spec
needs them), or repeats a key in one mapping, and YAML text that is not valid Unicode. YAML also reads
``1e-4`` as a float (YAML 1.1 wants ``1.0e-4``), as people write it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 4 << 20  # a spec or sweep file is a few kB
MAX_DEPTH = 32  # the deepest real file nests 3 levels


class TextFormatError(ValueError):
    """User JSON/YAML that is not read: too big, too deep, aliased, a repeated key, or invalid."""


def read_text(path: str | os.PathLike[str]) -> str:
    """A UTF-8 text file of at most :data:`MAX_BYTES`; OSError and UnicodeDecodeError pass through."""
    size = Path(path).stat().st_size
    if size > MAX_BYTES:
        raise TextFormatError(f"is {size:,} bytes; files of at most {MAX_BYTES:,} bytes are read")
    return Path(path).read_text(encoding="utf-8")


def _too_deep(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > MAX_DEPTH:
                return True
            stack.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v))
    return False


def _bad_text(value: Any) -> str | None:
    """The first key or string in ``value`` that is not valid Unicode (a lone surrogate, which YAML's
    ``"\\ud800"`` escape makes and no file, log line or terminal can hold), None if there is none."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return v
    return None


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise TextFormatError(f"key {key!r} appears twice in one object")
        out[key] = value
    return out


def parse_json(text: str) -> Any:
    """JSON with no repeated key and at most :data:`MAX_DEPTH` levels."""
    if len(text) > MAX_BYTES:
        raise TextFormatError(f"is {len(text):,} characters; at most {MAX_BYTES:,} are read")
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except RecursionError:
        raise TextFormatError(f"is nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise TextFormatError(f"is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    if _too_deep(value):
        raise TextFormatError(f"is nested deeper than {MAX_DEPTH} levels")
    return value


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without anchors or aliases, repeated keys, or nesting past :data:`MAX_DEPTH`."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(None, None, "YAML anchors and aliases (&name, *name) are not accepted",
                                              event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                  event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                repeated = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: SafeLoader refuses it below
                continue
            if repeated:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice in one mapping",
                                                        key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


_BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+|\.[0-9_]+[eE][-+]?[0-9]+)$"),
    list("-+0123456789."),
)


def parse_yaml(text: str) -> Any:
    """One YAML document under the bounds above (plain data only: no Python objects)."""
    if len(text) > MAX_BYTES:
        raise TextFormatError(f"is {len(text):,} characters; at most {MAX_BYTES:,} are read")
    try:
        value = yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 — a SafeLoader subclass
    except RecursionError:
        raise TextFormatError(f"is nested deeper than {MAX_DEPTH} levels") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        if isinstance(exc, (yaml.composer.ComposerError, yaml.constructor.ConstructorError)):
            raise TextFormatError(f"{problem}{where}") from None
        raise TextFormatError(f"is not valid YAML ({problem}{where})") from None
    bad = _bad_text(value)
    if bad is not None:
        raise TextFormatError(f"holds text that is not valid Unicode: {ascii(bad)[:80]}")
    return value
