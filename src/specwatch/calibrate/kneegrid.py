"""The saturation fit's knee grid for many runs: every (knee_v, knee_d) pair at one
capacity from the normal equations, in time linear in the runs once per grid row and column
rather than once per pair.

At fixed knees the saturation form is a weighted non-negative least-squares problem
``min ||W (X β − L)||, β ≥ 0`` with the design ``X`` of `saturation._design` and the
weights ``W = 1/L`` (relative errors). Only two of its eight columns depend on the knees,
one on ``knee_v`` and one on ``knee_d``, so the Gram matrix ``XᵀW²X`` and ``XᵀW²L`` of every
pair are assembled from dot products computed once per knee (and one per pair), and the
problem is solved in its 8-dimensional equivalent (``||Aβ − y||²`` with ``AᵀA = XᵀW²X``,
``Aᵀy = XᵀW²L``: the same minimiser). The relative RMS error follows from the same
products; :func:`solve_weighted` solves one pair the same way. On a few hundred runs the
per-pair NNLS on the runs themselves (`saturation._solve`) is as fast and is what runs; from
:data:`GRAM_MIN_POINTS` runs these do (the same solutions and RMS to about 1e-12).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.optimize import nnls

#: Runs from which the knee grid is solved from the normal equations.
GRAM_MIN_POINTS = 500

#: Eigenvalues of the column-scaled Gram matrix below this fraction of the largest are
#: treated as zero (a column that is all zeros, e.g. a knee above every run's load).
_RANK_TOLERANCE = 1e-13


def _small_nnls(gram: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """argmin βᵀGβ − 2rᵀβ over β ≥ 0, as an NNLS problem of the Gram matrix's size; a
    column that is all zeros keeps its coefficient at 0 (as NNLS does)."""
    out = np.zeros(gram.shape[0])
    used = np.flatnonzero(np.diag(gram) > 0)
    d = np.sqrt(np.diag(gram)[used])
    scaled = gram[np.ix_(used, used)] / np.outer(d, d)
    s, v = np.linalg.eigh(scaled)
    keep = s > s.max() * _RANK_TOLERANCE
    root = np.sqrt(s[keep])
    a = root[:, None] * v[:, keep].T
    y = (v[:, keep].T @ (rhs[used] / d)) / root
    sol, _ = nnls(a, y, maxiter=50 * gram.shape[0])
    out[used] = sol / d
    return out


def _rms(gram: np.ndarray, rhs: np.ndarray, sol: np.ndarray, n: int) -> float:
    """Relative RMS error from the normal equations: Σ (x·β/L − 1)² = βᵀGβ − 2 rᵀβ + n."""
    sq = float(sol @ gram @ sol - 2.0 * rhs @ sol + n)
    return math.sqrt(max(sq, 0.0) / n)


def solve_weighted(xw: np.ndarray) -> tuple[np.ndarray, float]:
    """(solution, relative RMS) of ``min ||xw·β − 1||, β ≥ 0`` (the design already
    divided by the latencies) from its normal equations."""
    gram, rhs = xw.T @ xw, xw.sum(axis=0)
    sol = _small_nnls(gram, rhs)
    return sol, _rms(gram, rhs, sol, xw.shape[0])


def grid_at_capacity(arrays: tuple[np.ndarray, ...], knees_v: Sequence[float],
                     knees_d: Sequence[float], capacity: np.ndarray | None
                     ) -> dict[tuple[float, float], tuple[np.ndarray, float]]:
    """(knee_v, knee_d) -> (solution, relative RMS) at one per-run ``capacity`` (requests,
    inf for none): what `saturation._solve` gives at each pair."""
    b, k, cyc, lat = arrays
    row = 1.0 / lat  # relative errors: W = 1/L, and W·L = 1
    if capacity is not None:
        past = b > capacity
        if past.any():
            row = row * np.where(past, b / capacity, 1.0)
            b = np.where(past, capacity, b)
    n = b.size
    ones = np.ones(n)
    base = np.column_stack([ones, cyc, cyc * k, b, cyc * b, cyc * k * b]) * row[:, None]
    kv_arr = np.array([0.0 if math.isinf(x) else x for x in knees_v])
    kd_arr = np.array([0.0 if math.isinf(x) else x for x in knees_d])
    # one column per knee (all zeros for an infinite knee), every product in a few GEMMs
    u = np.maximum(0.0, (b * (k + 1))[:, None] - kv_arr[None, :]) * (cyc * row)[:, None]
    u[:, [math.isinf(x) for x in knees_v]] = 0.0
    v = np.maximum(0.0, b[:, None] - kd_arr[None, :]) * (cyc * k * row)[:, None]
    v[:, [math.isinf(x) for x in knees_d]] = 0.0
    g0, c0 = base.T @ base, base.T @ ones
    bu, bv, uv = base.T @ u, base.T @ v, u.T @ v
    uu, vv = np.einsum("ij,ij->j", u, u), np.einsum("ij,ij->j", v, v)
    su, sv = u.sum(axis=0), v.sum(axis=0)
    out: dict[tuple[float, float], tuple[np.ndarray, float]] = {}
    gram = np.zeros((8, 8))
    gram[:6, :6] = g0
    rhs = np.zeros(8)
    rhs[:6] = c0
    for i, kv in enumerate(knees_v):
        gram[:6, 6] = gram[6, :6] = bu[:, i]
        gram[6, 6] = uu[i]
        rhs[6] = su[i]
        for j, kd in enumerate(knees_d):
            gram[:6, 7] = gram[7, :6] = bv[:, j]
            gram[7, 7] = vv[j]
            gram[6, 7] = gram[7, 6] = uv[i, j]
            rhs[7] = sv[j]
            sol = _small_nnls(gram, rhs)
            out[(kv, kd)] = (sol, _rms(gram, rhs, sol, n))
    return out
