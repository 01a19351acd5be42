"""Acceptance: E(α, k) of the i.i.d. model, its inverse, and per-position profiles (pure numpy).

Split from `closed_form` (which re-exports every name): how many tokens one verify cycle
commits is a property of the drafter and the traffic, not of the cost model.
"""

from __future__ import annotations

import numpy as np

from specwatch.model.coefficients import ArrayLike

__all__ = [
    "E_TOLERANCE",
    "acceptance_length_from_alpha",
    "acceptance_length_from_profile",
    "alpha_from_acceptance_length",
    "extend_profile",
]

# Acceptance lengths measured live carry rounding noise; accept E this far outside [1, k+1].
E_TOLERANCE = 1e-9
_E_TOLERANCE = E_TOLERANCE



def acceptance_length_from_alpha(alpha: ArrayLike, k: ArrayLike) -> np.ndarray:
    """E(α, k) = (1 − α^(k+1)) / (1 − α) = Σ_{i=0..k} α^i (i.i.d. acceptance, bonus token in).

    Written with expm1/log so it stays accurate as α → 1 (where it tends to k + 1). NaN where
    α is outside [0, 1) or k is negative/non-finite.
    """
    a, kk = np.broadcast_arrays(np.asarray(alpha, dtype=float), np.asarray(k, dtype=float))
    ok = np.isfinite(a) & (a >= 0) & (a < 1) & np.isfinite(kk) & (kk >= 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = -np.expm1((kk + 1.0) * np.log(a)) / (1.0 - a)
    e = np.where(a == 0, 1.0, e)
    return np.where(ok, e, np.nan)


def alpha_from_acceptance_length(e: ArrayLike, k: ArrayLike, iterations: int = 64) -> np.ndarray:
    """Invert E(α, k) for α by vectorised bisection (E is increasing in α on [0, 1)).

    E = 1 gives α = 0; E = k + 1 (every draft accepted) gives the limit α = 1. NaN when k = 0
    (α is not identifiable without drafts) or E is outside [1, k + 1]. 64 halvings of [0, 1]
    reach float resolution.
    """
    ee, kk = np.broadcast_arrays(np.asarray(e, dtype=float), np.asarray(k, dtype=float))
    ok = (
        np.isfinite(ee)
        & np.isfinite(kk)
        & (kk > 0)
        & (ee >= 1 - _E_TOLERANCE)
        & (ee <= kk + 1 + _E_TOLERANCE)
    )
    target = np.clip(ee, 1.0, kk + 1.0)
    lo = np.zeros(ee.shape)
    hi = np.ones(ee.shape)
    # E(mid) written out: `acceptance_length_from_alpha`'s formula without its checks, which
    # cost more than the formula on the exporter's scalar calls. mid stays in (0, 1] (it
    # never reaches 0); at a rounded 1.0 it gives NaN, as the checked form does: not below.
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


def acceptance_length_from_profile(profile: ArrayLike, k: ArrayLike) -> np.ndarray:
    """E(k) = 1 + Σ_{i<k} profile[i], profile[i] = P(first i+1 drafts accepted).

    Per-position acceptance usually decays, so this is the honest alternative to i.i.d.
    extrapolation. NaN where k is not an integer in [0, len(profile)].
    """
    prof = np.asarray(profile, dtype=float).ravel()
    cum = np.concatenate([[0.0], np.cumsum(prof)])
    kk = np.asarray(k, dtype=float)
    ok = np.isfinite(kk) & (kk >= 0) & (kk <= prof.size) & (kk == np.round(kk))
    idx = np.where(ok, kk, 0).astype(int)
    return np.where(ok, 1.0 + cum[idx], np.nan)


def extend_profile(profile: ArrayLike, k_max: int) -> np.ndarray:
    """A per-position profile made non-increasing and extended to k_max positions.

    Measured per-position rates can wobble upwards by counter noise; P(first i+1 accepted)
    cannot, so a running minimum restores it. Positions past the measured ones (a larger k
    than the one running) are extrapolated geometrically with the last measured conditional
    acceptance p[-1]/p[-2] (p[0] with one position): the i.i.d. assumption applied to the
    tail only, which keeps the measured decay where it is known.
    """
    prof = np.minimum.accumulate(np.clip(np.asarray(profile, dtype=float).ravel(), 0.0, 1.0))
    if prof.size == 0 or prof.size >= k_max:
        return prof[:k_max]
    ratio = prof[-1] / prof[-2] if prof.size >= 2 and prof[-2] > 0 else prof[0]
    tail = prof[-1] * ratio ** np.arange(1, k_max - prof.size + 1)
    return np.concatenate([prof, tail])
