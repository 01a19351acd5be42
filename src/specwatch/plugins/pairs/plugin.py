"""Measured A/B pairs: SD latency beside a baseline's, binned by arrival rate and acceptance.

A pair names two targets serving the same model, one with SD (``sd``) and one without it or
with another k (``baseline``). :class:`PairTracker` is a target hook: after each poll of a
side it cuts the side's ``window`` into non-overlapping segments, files each *steady* segment
(like a neighbour in load and SD acceptance; one that straddles a change measures neither and
is dropped) into its bin (arrival rate x acceptance band of the SD side), and compares a bin
only when both sides have ``min_requests`` finished requests in it. Its family builder
exposes ``sd_measured_*`` per pair, model, bin and band (definitions in
:mod:`specwatch.plugins.pairs.metrics`); a bin without enough requests has no series, never a
placeholder 0.

Invariants: a side whose configuration changes (engine, SD on or off, configured k) starts its
bins over; segments older than ``retention`` leave their bin; state is bounded by (sides) x
(bins) x (bands) x (retention / window) segments. docs/exporter.md, "Measured A/B pairs",
specifies the segments, bands and statistics.
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

from specwatch.common.schema import parse_duration
from specwatch.expose import metricdefs
from specwatch.plugins.host import PluginHost
from specwatch.plugins.pairs import metrics  # noqa: F401  (registers the definitions)
from specwatch.plugins.pairs import stats as pairstats
from specwatch.plugins.pairs.settings import PairConfig, Pairs, PairSettings
from specwatch.poll.snapshot import ModelSnapshot, Snapshot, TargetSnapshot
from specwatch.poll.windows import derive

log = logging.getLogger(__name__)

#: A segment whose own arrival rate differs from a neighbour segment's by more than this
#: fraction (of the larger) is not at that neighbour's load.
TRANSITION_TOLERANCE = 0.30
#: ... and one whose SD acceptance rate differs by more than this (absolute) is not in that
#: neighbour's acceptance regime. A segment like neither neighbour straddles a change.
ACCEPTANCE_TOLERANCE = 0.10
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


def bin_labels(edges: Sequence[float], top: str = "+Inf") -> list[str]:
    """``["0-0.5", "0.5-1", ..., "32-+Inf"]``: the ``arrival_rate_bin`` label values (with
    ``top="1"``: the ``acceptance_band`` ones)."""
    out = []
    for i, lo in enumerate(edges):
        hi = f"{edges[i + 1]:g}" if i + 1 < len(edges) else top
        out.append(f"{lo:g}-{hi}")
    return out


def bin_index(edges: Sequence[float], rate: float) -> int | None:
    """Index of the bin holding ``rate`` (lower edge inclusive); None below the first edge."""
    if not math.isfinite(rate) or rate < edges[0]:
        return None
    return bisect.bisect_right(edges, rate) - 1


@dataclass(frozen=True)
class SideConfiguration:
    """What a side is configured with: engine, SD on or off, configured k (None: not shown
    yet, e.g. before vLLM's first per-position series)."""

    engine: str
    sd: bool
    k: int | None

    @classmethod
    def of(cls, model: ModelSnapshot) -> SideConfiguration:
        sd = model.sd_families_present or model.configured_k is not None
        return cls(model.engine, sd, model.configured_k if sd else None)

    def differs(self, other: SideConfiguration) -> bool:
        """Another configuration: another engine, SD switched, or another known k."""
        if self.engine != other.engine or self.sd != other.sd:
            return True
        return self.k is not None and other.k is not None and self.k != other.k


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

    @property
    def e2e_count(self) -> float:
        h = self.histograms.get("e2e_latency_seconds")
        return h[-1][1] if h else 0.0


@dataclass
class _Side:
    """Segments of one (target, model) by (bin, regime source, band), where the last one
    ended, and the two latest segments, not filed yet (see :meth:`PairTracker._decide`)."""

    last_end: float = -math.inf
    current_bin: int | None = None
    config: SideConfiguration | None = None
    #: (end, own arrival rate, acceptance rate) of the side's recent segments: what its
    #: partners bin and file their segments of the same time by.
    recent: deque[tuple[float, float | None, float | None]] = field(
        default_factory=lambda: deque(maxlen=8))
    before: _Segment | None = None
    held: _Segment | None = None
    latest_rate: float | None = None
    #: Acceptance rate of the side's latest window (an SD side's current regime).
    latest_acceptance: float | None = None
    bins: dict[tuple[int, str, int], deque[_Segment]] = field(default_factory=dict)


@dataclass(frozen=True)
class MeasuredSpeedup:
    """A pair's measured mean e2e speedup (baseline / SD) in one bin, with its 90% interval."""

    pair: str
    speedup: float
    lower: float
    upper: float


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
        # arrival rate and its partners' over the same time (see _context).
        self._partners: dict[str, set[str]] = {}
        # The regime sources of each target: the SD side of every pair it is in (itself
        # when it is one), whose acceptance band its segments are filed under.
        self._sources: dict[str, set[str]] = {}
        for p in self.pairs:
            self._partners.setdefault(p.sd, set()).add(p.baseline)
            self._partners.setdefault(p.baseline, set()).add(p.sd)
            for t in (p.sd, p.baseline):
                self._sources.setdefault(t, set()).add(p.sd)

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
            self._fold(target.name, mname, end, w, SideConfiguration.of(model))
        return target

    def _fold(self, tname: str, mname: str, end: float, w: derive.WindowSignals,
              config: SideConfiguration | None = None) -> None:
        own = w.values.get(derive.ARRIVAL_RATE)
        edges = self.settings.bins_for(mname)
        start = end - w.span_seconds
        with self._lock:
            side = self._sides.setdefault((tname, mname), _Side())
            side.latest_rate = own
            side.latest_acceptance = w.values.get(derive.ACCEPTANCE_RATE)
            # A bin describes one configuration of the side: after a restart with another
            # configuration the older segments measure another system, so the side starts
            # over (its bins refill).
            if config is not None:
                if side.config is not None and config.differs(side.config):
                    side.bins.clear()
                    side.before = side.held = None
                    log.info("pair side %s/%s: configuration %s -> %s; its bins start over",
                             tname, mname, side.config, config)
                if side.config is not None and config.k is None:
                    config = SideConfiguration(config.engine, config.sd, side.config.k)
                side.config = config
            # The bin the pair is at now (sd_pair_current_arrival_rate_bin): by the larger of
            # the two sides' latest rates, as segments are binned (see _context).
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
            mean = w.values.get(derive.MEAN_LATENCY_SECONDS)
            e2e = w.histograms.get("e2e_latency_seconds")
            n_lat = e2e[-1][1] if e2e else 0.0
            vals = w.values
            seg = _Segment(end, float(own if own is not None else (rate or 0.0)), w.requests,
                           mean * n_lat if mean is not None and n_lat > 0 else None,
                           {k: v for k, v in w.histograms.items() if k in RATIO_METRICS},
                           vals.get(derive.MEAN_PROMPT_TOKENS),
                           vals.get(derive.MEAN_GENERATION_TOKENS),
                           vals.get(derive.ACCEPTANCE_LENGTH), vals.get(derive.DRAFT_LENGTH),
                           w.drafts)
            side.recent.append((end, own, side.latest_acceptance))
            # Every segment waits for the next one of its side: by then its partners'
            # segments of the same time are in (whatever order the two were polled in), and
            # the next segment says whether a segment unlike its previous one was steady.
            if side.held is not None:
                self._decide(tname, mname, side, side.before, side.held, seg)
            side.before, side.held = side.held, seg

    def _at(self, tname: str, mname: str, end: float) -> tuple[float | None, float | None]:
        """(arrival rate, acceptance rate) of a side's segment that ended at ``end``
        (within half a window; the two sides are polled at slightly different times)."""
        side = self._sides.get((tname, mname))
        best: tuple[float, float | None, float | None] | None = None
        for rec in side.recent if side is not None else ():
            if abs(rec[0] - end) <= self.window_seconds / 2 and \
                    (best is None or abs(rec[0] - end) < abs(best[0] - end)):
                best = rec
        return (best[1], best[2]) if best is not None else (None, None)

    def _context(self, tname: str, mname: str, seg: _Segment
                 ) -> tuple[float | None, dict[str, float | None]]:
        """A segment's load and, per regime source, that source's acceptance at the time.

        Both sides take the same offered load; what a window measures is the rate of
        *finished* requests, which lags arrivals on a side that is building a queue (the
        slower side past break-even). The larger of the two sides' rates over the same
        time is the better estimate of the load both are at, so both bin by it."""
        rates = [seg.rate] + [self._at(p, mname, seg.end)[0]
                              for p in self._partners.get(tname, ())]
        rates = [r for r in rates if r is not None]
        regimes = {src: self._at(src, mname, seg.end)[1]
                   for src in self._sources.get(tname, ())}
        return (max(rates) if rates else None), regimes

    def _close(self, tname: str, mname: str, a: _Segment, b: _Segment) -> bool:
        """Are two segments of a side at one load and in one acceptance regime?"""
        if abs(a.rate - b.rate) > TRANSITION_TOLERANCE * max(a.rate, b.rate):
            return False
        ra, rb = self._context(tname, mname, a)[1], self._context(tname, mname, b)[1]
        for src, acc in ra.items():
            other = rb.get(src)
            if acc is not None and other is not None and abs(acc - other) > ACCEPTANCE_TOLERANCE:
                return False
        return True

    def _decide(self, tname: str, mname: str, side: _Side, before: _Segment | None,
                seg: _Segment, after: _Segment) -> None:
        """File ``seg`` under its bin if it is steady (like the segment before it or the one
        after it); one like neither straddles a change of load or regime: dropped."""
        steady = (before is not None and self._close(tname, mname, seg, before)) or \
            self._close(tname, mname, seg, after)
        if not steady or seg.requests <= 0:
            return
        rate, regimes = self._context(tname, mname, seg)
        idx = bin_index(self.settings.bins_for(mname), rate) if rate is not None else None
        if idx is None:
            return
        maxlen = int(self.settings.retention_seconds / max(self.window_seconds, 1e-3)) + 2
        for src, acc in regimes.items():
            band = bin_index(self.settings.acceptance_bands, acc) if acc is not None else None
            if band is None:
                continue  # no acceptance known for the pair: no regime to file it under
            side.bins.setdefault((idx, src, band), deque(maxlen=maxlen)).append(seg)

    def current_speedup(self, target: str, model: str) -> MeasuredSpeedup | None:
        """The measured mean speedup where a pair whose SD side is ``target`` is now (its
        current arrival-rate bin and acceptance band), with its 90% interval: what the
        ``sd_measured_speedup{statistic="mean"}`` series and its bounds show for that cell.
        None where no such pair or no compared bin (each side under ``min_requests``)."""
        with self._lock:
            for pair in self.pairs:
                if pair.sd != target or (pair.model is not None and pair.model != model):
                    continue
                sd = self._sides.get((pair.sd, model))
                base = self._sides.get((pair.baseline, model))
                if sd is None or base is None or sd.current_bin is None \
                        or sd.latest_acceptance is None:
                    continue
                band = bin_index(self.settings.acceptance_bands, sd.latest_acceptance)
                if band is None:
                    continue
                cell = (sd.current_bin, pair.sd, band)
                sd_segs, base_segs = list(sd.bins.get(cell, ())), list(base.bins.get(cell, ()))
                need = max(self.settings.min_requests, 1)
                if min(sum(g.requests for g in sd_segs),
                       sum(g.requests for g in base_segs)) < need:
                    continue
                mean = _ratios("e2e_latency_seconds", sd_segs, base_segs).get("mean")
                interval = mean_ratio_interval(sd_segs, base_segs)
                if mean is not None and interval is not None:
                    return MeasuredSpeedup(pair.name, mean, interval[0], interval[1])
        return None

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
        # Names, labels and HELP come from the metric table (specwatch.expose.metricdefs).
        fams = {name: metricdefs.gauge(name) for name in (
            *RATIO_METRICS.values(), "sd_measured_speedup_lower", "sd_measured_speedup_upper",
            "sd_measured_arrival_rate", "sd_measured_requests",
            "sd_pair_current_arrival_rate_bin", *SIDE_METRICS)}
        with self._lock:
            for pair in self.pairs:
                for model in self._models(pair):
                    self._render(pair, model, fams)
        for fam in fams.values():
            if fam.samples:
                yield fam

    def _render(self, pair: PairConfig, model: str, fams: dict[str, GaugeMetricFamily]) -> None:
        sd = self._sides.get((pair.sd, model))
        base = self._sides.get((pair.baseline, model))
        names = bin_labels(self.settings.bins_for(model))
        bands = bin_labels(self.settings.acceptance_bands, top="1")
        if sd is not None and sd.current_bin is not None and sd.latest_acceptance is not None:
            band = bin_index(self.settings.acceptance_bands, sd.latest_acceptance)
            if band is not None:
                fams["sd_pair_current_arrival_rate_bin"].add_metric(
                    [pair.name, pair.sd, model, names[sd.current_bin], bands[band]], 1.0)
        if sd is None or base is None:
            return
        keys = sorted({(i, b) for (i, src, b) in (*sd.bins, *base.bins) if src == pair.sd})
        need = max(self.settings.min_requests, 1)
        for idx, band in keys:
            segs = {"sd": list(sd.bins.get((idx, pair.sd, band), ())),
                    "baseline": list(base.bins.get((idx, pair.sd, band), ()))}
            key = [pair.name, pair.sd, model, names[idx], bands[band]]
            counts = {s: sum(g.requests for g in segs[s]) for s in SIDES}
            for s in SIDES:
                if counts[s] > 0:
                    fams["sd_measured_requests"].add_metric([*key, s], counts[s])
                if counts[s] >= need:
                    for name, value in _side_means(segs[s]).items():
                        fams[name].add_metric([*key, s], value)
            if min(counts.values()) < need:
                continue
            all_segs = segs["sd"] + segs["baseline"]
            fams["sd_measured_arrival_rate"].add_metric(
                key, sum(g.rate for g in all_segs) / len(all_segs))
            for hname, metric in RATIO_METRICS.items():
                for stat, value in _ratios(hname, segs["sd"], segs["baseline"]).items():
                    fams[metric].add_metric([*key, stat], value)
            interval = mean_ratio_interval(segs["sd"], segs["baseline"])
            if interval is not None:
                fams["sd_measured_speedup_lower"].add_metric([*key, "mean"], interval[0])
                fams["sd_measured_speedup_upper"].add_metric([*key, "mean"], interval[1])


def _weighted(pairs_: Sequence[tuple[float | None, float]]) -> float | None:
    """Weighted mean over the (value, weight) pairs that have a value and weight."""
    num = sum(v * w for v, w in pairs_ if v is not None and w > 0)
    den = sum(w for v, w in pairs_ if v is not None and w > 0)
    return num / den if den > 0 else None


def _side_means(segs: Sequence[_Segment]) -> dict[str, float]:
    """One side's absolute figures in a bin: what calibration turns into (λ, L) points.

    Latency is exact (sum over count); rates and lengths are weighted by requests, the
    acceptance and draft lengths by drafts (a side without drafts has none)."""
    mean = _mean_latency(segs)
    out = {
        "sd_measured_latency_seconds": mean,
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


def _mean_latency(segs: Sequence[_Segment]) -> float | None:
    """Exact mean e2e latency of the segments' requests: their sums over their counts."""
    with_sum = [g for g in segs if g.e2e_sum is not None and g.e2e_count > 0]
    n = sum(g.e2e_count for g in with_sum)
    return sum(g.e2e_sum or 0.0 for g in with_sum) / n if n > 0 else None


def _variance_of_mean(segs: Sequence[_Segment], mean: float) -> float | None:
    """Variance of one side's mean e2e latency in a bin, the larger of two estimates.

    * From the buckets: :func:`pairstats.max_variance` (the requests' variance can be no larger,
      whatever they are inside their buckets) over the number of requests. A bound, not a
      guess: latencies inside vLLM's 0-0.3 s first bucket cannot be resolved, and the
      interval is as wide as that leaves it.
    * From the segments: the scatter of the segments' own means over their number, which
      holds what the buckets cannot (requests of one batch are not independent; the load
      moves inside a bin). Taken when there are two segments or more.
    """
    with_sum = [g for g in segs if g.e2e_sum is not None and g.e2e_count > 0]
    n = sum(g.e2e_count for g in with_sum)
    if n <= 0:
        return None
    merged = pairstats.merge([g.histograms["e2e_latency_seconds"] for g in with_sum])
    spread = pairstats.max_variance(merged, mean)
    if spread is None:
        return None
    var = spread / n
    means = [(g.e2e_sum or 0.0) / g.e2e_count for g in with_sum]
    if len(means) >= 2:
        m = sum(means) / len(means)
        scatter = sum((x - m) ** 2 for x in means) / (len(means) - 1)
        var = max(var, scatter / len(means))
    return var


def mean_ratio_interval(sd: Sequence[_Segment], base: Sequence[_Segment]
                        ) -> tuple[float, float] | None:
    """90% interval of a bin's mean ratio (baseline mean / SD mean): the two sides' means
    and :func:`_variance_of_mean` into :func:`pairstats.ratio_interval`."""
    ms, mb = _mean_latency(sd), _mean_latency(base)
    if not ms or not mb or ms <= 0 or mb <= 0:
        return None
    vs, vb = _variance_of_mean(sd, ms), _variance_of_mean(base, mb)
    if vs is None or vb is None:
        return None
    return pairstats.ratio_interval(mb, vb, ms, vs)


def _ratios(hname: str, sd: Sequence[_Segment], base: Sequence[_Segment]) -> dict[str, float]:
    """baseline / SD of one histogram's statistics (only those both sides have, finite and
    positive, and for quantiles only those the buckets resolve)."""
    out: dict[str, float] = {}
    if hname == "e2e_latency_seconds":
        ms, mb = _mean_latency(sd), _mean_latency(base)
        if ms and mb is not None and ms > 0:
            out["mean"] = mb / ms
    merged = []
    for segs in (sd, base):
        hists = [g.histograms[hname] for g in segs if hname in g.histograms]
        merged.append(pairstats.merge(hists) if hists else ())
    for stat, q in _QUANTILES.items():
        r = pairstats.quantile_ratio(q, merged[0], merged[1])
        if r is not None:
            out[stat] = r
    return {k: v for k, v in out.items() if math.isfinite(v) and v > 0}


def install(host: PluginHost, section: Pairs) -> PairTracker | None:
    """Register a tracker of the configured pairs (its target hook and family builder);
    None without pairs."""
    if not section.pairs:
        return None
    tracker = PairTracker(section.pairs, section.settings,
                          parse_duration(section.settings.window))
    host.add_target_hook(tracker.observe)
    host.add_family_builder(tracker.families)
    return tracker
