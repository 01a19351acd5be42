"""A window's signals are computed when first read, and read as if computed at once.

Every poll derives every window, but only a reader needs the signals (the
exposition, a prediction hook, the controller), and a target polled every 5 s and scraped
every 15 s has two snapshots in three that nobody renders. So a window's ``values``,
``positions`` and ``histograms`` (:mod:`specwatch.poll.windows.lazy`) are computed together
on the first read of any of them, and the bimodality coefficient, the dearest signal, on the
first read of that key (or of the whole ``values`` mapping). These tests protect both halves:
nothing is computed before it is read (the saving), and what is read is what eager
derivation gives, key order included, however the history moves on in between (the
snapshot stays a value).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import pickle
import random
import threading

import pytest
from helpers import reference_derive
from helpers.pageserver import fixture_pages
from helpers.paths import FIXTURES
from helpers.ring import EntryRing, HistoryEntry
from helpers.windows import window_signals
from prometheus_client import CollectorRegistry, generate_latest

from specwatch.expose.collector import SpecwatchCollector
from specwatch.poll import sources
from specwatch.poll.pipeline import Pipeline, PollResult
from specwatch.poll.windows import bimodality, derive, history
from specwatch.poll.windows import lazy as lazywindow
from specwatch.poll.windows.plan import Present

FIXTURES = FIXTURES / "vllm-0.32-cpu-ngram"
BC = derive.BIMODALITY_COEFFICIENT
CFG = derive.DeriveConfig(windows=(("1m", 60.0), ("5m", 300.0), ("15m", 900.0)),
                          count_window=300, min_bimodality_samples=10, histograms=False)


#: Per-position and latency-bucket counters (``_entries(..., full=True)``).
FULL_KEYS = [(sources.ACCEPTED_PER_POSITION, p) for p in ("0", "1", "2")] + [
    (sources.E2E_LATENCY_BUCKET, le) for le in ("0.5", "1.0", "+Inf")] + [
    (sources.TTFT_BUCKET, le) for le in ("0.1", "+Inf")]


def _entries(rng: random.Random, n: int, t0: float = 0.0, full: bool = False
             ) -> list[HistoryEntry]:
    """A vLLM model polled every 5 s: steady counters, a sample on most polls (two levels
    taking turns, so the coefficient is defined and varies); ``full``: with per-position
    and latency-bucket counters too."""
    keys = [(sources.DRAFTS, None), (sources.DRAFT_TOKENS, None),
            (sources.ACCEPTED_TOKENS, None), (sources.REQUESTS_FINISHED, None),
            (sources.E2E_LATENCY_COUNT, None), (sources.E2E_LATENCY_SUM, None)]
    keys += FULL_KEYS if full else []
    cum = dict.fromkeys(keys, 0.0)
    out = []
    for i in range(n):
        for k in keys:
            cum[k] += rng.uniform(1, 40)
        level = 0.3 if (i // rng.randint(1, 4)) % 2 else 0.7
        sample = None if rng.random() < 0.2 else min(1.0, max(0.0, rng.gauss(level, 0.05)))
        out.append(HistoryEntry(t0 + 5.0 * i, dict(cum), sample))
    return out


def _model(entries: list[HistoryEntry]) -> history.ModelHistory:
    ring = EntryRing()
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
    entries = [HistoryEntry(e.t, e.counters, 0.5) for e in
               _entries(random.Random(3), 100)]
    w = derive.derive_model(_model(entries), CFG, "vllm").window("5m")
    assert w is not None and isinstance(w.values, lazywindow.WindowValues)
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
    w = window_signals("w", 60.0, deltas, Present.of(deltas), 3, {}, samples)
    samples[:] = [0.5] * 40
    assert want is not None and w.values.get(BC) == want


FULL_CFG = dataclasses.replace(CFG, histograms=True)


@pytest.fixture
def computed(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Counts computations of a window's signals (the span of each window computed)."""
    made: list[float] = []
    real = derive._signals

    def counting(dt, *args):
        made.append(dt)
        return real(dt, *args)

    monkeypatch.setattr(derive, "_signals", counting)
    return made


def test_no_window_is_computed_until_read_then_once_for_its_three_mappings(
        computed: list[float]) -> None:
    """Deriving computes no window; the span, requests and drafts need nothing computed;
    the first read of any of values, positions or histograms computes that window only, for
    all three, and windows that share a base (a count window on a time window's base)
    share the computation."""
    snap = derive.derive_model(_model(_entries(random.Random(2), 400, full=True)), FULL_CFG,
                               "vllm")
    windows = {w.window: w for w in snap.windows}
    assert set(windows) == {"1m", "5m", "15m", "300req"}
    assert all(w.span_seconds > 0 and w.requests > 0 and w.drafts > 0
               for w in windows.values())
    assert computed == []
    assert windows["5m"].positions[derive.POSITION_ACCEPTANCE_RATE]
    assert computed == [windows["5m"].span_seconds]
    assert windows["5m"].histograms["e2e_latency_seconds"]
    assert windows["5m"].values[derive.ACCEPTANCE_RATE] > 0
    assert len(computed) == 1
    young = derive.derive_model(_model(_entries(random.Random(2), 5, full=True)), FULL_CFG,
                                "vllm")
    computed.clear()
    assert [dict(w.values) for w in young.windows[:3]] == [dict(young.windows[0].values)] * 3
    assert len(computed) == 1  # the 1m, 5m and 15m windows share the oldest entry


@pytest.mark.parametrize("seed", range(8))
def test_every_field_reads_as_the_eager_reference_after_the_history_moves_on(
        seed: int) -> None:
    """With per-position and bucket counters: values, positions and histograms read an hour
    of polls later equal the reference derived at the time, in the same key order."""
    rng = random.Random(seed)
    entries = _entries(rng, rng.randint(30, 300), full=True)
    mh = _model(entries)
    got = derive.derive_model(mh, FULL_CFG, "vllm")
    want = reference_derive.derive_model(mh, FULL_CFG, "vllm")
    for e in _entries(random.Random(seed + 100), 720, t0=entries[-1].t + 5.0, full=True):
        mh.entries.append(e)
        if len(mh.entries) > 400:
            mh.entries.popleft()
    assert [w.window for w in got.windows] == [w.window for w in want.windows]
    for g, w in zip(got.windows, want.windows, strict=True):
        assert list(g.positions.items()) == list(w.positions.items())
        assert list(g.histograms.items()) == list(w.histograms.items())
        assert list(g.values.items()) == list(w.values.items())
        assert (g.span_seconds, g.requests, g.drafts) == (w.span_seconds, w.requests, w.drafts)
    assert got == want


def test_an_sglang_window_reads_the_gauges_of_its_own_poll(computed: list[float]) -> None:
    """SGLang's acceptance rate reads the model's gauges: a window read after the gauges
    changed gives what it gave at derive time (the snapshot keeps its own copy)."""
    keys = [(sources.VERIFY_CALLS, None), (sources.GENERATION_TOKENS, None),
            (sources.REQUESTS_FINISHED, None)]
    ring = EntryRing()
    for i in range(30):
        ring.append(HistoryEntry(5.0 * i, {k: 40.0 * i * (j + 1)
                                                   for j, k in enumerate(keys)}, None))
    gauges = {sources.SPEC_DRAFT_TOKENS: 4.0}
    mh = history.ModelHistory("m", ring, configured_k=3, gauges=gauges,
                              signals=frozenset({sources.VERIFY_CALLS}))
    cfg = dataclasses.replace(CFG, count_window=0)
    got = derive.derive_model(mh, cfg, "sglang")
    want = reference_derive.derive_model(mh, cfg, "sglang")
    gauges[sources.SPEC_DRAFT_TOKENS] = 1.0
    assert computed == []
    assert got.window("5m").values.get(derive.ACCEPTANCE_RATE) is not None
    assert got == want
    assert derive.derive_model(mh, cfg, "sglang") != want  # the new gauge does change it


def test_a_failing_computation_reads_as_an_empty_window_and_is_logged(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A bug in the formulas must not raise in a scrape: the window has no series (no data
    means no series) and the error is logged once per window."""
    def broken(*args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(derive, "_signals", broken)
    snap = derive.derive_model(_model(_entries(random.Random(5), 100, full=True)), FULL_CFG,
                               "vllm")  # deriving computes nothing: no error yet
    w = snap.window("1m")
    assert w is not None
    with caplog.at_level(logging.ERROR, logger=lazywindow.__name__):
        assert dict(w.values) == {} and dict(w.positions) == {} and dict(w.histograms) == {}
        assert w.values.get(BC) is None
    assert [r.message for r in caplog.records] == ["deriving a window's signals failed"]


def test_concurrent_first_reads_agree(computed: list[float]) -> None:
    """Readers racing on a window's first read (two scrapes, a scrape and a hook) all get
    the one result; at most one computation each."""
    for seed in range(20):
        snap = derive.derive_model(_model(_entries(random.Random(seed), 200, full=True)),
                                   FULL_CFG, "vllm")
        w = snap.window("15m")
        assert w is not None
        results: list[tuple] = []
        barrier = threading.Barrier(4)

        def read(w=w, barrier=barrier, results=results) -> None:
            barrier.wait()
            results.append((dict(w.positions), list(w.values.items()), dict(w.histograms)))

        threads = [threading.Thread(target=read) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 4 and all(r == results[0] for r in results)
        assert BC in dict(results[0][1])
    assert len(computed) <= 4 * 20


def test_windows_of_a_target_without_positions_or_histograms_hold_plain_empty_dicts(
        ) -> None:
    """A plan without per-position counters (or with histograms off) has nothing to compute
    there: the field is a plain empty dict, not a lazy mapping (fewer objects a poll for
    the garbage collector)."""
    w = derive.derive_model(_model(_entries(random.Random(6), 100)), CFG, "vllm").window("5m")
    assert w is not None
    assert type(w.positions) is dict and w.positions == {}
    assert type(w.histograms) is dict and w.histograms == {}
    full = derive.derive_model(_model(_entries(random.Random(6), 100, full=True)), FULL_CFG,
                               "vllm").window("5m")
    assert full is not None and isinstance(full.positions, lazywindow.LazyMapping)
    assert isinstance(full.histograms, lazywindow.LazyMapping)
