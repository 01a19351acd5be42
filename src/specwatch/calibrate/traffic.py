"""The load and workload of a deployment, read from Prometheus (``advise --prometheus``).

Why here: it is Prometheus reading, like calibration's history pull (same client rules, same
errors), and the latency model must not import an HTTP client; ``specwatch.cli.advise``
hands the result to the pure advise core as a :class:`~specwatch.model.whatif.advise.Traffic`.

What is read over ``--range`` (default 7d), for the series matching ``--selector``, with
instant queries at the end of the range:

* arrival-rate percentiles: ``quantile_over_time(q, (sum(rate(requests[rate_window])))
  [range:step])``, the request rate of the whole selection (all engines) at each step;
* mean prompt and generation lengths (increase of ``_sum`` over increase of ``_count``) and
  their P95 (``histogram_quantile`` over the range's bucket increases);
* the acceptance profile per position: accepted tokens at position i per draft, i.e.
  P(the first i+1 drafts are accepted), summed over the range;
* the peak batch: the largest requests-running sample of any engine.

The metric names are vLLM v1's (:mod:`specwatch.engines.vllm_v1`), the engine calibration
reads.

Missing data is an error (exit 2) naming what was missing; nothing is made up.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

import requests

from specwatch.calibrate.promapi import PrometheusError, Row, new_session, query
from specwatch.calibrate.prometheus import (
    ENGINE,
    SELECTOR_RE,
    parse_duration,
    promql_duration,
)
from specwatch.common.errors import ConfigError
from specwatch.engines import base

REQUESTS = ENGINE.metric(base.E2E_LATENCY_COUNT)
#: Histogram families (their _sum, _count and _bucket series are read).
PROMPT = ENGINE.metric(base.PROMPT_LEN_SUM).removesuffix("_sum")
GENERATION = ENGINE.metric(base.GENERATION_LEN_SUM).removesuffix("_sum")
DRAFTS = ENGINE.metric(base.DRAFTS)
PER_POSITION = ENGINE.metric(base.ACCEPTED_PER_POSITION)
RUNNING = ENGINE.metric(base.RUNNING)
QUANTILES = {"p50": 0.5, "p95": 0.95, "p99": 0.99}


@dataclass(frozen=True)
class TrafficQuery:
    """Where and over what to read: URL, selector, range, rate window, subquery step."""

    url: str
    selector: str = ""
    range_s: float = 7 * 86400.0
    rate_window_s: float = 300.0
    step_s: float = 60.0
    at: float | None = None
    timeout: float = 30.0

    @classmethod
    def from_args(cls, *, url: str, selector: str, range_: str, rate_window: str, step: str,
                  timeout: float = 30.0) -> TrafficQuery:
        if not re.match(r"^https?://[^\s/]+", url):
            raise ConfigError(f"--prometheus: expected http(s)://host:port, got {url!r}")
        sel = selector.strip()
        if sel.startswith("{") and sel.endswith("}"):
            sel = sel[1:-1].strip()
        if sel and not SELECTOR_RE.fullmatch(sel):
            raise ConfigError(f'--selector: expected label matchers like model_name="qwen",'
                              f" got {selector!r}")
        r = parse_duration(range_, "--range")
        w = parse_duration(rate_window, "--rate-window")
        st = parse_duration(step, "--step")
        if w >= r:
            raise ConfigError(f"--rate-window {rate_window} must be shorter than --range "
                              f"{range_}")
        return cls(url.rstrip("/"), sel, r, w, st, None, timeout)

    def sel(self, metric: str) -> str:
        return f"{metric}{{{self.selector}}}" if self.selector else metric


@dataclass(frozen=True)
class TrafficReading:
    """What was read (None where Prometheus had no data for it)."""

    arrival_rates: dict[str, float]
    prompt_tokens: float
    generation_tokens: float
    prompt_tokens_p95: float | None
    generation_tokens_p95: float | None
    acceptance_profile: tuple[float, ...] | None
    peak_batch: float | None
    at: float


def _instant(session: requests.Session, q: TrafficQuery, expr: str, at: float) -> list[Row]:
    return query(session, q.url, "/api/v1/query", {"query": expr, "time": f"{at:.3f}"},
                 q.timeout, "vector", expr)


def _scalar(rows: list[Row]) -> float | None:
    if not rows or not rows[0][1]:
        return None
    v = rows[0][1][0][1]
    return v if math.isfinite(v) else None


def read_traffic(q: TrafficQuery) -> TrafficReading:
    """Every input of the advice from Prometheus (PrometheusError when a required one is
    missing: no request series, no length histograms)."""
    at = q.at if q.at is not None else time.time()
    rng = promql_duration(q.range_s)
    win = promql_duration(q.rate_window_s)
    step = promql_duration(q.step_s)
    where = f"{{{q.selector}}}" if q.selector else "(no selector)"
    with new_session(q.url) as s:
        rate = f"sum(rate({q.sel(REQUESTS)}[{win}]))"
        rates: dict[str, float] = {}
        for name, quant in QUANTILES.items():
            v = _scalar(_instant(s, q, f"quantile_over_time({quant}, ({rate})[{rng}:{step}])",
                                 at))
            if v is None:
                raise PrometheusError(
                    f"no request-rate data ({REQUESTS} matching {where}) in the last {rng} at "
                    f"{q.url}: check --selector and --range; nothing was advised")
            rates[name] = v
        means = {}
        for name, metric in (("prompt", PROMPT), ("generation", GENERATION)):
            v = _scalar(_instant(
                s, q, f"sum(increase({q.sel(metric + '_sum')}[{rng}])) / "
                      f"sum(increase({q.sel(metric + '_count')}[{rng}]))", at))
            if v is None:
                raise PrometheusError(f"no {metric}_sum/_count data matching {where} in the "
                                      f"last {rng}: the mean {name} length is unknown")
            means[name] = v
        p95 = {}
        for name, metric in (("prompt", PROMPT), ("generation", GENERATION)):
            p95[name] = _scalar(_instant(
                s, q, f"histogram_quantile(0.95, sum by (le) "
                      f"(increase({q.sel(metric + '_bucket')}[{rng}])))", at))
        drafts = _scalar(_instant(s, q, f"sum(increase({q.sel(DRAFTS)}[{rng}]))", at))
        profile = None
        if drafts is not None and drafts > 0:
            rows = _instant(s, q, f"sum by (position) (increase({q.sel(PER_POSITION)}[{rng}]))"
                                  f" / scalar(sum(increase({q.sel(DRAFTS)}[{rng}])))", at)
            by_pos = {}
            for labels, samples in rows:
                try:
                    by_pos[int(labels.get("position", ""))] = samples[0][1]
                except (ValueError, IndexError):
                    continue
            if by_pos and sorted(by_pos) == list(range(len(by_pos))):
                profile = tuple(min(1.0, max(0.0, by_pos[i])) for i in range(len(by_pos)))
        peak = _scalar(_instant(s, q, f"max(max_over_time({q.sel(RUNNING)}[{rng}]))", at))
    return TrafficReading(rates, means["prompt"], means["generation"], p95["prompt"],
                          p95["generation"], profile, peak, at)
