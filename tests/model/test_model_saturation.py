"""Property tests of the saturation regime (model.md "Saturation regime").

Protects: the new terms at zero give exactly the old six-coefficient model (old parameter
files predict the same numbers); latency grows with load; the bisection fixed point either
converges or reports saturation, exactly when λ is at or above the throughput ceiling; and
λ* matches a brute-force root computed by an independent scalar solver (scipy's brentq on the
per-system fixed point, then on L_SD − L_D along λ)."""

import math
import os

import numpy as np
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq

from specwatch.model import saturation
from specwatch.model.breakeven import BreakEvenKind
from specwatch.model.closed_form import Reason, breakeven, latency
from specwatch.model.coefficients import Coefficients
from specwatch.model.costs import cost_terms, throughput_ceiling

FAST = settings(max_examples=int(os.environ.get("SPECWATCH_HYPOTHESIS_EXAMPLES", "50")),
                deadline=None)


def num(lo, hi):
    # No subnormals: a cost of 5e-324 s makes 0.95/C2 overflow to an infinite arrival rate
    # (falsified at 200 examples, before and after the exact break-even).
    return st.floats(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False,
                     allow_subnormal=False)


linear = st.fixed_dictionaries({
    "a_p": num(0.01, 0.5), "b_p": num(0.0, 0.03), "a_v": num(5e-3, 0.05),
    "b_v": num(0.0, 2e-4), "a_d": num(0.0, 5e-3), "b_d": num(0.0, 1e-4),
})
saturating = st.fixed_dictionaries({
    "c_v": num(1e-6, 2e-4), "knee_v": num(0.0, 600.0),
    "c_d": num(0.0, 2e-4), "knee_d": num(0.0, 300.0),
    "max_num_seqs": st.one_of(st.just(0.0), num(8.0, 512.0)),
})
workload = st.tuples(st.integers(1, 6), num(0.0, 1.0), num(16.0, 2000.0), num(16.0, 600.0))


def _e(k, frac):
    return 1.0 + frac * k


def reference_latency(coef, lam, k, e, p, g):
    """Independent scalar solver: smallest root of B − λ·L(B) by a fine scan and brentq."""
    c1, c2 = (float(x) for x in cost_terms(coef, k, e, p, g))
    cap = float(coef.capacity(p, g))

    def big_l(b):
        return saturation.batch_latency(np.asarray(b, dtype=float), c1, c2, g / e, float(k),
                                        coef.c_v, coef.knee_v, coef.c_d, coef.knee_d)

    if lam == 0:
        return c1
    # Upper end of the scan: L(B) <= C1 + s·B (s the slope past every knee), so the root
    # lies below λ·C1/(1 − λ·s) when λ·s < 1.
    slope = c2 + g / e * ((k + 1) * coef.c_v + k * coef.c_d)
    bound = lam * c1 / (1 - lam * slope) * 1.5 if lam * slope < 1 else 1e12
    top = min(cap, bound) if math.isfinite(cap) else bound
    grid = np.concatenate([[0.0], np.geomspace(1e-6, top, 4000)])
    h = grid - lam * big_l(grid)
    pos = np.flatnonzero(h > 0)
    if pos.size == 0:
        return math.nan
    i = pos[0]
    b = brentq(lambda x: float(x - lam * big_l(x)), grid[i - 1], grid[i], xtol=1e-12,
               rtol=1e-12)
    return float(big_l(b))


@FAST
@given(linear, workload, num(0.0, 1.0))
def test_zero_new_terms_is_the_linear_model_exactly(lin, wl, load):
    """Saturation terms at 0: the old closed form, bit for bit (old params files unchanged)."""
    k, frac, p, g = wl
    e = _e(k, frac)
    coef = Coefficients(**lin)
    assert not coef.saturates
    c2 = float(cost_terms(coef, k, e, p, g)[1])
    # A subnormal C2 (b_d = 5e-324, found by hypothesis) would overflow λ to inf.
    lam = load * 0.95 / c2 if c2 > 1e-12 else load * 10
    c1 = float(cost_terms(coef, k, e, p, g)[0])
    got = latency(coef, lam, k, e, p, g, max_utilization=1.0)
    assert float(got.latency) == c1 / (1.0 - lam * c2)


@FAST
@given(linear, workload, num(0.0, 0.95))
def test_bisection_path_agrees_with_the_closed_form_when_the_knee_is_never_reached(
    lin, wl, load
):
    """The bracketing solver itself reduces to L = C1/(1 − λ·C2): a compute-bound slope whose
    knee lies beyond every reachable batch changes nothing."""
    k, frac, p, g = wl
    e = _e(k, frac)
    old = Coefficients(**lin)
    c1, c2 = (float(x) for x in cost_terms(old, k, e, p, g))
    # A subnormal C2 (b_p = 5e-324, found by hypothesis) overflows λ = load/C2 and the knee
    # built from it to inf/NaN: no load, no knee to compare.
    assume(c2 > 1e-12)
    lam = load / c2
    b_max = lam * c1 / (1 - lam * c2)
    new = Coefficients(**lin, c_v=1e-4, knee_v=(b_max + 1) * (k + 1) * 2, c_d=1e-4,
                       knee_d=(b_max + 1) * 2)
    assert new.saturates
    a = float(latency(old, lam, k, e, p, g, max_utilization=1.0).latency)
    b = float(latency(new, lam, k, e, p, g, max_utilization=1.0).latency)
    assert math.isclose(a, b, rel_tol=1e-9)


@FAST
@given(linear, saturating, workload)
def test_latency_is_increasing_in_arrival_rate(lin, sat, wl):
    k, frac, p, g = wl
    e = _e(k, frac)
    coef = Coefficients(**lin, **sat)
    lam_max, _ = saturation.ceiling(*(np.asarray(x, dtype=float) for x in (
        *cost_terms(coef, k, e, p, g), g / e, k)), coef.c_v, coef.knee_v, coef.c_d,
        coef.knee_d, coef.capacity(p, g))
    lams = np.linspace(0.0, float(lam_max) * 0.999, 200)
    lat = latency(coef, lams, k, e, p, g, max_utilization=1.0).latency
    assert np.all(np.isfinite(lat))
    assert np.all(np.diff(lat) >= -1e-12 * lat[1:])


@FAST
@given(linear, saturating, workload, num(0.0, 1.5))
def test_fixed_point_converges_or_reports_saturation(lin, sat, wl, load):
    """Either a latency that solves B = λ·L(B) (matching an independent solver), or
    SATURATED with no number, and saturation exactly when no root exists."""
    k, frac, p, g = wl
    e = _e(k, frac)
    coef = Coefficients(**lin, **sat)
    c1, c2 = cost_terms(coef, k, e, p, g)
    lam_max, _ = saturation.ceiling(c1, c2, np.float64(g / e), np.float64(k), coef.c_v,
                                    coef.knee_v, coef.c_d, coef.knee_d, coef.capacity(p, g))
    lam = float(load * lam_max)
    got = latency(coef, lam, k, e, p, g, max_utilization=1.0)
    ref = reference_latency(coef, lam, k, e, p, g)
    if load >= 1.0:
        assert int(got.reason) == Reason.SATURATED and math.isnan(float(got.latency))
    elif load < 0.999:
        assert int(got.reason) == Reason.OK
        lat = float(got.latency)
        b = lam * lat
        resid = b - lam * float(saturation.batch_latency(
            np.float64(b), float(c1), float(c2), g / e, float(k), coef.c_v, coef.knee_v,
            coef.c_d, coef.knee_d))
        assert abs(resid) <= 1e-9 * max(b, 1e-12) + 1e-12
        assert math.isclose(lat, ref, rel_tol=1e-6)
    if math.isnan(ref) and load < 0.999:  # the reference scan cannot resolve h's last
        assert math.isnan(float(got.latency))  # sliver of positivity next to the ceiling


@settings(max_examples=int(os.environ.get("SPECWATCH_HYPOTHESIS_EXAMPLES", "25")),
          deadline=None)
@given(linear, saturating, workload)
# Found in CI (2026-12-01): λ* is SD's ceiling (67.276 req/s) and no-SD's ceiling lies only
# 0.11% above it (67.352); every probe above λ* falls in the last sliver before no-SD's
# ceiling, where the reference scan returns NaN for no-SD too (the model: 6.008 s), so no
# probe can show SD losing.
@example(lin={"a_p": 0.328125, "b_p": 0.0, "a_v": 0.03515625, "b_v": 7.641695746334943e-05,
              "a_d": 0.0027722002556772245, "b_d": 0.0},
         sat={"c_v": 0.0001677383576375105, "knee_v": 405.0, "c_d": 0.0, "knee_d": 0.0,
              "max_num_seqs": 0.0},
         wl=(3, 0.9140625, 16.0, 86.0))
def test_breakeven_matches_a_brute_force_root(lin, sat, wl):
    """λ* from the model equals the first λ where the independent solver finds L_SD = L_D,
    or SD's ceiling when SD is faster up to it and saturates before no-SD."""
    k, frac, p, g = wl
    e = _e(k, frac)
    sat = dict(sat, max_num_seqs=0.0)
    coef = Coefficients(**lin, **sat)
    be = breakeven(coef, k, e, p, g)
    assume(int(be.kind) == BreakEvenKind.PAYS_BELOW)
    lam_star = float(be.rate)

    def diff(lam):
        sd = reference_latency(coef, lam, k, e, p, g)
        nosd = reference_latency(coef, lam, 0, 1.0, p, g)
        return sd, nosd

    sd0, nosd0 = diff(0.0)
    assert sd0 < nosd0
    # A gain at the rounding level (acceptance near 0: SD and no-SD differ by 1e-12 of the
    # latency) has no break-even that two solvers can agree on to better than their own
    # rounding; the property is about material gains.
    assume((nosd0 - sd0) / nosd0 > 1e-6)
    lo = diff(lam_star * 0.99)
    assert lo[0] < lo[1]  # SD still pays just below λ*
    # Just above λ*, and below no-SD's ceiling (it can lie within 1% of λ*: knee_v = 0,
    # E near k + 1 gives the two systems slopes 0.5% apart). There: SD slower, or SD
    # saturated while no-SD is not. "Just above" is 1%, or closer where SD's latency only
    # touches no-SD's: a dip of S below 1 can close again within 1% (falsified at 200
    # examples: S < 1 on [94.69, 94.88] req/s only, then above 1 to the ceiling; the exact
    # break-even finds that first crossing, which the 48-point scan stepped over).
    nosd_max = float(throughput_ceiling(coef, 0, 1.0, p, g))
    # Ceilings equal to rounding (free drafts, E = k + 1: both slopes g·c_v) leave no room
    # above λ* for a probe two solvers resolve (falsified at 200 examples).
    assume(nosd_max > lam_star * (1 + 1e-9))

    probes = [diff(lam_star + min(step * lam_star, 0.5 * (nosd_max - lam_star)))
              for step in (1e-2, 1e-3, 1e-4)]
    # Below no-SD's ceiling but in the sliver next to it, the reference scan cannot resolve
    # no-SD's latency (NaN: see test_fixed_point_converges_or_reports_saturation): a probe
    # compares nothing. No probe left: nothing to check at this λ*.
    resolved = [hi for hi in probes if not math.isnan(hi[1])]
    assume(resolved)
    assert any(math.isnan(hi[0]) or hi[0] > hi[1] for hi in resolved)
