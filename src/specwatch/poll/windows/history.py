"""Per target: the fold of each parsed page into its models' histories, with the reset rules.

Why a history of our own: windows are computed from the exporter's own polls, so every
Prometheus replica scraping the exporter sees the same values (scrape-to-scrape deltas would
split between HA replicas), and the time base is the exporter's poll clock, not the server's.
The clock is monotonic (:mod:`specwatch.poll.pipeline` stamps polls with it): a wall-clock
jump must not stretch or shrink a window.

Owns the raw state of every source series (value, ``_created``, last seen: slots in numpy
arrays), the reset rules applied PER SERIES before anything is summed (docs/exporter.md,
"Counter resets"), the per-model sums appended as one row per poll to each model's ring
(:mod:`specwatch.poll.windows.ring`), the per-poll acceptance-rate sample, and the bounds on the
models a target may hold. How the fold is vectorised: docs/performance.md, "History, derive
and exposition"; the dict implementation it is checked against is
``tests/helpers/reference_history.py``.

Invariant: a poll that saw at least one restarted series counts once in ``resets_total``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container
from dataclasses import dataclass, field

import numpy as np

from specwatch.engines import registry
from specwatch.poll import sources
from specwatch.poll.windows.ring import UNKNOWN, AggKey, HistoryRing, ModelHistory, grow_rows
from specwatch.poll.windows.samples import (
    SAMPLE_KEYS,
    interval_acceptance_rate,
    interval_sample_reads,
)

_NAN = float("nan")


@dataclass
class _Layout:
    """How the series of one page layout (a list of series keys) map onto the state."""

    keys: list[sources.SeriesKey]
    slots: np.ndarray  # raw-state slot of each series
    agg_of: np.ndarray  # aggregate id of each series
    #: model -> (aggregate ids, their keys); filled with ring columns per ModelHistory.
    models: dict[str, tuple[np.ndarray, list[AggKey]]]
    signals: dict[str, frozenset[str]]
    n_agg: int
    #: model -> (the ModelHistory the columns are for, its ring columns of the aggregates).
    columns: dict[str, tuple[ModelHistory, np.ndarray]] = field(default_factory=dict)
    created_keys: list[sources.SeriesKey] | None = None
    created_index: np.ndarray | None = None  # series index of each created sample (-1: none)


#: Called with (model name, reason) when a target's history forgets a model.
ForgetHook = Callable[[str, str], None]


class TargetHistory:
    """All models of one target. Not thread-safe: one poll of a target at a time updates it.

    ``max_models`` caps the models a target may hold at once (a target that renames its
    models every poll must not grow the exporter without bound): live models (on the
    latest page) beyond the cap are not taken in (reason ``max_models``, kept models first,
    then name order), and remembered models that vanished are forgotten oldest first when
    live plus vanished would pass ``max_models + max_vanished_models`` (reason
    ``vanished_limit``), as well as after the retention (reason ``retention``, not counted as
    a drop). ``dropped`` counts the models dropped by reason; ``on_forget`` hooks are called
    for every forgotten model.
    """

    def __init__(self, retention_seconds: float, max_entries: int,
                 min_drafts_per_sample: float, max_models: int | None = None,
                 max_vanished_models: int | None = None) -> None:
        self.retention_seconds = float(retention_seconds)
        self.max_entries = int(max_entries)
        self.min_drafts_per_sample = float(min_drafts_per_sample)
        self.max_models = max_models
        self.max_vanished_models = max_vanished_models if max_vanished_models is not None \
            else max_models
        #: Keep the latency histograms' bucket counters in the rings? Only the windows'
        #: histograms read them (a controller, A/B pairs); without those they are most of a
        #: ring's columns (vLLM: about 60 of 80), so the pipeline turns this off.
        #: Their series still take part in the reset rules (``resets_total`` is unchanged).
        self._keep_buckets = True
        self.models: dict[str, ModelHistory] = {}
        self.resets_total = 0
        self.present_models: frozenset[str] = frozenset()
        self.engine: str = "unknown"
        self.dropped: dict[str, int] = {"max_models": 0, "vanished_limit": 0}
        self.on_forget: list[ForgetHook] = []
        self._process_start: float | None = None
        self._polled_once = False
        # Raw state per source series slot (see the module docstring).
        self._slot: dict[sources.SeriesKey, int] = {}
        self._slot_keys: list[sources.SeriesKey | None] = []
        self._free: list[int] = []
        self._value = np.zeros(0)
        self._created = np.zeros(0)
        self._seen = np.zeros(0)  # -inf: a free slot
        self._model_slots: dict[str, set[int]] = {}
        self._layout: _Layout | None = None
        #: The page last folded and its layout, when folding it again changes no counter
        #: (see :meth:`update`); None otherwise.
        self._repeat: tuple[sources.ParsedPage, _Layout] | None = None

    @property
    def keep_buckets(self) -> bool:
        return self._keep_buckets

    @keep_buckets.setter
    def keep_buckets(self, keep: bool) -> None:
        """Set before the first poll: rings made earlier keep the columns they have."""
        if keep != self._keep_buckets:
            self._keep_buckets = keep
            self._layout = None

    # -- raw state slots -------------------------------------------------------------------
    def _slot_for(self, key: sources.SeriesKey) -> int:
        s = self._slot.get(key)
        if s is not None:
            return s
        if self._free:
            s = self._free.pop()
            self._slot_keys[s] = key
        else:
            s = len(self._slot_keys)
            self._slot_keys.append(key)
            if s >= len(self._seen):
                cap = max(64, 2 * len(self._seen))
                self._value = grow_rows(self._value, cap)
                self._created = grow_rows(self._created, cap)
                self._value[s:] = 0.0
                self._created[s:] = _NAN
                seen = np.full(cap, -math.inf)
                seen[:len(self._seen)] = self._seen
                self._seen = seen
        self._seen[s] = -math.inf
        self._slot[key] = s
        self._model_slots.setdefault(key[0], set()).add(s)
        return s

    def _free_slot(self, s: int) -> None:
        key = self._slot_keys[s]
        if key is None:
            return
        del self._slot[key]
        mine = self._model_slots.get(key[0])
        if mine is not None:
            mine.discard(s)
            if not mine:
                del self._model_slots[key[0]]
        self._slot_keys[s] = None
        self._seen[s] = -math.inf
        self._free.append(s)

    def _layout_for(self, page: sources.ParsedPage) -> _Layout:
        keys = list(page.counters)
        lay = self._layout
        if lay is None or lay.keys != keys:
            lay = self._new_layout(keys)
            self._layout = lay
        if page.created:
            ckeys = list(page.created)
            if lay.created_keys != ckeys:
                index = {k: i for i, k in enumerate(keys)}
                lay.created_keys = ckeys
                lay.created_index = np.fromiter((index.get(k, -1) for k in ckeys),
                                                dtype=np.intp, count=len(ckeys))
        return lay

    def _new_layout(self, keys: list[sources.SeriesKey]) -> _Layout:
        slots = np.fromiter((self._slot_for(k) for k in keys), dtype=np.intp, count=len(keys))
        agg_index: dict[tuple[str, AggKey], int] = {}
        agg_of = np.empty(len(keys), dtype=np.intp)
        signals: dict[str, set[str]] = {}
        skip = not self._keep_buckets
        unused: list[int] = []  # series whose deltas go to no ring column
        for i, (model, signal, identity) in enumerate(keys):
            if skip and signal in sources.BUCKET_SIGNALS:
                unused.append(i)
                signals.setdefault(model, set()).add(signal)
                continue
            if signal == sources.ACCEPTED_PER_POSITION:
                position = dict(identity).get("position")
            elif signal in sources.BUCKET_SIGNALS:
                position = dict(identity).get("le")
            else:
                position = None
            agg_of[i] = agg_index.setdefault((model, (signal, position)), len(agg_index))
            signals.setdefault(model, set()).add(signal)
        n_agg = len(agg_index)
        if unused:  # one extra aggregate, read by no model
            agg_of[unused] = n_agg
            n_agg += 1
        per_model: dict[str, tuple[list[int], list[AggKey]]] = {}
        for (model, agg_key), a in agg_index.items():
            ids, aks = per_model.setdefault(model, ([], []))
            ids.append(a)
            aks.append(agg_key)
        return _Layout(keys, slots, agg_of,
                       {m: (np.array(ids, dtype=np.intp), aks)
                        for m, (ids, aks) in per_model.items()},
                       {m: frozenset(s) for m, s in signals.items()}, n_agg)

    # -- one poll --------------------------------------------------------------------------
    def update(self, page: sources.ParsedPage, t: float) -> bool:
        """Fold one successfully parsed page taken at poll time ``t`` (monotonic seconds).

        Returns True when this poll detected a counter reset (and counted it).

        The page object folded last time, folded again (the pipeline hands the same parsed
        page back when a server sends identical bytes: an idle server), changes no counter:
        every delta is 0. Then the fold is skipped and each model's newest row is repeated
        as stored (:meth:`HistoryRing.repeat_last_row`); the windows still move on. This
        holds only while nothing changed the raw state since that fold (any forgetting
        drops the layout) and the page's counters are finite (``inf - inf`` is NaN), which
        ``_repeat`` records; the results equal a full fold's (tests/poll/test_history_repeat.py).
        """
        src = page
        page = self._cap_models(page)
        whole_restart = (
            self._process_start is not None and page.process_start_time is not None
            and abs(page.process_start_time - self._process_start) > 1e-6)
        if page.process_start_time is not None:
            self._process_start = page.process_start_time

        repeat = self._repeat
        models = page.models
        if repeat is not None and repeat[0] is src and repeat[1] is self._layout \
                and not whole_restart:
            lay = repeat[1]
            self._seen[lay.slots] = t
            reset_seen = False
            for model in models:
                hist = self.models[model]
                hist.last_seen = t
                ring = hist.entries
                if not ring:
                    ring.append_row(t, hist.cum, None)
                elif t > ring.time(-1):
                    # No counter moved, so the interval had no drafts and no sample.
                    ring.repeat_last_row(t)
                self._prune(hist, t)
        else:
            lay = self._layout_for(page)
            reset_seen, agg, finite = self._fold(page, lay, t, whole_restart)
            self._repeat = (src, lay) if finite else None
            if reset_seen:
                self.resets_total += 1
            self._fold_models(page, lay, t, agg)

        self.present_models = models
        self.engine = page.engine
        self._polled_once = True
        # Every raw state slot and every model was seen at t: none can be stale (the usual
        # poll: the same series as last time), so the search for stale ones is skipped.
        self._forget_stale(t, all_seen=len(self._slot) == len(lay.slots)
                           and len(self.models) == len(models))
        return reset_seen

    def _fold(self, page: sources.ParsedPage, lay: _Layout, t: float, whole_restart: bool
              ) -> tuple[bool, np.ndarray, bool]:
        """Deltas of every series with the reset rules, summed per model and aggregated key;
        the raw state moves to this page. Returns whether a series restarted, the sums, and
        whether every counter is finite (then folding this page again changes nothing)."""
        n = len(lay.keys)
        values = np.fromiter(page.counters.values(), dtype=np.float64, count=n)
        created = np.full(n, _NAN)
        if page.created and lay.created_index is not None:
            cv = np.fromiter(page.created.values(), dtype=np.float64,
                             count=len(lay.created_index))
            ok = lay.created_index >= 0
            created[lay.created_index[ok]] = cv[ok]
        slots = lay.slots
        known = self._seen[slots] != -math.inf
        prev = self._value[slots]
        prev_created = self._created[slots]
        with np.errstate(invalid="ignore", over="ignore"):  # free slots hold stale values
            restarted = known & (whole_restart | (values < prev)
                                 | (np.abs(created - prev_created) > 1e-6))
            deltas = np.where(known, np.where(restarted, values, values - prev), 0.0)
        self._value[slots] = values
        self._created[slots] = created
        self._seen[slots] = t
        agg = np.bincount(lay.agg_of, weights=deltas, minlength=lay.n_agg) if n \
            else np.zeros(0)
        return bool(restarted.any()), agg, bool(np.isfinite(values).all())

    def _fold_models(self, page: sources.ParsedPage, lay: _Layout, t: float,
                     agg: np.ndarray) -> None:
        """Add each model's summed deltas to its cumulative counters and append its row."""
        gauges: dict[str, dict[str, float]] = {}
        for (m, s), v in page.gauges.items():
            gauges.setdefault(m, {})[s] = v
        unknown = self._unknown(page)
        for model in page.models:
            hist = self.models.get(model)
            if hist is None:
                hist = ModelHistory(model, HistoryRing(maxlen=self.max_entries))
                self.models[model] = hist
            ring = hist.entries
            mine = lay.models.get(model)
            if mine is not None:
                cached = lay.columns.get(model)
                if cached is None or cached[0] is not hist:
                    cols = np.fromiter((ring.column_of(k) for k in mine[1]), dtype=np.intp,
                                       count=len(mine[1]))
                    lay.columns[model] = (hist, cols)
                else:
                    cols = cached[1]
                if len(hist.cum) < len(ring.keys):
                    hist.cum = np.concatenate((hist.cum, np.zeros(len(ring.keys)
                                                                  - len(hist.cum))))
                hist.cum[cols] += agg[mine[0]]
            bad = unknown.get(model)
            row = hist.cum
            if bad:
                # The aggregates an invalid series adds to are unknown in this row (their
                # cumulative value lacks that series' increase until its next valid value).
                bad_cols = [ring.column_of(k) for k in bad]
                if len(hist.cum) < len(ring.keys):
                    hist.cum = np.concatenate((hist.cum, np.zeros(len(ring.keys)
                                                                  - len(hist.cum))))
                row = hist.cum.copy()
                row[bad_cols] = UNKNOWN
            hist.configured_k = page.configured_k.get(model)
            hist.gauges = gauges.get(model, {})
            hist.signals = lay.signals.get(model, frozenset())
            if bad:
                hist.signals = hist.signals | {k[0] for k in bad}
            hist.last_seen = t
            if ring:
                if t > ring.time(-1):
                    sample = self._sample(hist, ring, bad or ())
                    if sample is not None:
                        hist.observe_sample(sample)
                    ring.append_row(t, row, sample)
                else:
                    # The clock did not advance: fold into the last entry instead of
                    # creating a zero-length interval.
                    ring.replace_last_row(row)
            else:
                ring.append_row(t, row, None)
            self._prune(hist, t)

    def _unknown(self, page: sources.ParsedPage) -> dict[str, set[AggKey]]:
        """The aggregates (per model) that an invalid series of ``page`` adds to."""
        out: dict[str, set[AggKey]] = {}
        for model, signal, identity in page.invalid_counters:
            if signal in sources.BUCKET_SIGNALS:
                if not self._keep_buckets:
                    continue
                position = dict(identity).get("le")
            elif signal == sources.ACCEPTED_PER_POSITION:
                position = dict(identity).get("position")
            else:
                position = None
            out.setdefault(model, set()).add((signal, position))
        return out

    def _sample(self, hist: ModelHistory, ring: HistoryRing, unknown: Container[AggKey]
                ) -> float | None:
        """The acceptance rate of the interval from the newest row where the counters it
        reads are known to ``hist.cum`` (a row with one unknown is skipped, as a failed poll
        would be); None when one is unknown at this poll (``unknown``) or in every row."""
        cur = {k: float(hist.cum[c]) for k in SAMPLE_KEYS
               if (c := ring.column_index(k)) is not None and c < len(hist.cum)}
        reads = interval_sample_reads(cur)
        if any(k in unknown for k in reads):
            return None
        for i in range(-1, -len(ring) - 1, -1):
            base = {k: x for k in SAMPLE_KEYS if (x := ring.value(i, k)) is not None}
            if not any(base.get(k) == UNKNOWN for k in reads):
                break
        else:
            return None
        return interval_acceptance_rate(
            base, cur, self.min_drafts_per_sample,
            proposed_per_verify=registry.proposed_per_verify(hist.gauges, hist.configured_k))

    def _prune(self, hist: ModelHistory, now: float) -> None:
        # Keep one entry at or before now - retention: it is the base of the longest window.
        ring = hist.entries
        cutoff = now - self.retention_seconds
        n = len(ring)
        # Entries whose time is at most the cutoff: usually none (a young history) or two
        # (a full one, one poll later), read from the first three times instead of a search.
        if n < 2 or ring.time(1) > cutoff:
            return
        if n == 2 or ring.time(2) > cutoff:
            k = 2
        else:
            k = int(np.searchsorted(ring.times(), cutoff, side="right"))
        drop = min(k, n) - 1
        if drop > 0:
            ring.drop_oldest(drop)

    def _forget_stale(self, now: float, all_seen: bool = False) -> None:
        """Forget the series and models unseen for the retention; ``all_seen``: this poll
        saw every live series slot and model, so there are none."""
        if all_seen:
            return
        horizon = now - self.retention_seconds
        seen = self._seen[:len(self._slot_keys)]
        stale = np.flatnonzero((seen < horizon) & (seen != -math.inf))
        if len(stale):
            for s in stale.tolist():
                self._free_slot(s)
            self._layout = None
        for name in [m for m, h in self.models.items() if h.last_seen < horizon]:
            self.forget(name, "retention")

    # -- bounds ----------------------------------------------------------------------------
    def forget(self, name: str, reason: str) -> None:
        """Forget one model (history and its series' raw state) and tell the hooks."""
        if self.models.pop(name, None) is None:
            return
        for s in list(self._model_slots.get(name, ())):
            self._free_slot(s)
        self._layout = None
        if reason in self.dropped:
            self.dropped[reason] += 1
        for hook in self.on_forget:
            hook(name, reason)

    def _cap_models(self, page: sources.ParsedPage) -> sources.ParsedPage:
        """Apply ``max_models`` to the page and make room among vanished models."""
        if self.max_models is None:
            return page
        models = page.models
        if len(models) > self.max_models:
            ordered = sorted(models, key=lambda m: (m not in self.models, m))
            keep = frozenset(ordered[:self.max_models])
            self.dropped["max_models"] += len(models) - len(keep)
            page = page.only_models(keep)
            models = keep
        # Live plus remembered models can pass the cap only when both counts together do.
        if len(self.models) + len(models) > self._model_limit():
            self._forget_vanished(models)
        return page

    def _model_limit(self) -> int:
        return (self.max_models or 0) + (self.max_vanished_models or 0)

    def _forget_vanished(self, models: frozenset[str]) -> None:
        """Forget the oldest remembered models beyond the cap on live plus remembered ones."""
        extra = len(self.models.keys() | models) - self._model_limit()
        if extra > 0:
            vanished = sorted((h.last_seen, m) for m, h in self.models.items()
                              if m not in models)
            for _seen, name in vanished[:extra]:
                self.forget(name, "vanished_limit")
