"""What the measured throughput ceilings decide: `saturated` at or past them, and the
break-even they bound.

A measured ceiling (`observed.MeasuredCeiling`) is where one curve of the calibration runs
(one k on one workload) stopped rising: more requests in flight brought no more throughput.
A prediction for the same k on lengths within `LENGTH_TOLERANCE` at or past its rate is
`saturated` (`model.validity`), whatever the fitted ceiling says. SD cannot pay where it
does not serve, so the break-even every command and the live series report is the model's
λ* lowered to SD's measured ceiling where no-SD still serves at that rate: the rule the model
already applies to its own ceilings (docs/model.md, "Break-even, best k, batch-size
schedule"). Without measured ceilings (a file without a calibrated range, or curves that
never stopped rising) it is the model's λ*, unchanged. Pure numpy.

May import: the model's closed form, break-even, coefficients, params, observed and
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
from specwatch.model.coefficients import ArrayLike
from specwatch.model.observed import CalibratedRange, MeasuredCeiling
from specwatch.model.params import Params

__all__ = ["LENGTH_TOLERANCE", "breakeven", "breakeven_interval", "ceiling_rate", "sd_ceiling",
           "top_rate"]

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


def breakeven(params: Params, k: ArrayLike, e: ArrayLike, p: ArrayLike,
              g: ArrayLike) -> BreakEven:
    """λ* as predict, sweep, advise, calibrate and the live series report it: the model's
    (`closed_form.breakeven`), bounded by SD's measured ceiling (module docstring). Where
    the bound applies, SD that pays below λ* (or everywhere) pays below the ceiling, and SD
    that pays only above a λ* at or past it never pays."""
    kk, ee, pp, gg = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (k, e, p, g)))
    be = model_breakeven(params.model(), kk, ee, pp, gg)
    cap = _sd_cap(params, kk, pp, gg)
    kind = be.kind.astype(np.int8)
    with np.errstate(invalid="ignore"):
        below = ((kind == BreakEvenKind.PAYS_BELOW) & (be.rate > cap)) \
            | ((kind == BreakEvenKind.PAYS_EVERYWHERE) & np.isfinite(cap))
        never = (kind == BreakEvenKind.PAYS_ABOVE) & (be.rate >= cap)
    rate = np.where(below, cap, np.where(never, 0.0, be.rate))
    kind = np.where(below, BreakEvenKind.PAYS_BELOW,
                    np.where(never, BreakEvenKind.NEVER_PAYS, kind)).astype(np.int8)
    return BreakEven(rate=rate, kind=kind)


def breakeven_interval(params: Params, k: float, e: float, p: float, g: float,
                       rate: float) -> tuple[float, float] | None:
    """The 90% interval of λ* (`uncertainty.breakeven_interval`; `rate` the reported λ*),
    with SD's measured ceiling, where one bounds λ*, known to the calibrated range's margin
    (the spread of repeated benchmark runs): the upper end is at most the ceiling plus the
    margin, and where the ceiling sets λ* itself the lower end is at most the ceiling less
    it. None without an uncertainty block, for MoE models, and when λ* is not a finite
    crossing."""
    if params.uncertainty is None:
        return None
    iv = uncertainty.breakeven_interval(params.model(), params.uncertainty, k, e, p, g, rate)
    if iv is None:
        return None
    cap = sd_ceiling(params, k, p, g)
    cal = params.calibrated_range
    if cap is None or cal is None:
        return iv
    spread = 1.0 + cal.margin
    lo = min(iv[0], cap / spread) if rate >= cap else iv[0]
    return (lo, min(iv[1], cap * spread))
