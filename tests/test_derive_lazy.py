"""The bimodality coefficient is computed when first read, and reads as if computed at once.

Issue 15: the coefficient costs about as much as the rest of a poll's derive, and only the
exposition reads it, so a window's ``values`` (:class:`derive.WindowValues`) compute it on
the first read of that key (or of the whole mapping). These tests protect both halves:
nothing computes it before it is read (the saving), and what is read is what eager
derivation gives, key order included, however the history moves on in between (the
snapshot stays a value).
"""

from __future__ import annotations

import copy
import pickle
import random
from pathlib import Path

import pytest
from helpers import reference_derive
from helpers.pageserver import fixture_pages
from prometheus_client import CollectorRegistry, generate_latest
from specwatch.exporter import bimodality, derive, history, sources
from specwatch.exporter.collector import SpecwatchCollector
from specwatch.exporter.pipeline import Pipeline, PollResult

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-0.32-cpu-ngram"
BC = derive.BIMODALITY_COEFFICIENT
CFG = derive.DeriveConfig(windows=(("1m", 60.0), ("5m", 300.0), ("15m", 900.0)),
                          count_window=300, min_bimodality_samples=10, histograms=False)


def _entries(rng: random.Random, n: int, t0: float = 0.0) -> list[history.HistoryEntry]:
    """A vLLM model polled every 5 s: steady counters, a sample on most polls (two levels
    taking turns, so the coefficient is defined and varies)."""
    keys = [(sources.DRAFTS, None), (sources.DRAFT_TOKENS, None),
            (sources.ACCEPTED_TOKENS, None), (sources.REQUESTS_FINISHED, None),
            (sources.E2E_LATENCY_COUNT, None), (sources.E2E_LATENCY_SUM, None)]
    cum = dict.fromkeys(keys, 0.0)
    out = []
    for i in range(n):
        for k in keys:
            cum[k] += rng.uniform(1, 40)
        level = 0.3 if (i // rng.randint(1, 4)) % 2 else 0.7
        sample = None if rng.random() < 0.2 else min(1.0, max(0.0, rng.gauss(level, 0.05)))
        out.append(history.HistoryEntry(t0 + 5.0 * i, dict(cum), sample))
    return out


def _model(entries: list[history.HistoryEntry]) -> history.ModelHistory:
    ring = history.HistoryRing()
    for e in entries:
        ring.append(e)
    return history.ModelHistory("m", ring, configured_k=3, gauges={},
                                signals=frozenset({sources.DRAFTS}))


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts calls of the coefficient (the one derive makes)."""
    made: list[int] = []
    real = bimodality.coexistence_coefficient

    def counting(samples, *args, **kwargs):
        made.append(len(samples))
        return real(samples, *args, **kwargs)

    monkeypatch.setattr(bimodality, "coexistence_coefficient", counting)
    return made


def test_not_computed_until_read_and_then_once(calls: list[int]) -> None:
    """Deriving and reading the other signals computes nothing; the first read of the
    coefficient computes it for that window only, and later reads reuse it."""
    snap = derive.derive_model(_model(_entries(random.Random(1), 400)), CFG, "vllm")
    windows = {w.window: w for w in snap.windows}
    assert set(windows) == {"1m", "5m", "15m", "300req"}
    for w in windows.values():
        assert w.values.get(derive.ACCEPTANCE_RATE) is not None
        assert derive.ARRIVAL_RATE in w.values
    assert calls == []
    assert windows["15m"].values.get(BC) is not None
    assert len(calls) == 1
    assert windows["15m"].values[BC] == windows["15m"].values.get(BC)
    assert list(windows["15m"].values) and len(windows["15m"].values) > 1
    assert len(calls) == 1


@pytest.mark.parametrize("seed", range(12))
def test_reads_as_the_eager_reference_in_key_order(seed: int, calls: list[int]) -> None:
    """Every window equals the reference derive (which computes the coefficient at once),
    values in the same order (the exposition's), as the history grows."""
    rng = random.Random(seed)
    entries = _entries(rng, rng.randint(20, 260))
    mh = _model(entries[:10])
    for e in entries[10:]:
        mh.entries.append(e)
        if rng.random() < 0.85:
            continue
        got = derive.derive_model(mh, CFG, "vllm")
        want = reference_derive.derive_model(mh, CFG, "vllm")
        assert [w.window for w in got.windows] == [w.window for w in want.windows]
        for g, w in zip(got.windows, want.windows, strict=True):
            assert list(g.values.items()) == list(w.values.items())
        assert got == want
    assert calls  # the coefficient was defined in these histories


def test_a_snapshot_keeps_its_windows_samples_when_the_history_moves_on(calls: list[int]
                                                                       ) -> None:
    """Read after an hour more of polls (other samples, the ring's rows reused and
    compacted), the coefficient is the one of the window the snapshot was derived from."""
    rng = random.Random(7)
    entries = _entries(rng, 500)
    mh = _model(entries[:200])
    early = derive.derive_model(mh, CFG, "vllm")
    want = reference_derive.derive_model(mh, CFG, "vllm")  # computes it at once
    calls.clear()
    for e in _entries(random.Random(8), 720, t0=entries[199].t + 5.0):
        mh.entries.append(e)
        if len(mh.entries) > 300:
            mh.entries.popleft()
    assert calls == []  # nothing read it yet
    for g, w in zip(early.windows, want.windows, strict=True):
        assert g.values.get(BC) == w.values.get(BC)
        assert list(g.values.items()) == list(w.values.items())


def test_an_undefined_coefficient_is_absent_however_it_is_read() -> None:
    """Constant samples have no spread: the key is absent from get, [], in, iteration and
    len, exactly as when it was computed at once."""
    entries = [history.HistoryEntry(e.t, e.counters, 0.5) for e in
               _entries(random.Random(3), 100)]
    w = derive.derive_model(_model(entries), CFG, "vllm").window("5m")
    assert w is not None and isinstance(w.values, derive.WindowValues)
    assert w.values.get(BC) is None
    assert BC not in w.values
    with pytest.raises(KeyError):
        w.values[BC]
    assert BC not in list(w.values) and len(w.values) == len(dict(w.values))


def test_copies_and_pickles_as_the_plain_mapping() -> None:
    """Copies, pickles and dict() hold the computed values (nothing lazy crosses them)."""
    w = derive.derive_model(_model(_entries(random.Random(4), 300)), CFG, "vllm").window("15m")
    assert w is not None
    for other in (pickle.loads(pickle.dumps(w)), copy.deepcopy(w), copy.copy(w)):
        assert other == w
        assert other.values.get(BC) == w.values.get(BC) is not None
    assert dict(w.values) == w.values and BC in dict(w.values)


def test_a_poll_nobody_scrapes_never_computes_it(calls: list[int]) -> None:
    """Through the pipeline and the cached exposition, on the recorded vLLM pages: polls
    published before any scrape compute nothing; the scrape computes it for the snapshot it
    renders, and the bytes are prometheus_client's encoding of collect(), coefficient
    included."""
    cfg = derive.DeriveConfig(windows=(("15m", 900.0),), count_window=0,
                              min_drafts_per_sample=1.0, min_bimodality_samples=4,
                              histograms=False)
    pipe = Pipeline([("t", "vllm")], cfg, 2.0)
    col = SpecwatchCollector(lambda: pipe.snapshot)
    pipe.add_publish_listener(col.prerender)
    pages = fixture_pages(FIXTURES)
    for k, (t, text) in enumerate(pages[:60]):
        pipe.apply(PollResult("t", t, t, 0.01, body=text, monotonic=2.0 * k))
    assert calls == []
    body = col.exposition(pipe.snapshot, openmetrics=False)
    assert calls
    assert f"{BC}{{".encode() in body
    registry = CollectorRegistry()
    registry.register(col)
    assert body == generate_latest(registry)


def test_window_signals_copies_the_samples_it_is_given() -> None:
    """A caller's list may change after the window is made: the coefficient read later is
    the one of the samples passed."""
    rng = random.Random(9)
    samples = [rng.choice([0.3, 0.7]) + rng.gauss(0, 0.02) for _ in range(40)]
    want = bimodality.coexistence_coefficient(samples)
    deltas = {(sources.DRAFTS, None): 10.0, (sources.DRAFT_TOKENS, None): 30.0,
              (sources.ACCEPTED_TOKENS, None): 12.0}
    w = derive.window_signals("w", 60.0, deltas, derive.Present.of(deltas), 3, {}, samples)
    samples[:] = [0.5] * 40
    assert want is not None and w.values.get(BC) == want
