"""The history's per-poll shortcuts leave the state the full path would leave.

Protected behaviour: three searches ran on every poll of every target and almost
never found anything; they are now skipped when they cannot:

* the search for stale series (unseen for the retention) and stale models, skipped when the
  poll saw every live series slot and every model;
* the prune of ring entries older than the retention, which reads the first three entry
  times instead of a binary search when they decide it;
* the cap on remembered models, skipped when live plus remembered models cannot pass it.

A history with the shortcuts is compared, after every poll, with one whose shortcuts are
turned off (the full search every time), on every piece of state (``assert_same_state``):
random sequences over the real vLLM pages where single series vanish inside a model that
stays (a position, an engine), models seen only through gauges come and go, the clock jumps
past the retention, and polls come at irregular times.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from test_history_repeat import assert_same_state, real_pages

from specwatch.poll import sources
from specwatch.poll.windows import history

RETENTION = 60.0


class FullSearches(history.TargetHistory):
    """The history with every shortcut off: what each poll computed before them."""

    def _forget_stale(self, now: float, all_seen: bool = False) -> None:
        super()._forget_stale(now, all_seen=False)

    def _prune(self, hist: history.ModelHistory, now: float) -> None:
        ring = hist.entries
        k = int(np.searchsorted(ring.times(), now - self.retention_seconds, side="right"))
        drop = min(k, len(ring)) - 1
        if drop > 0:
            ring.drop_oldest(drop)

    def _cap_models(self, page: sources.ParsedPage) -> sources.ParsedPage:
        page = super()._cap_models(page)
        if self.max_models is not None:
            self._forget_vanished(page.models)  # the union counted every time
        return page


def without(page: sources.ParsedPage, drop: set) -> sources.ParsedPage:
    """The page without the counter series ``drop`` (and their created samples)."""
    return dataclasses.replace(
        page, counters={k: v for k, v in page.counters.items() if k not in drop},
        created={k: v for k, v in page.created.items() if k not in drop})


def with_gauge_model(page: sources.ParsedPage, name: str, value: float) -> sources.ParsedPage:
    """The page plus a model seen only through a gauge (no counter series: no slots)."""
    return dataclasses.replace(
        page, gauges={**page.gauges, (name, sources.RUNNING): value})


def histories(max_models: int | None = None) -> tuple[history.TargetHistory, FullSearches]:
    return (history.TargetHistory(RETENTION, 400, 1, max_models=max_models),
            FullSearches(RETENTION, 400, 1, max_models=max_models))


def fold_both(quick: history.TargetHistory, full: FullSearches, page: sources.ParsedPage,
              t: float) -> None:
    assert quick.update(page, t) == full.update(page, t)
    assert_same_state(quick, full)


def test_a_series_that_vanishes_inside_a_model_is_forgotten_after_the_retention():
    """One position's counter stops while its model goes on: after the retention its slot
    is freed (the full search finds it although every model was seen), and when it comes
    back it is a new series that counts from its first value."""
    pages = real_pages()
    page = pages[20]
    position = next(k for k in page.counters if k[1] == sources.ACCEPTED_PER_POSITION)
    quick, full = histories()
    t = 0.0
    for p in pages[:20]:
        t += 5.0
        fold_both(quick, full, p, t)
    for p in pages[20:40]:  # 100 s without the position: longer than the retention
        t += 5.0
        fold_both(quick, full, without(p, {position}), t)
    assert position not in quick._slot
    for p in pages[40:45]:
        t += 5.0
        fold_both(quick, full, p, t)
    assert position in quick._slot


def test_a_model_seen_only_through_gauges_is_forgotten_after_the_retention():
    """A model without counter series holds no slot, so only the model check can tell that
    it vanished: after the retention it is forgotten."""
    pages = real_pages()
    quick, full = histories()
    t = 0.0
    for p in pages[:10]:
        t += 5.0
        fold_both(quick, full, with_gauge_model(p, "gauges-only", 3.0), t)
    assert "gauges-only" in quick.models
    for p in pages[10:30]:
        t += 5.0
        fold_both(quick, full, p, t)
    assert "gauges-only" not in quick.models


@pytest.mark.parametrize("seed", range(6))
def test_random_sequences_leave_the_full_searches_state(seed):
    """Series and gauge-only models come and go, the clock jumps and stalls, polls come at
    irregular intervals, and a small model cap forgets remembered models."""
    rng = random.Random(seed)
    pages = real_pages()
    series = [k for k in pages[10].counters
              if k[1] in (sources.ACCEPTED_PER_POSITION, sources.DRAFTS)]
    quick, full = histories(max_models=rng.choice([None, 2, 3]))
    t = 0.0
    for step in range(160):
        page = pages[step % len(pages)]
        if rng.random() < 0.4:
            page = without(page, set(rng.sample(series, rng.randint(1, len(series)))))
        for g in range(rng.choice([0, 0, 1, 3])):
            page = with_gauge_model(page, f"g{rng.randint(0, 4)}-{g}", rng.random())
        r = rng.random()
        t += (0.0 if r < 0.05 else RETENTION * rng.uniform(1.0, 2.5) if r < 0.1
              else rng.uniform(0.5, 12.0))
        fold_both(quick, full, page, t)
