"""derive's fast paths give the results of the dict-walk derive, bit for bit.

``derive_model`` reads each window's increases as a row at indices decided once per set of
present keys (``_Plan``, remembered on the ring), and ``window_signals`` builds the same row
from a mapping. Both must equal ``tests/helpers/reference_derive.py`` exactly (not to a
tolerance: the same operations in the same order), in the order values are inserted (the
exposition renders them in that order), on histories that exercise every branch: vLLM with
and without drafts and positions, SGLang, keys that appear or vanish (the plan is made
again), counters the ring has no column for, decreasing and subnormal increases, infinite
values, window histograms on and off. The bisection keeps its 50 midpoints: the same α as
the reference on a sweep of hard inputs.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from helpers import reference_derive
from helpers.ring import EntryRing, HistoryEntry
from helpers.windows import derive_window

from specwatch.common.acceptance import solve_token_acceptance_probability
from specwatch.poll import sources
from specwatch.poll.snapshot import ModelSnapshot, WindowSignals
from specwatch.poll.windows import derive, history

# The histories hold counter totals that overflowed to +inf: an arithmetic warning means a
# path computed with a value that is not one (inf - inf) instead of leaving it out.
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

POOL: list[tuple[str, str | None]] = [
    (sources.DRAFTS, None), (sources.DRAFT_TOKENS, None), (sources.ACCEPTED_TOKENS, None),
    (sources.VERIFY_CALLS, None), (sources.VERIFY_CALLS, "x"), (sources.GENERATION_TOKENS, None),
    (sources.PROMPT_TOKENS, None), (sources.REQUESTS_FINISHED, None),
    (sources.E2E_LATENCY_COUNT, None), (sources.E2E_LATENCY_SUM, None),
    (sources.PROMPT_LEN_COUNT, None), (sources.PROMPT_LEN_SUM, None),
    (sources.GENERATION_LEN_COUNT, None), (sources.GENERATION_LEN_SUM, None),
    *((sources.ACCEPTED_PER_POSITION, p) for p in ("0", "1", "2", "10", "x")),
    *((sources.E2E_LATENCY_BUCKET, le) for le in ("0.5", "1", "+Inf")),
    *((sources.TTFT_BUCKET, le) for le in ("0.1", "+Inf")),
]
#: The usual vLLM and SGLang key sets (most histories use one, some keys come and go).
VLLM = [k for k in POOL if k[0] not in (sources.VERIFY_CALLS,)]
SGLANG = [(sources.VERIFY_CALLS, None), (sources.GENERATION_TOKENS, None),
          (sources.PROMPT_TOKENS, None), (sources.REQUESTS_FINISHED, None)]


def _increase(rng: random.Random) -> float:
    r = rng.random()
    if r < 0.08:
        return 0.0
    if r < 0.12:
        return -rng.uniform(0, 50)  # a decrease (the ring stores whatever it is given)
    if r < 0.15:
        return 5e-324  # a subnormal increase: means overflow to inf and are dropped
    if r < 0.17:
        return math.inf
    if r < 0.5:
        return float(rng.randint(0, 500))
    return rng.uniform(0, 500)


def _history(rng: random.Random, n: int) -> list[HistoryEntry]:
    keys = rng.choice([VLLM, SGLANG, POOL])
    cum = {k: rng.uniform(0, 1e4) for k in POOL}
    entries = []
    t = rng.uniform(0, 100)
    for _ in range(n):
        t += rng.choice([1e-9, 0.5, 5.0, 5.0, 30.0])
        present = [k for k in keys if rng.random() < 0.93]
        for k in present:
            cum[k] = cum[k] + _increase(rng)
        sample = rng.choice([None, None, rng.random()])
        entries.append(HistoryEntry(t, {k: cum[k] for k in present}, sample))
    return entries


def _same(got: ModelSnapshot, want: ModelSnapshot) -> None:
    assert got == want
    for g, w in zip(got.windows, want.windows, strict=True):
        assert list(g.values.items()) == list(w.values.items())  # rendering order too
        assert [(n, list(p.items())) for n, p in g.positions.items()] == \
            [(n, list(p.items())) for n, p in w.positions.items()]


@pytest.mark.parametrize("seed", range(40))
def test_derive_model_equals_the_reference_as_the_history_grows(seed: int) -> None:
    """Derived after every appended entry (the remembered plan reused, and made again when
    a key appears or vanishes): equal to the reference's snapshot each time."""
    rng = random.Random(seed)
    cfg = derive.DeriveConfig(windows=(("a", 4.0), ("b", 30.0), ("c", 1e9)),
                              count_window=rng.choice([0, 50, 400]),
                              min_bimodality_samples=10**9, histograms=rng.random() < 0.5)
    ring = EntryRing()
    mh = history.ModelHistory("m", ring, configured_k=rng.choice([None, 0, 3, 7]),
                              gauges=rng.choice([{}, {sources.SPEC_DRAFT_TOKENS: 4.0},
                                                 {sources.SPEC_STEPS: 2.0}]),
                              signals=frozenset({sources.DRAFTS}))
    for entry in _history(rng, rng.randint(1, 40)):
        ring.append(entry)
        want = reference_derive.derive_model(mh, cfg, "vllm")
        if not cfg.histograms:  # the reference always builds them
            want = dataclasses.replace(want, windows=tuple(
                dataclasses.replace(w, histograms={}) for w in want.windows))
        _same(derive.derive_model(mh, cfg, "vllm"), want)


@pytest.mark.parametrize("seed", range(40))
def test_window_signals_from_a_mapping_equals_the_reference(seed: int) -> None:
    """derive_window (window_signals over a mapping of increases) against the reference's
    derive_window, for every base of a random history."""
    rng = random.Random(1000 + seed)
    entries = _history(rng, 12)
    k = rng.choice([None, 2, 5])
    gauges = rng.choice([{}, {sources.SPEC_DRAFT_TOKENS: 3.0}])
    for base in entries[:-1]:
        got = derive_window("w", base, entries[-1], k, gauges)
        want = reference_derive.derive_window("w", base, entries[-1], k, gauges)
        assert (got is None) == (want is None)
        if got is not None:
            assert isinstance(got, WindowSignals)
            _same(ModelSnapshot("m", "vllm", k, (got,)), ModelSnapshot("m", "vllm", k, (want,)))


def test_a_counter_without_a_column_reads_zero() -> None:
    """A ring that never saw finished requests (no column): the windows read 0 for them,
    as the dict walk did (no arrival rate, requests 0)."""
    ring = EntryRing([
        HistoryEntry(0.0, {(sources.DRAFTS, None): 10.0, (sources.DRAFT_TOKENS, None):
                                   30.0, (sources.ACCEPTED_TOKENS, None): 12.0}),
        HistoryEntry(5.0, {(sources.DRAFTS, None): 20.0, (sources.DRAFT_TOKENS, None):
                                   60.0, (sources.ACCEPTED_TOKENS, None): 30.0})])
    mh = history.ModelHistory("m", ring)
    cfg = derive.DeriveConfig(windows=(("1m", 60.0),), count_window=5)
    got = derive.derive_model(mh, cfg, "vllm")
    _same(got, reference_derive.derive_model(mh, cfg, "vllm"))
    (w,) = got.windows
    assert w.requests == 0.0 and derive.ARRIVAL_RATE not in w.values
    assert w.values[derive.ACCEPTANCE_RATE] == 18.0 / 30.0


def test_finite_drops_only_what_is_not_finite() -> None:
    """The one-sum check: an overflowing sum of finite values keeps them all (the filter
    runs and finds nothing); inf, -inf and NaN are dropped; a finite dict is returned as is."""
    ok = {"a": 1.0, "b": 0.0}
    assert derive._finite(ok) is ok
    assert derive._finite({}) == {}
    big = {"a": 1e308, "b": 1e308, "c": -0.0}
    assert derive._finite(big) == big
    assert derive._finite({"a": math.inf, "b": 2.0, "c": -math.inf, "d": math.nan}) == {"b": 2.0}
    assert list(derive._finite({"x": 1.0, "y": math.nan, "z": 3.0})) == ["x", "z"]


def _hard_cases(rng: random.Random, n: int) -> list[tuple[float, float]]:
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.4:
            k = float(rng.randint(1, 8))
        elif r < 0.6:
            k = rng.uniform(0, 10)
        elif r < 0.75:
            k = 10 ** rng.uniform(-15, 6)
        else:
            k = rng.choice([5e-324, 1e-300, 2.0 ** -52, 0.5, 1e308, math.inf, -1.0, 0.0,
                            math.nan])
        q = k + 1.0
        s = rng.random()
        top = q if math.isfinite(q) else 1e6
        if s < 0.4:
            e = rng.uniform(1.0, top)
        elif s < 0.55:
            e = 1.0 + 10 ** rng.uniform(-16, 0) * (top - 1.0)
        elif s < 0.7:
            e = top - 10 ** rng.uniform(-16, 0) * (top - 1.0)
        elif s < 0.9:  # E at a dyadic α, and its neighbours: ties for the comparisons
            a = rng.randint(1, 2 ** 20 - 1) / 2 ** 20
            e = (1.0 - a ** q) / (1.0 - a) if math.isfinite(q) else 1.0 / (1.0 - a)
            e = rng.choice([e, math.nextafter(e, math.inf), math.nextafter(e, 0.0)])
        else:
            e = rng.choice([1.0, math.nextafter(1.0, 2.0), q, math.nextafter(q, 0.0), 0.5,
                            math.nan, math.inf, -math.inf])
        out.append((e, k))
    return out


def test_unrolled_bisection_gives_the_references_alpha_bit_for_bit() -> None:
    """The 50 midpoints as lo + 2^-i give the same α as the reference's halving loop with
    its convergence test, including ties (e exactly E at a midpoint) and extreme k."""
    for e, k in _hard_cases(random.Random(7), 20000):
        got = solve_token_acceptance_probability(e, k)
        want = reference_derive.solve_token_acceptance_probability(e, k)
        assert (got is None) == (want is None), (e, k)
        if got is not None:
            assert got == want and math.copysign(1.0, got) == math.copysign(1.0, want), (e, k)
