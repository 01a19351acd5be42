"""The mixture-of-experts fixed point: L = G(L) with the share of experts φ(T) (pure numpy).

G is increasing in L, so the smallest fixed point is bracketed from below by G^n(0) and found by
a grid scan and a fixed number of bisections: the solver always terminates, and says when it did
not converge or when no stable operating point exists (saturation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specwatch.model.coefficients import ArrayLike, MoECoefficients

__all__ = ["MOE_RESIDUAL_TOLERANCE", "MoESolution", "solve_moe_latency"]

# MoE solver: grid points used to bracket the smallest fixed point, bisection steps, and the
# relative residual |L − G(L)| / L below which a solution counts as converged.
_MOE_GRID = 64
_MOE_BISECTIONS = 100
_MOE_PRE_ITERATIONS = 8
MOE_RESIDUAL_TOLERANCE = 1e-9


@dataclass(frozen=True)
class MoESolution:
    """Result of `solve_moe_latency` (arrays). latency is NaN unless converged."""

    latency: np.ndarray
    utilization: np.ndarray  # λ·(C2_u + φ·C2_s) at the solution; λ·(C2_u + C2_s) if saturated
    residual: np.ndarray  # |L − G(L)| / L at the returned point (NaN when saturated)
    converged: np.ndarray
    saturated: np.ndarray
    expert_share: np.ndarray  # φ(T) at the solution


def solve_moe_latency(
    coef: MoECoefficients,
    arrival_rate: ArrayLike,
    tokens_per_request: ArrayLike,
    c1_u: ArrayLike,
    c2_u: ArrayLike,
    c1_s: ArrayLike,
    c2_s: ArrayLike,
) -> MoESolution:
    """Smallest fixed point of L = G(L) = (C1_u + φ(T)·C1_s) / (1 − λ(C2_u + φ(T)·C2_s)).

    T = λ·L·tokens_per_request (k + 1 with SD, 1 without) is the number of tokens routed per
    step. G is increasing in L, so G^n(0) are lower bounds on the smallest fixed point (the
    one a system reaches from empty) and any L with G(L) <= L is an upper bound. When
    λ(C2_u + C2_s) < 1 the bound (C1_u + C1_s) / (1 − λ(C2_u + C2_s)) always brackets a root;
    otherwise G has a pole where the denominator reaches 0 and there may be no fixed point
    below it: that is saturation. A fixed grid scan finds the first sign change, and a fixed
    number of bisections refines it, so the solver always terminates.
    """
    lam, tpr, c1u, c2u, c1s, c2s = np.broadcast_arrays(
        *(np.asarray(x, dtype=float) for x in (arrival_rate, tokens_per_request, c1_u, c2_u,
                                               c1_s, c2_s))
    )
    shape = lam.shape
    rows = _Rows(coef, *(x.ravel() for x in (lam, tpr, c1u, c2u, c1s, c2s)))
    lam, tpr, c2u, c2s = rows.lam, rows.tpr, rows.c2u, rows.c2s
    n = lam.size
    saturated = np.zeros(n, dtype=bool)

    lo = _lower_bound(rows)
    # G^n(0) = inf means no fixed point exists (it would bound every iterate from above).
    saturated |= ~np.isfinite(lo)
    rho_max = lam * (c2u + c2s)
    hi = _upper_bound(rows, rho_max)

    todo = ~saturated & np.isfinite(lo)
    at_root, b = _bracket_root(rows, lo, hi, todo, saturated)
    solved = todo & ~saturated
    # The upper end keeps G(L) <= L, i.e. the point is on the stable side of the root.
    cand = np.where(at_root, lo, b)
    g_cand = np.full(n, np.nan)
    if solved.any():
        g_cand[solved] = rows.g(cand[solved], np.flatnonzero(solved))
    with np.errstate(divide="ignore", invalid="ignore"):
        residual = np.where(solved, np.abs(cand - g_cand) / cand, np.nan)
    converged = solved & (residual < MOE_RESIDUAL_TOLERANCE)
    latency = np.where(converged & (cand > 0) & np.isfinite(cand), cand, np.nan)
    phi = coef.expert_share(lam * np.where(solved, cand, 0.0) * tpr)
    util = np.where(solved, lam * (c2u + phi * c2s), rho_max)
    return MoESolution(
        latency=latency.reshape(shape),
        utilization=util.reshape(shape),
        residual=residual.reshape(shape),
        converged=converged.reshape(shape),
        saturated=saturated.reshape(shape),
        expert_share=np.where(solved, phi, np.nan).reshape(shape),
    )


@dataclass(frozen=True)
class _Rows:
    """The flattened inputs of one solve (one row per point) and their G(L)."""

    coef: MoECoefficients
    lam: np.ndarray
    tpr: np.ndarray
    c1u: np.ndarray
    c2u: np.ndarray
    c1s: np.ndarray
    c2s: np.ndarray

    def g(self, x: np.ndarray, sel: np.ndarray | slice = slice(None)) -> np.ndarray:
        """G(L) with +inf past the pole; x broadcasts against the selected rows (+ grid axis)."""
        lam_, tpr_ = self.lam[sel], self.tpr[sel]
        c1u_, c2u_, c1s_, c2s_ = self.c1u[sel], self.c2u[sel], self.c1s[sel], self.c2s[sel]
        if x.ndim == 2:
            lam_, tpr_, c1u_, c2u_, c1s_, c2s_ = (
                v[:, None] for v in (lam_, tpr_, c1u_, c2u_, c1s_, c2s_)
            )
        phi = self.coef.expert_share(lam_ * x * tpr_)
        den = 1.0 - lam_ * (c2u_ + phi * c2s_)
        with np.errstate(divide="ignore", invalid="ignore"):
            val = (c1u_ + phi * c1s_) / den
        return np.where(den > 0, val, np.inf)


def _lower_bound(rows: _Rows) -> np.ndarray:
    """G^n(0): monotone iteration from the empty system (inf where it hit the pole)."""
    lo = rows.g(np.zeros(rows.lam.size))
    for _ in range(_MOE_PRE_ITERATIONS):
        lo = np.where(np.isfinite(lo), rows.g(np.where(np.isfinite(lo), lo, 0.0)), lo)
    return lo


def _upper_bound(rows: _Rows, rho_max: np.ndarray) -> np.ndarray:
    """(C1_u + C1_s) / (1 − λ(C2_u + C2_s)) where that is below saturation, else the
    latency just short of G's pole."""
    lam, tpr, c2u, c2s = rows.lam, rows.tpr, rows.c2u, rows.c2s
    bounded = rho_max < 1.0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        hi_bounded = (rows.c1u + rows.c1s) / (1.0 - rho_max)
        phi_pole = (1.0 - lam * c2u) / (lam * c2s)
        keep = rows.coef.untouched_share
        if keep == 0.0:
            t_pole = np.zeros(lam.size)
        else:
            t_pole = np.log1p(-np.clip(phi_pole, 0.0, 1.0)) / math.log(keep)
        l_pole = t_pole / (lam * tpr) * (1.0 - 1e-12)
    return np.where(bounded, hi_bounded, l_pole)


def _bracket_root(rows: _Rows, lo: np.ndarray, hi: np.ndarray, todo: np.ndarray,
                  saturated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(at_root, b): rows whose lower bound already is the fixed point, and the upper end of
    each bisected bracket. Marks `saturated` (in place) where the grid finds no root."""
    n = lo.size
    # lo may already be (numerically) the fixed point: then there is nothing to bracket.
    at_root = np.zeros(n, dtype=bool)
    at_root[todo] = rows.g(lo[todo], np.flatnonzero(todo)) <= lo[todo]
    idx = np.flatnonzero(todo & ~at_root)
    b = lo.copy()
    if idx.size:
        lo_i, hi_i = lo[idx], np.maximum(hi[idx], lo[idx])
        s = (np.arange(1, _MOE_GRID + 1) / _MOE_GRID) ** 2  # dense near lo, where the root is
        grid = lo_i[:, None] + (hi_i - lo_i)[:, None] * s[None, :]
        h = grid - rows.g(grid, idx)
        ge = h >= 0
        found = ge.any(axis=1)
        first = np.argmax(ge, axis=1)
        left = np.where(first > 0, grid[np.arange(idx.size), first - 1], lo_i)
        right = grid[np.arange(idx.size), first]
        saturated[idx[~found]] = True
        fidx = idx[found]
        a_f, b_f = left[found], right[found]
        for _ in range(_MOE_BISECTIONS):
            mid = 0.5 * (a_f + b_f)
            pos = mid - rows.g(mid, fidx) >= 0
            a_f = np.where(pos, a_f, mid)
            b_f = np.where(pos, mid, b_f)
        b[fidx] = b_f
    return at_root, b
