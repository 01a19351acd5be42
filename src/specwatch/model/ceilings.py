"""What the measured throughput ceilings decide: `saturated` at or past them, SD's throughput
ceiling, and where a break-even can lie.

A measured ceiling (`observed.MeasuredCeiling`) is where one curve of the calibration runs
(one k on one workload) stopped rising: more requests in flight brought no more throughput.
A prediction for the same k on lengths within `LENGTH_TOLERANCE` at or past its rate is
`saturated` (`model.validity`), whatever the fitted ceiling says.

Two figures, named apart. The break-even λ* is where the predicted speedup crosses 1. SD's
throughput ceiling (`sd_throughput_ceiling`) is the arrival rate past which SD no longer keeps
up: the lower of the model's SD ceiling and SD's measured one. Where the speedup stays above 1
up to SD's measured ceiling and no-SD still serves there, there is no break-even below that
ceiling (`PAYS_TO_CEILING`), not a break-even at it. Without measured ceilings (a file
without a calibrated range, or curves that never stopped rising) λ* is the model's,
unchanged. Pure numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from specwatch.model import uncertainty
from specwatch.model.breakeven import BreakEven, BreakEvenKind
from specwatch.model.closed_form import breakeven as model_breakeven
from specwatch.model.closed_form import latency
from specwatch.model.coefficients import ArrayLike, MoECoefficients
from specwatch.model.costs import throughput_ceiling
from specwatch.model.observed import CalibratedRange, MeasuredCeiling
from specwatch.model.params import Params

__all__ = ["LENGTH_TOLERANCE", "RATE_TOLERANCE", "Bracket", "bracket", "breakeven",
           "breakeven_interval", "ceiling_rate", "sd_ceiling", "sd_ceiling_interval",
           "sd_throughput_ceiling", "top_rate"]

#: A prediction lies on a measured curve when its mean prompt and generation tokens are both
#: within this fraction of the curve's (the same workload).
LENGTH_TOLERANCE = 0.10


def _near(x: np.ndarray, centre: float) -> np.ndarray:
    return np.abs(x - centre) <= LENGTH_TOLERANCE * max(abs(centre), 1e-12)


def _on_curves(curves: Sequence[MeasuredCeiling], k: ArrayLike, p: ArrayLike, g: ArrayLike,
               empty: float, pick: Callable[[np.ndarray, float], np.ndarray]) -> np.ndarray:
    """`pick` over the rates of the recorded curves each (k, p, g) lies on (the same k,
    lengths within LENGTH_TOLERANCE); `empty` where it lies on none."""
    kk, pp, gg = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (k, p, g)))
    out = np.full(kk.shape, empty)
    for c in curves:
        same = (np.abs(kk - c.k) < 1e-9) & _near(pp, c.prompt_tokens) \
            & _near(gg, c.generation_tokens)
        out = np.where(same, pick(out, c.arrival_rate), out)
    return out


def ceiling_rate(cal: CalibratedRange | None, k: ArrayLike, p: ArrayLike,
                 g: ArrayLike) -> np.ndarray:
    """The lowest measured ceiling (req/s) of the curve each (k, p, g) lies on (k = 0: no
    SD); +inf where no measured curve of that k and those lengths stopped rising."""
    return _on_curves(cal.measured_ceilings if cal is not None else (), k, p, g, np.inf,
                      np.minimum)


def top_rate(cal: CalibratedRange | None, k: ArrayLike, p: ArrayLike,
             g: ArrayLike) -> np.ndarray:
    """The highest rate (req/s) a measured curve of each (k, p, g) was served at (k = 0: no
    SD; `CalibratedRange.curve_tops`); 0 where no recorded curve has that k and lengths."""
    return _on_curves(cal.curve_tops if cal is not None else (), k, p, g, 0.0, np.maximum)


#: How far above a recorded top rate (relative) the run that measured it can read: a
#: benchmark report's request throughput is rounded (2 decimals in vllm bench serve) and
#: computed its own way (the public sweep's req_tp is up to 0.2% above the rate calibrate
#: records for the same run), so "at or below the top" allows this much. Kept small: a
#: plateau run can come at nearly a top's rate with twice its latency.
RATE_TOLERANCE = 0.005


@dataclass(frozen=True)
class Bracket:
    """What the measured curves say about the curve each (k, p, g) lies on (arrays).

    For a k measured on that workload: its own curve. For a k not measured there but lying
    between two k that were (`interpolated`): the lower top and the lower ceiling of the two
    nearest, and a rising top only where both tops rose. `top` is the highest rate served
    (0: no curve), `rising_top` that rate where the top run was on its rising branch
    (`CurveTop.rising`; 0 otherwise), `ceiling` the lowest measured ceiling (+inf: none)."""

    interpolated: np.ndarray
    top: np.ndarray
    rising_top: np.ndarray
    ceiling: np.ndarray


def _rising(out: np.ndarray, rate: float) -> np.ndarray:
    return np.maximum(out, rate)


def bracket(cal: CalibratedRange | None, k: ArrayLike, p: ArrayLike, g: ArrayLike) -> Bracket:
    """The curve each (k, p, g) lies on, measured or between two measured k (`Bracket`)."""
    kk, pp, gg = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (k, p, g)))
    tops = cal.curve_tops if cal is not None else ()
    top = top_rate(cal, kk, pp, gg)
    rising = _on_curves([t for t in tops if t.rising], kk, pp, gg, 0.0, _rising)
    ceiling = ceiling_rate(cal, kk, pp, gg)
    lo = np.full(kk.shape, -np.inf)
    hi = np.full(kk.shape, np.inf)
    for t in tops:
        same = _near(pp, t.prompt_tokens) & _near(gg, t.generation_tokens) & (t.k > 0)
        lo = np.where(same & (t.k < kk) & (t.k > lo), t.k, lo)
        hi = np.where(same & (t.k > kk) & (t.k < hi), t.k, hi)
    interp = (top == 0) & (kk > 0) & np.isfinite(lo) & np.isfinite(hi)
    if not np.any(interp):
        return Bracket(interp, top, rising, ceiling)
    k_lo, k_hi = np.where(interp, lo, np.nan), np.where(interp, hi, np.nan)
    top_b = np.minimum(top_rate(cal, k_lo, pp, gg), top_rate(cal, k_hi, pp, gg))
    rose = (_on_curves([t for t in tops if t.rising], k_lo, pp, gg, 0.0, _rising) > 0) \
        & (_on_curves([t for t in tops if t.rising], k_hi, pp, gg, 0.0, _rising) > 0)
    ceiling_b = np.minimum(ceiling_rate(cal, k_lo, pp, gg), ceiling_rate(cal, k_hi, pp, gg))
    return Bracket(interp, np.where(interp, top_b, top),
                   np.where(interp, np.where(rose, top_b, 0.0), rising),
                   np.where(interp, ceiling_b, ceiling))


def _sd_cap(params: Params, k: np.ndarray, p: np.ndarray, g: np.ndarray) -> np.ndarray:
    """SD's measured ceiling where it bounds the break-even (+inf elsewhere): k > 0, and
    no-SD still serves at that rate (below its own measured ceiling and with a fixed point
    of the model)."""
    cal = params.calibrated_range
    sd = ceiling_rate(cal, k, p, g)
    if not np.any(np.isfinite(sd)):
        return sd
    nosd = ceiling_rate(cal, 0.0, p, g)
    finite = np.isfinite(sd)
    serves = latency(params.model(), np.where(finite, sd, 0.0), 0.0, 1.0, p, g,
                     max_utilization=1.0).valid
    return np.where((k > 0) & finite & (sd < nosd) & serves, sd, np.inf)


def sd_ceiling(params: Params, k: float, p: float, g: float) -> float | None:
    """SD's measured ceiling (req/s) that bounds the break-even at this k and these lengths,
    or None where none does (the break-even is then the model's)."""
    cap = float(_sd_cap(params, np.asarray(float(k)), np.asarray(float(p)),
                        np.asarray(float(g))))
    return cap if math.isfinite(cap) else None


def sd_throughput_ceiling(params: Params, k: ArrayLike, e: ArrayLike, p: ArrayLike,
                          g: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """SD's throughput ceiling (req/s): the arrival rate past which SD at (k, E) no longer
    keeps up, the lower of the model's ceiling (its dense part for MoE) and the measured
    ceiling of the curve (k, p, g) lies on; with whether the measured one set it. NaN for
    k = 0 (SD off) and bad inputs; +inf for a load-free fit without a measured ceiling."""
    kk, ee, pp, gg = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (k, e, p, g)))
    coef = params.model()
    with np.errstate(invalid="ignore", divide="ignore"):
        dense = coef.dense if isinstance(coef, MoECoefficients) else coef
        modelled = throughput_ceiling(dense, kk, ee, pp, gg)
        measured = ceiling_rate(params.calibrated_range, kk, pp, gg)
        ok = (kk > 0) & np.isfinite(kk) & (ee >= 1) & (pp >= 0) & (gg > 0)
        rate = np.where(ok, np.minimum(modelled, measured), np.nan)
    return rate, ok & (measured <= modelled)


def breakeven(params: Params, k: ArrayLike, e: ArrayLike, p: ArrayLike,
              g: ArrayLike) -> BreakEven:
    """λ* as predict, sweep, advise, calibrate and the live series report it: the model's
    (`closed_form.breakeven`), where it lies below SD's measured ceiling (module docstring).
    Where that ceiling is lower, SD that pays below λ* (or everywhere) pays up to the ceiling
    with no break-even below it (PAYS_TO_CEILING), and SD that pays only above a λ* at or past
    it never pays."""
    kk, ee, pp, gg = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (k, e, p, g)))
    be = model_breakeven(params.model(), kk, ee, pp, gg)
    cap = _sd_cap(params, kk, pp, gg)
    kind = be.kind.astype(np.int8)
    with np.errstate(invalid="ignore"):
        to_cap = ((kind == BreakEvenKind.PAYS_BELOW) & (be.rate >= cap)) \
            | ((kind == BreakEvenKind.PAYS_EVERYWHERE) & np.isfinite(cap))
        never = (kind == BreakEvenKind.PAYS_ABOVE) & (be.rate >= cap)
    rate = np.where(to_cap, np.inf, np.where(never, 0.0, be.rate))
    kind = np.where(to_cap, BreakEvenKind.PAYS_TO_CEILING,
                    np.where(never, BreakEvenKind.NEVER_PAYS, kind)).astype(np.int8)
    return BreakEven(rate=rate, kind=kind)


def breakeven_interval(params: Params, k: float, e: float, p: float, g: float,
                       rate: float) -> tuple[float, float] | None:
    """The 90% interval of λ* (`uncertainty.breakeven_interval`; `rate` the reported, finite
    λ*). An end at or past SD's measured ceiling, where one bounds λ*, is +inf: in that corner
    the speedup does not fall to 1 below the ceiling. None without an uncertainty block, for
    MoE models, and when λ* is not a finite crossing."""
    if params.uncertainty is None:
        return None
    iv = uncertainty.breakeven_interval(params.model(), params.uncertainty, k, e, p, g, rate)
    if iv is None:
        return None
    cap = sd_ceiling(params, k, p, g)
    if cap is None:
        return iv
    return (iv[0], iv[1] if iv[1] < cap else math.inf)


def sd_ceiling_interval(params: Params, rate: float, measured: bool) -> tuple[float, float] | None:
    """The 90% interval of SD's throughput ceiling `rate` (`sd_throughput_ceiling`): a
    measured one known to the calibrated range's margin (the spread of repeated benchmark
    runs), the model's to the fit's residual spread at utilisation 1 (SD's whole L(B) scaled
    by 1 ± zσ divides its ceiling by that factor). None without an uncertainty block or a
    finite rate."""
    if not math.isfinite(rate) or rate <= 0:
        return None
    cal = params.calibrated_range
    if measured and cal is not None:
        return (rate / (1.0 + cal.margin), rate * (1.0 + cal.margin))
    if params.uncertainty is None:
        return None
    d = params.uncertainty.z * float(params.uncertainty.sigma(1.0))
    return (rate / (1.0 + d), rate / (1.0 - d) if d < 1.0 else math.inf)
