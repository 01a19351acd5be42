"""Calibration points from Prometheus history: pull vLLM series, cut them into steady windows.

The operator's own traffic is the most honest benchmark, but it is not a sweep: load drifts,
SD is switched by restarts, the workload changes. So the history is pulled at a fixed step
(`rate(...[step])` per step, through the HTTP API's query_range), and consecutive steps with
the same SD configuration, the same workload and an arrival rate within 10% of the window's
mean form one steady window; each window long enough becomes one measurement point, with
λ, L, p, g, k and E computed from the summed counter increases over the window (ratios of
sums, so a quiet step weighs less than a busy one). The first step of each window is dropped:
requests finishing in it started under the previous load.

Series used (vLLM v1's, named by :mod:`specwatch.engines.vllm_v1`; vllm-metrics.md §1, §2.3),
summed by model_name:
- λ: vllm:e2e_request_latency_seconds_count; L: its _sum over its _count
- p, g: vllm:request_prompt_tokens_{sum,count}, vllm:request_generation_tokens_{sum,count}
- TTFT (queueing test): vllm:time_to_first_token_seconds_{sum,count}
- SD: vllm:spec_decode_num_drafts_total, …_num_draft_tokens_total, …_num_accepted_tokens_total
  (k = draft tokens per draft, E = 1 + accepted per draft) and …_accepted_tokens_per_pos_total
  (per-position acceptance). No drafts in a step means SD was off.
- Server capacity: vllm:cache_config_info (no model_name label: joined to the model through
  its `instance`), whose labels state each engine's KV cache (kv_cache_size_tokens, else
  num_gpu_blocks × block_size); summed over engines and instances, recorded with each
  window (`Point.kv_cache_tokens`), and a change of it ends a window (another server
  configuration).
"""

from __future__ import annotations

import datetime as _dt
import math
import re
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import requests

from specwatch.calibrate.inputs import Point, validate_point
from specwatch.calibrate.promapi import PrometheusError, Row, new_session, query
from specwatch.common.errors import ConfigError
from specwatch.engines import base, registry

#: Prometheus refuses range queries with more than 11,000 points per series; stay below.
MAX_POINTS_PER_QUERY = 10_000
#: Steps in one window must keep λ within this fraction of the window's mean λ.
RATE_TOLERANCE = 0.10
#: Steps in one window must keep mean prompt/generation lengths within this fraction.
LENGTH_TOLERANCE = 0.10
#: A window's draft length (tokens per draft) must stay within this of its first step.
DRAFT_LENGTH_TOLERANCE = 0.05

#: The engine whose history is read: calibration needs drafts, draft and accepted tokens
#: and accepted tokens per position, which vLLM's v1 engine counts.
ENGINE = registry.get("vllm")
#: The ``--point-sources`` name of the steady windows read here: the engine's family.
SOURCE = ENGINE.family
#: name -> metric whose per-second rate is pulled (the selector is inserted into each).
SERIES: dict[str, str] = {name: ENGINE.metric(signal) for name, signal in (
    ("requests", base.E2E_LATENCY_COUNT),
    ("latency_sum", base.E2E_LATENCY_SUM),
    ("prompt_sum", base.PROMPT_LEN_SUM),
    ("prompt_count", base.PROMPT_LEN_COUNT),
    ("gen_sum", base.GENERATION_LEN_SUM),
    ("gen_count", base.GENERATION_LEN_COUNT),
    ("ttft_sum", base.TTFT_SUM),
    ("ttft_count", base.TTFT_COUNT),
    ("drafts", base.DRAFTS),
    ("draft_tokens", base.DRAFT_TOKENS),
    ("accepted", base.ACCEPTED_TOKENS),
)}
PER_POSITION = ENGINE.metric(base.ACCEPTED_PER_POSITION)
CACHE_CONFIG = ENGINE.metric(base.CACHE_CONFIG)
_CACHE_INFO = ENGINE.infos[CACHE_CONFIG]
#: The labels of CACHE_CONFIG that state a KV-cache size ("engine" identifies one engine).
_CACHE_LABELS = tuple(label for label in _CACHE_INFO.labels if label != "engine")
_MATCHER_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=|!=|=~|!~)\s*("(?:[^"\\]|\\.)*")')

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
#: A selector's label matchers (the whole text: ``fullmatch``).
SELECTOR_RE = re.compile(
    r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*'
    r'(,\s*[A-Za-z_][A-Za-z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*)*,?\s*'
)


#: Longest duration a flag takes (10 years): longer ones overflow the times they offset.
MAX_DURATION_S = 10 * 365 * 86400.0
#: Latest Unix time a flag takes: the end of the year 9999, as RFC 3339 allows.
MAX_UNIX_SECONDS = 253402300799.0


def parse_duration(text: str, name: str) -> float:
    """Seconds from a Prometheus-style duration ("60s", "5m", "1h") or a plain number."""
    t = text.strip()
    try:
        value = float(t)
    except ValueError:
        m = _DURATION_RE.fullmatch(t)
        if not m:
            raise ConfigError(
                f"{name}: expected a duration like 60s, 5m or 1h, got {text!r}"
            ) from None
        value = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{name}: expected a positive duration, got {text!r}")
    if value > MAX_DURATION_S:
        raise ConfigError(f"{name}: expected a duration of at most 10 years, got {text!r}")
    return value


def parse_time(text: str, name: str, now: float | None = None) -> float:
    """Unix seconds from RFC 3339, Unix seconds, `now` or `now-DURATION`."""
    t = text.strip()
    now = time.time() if now is None else now
    if t == "now":
        return now
    if t.startswith("now-"):
        return now - parse_duration(t[4:], name)
    try:
        seconds = float(t)
    except ValueError:
        pass
    else:
        if not 0 <= seconds <= MAX_UNIX_SECONDS:  # NaN fails too
            raise ConfigError(f"{name}: expected Unix seconds between 0 and "
                              f"{MAX_UNIX_SECONDS:.0f} (the year 9999), got {text!r}")
        return seconds
    try:
        parsed = _dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"{name}: expected RFC 3339 (2026-01-23T10:00:00Z), Unix seconds or now-6h,"
            f" got {text!r}"
        ) from None
    if parsed.tzinfo is None:
        raise ConfigError(f"{name}: {text!r} has no time zone; add Z or an offset")
    return parsed.timestamp()


@dataclass(frozen=True)
class PrometheusQuery:
    """What to pull: where, when, at which resolution, for which series."""

    url: str
    start: float
    end: float
    step: float
    selector: str = ""
    min_window: float = 300.0
    timeout: float = 30.0

    @classmethod
    def from_args(
        cls,
        *,
        url: str,
        start: str,
        end: str,
        step: str,
        selector: str,
        min_window: str,
        timeout: float,
    ) -> PrometheusQuery:
        """Validate CLI strings into a query (every problem is a ConfigError naming the flag)."""
        if not re.match(r"^https?://[^\s/]+", url):
            raise ConfigError(f"--prometheus: expected http(s)://host:port, got {url!r}")
        now = time.time()
        t0 = parse_time(start, "--start", now)
        t1 = parse_time(end, "--end", now)
        if t1 <= t0:
            raise ConfigError(f"--end ({end}) must be after --start ({start})")
        sel = selector.strip()
        if sel.startswith("{") and sel.endswith("}"):
            sel = sel[1:-1].strip()
        if sel and not SELECTOR_RE.fullmatch(sel):
            raise ConfigError(
                f'--selector: expected label matchers like model_name="qwen",engine="0",'
                f" got {selector!r}"
            )
        step_s = parse_duration(step, "--step")
        window = parse_duration(min_window, "--min-window")
        if window < 2 * step_s:
            raise ConfigError(f"--min-window {min_window} must cover at least two --step {step}")
        return cls(url.rstrip("/"), t0, t1, step_s, sel, window, timeout)

    def expr(self, metric: str) -> str:
        """PromQL for one series: per-second rate per step, summed by model."""
        sel = f"{{{self.selector}}}" if self.selector else ""
        return f"sum by (model_name) (rate({metric}{sel}[{promql_duration(self.step)}]))"

    def per_position_expr(self) -> str:
        sel = f"{{{self.selector}}}" if self.selector else ""
        return (
            f"sum by (model_name, position) (rate({PER_POSITION}{sel}"
            f"[{promql_duration(self.step)}]))"
        )

    def cache_config_expr(self) -> str:
        """PromQL for the servers' stated KV cache per model: cache_config_info has no
        model_name, so it takes the model of the series `requests` reads on its instance
        (a vLLM instance serves one model); the selector's model_name matchers apply there."""
        sel = f"{{{self.selector}}}" if self.selector else ""
        other = ",".join(f"{n}{op}{v}" for n, op, v in _MATCHER_RE.findall(self.selector)
                         if n != "model_name")
        by = ", ".join(("model_name", "instance", "engine", *_CACHE_LABELS))
        return (f"max by ({by}) ({CACHE_CONFIG}{{{other}}} * on (instance) group_left"
                f" (model_name) group by (instance, model_name) ({SERIES['requests']}{sel}))")

    def chunks(self) -> list[tuple[float, float]]:
        """Sub-ranges short enough for Prometheus's points-per-series limit."""
        span = self.step * MAX_POINTS_PER_QUERY
        out = []
        t = self.start
        while t < self.end:
            out.append((t, min(self.end, t + span)))
            t += span + self.step
        return out


def promql_duration(seconds: float) -> str:
    """Seconds as a PromQL duration: whole seconds as ``30s``, else milliseconds."""
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{round(seconds * 1000)}ms"


def query_range(session: requests.Session, q: PrometheusQuery, expr: str, start: float,
                end: float) -> list[Row]:
    """The series of one ``/api/v1/query_range`` at ``q``'s step (PrometheusError on an
    unreachable server, a refused query or an answer that is not Prometheus')."""
    return query(session, q.url, "/api/v1/query_range",
                 {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                  "step": str(q.step)}, q.timeout, "matrix", expr)


def _engine_tokens(labels: dict[str, str]) -> float:
    """One engine's stated KV cache in tokens (NaN: not stated)."""
    tokens = _CACHE_INFO.state(labels)[0]
    return math.nan if tokens is None else tokens


def pull(
    q: PrometheusQuery, progress: bool = True
) -> tuple[dict[str, dict[str, dict[float, float]]], dict[str, dict[str, dict[float, float]]]]:
    """All series as model_name -> name -> {timestamp: rate}; and per-position rates as
    model_name -> position -> {timestamp: rate}. Shows a rich progress bar on stderr.
    The servers' stated KV cache is the series "kv_cache_tokens" ({timestamp: tokens}, NaN
    where an engine does not state it or one engine states two values)."""
    series: dict[str, dict[str, dict[float, float]]] = defaultdict(lambda: defaultdict(dict))
    positions: dict[str, dict[str, dict[float, float]]] = defaultdict(lambda: defaultdict(dict))
    # model -> timestamp -> (instance, engine) -> tokens
    engines: dict[str, dict[float, dict[tuple[str, str], float]]] = defaultdict(
        lambda: defaultdict(dict))
    jobs: list[tuple[str, str]] = [(name, q.expr(metric)) for name, metric in SERIES.items()]
    jobs.append(("per_position", q.per_position_expr()))
    jobs.append(("cache_config", q.cache_config_expr()))
    chunks = q.chunks()
    total = len(jobs) * len(chunks)
    with new_session(q.url) as session, _Progress(progress, total) as advance:
        for name, expr in jobs:
            for start, end in chunks:
                try:
                    results = query_range(session, q, expr, start, end)
                except PrometheusError as exc:
                    if name != "cache_config":
                        raise
                    # The stated capacity is optional: without it the capacity is fitted
                    # (e.g. one instance serving several model names cannot be joined).
                    print(f"specwatch calibrate: note: the servers' stated KV cache could not"
                          f" be read, so it is fitted: {exc}", file=sys.stderr)
                    engines.clear()
                    advance()
                    break
                for labels, samples in results:
                    model_name = labels.get("model_name", "")
                    for ts, v in samples:
                        if not math.isfinite(v):
                            continue
                        if name == "per_position":
                            positions[model_name][labels.get("position", "")][ts] = v
                        elif name == "cache_config":
                            at = engines[model_name][ts]
                            one = (labels.get("instance", ""), labels.get("engine", ""))
                            tokens = _engine_tokens(labels)
                            if one in at and at[one] != tokens:
                                tokens = math.nan  # two configurations at once: unknown
                            at[one] = tokens
                        else:
                            series[model_name][name][ts] = v
                advance()
    for model_name, by_time in engines.items():
        for ts, per_engine in by_time.items():
            series[model_name]["kv_cache_tokens"][ts] = float(sum(per_engine.values()))
    return series, positions


class _Progress:
    """A rich progress bar on stderr for the pull (a no-op when disabled, e.g. with --json)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled = enabled
        self.total = total
        self._bar = None
        self._task = None

    def __enter__(self) -> Callable[[], None]:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            console = Console(stderr=True)
            if not console.is_terminal:
                # Not a terminal (a log, a pipe): a bar would only leave a blank line.
                return self._advance
            self._bar = Progress(
                TextColumn("pulling Prometheus history"),
                BarColumn(),
                MofNCompleteColumn(),
                console=console,
                transient=True,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task("pull", total=self.total)
        return self._advance

    def _advance(self) -> None:
        if self._bar is not None:
            self._bar.advance(self._task)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


@dataclass
class _Step:
    t: float
    lam: float
    latency_sum: float
    prompt_sum: float
    prompt_count: float
    gen_sum: float
    gen_count: float
    ttft_sum: float
    ttft_count: float
    drafts: float
    draft_tokens: float
    accepted: float
    positions: dict[str, float]
    #: The servers' stated KV cache in tokens at this step (None: not stated).
    kv_cache_tokens: float | None = None

    @property
    def k(self) -> float:
        return self.draft_tokens / self.drafts if self.drafts > 0 else 0.0

    @property
    def p(self) -> float | None:
        return self.prompt_sum / self.prompt_count if self.prompt_count > 0 else None

    @property
    def g(self) -> float | None:
        return self.gen_sum / self.gen_count if self.gen_count > 0 else None


def _steps(
    model_series: dict[str, dict[float, float]], model_positions: dict[str, dict[float, float]]
) -> list[_Step]:
    times = sorted(model_series.get("requests", {}))
    out = []
    for t in times:

        def v(name: str, t: float = t) -> float:
            return model_series.get(name, {}).get(t, 0.0)

        if v("requests") <= 0 or v("latency_sum") <= 0:
            continue
        kv = model_series.get("kv_cache_tokens", {}).get(t)
        out.append(
            _Step(
                t=t,
                lam=v("requests"),
                latency_sum=v("latency_sum"),
                prompt_sum=v("prompt_sum"),
                prompt_count=v("prompt_count"),
                gen_sum=v("gen_sum"),
                gen_count=v("gen_count"),
                ttft_sum=v("ttft_sum"),
                ttft_count=v("ttft_count"),
                drafts=v("drafts"),
                draft_tokens=v("draft_tokens"),
                accepted=v("accepted"),
                positions={pos: s.get(t, 0.0) for pos, s in model_positions.items() if t in s},
                kv_cache_tokens=kv if kv is not None and math.isfinite(kv) else None,
            )
        )
    return out


def _same_config(window: list[_Step], step: _Step, step_s: float) -> bool:
    first = window[0]
    if step.t - window[-1].t > 1.5 * step_s:  # a gap: no data, or no traffic
        return False
    if (first.drafts > 0) != (step.drafts > 0):
        return False
    if first.kv_cache_tokens != step.kv_cache_tokens:  # another server configuration
        return False
    if first.drafts > 0 and abs(step.k - first.k) > DRAFT_LENGTH_TOLERANCE * max(first.k, 1.0):
        return False
    mean_lam = sum(s.lam for s in window) / len(window)
    if abs(step.lam - mean_lam) > RATE_TOLERANCE * mean_lam:
        return False
    for a, b in ((first.p, step.p), (first.g, step.g)):
        if a is not None and b is not None and abs(a - b) > LENGTH_TOLERANCE * max(a, b):
            return False
    return True


def windows(steps: list[_Step], step_s: float, min_window: float) -> list[list[_Step]]:
    """Maximal runs of steps with one SD configuration, workload and arrival rate; the first
    step of each run is dropped (it mixes the previous load), short runs are discarded."""
    runs: list[list[_Step]] = []
    for step in steps:
        if runs and _same_config(runs[-1], step, step_s):
            runs[-1].append(step)
        else:
            runs.append([step])
    return [run[1:] for run in runs if (len(run) - 1) * step_s >= min_window]


def _window_point(model_name: str, q: PrometheusQuery, run: list[_Step]) -> Point:
    def total(attr: str) -> float:
        return float(sum(getattr(s, attr) for s in run))

    lam = total("lam") / len(run)
    latency = total("latency_sum") / total("lam")
    drafts = total("drafts")
    k = total("draft_tokens") / drafts if drafts > 0 else 0.0
    if abs(k - round(k)) < DRAFT_LENGTH_TOLERANCE:
        k = float(round(k))
    e = 1.0 + total("accepted") / drafts if drafts > 0 else 1.0
    e = min(max(e, 1.0), k + 1.0)
    profile = None
    if drafts > 0:
        names = sorted({p for s in run for p in s.positions}, key=lambda x: (len(x), x))
        if names and len(names) == round(k):
            profile = tuple(
                min(1.0, sum(s.positions.get(n, 0.0) for s in run) / drafts) for n in names
            )
    start = _iso(run[0].t - q.step)
    end = _iso(run[-1].t)
    p_count, g_count, t_count = total("prompt_count"), total("gen_count"), total("ttft_count")
    return validate_point(
        Point(
            source=f"prometheus {model_name or '(no model_name)'} {start}..{end}",
            system=model_name or "default",
            arrival_rate=lam,
            latency_s=latency,
            draft_length=k,
            acceptance_length=e,
            prompt_tokens=total("prompt_sum") / p_count if p_count > 0 else None,
            generation_tokens=total("gen_sum") / g_count if g_count > 0 else None,
            ttft_s=total("ttft_sum") / t_count if t_count > 0 else None,
            per_position=profile,
            kv_cache_tokens=run[0].kv_cache_tokens,
        )
    )


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_prometheus(q: PrometheusQuery, progress: bool = True) -> list[Point]:
    """Pull the history and turn every steady window into a point (one system per model)."""
    series, positions = pull(q, progress)
    if not series:
        sel = f"{{{q.selector}}}" if q.selector else ""
        raise ConfigError(
            f"Prometheus at {q.url} has no {SERIES['requests']}{sel} samples between"
            f" {_iso(q.start)} and {_iso(q.end)}; check --selector and the time range"
        )
    points: list[Point] = []
    for model_name in sorted(series):
        runs = windows(
            _steps(series[model_name], positions.get(model_name, {})), q.step, q.min_window
        )
        points.extend(_window_point(model_name, q, run) for run in runs)
    if not points:
        raise ConfigError(
            f"Prometheus at {q.url}: no steady window of at least {q.min_window:g} s between"
            f" {_iso(q.start)} and {_iso(q.end)} (steady: same SD setting, workload, and arrival"
            f" rate within {RATE_TOLERANCE:.0%}); widen the range or lower --min-window"
        )
    return points


__all__ = [
    "PrometheusError",
    "PrometheusQuery",
    "parse_duration",
    "parse_time",
    "read_prometheus",
    "windows",
]
