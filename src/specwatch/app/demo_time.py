"""The demo's time base: what a reader on the wall clock needs from a scenario that runs
``speed`` times faster than real time.

`specwatch demo` keeps the exporter on the simulated clock (its windows, rates and timers
are the scenario's). Prometheus waits and counts on the wall clock, so everything it counts
in seconds is converted here: the rendered rules' ``for``/``keep_firing_for`` and range
windows divided by the speed, and the exporter's ``*_timestamp_seconds`` samples mapped
back to wall time (ages computed against ``time()`` are then real). The simulator's
counters are converted by its own wall-time view (``specwatch.sim.server.WallTimeView``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from specwatch.common.schema import parse_duration
from specwatch.web.routing import Handler, Request, Response

#: A sample of a timestamp series (``*_timestamp_seconds``) in a text or OpenMetrics page.
_TIMESTAMP_SAMPLE = re.compile(
    rb"^([a-zA-Z_:][a-zA-Z0-9_:]*_timestamp_seconds(?:\{.*\})?) (\S+)", re.MULTILINE)


def _scaled_duration(text: str, speed: float) -> str:
    """A Prometheus duration divided by ``speed``, in whole milliseconds, at least 1 ms
    (``for: 0s`` would mean "fire at once", a different rule)."""
    ms = max(1, round(parse_duration(text) * 1000.0 / speed))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


#: A range selector's or subquery's duration(s) in PromQL: ``[5m]``, ``[30m:1m]``.
_RANGE = re.compile(r"\[(\d+(?:\.\d+)?(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*)"
                    r"(?::(\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*)?)?\]")


def scaled_ranges(expr: str, speed: float) -> str:
    """``expr`` with every range window (and subquery resolution) divided by ``speed``."""
    def scale(m: re.Match[str]) -> str:
        out = "[" + _scaled_duration(m.group(1), speed)
        if m.group(0).find(":") >= 0:
            out += ":" + (_scaled_duration(m.group(2), speed) if m.group(2) else "")
        return out + "]"

    return _RANGE.sub(scale, expr)


def scaled_rules(rules: dict[str, Any], speed: float) -> dict[str, Any]:
    """Rendered rule groups with every range window of their expressions divided by
    ``speed`` (recorded names, which carry the window, are kept)."""
    out = {**rules, "groups": []}
    for group in rules.get("groups", []):
        new_rules = [{**r, "expr": scaled_ranges(r["expr"], speed)} if "expr" in r else r
                     for r in group.get("rules", [])]
        out["groups"].append({**group, "rules": new_rules})
    return out


def scaled_alert_durations(mixin_config: dict[str, Any], speed: float) -> dict[str, Any]:
    """Mixin overrides dividing every alert's ``for`` and ``keepFiringFor`` by ``speed``.

    Prometheus durations accept whole milliseconds; a duration that would round to 0 stays
    1 ms (``for: 0s`` would mean "fire at once", a different rule)."""
    def scaled(text: str) -> str:
        return _scaled_duration(text, speed)

    alerts: dict[str, Any] = {}
    for name, alert in mixin_config.get("alerts", {}).items():
        patch = {key: scaled(alert[key]) for key in ("for", "keepFiringFor")
                 if isinstance(alert.get(key), str) and alert[key]}
        if patch:
            alerts[name] = patch
    return {"alerts": alerts}


def wall_timestamps(handler: Handler, to_wall: Callable[[float], float]) -> Handler:
    """The exporter's /metrics with every ``*_timestamp_seconds`` sample mapped from the
    simulated clock to the wall clock (``to_wall``), for Prometheus, which computes ages
    against its wall clock. Served uncompressed (the rewrite needs the text)."""

    def handle(req: Request) -> Response:
        headers = {k: v for k, v in req.headers.items() if k != "accept-encoding"}
        resp = handler(replace(req, headers=headers))
        if resp.status != 200:
            return resp

        def mapped(m: re.Match[bytes]) -> bytes:
            return m.group(1) + b" " + repr(to_wall(float(m.group(2)))).encode()

        return replace(resp, body=_TIMESTAMP_SAMPLE.sub(mapped, resp.body))

    return handle
