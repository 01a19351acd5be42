"""Acceptance: E(α, k) of the i.i.d. model, its inverse, and per-position profiles (pure numpy).

Split from `closed_form` (which re-exports every name): how many tokens one verify cycle
commits is a property of the drafter and the traffic, not of the cost model. E(α, k) and its
inverse are defined once, in :mod:`specwatch.common.acceptance` (the poll path uses the same
definition), and re-exported here.
"""

from __future__ import annotations

import numpy as np

from specwatch.common.acceptance import (
    E_TOLERANCE,
    acceptance_length_from_alpha,
    alpha_from_acceptance_length,
)
from specwatch.model.coefficients import ArrayLike

__all__ = [
    "E_TOLERANCE",
    "acceptance_length_from_alpha",
    "acceptance_length_from_profile",
    "alpha_from_acceptance_length",
    "extend_profile",
]

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
