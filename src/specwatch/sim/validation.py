"""Strict validation of a scenario file's YAML: each mapping checked with its key path.

`Node` wraps one mapping of the document; its accessors check type and range and raise
`ConfigError` naming the file and the key path (``models[0].phases[2].arrival_rate.to``).
`allow` rejects unknown keys before anything else is read, so a typo is reported as a typo, and
`finish` rejects keys nobody read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from specwatch.common.errors import ConfigError

__all__ = ["Node", "check_number", "kind_of"]


class Node:
    """One mapping of the YAML document with its key path, for strict, well-named checks."""

    def __init__(self, source: str, path: str, value: Any) -> None:
        self.source = source
        self.path = path
        if not isinstance(value, Mapping):
            self.fail(f"expected a mapping, got {kind_of(value)}")
        self.data: Mapping[str, Any] = value
        self.used: set[str] = set()

    def where(self, key: str | None = None) -> str:
        if key is None:
            return self.path or "(top level)"
        return f"{self.path}.{key}" if self.path else key

    def fail(self, message: str, key: str | None = None) -> ConfigError:
        raise ConfigError(f"{self.source}: {self.where(key)}: {message}")

    def allow(self, *keys: str) -> None:
        """Reject unknown keys before anything else, so a typo is reported as a typo."""
        unknown = [k for k in self.data if k not in keys]
        if unknown:
            self.fail(f"unknown key {unknown[0]!r} (allowed here: {', '.join(keys)})",
                      str(unknown[0]))

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = ..., required: bool = False) -> Any:
        self.used.add(key)
        if key not in self.data:
            if required or default is ...:
                self.fail("required key is missing", key)
            return default
        return self.data[key]

    def number(
        self,
        key: str,
        default: Any = ...,
        *,
        lo: float | None = None,
        hi: float | None = None,
        lo_open: bool = False,
        hi_open: bool = False,
        integer: bool = False,
    ) -> Any:
        value = self.raw(key, default)
        if value is default and default is not ...:
            return value
        return check_number(self, key, value, lo, hi, lo_open, hi_open, integer)

    def string(self, key: str, default: Any = ...) -> Any:
        value = self.raw(key, default)
        if value is default and default is not ...:
            return value
        if not isinstance(value, str) or not value:
            self.fail(f"expected a non-empty string, got {kind_of(value)}", key)
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            self.fail(f"expected true or false, got {kind_of(value)}", key)
        return value

    def child(self, key: str) -> Node:
        return Node(self.source, self.where(key), self.raw(key, required=True))

    def items(self, key: str, default: Any = ...) -> list[tuple[str, Any]]:
        value = self.raw(key, default)
        if value is default and default is not ...:
            return []
        if not isinstance(value, list):
            self.fail(f"expected a list, got {kind_of(value)}", key)
        return [(f"{self.where(key)}[{i}]", item) for i, item in enumerate(value)]

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.used, key=str)
        if unknown:
            allowed = ", ".join(sorted(self.used))
            self.fail(f"unknown key {unknown[0]!r} (allowed here: {allowed})", str(unknown[0]))


def kind_of(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({value})"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def check_number(
    node: Node,
    key: str,
    value: Any,
    lo: float | None,
    hi: float | None,
    lo_open: bool,
    hi_open: bool,
    integer: bool,
) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        node.fail(f"expected a number, got {kind_of(value)}", key)
    if not math.isfinite(value):
        node.fail(f"expected a finite number, got {value}", key)
    if integer:
        if isinstance(value, float) and not value.is_integer():
            node.fail(f"expected an integer, got {value}", key)
        value = int(value)
    too_low = lo is not None and (value <= lo if lo_open else value < lo)
    too_high = hi is not None and (value >= hi if hi_open else value > hi)
    if too_low or too_high:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        span = f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}"
        node.fail(f"expected a number in {span}, got {value}", key)
    return value
