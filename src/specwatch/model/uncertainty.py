"""Intervals on the model's predictions: the fit's residual spread carried through the fixed
point (pure numpy; docs/model.md, "Uncertainty").

Why residual spread, and why through the fixed point: calibration fits L(B), the latency at a
given batch in flight, and what it cannot explain shows as the relative residuals of L(B) at
the calibration runs. Those residuals are larger near the ceiling (the form prices a roofline,
the hardware a smooth knee; the runs there are closed-loop queues), so their spread is kept per
band of utilisation λ/λ_max (`Band`). Every prediction goes from λ through B = λ·L(B), which
amplifies a relative error δ of L(B) by dlnL/dlnλ, up to 5-30 near the ceiling; the interval
therefore solves the fixed point again with the whole L(B) scaled by 1 ± z·σ:

    L_s(λ) = s·L(s·λ)      (B = λ·s·L(B) is the fixed point at arrival rate s·λ)

exact for every form (linear, knees, capacity, MoE), two more solves per point, and the
amplification comes out of the same code that makes the point prediction. A bootstrap of the
coefficients would measure how well the data pin the coefficients (small: 119 runs, eight
coefficients) but not the misfit of the form, which dominates near the ceiling.

Speedup L_D/L_SD: the two systems' errors are taken as independent worst cases (SD high with
no-SD low and the reverse); break-even: the same two corners (`closed_form.breakeven` with
scaled systems).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from specwatch.model.breakeven import BreakEvenKind
from specwatch.model.closed_form import breakeven, latency
from specwatch.model.coefficients import ArrayLike, Model, MoECoefficients

__all__ = [
    "DEFAULT_LEVEL",
    "DEFAULT_MAX_HALFWIDTH",
    "Band",
    "Intervals",
    "Uncertainty",
    "as_pair",
    "breakeven_interval",
    "intervals",
    "scaled_latency",
]

#: Coverage of the intervals: 90%, the level the acceptance targets are stated in.
DEFAULT_LEVEL = 0.9
#: A prediction whose latency interval is wider than ±15% is `sensitive` (not valid): past
#: that the number is mostly the fixed point's amplification of the fit's own misfit.
DEFAULT_MAX_HALFWIDTH = 0.15


@dataclass(frozen=True)
class Band:
    """Relative RMS residual of L(B) (`sigma`) of the `runs` calibration runs whose
    utilisation λ/λ_max lies below `utilization_below` (and above the previous band's)."""

    utilization_below: float
    sigma: float
    runs: int = 0


@dataclass(frozen=True)
class Uncertainty:
    """The parameters file's `uncertainty` block: residual spread per utilisation band."""

    bands: tuple[Band, ...]
    level: float = DEFAULT_LEVEL
    max_relative_halfwidth: float = DEFAULT_MAX_HALFWIDTH

    @property
    def z(self) -> float:
        """Two-sided normal quantile of the level (1.645 for 90%)."""
        return NormalDist().inv_cdf(0.5 + self.level / 2.0)

    def sigma(self, utilization: ArrayLike) -> np.ndarray:
        """σ of the band each utilisation falls in (the last band past its top; NaN for NaN)."""
        u = np.asarray(utilization, dtype=float)
        tops = np.array([b.utilization_below for b in self.bands])
        sig = np.array([b.sigma for b in self.bands])
        idx = np.minimum(np.searchsorted(tops, u, side="right"), len(tops) - 1)
        return np.where(np.isfinite(u), sig[idx], np.nan)

    def to_mapping(self) -> dict[str, Any]:
        return {
            "method": "residual_spread",
            "level": float(self.level),
            "max_relative_halfwidth": float(self.max_relative_halfwidth),
            "bands": [{"utilization_below": float(b.utilization_below),
                       "sigma": float(b.sigma), "runs": int(b.runs)} for b in self.bands],
        }


def scaled_latency(coef: Model, scale: ArrayLike, arrival_rate: ArrayLike, k: ArrayLike,
                   e: ArrayLike, p: ArrayLike, g: ArrayLike) -> np.ndarray:
    """Latency at the fixed point of a fit whose L(B) is `scale` times the model's:
    s·L(s·λ); NaN where that system saturates (no ceiling: the caller applies its own)."""
    s = np.asarray(scale, dtype=float)
    lam = np.asarray(arrival_rate, dtype=float)
    with np.errstate(invalid="ignore"):
        return s * latency(coef, s * lam, k, e, p, g, max_utilization=1.0).latency


@dataclass(frozen=True)
class Intervals:
    """90% intervals (arrays) of one operating point: NaN bounds where none exists.

    `latency_sd` / `latency_nosd` are (lower, upper) in seconds, the upper +inf where the
    pessimistic fit saturates; `speedup` (lower, upper); `halfwidth` the larger relative
    distance of the SD latency's bounds from its point value (+inf when unbounded), the
    quantity the `sensitive` rule compares with `max_relative_halfwidth`.
    """

    latency_sd: tuple[np.ndarray, np.ndarray]
    latency_nosd: tuple[np.ndarray, np.ndarray]
    speedup: tuple[np.ndarray, np.ndarray]
    halfwidth: np.ndarray
    halfwidth_nosd: np.ndarray


def _bounds(coef: Model, d: np.ndarray, lam: np.ndarray, k: ArrayLike, e: ArrayLike,
            p: ArrayLike, g: ArrayLike, point: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lo = scaled_latency(coef, 1.0 - d, lam, k, e, p, g)
    hi = scaled_latency(coef, 1.0 + d, lam, k, e, p, g)
    with np.errstate(invalid="ignore", divide="ignore"):
        hi = np.where(np.isfinite(point) & np.isfinite(d) & ~np.isfinite(hi), np.inf, hi)
        half = np.maximum(hi / point - 1.0, 1.0 - lo / point)
    return lo, hi, np.where(np.isfinite(point) & np.isfinite(d), half, np.nan)


def intervals(coef: Model, unc: Uncertainty, arrival_rate: ArrayLike, k: ArrayLike,
              e: ArrayLike, p: ArrayLike, g: ArrayLike, latency_sd: ArrayLike,
              latency_nosd: ArrayLike, utilization_sd: ArrayLike,
              utilization_nosd: ArrayLike) -> Intervals:
    """Latency (both systems) and speedup intervals around a point prediction.

    σ is the band's at each system's own utilisation; the bounds are the fixed points of the
    fit scaled by 1 ∓ z·σ (module docstring)."""
    z = unc.z
    lam = np.asarray(arrival_rate, dtype=float)
    d_sd = z * unc.sigma(utilization_sd)
    d_d = z * unc.sigma(utilization_nosd)
    sd_pt = np.asarray(latency_sd, dtype=float)
    d_pt = np.asarray(latency_nosd, dtype=float)
    sd_lo, sd_hi, half = _bounds(coef, d_sd, lam, k, e, p, g, sd_pt)
    d_lo, d_hi, half_d = _bounds(coef, d_d, lam, 0.0, 1.0, p, g, d_pt)
    with np.errstate(invalid="ignore", divide="ignore"):
        s_lo = d_lo / sd_hi
        s_hi = d_hi / sd_lo
    return Intervals((sd_lo, sd_hi), (d_lo, d_hi), (s_lo, s_hi), half, half_d)


def breakeven_interval(coef: Model, unc: Uncertainty, k: float, e: float, p: float,
                       g: float, rate: float) -> tuple[float, float] | None:
    """(lower, upper) λ* (req/s) over the two corners of the fit's spread: SD pessimistic
    with no-SD optimistic gives the lower, the reverse the upper. σ is the band's at the
    SD system's utilisation at λ* (the top band when λ* is its ceiling). None for MoE models
    and when λ* is not a finite crossing (pays everywhere / never / undefined)."""
    if isinstance(coef, MoECoefficients) or not (math.isfinite(rate) and rate > 0):
        return None
    point = latency(coef, rate, k, e, p, g, max_utilization=1.0)
    u = float(point.utilization)
    sigma = float(unc.sigma(u if math.isfinite(u) else math.inf))
    d = unc.z * sigma
    out = []
    for s_sd, s_d in ((1.0 + d, 1.0 - d), (1.0 - d, 1.0 + d)):
        be = breakeven(coef, k, e, p, g, scale_sd=s_sd, scale_nosd=s_d)
        kind = int(be.kind)
        r = float(be.rate)
        if kind in (BreakEvenKind.PAYS_BELOW, BreakEvenKind.PAYS_ABOVE) and math.isfinite(r):
            out.append(r)
        elif kind == BreakEvenKind.NEVER_PAYS:
            out.append(0.0)
        elif kind in (BreakEvenKind.PAYS_EVERYWHERE, BreakEvenKind.PAYS_TO_CEILING):
            out.append(math.inf)
        else:
            return None
    return (min(out), max(out))


def as_pair(lo: Any, hi: Any) -> list[float | None] | None:
    """[lo, hi] for JSON (None for a bound that is not finite; None when both are NaN)."""
    a, b = float(lo), float(hi)
    if math.isnan(a) and math.isnan(b):
        return None
    return [a if math.isfinite(a) else None, b if math.isfinite(b) else None]
