"""Break-even: the arrival rate λ* where the predicted speedup crosses 1, from cost terms.

Owns the kinds of break-even (`BreakEvenKind`: on which side of λ* SD pays), the closed form
from both systems' cost terms (`breakeven_from_costs`, also calibration's per-configuration
fallback) and the exact piecewise form of the saturation regime (`saturation_breakeven`,
docs/model.md "Break-even, best k, batch-size schedule"). One rule maps a kind and a crossing to
the reported rate (`breakeven_of`) for every solver. The entry point that dispatches per model
is `closed_form.breakeven`. Pure, vectorised numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from specwatch.model import saturation as _saturation
from specwatch.model.coefficients import ArrayLike, Coefficients
from specwatch.model.costs import cost_terms

__all__ = [
    "BreakEven",
    "BreakEvenKind",
    "breakeven_from_costs",
    "breakeven_of",
    "saturation_breakeven",
]


class BreakEvenKind(IntEnum):
    """How the speedup relates to 1 below saturation (the usual case is PAYS_BELOW)."""

    PAYS_BELOW = 0  # S > 1 for λ < λ*, S < 1 above: SD should be off above λ*
    PAYS_EVERYWHERE = 1  # S > 1 at every load below saturation: λ* = +inf
    NEVER_PAYS = 2  # S <= 1 at every load: λ* = 0
    PAYS_ABOVE = 3  # S < 1 below λ*, > 1 above (SD slower in isolation, cheaper under load)
    UNDEFINED = 4  # invalid inputs, or SD and no-SD cost exactly the same: λ* = NaN
    # S > 1 at every load SD serves, and SD's throughput ceiling lies below no-SD's: no
    # break-even below that ceiling (λ* = +inf); SD stops keeping up there, a separate figure
    PAYS_TO_CEILING = 5


@dataclass(frozen=True)
class BreakEven:
    """λ* (req/s) where S(λ*) = 1 and which side of it SD pays on (arrays)."""

    rate: np.ndarray
    kind: np.ndarray



def breakeven_of(kind: np.ndarray, cross: np.ndarray) -> BreakEven:
    """The rate each kind reports: the crossing for PAYS_BELOW/PAYS_ABOVE, +inf when SD
    pays everywhere or up to its ceiling (no crossing), 0 when it never pays, NaN when
    undefined (one rule for every solver)."""
    rate = np.select(
        [kind == BreakEvenKind.PAYS_BELOW, kind == BreakEvenKind.PAYS_ABOVE,
         kind == BreakEvenKind.PAYS_EVERYWHERE, kind == BreakEvenKind.PAYS_TO_CEILING,
         kind == BreakEvenKind.NEVER_PAYS],
        [cross, cross, np.inf, np.inf, 0.0],
        default=np.nan,
    )
    return BreakEven(rate=rate, kind=kind.astype(np.int8))


def breakeven_from_costs(
    c1_d: ArrayLike, c2_d: ArrayLike, c1_sd: ArrayLike, c2_sd: ArrayLike
) -> BreakEven:
    """Break-even from the cost terms (C1, C2) of the no-SD and the SD system directly.

    What `breakeven` computes once it has priced both systems. Calibration needs it on its
    own: when the data cannot separate the six coefficients it fits (C1, C2) per
    configuration, and break-even must still come from this one formula. UNDEFINED where a
    cost term is negative or not finite, or an isolated latency is zero.
    """
    c1_d, c2_d, c1_sd, c2_sd = np.broadcast_arrays(
        *(np.asarray(x, dtype=float) for x in (c1_d, c2_d, c1_sd, c2_sd))
    )
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(c1_d) & np.isfinite(c2_d) & np.isfinite(c1_sd) & np.isfinite(c2_sd)
        ok &= (c2_d >= 0) & (c2_sd >= 0)
    num = c1_d - c1_sd
    den = c1_d * c2_sd - c1_sd * c2_d
    c2_max = np.maximum(c2_d, c2_sd)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        cross = num / den
        lam_lim = np.where(c2_max > 0, 1.0 / c2_max, np.inf)
        # A crossing at saturation itself (to rounding) is no crossing: S is undefined there.
        crosses = (den != 0) & (cross > 0) & (cross < lam_lim * (1 - 1e-9))
        pays_at_zero = (num > 0) | ((num == 0) & (den < 0))
        kind = np.where(
            crosses,
            np.where(num > 0, BreakEvenKind.PAYS_BELOW, BreakEvenKind.PAYS_ABOVE),
            np.where(pays_at_zero, BreakEvenKind.PAYS_EVERYWHERE, BreakEvenKind.NEVER_PAYS),
        )
        identical = (num == 0) & (den == 0)
        kind = np.where(ok & ~identical & (c1_d > 0) & (c1_sd > 0), kind, BreakEvenKind.UNDEFINED)
    return breakeven_of(kind, cross)


def saturation_breakeven(
    coef: Coefficients, ok: np.ndarray, s_k: np.ndarray, s_e: np.ndarray, s_p: np.ndarray,
    s_g: np.ndarray, scale_sd: float = 1.0, scale_nosd: float = 1.0,
) -> BreakEven:
    """Break-even of the saturation regime, exact over the pieces of L (docs/model.md).

    Each system's latency along λ is a few hyperbolas α_j/(1 − λβ_j) (`saturation.pieces`),
    so the first crossing is one linear root per interval (`saturation.first_crossing`). The
    rules are those of the numeric scan (`closed_form._numeric_breakeven`, the tests'
    reference): the first crossing below the lower ceiling, PAYS_TO_CEILING (no crossing)
    when SD is faster up to its ceiling and it lies below no-SD's, UNDEFINED for bad inputs
    or S(0) = 1.
    Unlike the scan, it also finds two crossings inside one grid cell and a crossing just
    below the ceiling. `ok` and the `s_*` inputs are the checked points
    (`closed_form.breakeven` makes them).
    """
    # Both systems in one call along a leading axis of 2 (SD first): half the numpy calls.
    both_k = np.stack([s_k, np.zeros_like(s_k)])
    both_e = np.stack([s_e, np.ones_like(s_e)])
    c1, c2 = cost_terms(coef, both_k, both_e, s_p, s_g)
    c1_sd, c1_d = c1[0], c1[1]
    with np.errstate(divide="ignore", invalid="ignore"):
        starts, alpha, beta, ceilings = _saturation.pieces(
            c1, c2, s_g / both_e, both_k, coef.c_v, coef.knee_v, coef.c_d, coef.knee_d,
            coef.capacity(s_p, s_g, both_k))
        if scale_sd != 1.0 or scale_nosd != 1.0:
            # L(B) scaled by s: every piece α + β·B becomes s·α + s·β·B, and the λ = B/L(B)
            # where a piece starts (and the ceiling) is divided by s; the knees stay put.
            s = np.array([scale_sd, scale_nosd]).reshape((2,) + (1,) * (alpha.ndim - 1))
            starts, alpha, beta = starts / s, alpha * s, beta * s
            ceilings = ceilings / s.reshape((2,) + (1,) * (ceilings.ndim - 1))
            c1_sd, c1_d = c1_sd * scale_sd, c1_d * scale_nosd
        sd = (starts[0], alpha[0], beta[0])
        nosd = (starts[1], alpha[1], beta[1])
        sd_ceiling, nosd_ceiling = ceilings[0], ceilings[1]
        # S(0) = C1_D / C1_SD (each system empty); a zero isolated latency is DEGENERATE.
        s0 = np.where((c1_d > 0) & (c1_sd > 0), c1_d / c1_sd, np.nan)
    above0 = s0 > 1
    lam_hi = np.minimum(sd_ceiling, nosd_ceiling)
    lam_hi = np.where(np.isfinite(lam_hi), lam_hi, 0.0)  # load-free: S(0) decides
    cross, found = _saturation.first_crossing(lam_hi, sd, nosd, above0)
    kind = np.where(
        found,
        np.where(above0, BreakEvenKind.PAYS_BELOW, BreakEvenKind.PAYS_ABOVE),
        np.where(above0, BreakEvenKind.PAYS_EVERYWHERE, BreakEvenKind.NEVER_PAYS),
    )
    # SD faster up to its own ceiling, which lies below no-SD's: the speedup never falls to 1,
    # SD stops keeping up at its ceiling (a throughput figure, not a break-even).
    capped = ~found & above0 & (sd_ceiling < nosd_ceiling)
    kind = np.where(capped, BreakEvenKind.PAYS_TO_CEILING, kind)
    kind = np.where(ok & np.isfinite(s0) & (s0 != 1), kind, BreakEvenKind.UNDEFINED)
    return breakeven_of(kind, cross)
