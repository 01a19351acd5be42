"""E(α, k) and its inverse have one definition: the scalar form the poll path uses and the
vectorised form the model uses follow the same contract, edges included, and agree in value."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from specwatch.common import acceptance
from specwatch.common.acceptance import (
    E_TOLERANCE,
    acceptance_length_from_alpha,
    alpha_from_acceptance_length,
    expected_acceptance_length,
    solve_token_acceptance_probability,
)

ALPHAS = [0.0, 1e-300, 1e-9, 0.1, 0.5, 0.7, 0.9, 0.99, 1 - 1e-9, 1 - 1e-12,
          math.nextafter(1.0, 0.0), 1.0, math.nextafter(1.0, 2.0), 1.5, -1e-12, -0.5,
          math.nan, math.inf, -math.inf]
KS = [0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 15.0, 2.5, 0.3, 1e6, -1.0, -1e-12, math.nan, math.inf]


def _e_cases() -> list[tuple[float, float]]:
    """Acceptance lengths at and around each edge of [1, k + 1], and inside it."""
    cases = []
    for k in KS:
        top = k + 1.0 if math.isfinite(k) else 2.0
        es = [1.0, 1.0 - E_TOLERANCE / 2, 1.0 - 2 * E_TOLERANCE, math.nextafter(1.0, 2.0),
              0.5, top, top + E_TOLERANCE / 2, top + 2 * E_TOLERANCE, math.nextafter(top, 0.0),
              math.nan, math.inf, -math.inf]
        es += [1.0 + f * (top - 1.0) for f in (0.01, 0.3, 0.5, 0.77, 0.999)]
        cases += [(e, k) for e in es]
    return cases


def test_the_scalar_and_vectorised_e_agree_everywhere() -> None:
    """Same value (to 1e-13 relative) and the same NaN wherever the input is outside the
    domain, on a grid that holds every edge: α = 0 and 1, just past them, k = 0, NaN, inf."""
    for alpha, k in itertools.product(ALPHAS, KS):
        scalar = expected_acceptance_length(alpha, k)
        vector = float(acceptance_length_from_alpha(alpha, k))
        assert math.isnan(scalar) == math.isnan(vector), (alpha, k, scalar, vector)
        if not math.isnan(scalar):
            assert vector == pytest.approx(scalar, rel=1e-13, abs=0), (alpha, k)
    grid_a, grid_k = np.meshgrid(ALPHAS, KS)
    one_call = acceptance_length_from_alpha(grid_a, grid_k)
    each = np.array([[expected_acceptance_length(float(a), float(k)) for a, k in zip(ra, rk,
                     strict=True)] for ra, rk in zip(grid_a, grid_k, strict=True)])
    np.testing.assert_allclose(one_call, each, rtol=1e-13, atol=0, equal_nan=True)


@pytest.mark.parametrize("k", [0.0, 1.0, 3.0, 7.0, 2.5])
def test_every_draft_accepted_commits_k_plus_one(k: float) -> None:
    """α = 1 is the limit k + 1 in both forms (the model's form gave NaN there)."""
    assert expected_acceptance_length(1.0, k) == k + 1.0
    assert float(acceptance_length_from_alpha(1.0, k)) == k + 1.0
    assert float(acceptance_length_from_alpha(1 - 1e-12, k)) == pytest.approx(k + 1.0, rel=1e-9)


@pytest.mark.parametrize("alpha, k", [(1.5, 3.0), (-0.1, 3.0), (0.5, -1.0), (math.nan, 3.0),
                                      (0.5, math.inf), (math.inf, 2.0)])
def test_outside_the_domain_e_has_no_value(alpha: float, k: float) -> None:
    assert math.isnan(expected_acceptance_length(alpha, k))
    assert math.isnan(float(acceptance_length_from_alpha(alpha, k)))


def test_the_scalar_and_vectorised_inverse_agree_everywhere() -> None:
    """None where the vectorised form gives NaN, and α within 1e-12 elsewhere (1e-7 in the
    last 1e-4 below α = 1, where the scalar form's E(mid) loses digits to cancellation), on
    lengths at and around each bound of [1, k + 1] (inside and outside the tolerance) and
    inside it."""
    cases = _e_cases()
    es = np.array([e for e, _ in cases])
    ks = np.array([k for _, k in cases])
    vector = alpha_from_acceptance_length(es, ks)
    for (e, k), v in zip(cases, vector, strict=True):
        scalar = solve_token_acceptance_probability(e, k)
        assert (scalar is None) == bool(np.isnan(v)), (e, k, scalar, v)
        if scalar is not None:
            tolerance = 1e-12 if float(v) < 1 - 1e-4 else 1e-7
            assert abs(scalar - float(v)) <= tolerance, (e, k, scalar, v)
            assert float(alpha_from_acceptance_length(e, k)) == float(v), (e, k)


@pytest.mark.parametrize("e, k, want", [
    (1.0, 3.0, 0.0), (1.0 - E_TOLERANCE / 2, 3.0, 0.0), (4.0, 3.0, 1.0),
    (4.0 + E_TOLERANCE / 2, 3.0, 1.0), (1.0 - 2 * E_TOLERANCE, 3.0, None),
    (4.0 + 2 * E_TOLERANCE, 3.0, None), (4.5, 3.0, None), (0.9, 3.0, None), (1.0, 0.0, None),
    (1.5, -1.0, None), (math.nan, 3.0, None), (math.inf, 3.0, None), (2.0, math.inf, None),
])
def test_the_inverse_at_its_edges(e: float, k: float, want: float | None) -> None:
    """E at a bound (within the rounding tolerance) gives α = 0 or 1; an E no α of this model
    produces at this k, or a k without drafts, gives no α."""
    assert solve_token_acceptance_probability(e, k) == want
    v = float(alpha_from_acceptance_length(e, k))
    assert (math.isnan(v) if want is None else v == want), (e, k, v)


@pytest.mark.parametrize("alpha", [0.05, 0.3, 0.63, 0.9, 0.999])
@pytest.mark.parametrize("k", [1, 2, 4, 8, 12])
def test_the_inverse_inverts_e(alpha: float, k: int) -> None:
    e = expected_acceptance_length(alpha, k)
    assert solve_token_acceptance_probability(e, k) == pytest.approx(alpha, abs=1e-9)
    assert float(alpha_from_acceptance_length(e, k)) == pytest.approx(alpha, abs=1e-9)


def test_the_poll_path_and_the_model_use_this_definition() -> None:
    """One home: the exporter's α solver and the model's E(α, k) are these functions, and the
    poll path's formulas module holds no second copy."""
    from specwatch import model
    from specwatch.model import acceptance as model_acceptance
    from specwatch.poll import formulas
    from specwatch.poll.windows import derive
    assert derive.solve_token_acceptance_probability is solve_token_acceptance_probability
    assert model_acceptance.acceptance_length_from_alpha is acceptance_length_from_alpha
    assert model.alpha_from_acceptance_length is alpha_from_acceptance_length
    assert model_acceptance.E_TOLERANCE is acceptance.E_TOLERANCE
    assert not hasattr(formulas, "expected_acceptance_length")
    assert not hasattr(formulas, "solve_token_acceptance_probability")
