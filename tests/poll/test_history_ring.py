"""The columnar history ring behaves exactly like the deque of entries it replaced.

Protected behaviour: after any sequence of appends (keys appearing late or missing),
replacements of the newest entry, pops and maxlen evictions (compaction included), the ring
reads back the same entries as a reference deque of ``HistoryEntry`` objects, and
``derive_model`` over it gives the same windows as the entry-by-entry selection
(``time_window_base``/``count_window_base`` + ``derive_window``) over the reference.
"""

from __future__ import annotations

import os
from collections import deque

from helpers.ring import EntryRing, HistoryEntry
from helpers.windows import count_window_base, derive_window, time_window_base
from hypothesis import given, settings
from hypothesis import strategies as st

from specwatch.poll import sources
from specwatch.poll.windows import derive
from specwatch.poll.windows.ring import ModelHistory

EXAMPLES = int(os.environ.get("SPECWATCH_HYPOTHESIS_EXAMPLES", "60"))
KEYS = [(sources.DRAFTS, None), (sources.DRAFT_TOKENS, None), (sources.ACCEPTED_TOKENS, None),
        (sources.REQUESTS_FINISHED, None), (sources.ACCEPTED_PER_POSITION, "0"),
        (sources.ACCEPTED_PER_POSITION, "1"), (sources.E2E_LATENCY_SUM, None),
        (sources.E2E_LATENCY_COUNT, None)]

ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.sets(st.sampled_from(KEYS), min_size=1),
              st.one_of(st.none(), st.floats(0, 1))),
    st.tuples(st.just("replace"), st.sets(st.sampled_from(KEYS)), st.none()),
    st.tuples(st.just("pop"), st.none(), st.none()),
), min_size=1, max_size=120)


def same(ring: EntryRing, ref: deque) -> None:
    assert len(ring) == len(ref) and bool(ring) == bool(ref)
    for got, want in zip(ring, ref, strict=True):
        assert got.t == want.t and dict(got.counters) == dict(want.counters)
        assert got.sample == want.sample
    if ref:
        assert list(ring.times()) == [e.t for e in ref]
        assert ring[-1] == ring[len(ring) - 1]
        for key in KEYS:
            assert [ring.value(i, key) for i in range(len(ref))] == \
                [e.counters.get(key) for e in ref]
        for i in range(len(ref)):
            assert ring.samples_after(i) == [e.sample for e in list(ref)[i + 1:]
                                             if e.sample is not None]


@settings(max_examples=EXAMPLES, deadline=None)
@given(ops, st.sampled_from([None, 5, 40]))
def test_ring_reads_back_like_a_deque(operations, maxlen):
    ring, ref = EntryRing(maxlen=maxlen), deque(maxlen=maxlen)
    t, value = 0.0, 0.0
    for op, keys, sample in operations:
        if op == "append":
            t += 5.0
            value += 7.0
            e = HistoryEntry(t, {k: value + i for i, k in enumerate(sorted(keys, key=str))},
                             sample)
            ring.append(e)
            ref.append(e)
        elif op == "replace" and ref:
            e = HistoryEntry(ref[-1].t, {k: value + 0.5 for k in keys}, ref[-1].sample)
            ring[-1] = e
            ref[-1] = e
        elif op == "pop" and ref:
            ring.popleft()
            ref.popleft()
        same(ring, ref)


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.integers(0, 400), st.booleans()),
                min_size=1, max_size=300),
       st.sampled_from([0, 500, 1000]))
def test_derive_model_on_the_ring_matches_entry_by_entry_selection(steps, count_window):
    """Windows from the ring's columns equal windows from the entries themselves."""
    entries = []
    t = req = drafts = 0.0
    for dt, n, has_sample in steps:
        t += dt
        req += n
        drafts += 3 * n
        entries.append(HistoryEntry(t, {(sources.REQUESTS_FINISHED, None): req,
                                        (sources.DRAFTS, None): drafts,
                                        (sources.DRAFT_TOKENS, None): 3 * drafts,
                                        (sources.ACCEPTED_TOKENS, None): drafts},
                                    (n % 100) / 100 if has_sample else None))
    cfg = derive.DeriveConfig(windows=(("1m", 60.0), ("5m", 300.0)), count_window=count_window,
                              min_bimodality_samples=4)
    snap = derive.derive_model(ModelHistory("m", EntryRing(entries)), cfg, "vllm")
    want = []
    cur = entries[-1]
    selections = [(label, time_window_base(entries, secs)) for label, secs in cfg.windows]
    if count_window:
        selections.append((cfg.count_window_label,
                           count_window_base(entries, count_window)))
    for label, base in selections:
        if base is None:
            continue
        samples = [e.sample for e in entries if e.t > base.t and e.sample is not None]
        w = derive_window(label, base, cur, None, {}, samples, 4)
        if w is not None:
            want.append(w)
    assert snap.windows == tuple(want)


def test_long_run_with_evictions_and_compaction():
    """Hundreds of polls through a small ring (the popped rows are dropped from the columns
    now and then): still the same entries as the deque; a key that appears late is absent
    from the entries before it."""
    ring, ref = EntryRing(maxlen=10), deque(maxlen=10)
    for i in range(300):
        counters = {KEYS[0]: float(i)}
        if i >= 150:
            counters[KEYS[3]] = float(2 * i)
        # A count that outgrows 32 bits, and a sum that is not a whole number: the column
        # widens to doubles and keeps every earlier value.
        counters[KEYS[1]] = float(i) if i < 100 else 4294967295.0 + i
        if i % 7:
            counters[KEYS[6]] = i / 3
        e = HistoryEntry(float(i), counters, 0.5 if i % 3 == 0 else None)
        ring.append(e)
        ref.append(e)
        same(ring, ref)
    assert ring._start < 32  # the popped rows were compacted away
