"""Strict YAML configuration checking, shared by every file specwatch reads (the serve config,
the web config, scenario and parameter files where they use it).

A schema is a table of :class:`Key` entries (type, children, item type, a check function, a
one-line doc); :func:`validate` walks a parsed document against it and raises one
:class:`~specwatch.common.errors.ConfigError` naming the file and the key path, e.g.
``specwatch.yaml: targets[1].url: expected an http(s) URL, got 'foo'``. Check functions raise
:class:`CheckError` with what was expected; ``validate`` adds where.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from specwatch.common import boundedfile
from specwatch.common.boundedfile import SERVE_CONFIG, FileKind
from specwatch.common.errors import ConfigError


class CheckError(Exception):
    """Raised by a check: the message says what was expected (wrapped into ConfigError)."""


@dataclass(frozen=True)
class Key:
    """One schema entry. ``kind`` is the YAML type; ``check`` converts or raises CheckError.

    For ``kind=dict``: ``children`` is the nested schema (unknown keys are errors) or, with
    ``values`` set, a free mapping whose values follow ``values``. For ``kind=list``:
    ``items`` is the schema of each element.
    """

    kind: type | tuple[type, ...]
    required: bool = False
    check: Callable[[Any], Any] | None = None
    children: Mapping[str, Key] | None = None
    values: Key | None = None
    items: Key | None = None
    doc: str = ""


_DURATION_RE = re.compile(r"((\d+)h)?((\d+)m(?!s))?((\d+)s)?((\d+)ms)?")


#: Longest duration a config may give (a year): an infinite or astronomically long one would
#: make every timer and deadline overflow (``Event.wait(inf)``, ``monotonic() + 1e308``).
MAX_DURATION_SECONDS = 365 * 86400.0


def parse_duration(value: Any) -> float:
    """Seconds from a number or a Prometheus-style duration ("500ms", "30s", "1m30s", "1h")."""
    if isinstance(value, bool):
        raise CheckError(f"expected a duration, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        m = _DURATION_RE.fullmatch(value.strip())
        if not m or not value.strip():
            raise CheckError(f"expected a duration like 30s, 1m or 1h30m, got {value!r}")
        h, mi, s, ms = (int(g) if g else 0 for g in m.group(2, 4, 6, 8))
        seconds = h * 3600 + mi * 60 + s + ms / 1000.0
    else:
        raise CheckError(f"expected a duration, got {type(value).__name__}")
    if not seconds > 0:
        raise CheckError(f"expected a positive duration, got {value!r}")
    if not seconds <= MAX_DURATION_SECONDS:  # also inf and nan: they break every timer
        raise CheckError(f"expected a finite duration of at most 365d (31536000s), "
                         f"got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """The Prometheus spelling of a duration (used as the ``window`` label)."""
    ms = round(seconds * 1000)
    if ms % 1000:
        return f"{ms}ms"
    s = ms // 1000
    out = ""
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            out += f"{s // size}{unit}"
            s %= size
    return out or "0s"


def check_url(value: str) -> str:
    """An http(s) URL with a host; an empty path means ``/metrics``."""
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CheckError(f"expected an http(s) URL like http://host:8000/metrics, got {value!r}")
    try:
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as exc:
        raise CheckError(f"bad port in URL {value!r}") from exc
    if parts.username is not None or parts.password is not None:
        # Never echo the URL: it holds a password. Credentials in URLs end up in logs.
        raise CheckError("credentials in the URL are not allowed (they would reach logs); "
                         "use auth: {type: basic, username: ..., password_file: ...}")
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def check_url_any_path(value: str) -> str:
    """An http(s) URL with a host, path kept as given (a webhook endpoint)."""
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CheckError(f"expected an http(s) URL, got {value!r}")
    try:
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as exc:
        raise CheckError(f"bad port in URL {value!r}") from exc
    return value.strip()


def check_listen(value: str) -> str:
    _host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise CheckError(f"expected HOST:PORT, got {value!r}")
    return value


def positive_int(minimum: int) -> Callable[[Any], int]:
    """Check: an integer of at least ``minimum``."""
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise CheckError(f"expected an integer >= {minimum}, got {value!r}")
        return value
    return check


def non_negative(value: Any) -> float:
    """Check: a finite number >= 0."""
    if isinstance(value, bool) or not (value >= 0 and math.isfinite(value)):
        raise CheckError(f"expected a finite number >= 0, got {value!r}")
    return float(value)


def one_of(*choices: str) -> Callable[[Any], str]:
    """Check: one of ``choices``."""
    def check(value: Any) -> str:
        if value not in choices:
            raise CheckError(f"expected one of {', '.join(choices)}, got {value!r}")
        return value
    return check


#: The YAML kinds of a number key.
NUM: tuple[type, ...] = (int, float)


def unit_interval(value: Any) -> float:
    """Check: a number in [0, 1]."""
    if isinstance(value, bool) or not 0 <= value <= 1:  # nan fails too
        raise CheckError(f"expected a number in [0, 1], got {value!r}")
    return float(value)


def positive(value: Any) -> float:
    """Check: a finite number > 0."""
    if isinstance(value, bool) or not (value > 0 and math.isfinite(value)):
        raise CheckError(f"expected a finite number > 0, got {value!r}")
    return float(value)


def duration_or_zero(value: Any) -> float:
    """A duration that may be 0 (e.g. no stabilization)."""
    if not isinstance(value, bool) and isinstance(value, int | float) and value == 0:
        return 0.0
    return parse_duration(value)


#: The YAML kinds of a duration key: seconds as a number, or a string like "30s".
DURATION: tuple[type, ...] = (*NUM, str)


def validate(value: Any, key: Key, path: str, where: str) -> Any:
    """Check ``value`` against ``key``; return the converted value or raise ConfigError."""
    def fail(msg: str) -> ConfigError:
        return ConfigError(f"{where}: {path}: {msg}")

    kinds = key.kind if isinstance(key.kind, tuple) else (key.kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise fail(f"expected {_kind_name(key.kind)}, got a boolean")
    if not isinstance(value, kinds):
        raise fail(f"expected {_kind_name(key.kind)}, got {_yaml_type(value)}")
    if key.kind is dict and key.children is not None:
        out = {}
        for k, v in value.items():
            sub = f"{path}.{k}" if path else str(k)
            if k not in key.children:
                allowed = ", ".join(key.children)
                raise ConfigError(f"{where}: {sub}: unknown key (allowed: {allowed})")
            out[k] = validate(v, key.children[k], sub, where)
        for k, child in key.children.items():
            if child.required and k not in value:
                raise fail(f"missing required key {k!r}")
        return out
    if key.kind is dict and key.values is not None:
        return {str(k): validate(v, key.values, f"{path}.{k}", where) for k, v in value.items()}
    if key.kind is list and key.items is not None:
        return [validate(v, key.items, f"{path}[{i}]", where) for i, v in enumerate(value)]
    if key.check is not None:
        try:
            return key.check(value)
        except CheckError as exc:
            raise fail(str(exc)) from None
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "a number", float: "a number", str: "a string", dict: "a mapping",
             list: "a list"}
    return " or ".join(dict.fromkeys(names.get(k, k.__name__) for k in kinds))


def _yaml_type(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__) \
        + (f" {value!r}" if isinstance(value, int | float | str) else "")


def read_yaml(path: str, kind: FileKind = SERVE_CONFIG) -> Any:
    """Parse one YAML file (an empty file is ``{}``); errors name the file and line.

    Shared by every file the exporter reads at start-up (this config, the web config) so
    they all fail the same way: one ConfigError, never a traceback. The file is read with
    the bounds of its kind (:mod:`specwatch.common.boundedfile`).
    """
    data = boundedfile.read_yaml(path, kind)
    return {} if data is None else data
