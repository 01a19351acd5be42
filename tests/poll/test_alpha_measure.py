"""The draft-length-independent α: one acceptance measure whose meaning does not change with k.

Protects the alert's and the controller's premise: on the public sweep (EAGLE-3, Qwen3-32B,
H100) vLLM's acceptance rate falls with k while the first-position acceptance stays put.
"""

import itertools
import math

import pytest

from specwatch.common.acceptance import (
    expected_acceptance_length,
    solve_token_acceptance_probability,
)
from specwatch.poll.formulas import (
    ALPHA_FIRST_POSITION,
    ALPHA_PER_TOKEN,
    draft_length_independent_alpha,
)


def test_first_position_is_preferred_where_counted():
    assert draft_length_independent_alpha(0.63, 0.55) == (0.63, ALPHA_FIRST_POSITION)


def test_per_token_alpha_where_positions_are_not_counted():
    assert draft_length_independent_alpha(None, 0.55) == (0.55, ALPHA_PER_TOKEN)
    assert draft_length_independent_alpha(math.nan, 0.55) == (0.55, ALPHA_PER_TOKEN)


def test_nothing_without_a_finite_measure():
    assert draft_length_independent_alpha(None, None) is None
    assert draft_length_independent_alpha(math.nan, math.inf) is None


@pytest.mark.parametrize("alpha", [0.2, 0.4, 0.63, 0.9])
def test_per_token_alpha_does_not_fall_with_k_while_the_rate_does(alpha):
    # i.i.d. acceptance: rate = (E - 1) / k falls with k; α solved from E and k does not.
    rates, alphas = [], []
    for k in range(1, 7):
        e = expected_acceptance_length(alpha, k)
        rates.append((e - 1.0) / k)
        solved = solve_token_acceptance_probability(e, k)
        alphas.append(draft_length_independent_alpha(None, solved)[0])
    assert all(a > b for a, b in itertools.pairwise(rates))
    assert alphas == pytest.approx([alpha] * 6, abs=1e-9)
    # At k = 1 the measure is vLLM's rate, so a threshold keeps its meaning.
    assert alphas[0] == pytest.approx(rates[0], abs=1e-9)
