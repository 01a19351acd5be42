"""REFERENCE (tests only): the former dict-and-columns derive of specwatch.

Kept verbatim (imports aside) so the numpy implementation in
``specwatch.poll.windows.derive`` can be checked against it to 1e-9 on every fixture and
property test (tests/poll/test_history_equivalence.py). Not used by the exporter.

Windowed SD signals from a model's history: pure functions, no I/O, no clock.

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
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specwatch.engines import registry
from specwatch.poll import sources
from specwatch.poll.snapshot import ModelSnapshot, SampleHistogram, WindowSignals
from specwatch.poll.windows import bimodality

if TYPE_CHECKING:  # pragma: no cover
    from helpers.ring import HistoryEntry
    from specwatch.poll.windows.ring import HistoryRing, ModelHistory

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
BIMODALITY_COEFFICIENT = "sd_acceptance_bimodality_coefficient"

#: Sarle's threshold: a coefficient above 5/9 (uniform distribution) suggests two modes.
BIMODALITY_THRESHOLD = 5.0 / 9.0

#: Window histograms kept in WindowSignals.histograms: name -> canonical bucket signal.
LATENCY_HISTOGRAMS: dict[str, str] = {
    "e2e_latency_seconds": sources.E2E_LATENCY_BUCKET,
    "ttft_seconds": sources.TTFT_BUCKET,
    "inter_token_latency_seconds": sources.ITL_BUCKET,  # the A/B pairs' latency
}


@dataclass(frozen=True)
class DeriveConfig:
    """What to compute: time windows (label, seconds), count window, sample thresholds."""

    windows: tuple[tuple[str, float], ...] = (("1m", 60.0), ("5m", 300.0), ("15m", 900.0))
    count_window: int = 1000
    min_drafts_per_sample: float = 50.0
    min_bimodality_samples: int = 10

    @property
    def count_window_label(self) -> str:
        return f"{self.count_window}req"


def clamp01(x: float) -> float:
    """Clamp into [0, 1] (NaN never reaches here: callers check denominators first)."""
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


#: An unknown counter value in a history entry (an invalid source series added to it then).
UNKNOWN = -math.inf


def delta(base: Counters, cur: Counters, key: tuple[str, str | None]) -> float:
    """Increase of one aggregated counter; a key missing from ``base`` started at 0 later;
    NaN when it is unknown at either end (UNKNOWN, or a total overflowed to +inf)."""
    c, b = cur.get(key, 0.0), base.get(key, 0.0)
    if math.isinf(c) or math.isinf(b):
        return math.nan
    return max(0.0, c - b)


def _has(cur: Counters, signal: str) -> bool:
    return (signal, None) in cur


def sglang_proposed_per_verify(gauges: Mapping[str, float], configured_k: int | None
                               ) -> float | None:
    """Draft tokens SGLang proposes per verify call (its own acceptance-rate denominator).

    SGLang's ``spec_accept_rate`` divides by ``speculative_num_draft_tokens - 1`` (or by
    ``speculative_num_steps`` when the former is unset); the gauges carry both.
    """
    n = gauges.get(sources.SPEC_DRAFT_TOKENS)
    if n is not None and n >= 2:
        return n - 1
    steps = gauges.get(sources.SPEC_STEPS)
    if steps is not None and steps >= 1:
        return steps
    return float(configured_k) if configured_k else None


def sglang_acceptance_length(d_generation: float, d_requests: float, d_verify: float
                             ) -> float | None:
    """Tokens committed per SGLang verify call: (generation − first tokens) / verify calls.

    Each finished request's first token comes from prefill, not from a verify call, so one
    token per finished request is removed before dividing. Both counters move when a request
    finishes, so the ratio is consistent; it ignores tokens of requests still running.
    """
    if not d_verify > 0:
        return None
    e = (d_generation - d_requests) / d_verify
    return None if math.isnan(e) else max(1.0, e)


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


def expected_acceptance_length(alpha: float, k: float) -> float:
    """E(α, k) = (1 − α^(k+1)) / (1 − α) under the i.i.d. model (k + 1 at α = 1)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1.0)) / (1.0 - alpha)


def solve_token_acceptance_probability(e: float, k: float) -> float | None:
    """The α with E(α, k) = e, by bisection (E is increasing in α on [0, 1]).

    Returns 0 for e <= 1 and 1 for e >= k + 1; None when k is not a positive number or e
    lies more than a rounding tolerance (1e-9) outside [1, k + 1], where no α gives it.
    """
    if not (0 < k < math.inf) or not (1.0 - 1e-9 <= e <= k + 1.0 + 1e-9):
        return None
    if e <= 1.0:
        return 0.0
    if e >= k + 1.0:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if expected_acceptance_length(mid, k) < e:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15:  # converged (about 50 steps; 80 is the safety bound)
            break
    return 0.5 * (lo + hi)


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
    # The bucket keys of ``cur``, sorted by bound, are the same for every window of a
    # poll: remembered for the last ``cur`` seen (held, compared by identity and size;
    # history entries are never changed once made).
    last = _BUCKET_KEYS.get(signal)
    if last is not None and last[0] is cur and last[1] == len(cur):
        keys = last[2]
    else:
        les = [le for (s, le) in cur if s == signal and le is not None]
        keys = [(bound, (signal, le)) for bound, le in sorted((_bound(le), le) for le in les)]
        _BUCKET_KEYS[signal] = (cur, len(cur), keys)
    out: list[tuple[float, float]] = []
    running = 0.0
    cur_get, base_get = cur.get, base.get
    for bound, key in keys:
        c, b = cur_get(key, 0.0), base_get(key, 0.0)
        if math.isinf(c) or math.isinf(b):
            return ()  # an unknown bucket (or an overflowed total): no histogram
        running = max(running, c - b)  # delta(), inline
        out.append((bound, running))
    return tuple(out)


_BUCKET_KEYS: dict[str, tuple[Counters, int, list[tuple[float, tuple[str, str]]]]] = {}


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


def bimodality_coefficient(samples: Sequence[float]) -> float | None:
    """Sarle's bimodality coefficient with the small-sample corrections.

    BC = (G1² + 1) / (G2 + 3(n − 1)² / ((n − 2)(n − 3))), G1 the adjusted skewness and G2 the
    adjusted excess kurtosis. Needs n >= 4 and a non-zero variance, else None.
    """
    n = len(samples)
    if n < 4:
        return None
    mean = sum(samples) / n
    m2 = m3 = m4 = 0.0
    for x in samples:  # one pass (derive runs on every poll of every target)
        d = x - mean
        d2 = d * d
        m2 += d2
        m3 += d2 * d
        m4 += d2 * d2
    m2, m3, m4 = m2 / n, m3 / n, m4 / n
    if m2 <= 1e-18:
        return None
    g1 = m3 / m2 ** 1.5
    g2 = m4 / m2 ** 2 - 3.0
    big_g1 = g1 * math.sqrt(n * (n - 1)) / (n - 2)
    big_g2 = ((n + 1) * g2 + 6.0) * (n - 1) / ((n - 2) * (n - 3))
    denom = big_g2 + 3.0 * (n - 1) ** 2 / ((n - 2) * (n - 3))
    if denom <= 0:
        return None
    bc = (big_g1 ** 2 + 1.0) / denom
    return bc if math.isfinite(bc) else None


def derive_window(label: str, base: HistoryEntry, cur: HistoryEntry,
                  configured_k: int | None, gauges: Mapping[str, float],
                  samples: Sequence[float] = (), min_bimodality_samples: int = 10
                  ) -> WindowSignals | None:
    """All signals of one window between two history entries (None: no time elapsed)."""
    dt = cur.t - base.t
    if not dt > 0:
        return None
    b, c = base.counters, cur.counters
    d = lambda sig, pos=None: delta(b, c, (sig, pos))  # noqa: E731
    v: dict[str, float] = {}
    positions: dict[str, dict[str, float]] = {}

    e: float | None = None
    gamma: float | None = None
    if _has(c, sources.DRAFT_TOKENS) and _has(c, sources.ACCEPTED_TOKENS):
        d_tok, d_acc = d(sources.DRAFT_TOKENS), d(sources.ACCEPTED_TOKENS)
        if d_tok > 0:
            v[ACCEPTANCE_RATE] = clamp01(d_acc / d_tok)
        if _has(c, sources.DRAFTS):
            d_drafts = d(sources.DRAFTS)
            if d_drafts > 0:
                gamma = d_tok / d_drafts
                e = 1.0 + (math.nan if math.isnan(d_acc) or math.isnan(d_tok)
                           else min(d_acc, d_tok)) / d_drafts
                v[DRAFT_LENGTH] = gamma
                v[ACCEPTANCE_LENGTH] = e
                pos_keys = sorted((p for (s, p) in c if s == sources.ACCEPTED_PER_POSITION
                                   and p is not None), key=_position_order)
                rates = {p: clamp01(d(sources.ACCEPTED_PER_POSITION, p) / d_drafts)
                         for p in pos_keys}
                if rates:
                    positions[POSITION_ACCEPTANCE_RATE] = rates
                    cond: dict[str, float] = {}
                    prev = 1.0
                    for p in pos_keys:
                        if prev > 0:
                            cond[p] = clamp01(rates[p] / prev)
                        prev = rates[p]
                    positions[POSITION_CONDITIONAL_ACCEPTANCE_RATE] = cond
                    if len(pos_keys) >= 2:
                        p0, p1 = rates[pos_keys[0]], rates[pos_keys[1]]
                        if 0.0 < p0 < 1.0:
                            v[ACCEPTANCE_HETEROGENEITY] = clamp01(
                                (p1 - p0 * p0) / (p0 * (1.0 - p0)))
    elif _has(c, sources.VERIFY_CALLS):
        e = sglang_acceptance_length(d(sources.GENERATION_TOKENS),
                                     d(sources.REQUESTS_FINISHED), d(sources.VERIFY_CALLS))
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

    requests = d(sources.REQUESTS_FINISHED)
    drafts = next((d(sig) for sig in (sources.DRAFTS, sources.VERIFY_CALLS,
                                       sources.DRAFT_TOKENS) if _has(c, sig)), 0.0)
    histograms = {name: hb for name, sig in LATENCY_HISTOGRAMS.items()
                  if (hb := window_buckets(b, c, sig))}
    if _has(c, sources.REQUESTS_FINISHED):
        # A rate over elapsed time: 0 is a true value (an idle server), not a missing one.
        v[ARRIVAL_RATE] = requests / dt
    n_lat = d(sources.E2E_LATENCY_COUNT)
    if n_lat > 0:
        v[MEAN_LATENCY_SECONDS] = d(sources.E2E_LATENCY_SUM) / n_lat
        if ARRIVAL_RATE in v and requests > 0:
            v[EFFECTIVE_BATCH_SIZE] = v[ARRIVAL_RATE] * v[MEAN_LATENCY_SECONDS]
    for mean_name, s_sum, s_count, fallback in (
        (MEAN_PROMPT_TOKENS, sources.PROMPT_LEN_SUM, sources.PROMPT_LEN_COUNT,
         sources.PROMPT_TOKENS),
        (MEAN_GENERATION_TOKENS, sources.GENERATION_LEN_SUM, sources.GENERATION_LEN_COUNT,
         sources.GENERATION_TOKENS),
    ):
        if _has(c, s_count):
            n = d(s_count)
            if n > 0:
                v[mean_name] = d(s_sum) / n
        elif sources.VERIFY_CALLS in {s for s, _ in c} and requests > 0 and _has(c, fallback):
            # SGLang pages without the per-request histograms: token counter / requests.
            v[mean_name] = d(fallback) / requests

    if len(samples) >= max(4, min_bimodality_samples):
        bc = bimodality.coexistence_coefficient(samples)
        if bc is not None:
            v[BIMODALITY_COEFFICIENT] = bc
    # Last line of defence (found by fuzzing): a denominator that is positive but tiny (a
    # subnormal count delta) overflows a mean to inf. A value that is not finite is absent.
    v = {name: x for name, x in v.items() if math.isfinite(x)}
    positions = {name: {p: x for p, x in per.items() if math.isfinite(x)}
                 for name, per in positions.items()}
    # An unknown count reads as none counted.
    return WindowSignals(window=label, values=v, positions=positions, span_seconds=dt,
                         requests=0.0 if math.isnan(requests) else requests,
                         drafts=0.0 if math.isnan(drafts) else drafts, histograms=histograms)


def _position_order(p: str) -> tuple[int, str]:
    try:
        return (int(p), p)
    except ValueError:
        return (1 << 30, p)


def _time_base_index(times: Sequence[float], seconds: float) -> int | None:
    if len(times) < 2:
        return None
    # Entry times strictly increase (history folds a poll that does not advance the clock).
    return max(0, bisect.bisect_right(times, times[-1] - seconds + 1e-9) - 1)


def time_window_base(entries: Sequence[HistoryEntry], seconds: float) -> HistoryEntry | None:
    """Newest entry at or before ``newest.t - seconds``; the oldest one if none is."""
    i = _time_base_index([e.t for e in entries], seconds)
    return None if i is None else entries[i]


def _count_base_index(entries: Sequence[HistoryEntry], n_requests: int) -> int | None:
    if len(entries) < 2:
        return None
    key = (sources.REQUESTS_FINISHED, None)
    newest = entries[-1].counters.get(key)
    if newest is None:
        return None
    # Reset-corrected cumulative counters never decrease, so "at least n requests after it"
    # holds for a prefix of the entries: binary search for its last one.
    lo, hi = 0, len(entries) - 1  # the answer is in [lo, hi) or absent
    if not newest - entries[0].counters.get(key, 0.0) >= n_requests:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if newest - entries[mid].counters.get(key, 0.0) >= n_requests:
            lo = mid
        else:
            hi = mid
    return lo


def _count_base_index_column(ring: HistoryRing, cur: HistoryEntry, n_requests: int
                             ) -> int | None:
    """:func:`_count_base_index` over the ring, reading one counter per probe."""
    key = (sources.REQUESTS_FINISHED, None)
    newest = cur.counters.get(key)
    if len(ring) < 2 or newest is None or newest == UNKNOWN:
        return None
    column = [ring.value(i, key) for i in range(len(ring))]
    if UNKNOWN not in column:
        return _count_search([0.0 if v is None else v for v in column], newest, n_requests)
    # Unknown values taken as low as they can be (the known value before) and as high (the
    # known value after): the base is known only when both give the same entry.
    low: list[float] = []
    for v in column:
        low.append((low[-1] if low else 0.0) if v == UNKNOWN else 0.0 if v is None else v)
    high: list[float] = []
    for v in reversed(column):
        high.append(high[-1] if v == UNKNOWN else 0.0 if v is None else v)
    high.reverse()
    i = _count_search(low, newest, n_requests)
    return i if i == _count_search(high, newest, n_requests) else None


def _count_search(column: list[float], newest: float, n_requests: int) -> int | None:
    def value(i: int) -> float:
        return column[i]

    lo, hi = 0, len(column) - 1
    if not newest - value(0) >= n_requests:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if newest - value(mid) >= n_requests:
            lo = mid
        else:
            hi = mid
    return lo


def count_window_base(entries: Sequence[HistoryEntry], n_requests: int) -> HistoryEntry | None:
    """Newest entry with at least ``n_requests`` finished requests after it, or None."""
    i = _count_base_index(entries, n_requests)
    return None if i is None else entries[i]


def derive_model(hist: ModelHistory, cfg: DeriveConfig, engine: str) -> ModelSnapshot:
    """Every window of one model, plus its sample histogram and configured k."""
    ring = hist.entries
    windows: list[WindowSignals] = []
    cur = ring[-1] if ring else None
    if cur is not None:
        # Read the ring's columns (times, requests, samples) instead of making an object
        # per entry: this runs on every poll of every target, over an hour of entries.
        times = ring.times()
        bases: list[tuple[str, int | None]] = [
            (label, _time_base_index(times, secs)) for label, secs in cfg.windows]
        if cfg.count_window > 0:
            bases.append((cfg.count_window_label,
                          _count_base_index_column(ring, cur, cfg.count_window)))
        for label, i in bases:
            if i is None:
                continue
            w = derive_window(label, ring[i], cur, hist.configured_k, hist.gauges,
                              ring.samples_after(i), cfg.min_bimodality_samples)
            if w is not None and (_unclean(ring[i]) or _unclean(cur)):
                w = _with_fallback(w, label, ring, ring[i], cur, hist, cfg,
                                   ring.samples_after(i))
            if w is not None:
                windows.append(w)
    samples_hist = None
    if hist.sample_count > 0 or _has(cur.counters if cur else {}, sources.DRAFT_TOKENS) \
            or _has(cur.counters if cur else {}, sources.VERIFY_CALLS):
        cumulative: list[int] = []
        running = 0
        for n in hist.sample_bucket_counts:
            running += n
            cumulative.append(running)
        samples_hist = SampleHistogram(bounds=SAMPLE_BUCKETS, cumulative_counts=tuple(cumulative),
                                       sum=hist.sample_sum, count=hist.sample_count)
    return ModelSnapshot(model_name=hist.model_name, engine=engine,
                         configured_k=hist.configured_k, windows=tuple(windows),
                         samples=samples_hist, gauges=dict(hist.gauges),
                         sd_families_present=bool(hist.signals & registry.sd_counters()))


def _unclean(entry: HistoryEntry) -> bool:
    return any(v == UNKNOWN for v in entry.counters.values())


def _reads(c: Counters) -> dict[str, list[tuple[str, str | None]]]:
    """The counters each signal of a window whose newest entry holds ``c`` reads."""
    vllm = _has(c, sources.DRAFT_TOKENS) and _has(c, sources.ACCEPTED_TOKENS)
    k = lambda sig, pos=None: (sig, pos)  # noqa: E731
    acc = ([k(sources.DRAFT_TOKENS), k(sources.ACCEPTED_TOKENS), k(sources.DRAFTS)] if vllm
           else [k(sources.GENERATION_TOKENS), k(sources.REQUESTS_FINISHED),
                 k(sources.VERIFY_CALLS)])
    pos_keys = sorted((p for (s, p) in c if s == sources.ACCEPTED_PER_POSITION and p is not None),
                      key=_position_order)
    out = {
        ACCEPTANCE_RATE: [k(sources.DRAFT_TOKENS), k(sources.ACCEPTED_TOKENS)] if vllm else acc,
        DRAFT_LENGTH: [k(sources.DRAFT_TOKENS), k(sources.DRAFTS)],
        ACCEPTANCE_LENGTH: acc,
        TOKEN_ACCEPTANCE_PROBABILITY: acc,
        ACCEPTANCE_HETEROGENEITY: [k(sources.DRAFTS)] + [k(sources.ACCEPTED_PER_POSITION, p)
                                                   for p in pos_keys[:2]],
        ARRIVAL_RATE: [k(sources.REQUESTS_FINISHED)],
        MEAN_LATENCY_SECONDS: [k(sources.E2E_LATENCY_COUNT), k(sources.E2E_LATENCY_SUM)],
        EFFECTIVE_BATCH_SIZE: [k(sources.REQUESTS_FINISHED), k(sources.E2E_LATENCY_COUNT),
                               k(sources.E2E_LATENCY_SUM)],
    }
    for mean_name, s_sum, s_count, fallback in (
        (MEAN_PROMPT_TOKENS, sources.PROMPT_LEN_SUM, sources.PROMPT_LEN_COUNT,
         sources.PROMPT_TOKENS),
        (MEAN_GENERATION_TOKENS, sources.GENERATION_LEN_SUM, sources.GENERATION_LEN_COUNT,
         sources.GENERATION_TOKENS),
    ):
        out[mean_name] = ([k(s_count), k(s_sum)] if _has(c, s_count)
                          else [k(sources.REQUESTS_FINISHED), k(fallback)])
    for n, p in enumerate(pos_keys):
        out[f"position {p}"] = [k(sources.DRAFTS)] + [k(sources.ACCEPTED_PER_POSITION, q)
                                                for q in pos_keys[max(0, n - 1):n + 1]]
    for name, sig in LATENCY_HISTOGRAMS.items():
        out[f"histogram {name}"] = [key for key in c if key[0] == sig and key[1] is not None]
    return out


def _with_fallback(w: WindowSignals, label: str, ring: HistoryRing, base: HistoryEntry,
                   cur: HistoryEntry, hist: ModelHistory, cfg: DeriveConfig,
                   samples: Sequence[float]) -> WindowSignals:
    """A bad sample is a missed sample: each signal that an unknown counter at either end
    left out of ``w`` is that of the window between the entries with every counter known
    (the newest, and the base the window's rule picks among them), as if the other polls
    had failed."""
    clean = [i for i in range(len(ring)) if not _unclean(ring[i])]
    if len(clean) < 2:
        return w
    entries = [ring[i] for i in clean]
    seconds = dict(cfg.windows)
    if label in seconds:
        k = _time_base_index([e.t for e in entries], seconds[label])
    else:
        k = _count_base_index(entries, cfg.count_window)
    if k is None or k >= len(entries) - 1:
        return w
    end = entries[-1]
    # The newest entry's counters as the end has them (0.0 where it has none).
    end = type(end)(end.t, {key: end.counters.get(key, 0.0) for key in cur.counters})
    fb = derive_window(label, entries[k], end, hist.configured_k, hist.gauges, samples,
                       cfg.min_bimodality_samples)
    if fb is None:
        return w
    reads = _reads(cur.counters)

    def unknown(what: str) -> bool:
        return any(math.isnan(delta(base.counters, cur.counters, key))
                   for key in reads.get(what, ()))

    values = dict(w.values)
    for name, x in fb.values.items():
        if name not in values and unknown(name):
            values[name] = x
    positions = {name: dict(per) for name, per in w.positions.items()}
    for name, per in fb.positions.items():
        mine = positions.setdefault(name, {})
        for p, x in per.items():
            if p not in mine and unknown(f"position {p}"):
                mine[p] = x
    histograms = dict(w.histograms)
    for name, h in fb.histograms.items():
        if name not in histograms and unknown(f"histogram {name}"):
            histograms[name] = h
    return dataclasses.replace(w, values=values,
                               positions={n: per for n, per in positions.items() if per},
                               histograms=histograms)
