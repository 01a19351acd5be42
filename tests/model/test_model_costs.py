"""Cost-level entry points of the model (`latency_from_costs`, `breakeven_from_costs`).

Calibration fits (C1, C2) per configuration when the six coefficients are not identifiable,
and must price those with the model's own formulas. These tests pin that the cost-level
functions agree with the coefficient-level ones on the worked example of test_model.py
(C1_SD = 4.46/3, C2_SD = 0.43/3, C1_D = 2.1, C2_D = 0.11) and handle the edges.
"""

import numpy as np
import pytest

from specwatch.model.breakeven import BreakEvenKind, breakeven_from_costs
from specwatch.model.closed_form import breakeven, latency
from specwatch.model.coefficients import Coefficients
from specwatch.model.costs import cost_terms, latency_from_costs

COEF = Coefficients(a_p=0.1, b_p=0.01, a_v=0.02, b_v=0.001, a_d=0.002, b_d=0.0005)
P, G, K, E = 100.0, 100.0, 3, 1.875


def test_breakeven_from_costs_matches_worked_example():
    """λ* = (2.1 − 4.46/3)/(2.1·0.43/3 − 4.46·0.11/3) = 1.84/0.4124 from the cost terms alone."""
    be = breakeven_from_costs(2.1, 0.11, 4.46 / 3, 0.43 / 3)
    assert be.rate == pytest.approx(1.84 / 0.4124, rel=1e-12)
    assert be.kind == BreakEvenKind.PAYS_BELOW


def test_breakeven_is_breakeven_from_costs_of_its_cost_terms():
    """The coefficient-level break-even is the cost-level one applied to cost_terms()."""
    ks = np.array([1.0, 2.0, 3.0, 5.0])
    es = np.array([1.5, 1.75, 1.875, 1.97])
    c1_sd, c2_sd = cost_terms(COEF, ks, es, P, G)
    c1_d, c2_d = cost_terms(COEF, 0.0, 1.0, P, G)
    direct = breakeven(COEF, ks, es, P, G)
    via = breakeven_from_costs(c1_d, c2_d, c1_sd, c2_sd)
    np.testing.assert_array_equal(direct.kind, via.kind)
    np.testing.assert_allclose(direct.rate, via.rate, rtol=1e-12)


def test_breakeven_from_costs_kinds_and_bad_input():
    """SD cheaper at every load (C2_SD ≤ C2_D and C1_SD < C1_D) pays everywhere; SD dearer
    in isolation and under load never pays; negative or NaN costs are undefined."""
    every = breakeven_from_costs(2.0, 0.1, 1.0, 0.05)
    assert every.kind == BreakEvenKind.PAYS_EVERYWHERE and np.isinf(every.rate)
    never = breakeven_from_costs(1.0, 0.05, 2.0, 0.1)
    assert never.kind == BreakEvenKind.NEVER_PAYS and never.rate == 0.0
    bad = breakeven_from_costs([np.nan, 2.0], [0.1, -0.1], [1.0, 1.0], [0.2, 0.2])
    assert bad.kind.tolist() == [BreakEvenKind.UNDEFINED] * 2
    assert np.isnan(bad.rate).all()


def test_latency_from_costs_matches_latency_and_saturates():
    """L = C1/(1 − λ·C2): 2.1/(1 − 2·0.11) = 2.692308 for no SD at λ = 2, the same as
    latency(); NaN at and past λ·C2 = 1 and for negative λ."""
    assert latency_from_costs(2.1, 0.11, 2.0) == pytest.approx(2.1 / 0.78, rel=1e-12)
    c1, c2 = cost_terms(COEF, K, E, P, G)
    lam = np.array([0.0, 1.0, 5.0])
    np.testing.assert_allclose(
        latency_from_costs(c1, c2, lam), latency(COEF, lam, K, E, P, G, 1.0).latency, rtol=1e-12
    )
    out = latency_from_costs(1.0, 0.5, [2.0, 3.0, -1.0])
    assert np.isnan(out).all()
