"""Windowed SD signals from a model's history: pure functions, no I/O, no clock.

Every value is a ratio of *deltas* of reset-corrected cumulative counters between a window's
base entry and the newest entry. Rules kept here:

* a zero denominator (no drafts, no finished requests, no time) makes the signal ABSENT
  (the key is missing), never 0 and never NaN;
* ratios are clamped into [0, 1] (acceptance rate, position rates, heterogeneity), lengths
  into their physical range, so counter noise (vLLM updates families one after the other
  while a page is rendered) can never produce an impossible value.

Time windows use the newest entry at or before ``now - W`` as base (the oldest entry while
the history is shorter than W, so a fresh exporter shows partial windows, like PromQL's
``rate()`` over a young series). The count window ``"<N>req"`` uses the newest entry at least
N finished requests back; it is absent until the history holds N finished requests.

Nothing is derived before a reader asks (:mod:`specwatch.poll.lazywindow`, issue 15):
the pipeline publishes :func:`derive_models`, which freezes each model's history and runs
:func:`derive_model` on the first read of the snapshot's models; that finds each window's
base and differences the rows, and the formulas (``_signals``) run when the exposition, a
hook or the controller first reads the window. Most snapshots of a target polled more often
than it is scraped are never read. They read as if computed at once: each keeps what it
computes from.

Size: one module on purpose. The formulas (:func:`window_signals`) and the per-poll plan
that evaluates them on a row of deltas (``_Plan``, ``_signals``: the same formulas with the
branches decided once per key set, issue 15) must change together, and the equivalence
tests (tests/poll/test_derive_plan.py) pin one against the other; split, a formula changed in one
file and not the other would only be caught by those tests.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING

import numpy as np

from specwatch.poll import lazywindow, sources
from specwatch.poll.snapshot import ModelSnapshot, SampleHistogram, WindowSignals

if TYPE_CHECKING:  # pragma: no cover
    from specwatch.poll.history import HistoryEntry, ModelHistory

#: An unknown counter value as the history's rows read it (history.UNKNOWN: a counter
#: one of whose source series was invalid at that poll).
_UNKNOWN = -math.inf

#: Upper bounds of the ``sd_acceptance_rate_samples`` histogram (0.05 wide; +Inf implied).
SAMPLE_BUCKETS: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(1, 21))

Counters = Mapping[tuple[str, str | None], float]

# Metric names of the derived signals (shared names: architecture.md).
ACCEPTANCE_RATE = "sd_acceptance_rate"
ACCEPTANCE_LENGTH = "sd_acceptance_length"
DRAFT_LENGTH = "sd_draft_length"
TOKEN_ACCEPTANCE_PROBABILITY = "sd_token_acceptance_probability"
POSITION_ACCEPTANCE_RATE = "sd_position_acceptance_rate"
POSITION_CONDITIONAL_ACCEPTANCE_RATE = "sd_position_conditional_acceptance_rate"
ACCEPTANCE_HETEROGENEITY = "sd_acceptance_heterogeneity"
ARRIVAL_RATE = "sd_arrival_rate"
EFFECTIVE_BATCH_SIZE = "sd_effective_batch_size"
MEAN_PROMPT_TOKENS = "sd_mean_prompt_tokens"
MEAN_GENERATION_TOKENS = "sd_mean_generation_tokens"
MEAN_LATENCY_SECONDS = "sd_mean_latency_seconds"
BIMODALITY_COEFFICIENT = lazywindow.BIMODALITY_COEFFICIENT  # (computed on its own first read)

#: Sarle's threshold: a coefficient above 5/9 (uniform distribution) suggests two modes.
BIMODALITY_THRESHOLD = 5.0 / 9.0

#: Window histograms kept in WindowSignals.histograms: name -> canonical bucket signal.
LATENCY_HISTOGRAMS: dict[str, str] = {
    "e2e_latency_seconds": sources.E2E_LATENCY_BUCKET,
    "ttft_seconds": sources.TTFT_BUCKET,
    "inter_token_latency_seconds": sources.ITL_BUCKET,
}


@dataclass(frozen=True)
class DeriveConfig:
    """What to compute: time windows (label, seconds), count window, sample thresholds."""

    windows: tuple[tuple[str, float], ...] = (("1m", 60.0), ("5m", 300.0), ("15m", 900.0))
    count_window: int = 1000
    min_drafts_per_sample: float = 50.0
    min_bimodality_samples: int = 10
    #: Build the windows' latency histograms (WindowSignals.histograms)? Only the controller
    #: reads them; without one they are never built (issue 15).
    histograms: bool = True

    @property
    def count_window_label(self) -> str:
        return f"{self.count_window}req"


def clamp01(x: float) -> float:
    """Clamp into [0, 1] (NaN never reaches here: callers check denominators first)."""
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


def delta(base: Counters, cur: Counters, key: tuple[str, str | None]) -> float:
    """Increase of one aggregated counter; a key missing from ``base`` started at 0 later."""
    return max(0.0, cur.get(key, 0.0) - base.get(key, 0.0))


def _has(cur: Counters, signal: str) -> bool:
    return (signal, None) in cur


def sglang_proposed_per_verify(gauges: Mapping[str, float], configured_k: int | None
                               ) -> float | None:
    """Draft tokens SGLang proposes per verify call (its own acceptance-rate denominator).

    SGLang's ``spec_accept_rate`` divides by ``speculative_num_draft_tokens - 1`` (or by
    ``speculative_num_steps`` when the former is unset); the gauges carry both.
    """
    n = gauges.get(sources.SGLANG_SPEC_DRAFT_TOKENS)
    if n is not None and n >= 2:
        return n - 1
    steps = gauges.get(sources.SGLANG_SPEC_STEPS)
    if steps is not None and steps >= 1:
        return steps
    return float(configured_k) if configured_k else None


def sglang_acceptance_length(d_generation: float, d_requests: float, d_verify: float
                             ) -> float | None:
    """Tokens committed per SGLang verify call: (generation − first tokens) / verify calls.

    Each finished request's first token comes from prefill, not from a verify call, so one
    token per finished request is removed before dividing. Both counters move when a request
    finishes, so the ratio is consistent; it ignores tokens of requests still running.
    None without verify calls or when an increase is unknown (NaN).
    """
    if not d_verify > 0:
        return None
    e = (d_generation - d_requests) / d_verify
    return max(1.0, e) if e == e else None


def interval_acceptance_rate(base: Counters, cur: Counters, min_drafts: float,
                             proposed_per_verify: float | None = None) -> float | None:
    """Acceptance rate over one poll interval, or None with fewer than ``min_drafts`` drafts.

    vLLM: accepted / proposed draft tokens (v0 pages have no drafts counter: proposed draft
    tokens stand in for the threshold). SGLang: (E − 1) / proposed-per-verify.
    """
    if _has(cur, sources.DRAFT_TOKENS) and _has(cur, sources.ACCEPTED_TOKENS):
        d_tok = delta(base, cur, (sources.DRAFT_TOKENS, None))
        volume = delta(base, cur, (sources.DRAFTS, None)) if _has(cur, sources.DRAFTS) \
            else d_tok
        if volume < min_drafts or d_tok <= 0:
            return None
        return clamp01(delta(base, cur, (sources.ACCEPTED_TOKENS, None)) / d_tok)
    if _has(cur, sources.VERIFY_CALLS) and proposed_per_verify:
        d_verify = delta(base, cur, (sources.VERIFY_CALLS, None))
        if d_verify < min_drafts:
            return None
        e = sglang_acceptance_length(delta(base, cur, (sources.GENERATION_TOKENS, None)),
                                     delta(base, cur, (sources.REQUESTS_FINISHED, None)),
                                     d_verify)
        return None if e is None else clamp01((e - 1.0) / proposed_per_verify)
    return None


def interval_sample_reads(cur: Container[tuple[str, str | None]]
                          ) -> tuple[tuple[str, str | None], ...]:
    """The counters :func:`interval_acceptance_rate` reads when the newer end has the keys
    ``cur`` (a sample with one of them unknown is not taken)."""
    if (sources.DRAFT_TOKENS, None) in cur and (sources.ACCEPTED_TOKENS, None) in cur:
        sigs = (sources.DRAFT_TOKENS, sources.ACCEPTED_TOKENS, sources.DRAFTS)
    else:
        sigs = (sources.VERIFY_CALLS, sources.GENERATION_TOKENS, sources.REQUESTS_FINISHED)
    return tuple((s, None) for s in sigs)


def expected_acceptance_length(alpha: float, k: float) -> float:
    """E(α, k) = (1 − α^(k+1)) / (1 − α) under the i.i.d. model (k + 1 at α = 1)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1.0)) / (1.0 - alpha)


def solve_token_acceptance_probability(e: float, k: float) -> float | None:
    """The α with E(α, k) = e, by bisection (E is increasing in α on [0, 1]).

    Returns 0 for e <= 1 and 1 for e >= k + 1; None when k is not positive.
    """
    if not (k > 0) or not math.isfinite(e):
        return None
    if e <= 1.0:
        return 0.0
    if e >= k + 1.0:
        return 1.0
    lo = 0.0
    kp1 = k + 1.0
    # Bisection of [0, 1] down to a width of 2^-50 (the first width <= 1e-15): the bounds
    # are multiples of the width, so every midpoint is exact and never reaches 1, and the
    # loop always takes these 50 steps. Written as lo + step (the same exact midpoints as
    # 0.5 * (lo + hi), without hi and the convergence test) and with
    # expected_acceptance_length(mid, k) inlined (its operations, without its α >= 1 branch,
    # which no midpoint takes): 4 windows a poll, where the bookkeeping cost as much as E.
    for step in _BISECTION_STEPS:
        mid = lo + step
        if (1.0 - mid ** kp1) / (1.0 - mid) < e:
            lo = mid
    return lo + _BISECTION_HALF_WIDTH


#: The bisection's half-widths 2^-1 .. 2^-50, and the midpoint offset of its last bracket.
_BISECTION_STEPS: tuple[float, ...] = tuple(2.0 ** -i for i in range(1, 51))
_BISECTION_HALF_WIDTH = 2.0 ** -51


@functools.lru_cache(maxsize=4096)
def _bound(le: str) -> float:
    try:
        return float(le)
    except ValueError:
        return math.inf


def window_buckets(base: Counters, cur: Counters, signal: str
                   ) -> tuple[tuple[float, float], ...]:
    """Increases of one histogram's cumulative buckets over a window, sorted by bound.

    Empty when the page has no such histogram. Counts are made non-decreasing in the bound
    (a running maximum): buckets are separate series, so a page rendered while requests
    finish can be off by one between neighbours.
    """
    les = [le for (s, le) in cur if s == signal and le is not None]
    keys = [(bound, (signal, le)) for bound, le in sorted((_bound(le), le) for le in les)]
    out: list[tuple[float, float]] = []
    running = 0.0
    for bound, key in keys:
        running = max(running, delta(base, cur, key))
        out.append((bound, running))
    return tuple(out)


@dataclass(frozen=True)
class Present:
    """What the newest entry of a window holds: the keys present and what is sorted from
    them (the same for every window of a model at one poll, so computed once)."""

    keys: Mapping[tuple[str, str | None], None]
    signals: frozenset[str]
    positions: tuple[str, ...]  # accepted-per-position positions, in position order
    buckets: Mapping[str, tuple[tuple[float, tuple[str, str]], ...]]  # by bound

    @classmethod
    def of(cls, keys: Iterable[tuple[str, str | None]]) -> Present:
        present = dict.fromkeys(keys)
        signals = frozenset(s for s, _ in present)
        positions = tuple(sorted((p for (s, p) in present
                                  if s == sources.ACCEPTED_PER_POSITION and p is not None),
                                 key=_position_order))
        buckets: dict[str, tuple[tuple[float, tuple[str, str]], ...]] = {}
        for sig in LATENCY_HISTOGRAMS.values():
            les = [le for (s, le) in present if s == sig and le is not None]
            if les:
                buckets[sig] = tuple((bound, (sig, le))
                                     for bound, le in sorted((_bound(le), le) for le in les))
        return cls(present, signals, positions, buckets)


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The q-quantile of cumulative buckets, interpolated as PromQL's histogram_quantile.

    Linear interpolation inside the bucket holding the rank q·count (the lowest bucket from
    0); a rank in the +Inf bucket gives the largest finite bound. None without observations
    or without a +Inf bucket (the count is unknown).
    """
    if not buckets or not math.isinf(buckets[-1][0]) or not 0.0 <= q <= 1.0:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank and count > prev_count:
            if math.isinf(bound):
                return prev_bound if len(buckets) > 1 else None
            if bound <= 0:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return None


def derive_window(label: str, base: HistoryEntry, cur: HistoryEntry,
                  configured_k: int | None, gauges: Mapping[str, float],
                  samples: Sequence[float] = (), min_bimodality_samples: int = 10
                  ) -> WindowSignals | None:
    """All signals of one window between two history entries (None: no time elapsed)."""
    dt = cur.t - base.t
    if not dt > 0:
        return None
    b, c = base.counters, cur.counters
    deltas = {k: delta(b, c, k) for k in {*b, *c}}
    return window_signals(label, dt, deltas, Present.of(c), configured_k, gauges, samples,
                          min_bimodality_samples)


def window_signals(label: str, dt: float, deltas: Mapping[tuple[str, str | None], float],
                   present: Present, configured_k: int | None, gauges: Mapping[str, float],
                   samples: Sequence[float] = (), min_bimodality_samples: int = 10,
                   histograms: bool = True) -> WindowSignals:
    """All signals of one window of ``dt`` > 0 seconds from the counters' increases.

    ``deltas``: increase of each counter over the window (0 for a key missing from it);
    ``present``: the keys of the window's newest entry.
    """
    plan = _Plan.of(present, histograms)
    get = deltas.get
    row = [get(key, 0.0) for key in plan.keys]
    row.append(0.0)
    # Copies: the caller's gauges and samples may change before the window is read.
    source = _OneRow(dt, row, plan, configured_k, dict(gauges), np.array(samples, dtype=float),
                     min_bimodality_samples)
    return _lazy_window(label, source, 0, plan, dt, requests=row[plan.req],
                        drafts=0.0 if plan.volume is None else row[plan.volume])


def _lazy_window(label: str, source: lazywindow.Source, key: object, plan: _Plan, dt: float,
                 requests: float, drafts: float) -> WindowSignals:
    """A window whose span, requests and drafts are known now and whose other signals come
    from window ``key`` of ``source`` on first read."""
    values, positions, histograms = lazywindow.window_mappings(
        source, key, positions=bool(plan.positions), histograms=bool(plan.buckets))
    return WindowSignals(window=label, values=values, positions=positions, span_seconds=dt,
                         requests=requests, drafts=drafts, histograms=histograms)


#: The counters without position or bound that a window reads, in the order of a _Plan's
#: first indices.
_READ: tuple[str, ...] = (
    sources.DRAFT_TOKENS, sources.ACCEPTED_TOKENS, sources.DRAFTS, sources.VERIFY_CALLS,
    sources.GENERATION_TOKENS, sources.REQUESTS_FINISHED, sources.E2E_LATENCY_COUNT,
    sources.E2E_LATENCY_SUM, sources.PROMPT_LEN_COUNT, sources.PROMPT_LEN_SUM,
    sources.PROMPT_TOKENS, sources.GENERATION_LEN_COUNT, sources.GENERATION_LEN_SUM)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a window reads, decided once per set of present keys (issue 15).

    Which branches :func:`_signals` takes depends only on the keys present in the window's
    newest entry, the same for every window of a model and for as long as no key appears or
    vanishes; so they are decided here, and a window's increases are a list (a *row*) read
    at the indices kept here instead of a dictionary of every counter. ``keys`` are the
    counters of the row, in order; index -1 reads the 0.0 appended to every row (a counter
    the history has no column for never increased).
    """

    keys: tuple[tuple[str, str | None], ...]
    sd: bool  # drafts counted: vLLM (draft tokens) or SGLang (verify calls)
    vllm: bool  # draft and accepted tokens present: vLLM's acceptance signals
    sglang: bool  # otherwise verify calls present: SGLang's
    has_drafts: bool
    has_requests: bool
    tok: int
    acc: int
    drafts: int
    verify: int
    gen: int
    req: int
    lat_count: int
    lat_sum: int
    volume: int | None  # the window's draft volume (WindowSignals.drafts); None: 0.0
    positions: tuple[tuple[str, int], ...]  # accepted per position, in position order
    #: (mean name, index of the count or None, index of the sum; or, for SGLang pages
    #: without the per-request histograms, None and the token counter's index).
    means: tuple[tuple[str, int | None, int], ...]
    buckets: tuple[tuple[str, tuple[tuple[float, int], ...]], ...]  # by histogram name

    @classmethod
    def of(cls, present: Present, histograms: bool,
           available: Container[tuple[str, str | None]] | None = None) -> _Plan:
        """The plan for ``present``; ``available``: the keys that can have increased (all
        when None), the others read 0.0 without a place in the row."""
        keys: dict[tuple[str, str | None], int] = {}

        def at(key: tuple[str, str | None]) -> int:
            if available is not None and key not in available:
                return -1
            return keys.setdefault(key, len(keys))

        c = present.keys
        i = {sig: at((sig, None)) for sig in _READ}
        vllm = _has(c, sources.DRAFT_TOKENS) and _has(c, sources.ACCEPTED_TOKENS)
        volume = next((i[sig] for sig in (sources.DRAFTS, sources.VERIFY_CALLS,
                                           sources.DRAFT_TOKENS) if _has(c, sig)), None)
        means: list[tuple[str, int | None, int]] = []
        for mean_name, s_sum, s_count, fallback in (
            (MEAN_PROMPT_TOKENS, sources.PROMPT_LEN_SUM, sources.PROMPT_LEN_COUNT,
             sources.PROMPT_TOKENS),
            (MEAN_GENERATION_TOKENS, sources.GENERATION_LEN_SUM, sources.GENERATION_LEN_COUNT,
             sources.GENERATION_TOKENS),
        ):
            if _has(c, s_count):
                means.append((mean_name, i[s_count], i[s_sum]))
            elif sources.VERIFY_CALLS in present.signals and _has(c, fallback):
                means.append((mean_name, None, i[fallback]))
        positions = tuple((p, at((sources.ACCEPTED_PER_POSITION, p)))
                          for p in present.positions)
        buckets = tuple((name, tuple((bound, at(key)) for bound, key in
                                     present.buckets[sig]))
                        for name, sig in LATENCY_HISTOGRAMS.items()
                        if histograms and sig in present.buckets)
        return cls(
            keys=tuple(keys), sd=_has(c, sources.DRAFT_TOKENS) or _has(c, sources.VERIFY_CALLS),
            vllm=vllm, sglang=not vllm and _has(c, sources.VERIFY_CALLS),
            has_drafts=_has(c, sources.DRAFTS),
            has_requests=_has(c, sources.REQUESTS_FINISHED),
            tok=i[sources.DRAFT_TOKENS], acc=i[sources.ACCEPTED_TOKENS],
            drafts=i[sources.DRAFTS], verify=i[sources.VERIFY_CALLS],
            gen=i[sources.GENERATION_TOKENS], req=i[sources.REQUESTS_FINISHED],
            lat_count=i[sources.E2E_LATENCY_COUNT], lat_sum=i[sources.E2E_LATENCY_SUM],
            volume=volume, positions=positions, means=tuple(means), buckets=buckets)


@dataclass(slots=True, eq=False)
class _Rows:
    """What the windows of one model at one poll are computed from, when first read
    (:mod:`specwatch.poll.lazywindow`): a row of counter increases per base (``diff``,
    without the 0.0 that index -1 reads), the plan, a copy of the model's gauges and the
    per-poll samples after the oldest base. A window's key is its row, span and first
    sample. Nothing writes to any of it."""

    diff: np.ndarray
    plan: _Plan
    configured_k: int | None
    gauges: Mapping[str, float]
    samples: np.ndarray
    min_bimodality_samples: int

    def window(self, label: str, j: int, dt: float, first_sample: int) -> WindowSignals:
        """The window on row ``j``: the span, requests and drafts now, the other signals
        when first read."""
        plan, diff = self.plan, self.diff
        requests = diff.item(j, plan.req) if plan.req >= 0 else 0.0
        drafts = 0.0 if plan.volume is None or plan.volume < 0 else diff.item(j, plan.volume)
        # Unknown counts read as none counted: what reads them (the controller's traffic
        # floor, A/B segments) then holds or skips the window.
        return _lazy_window(
            label, self, (j, dt, first_sample), plan, dt,
            requests=requests if requests == requests else 0.0,
            drafts=drafts if drafts == drafts else 0.0)

    def signals(self, key: tuple[int, float, int]) -> lazywindow.Signals:
        j, dt, first = key
        r = self.diff[j].tolist()
        r.append(0.0)  # what index -1 reads: a counter without a column never increased
        return _signals(dt, r, self.plan, self.configured_k, self.gauges, self.samples[first:],
                        self.min_bimodality_samples)


class _OneRow:
    """:func:`window_signals`' source: one window from a row given as a list."""

    __slots__ = ("args",)

    def __init__(self, *args: object) -> None:
        self.args = args

    def signals(self, key: object) -> lazywindow.Signals:
        return _signals(*self.args)


def _signals(dt: float, r: list[float], plan: _Plan, configured_k: int | None,
             gauges: Mapping[str, float], samples: np.ndarray, min_bimodality_samples: int
             ) -> lazywindow.Signals:
    """The formulas of :func:`window_signals` on a row of increases read as ``plan`` says
    (clamp01 inlined: the same comparisons)."""
    v: dict[str, float] = {}
    positions: dict[str, dict[str, float]] = {}

    e: float | None = None
    gamma: float | None = None
    if plan.vllm:
        d_tok, d_acc = r[plan.tok], r[plan.acc]
        if d_tok > 0:
            x = d_acc / d_tok
            v[ACCEPTANCE_RATE] = 0.0 if x < 0.0 else 1.0 if x > 1.0 else x
        if plan.has_drafts:
            d_drafts = r[plan.drafts]
            if d_drafts > 0:
                gamma = d_tok / d_drafts
                # min(), NaN when either is unknown (NaN)
                e = 1.0 + (d_tok if d_tok < d_acc else d_acc if d_tok == d_tok else d_tok
                           ) / d_drafts
                v[DRAFT_LENGTH] = gamma
                v[ACCEPTANCE_LENGTH] = e
                if plan.positions:
                    rates: dict[str, float] = {}
                    cond: dict[str, float] = {}
                    prev = 1.0
                    for p, i in plan.positions:
                        x = r[i] / d_drafts
                        rates[p] = x = 0.0 if x < 0.0 else 1.0 if x > 1.0 else x
                        if prev > 0:
                            y = x / prev
                            cond[p] = 0.0 if y < 0.0 else 1.0 if y > 1.0 else y
                        prev = x
                    positions[POSITION_ACCEPTANCE_RATE] = rates
                    positions[POSITION_CONDITIONAL_ACCEPTANCE_RATE] = cond
                    if len(plan.positions) >= 2:
                        p0, p1 = rates[plan.positions[0][0]], rates[plan.positions[1][0]]
                        if 0.0 < p0 < 1.0:
                            v[ACCEPTANCE_HETEROGENEITY] = clamp01(
                                (p1 - p0 * p0) / (p0 * (1.0 - p0)))
    elif plan.sglang:
        e = sglang_acceptance_length(r[plan.gen], r[plan.req], r[plan.verify])
        if e is not None:
            if configured_k:
                e = min(e, configured_k + 1.0)
            v[ACCEPTANCE_LENGTH] = e
            proposed = sglang_proposed_per_verify(gauges, configured_k)
            if proposed:
                v[ACCEPTANCE_RATE] = clamp01((e - 1.0) / proposed)
    if e is not None:
        k = gamma if gamma else (float(configured_k) if configured_k else None)
        if k:
            alpha = solve_token_acceptance_probability(e, k)
            if alpha is not None:
                v[TOKEN_ACCEPTANCE_PROBABILITY] = alpha

    requests = r[plan.req]
    window_histograms: dict[str, tuple[tuple[float, float], ...]] = {}
    for name, buckets in plan.buckets:
        out: list[tuple[float, float]] = []
        running = 0.0
        for bound, i in buckets:
            x = r[i]
            if x != x:  # an unknown bucket: the histogram is left out
                break
            running = max(running, x)
            out.append((bound, running))
        else:
            window_histograms[name] = tuple(out)
    if plan.has_requests:
        # A rate over elapsed time: 0 is a true value (an idle server), not a missing one.
        v[ARRIVAL_RATE] = requests / dt
    n_lat = r[plan.lat_count]
    if n_lat > 0:
        v[MEAN_LATENCY_SECONDS] = r[plan.lat_sum] / n_lat
        if plan.has_requests and requests > 0:
            v[EFFECTIVE_BATCH_SIZE] = v[ARRIVAL_RATE] * v[MEAN_LATENCY_SECONDS]
    for mean_name, i_count, i_sum in plan.means:
        if i_count is not None:
            n = r[i_count]
            if n > 0:
                v[mean_name] = r[i_sum] / n
        elif requests > 0:
            # SGLang pages without the per-request histograms: token counter / requests.
            v[mean_name] = r[i_sum] / requests

    # Last line of defence (found by fuzzing): a denominator that is positive but tiny (a
    # subnormal count delta) overflows a mean to inf. A value that is not finite is absent.
    # (A conditional rate is finite when every rate is: a rate in [0, 1] over one in (0, 1]
    # is clamped, and only a NaN rate stays NaN.)
    if positions and not math.isfinite(sum(positions[POSITION_ACCEPTANCE_RATE].values())):
        positions = {name: _finite(per) for name, per in positions.items()}
    # Bimodality that a change over time cannot explain (issue 18): bimodality.py, computed
    # when first read (lazywindow.WindowValues).
    return lazywindow.Signals(
        _finite(v), positions, window_histograms,
        samples if len(samples) >= max(4, min_bimodality_samples) else None)


def _finite(values: dict[str, float]) -> dict[str, float]:
    """``values`` without the entries that are not finite (the same dict when all are).

    A sum of floats is finite only when every term is (inf and NaN stay in a float sum; an
    overflowing sum of finite terms only sends it to the filter), so the usual case costs
    one sum instead of a new dict.
    """
    if math.isfinite(sum(values.values())):
        return values
    return {name: x for name, x in values.items() if math.isfinite(x)}


def _position_order(p: str) -> tuple[int, str]:
    try:
        return (int(p), p)
    except ValueError:
        return (1 << 30, p)


def _time_base_index(times: Sequence[float], seconds: float) -> int | None:
    return _time_base_indices(times, [seconds])[0]


def _time_base_indices(times: Sequence[float], seconds: Sequence[float]
                       ) -> list[int | None]:
    """:func:`time_window_base`'s index for each window length: one search for all."""
    if len(times) < 2:
        return [None] * len(seconds)
    # Entry times strictly increase (history folds a poll that does not advance the clock).
    # The targets in floats (the same operations as on a float64 array) and the array's
    # method: a few windows, where numpy's per-call costs exceed the arithmetic.
    times = np.asarray(times)
    t = times.item(-1)
    idx = times.searchsorted([t - float(s) + 1e-9 for s in seconds], side="right")
    return [max(0, i - 1) for i in idx.tolist()]


def time_window_base(entries: Sequence[HistoryEntry], seconds: float) -> HistoryEntry | None:
    """Newest entry at or before ``newest.t - seconds``; the oldest one if none is."""
    i = _time_base_index(np.array([e.t for e in entries]), seconds)
    return None if i is None else entries[i]


def _count_base_index(column: Sequence[float], n_requests: int) -> int | None:
    """Newest index with at least ``n_requests`` finished requests after it (``column``: the
    cumulative finished requests per entry, NaN or 0 where absent, the newest present).

    An absent value counts as 0 (and ±inf as the largest finite float, like
    ``np.nan_to_num``): only the entries the binary search reads are converted, not the
    whole column on every poll.
    """
    if len(column) < 2:
        return None

    get = column.item if isinstance(column, np.ndarray) else column.__getitem__

    def value(i: int) -> float:
        v = float(get(i))
        if v != v:
            return 0.0
        return v if abs(v) != math.inf else math.copysign(sys.float_info.max, v)

    newest = value(-1)
    # Reset-corrected cumulative counters never decrease, so "at least n requests after it"
    # holds for a prefix of the entries: binary search for its last one.
    lo, hi = 0, len(column) - 1  # the answer is in [lo, hi) or absent
    if not newest - value(0) >= n_requests:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if newest - value(mid) >= n_requests:
            lo = mid
        else:
            hi = mid
    return lo


def _count_base_index_known(column: np.ndarray, n_requests: int) -> int | None:
    """:func:`_count_base_index` on a column that may hold unknown values (see
    :data:`specwatch.poll.history.UNKNOWN`): the base found with each unknown value
    taken as low as it can be (the known value before it) and as high (the known value
    after it); None when the two differ (which entry is the base is not known) or when the
    newest value is unknown."""
    unknown = column == _UNKNOWN
    if not unknown.any():
        return _count_base_index(column, n_requests)
    if unknown[-1]:
        return None
    idx = np.arange(len(column))
    known = ~unknown
    before = np.maximum.accumulate(np.where(known, idx, 0))
    after = np.minimum.accumulate(np.where(known, idx, len(column) - 1)[::-1])[::-1]
    low = column.copy()
    low[unknown] = np.where(known[before], column[before], 0.0)[unknown]
    low[np.isnan(low)] = 0.0
    high = column[after]
    i = _count_base_index(low, n_requests)
    return i if i == _count_base_index(high, n_requests) else None


def count_window_base(entries: Sequence[HistoryEntry], n_requests: int) -> HistoryEntry | None:
    """Newest entry with at least ``n_requests`` finished requests after it, or None."""
    key = (sources.REQUESTS_FINISHED, None)
    if len(entries) < 2 or key not in entries[-1].counters:
        return None
    i = _count_base_index([e.counters.get(key, 0.0) for e in entries], n_requests)
    return None if i is None else entries[i]


@functools.lru_cache(maxsize=64)
def _window_lengths(windows: tuple[tuple[str, float], ...]
                    ) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """The labels and lengths of a config's time windows (split once per config)."""
    return (tuple(label for label, _secs in windows),
            tuple(float(secs) for _label, secs in windows))


def derive_models(hists: Iterable[ModelHistory], cfg: DeriveConfig, engine: str
                  ) -> Mapping[str, ModelSnapshot]:
    """:func:`derive_model` of each model, by model name in the order given, computed on
    the first read of the mapping (:class:`specwatch.poll.lazywindow.Deferred`).

    Why (issue 15): most snapshots of a target polled more often than it is scraped are
    never read, and finding the windows' bases and differencing their rows was most of what
    deriving still cost a poll. Each model is frozen now (:meth:`ModelHistory.frozen`: its
    ring shared, not copied), so the result is what deriving at once would have given,
    however many polls come before the first read (``tests/poll/test_derive_models.py``).
    """
    frozen = [h.frozen() for h in hists]
    return lazywindow.Deferred(functools.partial(_derive_all, frozen, cfg, engine))


def _derive_all(hists: list[ModelHistory], cfg: DeriveConfig, engine: str
                ) -> dict[str, ModelSnapshot]:
    return {h.model_name: derive_model(h, cfg, engine) for h in hists}


def derive_model(hist: ModelHistory, cfg: DeriveConfig, engine: str) -> ModelSnapshot:
    """Every window of one model, plus its sample histogram and configured k.

    Each window is the difference of two rows of the model's ring (the newest and the
    window's base), computed for every counter it reads at once. It runs for every model on
    every poll, so what the windows share is done once: one search for all time-window
    bases, the count window's base by a binary search that reads only the entries it probes,
    one read of the base rows and the newest, the per-poll samples filtered once (each
    window's are a suffix of them, passed as an array), and windows with the same base row
    computed once. The formulas of each window run when it is first read (:class:`_Rows`):
    a snapshot nobody reads costs only the rows' difference. What the windows read
    (:class:`_Plan`: the columns, the branches taken) depends only on the keys present in
    the newest row, so it is remembered on the ring with that absence pattern and made
    again only when a key appears or vanishes.
    """
    ring = hist.entries
    windows: list[WindowSignals] = []
    gauges = dict(hist.gauges)  # the snapshot's own: the windows read them later
    n = len(ring)
    sd = False
    if n:
        times = ring.times()
        labels, seconds = _window_lengths(cfg.windows)
        bases: list[tuple[str, int | None]] = list(zip(
            labels, _time_base_indices(times, seconds), strict=True))
        if cfg.count_window > 0:
            req = ring.column((sources.REQUESTS_FINISHED, None))
            i = None
            if req is not None and req[-1] == req[-1]:
                i = _count_base_index_known(req, cfg.count_window)
            bases.append((cfg.count_window_label, i))
        wanted = sorted({i for _label, i in bases if i is not None})
        m = ring.rows([*wanted, n - 1])  # the bases, then the newest entry
        absent = np.isnan(m[-1])
        keys = ring.keys
        signature = (len(keys), cfg.histograms, absent.tobytes())
        cached = ring.derive_cache
        if isinstance(cached, tuple) and cached[0] == signature:
            plan, columns = cached[1], cached[2]
        else:
            present = Present.of(k for k, a in zip(keys, absent.tolist(), strict=True)
                                 if not a)
            plan = _Plan.of(present, cfg.histograms, frozenset(keys))
            columns = np.array([ring.column_index(k) for k in plan.keys], dtype=np.intp)
            ring.derive_cache = (signature, plan, columns)
        sd = plan.sd
        if wanted:
            t_cur = times.item(-1)
            m = m.take(columns, axis=1)  # (array methods: cheaper than their wrappers)
            m[np.isnan(m)] = 0.0  # an absent counter counts from 0
            unknown = m == _UNKNOWN
            if unknown.any():
                m[unknown] = 0.0
            diff = m[-1] - m[:-1]
            diff[~(diff > 0.0)] = 0.0  # delta(): never negative, never -0.0, never NaN
            if unknown.any():
                # A counter unknown at either end of a window has an unknown increase
                # (NaN): the signals that read it are left out (_signals), never 0.
                diff[unknown[:-1] | unknown[-1]] = math.nan
            # The per-poll samples after the oldest base, without the polls that had none
            # (NaN): filtered once for all windows (each window's are a suffix of them), into
            # a new array that the windows keep and nothing writes to.
            first = wanted[0] + 1
            samples = ring.sample_column()[first:]
            have = samples == samples
            # The samples of entries first..i, inclusive, at i - first: where the window
            # based at entry i starts (at 0 for the oldest base).
            upto = have.cumsum()
            rows = _Rows(diff, plan, hist.configured_k, gauges, samples[have],
                         cfg.min_bimodality_samples)
            row_of = {i: j for j, i in enumerate(wanted)}
            # Windows with the same base (all of them while the history is younger than the
            # shortest; the count window's base can equal a time window's) are the same
            # signals under another label: computed once.
            done: dict[int, WindowSignals] = {}
            for label, i in bases:
                if i is None:
                    continue
                dt = t_cur - times.item(i)
                if not dt > 0:
                    continue
                same = done.get(i)
                if same is not None:
                    windows.append(dataclasses.replace(same, window=label))
                    continue
                done[i] = ws = rows.window(label, row_of[i], dt,
                                           upto.item(i - first) if i >= first else 0)
                windows.append(ws)
    samples_hist = None
    if hist.sample_count > 0 or sd:
        samples_hist = SampleHistogram(
            bounds=SAMPLE_BUCKETS, cumulative_counts=tuple(accumulate(hist.sample_bucket_counts)),
            sum=hist.sample_sum, count=hist.sample_count)
    return ModelSnapshot(model_name=hist.model_name, engine=engine,
                         configured_k=hist.configured_k, windows=tuple(windows),
                         samples=samples_hist, gauges=gauges,
                         sd_families_present=not hist.signals.isdisjoint(
                             sources.VLLM_SD_SIGNALS))
