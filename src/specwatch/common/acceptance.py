"""E(α, k) of the i.i.d. acceptance model and its inverse: the one definition both the poll
path and the latency model use.

E(α, k) = (1 − α^(k+1)) / (1 − α) = Σ_{i=0..k} α^i is the number of tokens one verify cycle
commits when each of k drafted tokens is accepted with probability α, independently, plus
the bonus token.

One contract, in two forms: a scalar one on plain floats (the exporter's per-window call,
whose values the exposition renders) and a vectorised one on numpy arrays (the model's
grids). Both follow the same rules, which ``tests/common/test_acceptance.py`` checks on a
grid that holds every edge:

- E(α, k) is defined for α in [0, 1] and a finite k >= 0; at α = 1 it is the limit k + 1.
  Anything else (α outside [0, 1], a negative or non-finite k, NaN) has no value: NaN.
- The inverse is defined for a finite k > 0 (α is not identifiable without drafts) and a
  finite E in [1, k + 1], widened by :data:`E_TOLERANCE` for the rounding of measured
  lengths. E at or below 1 gives α = 0, E at or above k + 1 gives α = 1. Outside that range
  no α of this model produces E (the k it was measured at is not the one given): no value
  (None from the scalar form, NaN from the vectorised one).

The two forms agree (tested): E to 1e-13 relative; α within 1e-12 up to α = 1 − 1e-4 and
within 1e-7 above, where the scalar bisection's E(mid) = (1 − mid^(k+1)) / (1 − mid) loses
digits to cancellation (the exporter's published α is computed this way; the model's form
uses expm1/log). Each inverse is the fast form for its caller: the scalar bisection is
exact in binary and takes 50 steps, the vectorised one takes 64 halvings of every element
at once.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = [
    "E_TOLERANCE",
    "acceptance_length_from_alpha",
    "alpha_from_acceptance_length",
    "expected_acceptance_length",
    "solve_token_acceptance_probability",
]

#: Acceptance lengths measured live carry rounding noise; E this far outside [1, k + 1] is
#: taken as the bound.
E_TOLERANCE = 1e-9

ArrayLike = npt.ArrayLike


def expected_acceptance_length(alpha: float, k: float) -> float:
    """E(α, k) on plain floats (k + 1 at α = 1; NaN outside the domain above), written with
    expm1/log as the vectorised form is, so it stays accurate as α → 1."""
    if not (0.0 <= alpha <= 1.0) or not (0.0 <= k < math.inf):
        return math.nan
    if alpha == 1.0:
        return k + 1.0
    if alpha == 0.0:
        return 1.0
    return -math.expm1((k + 1.0) * math.log(alpha)) / (1.0 - alpha)


#: The bisection's half-widths 2^-1 .. 2^-50, and the midpoint offset of its last bracket.
_BISECTION_STEPS: tuple[float, ...] = tuple(2.0 ** -i for i in range(1, 51))
_BISECTION_HALF_WIDTH = 2.0 ** -51


def solve_token_acceptance_probability(e: float, k: float) -> float | None:
    """The α with E(α, k) = e on plain floats, by bisection (E is increasing in α on [0, 1]).

    0 for e <= 1 and 1 for e >= k + 1 (within :data:`E_TOLERANCE`); None where the contract
    above gives no value.
    """
    if not (0.0 < k < math.inf) or not (1.0 - E_TOLERANCE <= e <= k + 1.0 + E_TOLERANCE):
        return None
    if e <= 1.0:
        return 0.0
    if e >= k + 1.0:
        return 1.0
    lo = 0.0
    kp1 = k + 1.0
    # Bisection of [0, 1] down to a width of 2^-50 (the first width <= 1e-15): the bounds
    # are multiples of the width, so every midpoint is exact and never reaches 1, and the
    # loop always takes these 50 steps. Each midpoint is lo + step (the midpoint of
    # [lo, lo + 2 step]); E(mid, k) is written out without its α = 1 branch, which no
    # midpoint takes.
    for step in _BISECTION_STEPS:
        mid = lo + step
        if (1.0 - mid ** kp1) / (1.0 - mid) < e:
            lo = mid
    return lo + _BISECTION_HALF_WIDTH


def acceptance_length_from_alpha(alpha: ArrayLike, k: ArrayLike) -> np.ndarray:
    """E(α, k) on arrays (broadcast), by the contract above.

    Written with expm1/log so it stays accurate as α → 1, where it tends to k + 1.
    """
    a, kk = np.broadcast_arrays(np.asarray(alpha, dtype=float), np.asarray(k, dtype=float))
    ok = np.isfinite(a) & (a >= 0) & (a <= 1) & np.isfinite(kk) & (kk >= 0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        e = -np.expm1((kk + 1.0) * np.log(a)) / (1.0 - a)
    e = np.where(a == 0, 1.0, e)
    e = np.where(a == 1, kk + 1.0, e)
    return np.where(ok, e, np.nan)


def alpha_from_acceptance_length(e: ArrayLike, k: ArrayLike, iterations: int = 64) -> np.ndarray:
    """The α with E(α, k) = e on arrays (broadcast), by vectorised bisection; NaN where the
    contract above gives no value. 64 halvings of [0, 1] reach float resolution."""
    ee, kk = np.broadcast_arrays(np.asarray(e, dtype=float), np.asarray(k, dtype=float))
    ok = (
        np.isfinite(ee)
        & np.isfinite(kk)
        & (kk > 0)
        & (ee >= 1 - E_TOLERANCE)
        & (ee <= kk + 1 + E_TOLERANCE)
    )
    target = np.clip(ee, 1.0, kk + 1.0)
    lo = np.zeros(ee.shape)
    hi = np.ones(ee.shape)
    # E(mid) written out: `acceptance_length_from_alpha`'s formula without its checks, which
    # cost more than the formula. mid stays in (0, 1] (it never reaches 0); at a rounded 1.0
    # it gives NaN, which is not below the target, as the limit k + 1 is not.
    powers = np.where(ok, kk, 1.0) + 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(iterations):
            mid = 0.5 * (lo + hi)
            below = -np.expm1(powers * np.log(mid)) / (1.0 - mid) < target
            lo = np.where(below, mid, lo)
            hi = np.where(below, hi, mid)
    alpha = 0.5 * (lo + hi)
    alpha = np.where(target <= 1.0, 0.0, alpha)
    alpha = np.where(target >= kk + 1.0, 1.0, alpha)
    return np.where(ok, alpha, np.nan)
