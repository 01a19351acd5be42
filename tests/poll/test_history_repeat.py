"""An identical page folded again skips the counter fold and gives the full fold's results.

Protected behaviour ("skip work that cannot change"): when the pipeline hands
``TargetHistory.update`` the page object it folded last time (an idle server sends the same
bytes; the pipeline keeps the parsed page), every delta is 0, so the history skips the
vector fold and repeats each model's newest row as stored. The windows still move on. The
shortcut must be invisible. After every poll of random sequences, a history fed the page
objects as they come is compared with one fed a fresh copy of each page (so it always folds)
on every piece of state: the rings' stored rows, cumulative counters, raw series state,
samples, resets and drops. The sequences include repeats, equal copies, a stalled clock,
non-finite counters, models capped by ``max_models``, vanished models, forgetting and gaps
longer than the retention. A second history, the dict reference of
``tests/helpers/reference_history.py``, gives the same derived windows.
"""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest
from helpers import reference_derive, reference_history
from helpers.paths import FIXTURES
from test_history_equivalence import assert_same_model

from specwatch.poll import sources
from specwatch.poll.windows import derive, history

FIXTURES = FIXTURES
WINDOWS = (("1m", 60.0), ("5m", 300.0))


def real_pages() -> list[sources.ParsedPage]:
    files = sorted((FIXTURES / "vllm-0.32-cpu-ngram").glob("snap_*.prom"),
                   key=lambda p: int(p.stem.split("_")[1]))
    return [sources.parse_page(p.read_text()) for p in files]


def fresh(page: sources.ParsedPage) -> sources.ParsedPage:
    """An equal page that is another object (and holds other dicts): always folded."""
    return dataclasses.replace(page, counters=dict(page.counters), created=dict(page.created),
                               gauges=dict(page.gauges), configured_k=dict(page.configured_k))


def ring_state(ring: history.HistoryRing) -> tuple:
    live = slice(ring._start, ring._n)
    return (list(ring.keys), ring._t[live].tolist(), ring._s[live].tobytes(),
            ring._u[live].tobytes(), ring._f[live].tobytes(), ring._uc.tolist(),
            ring._fc.tolist(), list(ring._where), ring.maxlen)


def assert_same_state(a: history.TargetHistory, b: history.TargetHistory) -> None:
    """Every piece of state a later poll or a derive reads, compared exactly (NaN too)."""
    assert a.resets_total == b.resets_total
    assert a.present_models == b.present_models and a.engine == b.engine
    assert a.dropped == b.dropped and a._process_start == b._process_start
    assert a._slot == b._slot and a._slot_keys == b._slot_keys
    n = len(a._slot_keys)
    for name in ("_value", "_created", "_seen"):
        assert getattr(a, name)[:n].tobytes() == getattr(b, name)[:n].tobytes(), name
    assert a.models.keys() == b.models.keys()
    for name, ha in a.models.items():
        hb = b.models[name]
        assert ring_state(ha.entries) == ring_state(hb.entries), name
        # The fold adds +0.0 to a cumulative counter of -0.0: compared by value there.
        assert np.array_equal(ha.cum, hb.cum, equal_nan=True), name
        assert ha.sample_bucket_counts == hb.sample_bucket_counts
        assert ha.sample_sum == hb.sample_sum and ha.sample_count == hb.sample_count
        assert ha.configured_k == hb.configured_k and ha.gauges == hb.gauges
        assert ha.signals == hb.signals and ha.last_seen == hb.last_seen


class Folds:
    """Counts the vector folds a history runs (the work an identical page skips)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[history.TargetHistory] = []
        real = history.TargetHistory._fold

        def spy(hist, *args):
            self.calls.append(hist)
            return real(hist, *args)

        monkeypatch.setattr(history.TargetHistory, "_fold", spy)

    def of(self, hist: history.TargetHistory) -> int:
        return sum(1 for h in self.calls if h is hist)


def test_an_idle_server_is_folded_once_and_reads_as_fully_folded(monkeypatch):
    """The same page object thirty times: one fold, and the state, the windows and the
    reference's windows are those of thirty full folds."""
    folds = Folds(monkeypatch)
    pages = real_pages()
    cfg = derive.DeriveConfig(windows=WINDOWS, count_window=10, min_drafts_per_sample=1,
                              min_bimodality_samples=4)
    ref_cfg = reference_derive.DeriveConfig(windows=WINDOWS, count_window=10,
                                            min_drafts_per_sample=1,
                                            min_bimodality_samples=4)
    quick = history.TargetHistory(3600, 2000, 1)
    full = history.TargetHistory(3600, 2000, 1)
    ref = reference_history.TargetHistory(3600, 2000, 1)
    t = 100.0
    for page in pages[:10] + [pages[10]] * 30:
        t += 5.0
        assert quick.update(page, t) == full.update(fresh(page), t) == ref.update(page, t)
        assert_same_state(quick, full)
        for name in quick.present_models:
            assert_same_model(derive.derive_model(quick.models[name], cfg, page.engine),
                              reference_derive.derive_model(ref.models[name], ref_cfg,
                                                            page.engine))
    assert folds.of(full) == 40
    assert folds.of(quick) == 11  # ten changing pages, then the idle page once
    (model,) = quick.present_models
    assert len(quick.models[model].entries) == 40  # every idle poll still added a row


def test_a_page_with_an_infinite_counter_is_folded_every_time(monkeypatch):
    """inf - inf is NaN: a repeat of such a page is not a no-op, so it is folded again."""
    folds = Folds(monkeypatch)
    base = real_pages()[5]
    key = next(k for k in base.counters if k[1] == sources.ACCEPTED_TOKENS)
    page = dataclasses.replace(base, counters={**base.counters, key: math.inf})
    quick = history.TargetHistory(3600, 2000, 1)
    full = history.TargetHistory(3600, 2000, 1)
    for i in range(4):
        quick.update(page, 10.0 + i)
        full.update(fresh(page), 10.0 + i)
        assert_same_state(quick, full)
    assert folds.of(quick) == 4


def test_forgetting_a_model_between_two_identical_pages_folds_again(monkeypatch):
    """A model forgotten after the fold loses its raw series state: its return is a new
    baseline, which only a fold records."""
    folds = Folds(monkeypatch)
    page = real_pages()[20]
    (model,) = page.models
    quick = history.TargetHistory(3600, 2000, 1)
    full = history.TargetHistory(3600, 2000, 1)
    for hist, p in ((quick, page), (full, fresh(page))):
        hist.update(p, 10.0)
        hist.forget(model, "vanished_limit")
        hist.update(p if hist is quick else fresh(page), 15.0)
    assert_same_state(quick, full)
    assert folds.of(quick) == 2


def synthetic_page(rng: random.Random, step: int, models: int) -> sources.ParsedPage:
    counters: dict[sources.SeriesKey, float] = {}
    created: dict[sources.SeriesKey, float] = {}
    for m in range(models):
        for sig in (sources.DRAFTS, sources.DRAFT_TOKENS, sources.ACCEPTED_TOKENS,
                    sources.REQUESTS_FINISHED, sources.GENERATION_TOKENS,
                    sources.VERIFY_CALLS):
            key = (f"m{m}", sig, (("engine", "0"),))
            counters[key] = float(step * (m + 1) * rng.randint(1, 50))
            created[key] = 1.0
        counters[(f"m{m}", sources.ACCEPTED_PER_POSITION, (("position", "0"),))] = \
            float(rng.choice([step, 0.5 * step, 2.0 ** 33 + step, -0.0]))
    if rng.random() < 0.1:
        counters[next(iter(counters))] = rng.choice([math.inf, math.nan])
    return sources.ParsedPage("vllm", counters, created,
                              {("m0", sources.RUNNING): float(step)}, {"m0": 3},
                              rng.choice([1.0, 1.0, 1.0, 2.0]))


@pytest.mark.parametrize("seed", range(16))
def test_random_sequences_with_repeats_match_full_folds(seed):
    """Random polls: a new page, the same object again (most often), an equal copy, the
    clock standing still, a gap past the retention, a model forgotten, a process restart;
    up to four models against ``max_models`` 3 with room for one vanished model."""
    rng = random.Random(seed)
    quick = history.TargetHistory(120.0, 16, 1, max_models=3, max_vanished_models=1)
    full = history.TargetHistory(120.0, 16, 1, max_models=3, max_vanished_models=1)
    if seed % 2:
        quick.keep_buckets = full.keep_buckets = False
    real = real_pages()
    page = real[0]
    t = 0.0
    for step in range(1, 120):
        action = rng.choice(["same"] * 5 + ["new", "real", "copy", "stall", "gap", "forget"])
        if action == "new":
            page = synthetic_page(rng, step, rng.randint(1, 4))
        elif action == "real":
            page = rng.choice(real)
        elif action == "copy":
            page = fresh(page)
        elif action == "forget" and quick.models:
            victim = rng.choice(sorted(quick.models))
            quick.forget(victim, "vanished_limit")
            full.forget(victim, "vanished_limit")
        t += {"stall": 0.0, "gap": 500.0}.get(action, rng.choice([1.0, 5.0]))
        assert quick.update(page, t) == full.update(fresh(page), t)
        assert_same_state(quick, full)
