"""REFERENCE (tests only): the former dict-and-columns history of specwatch.

Kept verbatim (imports aside) so the numpy implementation in
``specwatch.poll.windows.history`` can be checked against it to 1e-9 on every fixture and
property test (tests/poll/test_history_equivalence.py). Not used by the exporter.

Per target and model: a bounded ring of reset-corrected cumulative counters.

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
from array import array
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from helpers import reference_derive as derive
from specwatch.poll import sources
from specwatch.poll.windows import samples as poll_samples

#: (canonical signal, position, bucket bound `le` or None): the key of an aggregated,
#: reset-corrected counter.
AggKey = tuple[str, str | None]

#: Upper bounds of the ``sd_acceptance_rate_samples`` histogram (owned by derive, which
#: builds the histogram; history counts samples into the same buckets).
SAMPLE_BUCKETS = derive.SAMPLE_BUCKETS


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """Cumulative, reset-corrected counters of one model at one successful poll.

    ``sample`` is the acceptance rate of the interval that ended at this poll, present only
    when the interval held at least ``min_drafts_per_sample`` drafts. The history stores
    entries as columns (:class:`HistoryRing`) and makes these objects when they are read.
    """

    t: float
    counters: Mapping[AggKey, float]
    sample: float | None = None


_NAN = float("nan")
#: An absent value in a uint32 column (counts stay below it; a larger one widens the column).
_ABSENT = 0xFFFFFFFF


def _fits_u32(v: float) -> bool:
    return 0.0 <= v < _ABSENT and v == int(v)


class HistoryRing:
    """The entries of one model as columns: a bounded ring, oldest first.

    Why columns: a history holds one entry per poll per model for the retention period (an
    hour: 720 entries at 5 s) for every target, and an entry holds every counter read
    (vLLM: about 60 with the latency histogram buckets). As objects (an entry, a mapping,
    its floats) that is 1.4-4 KB per entry, 0.5-1.5 GB for 500 targets, and millions of
    objects for the garbage collector to walk; as one array per counter it is 4 bytes per
    whole-number count and 8 per other value, in a few dozen objects per model.

    It behaves like the deque of :class:`HistoryEntry` it replaces (``len``, ``[i]``,
    iteration, ``append``, ``[-1] = entry``, ``popleft``, ``maxlen``); an entry read from
    it is a fresh :class:`HistoryEntry` whose ``counters`` hold the keys present at that
    poll. :func:`specwatch.poll.windows.derive.derive_model` reads it without making an entry
    per row (:meth:`times`, :meth:`value`, :meth:`samples_after`).
    """

    __slots__ = ("_f64", "_s", "_start", "_t", "_u32", "maxlen")

    def __init__(self, entries: Iterable[HistoryEntry] = (), maxlen: int | None = None
                 ) -> None:
        self.maxlen = maxlen
        self._t = array("d")
        self._s = array("d")
        # A counter's column is uint32 (absent: _ABSENT) while every value is a whole number
        # below 2**32 - 1 (request, token and bucket counts: 4 bytes a value), else doubles
        # (absent: NaN). A value that does not fit moves the column to _f64 for good.
        self._u32: dict[AggKey, array] = {}
        self._f64: dict[AggKey, array] = {}
        self._start = 0
        for e in entries:
            self.append(e)

    def __len__(self) -> int:
        return len(self._t) - self._start

    def __bool__(self) -> bool:
        return len(self._t) > self._start

    def _row(self, i: int) -> int:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("history index out of range")
        return self._start + i

    def __getitem__(self, i: int) -> HistoryEntry:
        r = self._row(i)
        counters = {k: float(x) for k, col in self._u32.items() if (x := col[r]) != _ABSENT}
        counters.update((k, x) for k, col in self._f64.items() if (x := col[r]) == x)
        sample = self._s[r]
        return HistoryEntry(self._t[r], counters, sample if sample == sample else None)

    def _widen(self, key: AggKey) -> array:
        col = array("d", [_NAN if x == _ABSENT else float(x) for x in self._u32.pop(key)])
        self._f64[key] = col
        return col

    def _put(self, key: AggKey, r: int, value: float | None) -> None:
        """Write row ``r`` of ``key`` (``r == len``: append), creating or widening it."""
        col = self._u32.get(key)
        if col is not None:
            if value is None or _fits_u32(value):
                x = _ABSENT if value is None else int(value)
                if r == len(col):
                    col.append(x)
                else:
                    col[r] = x
                return
            col = self._widen(key)
        else:
            col = self._f64.get(key)
            if col is None:
                if value is None:
                    return
                if _fits_u32(value):
                    col = self._u32[key] = array("I", [_ABSENT]) * r
                    col.append(int(value))
                    return
                col = self._f64[key] = array("d", [_NAN]) * r
        y = _NAN if value is None else value
        if r == len(col):
            col.append(y)
        else:
            col[r] = y

    def __setitem__(self, i: int, entry: HistoryEntry) -> None:
        if i != -1:
            raise IndexError("only the newest entry can be replaced")
        r = self._row(-1)
        self._t[r] = entry.t
        self._s[r] = _NAN if entry.sample is None else entry.sample
        for key in [*self._u32, *self._f64]:
            if key not in entry.counters:
                self._put(key, r, None)
        for key, v in entry.counters.items():
            self._put(key, r, v)

    def __iter__(self) -> Iterator[HistoryEntry]:
        for i in range(len(self)):
            yield self[i]

    def append(self, entry: HistoryEntry) -> None:
        n = len(self._t)
        u32 = self._u32
        for key, v in entry.counters.items():
            col = u32.get(key)
            if col is not None and 0.0 <= v < _ABSENT and v == int(v):
                col.append(int(v))  # the common case, inline
            else:
                self._put(key, n, v)
        for col in u32.values():
            if len(col) == n:
                col.append(_ABSENT)
        for col in self._f64.values():
            if len(col) == n:
                col.append(_NAN)
        self._t.append(entry.t)
        self._s.append(_NAN if entry.sample is None else entry.sample)
        if self.maxlen is not None and len(self) > self.maxlen:
            self.popleft()

    def popleft(self) -> None:
        if not self:
            raise IndexError("pop from an empty history")
        self._start += 1
        if self._start >= 32 and self._start * 4 >= len(self._t):
            s = self._start  # drop the popped rows (amortized: a C copy now and then)
            self._t = self._t[s:]
            self._s = self._s[s:]
            for cols in (self._u32, self._f64):
                for key in cols:
                    cols[key] = cols[key][s:]
            self._start = 0

    # -- access without an entry per row (derive) ------------------------------------------
    def time(self, i: int) -> float:
        return self._t[self._row(i)]

    def times(self) -> array:
        """Entry times, oldest first (a copy)."""
        return self._t[self._start:]

    def value(self, i: int, key: AggKey) -> float | None:
        """One counter at entry ``i`` (None when the entry does not have it)."""
        r = self._row(i)
        col = self._u32.get(key)
        if col is not None:
            x = col[r]
            return None if x == _ABSENT else float(x)
        col = self._f64.get(key)
        if col is None:
            return None
        x = col[r]
        return None if x != x else x

    def samples_after(self, i: int) -> list[float]:
        """The interval samples of the entries after entry ``i`` (those that have one)."""
        return [x for x in self._s[self._start + i + 1:] if x == x]


@dataclass
class ModelHistory:
    """The ring of one model on one target, plus lifetime state the ring cannot hold."""

    model_name: str
    entries: HistoryRing
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

    def __post_init__(self) -> None:
        if not isinstance(self.entries, HistoryRing):  # e.g. a deque of entries
            self.entries = HistoryRing(self.entries, getattr(self.entries, "maxlen", None))

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


@dataclass(slots=True)
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

        # The aggregates an invalid series adds to are unknown at this poll.
        unknown: dict[str, set[AggKey]] = {}
        for model, signal, identity in page.invalid_counters:
            if signal == sources.ACCEPTED_PER_POSITION:
                position = dict(identity).get("position")
            elif signal in sources.BUCKET_SIGNALS:
                position = dict(identity).get("le")
            else:
                position = None
            unknown.setdefault(model, set()).add((signal, position))

        for model in page.models:
            hist = self.models.get(model)
            if hist is None:
                hist = ModelHistory(model, HistoryRing(maxlen=self.max_entries))
                self.models[model] = hist
            for agg_key, d in deltas.get(model, {}).items():
                hist.cumulative[agg_key] = hist.cumulative.get(agg_key, 0.0) + d
            bad = unknown.get(model, set())
            for agg_key in bad:
                hist.cumulative.setdefault(agg_key, 0.0)
            hist.configured_k = page.configured_k.get(model)
            hist.gauges = {s: v for (m, s), v in page.gauges.items() if m == model}
            hist.signals = frozenset(sig for (m, sig, _i) in page.counters if m == model) \
                | {sig for sig, _p in bad}
            hist.last_seen = t
            prev_entry = hist.entries[-1] if hist.entries else None
            counters = hist.cumulative  # copied into the ring's columns by append
            if bad:
                counters = {k: derive.UNKNOWN if k in bad else v for k, v in counters.items()}
            sample = None
            reads = poll_samples.interval_sample_reads(counters)
            # The interval's base: the newest entry where what the sample reads is known.
            base_entry = None
            for i in range(len(hist.entries) - 1, -1, -1):
                entry = hist.entries[i]
                if not any(entry.counters.get(k) == derive.UNKNOWN for k in reads):
                    base_entry = entry
                    break
            if prev_entry is not None and t > prev_entry.t and base_entry is not None \
                    and not any(k in bad for k in reads):
                sample = derive.interval_acceptance_rate(
                    base_entry.counters, counters, self.min_drafts_per_sample,
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
        while len(hist.entries) >= 2 and hist.entries.time(1) <= horizon:
            hist.entries.popleft()

    def _forget_stale(self, now: float) -> None:
        horizon = now - self.retention_seconds
        stale = [k for k, s in self._raw.items() if s.last_seen < horizon]
        for k in stale:
            del self._raw[k]
        for name in [m for m, h in self.models.items() if h.last_seen < horizon]:
            del self.models[name]
