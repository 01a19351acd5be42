"""The history ring read and written as a deque of entries, for tests.

The poll path reads and writes its ring as rows (:class:`specwatch.poll.windows.ring.HistoryRing`'s
row API). Tests build histories entry by entry and read them back as entries: these helpers
do that through the same public row API, so what they write is what the poll path reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from specwatch.poll.windows.ring import AggKey, HistoryRing


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """Cumulative, reset-corrected counters of one model at one successful poll.

    ``sample`` is the acceptance rate of the interval that ended at this poll, present only
    when the interval held at least ``min_drafts_per_sample`` drafts. A counter unknown at
    this poll holds :data:`specwatch.poll.windows.ring.UNKNOWN`. The ring stores entries as rows;
    these objects are made when a test reads one.
    """

    t: float
    counters: Mapping[AggKey, float]
    sample: float | None = None


def entry(ring: HistoryRing, i: int) -> HistoryEntry:
    """Entry ``i`` of any ring (a frozen view too): its time, the counters present at that
    poll and its sample."""
    values = ring.row(i).tolist()
    counters = {k: x for k, x in zip(ring.keys, values, strict=True) if x == x}
    sample = float(ring.sample_column()[i if i >= 0 else len(ring) + i])
    return HistoryEntry(ring.time(i), counters, sample if sample == sample else None)


def entries(ring: HistoryRing) -> list[HistoryEntry]:
    """Every live entry of a ring, oldest first."""
    return [entry(ring, i) for i in range(len(ring))]


def _vector(ring: HistoryRing, e: HistoryEntry) -> np.ndarray:
    for key in e.counters:
        ring.column_of(key)
    v = np.full(len(ring.keys), np.nan)
    for key, x in e.counters.items():
        v[ring.column_index(key)] = x
    return v


def append_entry(ring: HistoryRing, e: HistoryEntry) -> None:
    """Add ``e`` as the newest row (its new counters get columns)."""
    ring.append_row(e.t, _vector(ring, e), e.sample)


class EntryRing(HistoryRing):
    """A ring with the deque interface: ``len``, ``[i]``, iteration, ``append``,
    ``[-1] = entry``, ``popleft``."""

    __slots__ = ()

    def __init__(self, items: Iterable[HistoryEntry] = (), maxlen: int | None = None) -> None:
        super().__init__(maxlen=maxlen)
        for e in items:
            self.append(e)

    def __getitem__(self, i: int) -> HistoryEntry:
        return entry(self, i)

    def __setitem__(self, i: int, e: HistoryEntry) -> None:
        if i != -1:
            raise IndexError("only the newest entry can be replaced")
        # replace_last_row writes into new arrays (a frozen view keeps the old ones), so the
        # newest time and sample are then set in those.
        self.replace_last_row(_vector(self, e))
        self.times()[-1] = e.t
        self.sample_column()[-1] = np.nan if e.sample is None else e.sample

    def __iter__(self) -> Iterator[HistoryEntry]:
        for i in range(len(self)):
            yield entry(self, i)

    def append(self, e: HistoryEntry) -> None:
        append_entry(self, e)

    def popleft(self) -> None:
        if not self:
            raise IndexError("pop from an empty history")
        self.drop_oldest(1)
