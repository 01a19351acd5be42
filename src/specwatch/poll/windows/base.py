"""Where each window starts: the base entry of the time windows and of the count window.

Time windows use the newest entry at or before ``now - W`` as base (the oldest entry while
the history is shorter than W, so a fresh exporter shows partial windows, like PromQL's
``rate()`` over a young series). The count window ``"<N>req"`` uses the newest entry at
least N finished requests back; it is absent until the history holds N finished requests.

Functions take the ring's columns (entry times, one counter), never entries, and give row
indices.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Sequence

import numpy as np

from specwatch.poll.windows.ring import UNKNOWN


def time_base_indices(times: Sequence[float], seconds: Sequence[float]) -> list[int | None]:
    """For each window length, the index of the newest entry at or before
    ``times[-1] - seconds`` (0 when none is); None for every window with fewer than two
    entries."""
    if len(times) < 2:
        return [None] * len(seconds)
    # Entry times strictly increase (history folds a poll that does not advance the clock).
    # The targets in floats (the same operations as on a float64 array) and the array's
    # method: a few windows, where numpy's per-call costs exceed the arithmetic.
    times = np.asarray(times)
    t = times.item(-1)
    idx = times.searchsorted([t - float(s) + 1e-9 for s in seconds], side="right")
    return [max(0, i - 1) for i in idx.tolist()]


def count_base_index(column: Sequence[float], n_requests: int) -> int | None:
    """Newest index with at least ``n_requests`` finished requests after it (``column``: the
    cumulative finished requests per entry, NaN or 0 where absent, the newest present).

    An absent value counts as 0 (and ±inf as the largest finite float, like
    ``np.nan_to_num``): only the entries the binary search reads are converted, not the
    whole column on every poll.
    """
    if len(column) < 2:
        return None

    get = column.item if isinstance(column, np.ndarray) else column.__getitem__

    def value(i: int) -> float:
        v = float(get(i))
        if v != v:
            return 0.0
        return v if abs(v) != math.inf else math.copysign(sys.float_info.max, v)

    newest = value(-1)
    # Reset-corrected cumulative counters never decrease, so "at least n requests after it"
    # holds for a prefix of the entries: binary search for its last one.
    lo, hi = 0, len(column) - 1  # the answer is in [lo, hi) or absent
    if not newest - value(0) >= n_requests:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if newest - value(mid) >= n_requests:
            lo = mid
        else:
            hi = mid
    return lo


def count_base_index_known(column: np.ndarray, n_requests: int) -> int | None:
    """:func:`count_base_index` on a column that may hold unknown values
    (:data:`specwatch.poll.windows.ring.UNKNOWN`): the base found with each unknown value taken as
    low as it can be (the known value before it) and as high (the known value after it);
    None when the two differ (which entry is the base is not known) or when the newest
    value is unknown."""
    unknown = column == UNKNOWN
    if not unknown.any():
        return count_base_index(column, n_requests)
    if unknown[-1]:
        return None
    idx = np.arange(len(column))
    known = ~unknown
    before = np.maximum.accumulate(np.where(known, idx, 0))
    after = np.minimum.accumulate(np.where(known, idx, len(column) - 1)[::-1])[::-1]
    low = column.copy()
    low[unknown] = np.where(known[before], column[before], 0.0)[unknown]
    low[np.isnan(low)] = 0.0
    high = column[after]
    i = count_base_index(low, n_requests)
    return i if i == count_base_index(high, n_requests) else None


@functools.lru_cache(maxsize=64)
def window_lengths(windows: tuple[tuple[str, float], ...]
                   ) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """The labels and lengths of a config's time windows (split once per config)."""
    return (tuple(label for label, _secs in windows),
            tuple(float(secs) for _label, secs in windows))
