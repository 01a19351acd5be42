"""The linear latency form's least-squares core and the measures every fit is judged by.

With B = λ·L known from each measurement, the model is linear in its six coefficients:

    L = a_p + (g/E)·a_v + (g·k/E)·a_d + B·b_p + (B·g/E)·b_v + (B·g·k/E)·b_d

so non-negative least squares (scipy.optimize.nnls) fits it. This module owns that design matrix
(`COEFFICIENTS` order), the fit, the variance inflation of its columns, R² and MAPE, and how
points are grouped by draft length and workload. Predictions go through `specwatch.model`;
nothing here re-implements the closed form.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import nnls

from specwatch import model
from specwatch.calibrate.inputs import Point

__all__ = [
    "COEFFICIENTS",
    "design_matrix",
    "fit_coefficients",
    "fmt_k",
    "k_key",
    "mean_absolute_percentage_error",
    "model_inputs",
    "need_e",
    "need_g",
    "predict_points",
    "r_squared",
    "variance_inflation",
    "workload_labels",
]

#: Design matrix column order (and the names the report uses).
COEFFICIENTS = ("a_p", "a_v", "a_d", "b_p", "b_v", "b_d")

#: Relative tolerance when grouping points into one workload by their mean lengths.
_WORKLOAD_TOLERANCE = 0.10


def design_matrix(points: Sequence[Point]) -> np.ndarray:
    """Rows [1, g/E, g·k/E, B, B·g/E, B·g·k/E] in COEFFICIENTS order (needs g and E)."""
    lam = np.array([p.arrival_rate for p in points], dtype=float)
    lat = np.array([p.latency_s for p in points], dtype=float)
    g = np.array([need_g(p) for p in points], dtype=float)
    k = np.array([p.draft_length for p in points], dtype=float)
    e = np.array([need_e(p) for p in points], dtype=float)
    b = lam * lat
    cycles = g / e
    return np.column_stack([np.ones_like(b), cycles, cycles * k, b, b * cycles, b * cycles * k])


def need_g(p: Point) -> float:
    if p.generation_tokens is None:
        raise ValueError(f"{p.source}: no generation tokens")
    return p.generation_tokens


def need_e(p: Point) -> float:
    if p.acceptance_length is None:
        raise ValueError(f"{p.source}: no acceptance length")
    return p.acceptance_length


def fit_coefficients(points: Sequence[Point]) -> model.Coefficients:
    """Non-negative least squares of the linear form; returns model coefficients."""
    x = design_matrix(points)
    y = np.array([p.latency_s for p in points], dtype=float)
    solution, _ = nnls(x, y)
    return model.Coefficients(**{n: float(v) for n, v in zip(COEFFICIENTS, solution, strict=True)})


def variance_inflation(x: np.ndarray) -> np.ndarray:
    """Variance inflation factor of each column of a design matrix (inf when collinear).

    Columns are scaled to unit norm first so the result does not depend on units. The design
    already has a constant column, so each column is regressed on the others as they are.
    """
    n_rows, n_cols = x.shape
    norms = np.linalg.norm(x, axis=0)
    out = np.full(n_cols, np.inf)
    if n_rows < n_cols:
        return out
    scaled = np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)
    for j in range(n_cols):
        if norms[j] == 0:
            continue
        others = np.delete(scaled, j, axis=1)
        beta, *_ = np.linalg.lstsq(others, scaled[:, j], rcond=None)
        residual = float(np.sum((scaled[:, j] - others @ beta) ** 2))
        out[j] = 1.0 / residual if residual > 1e-15 else np.inf
    return out


def predict_points(
    coef: model.Coefficients, points: Sequence[Point]
) -> tuple[np.ndarray, np.ndarray]:
    """(latency, utilisation) the model predicts at each point's measured λ, k, E, p, g.

    The ceiling is lifted (1.0) so that a prediction exists for every point below saturation;
    the fit itself decides what to exclude.
    """
    lam, k, e, p, g = model_inputs(points)
    result = model.latency(coef, lam, k, e, p, g, max_utilization=1.0)
    return result.latency, result.utilization


def model_inputs(points: Sequence[Point]) -> tuple[np.ndarray, ...]:
    lam = np.array([pt.arrival_rate for pt in points], dtype=float)
    k = np.array([pt.draft_length for pt in points], dtype=float)
    e = np.array([need_e(pt) for pt in points], dtype=float)
    p = np.array([pt.prompt_tokens or 0.0 for pt in points], dtype=float)
    g = np.array([need_g(pt) for pt in points], dtype=float)
    return lam, k, e, p, g


def r_squared(measured: np.ndarray, predicted: np.ndarray) -> float:
    """Coefficient of determination of predictions against measurements."""
    ss_res = float(np.sum((measured - predicted) ** 2))
    ss_tot = float(np.sum((measured - measured.mean()) ** 2))
    if ss_tot == 0:
        return 1.0 if ss_res == 0 else float("nan")
    return 1.0 - ss_res / ss_tot


def mean_absolute_percentage_error(measured: np.ndarray, predicted: np.ndarray) -> float:
    """Mean |predicted − measured| / measured as a fraction (0.02 = 2%); NaN predictions count
    as 100% (the model called a measured point saturated)."""
    err = np.abs(predicted - measured) / measured
    return float(np.mean(np.where(np.isfinite(err), err, 1.0)))


def k_key(point: Point) -> float:
    """Draft length as a grouping key (γ_eff from Prometheus windows may be fractional)."""
    return round(point.draft_length, 2)


def workload_labels(points: Sequence[Point]) -> list[str]:
    """A workload name per point: its dataset, else a cluster of similar mean (p, g).

    The lengths of one dataset vary slightly with the number of prompts a run drew (144.5 vs
    146.1 prompt tokens), so lengths are clustered within 10% rather than compared exactly.
    """
    labels: list[str] = []
    centres: list[tuple[float, float]] = []
    for pt in points:
        if pt.dataset:
            labels.append(pt.dataset)
            continue
        p = pt.prompt_tokens or 0.0
        g = pt.generation_tokens or 0.0
        for cp, cg in centres:
            if _close(p, cp) and _close(g, cg):
                labels.append(_length_label(cp, cg))
                break
        else:
            centres.append((p, g))
            labels.append(_length_label(p, g))
    return labels


def _length_label(p: float, g: float) -> str:
    parts = [f"p≈{p:.0f}"] if p > 0 else []
    parts += [f"g≈{g:.0f}"] if g > 0 else []
    return " ".join(parts) or "one workload"


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= _WORKLOAD_TOLERANCE * max(abs(a), abs(b), 1e-12)


def fmt_k(k: float) -> str:
    return f"{k:g}"
