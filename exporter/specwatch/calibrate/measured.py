"""Calibration points from the exporter's measured A/B pairs (issue 16).

Why: a deployment running a pair (``pairs:`` in the serve config) measures its own latency
with and without SD at several loads, binned by arrival rate. Each bin of each side is one
steady (λ, L) point of the system (the model name): λ the side's finished requests per
second over the bin's windows, L its mean e2e latency, with the bin's mean prompt and
generation lengths, and on an SD side its draft length and acceptance length. A side
without drafts is a no-SD point (k = 0).

Read with instant queries at ``--end`` over ``--start..--end`` (``last_over_time``: the
latest value of each bin in the range), selected by ``--selector`` (exporter labels, e.g.
``pair="canary"``).
"""

from __future__ import annotations

import math
from collections import defaultdict

import requests

from specwatch.calibrate.inputs import Point, validate_point
from specwatch.calibrate.prometheus import PrometheusError, PrometheusQuery, _promql_duration
from specwatch.common.errors import ConfigError

#: exporter series -> Point field (per pair, model_name, arrival_rate_bin, side).
SERIES = {
    "sd_measured_side_arrival_rate": "arrival_rate",
    "sd_measured_latency_seconds": "latency_s",
    "sd_measured_prompt_tokens": "prompt_tokens",
    "sd_measured_generation_tokens": "generation_tokens",
    "sd_measured_draft_length": "draft_length",
    "sd_measured_acceptance_length": "acceptance_length",
}
KEY = ("pair", "model_name", "arrival_rate_bin", "side")


def _instant(session: requests.Session, q: PrometheusQuery, expr: str) -> list[dict]:
    try:
        resp = session.get(f"{q.url}/api/v1/query", params={"query": expr, "time": q.end},
                           timeout=q.timeout)
    except requests.RequestException as exc:
        raise PrometheusError(f"cannot reach Prometheus at {q.url}: {exc}") from None
    try:
        body = resp.json()
    except ValueError:
        raise PrometheusError(f"{q.url}/api/v1/query answered HTTP {resp.status_code} without"
                              " JSON; is this the Prometheus base URL?") from None
    if resp.status_code != 200 or body.get("status") != "success":
        raise PrometheusError(f"Prometheus refused {expr!r}: HTTP {resp.status_code}"
                              f" {body.get('errorType', '')}: {body.get('error', '')}".rstrip())
    return list((body.get("data") or {}).get("result") or [])


def read_pair_points(q: PrometheusQuery) -> list[Point]:
    """One point per pair, model, bin and side (ConfigError when there is no pair series)."""
    sel = f"{{{q.selector}}}" if q.selector else ""
    rng = _promql_duration(max(q.end - q.start, 1.0))
    values: dict[tuple[str, ...], dict[str, float]] = defaultdict(dict)
    with requests.Session() as session:
        for metric, fieldname in SERIES.items():
            for row in _instant(session, q, f"last_over_time({metric}{sel}[{rng}])"):
                labels = row.get("metric") or {}
                key = tuple(labels.get(k, "") for k in KEY)
                v = float(row["value"][1])
                if math.isfinite(v):
                    values[key].setdefault(fieldname, v)
    points = []
    for key in sorted(values):
        v = values[key]
        if "latency_s" not in v or "arrival_rate" not in v:
            continue
        pair, model, bin_, side = key
        k = v.get("draft_length", 0.0)
        if k and abs(k - round(k)) < 0.05:
            k = float(round(k))
        e = v.get("acceptance_length") if k > 0 else 1.0
        points.append(validate_point(Point(
            source=f"pair {pair} {side} {model} {bin_} req/s",
            system=model or "default", arrival_rate=v["arrival_rate"],
            latency_s=v["latency_s"], draft_length=k, acceptance_length=e,
            prompt_tokens=v.get("prompt_tokens"), generation_tokens=v.get("generation_tokens"))))
    if not points:
        raise ConfigError(
            f"Prometheus at {q.url} has no measured-pair series (sd_measured_latency_seconds"
            f"{sel}) in the range: configure pairs: in the exporter, check --selector and"
            " --start/--end; nothing was written")
    return points
