"""The KV-cache capacity in the model (model.md, "Fitted capacity").

Protects: the SD capacity `kv_cache_tokens_sd` applies to SD only (the no-SD system keeps the
whole cache); with it absent every number is the old one (old parameter files, closed-loop
L(B) included); past the capacity a closed-loop run has B − N waiting, so its latency grows
linearly in B at the constant throughput N/L(N), which is the open-loop ceiling: the closed-
and open-loop pictures agree.
"""

import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specwatch import model
from specwatch.model import saturation
from specwatch.model.coefficients import Coefficients
from specwatch.model.costs import cost_terms
from specwatch.model.params import load_params, params_from_mapping

FAST = settings(max_examples=int(os.environ.get("SPECWATCH_HYPOTHESIS_EXAMPLES", "50")),
                deadline=None)
LIN = dict(a_p=0.2, b_p=0.02, a_v=0.033, b_v=2e-5, a_d=0.006, b_d=3e-5)


def num(lo, hi):
    return st.floats(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False)


def test_sd_capacity_applies_to_sd_only():
    coef = Coefficients(**LIN, kv_cache_tokens_sd=30000.0)
    assert math.isinf(float(coef.capacity(144.0, 200.0, 0)))
    assert float(coef.capacity(144.0, 200.0, 3)) == pytest.approx(30000.0 / 344.0)
    both = Coefficients(**LIN, kv_cache_tokens=80000.0, kv_cache_tokens_sd=30000.0)
    assert float(both.capacity(144.0, 200.0, 0)) == pytest.approx(80000.0 / 344.0)
    assert float(both.capacity(144.0, 200.0, 2)) == pytest.approx(30000.0 / 344.0)
    # Without the SD value, kv_cache_tokens bounds both systems (the old meaning).
    old = Coefficients(**LIN, kv_cache_tokens=80000.0)
    assert float(old.capacity(144.0, 200.0, 2)) == float(old.capacity(144.0, 200.0))


@FAST
@given(num(0.0, 0.05), num(0.0, 2e-4), num(0.0, 600.0), num(1.0, 400.0), st.integers(0, 6),
       num(16.0, 2000.0), num(16.0, 600.0))
def test_no_capacity_leaves_the_closed_loop_latency_unchanged(c_v, c_d, knee, b, k, p, g):
    """kv_cache_tokens_sd absent: model.batch_latency is the roofline L(B), bit for bit."""
    coef = Coefficients(**LIN, c_v=c_v, knee_v=knee, c_d=c_d, knee_d=knee / 4)
    e = 1.0 + 0.5 * k
    c1, c2 = cost_terms(coef, k, e, p, g)
    old = saturation.batch_latency(np.float64(b), c1, c2, g / e, np.float64(k), coef.c_v,
                                   coef.knee_v, coef.c_d, coef.knee_d)
    assert float(model.batch_latency(coef, b, k, e, p, g)) == float(old)


def test_past_the_capacity_latency_is_linear_in_b_at_the_open_loop_ceiling():
    coef = Coefficients(**LIN, kv_cache_tokens_sd=30000.0)
    k, e, p, g = 3, 2.9, 144.5, 200.0
    n = 30000.0 / (p + g)
    b = np.array([1.2 * n, 2.0 * n, 3.0 * n])
    lat = model.batch_latency(coef, b, k, e, p, g)
    at_cap = float(model.batch_latency(coef, n, k, e, p, g))
    np.testing.assert_allclose(lat, b / n * at_cap, rtol=1e-12)
    # Constant throughput B/L past the capacity, equal to the open-loop ceiling ...
    lam_max = float(model.throughput_ceiling(coef, k, e, p, g))
    np.testing.assert_allclose(b / lat, lam_max, rtol=1e-12)
    # ... above which the open-loop model says saturated (never a number), and just below
    # which its fixed point approaches the capacity.
    above = model.latency(coef, lam_max * 1.001, k, e, p, g, max_utilization=1.0)
    assert int(above.reason) == model.Reason.SATURATED and math.isnan(float(above.latency))
    below = model.latency(coef, lam_max * 0.999, k, e, p, g, max_utilization=1.0)
    assert lam_max * 0.999 * float(below.latency) == pytest.approx(n, rel=0.01)
    # The no-SD system keeps the whole cache: no capacity, its own (higher) ceiling.
    nosd = float(model.throughput_ceiling(coef, 0, 1.0, p, g))
    assert nosd > lam_max and math.isclose(nosd, 1 / float(cost_terms(coef, 0, 1, p, g)[1]))


def test_params_file_carries_the_sd_capacity(tmp_path):
    doc = {"system": "s", "coefficients": LIN,
           "saturation": {"c_v": 5e-5, "knee_v": 96, "c_d": 2e-4, "knee_d": 64},
           "capacity": {"kv_cache_tokens_sd": 29549.5}}
    params = params_from_mapping(doc)
    assert params.coefficients.kv_cache_tokens_sd == 29549.5
    assert params.to_mapping()["capacity"] == {"kv_cache_tokens_sd": 29549.5}
    path = tmp_path / "p.yaml"
    path.write_text("system: s\ncoefficients: {a_p: 0.2, b_p: 0.02, a_v: 0.033, b_v: 0,"
                    " a_d: 0.006, b_d: 0}\ncapacity: {kv_cache_tokens_sd: -5}\n")
    from specwatch.common.errors import ConfigError

    with pytest.raises(ConfigError, match="kv_cache_tokens_sd"):
        load_params(path)


def test_demo_speed_scaling_keeps_the_capacity(tmp_path):
    """`make demo --speed` divides durations, never tokens: the SD capacity survives it."""
    from types import SimpleNamespace

    from specwatch.app.demo import scaled_params_file

    src = tmp_path / "p.yaml"
    src.write_text("system: s\ncoefficients: {a_p: 0.2, b_p: 0.02, a_v: 0.033, b_v: 0,"
                   " a_d: 0.006, b_d: 0}\ncapacity: {kv_cache_tokens_sd: 29549.5}\n")
    scenario = SimpleNamespace(models=[SimpleNamespace(params=str(src))])
    out = scaled_params_file(scenario, 0, 10.0, tmp_path)
    scaled = load_params(out).coefficients
    assert scaled.kv_cache_tokens_sd == 29549.5 and scaled.a_p == pytest.approx(0.02)
