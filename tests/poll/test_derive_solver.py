"""The token acceptance probability's bisection, inlined for speed, takes the
same steps as the one before: equal results, bit for bit, to the reference kept in
``tests/helpers/reference_derive.py`` (which calls ``expected_acceptance_length``)."""

from __future__ import annotations

import math

from helpers import reference_derive
from hypothesis import given, settings
from hypothesis import strategies as st

from specwatch.common.acceptance import solve_token_acceptance_probability


@settings(max_examples=500, deadline=None)
@given(e=st.one_of(st.floats(0.5, 12.0), st.floats(1.0, 1.0 + 1e-6),
                   st.just(math.nan), st.just(math.inf)),
       k=st.one_of(st.floats(-1.0, 11.0), st.integers(0, 10)))
def test_same_alpha_as_the_reference(e: float, k: float) -> None:
    got = solve_token_acceptance_probability(e, k)
    want = reference_derive.solve_token_acceptance_probability(e, k)
    assert got == want or (got is None and want is None)
