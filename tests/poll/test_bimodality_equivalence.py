"""The prefix-sum bimodality gives what the per-segment one gave.

``specwatch.poll.windows.bimodality`` was rewritten for speed (one centring shared by the raw
coefficient and the change points, one distance vector per bound, kept segments as
slices). The module before the rewrite is kept verbatim in
``tests/helpers/reference_bimodality.py``; on random windows of per-poll samples (0 to
400 of them: noise, steps, dips that recover, drifts, interleaved populations, rounded
values full of ties, constant and nearly constant data around the "no spread" limit
m2 <= 1e-18) both must find the same change points and segments, return None in the
same cases and agree on every coefficient to 1e-9.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import reference_bimodality as ref
from hypothesis import given, settings
from hypothesis import strategies as st

from specwatch.poll.windows import bimodality

EXAMPLES = 300

#: Noise levels: none, rounding-level, around the "no spread" limit (sd 1e-9 is m2 1e-18),
#: and realistic per-poll spreads of the acceptance rate.
SPREADS = [0.0, 1e-15, 1e-12, 5e-10, 1e-9, 1.5e-9, 3e-9, 1e-6, 1e-3, 0.03, 0.2]


def _window(seed: int, n: int, kind: str, spread: float, changes: int) -> np.ndarray:
    """``n`` samples of one kind of acceptance history, from ``seed``."""
    rng = np.random.default_rng(seed)
    if kind == "level":
        base = np.full(n, rng.uniform(0, 1))
    elif kind == "steps":
        cuts = np.sort(rng.integers(0, n + 1, changes))
        base = np.repeat(rng.uniform(0, 1, changes + 1), np.diff([0, *cuts, n]))
    elif kind == "dip":
        base = np.full(n, rng.uniform(0.4, 0.9))
        a, b = np.sort(rng.integers(0, n + 1, 2))
        base[a:b] -= rng.uniform(0.05, 0.4)
    elif kind == "drift":
        base = np.linspace(rng.uniform(0, 1), rng.uniform(0, 1), n)
    elif kind == "mixture":
        block = int(rng.integers(1, 13))
        turns = np.repeat(rng.random(n // block + 1) < rng.uniform(0.1, 0.9), block)[:n]
        base = np.where(turns, 0.8, 0.1)
    else:  # "rounded": few distinct values, many exact ties among the gains
        base = np.round(rng.uniform(0, 1, n), 1)
    return base + rng.normal(0.0, spread, n)


def _assert_same(x: np.ndarray | list[float]) -> None:
    for k in (0, 1, 2, 3):
        assert bimodality.change_points(x, k) == ref.change_points(x, k), k
        got, want = bimodality.segments(x, k), ref.segments(x, k)
        assert len(got) == len(want), k
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)  # NaN where NaN (the non-finite test)
        c_got = bimodality.coexistence_coefficient(x, k)
        c_want = ref.coexistence_coefficient(x, k)
        assert (c_got is None) == (c_want is None), (k, c_got, c_want)
        if c_want is not None:
            assert c_got == pytest.approx(c_want, rel=1e-9, abs=0.0), k
    s_got, s_want = bimodality.sarle_coefficient(x), ref.sarle_coefficient(x)
    assert (s_got is None) == (s_want is None)
    if s_want is not None:
        assert s_got == pytest.approx(s_want, rel=1e-9, abs=0.0)


@settings(max_examples=EXAMPLES, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 400),
       kind=st.sampled_from(["level", "steps", "dip", "drift", "mixture", "rounded"]),
       spread=st.sampled_from(SPREADS), changes=st.integers(1, 4))
def test_same_as_the_reference_on_shaped_windows(seed: int, n: int, kind: str,
                                                 spread: float, changes: int) -> None:
    _assert_same(_window(seed, n, kind, spread, changes))


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 0.25, 0.5, 1.0])),
                max_size=60))
def test_same_as_the_reference_on_arbitrary_short_windows(x: list[float]) -> None:
    """Short windows (what the 1m window holds) of arbitrary rates, exact ties included;
    shrinkable, so a difference reduces to a small example."""
    _assert_same(x)


def test_same_on_windows_at_the_no_spread_limit() -> None:
    """Segments whose variance straddles 1e-18 (the "no spread" rule) and constant
    segments whose mean is not exactly representable (0.1 summed 60 times is not 6.0):
    the same segments are left out of the mean."""
    rng = np.random.default_rng(15)
    undefined = 0
    for sd in np.geomspace(3e-10, 3e-9, 40):
        for level in (0.1, 0.3, 0.57, 0.7):
            x = np.r_[np.full(60, level), level / 2 + rng.normal(0, sd, 60)]
            _assert_same(x)
            undefined += ref.coexistence_coefficient(x) is None
    assert 0 < undefined < 160  # both sides of the limit were exercised


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # overflow and inf - inf, as before
def test_non_finite_samples_give_the_same_answer() -> None:
    """NaN or inf in a window (derive never passes them; the functions are public): the
    change points and the None result are the reference's."""
    for bad in (np.nan, np.inf, -np.inf, 1e200):
        x = np.r_[np.full(10, 0.5), [bad], np.linspace(0.2, 0.3, 12)]
        _assert_same(x)


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 400),
       st.sampled_from(["level", "steps", "dip", "drift", "mixture", "rounded"]),
       st.sampled_from(SPREADS))
def test_the_two_end_bounds_at_once_are_the_per_bound_vectors_bit_for_bit(
        seed: int, n: int, kind: str, spread: float) -> None:
    """The segmentation computes the distance vectors of bounds 0 and n as two rows of one
    array (fewer numpy calls): every element equals the one-bound computation exactly, so
    the gains and change points cannot move."""
    x = _window(seed, n, kind, spread, 2)
    buf = np.add.accumulate(bimodality._centred(x), axis=1)
    cs, cs2 = buf[0], buf[1]
    k = bimodality._counts(n)
    both = bimodality._ends(cs, cs2, n)
    assert both[0].tobytes() == bimodality._dist(cs, cs2, 0, k[n:]).tobytes()
    assert both[1].tobytes() == bimodality._dist(cs, cs2, n, k[:n + 1]).tobytes()
