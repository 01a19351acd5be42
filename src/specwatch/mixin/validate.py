"""Checks of the values a user sets in the mixin's ``_config`` (``specwatch mixin render
--set``), made before anything is rendered or written.

Why: Jsonnet inserts these values into PromQL text and YAML fields as they are. A selector
without quotes (``job=vllm``) or a duration in words (``ten minutes``) renders without
complaint and gives rule files that Prometheus refuses to load, or alerts that can never
fire. Each check here names the key, the value and what it expects, in one line.

What is checked, by key:

- ``vllmSelector``, ``exporterSelector``: a PromQL label-matcher list, one or more
  ``name op "value"`` items separated by commas (op one of ``= != =~ !~``; value a double-,
  single- or back-quoted string), the text Jsonnet puts between ``{`` and ``}``.
- durations (``for``, ``keepFiringFor``, ``rateWindow`` ...): a Prometheus duration
  (``30s``, ``10m``, ``1h30m``); the ones documented as optional also take ``''``.
- exporter windows (``exporterWindow``, ``alerts.*.window``): a window the exporter serves,
  a Prometheus duration or ``<N>req``.
- thresholds: a number in the range that makes the comparison meaningful (an acceptance rate
  in [0, 1], a speedup above 0 ...).
- enumerations (``severity``, ``source``, ``statistic``, ``measure``): one of the known words.

Keys the table does not know (dashboard titles, tags, URLs) keep only the type check of
`specwatch.mixin.overrides`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from specwatch.common.errors import ConfigError

# PromQL label matchers, as the Prometheus parser reads them: a label name (or a quoted
# UTF-8 name, Prometheus 3), an operator, and a string literal in one of the three quotings.
_NAME = r'(?:[a-zA-Z_][a-zA-Z0-9_]*|"(?:[^"\\\n]|\\.)*")'
_STRING = r'(?:"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|`[^`]*`)'
_MATCHER = rf"\s*{_NAME}\s*(?:=~|!~|!=|=)\s*{_STRING}\s*"
_MATCHER_LIST = re.compile(rf"{_MATCHER}(?:,{_MATCHER})*,?\s*")
_MATCHER_ONE = re.compile(rf"\s*({_NAME})\s*(=~|!~|!=|=)\s*({_STRING})\s*")

# Prometheus' duration syntax (model.ParseDuration): units in decreasing order, each once.
_DURATION = re.compile(r"(?:\d+y)?(?:\d+w)?(?:\d+d)?(?:\d+h)?(?:\d+m)?(?:\d+s)?(?:\d+ms)?")
_REQUEST_WINDOW = re.compile(r"[1-9]\d*req")

SEVERITIES = ("critical", "warning", "info")
SOURCES = ("exporter", "vllm")
STATISTICS = ("mean", "p50", "p99")
MEASURES = ("alpha", "rate")


def is_duration(text: str) -> bool:
    """True for a non-zero Prometheus duration (``90s``, ``1h30m``)."""
    return bool(text) and _DURATION.fullmatch(text) is not None and any(
        c in "123456789" for c in text)


def matchers(text: str) -> list[tuple[str, str, str]]:
    """``job="vllm", namespace=~"llm-.*"`` -> [(name, op, quoted value), ...].

    Raises ValueError when ``text`` is not a non-empty matcher list."""
    if not text.strip() or _MATCHER_LIST.fullmatch(text) is None:
        raise ValueError(text)
    items = [m for m in _split_top_level(text) if m.strip()]
    out = []
    for item in items:
        m = _MATCHER_ONE.fullmatch(item)
        if m is None:  # pragma: no cover - the list pattern already accepted it
            raise ValueError(item)
        out.append((m.group(1), m.group(2), m.group(3)))
    return out


def _split_top_level(text: str) -> list[str]:
    """Split at the commas outside string literals."""
    parts, current, quote = [], [], ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            current.append(ch)
            if ch == "\\" and quote != "`" and i + 1 < len(text):
                current.append(text[i + 1])
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'`":
            quote = ch
            current.append(ch)
        elif ch == ",":
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current))
    return parts


def _selector(key: str, value: Any) -> None:
    try:
        matchers(str(value))
    except ValueError:
        hint = ""
        bare = re.fullmatch(r"\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*([^\"'`,]+?)\s*", str(value))
        if bare:
            hint = f" (quote the value: {bare.group(1)}{bare.group(2)}\"{bare.group(3)}\")"
        raise ConfigError(
            f"--set {key}: {value!r} is not a PromQL label-matcher list; expected "
            f"name=\"value\" items separated by commas, e.g. 'job=\"vllm\"'{hint}") from None


def _duration(optional: bool) -> Callable[[str, Any], None]:
    def check(key: str, value: Any) -> None:
        text = str(value)
        if optional and text == "":
            return
        if not is_duration(text):
            also = " or '' to leave it out" if optional else ""
            raise ConfigError(f"--set {key}: {text!r} is not a Prometheus duration; expected "
                              f"a number with a unit such as 30s, 10m, 1h30m{also}")
    return check


def _window(key: str, value: Any) -> None:
    text = str(value)
    if not (is_duration(text) or _REQUEST_WINDOW.fullmatch(text)):
        raise ConfigError(f"--set {key}: {text!r} is not an exporter window; expected a "
                          "Prometheus duration (1m, 5m, 15m) or a request count (1000req)")


def _number(low: float, high: float, *, low_open: bool = False,
            integer: bool = False) -> Callable[[str, Any], None]:
    def check(key: str, value: Any) -> None:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(
            value)
        if ok:
            ok = (value > low if low_open else value >= low) and value <= high
        if ok and integer:
            ok = float(value).is_integer()
        if not ok:
            lo = "(" if low_open else "["
            hi = "]" if math.isfinite(high) else ")"
            kind = "an integer" if integer else "a number"
            raise ConfigError(f"--set {key}: {value!r} is out of range; expected {kind} in "
                              f"{lo}{low:g}, {high:g}{hi}")
    return check


def _one_of(words: tuple[str, ...]) -> Callable[[str, Any], None]:
    def check(key: str, value: Any) -> None:
        if value not in words:
            raise ConfigError(f"--set {key}: {value!r} is not one of {', '.join(words)}")
    return check


_INF = math.inf
# Dotted key (``*`` for any alert) -> check. The first pattern that matches wins.
CHECKS: tuple[tuple[str, Callable[[str, Any], None]], ...] = (
    ("vllmSelector", _selector),
    ("exporterSelector", _selector),
    ("rateWindow", _duration(optional=False)),
    ("exporterWindow", _window),
    ("alerts.*.window", _window),
    ("alerts.*.for", _duration(optional=False)),
    ("alerts.*.keepFiringFor", _duration(optional=True)),
    ("alerts.*.missingSampleGrace", _duration(optional=True)),
    ("alerts.*.severity", _one_of(SEVERITIES)),
    ("alerts.*.source", _one_of(SOURCES)),
    ("alerts.*.statistic", _one_of(STATISTICS)),
    ("alerts.*.measure", _one_of(MEASURES)),
    ("alerts.*.minArrivalRate", _number(0, _INF)),
    ("alerts.*.minSamples", _number(1, _INF, integer=True)),
    ("alerts.SDAcceptanceRateLow.threshold", _number(0, 1)),
    ("alerts.SDAcceptanceBimodal.threshold", _number(0, 1)),
    ("alerts.SDModelSaturated.threshold", _number(0, 1, low_open=True)),
    ("alerts.SDModelDrift.threshold", _number(0, _INF, low_open=True)),
    ("alerts.*.threshold", _number(0, _INF, low_open=True)),
    ("grafana.refresh", _duration(optional=True)),
    ("grafana.xyChartMaxFrames", _number(1, _INF, integer=True)),
)


def _matches(pattern: str, key: str) -> bool:
    p, k = pattern.split("."), key.split(".")
    return len(p) == len(k) and all(a in ("*", b) for a, b in zip(p, k, strict=True))


def check_value(key: str, value: Any) -> None:
    """Raise ConfigError when ``value`` is not valid for the dotted config ``key``."""
    for pattern, check in CHECKS:
        if _matches(pattern, key):
            check(key, value)
            return


def check_overrides(overrides: Mapping[str, Any], path: str = "") -> None:
    """Every leaf of a nested overrides dict, checked."""
    for key, value in overrides.items():
        where = f"{path}.{key}" if path else str(key)
        if isinstance(value, Mapping):
            check_overrides(value, where)
        else:
            check_value(where, value)
