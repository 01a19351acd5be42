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

May import: the model's closed form, break-even, coefficients, costs, params, observed and
uncertainty modules.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from specwatch.model import uncertainty
from specwatch.model.breakeven import BreakEven, BreakEvenKind
from specwatch.model.closed_form import breakeven as model_breakeven
from specwatch.model.closed_form import latency
from specwatch.model.coefficients import ArrayLike, MoECoefficients
from specwatch.model.costs import throughput_ceiling
from specwatch.model.observed import CalibratedRange, MeasuredCeiling
from specwatch.model.params import Params

__all__ = ["LENGTH_TOLERANCE", "breakeven", "breakeven_interval", "ceiling_rate", "sd_ceiling",
           "sd_ceiling_interval", "sd_throughput_ceiling", "top_rate"]

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
