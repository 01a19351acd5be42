"""Strict field checks for the parameters file: each failure names file, line and field.

Owns the YAML location context (`Ctx`: a dotted field path to a line number) and the typed field
readers the parameters file's blocks are built from (numbers, seconds with units, mappings with
known keys, bounded integers, non-negative counts); duplicate keys are refused by the reader
(`specwatch.common.boundedfile`). Every reader returns the value or raises `ConfigError`; none
has a default.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import yaml

from specwatch.common.errors import ConfigError

__all__ = [
    "Ctx",
    "count",
    "integer",
    "mapping",
    "number",
    "seconds",
]

_UNIT_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_DURATION_RE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(s|ms|us|µs|ns)\s*")


class Ctx:
    """Where we are: file name and YAML node tree, to put a line number on each error."""

    def __init__(self, source: str, root: yaml.Node | None) -> None:
        self.source = source
        self.root = root

    def line(self, path: tuple[str | int, ...]) -> int | None:
        node = self.root
        line = None
        for part in path:
            if node is None:
                break
            nxt = None
            if isinstance(node, yaml.MappingNode):
                for key_node, value_node in node.value:
                    if key_node.value == part:
                        nxt = value_node
                        line = key_node.start_mark.line + 1
                        break
            elif (
                isinstance(node, yaml.SequenceNode)
                and isinstance(part, int)
                and 0 <= part < len(node.value)
            ):
                nxt = node.value[part]
                line = nxt.start_mark.line + 1
            node = nxt
        return line

    def fail(self, path: tuple[str | int, ...], message: str) -> ConfigError:
        where = self.source
        line = self.line(path)
        if line is not None:
            where = f"{where}:{line}"
        dotted = ""
        for part in path:
            dotted += f"[{part}]" if isinstance(part, int) else (f".{part}" if dotted else part)
        return ConfigError(f"{where}: {dotted}: {message}" if dotted else f"{where}: {message}")


def number(ctx: Ctx, path: tuple[str | int, ...], value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ctx.fail(path, f"expected {what}, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ctx.fail(path, f"expected {what}, got {value!r}")
    return v


def seconds(ctx: Ctx, path: tuple[str | int, ...], value: Any, upper: float) -> float:
    what = "a non-negative number of seconds"
    if isinstance(value, str):
        m = _DURATION_RE.fullmatch(value)
        if not m:
            raise ctx.fail(path, f"expected {what} (or a duration like '25ms'), got {value!r}")
        v = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    else:
        v = number(ctx, path, value, what)
    if v < 0:
        raise ctx.fail(path, f"expected {what}, got {value!r}")
    if v > upper:
        raise ctx.fail(
            path,
            f"{v:g} s is above {upper:g} s: values are seconds, was this written in "
            "milliseconds? (write '25ms' or 0.025)",
        )
    return v


def mapping(ctx: Ctx, path: tuple[str | int, ...], value: Any, allowed: tuple[str, ...] | None,
             required: tuple[str, ...] = ()) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ctx.fail(path, f"expected a mapping, got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str):
            raise ctx.fail(path, f"keys must be strings, got {key!r}")
        if allowed is not None and key not in allowed:
            raise ctx.fail((*path, key), f"unknown key; expected one of {', '.join(allowed)}")
    for key in required:
        if key not in value:
            raise ctx.fail(path, f"missing required key {key!r}")
    return value


def integer(ctx: Ctx, path: tuple[str | int, ...], value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ctx.fail(path, f"expected an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


def count(ctx: Ctx, path: tuple[str | int, ...], value: Any, unit: str) -> float:
    v = number(ctx, path, value, f"a number >= 0 ({unit})")
    if v < 0:
        raise ctx.fail(path, f"expected a number >= 0 ({unit}), got {value!r}")
    return v


