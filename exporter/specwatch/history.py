"""Per target and model: a bounded ring of reset-corrected cumulative counters.

Why a history of our own: windows are computed from the exporter's own polls, so every
Prometheus replica scraping the exporter sees the same values (scrape-to-scrape deltas would
split between HA replicas), and the time base is the exporter's poll clock, not the server's.

Reset rules (anchors-reliability §1.4), applied PER SERIES before anything is summed:

* a series whose value went down restarted from 0: its delta is its current value
  (PromQL's convention), never negative and never ``abs()``;
* a series whose ``_created`` sample changed, or a page whose ``process_start_time_seconds``
  changed, restarted even when it climbed past the old value between two polls;
* a series that vanishes (a LoRA adapter or model unloaded, a rank gone) keeps its last raw
  value for the retention period, so when it returns its delta is measured from that value
  (or from 0 when it went down); after the retention it is forgotten and re-baselined;
* a series never seen before is a baseline (delta 0), like PromQL's first sample.

Each poll in which at least one series restarted counts once in
``specwatch_target_counter_resets_total`` (one restart of a server resets hundreds of series;
an operator wants to count restarts, not series).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from specwatch import derive, sources

#: (canonical signal, position, bucket bound `le` or None): the key of an aggregated,
#: reset-corrected counter.
AggKey = tuple[str, str | None]

#: Upper bounds of the ``sd_acceptance_rate_samples`` histogram (0.05 wide; +Inf implied).
SAMPLE_BUCKETS: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(1, 21))


@dataclass(frozen=True)
class HistoryEntry:
    """Cumulative, reset-corrected counters of one model at one successful poll.

    ``sample`` is the acceptance rate of the interval that ended at this poll, present only
    when the interval held at least ``min_drafts_per_sample`` drafts.
    """

    t: float
    counters: Mapping[AggKey, float]
    sample: float | None = None


@dataclass
class ModelHistory:
    """The ring of one model on one target, plus lifetime state the ring cannot hold."""

    model_name: str
    entries: deque[HistoryEntry]
    cumulative: dict[AggKey, float] = field(default_factory=dict)
    sample_bucket_counts: list[int] = field(
        default_factory=lambda: [0] * (len(SAMPLE_BUCKETS) + 1))
    sample_sum: float = 0.0
    sample_count: int = 0
    configured_k: int | None = None
    gauges: dict[str, float] = field(default_factory=dict)
    last_seen: float = -math.inf
    #: Canonical counter signals on the latest page (e.g. whether SD families are present).
    signals: frozenset[str] = frozenset()

    def observe_sample(self, value: float) -> None:
        """Add one interval acceptance rate to the lifetime histogram."""
        for i, bound in enumerate(SAMPLE_BUCKETS):
            if value <= bound + 1e-12:
                self.sample_bucket_counts[i] += 1
                break
        else:
            self.sample_bucket_counts[-1] += 1
        self.sample_sum += value
        self.sample_count += 1


@dataclass
class _RawState:
    value: float
    created: float | None
    last_seen: float


class TargetHistory:
    """All models of one target. Not thread-safe: one poll of a target at a time updates it."""

    def __init__(self, retention_seconds: float, max_entries: int,
                 min_drafts_per_sample: float) -> None:
        self.retention_seconds = float(retention_seconds)
        self.max_entries = int(max_entries)
        self.min_drafts_per_sample = float(min_drafts_per_sample)
        self.models: dict[str, ModelHistory] = {}
        self.resets_total = 0
        self.present_models: frozenset[str] = frozenset()
        self.engine: str = "unknown"
        self._raw: dict[sources.SeriesKey, _RawState] = {}
        self._process_start: float | None = None
        self._polled_once = False

    def update(self, page: sources.ParsedPage, t: float) -> bool:
        """Fold one successfully parsed page taken at poll time ``t``.

        Returns True when this poll detected a counter reset (and counted it).
        """
        whole_restart = (
            self._process_start is not None and page.process_start_time is not None
            and abs(page.process_start_time - self._process_start) > 1e-6)
        if page.process_start_time is not None:
            self._process_start = page.process_start_time

        reset_seen = False
        deltas: dict[str, dict[AggKey, float]] = {}
        for key, value in page.counters.items():
            model, signal, identity = key
            created = page.created.get(key)
            prev = self._raw.get(key)
            if prev is None:
                delta = 0.0
            else:
                restarted = (
                    whole_restart or value < prev.value
                    or (created is not None and prev.created is not None
                        and abs(created - prev.created) > 1e-6))
                if restarted:
                    delta = value
                    reset_seen = True
                else:
                    delta = value - prev.value
            self._raw[key] = _RawState(value, created, t)
            if signal == sources.ACCEPTED_PER_POSITION:
                position = dict(identity).get("position")
            elif signal in sources.BUCKET_SIGNALS:
                position = dict(identity).get("le")
            else:
                position = None
            agg = deltas.setdefault(model, {})
            agg[(signal, position)] = agg.get((signal, position), 0.0) + delta
        if reset_seen:
            self.resets_total += 1

        for model in page.models:
            hist = self.models.get(model)
            if hist is None:
                hist = ModelHistory(model, deque(maxlen=self.max_entries))
                self.models[model] = hist
            for agg_key, d in deltas.get(model, {}).items():
                hist.cumulative[agg_key] = hist.cumulative.get(agg_key, 0.0) + d
            hist.configured_k = page.configured_k.get(model)
            hist.gauges = {s: v for (m, s), v in page.gauges.items() if m == model}
            hist.signals = frozenset(sig for (m, sig, _i) in page.counters if m == model)
            hist.last_seen = t
            prev_entry = hist.entries[-1] if hist.entries else None
            counters = dict(hist.cumulative)
            sample = None
            if prev_entry is not None and t > prev_entry.t:
                sample = derive.interval_acceptance_rate(
                    prev_entry.counters, counters, self.min_drafts_per_sample,
                    proposed_per_verify=derive.sglang_proposed_per_verify(
                        hist.gauges, hist.configured_k))
                if sample is not None:
                    hist.observe_sample(sample)
            if prev_entry is not None and t <= prev_entry.t:
                # The clock did not advance: fold into the last entry instead of creating a
                # zero-length interval.
                hist.entries[-1] = HistoryEntry(prev_entry.t, counters, prev_entry.sample)
            else:
                hist.entries.append(HistoryEntry(t, counters, sample))
            self._prune(hist, t)

        self.present_models = page.models
        self.engine = page.engine
        self._polled_once = True
        self._forget_stale(t)
        return reset_seen

    def _prune(self, hist: ModelHistory, now: float) -> None:
        # Keep one entry at or before now - retention: it is the base of the longest window.
        horizon = now - self.retention_seconds
        while len(hist.entries) >= 2 and hist.entries[1].t <= horizon:
            hist.entries.popleft()

    def _forget_stale(self, now: float) -> None:
        horizon = now - self.retention_seconds
        stale = [k for k, s in self._raw.items() if s.last_seen < horizon]
        for k in stale:
            del self._raw[k]
        for name in [m for m, h in self.models.items() if h.last_seen < horizon]:
            del self.models[name]
