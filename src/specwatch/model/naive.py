"""COMPARISON ONLY: the naive seed form of the SD latency model. Never a specwatch prediction.

The pseudo-code that circulates with the interpretable SD latency model prices a request as

    L_SD(B) = (g/E)·[(a_p + b_p·B) + γ·(a_d + b_d·B) + (a_v + b_v·B)·γ·(1 − α)]
    L_D(B)  = g·[(a_p + b_p·B) + (a_v + b_v·B)]

and finds B by iterating B ← λ·L_SD(B) in a scalar loop, then prices the no-SD system at
that same B. This reconstruction keeps the four mistakes the model reference lists, which
is the point of keeping it: verify passes counted as γ(1 − α) instead of g/E, verify cost
growing with γ, prefill paid every cycle instead of once per request, and one batch reused
for both systems. specwatch uses it only as the benchmark baseline (bench/bench_model.py)
and to show, in tests, how far it is from the corrected closed form.
"""

from __future__ import annotations

import math

from specwatch.model.coefficients import Coefficients


def naive_latency_sd(coef: Coefficients, batch: float, k: float, alpha: float, g: float) -> float:
    """The naive per-request SD latency at a given batch B (seed form, labelled wrong)."""
    e = (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
    per_cycle = (
        (coef.a_p + coef.b_p * batch)
        + k * (coef.a_d + coef.b_d * batch)
        + (coef.a_v + coef.b_v * batch) * k * (1.0 - alpha)
    )
    return (g / e) * per_cycle


def naive_latency_nosd(coef: Coefficients, batch: float, g: float) -> float:
    """The naive no-SD latency, priced at the SD system's batch (the fourth mistake)."""
    return g * ((coef.a_p + coef.b_p * batch) + (coef.a_v + coef.b_v * batch))


def naive_speedup_scalar(
    coef: Coefficients,
    arrival_rate: float,
    k: float,
    alpha: float,
    g: float,
    tol: float = 1e-9,
    max_iter: int = 10_000,
) -> float:
    """The seed's scalar fixed-point loop on B = λ·L_SD(B); NaN if it does not converge.

    This is the loop the benchmark times: one Python iteration per step, one point at a time.
    """
    batch = 0.0
    for _ in range(max_iter):
        new = arrival_rate * naive_latency_sd(coef, batch, k, alpha, g)
        if not math.isfinite(new) or new > 1e12:
            return math.nan
        if abs(new - batch) <= tol * max(1.0, abs(new)):
            batch = new
            break
        batch = new
    else:
        return math.nan
    l_sd = naive_latency_sd(coef, batch, k, alpha, g)
    return naive_latency_nosd(coef, batch, g) / l_sd
