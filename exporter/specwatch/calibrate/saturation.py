"""Calibrating the saturation regime over the whole load range (model.md, "Saturation regime").

Each run is (B, λ, L) with B = λ·L from Little's law, so the fit sees the latency as a function
of the batch in flight, L(B), which is what a closed-loop benchmark measures on both sides of
the throughput peak. For fixed knees (T_v tokens per verify step, T_d tokens per draft step)
L(B) is linear in eight coefficients:

    L = a_p + cyc·a_v + cyc·k·a_d + B·b_p + cyc·B·b_v + cyc·k·B·b_d
        + cyc·max(0, B(k+1) − T_v)·c_v + cyc·k·max(0, B − T_d)·c_d,     cyc = g/E

so non-negative least squares on relative residuals (each row divided by its measured L, the
error the acceptance targets are stated in) fits them, and the knees are found by a grid
search over that profile (the residual at each knee pair is reported: a flat profile means
the knee is not identifiable from the data given).

Points are excluded only when truly unusable (no generation length, no acceptance length for
an SD run, a non-positive latency or throughput); high-concurrency points with exploding TTFT
are what this fit exists to use.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import nnls

from specwatch import model
from specwatch.calibrate.inputs import Point

__all__ = [
    "KNEES_D",
    "KNEES_V",
    "SATURATION_COEFFICIENTS",
    "SaturationFit",
    "design_matrix",
    "fit_saturation",
    "measured_breakeven",
    "predicted_latency",
]

#: Column order of the design matrix (and the names the report uses).
SATURATION_COEFFICIENTS = ("a_p", "a_v", "a_d", "b_p", "b_v", "b_d", "c_v", "c_d")

#: Knee grids (tokens per step). inf = no knee: the compute-bound column is dropped.
KNEES_V = (0.0, 32.0, 64.0, 96.0, 128.0, 160.0, 192.0, 256.0, 320.0, 384.0, 512.0, 768.0,
           1024.0, math.inf)
KNEES_D = (0.0, 16.0, 32.0, 64.0, 96.0, 128.0, 192.0, 256.0, math.inf)

#: A knee pair whose relative RMS error is within this factor of the best one is "as good":
#: the reported knee range is the span of those pairs.
KNEE_TOLERANCE = 1.10


@dataclass
class SaturationFit:
    """The fitted coefficients, the chosen knees and the knee profile."""

    coefficients: model.Coefficients
    rms: float  # relative RMS error at the chosen knees
    knee_range_v: tuple[float, float]
    knee_range_d: tuple[float, float]
    profile: dict[tuple[float, float], float] = field(default_factory=dict)


def _arrays(points: Sequence[Point]) -> tuple[np.ndarray, ...]:
    b = np.array([p.in_flight for p in points], dtype=float)
    k = np.array([p.draft_length for p in points], dtype=float)
    e = np.array([p.acceptance_length if p.sd else 1.0 for p in points], dtype=float)
    p_ = np.array([p.prompt_tokens or 0.0 for p in points], dtype=float)
    g = np.array([p.generation_tokens for p in points], dtype=float)
    return b, k, e, p_, g


def design_matrix(points: Sequence[Point], knee_v: float, knee_d: float) -> np.ndarray:
    """Rows of the linear problem at fixed knees, columns in SATURATION_COEFFICIENTS order."""
    b, k, e, _, g = _arrays(points)
    return _design(b, k, g / e, knee_v, knee_d)


def _design(b: np.ndarray, k: np.ndarray, cyc: np.ndarray, knee_v: float, knee_d: float
            ) -> np.ndarray:
    hv = np.zeros_like(b) if math.isinf(knee_v) else np.maximum(0.0, b * (k + 1) - knee_v)
    hd = np.zeros_like(b) if math.isinf(knee_d) else np.maximum(0.0, b - knee_d)
    return np.column_stack(
        [np.ones_like(b), cyc, cyc * k, b, cyc * b, cyc * k * b, cyc * hv, cyc * k * hd]
    )


def _solve(arrays: tuple[np.ndarray, ...], knee_v: float, knee_d: float
           ) -> tuple[np.ndarray, float]:
    b, k, cyc, lat = arrays
    x = _design(b, k, cyc, knee_v, knee_d)
    w = 1.0 / lat
    sol, _ = nnls(x * w[:, None], lat * w, maxiter=50 * x.shape[1])
    rel = x @ sol / lat - 1.0
    return sol, float(np.sqrt(np.mean(rel**2)))


def _coefficients(sol: np.ndarray, knee_v: float, knee_d: float) -> model.Coefficients:
    v = dict(zip(SATURATION_COEFFICIENTS, (float(x) for x in sol), strict=True))
    return model.Coefficients(
        a_p=v["a_p"], b_p=v["b_p"], a_v=v["a_v"], b_v=v["b_v"], a_d=v["a_d"], b_d=v["b_d"],
        c_v=v["c_v"] if math.isfinite(knee_v) else 0.0,
        knee_v=knee_v if math.isfinite(knee_v) and v["c_v"] > 0 else 0.0,
        c_d=v["c_d"] if math.isfinite(knee_d) else 0.0,
        knee_d=knee_d if math.isfinite(knee_d) and v["c_d"] > 0 else 0.0,
    )


def fit_saturation(points: Sequence[Point]) -> SaturationFit:
    """Grid search over the knees, NNLS at each; the pair with the lowest relative RMS wins
    (ties to the larger knee: the longer memory-bound stretch, closest to the linear model)."""
    if len(points) < len(SATURATION_COEFFICIENTS):
        raise ValueError(
            f"{len(points)} point(s); the saturation form needs at least "
            f"{len(SATURATION_COEFFICIENTS)}"
        )
    has_sd = any(p.sd for p in points)
    knees_d = KNEES_D if has_sd else (math.inf,)
    b, k, e, _, g = _arrays(points)
    arrays = (b, k, g / e, np.array([p.latency_s for p in points], dtype=float))
    profile: dict[tuple[float, float], float] = {}
    best: tuple[float, float, float, np.ndarray] | None = None
    for kv in KNEES_V:
        for kd in knees_d:
            sol, rms = _solve(arrays, kv, kd)
            profile[(kv, kd)] = rms
            if best is None or rms < best[0] * (1 - 1e-9):
                best = (rms, kv, kd, sol)
    assert best is not None
    rms, kv, kd, sol = best
    good = [key for key, r in profile.items() if r <= rms * KNEE_TOLERANCE]
    vs = [key[0] for key in good]
    ds = [key[1] for key in good]
    return SaturationFit(
        coefficients=_coefficients(sol, kv, kd),
        rms=rms,
        knee_range_v=(min(vs), max(vs)),
        knee_range_d=(min(ds), max(ds)),
        profile=profile,
    )


def predicted_latency(coef: model.Coefficients, points: Sequence[Point]) -> np.ndarray:
    """L(B) at each point's measured batch in flight (the closed-loop prediction)."""
    b, k, e, p_, g = _arrays(points)
    return model.batch_latency(coef, b, k, e, p_, g)


# --------------------------------------------------------------------------- break-even


def _up_to_peak(points: Sequence[Point]) -> list[tuple[float, float]]:
    """(λ, L) of one curve sorted by load, up to and including its throughput peak."""
    pts = _by_load(points)
    if not pts:
        return []
    peak = max(range(len(pts)), key=lambda i: pts[i].arrival_rate)
    curve = [(p.arrival_rate, p.latency_s) for p in pts[: peak + 1]]
    # Keep λ strictly increasing (a closed-loop curve can wobble at light load).
    out: list[tuple[float, float]] = []
    for lam, lat in curve:
        if not out or lam > out[-1][0]:
            out.append((lam, lat))
    return out


def _by_load(points: Sequence[Point]) -> list[Point]:
    return sorted(points, key=lambda p: (p.concurrency or p.in_flight, p.arrival_rate))


def _peak_seen(points: Sequence[Point]) -> bool:
    """True when the curve has a run past its throughput peak: the ceiling was measured,
    not just the last load tried."""
    pts = _by_load(points)
    peak = max(range(len(pts)), key=lambda i: pts[i].arrival_rate)
    return peak < len(pts) - 1


def measured_breakeven(sd: Sequence[Point], nosd: Sequence[Point]) -> tuple[float, str] | None:
    """Measured λ* of one draft length on one workload, and how it was found.

    The arrival rate where the SD and no-SD latency curves cross at equal λ (linear
    interpolation, each curve up to its own throughput peak), or SD's throughput ceiling
    when SD is still faster there, no-SD serves more, and SD's curve has a run past its peak
    (otherwise the "peak" is only the last load tried). None when neither applies within the
    measured range.
    """
    a, b = _up_to_peak(sd), _up_to_peak(nosd)
    if len(a) < 2 or len(b) < 2:
        return None
    la, ya = np.array([x for x, _ in a]), np.array([y for _, y in a])
    lb, yb = np.array([x for x, _ in b]), np.array([y for _, y in b])
    lo, hi = max(la[0], lb[0]), min(la[-1], lb[-1])
    if hi <= lo:
        return None
    grid = np.linspace(lo, hi, 2001)
    diff = np.interp(grid, la, ya) - np.interp(grid, lb, yb)
    if diff[0] >= 0:
        return None  # SD not faster at the lightest common load: no pays-below crossing
    cross = np.flatnonzero(diff >= 0)
    if cross.size:
        i = cross[0]
        x0, x1, d0, d1 = grid[i - 1], grid[i], diff[i - 1], diff[i]
        return float(x0 + (x1 - x0) * (-d0) / (d1 - d0)), "crossing"
    if la[-1] < lb[-1] and _peak_seen(sd):
        return float(la[-1]), "sd_ceiling"
    return None


def group_by_workload(points: Sequence[Point], labels: Sequence[str]
                      ) -> dict[str, dict[float, list[Point]]]:
    """workload -> draft length -> points (k = 0 is no SD)."""
    out: dict[str, dict[float, list[Point]]] = defaultdict(lambda: defaultdict(list))
    for p, w in zip(points, labels, strict=True):
        out[w][float(round(p.draft_length, 6))].append(p)
    return out
