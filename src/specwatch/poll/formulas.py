"""The speculative-decoding formulas of the poll path, on plain numbers.

Owns: the acceptance rate and length (vLLM's counters and SGLang's), the buckets of the
per-poll acceptance-rate samples, and the quantile of cumulative histogram buckets. Every
function is pure and scalar; the callers decide when a denominator is usable and pass
increases of counters.

Invariants: ratios are clamped into [0, 1]; a NaN input gives NaN (or None where the
docstring says so), never an exception.

E(α, k) and its inverse (the α solver) live in :mod:`specwatch.common.acceptance`, the one
definition the poll path and the latency model share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: Upper bounds of the ``sd_acceptance_rate_samples`` histogram (0.05 wide; +Inf implied).
SAMPLE_BUCKETS: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(1, 21))


def clamp01(x: float) -> float:
    """Clamp into [0, 1] (a NaN stays NaN: both comparisons are false)."""
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


def acceptance_rate(accepted: float, proposed: float) -> float:
    """Accepted over proposed draft tokens, clamped into [0, 1] (``proposed`` > 0)."""
    return clamp01(accepted / proposed)


def acceptance_length(draft_tokens: float, accepted: float, drafts: float) -> float:
    """Tokens committed per verify: 1 + min(draft tokens, accepted) / drafts (``drafts`` > 0).

    Accepted tokens never exceed the drafted ones; counter noise can make them, so the
    smaller of the two is taken. NaN when either count is unknown (NaN).
    """
    smaller = draft_tokens if draft_tokens < accepted \
        else accepted if draft_tokens == draft_tokens else draft_tokens
    return 1.0 + smaller / drafts


def verify_acceptance_length(d_generation: float, d_requests: float, d_verify: float
                             ) -> float | None:
    """Tokens committed per verify call (engines that count verify calls, not tokens):
    (generation − first tokens) / verify calls.

    Each finished request's first token comes from prefill, not from a verify call, so one
    token per finished request is removed before dividing. Both counters move when a request
    finishes, so the ratio is consistent; it ignores tokens of requests still running.
    None without verify calls or when an increase is unknown (NaN).
    """
    if not d_verify > 0:
        return None
    e = (d_generation - d_requests) / d_verify
    return max(1.0, e) if e == e else None


def verify_acceptance_rate(acceptance_length: float, proposed_per_verify: float) -> float:
    """The acceptance rate of verify calls: (E − 1) / draft tokens proposed per verify, in
    [0, 1]."""
    return clamp01((acceptance_length - 1.0) / proposed_per_verify)


def acceptance_heterogeneity(p0: float, p1: float) -> float:
    """(P(first two accepted) − p0²) / (p0 (1 − p0)), clamped into [0, 1] (0 < p0 < 1).

    0 when acceptances are independent of each other (i.i.d.), 1 when the second draft is
    accepted whenever the first is.
    """
    return clamp01((p1 - p0 * p0) / (p0 * (1.0 - p0)))


#: The ``method`` label of the draft-length-independent α (:func:`draft_length_independent_alpha`).
ALPHA_FIRST_POSITION = "first_position"
ALPHA_PER_TOKEN = "per_token"


def draft_length_independent_alpha(first_position: float | None, token_alpha: float | None
                                   ) -> tuple[float, str] | None:
    """An acceptance measure that does not fall with the draft length k, and how it was made.

    vLLM's acceptance rate (accepted / proposed) falls with k by construction: later
    positions are accepted less often. The share of drafts whose first token was accepted
    (from the per-position counters) does not depend on k, nor does the per-token α of the
    i.i.d. model solved from the acceptance length and k; at k = 1 both equal the rate. The
    first position is preferred where the engine counts positions. None when neither is a
    finite number.
    """
    if first_position is not None and math.isfinite(first_position):
        return clamp01(first_position), ALPHA_FIRST_POSITION
    if token_alpha is not None and math.isfinite(token_alpha):
        return clamp01(token_alpha), ALPHA_PER_TOKEN
    return None


def sample_bucket(value: float) -> int:
    """The index of the first :data:`SAMPLE_BUCKETS` bound holding ``value`` (a rounding
    tolerance of 1e-12); ``len(SAMPLE_BUCKETS)`` is the +Inf bucket."""
    for i, bound in enumerate(SAMPLE_BUCKETS):
        if value <= bound + 1e-12:
            return i
    return len(SAMPLE_BUCKETS)


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The q-quantile of cumulative buckets, interpolated as PromQL's histogram_quantile.

    Linear interpolation inside the bucket holding the rank q·count (the lowest bucket from
    0); a rank in the +Inf bucket gives the largest finite bound. None without observations
    or without a +Inf bucket (the count is unknown).
    """
    if not buckets or not math.isinf(buckets[-1][0]) or not 0.0 <= q <= 1.0:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank and count > prev_count:
            if math.isinf(bound):
                return prev_bound if len(buckets) > 1 else None
            if bound <= 0:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return None
