"""Cost terms of one dense system and what follows from them without a fixed-point solve.

Owns (C1, C2) of the linear form L(B) = C1 + C2·B (`cost_terms`, and the dense/expert split of
an MoE model), the latency at a given batch in flight L(B) (`batch_latency`, what a closed-loop
benchmark measures), the throughput ceiling λ_max, and L = C1 / (1 − λ·C2) from cost terms alone
(calibration's per-configuration fallback). Pure, vectorised numpy: every function broadcasts
over its numeric arguments.
"""

from __future__ import annotations

import numpy as np

from specwatch.model import saturation as _saturation
from specwatch.model.coefficients import ArrayLike, Coefficients, MoECoefficients

__all__ = [
    "batch_latency",
    "cost_terms",
    "latency_from_costs",
    "moe_cost_terms",
    "throughput_ceiling",
]


def cost_terms(
    coef: Coefficients, k: ArrayLike, e: ArrayLike, p: ArrayLike, g: ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    """(C1, C2) of one system: C1 = a_p + (g/E)(a_v + k·a_d), C2 = b_p + (g/E)(b_v + k·b_d).

    g/E verify cycles per request, each one verify pass plus k draft steps; prefill once per
    request. k = 0 with E = 1 is the no-SD system. For an MoE model use `moe_cost_terms`.
    """
    if isinstance(coef, MoECoefficients):
        raise TypeError("cost_terms prices a dense model; use moe_cost_terms for MoE")
    kk, ee, pp, gg = (np.asarray(x, dtype=float) for x in (k, e, p, g))
    cycles = gg / ee
    b_v = coef.b_v + coef.b_v_context * (pp + gg / 2.0)
    c1 = coef.a_p + cycles * (coef.a_v + kk * coef.a_d)
    c2 = coef.b_p + cycles * (b_v + kk * coef.b_d)
    return c1, c2


def moe_cost_terms(
    coef: MoECoefficients, k: ArrayLike, e: ArrayLike, p: ArrayLike, g: ArrayLike
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(C1_u, C2_u, C1_s, C2_s): dense part (drafter included) and expert part of one system."""
    c1_u, c2_u = cost_terms(coef.dense, k, e, p, g)
    ee, gg = np.asarray(e, dtype=float), np.asarray(g, dtype=float)
    cycles = gg / ee
    c1_s = coef.expert.a_p + cycles * coef.expert.a_v
    c2_s = coef.expert.b_p + cycles * coef.expert.b_v
    return c1_u, c2_u, c1_s, c2_s


def batch_latency(
    coef: Coefficients, in_flight: ArrayLike, k: ArrayLike, e: ArrayLike, p: ArrayLike,
    g: ArrayLike,
) -> np.ndarray:
    """L(B): mean latency (s) with B requests in flight, before the fixed point B = λ·L.

    What a closed-loop benchmark measures directly (it fixes B, Little's law gives λ = B/L),
    so calibration judges the fit with it over the whole load range, past the throughput
    peak included. Linear model: C1 + C2·B; the saturation regime adds the knee terms; past
    the capacity N, N run and B − N wait: L = (B/N)·L(N) (`saturation.closed_loop_latency`).
    """
    if isinstance(coef, MoECoefficients):
        raise TypeError("batch_latency prices a dense model")
    kk, ee, pp, gg, bb = (np.asarray(x, dtype=float) for x in (k, e, p, g, in_flight))
    c1, c2 = cost_terms(coef, kk, ee, pp, gg)
    return _saturation.closed_loop_latency(bb, c1, c2, gg / ee, kk, coef.c_v, coef.knee_v,
                                           coef.c_d, coef.knee_d, coef.capacity(pp, gg, kk))


def throughput_ceiling(
    coef: Coefficients, k: ArrayLike, e: ArrayLike, p: ArrayLike, g: ArrayLike
) -> np.ndarray:
    """λ_max (req/s): the highest arrival rate with a fixed point (1/C2 in the linear model)."""
    if isinstance(coef, MoECoefficients):
        raise TypeError("throughput_ceiling prices a dense model")
    kk, ee, pp, gg = (np.asarray(x, dtype=float) for x in (k, e, p, g))
    c1, c2 = cost_terms(coef, kk, ee, pp, gg)
    return _saturation.ceiling(c1, c2, gg / ee, kk, coef.c_v, coef.knee_v, coef.c_d,
                               coef.knee_d, coef.capacity(pp, gg, kk))[0]


def latency_from_costs(c1: ArrayLike, c2: ArrayLike, arrival_rate: ArrayLike) -> np.ndarray:
    """L = C1 / (1 − λ·C2) from one dense system's cost terms; NaN at or past saturation.

    The fixed point without coefficients: calibration's per-configuration fallback fits
    (C1, C2) directly and predicts with this (never with a copy of the formula).
    """
    c1, c2, lam = np.broadcast_arrays(
        *(np.asarray(x, dtype=float) for x in (c1, c2, arrival_rate))
    )
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        util = lam * c2
        ok = np.isfinite(c1) & (c1 >= 0) & np.isfinite(util) & (util < 1.0) & (lam >= 0)
        return np.where(ok, c1 / (1.0 - util), np.nan)
