"""Per target and model: a bounded ring of reset-corrected cumulative counters, in numpy.

Why a history of our own: windows are computed from the exporter's own polls, so every
Prometheus replica scraping the exporter sees the same values (scrape-to-scrape deltas would
split between HA replicas), and the time base is the exporter's poll clock, not the server's.
The clock is monotonic (:mod:`specwatch.poll.pipeline` stamps polls with it): a wall-clock
jump must not stretch or shrink a window.

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

How (issue 15): the raw state of every source series is a slot in three numpy arrays (value,
``_created``, last seen); a page's series are mapped to their slots and to their model's
aggregated columns once per *layout* (the list of series keys, the same from one poll to the
next on a steady server), so a poll is a handful of vector operations: deltas with the reset
rules, one ``bincount`` that sums them per (model, aggregated key) in page order (the same
additions, in the same order, as the dict walk it replaced), and one row appended per model.
The parsed page of an idle server (the same bytes, so the same page object) is not folded
again: its deltas are all 0, and each model's newest row is repeated.
The dict implementation is kept in ``tests/helpers/reference_history.py`` and the results are
checked equal on every fixture and property test.

Size: one module because the ring, the raw series state and the per-target bounds are one
data structure (the layout cache ties series slots to ring columns); split, each part would
need the others' internals.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from specwatch.poll import derive, sources

#: (canonical signal, position or bucket bound `le` or None): the key of an aggregated,
#: reset-corrected counter.
AggKey = tuple[str, str | None]

#: Upper bounds of the ``sd_acceptance_rate_samples`` histogram (owned by derive, which
#: builds the histogram; history counts samples into the same buckets).
SAMPLE_BUCKETS = derive.SAMPLE_BUCKETS


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """Cumulative, reset-corrected counters of one model at one successful poll.

    ``sample`` is the acceptance rate of the interval that ended at this poll, present only
    when the interval held at least ``min_drafts_per_sample`` drafts. A counter unknown at
    this poll holds :data:`UNKNOWN`. The history stores entries as rows
    (:class:`HistoryRing`) and makes these objects when they are read.
    """

    t: float
    counters: Mapping[AggKey, float]
    sample: float | None = None


_NAN = float("nan")
#: An unknown value (an invalid source counter added to it at this poll) as rows read it:
#: reset-corrected counters are never negative, so it cannot be a value.
UNKNOWN = -math.inf
#: An absent value in the uint32 matrix (counts stay below it; a larger one widens the column).
_ABSENT = 0xFFFFFFFF
#: An unknown value in the uint32 matrix.
_UNKNOWN = 0xFFFFFFFE
#: The counters the interval acceptance rate reads (all without position).
_SAMPLE_KEYS: tuple[AggKey, ...] = tuple((s, None) for s in (
    sources.DRAFTS, sources.DRAFT_TOKENS, sources.ACCEPTED_TOKENS, sources.VERIFY_CALLS,
    sources.GENERATION_TOKENS, sources.REQUESTS_FINISHED))


class HistoryRing:
    """The entries of one model as a ring of numpy rows, one column per aggregated counter.

    Why rows of arrays: a history holds one entry per poll per model for the retention period
    (an hour: 720 entries at 5 s) for every target, and an entry holds every counter read
    (vLLM: about 60 with the latency histogram buckets). Stored as rows of a matrix, an
    update is a few vector operations and a window is the difference of two rows, instead of
    a walk over dicts; memory is 4 bytes per whole-number count (a uint32 matrix, absent:
    0xFFFFFFFF) and 8 per other value (a float64 matrix, absent: NaN). A value that does not
    fit moves its column from the uint32 matrix to the float64 one for good. A value that is
    *unknown* at a poll (:data:`UNKNOWN`, -inf as rows read it; 0xFFFFFFFE in the uint32
    matrix) is not absent: the counter exists but an invalid source series added to it then.

    It behaves like the deque of :class:`HistoryEntry` it replaced (``len``, ``[i]``,
    iteration, ``append``, ``[-1] = entry``, ``popleft``, ``maxlen``); an entry read from
    it is a fresh :class:`HistoryEntry` whose ``counters`` hold the keys present at that
    poll. The poll path and :func:`specwatch.poll.derive.derive_model` use the row API
    (:meth:`row`, :meth:`append_row`, :meth:`column`, :attr:`keys`) instead.
    """

    __slots__ = ("_cap", "_cols", "_f", "_fc", "_n", "_s", "_start", "_t", "_u", "_uc",
                 "_where", "derive_cache", "keys", "maxlen")

    def __init__(self, entries: Iterable[HistoryEntry] = (), maxlen: int | None = None
                 ) -> None:
        self.maxlen = maxlen
        self._cap = 8
        self._t = np.empty(self._cap)
        self._s = np.empty(self._cap)
        self._u = np.empty((self._cap, 0), dtype=np.uint32)
        self._f = np.empty((self._cap, 0))
        #: Column of each key; the key of each column; per column (in the uint32 matrix?,
        #: index there); the columns held by each matrix, in matrix order.
        self._cols: dict[AggKey, int] = {}
        self.keys: list[AggKey] = []
        self._where: list[tuple[bool, int]] = []
        self._uc = np.empty(0, dtype=np.intp)
        self._fc = np.empty(0, dtype=np.intp)
        self._start = 0
        self._n = 0  # rows used: live rows are [_start, _n)
        #: What derive computed from the column set (it changes only when a key appears).
        self.derive_cache: object = None
        for e in entries:
            self.append(e)

    # -- the deque interface ---------------------------------------------------------------
    def __len__(self) -> int:
        return self._n - self._start

    def __bool__(self) -> bool:
        return self._n > self._start

    def _row(self, i: int) -> int:
        n = self._n - self._start
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("history index out of range")
        return self._start + i

    def __getitem__(self, i: int) -> HistoryEntry:
        r = self._row(i)
        row = self._read(r)
        counters = {k: x for k, x in zip(self.keys, row.tolist(), strict=True) if x == x}
        sample = float(self._s[r])
        return HistoryEntry(float(self._t[r]), counters, sample if sample == sample else None)

    def __setitem__(self, i: int, entry: HistoryEntry) -> None:
        if i != -1:
            raise IndexError("only the newest entry can be replaced")
        r = self._row(-1)
        self._own_storage()
        self._t[r] = entry.t
        self._s[r] = _NAN if entry.sample is None else entry.sample
        self._write(r, self._vector(entry.counters))

    def __iter__(self) -> Iterator[HistoryEntry]:
        for i in range(len(self)):
            yield self[i]

    def append(self, entry: HistoryEntry) -> None:
        self.append_row(entry.t, self._vector(entry.counters), entry.sample)

    def popleft(self) -> None:
        if not self:
            raise IndexError("pop from an empty history")
        self.drop_oldest(1)

    # -- the row interface -------------------------------------------------------------------
    def column_of(self, key: AggKey) -> int:
        """The column of ``key``, created (absent in every existing row) when new."""
        c = self._cols.get(key)
        if c is None:
            c = len(self.keys)
            self._cols[key] = c
            self.keys.append(key)
            self._where.append((True, self._u.shape[1]))
            self._u = np.concatenate(
                (self._u, np.full((self._cap, 1), _ABSENT, dtype=np.uint32)), axis=1)
            self._uc = np.append(self._uc, c)
        return c

    def column_index(self, key: AggKey) -> int | None:
        """The column of ``key``, None when the ring has none."""
        return self._cols.get(key)

    def frozen(self) -> HistoryRing:
        """The live entries as they are now, read-only, for reading later (issue 15: a
        snapshot's models are derived when first read, after more polls may have changed
        this ring). It shares this ring's storage instead of copying it: the ring never
        writes to a row once another row follows it, and a compaction or a change of the
        newest row writes into new arrays (:meth:`_own_storage`), so the rows a view reads
        keep their values. A view keeps its arrays alive until it is let go."""
        view = _FrozenRing.__new__(_FrozenRing)
        view._origin = self
        view.maxlen = None
        view._cap = self._cap
        view._t, view._s, view._u, view._f = self._t, self._s, self._u, self._f
        view._cols = dict(self._cols)
        view.keys = list(self.keys)
        view._where = list(self._where)
        view._uc, view._fc = self._uc, self._fc
        view._start, view._n = self._start, self._n
        return view

    def append_row(self, t: float, values: np.ndarray, sample: float | None) -> None:
        """Append one row; ``values`` has one value per column (NaN: absent), and may be
        shorter than the column count (the missing columns are absent)."""
        if self._n == self._cap:
            self._make_room()
        r = self._n
        self._n += 1
        self._t[r] = t
        self._s[r] = _NAN if sample is None else sample
        self._write(r, values)
        if self.maxlen is not None and len(self) > self.maxlen:
            self.drop_oldest(1)

    def repeat_last_row(self, t: float) -> None:
        """Append a row holding the newest row's counters, copied as stored (no conversion:
        the row an unchanged page would write), with no sample."""
        if self._n == self._cap:
            self._make_room()
        r = self._n
        self._n += 1
        self._t[r] = t
        self._s[r] = _NAN
        self._u[r] = self._u[r - 1]
        self._f[r] = self._f[r - 1]
        if self.maxlen is not None and len(self) > self.maxlen:
            self.drop_oldest(1)

    def replace_last_row(self, values: np.ndarray) -> None:
        """Overwrite the counters of the newest row (time and sample kept): in new arrays,
        as a view taken before may read that row (:meth:`frozen`)."""
        r = self._row(-1)
        self._own_storage()
        self._write(r, values)

    def drop_oldest(self, n: int) -> None:
        """Forget the ``n`` oldest rows (their space is reused when the ring fills)."""
        self._start += min(n, self._n - self._start)

    def row(self, i: int) -> np.ndarray:
        """Entry ``i`` as one float64 value per column (NaN: absent); a new array."""
        return self._read(self._row(i))

    def rows(self, idx: Sequence[int]) -> np.ndarray:
        """Entries ``idx`` as a (len(idx), columns) float64 matrix (NaN: absent)."""
        r = np.asarray(idx, dtype=np.intp) + self._start
        out = np.empty((len(r), len(self.keys)))
        if len(self._uc):
            out[:, self._uc] = _as_float(self._u[r])
        if len(self._fc):
            out[:, self._fc] = self._f[r]
        return out

    def column(self, key: AggKey) -> np.ndarray | None:
        """One counter over the live entries (NaN: absent), or None for an unknown key."""
        c = self._cols.get(key)
        if c is None:
            return None
        in_u, j = self._where[c]
        if in_u:
            return _as_float(self._u[self._start:self._n, j])
        return self._f[self._start:self._n, j].copy()

    def time(self, i: int) -> float:
        return float(self._t[self._row(i)])

    def times(self) -> np.ndarray:
        """Entry times, oldest first (a view: valid until the next change)."""
        return self._t[self._start:self._n]

    def sample_column(self) -> np.ndarray:
        """Interval samples of the live entries (NaN: none), a view."""
        return self._s[self._start:self._n]

    def value(self, i: int, key: AggKey) -> float | None:
        """One counter at entry ``i`` (None when the entry does not have it)."""
        r = self._row(i)
        c = self._cols.get(key)
        if c is None:
            return None
        in_u, j = self._where[c]
        if in_u:
            x = int(self._u[r, j])
            return None if x == _ABSENT else UNKNOWN if x == _UNKNOWN else float(x)
        y = float(self._f[r, j])
        return None if y != y else y

    def samples_after(self, i: int) -> list[float]:
        """The interval samples of the entries after entry ``i`` (those that have one)."""
        s = self._s[self._start + i + 1:self._n]
        return s[s == s].tolist()

    # -- storage -----------------------------------------------------------------------------
    def _vector(self, counters: Mapping[AggKey, float]) -> np.ndarray:
        for key in counters:
            self.column_of(key)
        v = np.full(len(self.keys), _NAN)
        for key, x in counters.items():
            v[self._cols[key]] = x
        return v

    def _make_room(self) -> None:
        live = self._n - self._start
        if self._start >= max(8, live // 32):
            # Drop the popped rows (amortized: one copy of the live rows per ``_start``
            # pops, at most 32 row copies a pop), into new arrays: a view taken before
            # (:meth:`frozen`) still reads the old ones.
            s = self._start
            self._t, self._s, self._u, self._f = (
                _moved(a, s, self._n) for a in (self._t, self._s, self._u, self._f))
            self._start, self._n = 0, live
            return
        # Small steps: a full ring of a long-running exporter holds its retention plus
        # at most about 1/16 + 1/32 spare rows (it was up to 1/4 + 1/8 with 5/4 steps).
        cap = max(self._cap + 8, self._cap * 17 // 16)
        self._t = _grow(self._t, cap)
        self._s = _grow(self._s, cap)
        self._u = _grow(self._u, cap)
        self._f = _grow(self._f, cap)
        self._cap = cap

    def _own_storage(self) -> None:
        """New arrays with the same rows, before a row is written in place."""
        self._t, self._s, self._u, self._f = (
            a.copy() for a in (self._t, self._s, self._u, self._f))

    def _read(self, r: int) -> np.ndarray:
        out = np.empty(len(self.keys))
        if len(self._uc):
            out[self._uc] = _as_float(self._u[r])
        if len(self._fc):
            out[self._fc] = self._f[r]
        return out

    def _write(self, r: int, values: np.ndarray) -> None:
        n = len(self.keys)
        if len(values) < n:
            values = np.concatenate((values, np.full(n - len(values), _NAN)))
        if len(self._uc):
            u = values[self._uc]
            absent = u != u
            unknown = u == UNKNOWN
            fits = absent | unknown | ((u >= 0.0) & (u < _UNKNOWN) & (u == np.floor(u)))
            if not fits.all():
                for c in self._uc[~fits].tolist():
                    self._widen(c)
                u = values[self._uc]
                absent = u != u
                unknown = u == UNKNOWN
            self._u[r] = np.where(absent, _ABSENT, np.where(unknown, _UNKNOWN, u)
                                  ).astype(np.uint32)
        if len(self._fc):
            self._f[r] = values[self._fc]

    def _widen(self, c: int) -> None:
        """Move column ``c`` from the uint32 matrix to the float64 one (for good)."""
        _in_u, j = self._where[c]
        col = _as_float(self._u[:, j])
        self._f = np.concatenate((self._f, col[:, None]), axis=1)
        self._fc = np.append(self._fc, c)
        self._where[c] = (False, self._f.shape[1] - 1)
        self._u = np.delete(self._u, j, axis=1)
        self._uc = np.delete(self._uc, j)
        for k, col_index in enumerate(self._uc.tolist()):
            self._where[col_index] = (True, k)


def _as_float(u: np.ndarray) -> np.ndarray:
    """uint32 counts as float64: absent NaN, unknown :data:`UNKNOWN`."""
    out = u.astype(np.float64)
    out[u == _ABSENT] = _NAN
    out[u == _UNKNOWN] = UNKNOWN
    return out


def _grow(a: np.ndarray, rows: int) -> np.ndarray:
    out = np.empty((rows, *a.shape[1:]), dtype=a.dtype)
    out[:len(a)] = a
    return out


def _moved(a: np.ndarray, start: int, stop: int) -> np.ndarray:
    """A new array of ``a``'s shape whose first rows are ``a[start:stop]``."""
    out = np.empty_like(a)
    out[:stop - start] = a[start:stop]
    return out


class _FrozenRing(HistoryRing):
    """A read-only view of a ring's live entries at one poll (:meth:`HistoryRing.frozen`).

    Reads work as on the ring; every change raises. ``derive_cache`` is the ring's own
    (what derive plans from a key set holds for every row that has those keys)."""

    __slots__ = ("_origin",)

    @property  # type: ignore[override]
    def derive_cache(self) -> object:
        return self._origin.derive_cache

    @derive_cache.setter
    def derive_cache(self, value: object) -> None:
        self._origin.derive_cache = value

    def _read_only(self, *_args: object) -> None:
        raise TypeError("a frozen history ring cannot change")

    append_row = repeat_last_row = replace_last_row = _read_only  # type: ignore[assignment]
    drop_oldest = column_of = __setitem__ = _read_only  # type: ignore[assignment]


@dataclass
class ModelHistory:
    """The ring of one model on one target, plus lifetime state the ring cannot hold."""

    model_name: str
    entries: HistoryRing
    sample_bucket_counts: list[int] = field(
        default_factory=lambda: [0] * (len(SAMPLE_BUCKETS) + 1))
    sample_sum: float = 0.0
    sample_count: int = 0
    configured_k: int | None = None
    gauges: dict[str, float] = field(default_factory=dict)
    last_seen: float = -math.inf
    #: Canonical counter signals on the latest page (e.g. whether SD families are present).
    signals: frozenset[str] = frozenset()
    #: Reset-corrected cumulative value of each column of ``entries`` (the newest row).
    cum: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        if not isinstance(self.entries, HistoryRing):  # e.g. a deque of entries
            self.entries = HistoryRing(self.entries, getattr(self.entries, "maxlen", None))

    @property
    def cumulative(self) -> dict[AggKey, float]:
        """Every counter seen so far and its reset-corrected cumulative value."""
        return dict(zip(self.entries.keys, self.cum.tolist(), strict=False))

    def frozen(self) -> ModelHistory:
        """This model as it is now, for a snapshot derived when first read (what
        :func:`specwatch.poll.derive.derive_model` reads): the ring read-only and
        shared (:meth:`HistoryRing.frozen`), what changes in place copied (the sample
        buckets, ``cum``); ``gauges`` and ``signals`` are replaced by a poll, never changed."""
        return ModelHistory(self.model_name, self.entries.frozen(),
                            list(self.sample_bucket_counts), self.sample_sum,
                            self.sample_count, self.configured_k, self.gauges,
                            self.last_seen, self.signals, self.cum.copy())

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

    ``max_models`` caps the models a target may hold at once (issue 17: a target that renames
    its models every poll must not grow the exporter without bound): live models (on the
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
        #: ring's columns (vLLM: about 60 of 80), so the pipeline turns this off (issue 15).
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
                self._value = _grow(self._value, cap)
                self._created = _grow(self._created, cap)
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
        """The acceptance rate of the interval from the newest row to ``hist.cum``; None
        when a counter it reads is unknown at either end (``unknown``: at this poll)."""
        base = {k: x for k in _SAMPLE_KEYS if (x := ring.value(-1, k)) is not None}
        cur = {k: float(hist.cum[c]) for k in _SAMPLE_KEYS
               if (c := ring.column_index(k)) is not None and c < len(hist.cum)}
        for k in derive.interval_sample_reads(cur):
            if k in unknown or base.get(k) == UNKNOWN:
                return None
        return derive.interval_acceptance_rate(
            base, cur, self.min_drafts_per_sample,
            proposed_per_verify=derive.sglang_proposed_per_verify(hist.gauges,
                                                                  hist.configured_k))

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

    # -- bounds (issue 17) -----------------------------------------------------------------
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
