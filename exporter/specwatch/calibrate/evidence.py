"""What a fit's own runs vouch for: the calibrated range and the residual spread (every mode).

Both are written into every parameters file calibration produces, whatever the model form,
because every prediction is judged by them (`model.validity.assess`):

- the calibrated range: the highest arrival rate per draft length (0 = no SD) and over all,
  requests in flight B = λ·L, tokens per verify step B·(k+1), and the highest utilisation
  λ/λ_max of a run under the fitted model. A prediction past them is
  `beyond_calibrated_load`: a fit that never saw its knee or its capacity cannot vouch for a
  load near them; the bound is every system's runs (another k, or no SD, at those tokens per
  step and in-flight counts is evidence for the same step cost), not the k's own alone;
- the residual spread: the relative RMS residual of L(B) at the runs, per band of
  utilisation (`model.uncertainty`), merged upward until a band has `MIN_BAND_RUNS` runs and
  made non-decreasing in the utilisation (a band above cannot claim a tighter fit than the
  ones below with fewer runs behind it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from specwatch import model
from specwatch.calibrate.inputs import Point
from specwatch.model.params import CalibratedRange
from specwatch.model.uncertainty import Band, Uncertainty

__all__ = ["BAND_EDGES", "MIN_BAND_RUNS", "calibrated_range", "residual_spread",
           "run_utilization"]

#: Upper edges of the utilisation bands of the residual spread; the last band is open.
#: The residuals grow towards the ceiling (0.9 and past it are the closed-loop queues).
BAND_EDGES = (0.5, 0.7, 0.8, 0.9)

#: A band needs this many runs for its own σ (fewer: merged with the band above it).
MIN_BAND_RUNS = 5


def _arrays(points: Sequence[Point]) -> tuple[np.ndarray, ...]:
    lam = np.array([q.arrival_rate for q in points], dtype=float)
    k = np.array([q.draft_length for q in points], dtype=float)
    e = np.array([q.acceptance_length if q.sd else 1.0 for q in points], dtype=float)
    p = np.array([q.prompt_tokens or 0.0 for q in points], dtype=float)
    g = np.array([q.generation_tokens for q in points], dtype=float)
    return lam, k, e, p, g


def run_utilization(coef: model.Coefficients, points: Sequence[Point]) -> np.ndarray:
    """λ/λ_max of each run under the fitted model (above 1 for a run past the model's
    ceiling: a closed-loop run measured past its throughput peak)."""
    lam, k, e, p, g = _arrays(points)
    with np.errstate(divide="ignore", invalid="ignore"):
        return lam / model.throughput_ceiling(coef, k, e, p, g)


def calibrated_range(coef: model.Coefficients, points: Sequence[Point]) -> CalibratedRange:
    """The load the runs cover (module docstring)."""
    lam, k, _, _, _ = _arrays(points)
    by_k: dict[int, float] = {}
    for rate, kk in zip(lam, k, strict=True):
        key = round(float(kk))
        by_k[key] = max(by_k.get(key, 0.0), round(float(rate), 4))
    util = run_utilization(coef, points)
    util = util[np.isfinite(util)]
    return CalibratedRange(
        max_arrival_rate=round(float(lam.max()), 4),
        max_in_flight=round(float(max(q.in_flight for q in points)), 3),
        draft_lengths=tuple(sorted(by_k)),
        max_tokens_per_step=round(float(max(q.in_flight * (q.draft_length + 1)
                                            for q in points)), 1),
        max_arrival_rate_by_k=by_k,
        max_utilization_seen=round(float(util.max()), 4) if util.size else None,
    )


def residual_spread(coef: model.Coefficients, points: Sequence[Point],
                    batch_predicted: np.ndarray) -> Uncertainty:
    """Relative RMS residual of L(B) per utilisation band (module docstring).

    `batch_predicted` is L(B) at each run's measured batch in flight (what the fit fits; a
    NaN there, a run the model cannot price, counts as a 100% residual)."""
    measured = np.array([q.latency_s for q in points], dtype=float)
    rel = batch_predicted / measured - 1.0
    rel = np.where(np.isfinite(rel), rel, 1.0)
    util = run_utilization(coef, points)
    util = np.where(np.isfinite(util), util, math.inf)
    edges = (*BAND_EDGES, math.inf)
    bands: list[tuple[float, list[float]]] = []
    pending: list[float] = []
    lo = -math.inf
    for top in edges:
        pending.extend(rel[(util >= lo) & (util < top)].tolist())
        lo = top
        if len(pending) >= MIN_BAND_RUNS or (math.isinf(top) and pending):
            bands.append((top, pending))
            pending = []
    if len(bands) > 1 and len(bands[-1][1]) < MIN_BAND_RUNS:
        top, last = bands.pop()
        bands[-1] = (top, bands[-1][1] + last)
    if not bands:
        bands = [(math.inf, [0.0])]
    else:
        bands[-1] = (math.inf, bands[-1][1])
    out: list[Band] = []
    floor = 0.0
    for top, res in bands:
        sigma = max(floor, float(np.sqrt(np.mean(np.square(res)))))
        floor = sigma
        out.append(Band(utilization_below=top, sigma=round(sigma, 5), runs=len(res)))
    return Uncertainty(bands=tuple(out))
