"""The saturation regime's exact break-even against the numeric scan it replaces.

Protects: `breakeven` on saturating coefficients (closed form over the pieces of L,
`breakeven.saturation_breakeven`) gives the kind and λ* of `_numeric_breakeven` (grid scan
and bisection of S(λ), kept as the reference) on random coefficients, workloads and
capacities, and on the shipped parameters files; it broadcasts like the other model
functions (scalars, arrays, bad points UNDEFINED without poisoning the others).

Tolerance: the reference bisects a bracket of width λ_hi/49 (one grid cell, or the last cell
up to SD's ceiling) 32 times and returns the middle, so its λ* is within
λ_hi/(49·2^33) = 2.4e-12·λ_hi of its root; S's own rounding next to a shallow crossing adds
a little. 1e-11·λ_hi covers both, λ_hi = min(λ_max,SD, λ_max,noSD) being the scan's range.
Where kind or rate still differ, the scan has hit one of its blind spots (two crossings
inside one of its 48 cells, or a crossing in the last 1/49 before the ceiling): the test
then asks a 40x finer scan, which must agree.
"""

import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specwatch.model import closed_form, saturation
from specwatch.model.breakeven import BreakEvenKind
from specwatch.model.closed_form import breakeven
from specwatch.model.coefficients import Coefficients
from specwatch.model.costs import cost_terms
from specwatch.model.params import load_params

EXAMPLES = int(os.environ.get("SPECWATCH_HYPOTHESIS_EXAMPLES", "50"))
PARAMS = sorted((Path(__file__).resolve().parents[2] / "examples" / "params").glob(
    "qwen3-32b-h100-*.yaml"))
REL = 1e-11
FINE_GRID = 2048


def num(lo, hi):
    return st.floats(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False,
                     allow_subnormal=False)


def maybe(strategy):
    return st.one_of(st.just(0.0), strategy)


linear = st.fixed_dictionaries({
    "a_p": num(0.01, 0.5), "b_p": maybe(num(0.0, 0.03)), "a_v": num(5e-3, 0.05),
    "b_v": num(0.0, 2e-4), "a_d": num(0.0, 5e-3), "b_d": num(0.0, 1e-4),
    "b_v_context": maybe(num(0.0, 1e-7)),
})
saturating = st.fixed_dictionaries({
    "c_v": maybe(num(1e-6, 2e-4)), "knee_v": num(0.0, 600.0),
    "c_d": maybe(num(1e-6, 2e-4)), "knee_d": num(0.0, 300.0),
    "max_num_seqs": maybe(num(1.0, 512.0)),
    "kv_cache_tokens": maybe(num(1e3, 2e5)),
    "kv_cache_tokens_sd": maybe(num(1e3, 2e5)),
})
workload = st.tuples(st.integers(1, 8), num(0.0, 1.0), num(1.0, 2000.0), num(1.0, 600.0))


def scan_range(coef, k, e, p, g):
    """λ_hi: the lower of the two systems' ceilings, the range the reference scans."""
    sat = (coef.c_v, coef.knee_v, coef.c_d, coef.knee_d)
    sd = saturation.ceiling(*cost_terms(coef, k, e, p, g), np.float64(g / e), np.float64(k),
                            *sat, coef.capacity(p, g, k))[0]
    nosd = saturation.ceiling(*cost_terms(coef, 0.0, 1.0, p, g), np.float64(g),
                              np.float64(0.0), *sat, coef.capacity(p, g, 0.0))[0]
    return float(np.minimum(sd, nosd))


def agrees(exact, ref, lam_hi):
    if int(exact.kind) != int(ref.kind):
        return False
    a, b = float(exact.rate), float(ref.rate)
    if math.isnan(b) or math.isinf(b) or b == 0.0:
        return a == b or (math.isnan(a) and math.isnan(b))
    return abs(a - b) <= REL * lam_hi


@settings(max_examples=EXAMPLES, deadline=None)
@given(linear, saturating, workload)
def test_exact_breakeven_equals_the_numeric_scan(lin, sat, wl):
    k, frac, p, g = wl
    e = 1.0 + frac * k
    coef = Coefficients(**lin, **sat)
    if not coef.saturates:
        coef = Coefficients(**lin, **dict(sat, c_v=1e-5))
    exact = breakeven(coef, k, e, p, g)
    ref = closed_form._numeric_breakeven(coef, k, e, p, g)
    lam_hi = scan_range(coef, k, e, p, g)
    if not agrees(exact, ref, lam_hi):
        fine = closed_form._numeric_breakeven(coef, k, e, p, g, grid=FINE_GRID)
        assert agrees(exact, fine, lam_hi), (
            f"exact {int(exact.kind)} {float(exact.rate)!r}, scan {int(ref.kind)} "
            f"{float(ref.rate)!r}, fine scan {int(fine.kind)} {float(fine.rate)!r}, "
            f"λ_hi {lam_hi!r}")


@pytest.mark.parametrize("path", PARAMS, ids=lambda p: p.stem)
def test_shipped_parameters_files_every_k_and_acceptance(path):
    """The saturation-regime files the exporter loads: every k of their range, E from just
    above 1 to near k + 1 (PAYS_BELOW, capped at SD's ceiling, NEVER_PAYS all occur)."""
    coef = load_params(path).coefficients
    assert coef.saturates
    k = np.repeat(np.arange(1.0, 7.0), 5)
    e = 1.0 + np.tile([0.05, 0.2, 0.4, 0.6, 0.9], 6) * k
    p, g = 113.66, 226.29
    exact = breakeven(coef, k, e, p, g)
    ref = closed_form._numeric_breakeven(coef, k, e, p, g)
    np.testing.assert_array_equal(exact.kind, ref.kind)
    kinds = set(ref.kind.tolist())
    assert BreakEvenKind.PAYS_BELOW in kinds
    for i in range(k.size):
        assert agrees(closed_form.BreakEven(exact.rate[i], exact.kind[i]),
                      closed_form.BreakEven(ref.rate[i], ref.kind[i]),
                      scan_range(coef, k[i], e[i], p, g)), i


def test_broadcasts_and_isolates_bad_points():
    """Arrays in, arrays of the broadcast shape out; each point equals its scalar call; a bad
    point (NaN, negative k, E above k + 1) is UNDEFINED and leaves its neighbours alone."""
    coef = load_params(PARAMS[0]).coefficients
    k = np.array([[1.0, 3.0, np.nan], [-1.0, 4.0, 2.0]])
    e = np.array([[1.6, 2.2, 2.0], [1.0, 6.0, 2.5]])
    p = np.array([100.0, 113.0, 300.0])
    g = 226.0
    got = breakeven(coef, k, e, p, g)
    assert got.rate.shape == got.kind.shape == (2, 3)
    for idx in np.ndindex(2, 3):
        one = breakeven(coef, k[idx], e[idx], p[idx[1]], g)
        assert int(got.kind[idx]) == int(one.kind)
        np.testing.assert_equal(got.rate[idx], float(one.rate))
    undefined = {(0, 2), (1, 0), (1, 1)}
    for idx in np.ndindex(2, 3):
        is_undefined = int(got.kind[idx]) == BreakEvenKind.UNDEFINED
        assert is_undefined == (idx in undefined), idx
        assert math.isnan(float(got.rate[idx])) == is_undefined


def test_equal_isolated_latency_is_undefined():
    """E = 1 with free drafts: S(0) = C1_D/C1_SD = 1, which side SD pays on is not defined
    (the scan's rule: it needs S(0) != 1 to know what a crossing is)."""
    coef = Coefficients(a_p=0.1, b_p=0.01, a_v=0.03, b_v=5e-5, a_d=0.0, b_d=0.0, c_v=7e-5,
                        knee_v=192.0, c_d=0.0, knee_d=128.0)
    got = breakeven(coef, 3.0, 1.0, 100.0, 200.0)
    assert int(got.kind) == BreakEvenKind.UNDEFINED and math.isnan(float(got.rate))
