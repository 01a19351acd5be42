"""The stored history of one model: a bounded ring of its reset-corrected cumulative
counters (one numpy row per poll), and the lifetime state the ring cannot hold.

Owns the storage layout (a uint32 matrix for whole-number counts, a float64 one for the
rest; absent and unknown values marked in each), the read-only frozen view a snapshot
derives from, and the lifetime histogram of the per-poll acceptance-rate samples.

Invariants: entry times strictly increase; a row is never written once another follows it
(a change of the newest row or a compaction writes new arrays), so a frozen view reads the
values it was taken with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specwatch.poll.formulas import SAMPLE_BUCKETS, sample_bucket

#: (canonical signal, position or bucket bound `le` or None): the key of an aggregated,
#: reset-corrected counter.
AggKey = tuple[str, str | None]


_NAN = float("nan")
#: An unknown value (an invalid source counter added to it at this poll) as rows read it:
#: reset-corrected counters are never negative, so it cannot be a value.
UNKNOWN = -math.inf
#: An absent value in the uint32 matrix (counts stay below it; a larger one widens the column).
_ABSENT = 0xFFFFFFFF
#: An unknown value in the uint32 matrix.
_UNKNOWN = 0xFFFFFFFE


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

    It is read and written as rows (:meth:`row`, :meth:`append_row`, :meth:`column`,
    :attr:`keys`); ``len`` is the number of live entries, at most ``maxlen``.
    """

    __slots__ = ("_cap", "_cols", "_f", "_fc", "_n", "_s", "_start", "_t", "_u", "_uc",
                 "_where", "derive_cache", "keys", "maxlen")

    def __init__(self, maxlen: int | None = None) -> None:
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
        """The live entries as they are now, read-only, for reading later (a
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
        # at most about 1/16 + 1/32 spare rows.
        cap = max(self._cap + 8, self._cap * 17 // 16)
        self._t = grow_rows(self._t, cap)
        self._s = grow_rows(self._s, cap)
        self._u = grow_rows(self._u, cap)
        self._f = grow_rows(self._f, cap)
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


def grow_rows(a: np.ndarray, rows: int) -> np.ndarray:
    """A new array of ``rows`` rows whose first rows are ``a`` (the rest uninitialised)."""
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
    drop_oldest = column_of = _read_only  # type: ignore[assignment]



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

    @property
    def cumulative(self) -> dict[AggKey, float]:
        """Every counter seen so far and its reset-corrected cumulative value."""
        return dict(zip(self.entries.keys, self.cum.tolist(), strict=False))

    def frozen(self) -> ModelHistory:
        """This model as it is now, for a snapshot derived when first read (what
        :func:`specwatch.poll.windows.derive.derive_model` reads): the ring read-only and
        shared (:meth:`HistoryRing.frozen`), what changes in place copied (the sample
        buckets, ``cum``); ``gauges`` and ``signals`` are replaced by a poll, never changed."""
        return ModelHistory(self.model_name, self.entries.frozen(),
                            list(self.sample_bucket_counts), self.sample_sum,
                            self.sample_count, self.configured_k, self.gauges,
                            self.last_seen, self.signals, self.cum.copy())

    def observe_sample(self, value: float) -> None:
        """Add one interval acceptance rate to the lifetime histogram."""
        self.sample_bucket_counts[sample_bucket(value)] += 1
        self.sample_sum += value
        self.sample_count += 1


