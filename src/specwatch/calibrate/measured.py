"""Calibration points the exporter measured: A/B pairs and switch records.

A deployment measures its own latency at several loads and configurations without a
benchmark sweep; both exporter features become (λ, L) points of the system (the model
name), read from Prometheus history over ``--start..--end`` at ``--step`` (query_range),
selected by ``--selector``:

* **Pairs**: one point per *visit* of a pair's arrival-rate bin and side, the first run of
  samples of one presence of the series with one integral draft length and one workload,
  at its sample with the most finished requests; what follows in the same presence is a
  mixture and gives none.
* **Switch records** (the controller): two points (before and after) the first time a
  switch time appears; the same record seen at later steps is not counted again.

The rules (what a visit is, why, and how to size a pair's history for a fit) are in
docs/calibration.md, "Calibrating from what the exporter measured".
"""

from __future__ import annotations

import datetime as _dt
import math
from collections import defaultdict
from collections.abc import Iterable

from specwatch.calibrate.inputs import Point, validate_point
from specwatch.calibrate.promapi import new_session
from specwatch.calibrate.prometheus import PrometheusError, PrometheusQuery, query_range
from specwatch.common.errors import ConfigError

#: exporter pair series -> Point field (per pair, model_name, arrival_rate_bin,
#: acceptance_band, side).
SERIES = {
    "sd_measured_side_arrival_rate": "arrival_rate",
    "sd_measured_latency_seconds": "latency_s",
    "sd_measured_prompt_tokens": "prompt_tokens",
    "sd_measured_generation_tokens": "generation_tokens",
    "sd_measured_draft_length": "draft_length",
    "sd_measured_acceptance_length": "acceptance_length",
    "sd_measured_requests": "requests",
}
KEY = ("pair", "model_name", "arrival_rate_bin", "acceptance_band", "side")

#: controller switch-record series -> Point field (per target, model_name, action, side).
SWITCH_SERIES = {
    "sd_switch_window_arrival_rate": "arrival_rate",
    "sd_switch_window_latency_seconds": "latency_s",
    "sd_switch_window_prompt_tokens": "prompt_tokens",
    "sd_switch_window_generation_tokens": "generation_tokens",
    "sd_switch_window_draft_length": "draft_length",
    "sd_switch_window_acceptance_length": "acceptance_length",
}
SWITCH_TIME = "sd_switch_timestamp_seconds"
SWITCH_KEY = ("target", "model_name", "action", "side")

#: A visit's mean prompt and generation lengths stay within this of its first sample (a
#: bin's mean over a few hundred requests moves by 1-2% as it fills; one window of another
#: workload joining it moves it by far more).
LENGTH_TOLERANCE = 0.05
#: A gap of more than this many steps ends a bin's presence (the bin emptied).
PRESENCE_GAP_STEPS = 5
#: A visit is at least this many samples: a bin whose first visible sample already mixes
#: two workloads changes at every sample after it and gives no point.
MIN_VISIT_SAMPLES = 3
#: A draft length this close to an integer is that integer; further off, the sample mixes.
DRAFT_LENGTH_TOLERANCE = 0.05
#: A drafter may propose fewer tokens than its k (an n-gram lookup without a full match), so
#: its mean proposed tokens per draft lies just below k: up to this far below an integer, the
#: draft length is that integer (a real vLLM n-gram pair at k = 2 proposes 1.84-1.95).
SHORT_PROPOSALS = 0.2

Series = dict[tuple[str, ...], dict[str, dict[float, float]]]


def _pull(q: PrometheusQuery, metrics: dict[str, str], key: tuple[str, ...]) -> Series:
    """key labels -> field -> {timestamp: value} for every metric, over the whole range."""
    sel = f"{{{q.selector}}}" if q.selector else ""
    out: Series = defaultdict(lambda: defaultdict(dict))
    with new_session(q.url) as session:
        for metric, fieldname in metrics.items():
            for start, end in q.chunks():
                for labels, samples in query_range(session, q, f"{metric}{sel}", start, end):
                    k = tuple(labels.get(n, "") for n in key)
                    for ts, v in samples:
                        if math.isfinite(v):
                            out[k][fieldname][ts] = v
    return out


def _integral_k(k: float | None) -> float | None:
    """The draft length as an integer (0 without drafts); None when it mixes two."""
    if k is None or k == 0:
        return 0.0
    if abs(k - round(k)) <= DRAFT_LENGTH_TOLERANCE:
        return float(round(k))
    if math.ceil(k) - k <= SHORT_PROPOSALS:
        return float(math.ceil(k))
    return None


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return True
    return abs(a - b) <= LENGTH_TOLERANCE * max(abs(a), abs(b), 1e-12)


def visits(fields: dict[str, dict[float, float]], step: float) -> list[list[float]]:
    """Sample times of each visit of one bin and side (see the module docstring).

    A *presence* is a stretch of samples without a gap longer than ``PRESENCE_GAP_STEPS``
    steps (a missed scrape or two does not end it; a bin that emptied and refilled does).
    Within a presence, the first run of samples with one draft length and one workload is
    the visit; what follows it in the same presence is the bin after other traffic (another
    load's or workload's windows) joined it, a mixture that is no configuration's point.
    """
    times = sorted(set(fields.get("latency_s", {})) & set(fields.get("arrival_rate", {})))
    out: list[list[float]] = []
    run: list[float] = []
    first: dict[str, float | None] = {}
    closed = False  # the presence's visit has ended: skip until the next presence
    last_t = -math.inf
    for t in times:
        if t - last_t > PRESENCE_GAP_STEPS * step:  # a new presence
            if run:
                out.append(run)
            run, closed = [], False
        last_t = t
        if closed:
            continue
        k = _integral_k(fields.get("draft_length", {}).get(t))
        now = {"k": k, "p": fields.get("prompt_tokens", {}).get(t),
               "g": fields.get("generation_tokens", {}).get(t)}
        if k is None:  # a mix of two draft lengths: not one configuration
            same = False
        elif not run:
            run, first = [t], now
            continue
        else:
            same = (now["k"] == first["k"] and _close(first["p"], now["p"])
                    and _close(first["g"], now["g"]))
        if same:
            run.append(t)
        else:
            if run:
                out.append(run)
            run, closed = [], True
    if run:
        out.append(run)
    return out


def _point(source: str, system: str, fields: dict[str, dict[float, float]], t: float
           ) -> Point | None:
    v = {name: values[t] for name, values in fields.items() if t in values}
    if "latency_s" not in v or "arrival_rate" not in v:
        return None
    k = _integral_k(v.get("draft_length")) or 0.0
    e = v.get("acceptance_length") if k > 0 else 1.0
    return validate_point(Point(
        source=source, system=system or "default", arrival_rate=v["arrival_rate"],
        latency_s=v["latency_s"], draft_length=k, acceptance_length=e,
        prompt_tokens=v.get("prompt_tokens"), generation_tokens=v.get("generation_tokens")))


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pair_points(series: Series, step: float) -> list[Point]:
    """One point per visit of each pair, model, bin and side (see the module docstring)."""
    points = []
    for key in sorted(series):
        pair, model, bin_, band, side = key
        fields = series[key]
        counts = fields.get("requests", {})
        seen: set[tuple[float, float]] = set()
        for run in visits(fields, step):
            if len(run) < MIN_VISIT_SAMPLES:
                continue
            best = max(run, key=lambda t: (counts.get(t, 0.0), t))
            regime = f" acceptance {band}" if band else ""
            p = _point(f"pair {pair} {side} {model} {bin_} req/s{regime} at {_iso(best)}",
                       model, fields, best)
            # The same figures again (a scrape gap split a presence): one measurement.
            if p is not None and (p.arrival_rate, p.latency_s) not in seen:
                seen.add((p.arrival_rate, p.latency_s))
                points.append(p)
    return points


def read_pair_points(q: PrometheusQuery) -> list[Point]:
    """Pair points over the query's range (ConfigError when there is no pair series)."""
    points = pair_points(_pull(q, SERIES, KEY), q.step)
    if not points:
        sel = f"{{{q.selector}}}" if q.selector else ""
        raise ConfigError(
            f"Prometheus at {q.url} has no measured-pair series (sd_measured_latency_seconds"
            f"{sel}) between {_iso(q.start)} and {_iso(q.end)}: configure pairs: in the"
            " exporter, check --selector and --start/--end; nothing was written")
    return points


def switch_points(times: Series, windows: Series) -> list[Point]:
    """Before and after points of every switch record, once per record."""
    points = []
    seen: set[tuple[str, ...]] = set()
    for (target, model, action, _side), fields in sorted(times.items()):
        for t, switched_at in sorted(fields.get("switched_at", {}).items()):
            record = (target, model, action, f"{switched_at:.3f}")
            if record in seen:
                continue
            seen.add(record)
            for side in ("before", "after"):
                p = _point(f"switch {target} {model} {action} {side} {_iso(switched_at)}",
                           model, windows.get((target, model, action, side), {}), t)
                if p is not None:
                    points.append(p)
    return points


def read_switch_points(q: PrometheusQuery) -> list[Point]:
    """Switch-record points over the query's range (ConfigError when there is none)."""
    times = _pull(q, {SWITCH_TIME: "switched_at"}, SWITCH_KEY)
    points = switch_points(times, _pull(q, SWITCH_SERIES, SWITCH_KEY)) if times else []
    if not points:
        sel = f"{{{q.selector}}}" if q.selector else ""
        raise ConfigError(
            f"Prometheus at {q.url} has no complete switch record ({SWITCH_TIME}{sel} with"
            f" sd_switch_window_latency_seconds) between {_iso(q.start)} and {_iso(q.end)}:"
            " the controller records one per SD switch once a full decision window after it"
            " has passed; check --selector and --start/--end; nothing was written")
    return points


def sources_of(points: Iterable[Point]) -> dict[str, dict[str, int]]:
    """How many points of each system came from where: ``files`` (bench JSON, CSV),
    ``vllm`` (steady windows of vLLM's history), ``pairs``, ``switches``."""
    kinds = {"prometheus": "vllm", "pair": "pairs", "switch": "switches"}
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for p in points:
        out[p.system][kinds.get(p.source.split(" ", 1)[0], "files")] += 1
    return {s: dict(c) for s, c in sorted(out.items())}


__all__ = ["PrometheusError", "read_pair_points", "read_switch_points", "sources_of"]
