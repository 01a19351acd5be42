"""The saturation regime: per-step cost with a roofline knee, and its fixed point (pure numpy).

Per request in flight B, with cycles = g/E verify cycles per request:

    L(B) = C1 + C2·B + cycles·( c_v·max(0, B·(k+1) − T_v) + k·c_d·max(0, B − T_d) )

C1, C2 are the linear model's cost terms; c_v is the compute-bound cost of one verified token
past the verifier's knee T_v (tokens per verify step), c_d the same for one draft token past
the drafter's knee T_d. With c_v = c_d = 0 and no capacity this is the linear model.

Owns: the fixed point B = λ·L(B) (the smallest root, by bisection below the throughput
ceiling; at or above the ceiling the system is saturated, never a number), the break-even in
closed form along the pieces of L (`pieces`, `first_crossing`), the capacity bound B <= N and
the closed-loop latency past it (`closed_loop_latency`). Why each holds, and the derivations:
docs/model.md, "Saturation regime".
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "BISECTIONS",
    "batch_latency",
    "ceiling",
    "closed_loop_latency",
    "first_crossing",
    "fixed_point",
    "pieces",
]

#: Bisection halvings of the bracket [0, B_hi]: 2^-64 of the bracket is below float resolution.
BISECTIONS = 64


def batch_latency(
    b: np.ndarray,
    c1: np.ndarray,
    c2: np.ndarray,
    cycles: np.ndarray,
    k: np.ndarray,
    c_v: float,
    knee_v: float,
    c_d: float,
    knee_d: float,
) -> np.ndarray:
    """L(B): mean request latency (s) with B requests in flight (module docstring)."""
    with np.errstate(invalid="ignore", over="ignore"):
        extra = c_v * np.maximum(0.0, b * (k + 1.0) - knee_v)
        extra = extra + k * c_d * np.maximum(0.0, b - knee_d)
        return c1 + c2 * b + cycles * extra


def closed_loop_latency(
    b: np.ndarray,
    c1: np.ndarray,
    c2: np.ndarray,
    cycles: np.ndarray,
    k: np.ndarray,
    c_v: float,
    knee_v: float,
    c_d: float,
    knee_d: float,
    capacity: np.ndarray,
) -> np.ndarray:
    """L with B requests in the system of which at most N = `capacity` run: L(B) up to N,
    then (B/N)·L(N) (B − N wait; throughput stays N/L(N)). Identical to `batch_latency`
    where B <= N, so with no capacity (inf) it is `batch_latency` exactly."""
    b, capacity = np.broadcast_arrays(np.asarray(b, dtype=float),
                                      np.asarray(capacity, dtype=float))
    running = np.minimum(b, capacity)
    lat = batch_latency(running, c1, c2, cycles, k, c_v, knee_v, c_d, knee_d)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b > capacity, lat * (b / capacity), lat)


def ceiling(
    c1: np.ndarray,
    c2: np.ndarray,
    cycles: np.ndarray,
    k: np.ndarray,
    c_v: float,
    knee_v: float,
    c_d: float,
    knee_d: float,
    capacity: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(λ_max in req/s, B* in requests): the throughput ceiling and the batch it is reached at.

    L is piecewise linear and convex with breakpoints at the knees, so λ(B) = B/L(B) is
    monotone on each piece (increasing where the piece's intercept is positive): its supremum
    is at a knee, at the capacity, or the limit 1/slope as B → ∞ (B* = inf there). `capacity`
    is the largest number of requests in flight (inf for none).
    """
    c1, c2, cycles, k, capacity = np.broadcast_arrays(c1, c2, cycles, k, capacity)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        kv_b = np.where(c_v > 0, knee_v / (k + 1.0), np.inf)
        kd_b = np.where((c_d > 0) & (k > 0), knee_d * np.ones_like(k), np.inf)
        slope_inf = c2 + cycles * ((k + 1.0) * c_v + k * c_d)
        # Intercept of the last piece: L(B) = slope_inf·B + last for B past both knees.
        last = c1 - cycles * (
            np.where(c_v > 0, c_v * knee_v, 0.0) + np.where(k > 0, k * c_d * knee_d, 0.0)
        )
        best = np.where(
            (last > 0) & np.isinf(capacity),
            np.where(slope_inf > 0, 1.0 / slope_inf, np.inf),
            0.0,
        )
        best_b = np.where(best > 0, np.inf, 0.0)
        for cand in (kv_b, kd_b, capacity):
            b = np.minimum(cand, capacity)
            ok = np.isfinite(b) & (b > 0)
            lam = np.where(
                ok, b / batch_latency(b, c1, c2, cycles, k, c_v, knee_v, c_d, knee_d), 0.0
            )
            better = ok & (lam > best)
            best = np.where(better, lam, best)
            best_b = np.where(better, b, best_b)
    return best, best_b


def _piecewise_root(
    lam: np.ndarray, c1: np.ndarray, c2: np.ndarray, cycles: np.ndarray, k: np.ndarray,
    c_v: float, knee_v: float, c_d: float, knee_d: float,
) -> np.ndarray:
    """Smallest root of B = λ·(α + β·B) over the linear pieces of L (NaN where none):
    exact up to rounding, and checked by `fixed_point` before it is used."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        kv_b = np.where(c_v > 0, knee_v / (k + 1.0), np.inf)
        kd_b = np.where((c_d > 0) & (k > 0), knee_d * np.ones_like(k), np.inf)
        first, second = np.minimum(kv_b, kd_b), np.maximum(kv_b, kd_b)
        zero = np.zeros_like(first)
        root = np.full(np.broadcast_shapes(lam.shape, first.shape), np.nan)
        for lo, hi in ((zero, first), (first, second), (second, np.full_like(first, np.inf))):
            mid = np.where(np.isfinite(hi), 0.5 * (lo + hi), lo + 1.0)
            slope = c2 + cycles * (np.where(mid * (k + 1.0) > knee_v, c_v * (k + 1.0), 0.0)
                                   + np.where(mid > knee_d, k * c_d, 0.0))
            intercept = batch_latency(mid, c1, c2, cycles, k, c_v, knee_v, c_d, knee_d) - (
                slope * mid)
            den = 1.0 - lam * slope
            cand = lam * intercept / den
            ok = (den > 0) & (cand >= lo) & (cand <= hi) & np.isnan(root)
            root = np.where(ok, cand, root)
    return root


def fixed_point(
    lam: np.ndarray,
    c1: np.ndarray,
    c2: np.ndarray,
    cycles: np.ndarray,
    k: np.ndarray,
    c_v: float,
    knee_v: float,
    c_d: float,
    knee_d: float,
    capacity: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(latency L in s, utilisation λ/λ_max, saturated) at arrival rate λ.

    Latency is NaN where saturated. The bracket's upper end is B* when the ceiling is reached
    at a finite batch (h(B*) = B*·(1 − λ/λ_max) > 0), else λ·C1/(1 − λ·s) with s the slope of
    the last piece (L(B) <= C1 + s·B, so h is positive there). The root of the linear piece
    it lies on is computed directly and kept where a 1e-12-wide sign-change bracket proves
    it; every other row is bisected on [0, upper end], 64 halvings (the guarantee).
    """
    lam, c1, c2, cycles, k, capacity = np.broadcast_arrays(
        *(np.asarray(x, dtype=float) for x in (lam, c1, c2, cycles, k, capacity))
    )
    lam_max, b_star = ceiling(c1, c2, cycles, k, c_v, knee_v, c_d, knee_d, capacity)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        util = np.where(lam_max > 0, lam / lam_max, np.inf)
        util = np.where(lam == 0, 0.0, util)
        saturated = ~(util < 1.0)
        slope_inf = c2 + cycles * ((k + 1.0) * c_v + k * c_d)
        hi_inf = lam * c1 / (1.0 - lam * slope_inf)
        hi = np.where(np.isfinite(b_star), b_star, hi_inf)
        hi = np.where(saturated, 0.0, hi)

        def h(x: np.ndarray) -> np.ndarray:
            return x - lam * batch_latency(x, c1, c2, cycles, k, c_v, knee_v, c_d, knee_d)

        # Fast path: the root of the linear piece it lies on, accepted only where a bracket
        # of relative width 1e-12 around it proves it (h < 0 below, >= 0 above, inside
        # [0, hi]); any row it does not prove is bisected (the guarantee).
        guess = _piecewise_root(lam, c1, c2, cycles, k, c_v, knee_v, c_d, knee_d)
        below = guess * (1.0 - 1e-12)
        above = guess * (1.0 + 1e-12) + 1e-300
        proven = (np.isfinite(guess) & (above <= hi) & (h(below) < 0) & (h(above) >= 0)) | (
            lam == 0) | saturated
        b = np.where(lam == 0, 0.0, above)
        if not proven.all():
            lo = np.zeros_like(hi)
            top = hi.copy()
            for _ in range(BISECTIONS):
                mid = 0.5 * (lo + top)
                neg = h(mid) < 0
                lo = np.where(neg, mid, lo)
                top = np.where(neg, top, mid)
            b = np.where(proven, b, top)
        # L = B/λ at the root; at λ = 0 the system is empty and L = L(0) = C1.
        lat = np.where(
            lam > 0,
            batch_latency(b, c1, c2, cycles, k, c_v, knee_v, c_d, knee_d),
            c1,
        )
    return np.where(saturated, np.nan, lat), util, saturated


#: Pieces of L per system: [0, first knee], [first knee, second knee], [second knee, ∞).
PIECES = 3


def pieces(
    c1: np.ndarray,
    c2: np.ndarray,
    cycles: np.ndarray,
    k: np.ndarray,
    c_v: float,
    knee_v: float,
    c_d: float,
    knee_d: float,
    capacity: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(starts, α, β, λ_max): L(λ) = α_j/(1 − λ·β_j) for λ in [starts_j, starts_j+1).

    Arrays of shape (..., PIECES) plus λ_max (...,). Piece j of L(B) = α_j + β_j·B begins at
    the batch b_j (0, then the knees in order, inf for a knee that is not set); it is reached
    at λ = b_j/L(b_j), clipped to the ceiling: a piece past the ceiling's batch B* (past the
    capacity, or where α_j <= 0 and λ(B) decreases) starts at λ(B*) = λ_max, never used. The
    last piece runs to λ_max. α_j is written from the knee terms (c·(B·m − T) = c·m·B − c·T),
    so it is finite even for a piece that starts at inf.
    """
    c1, c2, cycles, k, capacity = np.broadcast_arrays(c1, c2, cycles, k, capacity)
    lam_max, b_star = ceiling(c1, c2, cycles, k, c_v, knee_v, c_d, knee_d, capacity)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        kv_b = np.where(c_v > 0, knee_v / (k + 1.0), np.inf)
        kd_b = np.where((c_d > 0) & (k > 0), knee_d, np.inf)
        starts_b = np.stack([np.zeros_like(kv_b), np.minimum(kv_b, kd_b),
                             np.maximum(kv_b, kd_b)], axis=-1)
        past_v = kv_b[..., None] <= starts_b  # the piece lies past the verifier's knee
        past_d = kd_b[..., None] <= starts_b
        cyc = cycles[..., None]
        beta = c2[..., None] + cyc * (np.where(past_v, c_v * (k[..., None] + 1.0), 0.0)
                                      + np.where(past_d, k[..., None] * c_d, 0.0))
        alpha = c1[..., None] - cyc * (np.where(past_v, c_v * knee_v, 0.0)
                                       + np.where(past_d, k[..., None] * c_d * knee_d, 0.0))
        b = np.minimum(starts_b, b_star[..., None])  # may lie on an earlier piece: L(b)
        lam_b = b / batch_latency(b, c1[..., None], c2[..., None], cyc, k[..., None], c_v,
                                  knee_v, c_d, knee_d)
        lm = lam_max[..., None]
        starts = np.where(np.isfinite(lam_b), np.minimum(lam_b, lm), lm)
        starts[..., 0] = 0.0
    return starts, alpha, beta, lam_max


def first_crossing(
    lam_hi: np.ndarray,
    sd: tuple[np.ndarray, np.ndarray, np.ndarray],
    nosd: tuple[np.ndarray, np.ndarray, np.ndarray],
    sd_faster: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(λ, found): the first λ in (0, lam_hi) where SD's side of S = L_D/L_SD against 1 flips.

    `sd` and `nosd` are (starts, α, β) from `pieces`; `sd_faster` says S(0) > 1. The flip is
    S <= 1 where SD is faster at λ = 0, S > 1 where it is slower (what the numeric scan
    looks for). Both systems' piece starts cut [0, lam_hi] into at most 2·PIECES − 1
    intervals on which each latency is one hyperbola, and on each of them
    L_SD − L_D = D(λ) / ((1 − λβ_s)(1 − λβ_d)), D(λ) = α_s(1 − λβ_d) − α_d(1 − λβ_s), with
    both denominators positive below the ceilings: S's side is D's sign, D is linear, and
    its one root is (α_s − α_d)/(α_s·β_d − α_d·β_s). The first interval whose end has
    flipped holds the crossing (D is linear on each interval, so a flip inside one shows at
    its end, and L is continuous along λ, so none hides between intervals). A crossing
    within 1e-9 of lam_hi is none: S is undefined at saturation (the linear closed form's
    rule).
    """
    s_starts, s_alpha, s_beta = sd
    d_starts, d_alpha, d_beta = nosd
    hi = lam_hi[..., None]
    cuts = np.sort(np.minimum(np.concatenate(
        [s_starts, d_starts[..., 1:], hi], axis=-1), hi), axis=-1)
    u, v = cuts[..., :-1], cuts[..., 1:]
    mid = 0.5 * (u + v)
    # The piece each system is on inside [u, v]: how many of its later starts lie at or below
    # the middle of the interval.
    si = (s_starts[..., None, 1:] <= mid[..., None]).sum(axis=-1)
    di = (d_starts[..., None, 1:] <= mid[..., None]).sum(axis=-1)
    a_s = np.take_along_axis(s_alpha, si, axis=-1)
    b_s = np.take_along_axis(s_beta, si, axis=-1)
    a_d = np.take_along_axis(d_alpha, di, axis=-1)
    b_d = np.take_along_axis(d_beta, di, axis=-1)
    faster = sd_faster[..., None]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        def flipped(lam: np.ndarray) -> np.ndarray:
            dd = a_s * (1.0 - lam * b_d) - a_d * (1.0 - lam * b_s)
            return np.where(faster, dd >= 0, dd < 0)

        root = (a_s - a_d) / (a_s * b_d - a_d * b_s)
        at_u = flipped(u)
        cand = np.where(at_u, u, np.clip(root, u, v))
        hit = (u < v) & (at_u | flipped(v)) & (cand > 0) & (cand < hi * (1.0 - 1e-9))
    found = hit.any(axis=-1)
    first = np.argmax(hit, axis=-1)[..., None]
    cross = np.take_along_axis(cand, first, axis=-1)[..., 0]
    return np.where(found, cross, np.nan), found
