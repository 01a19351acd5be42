"""Window functions on history entries (test-only API): one window between two
:class:`helpers.ring.HistoryEntry` objects, a window from a mapping of increases,
and the base entries of the time and count windows. They give what
:func:`specwatch.poll.windows.derive.derive_model` gives on a ring, through the same plan and
formulas."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from helpers.reference_derive import delta
from helpers.ring import HistoryEntry
from specwatch.poll import sources
from specwatch.poll.snapshot import WindowSignals
from specwatch.poll.windows import derive
from specwatch.poll.windows.base import count_base_index, time_base_indices
from specwatch.poll.windows.plan import Present, WindowPlan


def derive_window(label: str, base: HistoryEntry, cur: HistoryEntry,
                  configured_k: int | None, gauges: Mapping[str, float],
                  samples: Sequence[float] = (), min_bimodality_samples: int = 10
                  ) -> WindowSignals | None:
    """All signals of one window between two history entries (None: no time elapsed)."""
    dt = cur.t - base.t
    if not dt > 0:
        return None
    b, c = base.counters, cur.counters
    deltas = {k: delta(b, c, k) for k in {*b, *c}}
    return window_signals(label, dt, deltas, Present.of(c), configured_k, gauges, samples,
                          min_bimodality_samples)


def window_signals(label: str, dt: float, deltas: Mapping[tuple[str, str | None], float],
                   present: Present, configured_k: int | None, gauges: Mapping[str, float],
                   samples: Sequence[float] = (), min_bimodality_samples: int = 10,
                   histograms: bool = True) -> WindowSignals:
    """All signals of one window of ``dt`` > 0 seconds from the counters' increases.

    ``deltas``: increase of each counter over the window (0 for a key missing from it);
    ``present``: the keys of the window's newest entry.
    """
    plan = WindowPlan.of(present, histograms)
    get = deltas.get
    row = np.array([[get(key, 0.0) for key in plan.keys]], dtype=float)
    # Copies: the caller's gauges and samples may change before the window is read.
    rows = derive.WindowRows(row, plan, configured_k, dict(gauges),
                             np.array(samples, dtype=float), min_bimodality_samples)
    return rows.window(label, 0, dt, 0)


def time_window_base(entries: Sequence[HistoryEntry], seconds: float) -> HistoryEntry | None:
    """Newest entry at or before ``newest.t - seconds``; the oldest one if none is."""
    i = time_base_indices(np.array([e.t for e in entries]), [seconds])[0]
    return None if i is None else entries[i]


def count_window_base(entries: Sequence[HistoryEntry], n_requests: int) -> HistoryEntry | None:
    """Newest entry with at least ``n_requests`` finished requests after it, or None."""
    key = (sources.REQUESTS_FINISHED, None)
    if len(entries) < 2 or key not in entries[-1].counters:
        return None
    i = count_base_index([e.counters.get(key, 0.0) for e in entries], n_requests)
    return None if i is None else entries[i]
