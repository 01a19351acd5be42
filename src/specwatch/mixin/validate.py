"""Checks of the values a user sets in the mixin's ``_config`` (``specwatch mixin render
--set``), made before anything is rendered or written.

Why: Jsonnet inserts these values into PromQL text and YAML fields as they are. A selector
without quotes (``job=vllm``) or a duration in words (``ten minutes``) renders without
complaint and gives rule files that Prometheus refuses to load, or alerts that can never
fire. Each check here names the key, the value and what it expects, in one line.

What is checked, by key:

- ``vllmSelector``, ``exporterSelector`` and the other engines' ``sglangSelector``,
  ``trtllmSelector``, ``llamacppSelector``: a PromQL label-matcher list, one or more
  ``name op "value"`` items separated by commas (op one of ``= != =~ !~``; value a double-,
  single- or back-quoted string), the text Jsonnet puts between ``{`` and ``}``.
- durations (``for``, ``keepFiringFor``, ``rateWindow`` ...): a Prometheus duration
  (``30s``, ``10m``, ``1h30m``); the ones documented as optional also take ``''``.
- exporter windows (``exporterWindow``, ``alerts.*.window``): a window the exporter serves,
  a Prometheus duration or ``<N>req``.
- thresholds: a number in the range that makes the comparison meaningful (an acceptance rate
  in [0, 1], a speedup above 0 ...).
- enumerations (``severity``, ``source``, ``statistic``, ``measure``): one of the known words.
- ``clusterLabel``: one label name; it is spliced into every ``by (...)``/``on (...)`` list,
  so ``cluster, instance`` would silently regroup every recording rule.
- ``runbookURLPattern``: an http(s) URL with exactly one ``%s`` (the lower-cased alert name;
  ``%%`` for a literal ``%``), as Jsonnet's ``%`` operator formats it.
- ``grafanaURL``: an http(s) URL or ``''``; ``dashboardUIDs.*``: a Grafana uid;
  ``alertLabels.*``: a non-empty value (Alertmanager routes on it).
- the two selectors together: not the same matcher list (one scrape job cannot be both vLLM
  and specwatch; one side's queries would be empty).

Keys the table does not know (dashboard titles, tags) keep only the type check of
`specwatch.mixin.overrides`.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from specwatch.common.errors import ConfigError
from specwatch.engines import registry

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


_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Grafana's uid rule: letters, digits, '-' and '_', at most 40 characters.
_GRAFANA_UID = re.compile(r"[a-zA-Z0-9_-]{1,40}")
# A Jsonnet/Python format directive: '%' then flags, width, precision and a conversion.
_FORMAT_DIRECTIVE = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?(.?)")


def _label_name(key: str, value: Any) -> None:
    if not _LABEL_NAME.fullmatch(str(value)):
        raise ConfigError(f"--set {key}: {value!r} is not one label name; expected a Prometheus "
                          "label name such as cluster ([a-zA-Z_][a-zA-Z0-9_]*): it is added to "
                          "every aggregation, so a list would regroup every rule")


def _http_url(text: str) -> bool:
    """An absolute http(s) URL with a host and nothing a template or a shell would split."""
    if any(ch.isspace() for ch in text) or "{{" in text or "}}" in text:
        return False
    parts = urllib.parse.urlsplit(text)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def _url_pattern(key: str, value: Any) -> None:
    text = str(value)
    conversions = [m.group(1) for m in _FORMAT_DIRECTIVE.finditer(text)]
    placeholders = [c for c in conversions if c != "%"]
    if placeholders != ["s"] or not _http_url(text.replace("%%", "%25").replace("%s", "x")):
        raise ConfigError(f"--set {key}: {text!r} is not a URL pattern; expected an http(s) URL "
                          "with exactly one %s (replaced by the lower-cased alert name) and %% "
                          "for a literal %, e.g. https://wiki.example.com/specwatch#%s")


def _grafana_url(key: str, value: Any) -> None:
    text = str(value)
    # The links append /d/<uid>/?<variables>, so the address ends at its path.
    if text != "" and (not _http_url(text) or "?" in text or "#" in text):
        raise ConfigError(f"--set {key}: {text!r} is not Grafana's address; expected an "
                          "http(s) URL without query or fragment, such as "
                          "https://grafana.example.com, or '' for no link")


def _alert_label(key: str, value: Any) -> None:
    text = str(value)
    if not text or "\n" in text:
        raise ConfigError(f"--set {key}: {text!r} is not a label value; expected a non-empty "
                          "single-line value: Alertmanager routes specwatch's alerts on it "
                          "(deploy/alertmanager matches component=\"specwatch\")")


def _grafana_uid(key: str, value: Any) -> None:
    if not _GRAFANA_UID.fullmatch(str(value)):
        raise ConfigError(f"--set {key}: {value!r} is not a Grafana dashboard uid; expected at "
                          "most 40 letters, digits, '-' or '_'")


_INF = math.inf
# Dotted key (``*`` for any alert) -> check. The first pattern that matches wins.
CHECKS: tuple[tuple[str, Callable[[str, Any], None]], ...] = (
    # One selector per engine family (the config's `<family>Selector`), and the exporter's.
    *((f"{family}Selector", _selector) for family in registry.families()),
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
    ("alerts.*.minDraftRate", _number(0, _INF)),
    ("alerts.*.minDraftedPolls", _number(0, _INF)),
    ("alerts.*.draftedPollsWindow", _duration(optional=False)),
    ("alerts.*.minSamples", _number(1, _INF, integer=True)),
    ("alerts.SDAcceptanceRateLow.threshold", _number(0, 1)),
    ("alerts.SDAcceptanceBimodal.threshold", _number(0, 1)),
    ("alerts.SDModelSaturated.threshold", _number(0, 1, low_open=True)),
    ("alerts.SDModelDrift.threshold", _number(0, _INF, low_open=True)),
    ("alerts.*.threshold", _number(0, _INF, low_open=True)),
    ("clusterLabel", _label_name),
    ("runbookURLPattern", _url_pattern),
    ("grafanaURL", _grafana_url),
    ("dashboardUIDs.*", _grafana_uid),
    ("alertLabels.*", _alert_label),
    ("grafana.refresh", _duration(optional=True)),
    ("grafana.xyChartMaxFrames", _number(1, _INF, integer=True)),
)


def _matches(pattern: str, parts: Sequence[str]) -> bool:
    p = pattern.split(".")
    return len(p) == len(parts) and all(a in ("*", b) for a, b in zip(p, parts, strict=True))


def check_value(key: str, value: Any, parts: Sequence[str] | None = None) -> None:
    """Raise ConfigError when ``value`` is not valid for the config key ``key`` (its path
    ``parts``, when a part holds a dot; else the dotted ``key`` split)."""
    path = tuple(parts) if parts is not None else tuple(key.split("."))
    for pattern, check in CHECKS:
        if _matches(pattern, path):
            check(key, value)
            return


def _normalized(selector: str) -> frozenset[tuple[str, str, str]]:
    """A matcher list as a set of (name, op, value): spacing, order and quoting ignored."""
    out = set()
    for name, op, quoted in matchers(selector):
        body = quoted[1:-1]
        if quoted[0] != "`":
            body = re.sub(r"\\(.)", r"\1", body)
        out.add((name.strip('"'), op, body))
    return frozenset(out)


def check_selectors(vllm: str, exporter: str) -> None:
    """Refuse one selector for both vLLM's and specwatch's series."""
    try:
        same = _normalized(vllm) == _normalized(exporter)
    except ValueError:  # each is checked on its own first
        return
    if same:
        raise ConfigError(f"--set vllmSelector and exporterSelector: both select {exporter!r}; "
                          "vLLM's series and specwatch's sd_* series come from different scrape "
                          "jobs, so one of the two would match nothing (e.g. vllmSelector="
                          "'job=\"vllm\"', exporterSelector='job=\"specwatch\"')")


def check_overrides(overrides: Mapping[str, Any], path: tuple[str, ...] = ()) -> None:
    """Every leaf of a nested overrides dict, checked."""
    for key, value in overrides.items():
        where = (*path, str(key))
        if isinstance(value, Mapping):
            check_overrides(value, where)
        else:
            check_value(".".join(where), value, where)
