"""Windowed SD signals from a model's history: pure functions, no I/O, no clock.

Every value is a ratio of *deltas* of reset-corrected cumulative counters between a window's
base entry (:mod:`specwatch.poll.windows.base`) and the newest entry. Rules kept here:

* a zero denominator (no drafts, no finished requests, no time) makes the signal ABSENT
  (the key is missing), never 0 and never NaN;
* ratios are clamped into [0, 1] (acceptance rate, position rates, heterogeneity), lengths
  into their physical range, so counter noise (vLLM updates families one after the other
  while a page is rendered) can never produce an impossible value.

Nothing is derived before a reader asks (:mod:`specwatch.poll.windows.lazy`): the pipeline
publishes :func:`derive_models`, which freezes each model's history and runs
:func:`derive_model` on the first read of the snapshot's models; that finds each window's
base and differences the rows, and the formulas (:func:`_signals`, on a row read as a
:class:`~specwatch.poll.windows.plan.WindowPlan` says) run when the window is first read. They
read as if computed at once: each keeps what it computes from. Design and equivalence
checks: docs/performance.md, "History, derive and exposition".
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from specwatch.common.acceptance import solve_token_acceptance_probability
from specwatch.engines import registry
from specwatch.poll import sources
from specwatch.poll.formulas import (
    SAMPLE_BUCKETS,
    acceptance_heterogeneity,
    acceptance_length,
    acceptance_rate,
    clamp01,
    draft_length_independent_alpha,
    verify_acceptance_length,
    verify_acceptance_rate,
)
from specwatch.poll.signals import (
    ACCEPTANCE_ALPHA,
    ACCEPTANCE_HETEROGENEITY,
    ACCEPTANCE_LENGTH,
    ACCEPTANCE_RATE,
    ARRIVAL_RATE,
    BIMODALITY_COEFFICIENT,
    DRAFT_LENGTH,
    EFFECTIVE_BATCH_SIZE,
    MEAN_GENERATION_TOKENS,
    MEAN_LATENCY_SECONDS,
    MEAN_PROMPT_TOKENS,
    POSITION_ACCEPTANCE_RATE,
    POSITION_CONDITIONAL_ACCEPTANCE_RATE,
    TOKEN_ACCEPTANCE_PROBABILITY,
)
from specwatch.poll.snapshot import ModelSnapshot, SampleHistogram, WindowSignals
from specwatch.poll.windows import lazy as lazywindow
from specwatch.poll.windows.base import count_base_index_known, time_base_indices, window_lengths
from specwatch.poll.windows.plan import Present, WindowPlan
from specwatch.poll.windows.ring import UNKNOWN, HistoryRing, ModelHistory

__all__ = [
    "ACCEPTANCE_ALPHA", "ACCEPTANCE_HETEROGENEITY", "ACCEPTANCE_LENGTH", "ACCEPTANCE_RATE",
    "ARRIVAL_RATE", "BIMODALITY_COEFFICIENT", "DRAFT_LENGTH", "EFFECTIVE_BATCH_SIZE",
    "MEAN_GENERATION_TOKENS", "MEAN_LATENCY_SECONDS", "MEAN_PROMPT_TOKENS",
    "POSITION_ACCEPTANCE_RATE", "POSITION_CONDITIONAL_ACCEPTANCE_RATE",
    "TOKEN_ACCEPTANCE_PROBABILITY", "DeriveConfig", "WindowRows", "acceptance_alpha",
    "derive_model", "derive_models",
]


@dataclass(frozen=True)
class DeriveConfig:
    """What to compute: time windows (label, seconds), count window, sample thresholds."""

    windows: tuple[tuple[str, float], ...] = (("1m", 60.0), ("5m", 300.0), ("15m", 900.0))
    count_window: int = 1000
    min_drafts_per_sample: float = 50.0
    min_bimodality_samples: int = 10
    #: Build the windows' latency histograms (WindowSignals.histograms)? Only the controller
    #: and A/B pairs read them; without them they are never built.
    histograms: bool = True

    @property
    def count_window_label(self) -> str:
        return f"{self.count_window}req"


def _lazy_window(label: str, source: lazywindow.Source, key: object, plan: WindowPlan,
                 dt: float, requests: float, drafts: float) -> WindowSignals:
    """A window whose span, requests and drafts are known now and whose other signals come
    from window ``key`` of ``source`` on first read."""
    values, positions, histograms = lazywindow.window_mappings(
        source, key, positions=bool(plan.positions), histograms=bool(plan.buckets))
    return WindowSignals(window=label, values=values, positions=positions, span_seconds=dt,
                         requests=requests, drafts=drafts, histograms=histograms)


@dataclass(slots=True, eq=False)
class WindowRows:
    """What the windows of one model at one poll are computed from, when first read
    (:mod:`specwatch.poll.windows.lazy`): a row of counter increases per base (``diff``,
    without the 0.0 that index -1 reads), the plan, a copy of the model's gauges and the
    per-poll samples after the oldest base. A window's key is its row, span and first
    sample. Nothing writes to any of it."""

    diff: np.ndarray
    plan: WindowPlan
    configured_k: int | None
    gauges: Mapping[str, float]
    samples: np.ndarray
    min_bimodality_samples: int
    #: Per window whose base or newest row holds an unknown counter: the increases and span
    #: between the rows a failed poll in place of each unclean one would give
    #: (:func:`_fallbacks`); a window's key names its entry (-1: none).
    fallbacks: list[tuple[np.ndarray, float]] = dataclasses.field(default_factory=list)

    def window(self, label: str, j: int, dt: float, first_sample: int, fallback: int = -1
               ) -> WindowSignals:
        """The window on row ``j``: the span, requests and drafts now, the other signals
        when first read (``fallback``: its entry of ``fallbacks``, -1: none)."""
        plan, diff = self.plan, self.diff
        requests = diff.item(j, plan.req) if plan.req >= 0 else 0.0
        drafts = 0.0 if plan.volume is None or plan.volume < 0 else diff.item(j, plan.volume)
        # Unknown counts read as none counted: what reads them (the controller's traffic
        # floor, A/B segments) then holds or skips the window.
        return _lazy_window(
            label, self, (j, dt, first_sample, fallback), plan, dt,
            requests=requests if requests == requests else 0.0,
            drafts=drafts if drafts == drafts else 0.0)

    def signals(self, key: tuple[int, float, int, int]) -> lazywindow.Signals:
        j, dt, first, f = key
        r = self.diff[j].tolist()
        r.append(0.0)  # what index -1 reads: a counter without a column never increased
        samples = self.samples[first:]
        out = _signals(dt, r, self.plan, self.configured_k, self.gauges, samples,
                       self.min_bimodality_samples)
        if f < 0:
            return out
        row, fb_dt = self.fallbacks[f]
        rf = row.tolist()
        rf.append(0.0)
        fb = _signals(fb_dt, rf, self.plan, self.configured_k, self.gauges, samples,
                      self.min_bimodality_samples)
        return merge_fallback(out, fb, r, self.plan)


@functools.lru_cache(maxsize=256)
def signal_reads(plan: WindowPlan) -> dict[str, tuple[int, ...]]:
    """The row indices each signal of ``plan`` reads (what :func:`_signals` divides and
    multiplies); a position's rates under ``position P``, a histogram under ``histogram NAME``."""
    acc = ((plan.tok, plan.acc, plan.drafts) if plan.by_tokens
           else (plan.gen, plan.req, plan.verify))
    out: dict[str, tuple[int, ...]] = {
        ACCEPTANCE_RATE: (plan.tok, plan.acc) if plan.by_tokens else acc,
        DRAFT_LENGTH: (plan.tok, plan.drafts),
        ACCEPTANCE_LENGTH: acc,
        TOKEN_ACCEPTANCE_PROBABILITY: acc,
        ACCEPTANCE_HETEROGENEITY: (plan.drafts, *(i for _, i in plan.positions[:2])),
        ARRIVAL_RATE: (plan.req,),
        MEAN_LATENCY_SECONDS: (plan.lat_count, plan.lat_sum),
        EFFECTIVE_BATCH_SIZE: (plan.req, plan.lat_count, plan.lat_sum),
    }
    for mean_name, i_count, i_sum in plan.means:
        out[mean_name] = (plan.req if i_count is None else i_count, i_sum)
    upto: tuple[int, ...] = ()
    for p, i in plan.positions:  # a conditional rate reads the position before, too
        upto = (*upto[-1:], i)
        out[f"position {p}"] = (plan.drafts, *upto)
    for name, buckets in plan.buckets:
        out[f"histogram {name}"] = tuple(i for _, i in buckets)
    return out


def merge_fallback(out: lazywindow.Signals, fb: lazywindow.Signals, r: list[float],
                   plan: WindowPlan) -> lazywindow.Signals:
    """``out`` with each signal that an unknown increase in ``r`` left out of it taken from
    ``fb``, the window between the nearest rows where every counter is known: a bad sample
    is a missed sample, as across a failed poll. A signal absent for another reason (no
    drafts, no requests in the window) stays absent."""
    reads = signal_reads(plan)

    def unknown(what: str) -> bool:
        return any(r[i] != r[i] for i in reads.get(what, ()))

    values = dict(out.values)
    for name, x in fb.values.items():
        if name not in values and unknown(name):
            values[name] = x
    positions = {name: dict(per) for name, per in out.positions.items()}
    for name, per in fb.positions.items():
        mine = positions.setdefault(name, {})
        for p, x in per.items():
            if p not in mine and unknown(f"position {p}"):
                mine[p] = x
    histograms = dict(out.histograms)
    for name, h in fb.histograms.items():
        if name not in histograms and unknown(f"histogram {name}"):
            histograms[name] = h
    return lazywindow.Signals(values, {n: per for n, per in positions.items() if per},
                              histograms, out.samples)


def _signals(dt: float, r: list[float], plan: WindowPlan, configured_k: int | None,
             gauges: Mapping[str, float], samples: np.ndarray, min_bimodality_samples: int
             ) -> lazywindow.Signals:
    """Every signal of one window of ``dt`` seconds from its row of increases ``r``, read
    as ``plan`` says; values are inserted in the order the exposition renders them."""
    v: dict[str, float] = {}
    positions: dict[str, dict[str, float]] = {}
    e: float | None = None
    gamma: float | None = None
    if plan.by_tokens:
        e, gamma = _token_acceptance(v, positions, r, plan)
    elif plan.by_verify:
        e = _verify_acceptance(v, r, plan, configured_k, gauges)
    if e is not None:
        k = gamma if gamma else (float(configured_k) if configured_k else None)
        if k:
            alpha = solve_token_acceptance_probability(e, k)
            if alpha is not None:
                v[TOKEN_ACCEPTANCE_PROBABILITY] = alpha
    window_histograms = _window_histograms(r, plan)
    _traffic(v, r, plan, dt)
    # Last line of defence (found by fuzzing): a denominator that is positive but tiny (a
    # subnormal count delta) overflows a mean to inf. A value that is not finite is absent.
    # (A conditional rate is finite when every rate is: a rate in [0, 1] over one in (0, 1]
    # is clamped, and only a NaN rate stays NaN.)
    if positions and not math.isfinite(sum(positions[POSITION_ACCEPTANCE_RATE].values())):
        positions = {name: _finite(per) for name, per in positions.items()}
    # Bimodality that a change over time cannot explain (bimodality.py), computed when first
    # read (lazywindow.WindowValues).
    return lazywindow.Signals(
        _finite(v), positions, window_histograms,
        samples if len(samples) >= max(4, min_bimodality_samples) else None)


def _token_acceptance(v: dict[str, float], positions: dict[str, dict[str, float]],
                      r: list[float], plan: WindowPlan) -> tuple[float | None, float | None]:
    """The acceptance signals of draft and accepted token counters (and drafts, accepted
    per position where counted) into ``v`` and ``positions``; returns the acceptance length
    and the draft length (None without drafts)."""
    d_tok, d_acc = r[plan.tok], r[plan.acc]
    if d_tok > 0:
        v[ACCEPTANCE_RATE] = acceptance_rate(d_acc, d_tok)
    if not plan.has_drafts:
        return None, None
    d_drafts = r[plan.drafts]
    if not d_drafts > 0:
        return None, None
    gamma = d_tok / d_drafts
    e = acceptance_length(d_tok, d_acc, d_drafts)
    v[DRAFT_LENGTH] = gamma
    v[ACCEPTANCE_LENGTH] = e
    if plan.positions:
        rates: dict[str, float] = {}
        cond: dict[str, float] = {}
        prev = 1.0
        for p, i in plan.positions:
            rates[p] = x = clamp01(r[i] / d_drafts)
            if prev > 0:
                cond[p] = clamp01(x / prev)
            prev = x
        positions[POSITION_ACCEPTANCE_RATE] = rates
        positions[POSITION_CONDITIONAL_ACCEPTANCE_RATE] = cond
        if len(plan.positions) >= 2:
            p0, p1 = rates[plan.positions[0][0]], rates[plan.positions[1][0]]
            if 0.0 < p0 < 1.0:
                v[ACCEPTANCE_HETEROGENEITY] = acceptance_heterogeneity(p0, p1)
    return e, gamma


def _verify_acceptance(v: dict[str, float], r: list[float], plan: WindowPlan,
                       configured_k: int | None, gauges: Mapping[str, float]) -> float | None:
    """The acceptance signals of verify calls into ``v``; returns the acceptance length
    (capped at k + 1 when k is configured) or None."""
    e = verify_acceptance_length(r[plan.gen], r[plan.req], r[plan.verify])
    if e is None:
        return None
    if configured_k:
        e = min(e, configured_k + 1.0)
    v[ACCEPTANCE_LENGTH] = e
    proposed = registry.proposed_per_verify(gauges, configured_k)
    if proposed:
        v[ACCEPTANCE_RATE] = verify_acceptance_rate(e, proposed)
    return e


def _window_histograms(r: list[float], plan: WindowPlan
                       ) -> dict[str, tuple[tuple[float, float], ...]]:
    """The window's latency histograms: cumulative bucket increases made non-decreasing in
    the bound (buckets are separate series, so a page rendered while requests finish can be
    off by one between neighbours); a histogram with an unknown bucket is left out."""
    window_histograms: dict[str, tuple[tuple[float, float], ...]] = {}
    for name, buckets in plan.buckets:
        out: list[tuple[float, float]] = []
        running = 0.0
        for bound, i in buckets:
            x = r[i]
            if x != x:
                break
            running = max(running, x)
            out.append((bound, running))
        else:
            window_histograms[name] = tuple(out)
    return window_histograms


def _traffic(v: dict[str, float], r: list[float], plan: WindowPlan, dt: float) -> None:
    """The arrival rate, mean latency, effective batch size and token means into ``v``."""
    requests = r[plan.req]
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


def acceptance_alpha(w: WindowSignals) -> tuple[float, str] | None:
    """The window's draft-length-independent α and its method
    (:func:`~specwatch.poll.formulas.draft_length_independent_alpha`): the first position's
    acceptance where the engine counts positions, else the per-token α of the window; None
    when the window has neither (no drafts: no series).

    Read from the window's own signals, so the exposition, the alert's series and any
    plug-in get the same value from one place.
    """
    rates = w.positions.get(POSITION_ACCEPTANCE_RATE)
    first = rates.get(sources.FIRST_POSITION) if rates else None
    return draft_length_independent_alpha(first, w.values.get(TOKEN_ACCEPTANCE_PROBABILITY))


def _finite(values: dict[str, float]) -> dict[str, float]:
    """``values`` without the entries that are not finite (the same dict when all are).

    A sum of floats is finite only when every term is (inf and NaN stay in a float sum; an
    overflowing sum of finite terms only sends it to the filter), so the usual case costs
    one sum instead of a new dict.
    """
    if math.isfinite(sum(values.values())):
        return values
    return {name: x for name, x in values.items() if math.isfinite(x)}


def derive_models(hists: Iterable[ModelHistory], cfg: DeriveConfig, engine: str
                  ) -> Mapping[str, ModelSnapshot]:
    """:func:`derive_model` of each model, by model name in the order given, computed on
    the first read of the mapping (:class:`specwatch.poll.windows.lazy.Deferred`).

    Most snapshots of a target polled more often than it is scraped are never read. Each
    model is frozen now (:meth:`ModelHistory.frozen`: its ring shared, not copied), so the
    result is what deriving at once would have given, however many polls come before the
    first read.
    """
    frozen = [h.frozen() for h in hists]
    return lazywindow.Deferred(functools.partial(_derive_all, frozen, cfg, engine))


def _derive_all(hists: list[ModelHistory], cfg: DeriveConfig, engine: str
                ) -> dict[str, ModelSnapshot]:
    return {h.model_name: derive_model(h, cfg, engine) for h in hists}


def derive_model(hist: ModelHistory, cfg: DeriveConfig, engine: str) -> ModelSnapshot:
    """Every window of one model, plus its sample histogram and configured k.

    Each window is the difference of two rows of the model's ring (the newest and the
    window's base), computed for every counter it reads at once; what the windows share is
    done once per poll (the bases, the rows read, the samples filtered, windows with the
    same base). The formulas of each window run when it is first read (:class:`WindowRows`).
    """
    ring = hist.entries
    windows: list[WindowSignals] = []
    gauges = dict(hist.gauges)  # the snapshot's own: the windows read them later
    sd = False
    if len(ring):
        times = ring.times()
        bases = _bases(ring, times, cfg)
        wanted = sorted({i for _label, i in bases if i is not None})
        m = ring.rows([*wanted, len(ring) - 1])  # the bases, then the newest entry
        plan, columns = _plan(ring, np.isnan(m[-1]), cfg.histograms)
        sd = plan.sd
        if wanted:
            samples, upto = _samples_after(ring, wanted[0])
            unclean = (m == UNKNOWN).any(axis=1)
            rows = WindowRows(_increases(m.take(columns, axis=1)), plan, hist.configured_k,
                              gauges, samples, cfg.min_bimodality_samples)
            fallback: dict[str, int] = {}
            if unclean.any():
                fallback = _fallbacks(ring, times, bases, wanted, unclean, columns, cfg, rows)
            windows = _windows(rows, times, bases, wanted, upto, fallback)
    samples_hist = None
    if hist.sample_count > 0 or sd:
        samples_hist = SampleHistogram(
            bounds=SAMPLE_BUCKETS, cumulative_counts=tuple(accumulate(hist.sample_bucket_counts)),
            sum=hist.sample_sum, count=hist.sample_count)
    return ModelSnapshot(model_name=hist.model_name, engine=engine,
                         configured_k=hist.configured_k, windows=tuple(windows),
                         samples=samples_hist, gauges=gauges,
                         sd_families_present=not hist.signals.isdisjoint(
                             registry.sd_counters()))


def _bases(ring: HistoryRing, times: np.ndarray, cfg: DeriveConfig
           ) -> list[tuple[str, int | None]]:
    """Each window's label and base row (None: the window is absent): one search for all
    time windows, the count window's by a binary search reading only the rows it probes."""
    labels, seconds = window_lengths(cfg.windows)
    bases: list[tuple[str, int | None]] = list(zip(
        labels, time_base_indices(times, seconds), strict=True))
    if cfg.count_window > 0:
        req = ring.column((sources.REQUESTS_FINISHED, None))
        i = None
        if req is not None and req[-1] == req[-1]:
            i = count_base_index_known(req, cfg.count_window)
        bases.append((cfg.count_window_label, i))
    return bases


def _plan(ring: HistoryRing, absent: np.ndarray, histograms: bool
          ) -> tuple[WindowPlan, np.ndarray]:
    """The plan for the keys present in the newest row (``absent``: per ring column) and
    the ring columns of its keys; remembered on the ring with that absence pattern and made
    again only when a key appears or vanishes."""
    keys = ring.keys
    signature = (len(keys), histograms, absent.tobytes())
    cached = ring.derive_cache
    if isinstance(cached, tuple) and cached[0] == signature:
        return cached[1], cached[2]
    present = Present.of(k for k, a in zip(keys, absent.tolist(), strict=True) if not a)
    plan = WindowPlan.of(present, histograms, frozenset(keys))
    columns = np.array([ring.column_index(k) for k in plan.keys], dtype=np.intp)
    ring.derive_cache = (signature, plan, columns)
    return plan, columns


def _fallbacks(ring: HistoryRing, times: np.ndarray, bases: list[tuple[str, int | None]],
               wanted: list[int], unclean: np.ndarray, columns: np.ndarray, cfg: DeriveConfig,
               rows: WindowRows) -> dict[str, int]:
    """For each window whose base or newest row holds an unknown counter (``unclean``: per
    row of ``wanted``, then the newest), the window the rows with every counter known give,
    as if each other poll had failed: it ends at the newest clean row and starts at the base
    the window's rule picks among the clean rows. Appended to ``rows.fallbacks``; returns
    window label -> its entry. Runs only while an unknown value is in a window's rows."""
    full = ring.rows(range(len(ring)))
    clean = np.flatnonzero(~(full == UNKNOWN).any(axis=1))
    if len(clean) < 2:
        return {}
    end = int(clean[-1])
    seconds = dict(zip(*window_lengths(cfg.windows), strict=True))
    row_of = {i: j for j, i in enumerate(wanted)}
    out: dict[str, int] = {}
    for label, i in bases:
        if i is None or not (unclean[row_of[i]] or unclean[-1]):
            continue
        if label in seconds:
            k = time_base_indices(times[clean], (seconds[label],))[0]
        else:
            req = ring.column_index((sources.REQUESTS_FINISHED, None))
            k = None if req is None else count_base_index_known(full[clean, req],
                                                                cfg.count_window)
        if k is None or int(clean[k]) >= end:
            continue
        base = int(clean[k])
        pair = full[[base, end]].take(columns, axis=1)
        out[label] = len(rows.fallbacks)
        rows.fallbacks.append((_increases(pair)[0], times.item(end) - times.item(base)))
    return out


def _increases(m: np.ndarray) -> np.ndarray:
    """Per base row of ``m`` (the last row: the newest entry), the increase of each counter
    up to the newest entry: never negative, never -0.0; NaN where the counter is unknown at
    either end (the signals that read it are left out, never 0). Unknown is UNKNOWN (an
    invalid source series) or a total that overflowed to +inf, whose increase no subtraction
    gives (inf - inf). ``m`` is written to."""
    m[np.isnan(m)] = 0.0  # an absent counter counts from 0
    unknown = np.isinf(m)  # UNKNOWN is -inf
    if unknown.any():
        m[unknown] = 0.0
    diff = m[-1] - m[:-1]
    diff[~(diff > 0.0)] = 0.0
    if unknown.any():
        diff[unknown[:-1] | unknown[-1]] = math.nan
    return diff


def _samples_after(ring: HistoryRing, oldest: int) -> tuple[np.ndarray, np.ndarray]:
    """The per-poll samples after row ``oldest`` without the polls that had none (NaN), in a
    new array that the windows keep and nothing writes to (each window's are a suffix of
    them); and, at ``i - oldest - 1``, how many of them entries ``oldest + 1 .. i`` hold."""
    samples = ring.sample_column()[oldest + 1:]
    have = samples == samples
    return samples[have], have.cumsum()


def _windows(rows: WindowRows, times: np.ndarray, bases: list[tuple[str, int | None]],
             wanted: list[int], upto: np.ndarray, fallback: Mapping[str, int]
             ) -> list[WindowSignals]:
    """The windows on ``rows`` (one row per base in ``wanted``), in the order of ``bases``;
    windows with the same base row are computed once (all of them while the history is
    younger than the shortest; the count window's base can equal a time window's)."""
    first = wanted[0] + 1
    row_of = {i: j for j, i in enumerate(wanted)}
    t_cur = times.item(-1)
    windows: list[WindowSignals] = []
    done: dict[tuple[int, int], WindowSignals] = {}
    for label, i in bases:
        if i is None:
            continue
        dt = t_cur - times.item(i)
        if not dt > 0:
            continue
        f = fallback.get(label, -1)
        same = done.get((i, f))
        if same is not None:
            windows.append(dataclasses.replace(same, window=label))
            continue
        done[(i, f)] = ws = rows.window(label, row_of[i], dt,
                                        upto.item(i - first) if i >= first else 0, f)
        windows.append(ws)
    return windows
