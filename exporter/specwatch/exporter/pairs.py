"""Measured A/B pairs (issue 16): SD latency beside a baseline's, binned by arrival rate.

Why: a predicted speedup is a model's word; an operator trusts a measured one. A pair names
two targets serving the same model, one with SD (``sd``) and one without it or with another
k (``baseline``). Comparing their latencies is only fair at the same load, so every finished
request is put in the arrival-rate bin of the window it finished in, per side, and a bin is
compared only when both sides have at least ``min_requests`` finished requests in it.

How (poll path only, no model): :class:`PairTracker` is a target hook. After each poll of a
side it looks at that model's ``window`` (e.g. ``1m``) in the freshly derived snapshot; when
the window starts exactly where the side's previous segment ended (or later), the window is
one new non-overlapping *segment*: its arrival rate picks the bin, and its latency histogram
increases (e2e, TTFT, inter-token), the e2e latency sum and the request count are added to
that bin, unless its own arrival rate is more than 30% off the side's previous segment's
(it straddles a load change: a transition, not a measurement at either load). Segments
older than ``retention`` are dropped, so a bin describes recent traffic,
and a side whose draft length changes (SD switched, or another k) starts its bins over, so
a bin never mixes two configurations; state is bounded: (pairs' sides) x (bins) x
(retention / window) segments.

Exposed per pair (``target`` is its SD side), model and bin (a bin where a side has too
few requests has no series; nothing here is ever a placeholder 0):

* ``sd_measured_speedup{statistic="mean|p50|p99"}``: baseline e2e latency / SD e2e latency
  (> 1: SD is faster);
* ``sd_measured_ttft_ratio`` and ``sd_measured_inter_token_latency_ratio``
  ``{statistic="p50|p99"}``: the same ratio for TTFT and inter-token latency (quantiles from
  the histograms; their mean needs sums the window does not carry);
* ``sd_measured_arrival_rate``: the mean arrival rate of the bin's segments (both sides),
  the x position of the point on a speedup-vs-arrival-rate panel;
* ``sd_measured_requests{side}``: finished requests in the bin per side;
* ``sd_pair_current_arrival_rate_bin``: 1 for the bin of the SD side's current arrival rate,
  what ``SDMeasuredSlowdown`` joins on ("at the current load").
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily, Metric

from specwatch.exporter import derive, metricdefs
from specwatch.exporter.snapshot import Snapshot, TargetSnapshot

log = logging.getLogger(__name__)

#: Default arrival-rate bin edges (requests per second): [0, 0.5), [0.5, 1), ... [32, +Inf).
DEFAULT_BINS: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
DEFAULT_WINDOW = "1m"
DEFAULT_MIN_REQUESTS = 50
DEFAULT_RETENTION_SECONDS = 3600.0
#: A segment whose own arrival rate differs from the side's previous segment's by more than
#: this fraction (of the larger) straddles a load change: its requests started under one
#: load and finished under another, a measurement of neither, so it is not binned.
TRANSITION_TOLERANCE = 0.30
#: Statistics of the e2e ratio; TTFT and inter-token ratios have the quantiles only.
E2E_STATISTICS = ("mean", "p50", "p99")
QUANTILE_STATISTICS = ("p50", "p99")
_QUANTILES = {"p50": 0.5, "p99": 0.99}
#: Histogram names of WindowSignals.histograms used here -> the metric of their ratio.
RATIO_METRICS: dict[str, str] = {
    "e2e_latency_seconds": "sd_measured_speedup",
    "ttft_seconds": "sd_measured_ttft_ratio",
    "inter_token_latency_seconds": "sd_measured_inter_token_latency_ratio",
}
SIDES = ("sd", "baseline")
#: Per-side figures of a bin (calibration points).
SIDE_METRICS = ("sd_measured_latency_seconds", "sd_measured_side_arrival_rate",
                "sd_measured_prompt_tokens", "sd_measured_generation_tokens",
                "sd_measured_acceptance_length", "sd_measured_draft_length")


@dataclass(frozen=True)
class PairConfig:
    """One ``pairs:`` entry: two targets, optionally one model (default: every model both
    sides serve)."""

    name: str
    sd: str
    baseline: str
    model: str | None = None


@dataclass(frozen=True)
class PairSettings:
    """``pair_options:``: the window a segment is, thresholds, bins (default and per model)."""

    window: str = DEFAULT_WINDOW
    min_requests: float = DEFAULT_MIN_REQUESTS
    retention_seconds: float = DEFAULT_RETENTION_SECONDS
    bins: tuple[float, ...] = DEFAULT_BINS
    model_bins: Mapping[str, tuple[float, ...]] = field(default_factory=dict)

    def bins_for(self, model: str) -> tuple[float, ...]:
        return self.model_bins.get(model, self.bins)


def bin_labels(edges: Sequence[float]) -> list[str]:
    """``["0-0.5", "0.5-1", ..., "32-+Inf"]``: the ``arrival_rate_bin`` label values."""
    out = []
    for i, lo in enumerate(edges):
        hi = f"{edges[i + 1]:g}" if i + 1 < len(edges) else "+Inf"
        out.append(f"{lo:g}-{hi}")
    return out


def bin_index(edges: Sequence[float], rate: float) -> int | None:
    """Index of the bin holding ``rate`` (lower edge inclusive); None below the first edge."""
    if not math.isfinite(rate) or rate < edges[0]:
        return None
    return bisect.bisect_right(edges, rate) - 1


@dataclass(frozen=True, slots=True)
class _Segment:
    """One non-overlapping window of one side: where it ended, its load and its latencies."""

    end: float
    rate: float
    requests: float
    e2e_sum: float | None  # mean e2e latency x requests; None without a mean
    histograms: Mapping[str, tuple[tuple[float, float], ...]]
    #: Window means kept for calibration points (None where the window had none).
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    acceptance_length: float | None = None
    draft_length: float | None = None
    drafts: float = 0.0


@dataclass
class _Side:
    """Segments of one (target, model) by bin index, and where the last one ended."""

    last_end: float = -math.inf
    current_bin: int | None = None
    #: Draft length of the side's latest segment (0: SD off); None before the first one.
    config: float | None = None
    #: Own arrival rate of the side's previous segment (the transition test).
    previous_rate: float | None = None
    latest_rate: float | None = None
    bins: dict[int, deque[_Segment]] = field(default_factory=dict)


def _merge(hists: Sequence[tuple[tuple[float, float], ...]]) -> tuple[tuple[float, float], ...]:
    """Sum cumulative bucket counts of several windows (bounds unioned; a bound one window
    lacks takes that window's count at its next lower bound, the cumulative convention)."""
    bounds = sorted({b for h in hists for b, _ in h})
    total = dict.fromkeys(bounds, 0.0)
    for h in hists:
        hb = [b for b, _ in h]
        for b in bounds:
            i = bisect.bisect_right(hb, b) - 1
            if i >= 0:
                total[b] += h[i][1]
    return tuple((b, total[b]) for b in bounds)


class PairTracker:
    """Segments of every pair side, fed by a target hook; renders the pair families."""

    def __init__(self, pairs: Sequence[PairConfig], settings: PairSettings,
                 window_seconds: float) -> None:
        self.pairs = tuple(pairs)
        self.settings = settings
        self.window_seconds = float(window_seconds)
        self._lock = threading.Lock()
        self._sides: dict[tuple[str, str], _Side] = {}
        self._targets = {t for p in self.pairs for t in (p.sd, p.baseline)}
        # The other side(s) of each target: a segment is binned by the larger of its own
        # arrival rate and its partners' latest one (see _fold).
        self._partners: dict[str, set[str]] = {}
        for p in self.pairs:
            self._partners.setdefault(p.sd, set()).add(p.baseline)
            self._partners.setdefault(p.baseline, set()).add(p.sd)

    # -- feeding (poll threads) -------------------------------------------------------------
    def observe(self, target: TargetSnapshot) -> TargetSnapshot:
        """Target hook: fold the window of each model of a paired target; returns it as is."""
        if target.name not in self._targets or not target.up:
            return target
        end = target.last_success_timestamp
        if end is None:
            return target
        for mname, model in target.models.items():
            w = model.window(self.settings.window)
            if w is None:
                continue
            self._fold(target.name, mname, end, w)
        return target

    def _fold(self, tname: str, mname: str, end: float, w: derive.WindowSignals) -> None:
        own = w.values.get(derive.ARRIVAL_RATE)
        edges = self.settings.bins_for(mname)
        start = end - w.span_seconds
        with self._lock:
            side = self._sides.setdefault((tname, mname), _Side())
            side.latest_rate = own
            # Both sides take the same offered load; what a window measures is the rate of
            # *finished* requests, which lags arrivals on a side that is building a queue
            # (the slower side past break-even). The larger of the two sides' rates is the
            # better estimate of the load both are at, so both bin by it.
            rates = [own] + [other.latest_rate for p in self._partners.get(tname, ())
                             if (other := self._sides.get((p, mname))) is not None]
            rates = [r for r in rates if r is not None]
            rate = max(rates) if rates else None
            idx = bin_index(edges, rate) if rate is not None else None
            side.current_bin = idx
            horizon = end - self.settings.retention_seconds
            for segs in side.bins.values():
                while segs and segs[0].end < horizon:
                    segs.popleft()
            # A young window (shorter than nominal) is not a segment yet: segments have the
            # nominal length so that their arrival rates are comparable.
            if w.span_seconds < self.window_seconds - 1e-6 or start < side.last_end - 1e-6:
                return
            side.last_end = end
            previous, side.previous_rate = side.previous_rate, own
            if previous is not None and own is not None and \
                    abs(own - previous) > TRANSITION_TOLERANCE * max(own, previous):
                return  # straddles a load change (see TRANSITION_TOLERANCE)
            if idx is None or w.requests <= 0:
                return
            mean = w.values.get(derive.MEAN_LATENCY_SECONDS)
            e2e = w.histograms.get("e2e_latency_seconds")
            n_lat = e2e[-1][1] if e2e else 0.0
            vals = w.values
            seg = _Segment(end, float(own if own is not None else rate), w.requests,
                           mean * n_lat if mean is not None and n_lat > 0 else None,
                           {k: v for k, v in w.histograms.items() if k in RATIO_METRICS},
                           vals.get(derive.MEAN_PROMPT_TOKENS),
                           vals.get(derive.MEAN_GENERATION_TOKENS),
                           vals.get(derive.ACCEPTANCE_LENGTH), vals.get(derive.DRAFT_LENGTH),
                           w.drafts)
            # A bin describes one configuration of the side: after a draft-length change
            # (a restart with another --speculative-config) the older segments measure
            # another system, so the side starts over (its bins refill at the new k).
            config = float(round(seg.draft_length)) if seg.drafts > 0 and \
                seg.draft_length is not None else 0.0
            if side.config is not None and config != side.config:
                side.bins.clear()
            side.config = config
            maxlen = int(self.settings.retention_seconds / max(self.window_seconds, 1e-3)) + 2
            side.bins.setdefault(idx, deque(maxlen=maxlen)).append(seg)

    # -- rendering (scrapes) -------------------------------------------------------------------
    def _models(self, pair: PairConfig) -> list[str]:
        if pair.model is not None:
            return [pair.model]
        sd = {m for (t, m) in self._sides if t == pair.sd}
        base = {m for (t, m) in self._sides if t == pair.baseline}
        return sorted(sd & base)

    def families(self, _snap: Snapshot | None = None) -> Iterator[Metric]:
        """The measured-pair families (collector family builder; see the module docstring)."""
        # `target` is the pair's SD side: the measured points sit beside that target's
        # predicted speedup (and dashboards filter by target like every exporter series).
        # Names, labels and HELP come from the metric table (specwatch.exporter.metricdefs).
        ratio = {name: metricdefs.gauge(name) for name in RATIO_METRICS.values()}
        rate = metricdefs.gauge("sd_measured_arrival_rate")
        requests = metricdefs.gauge("sd_measured_requests")
        current = metricdefs.gauge("sd_pair_current_arrival_rate_bin")
        sides = {name: metricdefs.gauge(name) for name in SIDE_METRICS}
        with self._lock:
            for pair in self.pairs:
                for model in self._models(pair):
                    self._render(pair, model, ratio, rate, requests, current, sides)
        for fam in (*ratio.values(), rate, requests, current, *sides.values()):
            if fam.samples:
                yield fam

    def _render(self, pair: PairConfig, model: str, ratio: dict[str, GaugeMetricFamily],
                rate: GaugeMetricFamily, requests: GaugeMetricFamily,
                current: GaugeMetricFamily, sides: dict[str, GaugeMetricFamily]) -> None:
        sd = self._sides.get((pair.sd, model))
        base = self._sides.get((pair.baseline, model))
        names = bin_labels(self.settings.bins_for(model))
        if sd is not None and sd.current_bin is not None:
            current.add_metric([pair.name, pair.sd, model, names[sd.current_bin]], 1.0)
        if sd is None or base is None:
            return
        for idx, label in enumerate(names):
            segs = {"sd": list(sd.bins.get(idx, ())), "baseline": list(base.bins.get(idx, ()))}
            counts = {s: sum(g.requests for g in segs[s]) for s in SIDES}
            for s in SIDES:
                if counts[s] > 0:
                    requests.add_metric([pair.name, pair.sd, model, label, s], counts[s])
                if counts[s] >= max(self.settings.min_requests, 1):
                    for name, value in _side_means(segs[s]).items():
                        sides[name].add_metric([pair.name, pair.sd, model, label, s], value)
            if min(counts.values()) < max(self.settings.min_requests, 1):
                continue
            key = [pair.name, pair.sd, model, label]
            all_segs = segs["sd"] + segs["baseline"]
            rate.add_metric(key, sum(g.rate for g in all_segs) / len(all_segs))
            for hname, metric in RATIO_METRICS.items():
                for stat, value in _ratios(hname, segs["sd"], segs["baseline"]).items():
                    ratio[metric].add_metric([*key, stat], value)


def _weighted(pairs_: Sequence[tuple[float | None, float]]) -> float | None:
    """Weighted mean over the (value, weight) pairs that have a value and weight."""
    num = sum(v * w for v, w in pairs_ if v is not None and w > 0)
    den = sum(w for v, w in pairs_ if v is not None and w > 0)
    return num / den if den > 0 else None


def _side_means(segs: Sequence[_Segment]) -> dict[str, float]:
    """One side's absolute figures in a bin: what calibration turns into (λ, L) points.

    Latency is exact (sum over count); rates and lengths are weighted by requests, the
    acceptance and draft lengths by drafts (a side without drafts has none)."""
    with_sum = [g for g in segs if g.e2e_sum is not None and "e2e_latency_seconds"
                in g.histograms]
    n = sum(g.histograms["e2e_latency_seconds"][-1][1] for g in with_sum)
    out = {
        "sd_measured_latency_seconds": sum(g.e2e_sum or 0.0 for g in with_sum) / n
        if n > 0 else None,
        "sd_measured_side_arrival_rate": sum(g.rate for g in segs) / len(segs) if segs
        else None,
        "sd_measured_prompt_tokens": _weighted([(g.prompt_tokens, g.requests) for g in segs]),
        "sd_measured_generation_tokens": _weighted([(g.generation_tokens, g.requests)
                                                    for g in segs]),
        "sd_measured_acceptance_length": _weighted([(g.acceptance_length, g.drafts)
                                                    for g in segs]),
        "sd_measured_draft_length": _weighted([(g.draft_length, g.drafts) for g in segs]),
    }
    return {k: v for k, v in out.items() if v is not None and math.isfinite(v)}


def _ratios(hname: str, sd: Sequence[_Segment], base: Sequence[_Segment]) -> dict[str, float]:
    """baseline / SD of one histogram's statistics (only those both sides have, finite and
    positive)."""
    out: dict[str, float] = {}
    if hname == "e2e_latency_seconds":
        means = []
        for segs in (sd, base):
            with_sum = [g for g in segs if g.e2e_sum is not None]
            n = sum(g.histograms["e2e_latency_seconds"][-1][1] for g in with_sum
                    if "e2e_latency_seconds" in g.histograms)
            means.append(sum(g.e2e_sum for g in with_sum) / n if n > 0 else None)
        if means[0] and means[1] is not None and means[0] > 0:
            out["mean"] = means[1] / means[0]
    merged = []
    for segs in (sd, base):
        hists = [g.histograms[hname] for g in segs if hname in g.histograms]
        merged.append(_merge(hists) if hists else ())
    for stat, q in _QUANTILES.items():
        qs = [derive.histogram_quantile(q, h) for h in merged]
        if qs[0] and qs[1] is not None and qs[0] > 0:
            out[stat] = qs[1] / qs[0]
    return {k: v for k, v in out.items() if math.isfinite(v) and v > 0}


def install(pipeline: object, collector: object, pairs: Sequence[PairConfig],
            settings: PairSettings, window_seconds: float) -> PairTracker | None:
    """Hook a tracker into a pipeline (target hook) and a collector (family builder)."""
    if not pairs:
        return None
    tracker = PairTracker(pairs, settings, window_seconds)
    pipeline.add_target_hook(tracker.observe)  # type: ignore[attr-defined]
    collector.add_family_builder(tracker.families)  # type: ignore[attr-defined]
    return tracker
