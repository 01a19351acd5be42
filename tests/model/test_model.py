"""Worked examples of the latency model, checked against numbers computed by hand.

Shared example system (seconds): a_p=0.1, b_p=0.01, a_v=0.02, b_v=0.001, a_d=0.002,
b_d=0.0005; p=100 prompt tokens, g=100 generated tokens; k=3 drafts at α=0.5.

    E    = (1 − 0.5^4)/(1 − 0.5)        = 0.9375/0.5            = 1.875
    g/E  = 100/1.875                     = 160/3                 = 53.333…
    C1_SD = 0.1 + (160/3)·(0.02 + 3·0.002) = 0.1 + 4.16/3         = 4.46/3 = 1.486667
    C2_SD = 0.01 + (160/3)·(0.001 + 3·0.0005) = 0.01 + 0.4/3      = 0.43/3 = 0.143333
    C1_D  = 0.1 + 100·0.02               = 2.1
    C2_D  = 0.01 + 100·0.001             = 0.11
"""

import math

import numpy as np
import pytest

from specwatch.model.acceptance import (
    acceptance_length_from_alpha,
    acceptance_length_from_profile,
    alpha_from_acceptance_length,
    extend_profile,
)
from specwatch.model.breakeven import BreakEvenKind
from specwatch.model.closed_form import (
    Reason,
    breakeven,
    breakeven_arrival_rate,
    latency,
    optimal_draft_length,
    predict,
    reason_text,
    speedup,
)
from specwatch.model.coefficients import Coefficients, ExpertCoefficients, MoECoefficients
from specwatch.model.costs import cost_terms
from specwatch.model.naive import naive_speedup_scalar

COEF = Coefficients(a_p=0.1, b_p=0.01, a_v=0.02, b_v=0.001, a_d=0.002, b_d=0.0005)
P, G, K, ALPHA = 100.0, 100.0, 3, 0.5
E = 1.875


def test_acceptance_length_from_alpha_worked_example():
    """E(0.5, 3) = 1 + 0.5 + 0.25 + 0.125 = 1.875; E(0, k) = 1; E(α, 0) = 1."""
    assert acceptance_length_from_alpha(ALPHA, K) == pytest.approx(1.875, rel=1e-15)
    assert acceptance_length_from_alpha(0.0, 5) == 1.0
    assert acceptance_length_from_alpha(0.7, 0) == pytest.approx(1.0)


def test_acceptance_length_near_one_stays_accurate():
    """α → 1 must approach k + 1 without catastrophic cancellation."""
    e = acceptance_length_from_alpha(1 - 1e-12, 4)
    assert e == pytest.approx(5.0, rel=1e-9)


def test_alpha_round_trip_and_limits():
    """α from E inverts E(α, k); E = 1 → α = 0, E = k+1 → 1, out of range and k = 0 → NaN."""
    alphas = np.array([0.0, 0.1, 0.5, 0.8, 0.95])
    ks = np.array([1, 2, 3, 5, 8])
    back = alpha_from_acceptance_length(acceptance_length_from_alpha(alphas, ks), ks)
    np.testing.assert_allclose(back, alphas, atol=1e-12)
    assert alpha_from_acceptance_length(4.0, 3) == 1.0
    assert np.isnan(alpha_from_acceptance_length(4.5, 3))
    assert np.isnan(alpha_from_acceptance_length(0.9, 3))
    assert np.isnan(alpha_from_acceptance_length(1.0, 0))


def test_acceptance_length_from_profile():
    """E(k) = 1 + Σ_{i<k} p_i: with [0.78, 0.48, 0.27], E(2) = 2.26, E(3) = 2.53; k > len → NaN."""
    prof = [0.78, 0.48, 0.27]
    np.testing.assert_allclose(
        acceptance_length_from_profile(prof, [0, 1, 2, 3]), [1.0, 1.78, 2.26, 2.53]
    )
    assert np.isnan(acceptance_length_from_profile(prof, 4))
    assert np.isnan(acceptance_length_from_profile(prof, 1.5))


def test_cost_terms_worked_example():
    """C1/C2 of both systems match the hand arithmetic in the module docstring."""
    c1, c2 = cost_terms(COEF, K, E, P, G)
    assert c1 == pytest.approx(4.46 / 3, rel=1e-12)
    assert c2 == pytest.approx(0.43 / 3, rel=1e-12)
    c1d, c2d = cost_terms(COEF, 0, 1, P, G)
    assert (c1d, c2d) == (pytest.approx(2.1), pytest.approx(0.11))


def test_context_slope_adds_to_b_v():
    """b_v_context = 1e-6 s/token adds 1e-6·(p + g/2) = 1e-6·150 to b_v: C2_D += 100·1.5e-4."""
    coef = Coefficients(**{**COEF.__dict__, "b_v_context": 1e-6})
    _, c2d = cost_terms(coef, 0, 1, P, G)
    assert c2d == pytest.approx(0.11 + 100 * 1.5e-4)


def test_latency_and_speedup_worked_example():
    """At λ = 2 req/s:
    ρ_SD = 2·0.43/3 = 0.286667, L_SD = 1.486667/0.713333 = 2.084112 s
    ρ_D  = 2·0.11   = 0.22,     L_D  = 2.1/0.78          = 2.692308 s
    S    = (2.1/0.78)·(2.14/3)/(4.46/3) = 4.494/3.4788 = 1.291825
    """
    pred = predict(COEF, 2.0, K, E, P, G)
    assert pred.sd.latency == pytest.approx((4.46 / 3) / (1 - 0.86 / 3), rel=1e-12)
    assert pred.sd.latency == pytest.approx(2.084112, rel=1e-6)
    assert pred.nosd.latency == pytest.approx(2.692308, rel=1e-6)
    assert pred.speedup == pytest.approx(4.494 / 3.4788, rel=1e-12)
    assert pred.sd.utilization == pytest.approx(0.286667, rel=1e-5)
    assert pred.nosd.utilization == pytest.approx(0.22)
    assert bool(pred.valid) and pred.reason == Reason.OK


def test_isolated_speedup_worked_example():
    """S(0) = 1/C1_R = 2.1/(4.46/3) = 6.3/4.46 = 1.412556."""
    assert speedup(COEF, 0.0, K, E, P, G) == pytest.approx(6.3 / 4.46, rel=1e-12)


def test_breakeven_worked_example():
    """λ* = (C1_D − C1_SD)/(C1_D·C2_SD − C1_SD·C2_D)
          = (2.1 − 4.46/3)/(2.1·0.43/3 − 4.46·0.11/3) = 1.84/0.4124 = 4.461687 req/s;
    equivalently r* = (1 − C1_R)/(C2_R − C1_R) = 0.490786, λ* = r*/C2_D."""
    be = breakeven(COEF, K, E, P, G)
    assert be.rate == pytest.approx(1.84 / 0.4124, rel=1e-12)
    assert be.kind == BreakEvenKind.PAYS_BELOW
    c1r, c2r = (4.46 / 3) / 2.1, (0.43 / 3) / 0.11
    assert be.rate == pytest.approx((1 - c1r) / (c2r - c1r) / 0.11, rel=1e-12)
    assert speedup(COEF, be.rate, K, E, P, G) == pytest.approx(1.0, rel=1e-12)


def test_optimal_draft_length_worked_example():
    """α = 0.5, E(k) = 2 − 0.5^k. At λ = 0, L = C1(k) = 0.1 + (100/E)(0.02 + 0.002k):
    k=0: 2.1, k=1: 1.566667, k=2: 1.471429, k=3: 1.486667 → best k = 2.
    At λ = 4, C2(k) = 0.01 + (100/E)(0.001 + 0.0005k):
    k=0: L = 2.1/0.56 = 3.75, k=1: 1.566667/0.56 = 2.797619,
    k=2: C2 = 0.124286, L = 1.471429/0.502857 = 2.926136, k=3: 1.486667/0.426667 = 3.484375
    → best k = 1: the optimum shrinks with load."""
    opt = optimal_draft_length(COEF, [0.0, 4.0], alpha=0.5, p=P, g=G, k_max=8)
    assert opt.k.tolist() == [2, 1]
    np.testing.assert_allclose(opt.latency, [1.471429, 2.797619], rtol=1e-6)
    np.testing.assert_allclose(opt.speedup, [2.1 / 1.471429, 3.75 / 2.797619], rtol=1e-6)


def test_optimal_draft_length_turns_sd_off_at_high_load():
    """Near saturation of every SD k the no-SD system is the only one within the ceiling.

    α = 0.3, λ = 8: ρ_D = 8·0.11 = 0.88 <= 0.9 (valid);
    k=1: E = 1.3, C2 = 0.01 + (100/1.3)·0.0015 = 0.125385, ρ = 1.003 (saturated);
    k=2: E = 1.39, C2 = 0.01 + (100/1.39)·0.002 = 0.153885, ρ = 1.231; larger k are worse.
    """
    opt = optimal_draft_length(COEF, 8.0, alpha=0.3, p=P, g=G)
    assert int(opt.k) == 0 and opt.speedup == pytest.approx(1.0)


def test_optimal_draft_length_is_not_sd_off_where_an_sd_k_past_the_ceiling_is_faster():
    """SD off is the choice only where no SD k is faster. At λ = 4, α = 0.5, k = 3 is priced
    at 3.484375 s against no SD's 3.75 s (worked example above) but its utilisation
    4·C2 = 0.573 is past a 0.45 ceiling no SD (0.44) is within: the fastest choice is not
    vouched for, so there is none (k = -1, above the ceiling), not "SD off". Past the
    break-even (λ = 4.8 > 4.4617) k = 3 is slower, and SD off is the choice."""
    unvouched = optimal_draft_length(COEF, 4.0, alpha=0.5, p=P, g=G, draft_lengths=[3],
                                     max_utilization=0.45)
    assert int(unvouched.k) == -1 and not bool(unvouched.valid)
    assert int(unvouched.reason) == Reason.ABOVE_CEILING
    np.testing.assert_allclose(unvouched.candidates, [3.75, np.nan], rtol=1e-9)
    off = optimal_draft_length(COEF, 4.8, alpha=0.5, p=P, g=G, draft_lengths=[3],
                               max_utilization=0.54)
    assert int(off.k) == 0 and bool(off.valid)


def test_optimal_draft_length_with_profile_stops_at_profile_length():
    """With a profile, k beyond its length is never chosen (no extrapolation)."""
    opt = optimal_draft_length(COEF, 0.0, profile=[0.9, 0.85], p=P, g=G, k_max=8)
    assert 0 <= int(opt.k) <= 2
    assert opt.candidates.shape[-1] == 3


def test_optimal_draft_length_requires_exactly_one_acceptance_source():
    with pytest.raises(ValueError):
        optimal_draft_length(COEF, 1.0, p=P, g=G)
    with pytest.raises(ValueError):
        optimal_draft_length(COEF, 1.0, alpha=0.5, profile=[0.5], p=P, g=G)


def test_saturation_gives_nan_not_negative_latency():
    """λ·C2 >= 1 is saturation: NaN latency and speedup, reason SATURATED, never negative."""
    lam = 1 / 0.11 + 1  # past no-SD saturation, and past SD's (C2_SD > C2_D)
    pred = predict(COEF, lam, K, E, P, G)
    assert np.isnan(pred.sd.latency) and np.isnan(pred.nosd.latency)
    assert np.isnan(pred.speedup)
    assert pred.reason == Reason.SATURATED and not pred.valid
    assert pred.sd.utilization > 1  # still reported: how far past saturation it is


def test_above_ceiling_is_invalid_but_priced():
    """Between the ceiling (0.9) and 1 the latency is finite but the prediction is invalid."""
    lam = 0.95 / 0.11
    res = latency(COEF, lam, 0, 1, P, G)
    assert res.reason == Reason.ABOVE_CEILING and not res.valid
    assert res.latency == pytest.approx(2.1 / 0.05)
    assert latency(COEF, lam, 0, 1, P, G, max_utilization=1.0).valid


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"arrival_rate": -1.0}, Reason.BAD_INPUT),
        ({"arrival_rate": math.inf}, Reason.BAD_INPUT),
        ({"g": math.nan}, Reason.BAD_INPUT),
        ({"p": -5.0}, Reason.BAD_INPUT),
        ({"k": -1.0}, Reason.BAD_DRAFT_LENGTH),
        ({"e": 4.5}, Reason.ACCEPTANCE_LENGTH_OUT_OF_RANGE),
        ({"e": 0.5}, Reason.ACCEPTANCE_LENGTH_OUT_OF_RANGE),
        ({"k": 0.0, "e": 1.5}, Reason.ACCEPTANCE_LENGTH_OUT_OF_RANGE),
    ],
)
def test_bad_inputs_are_flagged_not_priced(kwargs, reason):
    """Each bad input yields NaN latency with its own reason code and a readable reason."""
    args = {"arrival_rate": 1.0, "k": 3.0, "e": 2.0, "p": P, "g": G, **kwargs}
    res = latency(COEF, **args)
    assert res.reason == reason and not res.valid and np.isnan(res.latency)
    assert reason_text(res.reason) != "ok"


def test_one_bad_point_does_not_poison_a_vector():
    """Vectorised evaluation keeps good points valid beside bad ones."""
    res = latency(COEF, [1.0, -1.0, 2.0], K, E, P, G)
    assert res.valid.tolist() == [True, False, True]
    assert np.isfinite(res.latency[[0, 2]]).all()


def test_breakeven_kinds():
    """No break-even when SD is cheaper under load too (C2_R <= 1): +inf; never when slower."""
    cheap_load = Coefficients(a_p=0.1, b_p=0.01, a_v=0.02, b_v=0.001, a_d=0.002, b_d=0.0)
    be = breakeven(cheap_load, K, E, P, G)
    assert be.kind == BreakEvenKind.PAYS_EVERYWHERE and be.rate == math.inf
    # α = 0 (E = 1): drafts never accepted, every draft step is pure overhead.
    assert breakeven(COEF, K, 1.0, P, G).kind == BreakEvenKind.NEVER_PAYS
    assert breakeven_arrival_rate(COEF, K, 1.0, P, G) == 0.0
    assert breakeven(COEF, K, 5.0, P, G).kind == BreakEvenKind.UNDEFINED


def test_breakeven_pays_above_when_sd_is_slower_alone_but_cheaper_under_load():
    """C1_R > 1 and C2_R < 1: SD pays only above λ*, where S crosses 1 from below."""
    coef = Coefficients(a_p=0.0, b_p=0.0, a_v=0.02, b_v=0.002, a_d=0.02, b_d=0.0)
    # k=1, E=1.5: C1_SD = (100/1.5)·0.04 = 2.6667 > C1_D = 2; C2_SD = 0.1333 < C2_D = 0.2.
    be = breakeven(coef, 1, 1.5, P, G)
    assert be.kind == BreakEvenKind.PAYS_ABOVE
    # λ* = (2 − 2.6667)/(2·0.1333 − 2.6667·0.2) = −0.6667/(0.26667 − 0.53333) = 2.5 req/s
    assert be.rate == pytest.approx(2.5)
    assert speedup(coef, 2.0, 1, 1.5, P, G) < 1 < speedup(coef, 3.0, 1, 1.5, P, G)


def test_moe_with_all_experts_active_is_the_dense_sum():
    """m = M touches every expert for any T > 0 (φ = 1): the dense model with u + s."""
    dense = Coefficients(a_p=0.05, b_p=0.004, a_v=0.01, b_v=0.0005, a_d=0.002, b_d=0.0005)
    expert = ExpertCoefficients(a_p=0.05, b_p=0.006, a_v=0.01, b_v=0.0005)
    moe = MoECoefficients(dense=dense, expert=expert, experts=8, active_experts=8)
    total = Coefficients(a_p=0.1, b_p=0.01, a_v=0.02, b_v=0.001, a_d=0.002, b_d=0.0005)
    lam = np.array([0.5, 2.0, 5.0])
    np.testing.assert_allclose(
        latency(moe, lam, K, E, P, G).latency, latency(total, lam, K, E, P, G).latency,
        rtol=1e-10,
    )


def test_moe_without_expert_cost_is_dense():
    """A zero expert part leaves the dense model unchanged, at every load."""
    moe = MoECoefficients(COEF, ExpertCoefficients(0, 0, 0, 0), experts=128, active_experts=8)
    lam = np.array([0.0, 1.0, 4.0, 8.0])
    np.testing.assert_allclose(
        predict(moe, lam, K, E, P, G).speedup, predict(COEF, lam, K, E, P, G).speedup,
        rtol=1e-10,
    )
    assert breakeven(moe, K, E, P, G).rate == pytest.approx(1.84 / 0.4124, rel=1e-9)


def test_moe_expert_share_sits_between_dense_part_and_full():
    """0 < φ < 1 puts MoE latency strictly between the dense-only and all-experts bounds."""
    dense = Coefficients(a_p=0.05, b_p=0.004, a_v=0.01, b_v=0.0005, a_d=0.002, b_d=0.0005)
    expert = ExpertCoefficients(a_p=0.05, b_p=0.006, a_v=0.01, b_v=0.0005)
    moe = MoECoefficients(dense=dense, expert=expert, experts=128, active_experts=2)
    total = Coefficients(a_p=0.1, b_p=0.01, a_v=0.02, b_v=0.001, a_d=0.002, b_d=0.0005)
    lam = 1.0
    l_moe = float(latency(moe, lam, K, E, P, G).latency)
    assert float(latency(dense, lam, K, E, P, G).latency) < l_moe
    assert l_moe < float(latency(total, lam, K, E, P, G).latency)


def test_coefficients_reject_negative_and_non_finite():
    with pytest.raises(ValueError, match="a_v"):
        Coefficients(a_p=0.1, b_p=0, a_v=-1, b_v=0, a_d=0, b_d=0)
    with pytest.raises(ValueError, match="b_d"):
        Coefficients(a_p=0.1, b_p=0, a_v=1, b_v=0, a_d=0, b_d=math.nan)
    with pytest.raises(ValueError, match="active_experts"):
        MoECoefficients(COEF, ExpertCoefficients(0, 0, 0, 0), experts=4, active_experts=5)


def test_naive_seed_form_disagrees_with_the_corrected_model():
    """The labelled naive form (comparison only) differs from the closed form, which is why
    specwatch never uses it as its prediction."""
    naive = naive_speedup_scalar(COEF, 0.5, K, ALPHA, G)
    assert math.isfinite(naive)
    assert abs(naive - float(speedup(COEF, 0.5, K, E, P, G))) > 0.1


def test_optimal_draft_length_over_a_restricted_set():
    """Restricted to {2, 4} (plus SD off), λ = 0 picks 2 (C1: k=2 1.471429 < k=4 1.545161)."""
    opt = optimal_draft_length(COEF, 0.0, alpha=0.5, p=P, g=G, draft_lengths=[4, 2])
    assert opt.draft_lengths.tolist() == [0, 2, 4]
    assert int(opt.k) == 2


def test_extend_profile_keeps_measured_positions_and_extends_geometrically():
    """[0.6, 0.3] (conditional 0.5) extends to 0.15, 0.075; an upward wobble is flattened."""
    np.testing.assert_allclose(extend_profile([0.6, 0.3], 4), [0.6, 0.3, 0.15, 0.075])
    np.testing.assert_allclose(extend_profile([0.6, 0.62, 0.3], 3), [0.6, 0.6, 0.3])
    np.testing.assert_allclose(extend_profile([0.8, 0.4, 0.2], 2), [0.8, 0.4])
