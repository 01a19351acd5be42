"""A target's models are derived when first read, and read as if derived at its poll.

A target polled every 5 s and scraped every 15 s publishes two snapshots in three
that nobody reads, so :func:`specwatch.poll.windows.derive.derive_models` freezes each model's
history at the poll (:meth:`ModelHistory.frozen`: the ring's arrays shared, not copied) and
derives on the first read of the snapshot's ``models``. These tests protect both halves:
nothing is derived before a reader asks, and what is read equals what deriving at the poll
gave, exactly, however the history changes in between: rows appended and dropped, the ring
compacted (its live rows moved to the front), a column widened to float64, columns added,
the newest row replaced (a poll that does not advance the clock), models forgotten.
"""

from __future__ import annotations

import logging
import pickle
import random
import re

import pytest
from helpers.paths import FIXTURES
from helpers.ring import EntryRing, HistoryEntry, append_entry, entries

from specwatch.poll import sources
from specwatch.poll.pipeline import Pipeline, PollResult
from specwatch.poll.windows import derive
from specwatch.poll.windows import lazy as lazywindow

FIXTURES = FIXTURES / "vllm-0.32-cpu-ngram"
CFG = derive.DeriveConfig(windows=(("30s", 30.0), ("1m", 60.0)), count_window=20,
                          min_bimodality_samples=4, histograms=True)
GENERATION = (sources.GENERATION_TOKENS, None)


def _pages() -> list[str]:
    files = sorted(FIXTURES.glob("snap_*.prom"), key=lambda p: int(p.stem.split("_")[1]))
    return [p.read_text() for p in files]


def _at_once(models) -> dict:
    """The models with every value computed now (a pickle holds computed values only)."""
    return pickle.loads(pickle.dumps(dict(models)))


def _widened(page: str) -> str:
    """The page with its generation tokens above 2^32 (the ring moves that column from the
    uint32 matrix to the float64 one)."""
    return re.sub(r"^(vllm:generation_tokens_total\{[^}]*\}) (\S+)$",
                  lambda m: f"{m.group(1)} {float(m.group(2)) + 5e9}", page, flags=re.M)


def _with_position(page: str, position: str) -> str:
    """The page with one more accepted-per-position series (a new column of the ring)."""
    return re.sub(r'^(vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position=")'
                  r'0("\} \S+)$', lambda m: f"{m.group(0)}\n{m.group(1)}{position}{m.group(2)}",
                  page, count=1, flags=re.M)


def _stream(seed: int) -> list[tuple[str, float]]:
    """(page, poll time): the real recording in order, twice (the second pass is a server
    restart), with stalls (the same time again), a widened counter, a counter that appears
    and jumps in time."""
    rng = random.Random(seed)
    pages = _pages()
    out, t = [], 1000.0
    for i, page in enumerate(pages * 2):
        if rng.random() < 0.1:
            out.append((page, t))  # a poll that does not advance the clock
        if i == 30:
            page = _widened(page)
        if i >= 40:
            page = _with_position(page, "7")
        t += rng.choice((5.0, 5.0, 5.0, 2.5, 20.0))
        out.append((page, t))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_models_read_after_later_polls_equal_models_derived_at_the_poll(seed: int) -> None:
    """Every snapshot's models, read only after the whole stream (one minute of retention:
    rows dropped and the ring compacted many times over), equal the models derived from the
    history right at that poll, to the last bit."""
    pipe = Pipeline([("t", "vllm")], CFG, 5.0, history_retention=60.0)
    published, at_poll = [], []
    compactions = widened = 0
    for page, t in _stream(seed):
        hist = pipe.target_history("t")
        starts = {n: mh.entries._start for n, mh in hist.models.items()}
        snap = pipe.apply(PollResult("t", t, t, 0.01, body=page, monotonic=t))
        assert snap.up
        published.append(snap)
        at_poll.append(_at_once({n: derive.derive_model(mh, CFG, snap.engine)
                                 for n, mh in sorted(hist.models.items())
                                 if n in hist.present_models and mh.entries}))
        # A compaction moves the live rows to the front: the first live row goes back.
        compactions += sum(mh.entries._start < starts.get(n, 0)
                           for n, mh in hist.models.items())
        widened += any(not mh.entries._where[mh.entries._cols[GENERATION]][0]
                       for mh in hist.models.values() if GENERATION in mh.entries._cols)
    # What the test is about did happen.
    assert compactions >= 5 and widened
    assert any(dict(w.positions).get(derive.POSITION_ACCEPTANCE_RATE, {}).get("7") is not None
               for m in published[-1].models.values() for w in m.windows)
    assert len(published) > 90
    for snap, want in zip(published, at_poll, strict=True):
        assert list(snap.models) == list(want)
        assert _at_once(snap.models) == want


def test_nothing_is_derived_until_read_then_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Publishing a snapshot derives nothing; the first read derives every model once, and
    later reads (and a second reader) use that result."""
    calls: list[str] = []
    real = derive.derive_model

    def counting(hist, cfg, engine):
        calls.append(hist.model_name)
        return real(hist, cfg, engine)

    monkeypatch.setattr(derive, "derive_model", counting)
    pipe = Pipeline([("t", "vllm")], CFG, 5.0)
    snaps = [pipe.apply(PollResult("t", t, t, 0.01, body=page, monotonic=t))
             for t, page in zip(range(1000, 1100, 5), _pages(), strict=False)]
    assert calls == []
    models = snaps[3].models
    assert len(models) == 1 and calls == [next(iter(models))]
    assert dict(models) == dict(snaps[3].models) and len(calls) == 1
    assert snaps[-1].models.keys() == models.keys() and len(calls) == 2


def test_a_failing_derivation_reads_as_no_models_and_is_logged(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A bug in deriving must not raise in a scrape or a hook: the target has no derived
    series (no data means no series, never a stale or made-up value), logged once."""
    def broken(*_args):
        raise ZeroDivisionError("a bug")

    pipe = Pipeline([("t", "vllm")], CFG, 5.0)
    monkeypatch.setattr(derive, "derive_model", broken)
    snap = pipe.apply(PollResult("t", 1000.0, 1000.0, 0.01, body=_pages()[0],
                                 monotonic=1000.0))
    assert snap.up
    with caplog.at_level(logging.ERROR, logger=lazywindow.__name__):
        assert dict(snap.models) == {} and len(snap.models) == 0
        assert list(snap.models.items()) == []
    assert [r.message for r in caplog.records] == ["deriving the models of a target failed"]


def test_a_frozen_ring_reads_like_the_ring_and_refuses_changes() -> None:
    """The view a snapshot keeps answers every read the ring answered at that poll, and
    cannot be changed (it shares the ring's arrays)."""
    ring = EntryRing(maxlen=50)
    rng = random.Random(3)
    keys = [(sources.DRAFTS, None), (sources.DRAFT_TOKENS, None), (sources.ACCEPTED_TOKENS, None)]
    cum = dict.fromkeys(keys, 0.0)
    for i in range(40):
        for k in keys:
            cum[k] += rng.randint(1, 50)
        ring.append(HistoryEntry(5.0 * i, dict(cum), rng.random()))
    view = ring.frozen()
    before = [(e.t, dict(e.counters), e.sample) for e in ring]
    columns = [view.column(k).tolist() for k in keys]
    new = (sources.REQUESTS_FINISHED, None)
    for i in range(40, 200):  # drops, compactions, a new column, values past uint32
        cum[keys[1]] += 2.0 ** 33
        ring.append(HistoryEntry(5.0 * i, {**cum, new: float(i)}, None))
    ring[-1] = HistoryEntry(5.0 * 199, {keys[0]: 1.0}, 0.5)
    assert [(e.t, dict(e.counters), e.sample) for e in entries(view)] == before
    assert view.keys == keys and len(view) == 40
    assert [view.column(k).tolist() for k in keys] == columns
    assert view.column_index(new) is None and view.column(new) is None
    for change in (lambda: append_entry(view, HistoryEntry(1e6, {}, None)),
                   lambda: view.drop_oldest(1), lambda: view.replace_last_row(view.row(-1)),
                   lambda: view.column_of(("x", None))):
        with pytest.raises(TypeError, match="cannot change"):
            change()
