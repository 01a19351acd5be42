"""Property tests of the latency model (hypothesis): the identities model.md states hold for
every system, not just the worked examples. max_examples is modest to keep the suite fast."""

import math
import os

import numpy as np
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from specwatch.model.acceptance import acceptance_length_from_alpha, alpha_from_acceptance_length
from specwatch.model.breakeven import BreakEvenKind
from specwatch.model.closed_form import breakeven, latency, optimal_draft_length, speedup
from specwatch.model.coefficients import Coefficients, ExpertCoefficients, MoECoefficients
from specwatch.model.costs import cost_terms, moe_cost_terms
from specwatch.model.moe import MOE_RESIDUAL_TOLERANCE, solve_moe_latency

# SPECWATCH_HYPOTHESIS_EXAMPLES=5000 for a long run; the default keeps the suite fast.
FAST = settings(max_examples=int(os.environ.get("SPECWATCH_HYPOTHESIS_EXAMPLES", "60")),
                deadline=None)


def secs(lo, hi):
    return st.floats(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False)


coefficients = st.builds(
    Coefficients,
    a_p=secs(0.0, 1.0),
    b_p=secs(0.0, 0.05),
    a_v=secs(1e-3, 0.1),
    b_v=secs(0.0, 1e-3),
    a_d=secs(0.0, 0.05),
    b_d=secs(0.0, 2e-3),
    b_v_context=secs(0.0, 1e-7),
)
alphas = secs(0.0, 0.95)
draft_lengths = st.integers(min_value=1, max_value=8)
prompts = secs(0.0, 4000.0)
generations = secs(1.0, 2000.0)


@FAST
@given(coefficients, draft_lengths, alphas, prompts, generations)
def test_speedup_at_zero_load_is_inverse_c1_ratio(coef, k, alpha, p, g):
    """S(0) = 1/C1_R: with no queue only load-independent costs matter."""
    e = acceptance_length_from_alpha(alpha, k)
    c1_sd, _ = cost_terms(coef, k, e, p, g)
    c1_d, _ = cost_terms(coef, 0, 1.0, p, g)
    assert math.isclose(speedup(coef, 0.0, k, e, p, g), c1_d / c1_sd, rel_tol=1e-12)


@FAST
@given(coefficients, draft_lengths, alphas, prompts, generations)
def test_speedup_at_breakeven_is_one(coef, k, alpha, p, g):
    """S(λ*) = 1 wherever a break-even exists below saturation. Rounding in λ* is amplified
    by 1/(1 − ρ) near saturation, so the tolerance scales with that condition number."""
    e = acceptance_length_from_alpha(alpha, k)
    be = breakeven(coef, k, e, p, g)
    assume(be.kind in (BreakEvenKind.PAYS_BELOW, BreakEvenKind.PAYS_ABOVE))
    c2_max = max(float(cost_terms(coef, k, e, p, g)[1]), float(cost_terms(coef, 0, 1, p, g)[1]))
    condition = 1.0 / (1.0 - float(be.rate) * c2_max)
    assert math.isclose(speedup(coef, be.rate, k, e, p, g), 1.0, rel_tol=1e-12 * condition)


@FAST
@given(coefficients, draft_lengths, alphas, prompts, generations)
def test_speedup_falls_with_load_when_c2_ratio_above_one(coef, k, alpha, p, g):
    """C2_R > 1: each extra request in flight costs SD more, so S falls monotonically."""
    e = acceptance_length_from_alpha(alpha, k)
    _, c2_sd = cost_terms(coef, k, e, p, g)
    _, c2_d = cost_terms(coef, 0, 1.0, p, g)
    assume(c2_d > 1e-12 and c2_sd / c2_d > 1 + 1e-9)
    lam_sat = 1.0 / max(c2_sd, c2_d)
    lams = np.linspace(0.0, lam_sat * 0.999, 200)
    s = speedup(coef, lams, k, e, p, g)
    assert np.all(np.isfinite(s))
    assert np.all(np.diff(s) <= 1e-12 * s[:-1])


@FAST
@given(coefficients, st.integers(0, 8), alphas, prompts, generations, secs(0.0, 0.98))
# Found in CI (2026-12-01): C2 ~ 1e-308 (only b_v_context, the smallest normal float) makes
# λ = ρ/C2 ~ 1e308, and the brute force's λ·L overflows to inf on its second step while the
# closed form answers 4.25; the iteration cannot represent that B, so it has no answer there.
@example(coef=Coefficients(a_p=1.0, b_p=0.0, a_v=0.0625, b_v=0.0, a_d=0.0, b_d=0.0,
                           b_v_context=2.2250738585072014e-308),
         k=0, alpha=0.0, p=0.0, g=1.0, rho=0.75)
def test_closed_form_equals_brute_force_fixed_point(coef, k, alpha, p, g, rho):
    """L = C1/(1 − λC2) is the fixed point of L ← C1 + C2·B, B = λ·L, iterated by brute force."""
    e = 1.0 if k == 0 else float(acceptance_length_from_alpha(alpha, k))
    c1, c2 = (float(x) for x in cost_terms(coef, k, e, p, g))
    assume(c2 > 0)
    lam = rho / c2
    value = 0.0
    for _ in range(20_000):
        new = c1 + c2 * (lam * value)
        assume(math.isfinite(new))  # B = λ·L beyond the largest float: no brute-force answer
        if abs(new - value) <= 1e-13 * new:
            value = new
            break
        value = new
    else:
        assume(False)  # did not converge: nothing to compare against
    closed = float(latency(coef, lam, k, e, p, g, max_utilization=1.0).latency)
    assert math.isclose(closed, value, rel_tol=1e-9)


moe_models = st.builds(
    MoECoefficients,
    dense=coefficients,
    expert=st.builds(
        ExpertCoefficients,
        a_p=secs(0.0, 1.0),
        b_p=secs(0.0, 0.05),
        a_v=secs(0.0, 0.1),
        b_v=secs(0.0, 2e-3),
    ),
    experts=st.just(128),
    active_experts=st.integers(1, 128),
)


@FAST
@given(moe_models, st.integers(0, 6), alphas, prompts, generations, secs(0.0, 60.0))
def test_moe_solver_converges_or_says_so(coef, k, alpha, p, g, lam):
    """Residual |L − G(L)|/L < 1e-9, or an explicit non-convergence/saturation flag; the
    latency is never negative or infinite."""
    e = 1.0 if k == 0 else float(acceptance_length_from_alpha(alpha, k))
    c1u, c2u, c1s, c2s = moe_cost_terms(coef, k, e, p, g)
    sol = solve_moe_latency(coef, lam, k + 1, c1u, c2u, c1s, c2s)
    if bool(sol.converged):
        assert sol.residual < MOE_RESIDUAL_TOLERANCE
        assert 0 < sol.latency < math.inf
        assert sol.utilization < 1
    else:
        assert bool(sol.saturated) or not bool(sol.converged)
        assert np.isnan(sol.latency)
    if bool(sol.saturated):
        assert not bool(sol.converged)


@FAST
@given(moe_models, st.integers(1, 6), alphas, prompts, generations)
def test_moe_solution_is_the_smallest_fixed_point(coef, k, alpha, p, g):
    """Starting from an empty system, plain fixed-point iteration climbs to the smallest
    fixed point; where it converges the bracketing solver agrees with it."""
    e = float(acceptance_length_from_alpha(alpha, k))
    c1u, c2u, c1s, c2s = (float(x) for x in moe_cost_terms(coef, k, e, p, g))
    assume(c2u + c2s > 0)
    lam = 0.5 / (c2u + c2s)
    value = 0.0
    for _ in range(20_000):
        phi = float(coef.expert_share(lam * value * (k + 1)))
        new = (c1u + phi * c1s) / (1 - lam * (c2u + phi * c2s))
        if abs(new - value) <= 1e-13 * new:
            value = new
            break
        value = new
    else:
        assume(False)
    sol = solve_moe_latency(coef, lam, k + 1, c1u, c2u, c1s, c2s)
    assert bool(sol.converged)
    assert math.isclose(float(sol.latency), value, rel_tol=1e-8)


def _c2_nondecreasing_in_k(coef, alpha, p, g, k_max):
    ks = np.arange(k_max + 1)
    es = acceptance_length_from_alpha(alpha, ks)
    _, c2 = cost_terms(coef, ks, es, p, g)
    return bool(np.all(np.diff(c2) >= 0))


@FAST
@given(coefficients, alphas, prompts, generations)
def test_optimal_k_never_increases_with_load(coef, alpha, p, g):
    """For i.i.d. α, the best k shrinks (or stays) as λ grows, provided C2(k) does not fall
    with k (each draft token adds load cost; the common case, C2_R > 1). This is Topkis's
    condition: L(k')/L(k) grows with λ for k' > k exactly when C2(k') >= C2(k)."""
    k_max = 8
    assume(_c2_nondecreasing_in_k(coef, alpha, p, g, k_max))
    _, c2_d = cost_terms(coef, 0, 1.0, p, g)
    assume(c2_d > 1e-12)
    lams = np.linspace(0.0, 0.9 / float(c2_d), 60)
    opt = optimal_draft_length(coef, lams, alpha=alpha, p=p, g=g, k_max=k_max)
    ks = opt.k[opt.valid]
    for i in np.flatnonzero(np.diff(ks) > 0):
        # Allow only float-level ties between the two candidates.
        row = opt.candidates[opt.valid][i + 1]
        assert math.isclose(row[ks[i]], row[ks[i + 1]], rel_tol=1e-12)


def test_optimal_k_can_grow_with_load_when_drafts_reduce_load_cost():
    """The limit of the property above: with b_d = 0, extra drafts cut C2 (fewer verify
    passes, no load cost of their own), so a longer draft can win as load grows. Documented
    in README "Latency model"; the exporter reports whatever the model says."""
    coef = Coefficients(a_p=0.0, b_p=0.0, a_v=0.02, b_v=0.002, a_d=0.004, b_d=0.0)
    assert not _c2_nondecreasing_in_k(coef, 0.6, 100.0, 100.0, 8)
    opt = optimal_draft_length(coef, [0.0, 4.5], alpha=0.6, p=100.0, g=100.0)
    assert opt.k[1] > opt.k[0]


@FAST
@given(st.floats(0.0, 0.999), st.integers(1, 16))
def test_alpha_inverts_acceptance_length(alpha, k):
    e = acceptance_length_from_alpha(alpha, k)
    back = float(alpha_from_acceptance_length(e, k))
    assert math.isclose(float(acceptance_length_from_alpha(back, k)), float(e), rel_tol=1e-12)
