"""Fitting the latency model's six coefficients to measurement points (model.md, "Fitting").

With B = λ·L known from each measurement, the model is linear in the coefficients:

    L = a_p + (g/E)·a_v + (g·k/E)·a_d + B·b_p + (B·g/E)·b_v + (B·g·k/E)·b_d

so non-negative least squares (scipy.optimize.nnls) fits it. Everything around that one call
is about honesty: which points are excluded and why (past the utilisation ceiling, queueing at
the server, above a concurrency cap), whether the data can separate all six coefficients at
all (variance inflation of the design matrix columns), and how well the fit predicts a draft
length it has not seen (leave-one-k-out). When the six cannot be separated, each configuration
gets its own (C1, C2) so speedup and break-even are still measured-backed.

Predictions go through `specwatch.model`; this module never re-implements the closed form.

Size: the least-squares problem, its design matrix and the diagnostics that judge it
(identifiability, leave-one-out) share the same column layout; splitting them would expose
that layout as an interface.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import nnls

from specwatch import model
from specwatch.calibrate import evidence
from specwatch.calibrate.inputs import Point
from specwatch.model.observed import CalibratedRange
from specwatch.model.uncertainty import Uncertainty

#: Design matrix column order (and the names the report uses).
COEFFICIENTS = ("a_p", "a_v", "a_d", "b_p", "b_v", "b_d")

#: Columns whose variance inflation factor exceeds this are reported as not identifiable.
#: VIF = 1/(1 − R²_j) of column j regressed on the others; 1000 means 99.9% of the column is
#: explained by the others, so 1% measurement noise moves that coefficient by tens of percent.
#: On the public Qwen3-32B sweep (concurrency <= 64) the columns reach VIF ≈ 120; a single
#: workload with only k = 0 and one k reaches 10⁵ and more.
DEFAULT_VIF_LIMIT = 1000.0

#: Default queueing test: a point whose mean TTFT exceeds this multiple of the TTFT at the
#: lowest load of the same configuration is queueing at the server (model.md: exclude points
#: whose queue time or TTFT explodes). On the public sweep every point at concurrency <= 64
#: is below 4.8×, except the no-SD InstructCoder run at 64 (6.0×); runs at 128 and 256 reach
#: 6× to 300×.
DEFAULT_MAX_TTFT_RATIO = 5.0

#: Relative tolerance when grouping points into one workload by their mean lengths.
_WORKLOAD_TOLERANCE = 0.10


@dataclass(frozen=True)
class FitOptions:
    """What to exclude and how strict identifiability is (CLI flags map to these)."""

    max_utilization: float = model.DEFAULT_MAX_UTILIZATION
    max_concurrency: float | None = None
    max_ttft_ratio: float | None = DEFAULT_MAX_TTFT_RATIO
    vif_limit: float = DEFAULT_VIF_LIMIT


@dataclass(frozen=True)
class Excluded:
    """A point left out of the fit, and why (shown in every report)."""

    point: Point
    reason: str


@dataclass(frozen=True)
class ConfigurationFit:
    """(C1, C2) of one configuration (one draft length on one workload), fitted on its own."""

    k: float
    workload: str
    c1: float
    c2: float
    n_points: int
    acceptance_length: float
    prompt_tokens: float | None
    generation_tokens: float | None


@dataclass(frozen=True)
class DraftLengthSummary:
    """What the fit says about one draft length: zero-load speedup and break-even."""

    k: float
    acceptance_length: float
    prompt_tokens: float | None
    generation_tokens: float | None
    zero_load_speedup: float
    breakeven_arrival_rate: float
    breakeven_kind: str


@dataclass(frozen=True)
class MeasuredSpeedup:
    """L_D / L_SD measured at the lowest concurrency both systems ran on one workload."""

    k: float
    workload: str
    concurrency: float
    measured: float
    predicted: float


@dataclass
class SystemFit:
    """The result of calibrating one system (see `fit_system`)."""

    system: str
    mode: str  # "saturation", "six-coefficient" or "per-configuration"
    points: list[Point]
    excluded: list[Excluded]
    predicted: np.ndarray
    utilization: np.ndarray
    r2: float
    mape: float
    coefficients: model.Coefficients | None = None
    vif: dict[str, float] = field(default_factory=dict)
    not_identifiable: list[str] = field(default_factory=list)
    fallback_reason: str | None = None
    leave_one_k_out_mape: float | None = None
    leave_one_k_out_by_k: dict[float, float] = field(default_factory=dict)
    leave_one_k_out_note: str | None = None
    configurations: list[ConfigurationFit] = field(default_factory=list)
    draft_lengths: list[DraftLengthSummary] = field(default_factory=list)
    measured_speedups: list[MeasuredSpeedup] = field(default_factory=list)
    acceptance_profile: tuple[float, ...] | None = None
    notes: list[str] = field(default_factory=list)
    # Saturation mode only (calibrate.load_range): what the parameters file records for
    # validity, and the whole-range report (knees, per-concurrency errors, break-even).
    calibrated_range: CalibratedRange | None = None
    saturation: dict[str, Any] | None = None
    #: The residual spread of L(B) per utilisation band (intervals; every coefficient mode).
    uncertainty: Uncertainty | None = None
    #: Every run predicted through `specwatch predict`'s path (`evidence.user_path`).
    user_path: dict[str, Any] | None = None

    @property
    def n_points(self) -> int:
        return len(self.points)

    @property
    def n_excluded(self) -> int:
        return len(self.excluded)

    def residuals(self) -> np.ndarray:
        """Relative residuals (predicted − measured) / measured of the points used."""
        measured = np.array([p.latency_s for p in self.points])
        return (self.predicted - measured) / measured


class FitError(Exception):
    """The data cannot be fitted at all (too few points); carries a user-facing message."""


# --------------------------------------------------------------------------------------------
# building blocks


def design_matrix(points: Sequence[Point]) -> np.ndarray:
    """Rows [1, g/E, g·k/E, B, B·g/E, B·g·k/E] in COEFFICIENTS order (needs g and E)."""
    lam = np.array([p.arrival_rate for p in points], dtype=float)
    lat = np.array([p.latency_s for p in points], dtype=float)
    g = np.array([_need_g(p) for p in points], dtype=float)
    k = np.array([p.draft_length for p in points], dtype=float)
    e = np.array([_need_e(p) for p in points], dtype=float)
    b = lam * lat
    cycles = g / e
    return np.column_stack([np.ones_like(b), cycles, cycles * k, b, b * cycles, b * cycles * k])


def _need_g(p: Point) -> float:
    if p.generation_tokens is None:
        raise ValueError(f"{p.source}: no generation tokens")
    return p.generation_tokens


def _need_e(p: Point) -> float:
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
    lam, k, e, p, g = _arrays(points)
    result = model.latency(coef, lam, k, e, p, g, max_utilization=1.0)
    return result.latency, result.utilization


def _arrays(points: Sequence[Point]) -> tuple[np.ndarray, ...]:
    lam = np.array([pt.arrival_rate for pt in points], dtype=float)
    k = np.array([pt.draft_length for pt in points], dtype=float)
    e = np.array([_need_e(pt) for pt in points], dtype=float)
    p = np.array([pt.prompt_tokens or 0.0 for pt in points], dtype=float)
    g = np.array([_need_g(pt) for pt in points], dtype=float)
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


def _fmt_k(k: float) -> str:
    return f"{k:g}"


# --------------------------------------------------------------------------------------------
# exclusions that do not depend on the fit


def _pre_exclusions(
    points: Sequence[Point], options: FitOptions
) -> tuple[list[Point], list[Excluded]]:
    kept: list[Point] = []
    excluded: list[Excluded] = []
    for pt in points:
        if (
            options.max_concurrency is not None
            and pt.concurrency is not None
            and pt.concurrency > options.max_concurrency
        ):
            excluded.append(
                Excluded(
                    pt,
                    f"concurrency {pt.concurrency:g} > --max-concurrency "
                    f"{options.max_concurrency:g}",
                )
            )
        else:
            kept.append(pt)
    if options.max_ttft_ratio is None:
        return kept, excluded
    labels = workload_labels(kept)
    groups: dict[tuple[float, str], list[int]] = defaultdict(list)
    for i, pt in enumerate(kept):
        groups[(k_key(pt), labels[i])].append(i)
    drop: dict[int, str] = {}
    for (k, workload), idx in groups.items():
        with_ttft = [i for i in idx if kept[i].ttft_s is not None and kept[i].ttft_s > 0]
        if len(with_ttft) < 2:
            continue
        ref_i = min(with_ttft, key=lambda i: (kept[i].arrival_rate, kept[i].concurrency or 0))
        ref = kept[ref_i].ttft_s
        assert ref is not None
        for i in with_ttft:
            ttft = kept[i].ttft_s
            assert ttft is not None
            if ttft > options.max_ttft_ratio * ref:
                drop[i] = (
                    f"queueing: mean TTFT {ttft:.3g} s is {ttft / ref:.1f}× the {ref:.3g} s at the"
                    f" lowest load of k={_fmt_k(k)} on {workload} (limit"
                    f" {options.max_ttft_ratio:g}×, --max-ttft-ratio)"
                )
    final = [pt for i, pt in enumerate(kept) if i not in drop]
    excluded.extend(Excluded(kept[i], why) for i, why in sorted(drop.items()))
    return final, excluded


# --------------------------------------------------------------------------------------------
# the fit


def fit_system(
    system: str, points: Sequence[Point], options: FitOptions | None = None
) -> SystemFit:
    """Calibrate one system: exclusions, six-coefficient NNLS or per-configuration fallback.

    Raises FitError when nothing is left to fit.
    """
    options = options or FitOptions()
    if not points:
        raise FitError(f"system {system!r}: no measurement points")
    candidates, excluded = _pre_exclusions(points, options)
    missing_g = [p for p in candidates if p.generation_tokens is None]
    missing_e = [p for p in candidates if p.sd and p.acceptance_length is None]
    reason = None
    if missing_g:
        reason = (
            f"{len(missing_g)} point(s) lack generation tokens (first: {missing_g[0].source});"
            " the six-coefficient form prices tokens, so it needs g"
        )
    elif missing_e:
        reason = (
            f"{len(missing_e)} SD point(s) lack the acceptance length (first:"
            f" {missing_e[0].source}); the six-coefficient form needs E"
        )
    if reason is None:
        return _fit_six(system, candidates, excluded, options)
    return _fit_per_configuration(system, candidates, excluded, options, reason)


def _utilization_loop(
    candidates: list[Point],
    excluded: list[Excluded],
    ceiling: float,
    fit: Callable[[list[Point]], object],
    utilization: Callable[[object, list[Point]], np.ndarray],
) -> tuple[list[Point], object]:
    """Fit, drop points whose predicted utilisation λ·C2 is above the ceiling, refit.

    A point once dropped stays dropped, so this terminates (at most one pass per point).
    """
    current = list(candidates)
    while True:
        if len(current) == 0:
            raise FitError("every point was excluded; nothing left to fit")
        result = fit(current)
        util = utilization(result, current)
        bad = [i for i, u in enumerate(util) if not (np.isfinite(u) and u <= ceiling)]
        if not bad:
            return current, result
        for i in bad:
            u = util[i]
            why = (
                f"utilisation λ·C2 = {u:.2f} above the ceiling {ceiling:g} (--max-utilization)"
                if np.isfinite(u)
                else "the fitted model has no prediction here"
            )
            excluded.append(Excluded(current[i], why))
        current = [p for i, p in enumerate(current) if i not in set(bad)]


def _fit_six(
    system: str, candidates: list[Point], excluded: list[Excluded], options: FitOptions
) -> SystemFit:
    """The six-coefficient fit, or the per-configuration fallback when the data cannot
    identify every coefficient."""
    if len(candidates) < len(COEFFICIENTS):
        return _fit_per_configuration(
            system,
            candidates,
            excluded,
            options,
            f"{len(candidates)} point(s) left; six coefficients need at least six",
        )

    def util_of(coef: object, pts: list[Point]) -> np.ndarray:
        assert isinstance(coef, model.Coefficients)
        lam, k, e, p, g = _arrays(pts)
        return lam * model.cost_terms(coef, k, e, p, g)[1]

    work_excluded = list(excluded)
    used, coef_obj = _utilization_loop(
        candidates, work_excluded, options.max_utilization, fit_coefficients, util_of
    )
    assert isinstance(coef_obj, model.Coefficients)
    vif = variance_inflation(design_matrix(used))
    vif_map = {n: float(v) for n, v in zip(COEFFICIENTS, vif, strict=True)}
    not_identifiable = [n for n, v in vif_map.items() if not v <= options.vif_limit]
    if not_identifiable:
        fallback = _fit_per_configuration(
            system,
            candidates,
            excluded,
            options,
            _identifiability_reason(used, not_identifiable),
        )
        fallback.vif = vif_map
        fallback.not_identifiable = not_identifiable
        return fallback
    predicted, util = predict_points(coef_obj, used)
    measured = np.array([p.latency_s for p in used])
    fit = SystemFit(
        system=system,
        mode="six-coefficient",
        points=used,
        excluded=work_excluded,
        predicted=predicted,
        utilization=util,
        r2=r_squared(measured, predicted),
        mape=mean_absolute_percentage_error(measured, predicted),
        coefficients=coef_obj,
        vif=vif_map,
    )
    _leave_one_k_out(fit)
    _summaries_six(fit)
    if not any(p.draft_length == 0 for p in used):
        fit.notes.append(
            "no runs without SD: the no-SD latency behind speedup and break-even is the"
            " verify cost extrapolated to one token per step; add a baseline run to check it"
        )
    fit.acceptance_profile = _profile(used)
    fit.configurations = _configurations(used, options)
    fit.calibrated_range = evidence.calibrated_range(coef_obj, used)
    lam, k, e, p, g = _arrays(used)
    batch = model.batch_latency(coef_obj, lam * measured, k, e, p, g)
    fit.uncertainty = evidence.residual_spread(coef_obj, used, batch)
    fit.user_path = evidence.user_path(
        evidence.params_of(fit, options.max_utilization), used, batch)
    return fit


def _identifiability_reason(points: Sequence[Point], names: Sequence[str]) -> str:
    ks = sorted({k_key(p) for p in points})
    workloads = sorted(set(workload_labels(points)))
    loads = len({round(p.in_flight, 3) for p in points})
    hints = []
    if len(ks) < 3:
        hints.append(f"only draft lengths {', '.join(_fmt_k(k) for k in ks)}")
    if len(workloads) < 2:
        hints.append("a single workload (one mean prompt/generation length)")
    if loads < 3:
        hints.append(f"only {loads} load level(s)")
    why = "; ".join(hints) if hints else "the columns are nearly collinear"
    return (
        f"the data cannot separate {', '.join(names)} (variance inflation above the limit):"
        f" {why}. Add runs at more draft lengths, a second workload, or more load levels"
    )


def _leave_one_k_out(fit: SystemFit) -> None:
    """Refit without each draft length in turn and predict it: the error on an unseen k."""
    assert fit.coefficients is not None
    keys = sorted({k_key(p) for p in fit.points})
    if len(keys) < 2:
        fit.leave_one_k_out_note = "needs at least two draft lengths"
        return
    errors: list[float] = []
    for key in keys:
        train = [p for p in fit.points if k_key(p) != key]
        test = [p for p in fit.points if k_key(p) == key]
        if len(train) < len(COEFFICIENTS):
            fit.leave_one_k_out_note = f"too few points left without k={_fmt_k(key)}"
            fit.leave_one_k_out_by_k = {}
            return
        coef = fit_coefficients(train)
        predicted, _ = predict_points(coef, test)
        measured = np.array([p.latency_s for p in test])
        err = np.abs(predicted - measured) / measured
        err = np.where(np.isfinite(err), err, 1.0)
        fit.leave_one_k_out_by_k[key] = float(np.mean(err))
        errors.extend(err.tolist())
    fit.leave_one_k_out_mape = float(np.mean(errors))


def _summaries_six(fit: SystemFit) -> None:
    """Zero-load speedup and break-even per draft length, and the measured speedup check."""
    coef = fit.coefficients
    assert coef is not None
    by_k: dict[float, list[Point]] = defaultdict(list)
    for p in fit.points:
        by_k[k_key(p)].append(p)
    for key in sorted(k for k in by_k if k > 0):
        pts = by_k[key]
        e = float(np.mean([_need_e(p) for p in pts]))
        p_tok = float(np.mean([p.prompt_tokens or 0.0 for p in pts]))
        g_tok = float(np.mean([_need_g(p) for p in pts]))
        s0 = float(model.speedup(coef, 0.0, key, e, p_tok, g_tok))
        be = model.breakeven(coef, key, e, p_tok, g_tok)
        fit.draft_lengths.append(
            DraftLengthSummary(
                k=key,
                acceptance_length=e,
                prompt_tokens=p_tok,
                generation_tokens=g_tok,
                zero_load_speedup=s0,
                breakeven_arrival_rate=float(be.rate),
                breakeven_kind=model.BreakEvenKind(int(be.kind)).name.lower(),
            )
        )

    def predicted_speedup(sd: Point, nosd: Point) -> float:
        return float(
            model.speedup(
                coef, 0.0, sd.draft_length, _need_e(sd), sd.prompt_tokens or 0.0, _need_g(sd)
            )
        )

    fit.measured_speedups = _measured_speedups(fit.points, predicted_speedup)


def _measured_speedups(
    points: Sequence[Point], predict: Callable[[Point, Point], float]
) -> list[MeasuredSpeedup]:
    """L_D / L_SD at the lowest concurrency run both with and without SD on one workload."""
    labels = workload_labels(points)
    table: dict[tuple[str, float, float], Point] = {}
    for pt, label in zip(points, labels, strict=True):
        if pt.concurrency is None:
            continue
        table.setdefault((label, k_key(pt), pt.concurrency), pt)
    out: list[MeasuredSpeedup] = []
    for workload in sorted(set(labels)):
        base = {c: p for (w, k, c), p in table.items() if w == workload and k == 0}
        sd_keys = sorted({k for (w, k, _c) in table if w == workload and k > 0})
        for key in sd_keys:
            sd = {c: p for (w, k, c), p in table.items() if w == workload and k == key}
            common = sorted(set(base) & set(sd))
            if not common:
                continue
            c = common[0]
            out.append(
                MeasuredSpeedup(
                    k=key,
                    workload=workload,
                    concurrency=c,
                    measured=base[c].latency_s / sd[c].latency_s,
                    predicted=predict(sd[c], base[c]),
                )
            )
    return out


def _profile(points: Sequence[Point]) -> tuple[float, ...] | None:
    """Mean per-position acceptance of the runs at the largest draft length that report it."""
    with_profile = [p for p in points if p.per_position]
    if not with_profile:
        return None
    longest = max(len(p.per_position or ()) for p in with_profile)
    rows = np.array([p.per_position for p in with_profile if len(p.per_position or ()) == longest])
    profile = np.minimum.accumulate(np.clip(rows.mean(axis=0), 0.0, 1.0))
    return tuple(round(float(v), 4) for v in profile)


# --------------------------------------------------------------------------------------------
# per-configuration fallback


def _config_groups(points: Sequence[Point]) -> dict[tuple[float, str], list[Point]]:
    labels = workload_labels(points)
    groups: dict[tuple[float, str], list[Point]] = defaultdict(list)
    for pt, label in zip(points, labels, strict=True):
        groups[(k_key(pt), label)].append(pt)
    return groups


def _fit_config(points: Sequence[Point]) -> tuple[float, float]:
    """L = C1 + B·C2 by NNLS on one configuration's load sweep."""
    b = np.array([p.in_flight for p in points])
    y = np.array([p.latency_s for p in points])
    (c1, c2), _ = nnls(np.column_stack([np.ones_like(b), b]), y)
    return float(c1), float(c2)


def _configurations(points: Sequence[Point], options: FitOptions) -> list[ConfigurationFit]:
    out = []
    for (key, workload), pts in sorted(_config_groups(points).items()):
        if len({round(p.in_flight, 6) for p in pts}) < 2:
            continue
        c1, c2 = _fit_config(pts)
        out.append(_config_fit(key, workload, c1, c2, pts))
    return out


def _config_fit(
    key: float, workload: str, c1: float, c2: float, pts: Sequence[Point]
) -> ConfigurationFit:
    es = [p.acceptance_length for p in pts if p.acceptance_length is not None]
    ps = [p.prompt_tokens for p in pts if p.prompt_tokens is not None]
    gs = [p.generation_tokens for p in pts if p.generation_tokens is not None]
    return ConfigurationFit(
        k=key,
        workload=workload,
        c1=c1,
        c2=c2,
        n_points=len(pts),
        acceptance_length=float(np.mean(es)) if es else float("nan"),
        prompt_tokens=float(np.mean(ps)) if ps else None,
        generation_tokens=float(np.mean(gs)) if gs else None,
    )


def _fit_per_configuration(
    system: str,
    candidates: list[Point],
    excluded: list[Excluded],
    options: FitOptions,
    reason: str | None,
) -> SystemFit:
    """(C1, C2) per configuration; speedup and break-even from paired configurations."""
    excluded = list(excluded)
    used: list[Point] = []
    predicted: list[float] = []
    utilization: list[float] = []
    configs: list[ConfigurationFit] = []
    for (key, workload), pts in sorted(_config_groups(candidates).items()):
        if len({round(p.in_flight, 6) for p in pts}) < 2:
            excluded.extend(
                Excluded(
                    p,
                    f"k={_fmt_k(key)} on {workload} has a single load level; a"
                    " per-configuration fit needs two",
                )
                for p in pts
            )
            continue

        def fit_pair(current: list[Point]) -> tuple[float, float]:
            return _fit_config(current)

        def util_of(costs: object, current: list[Point]) -> np.ndarray:
            assert isinstance(costs, tuple)
            return np.array([p.arrival_rate for p in current]) * costs[1]

        try:
            kept, costs = _utilization_loop(
                pts, excluded, options.max_utilization, fit_pair, util_of
            )
        except FitError:
            continue
        assert isinstance(costs, tuple)
        c1, c2 = costs
        lam = np.array([p.arrival_rate for p in kept])
        predicted.extend(model.latency_from_costs(c1, c2, lam).tolist())
        utilization.extend((lam * c2).tolist())
        used.extend(kept)
        configs.append(_config_fit(key, workload, c1, c2, kept))
    if not used:
        raise FitError(
            f"system {system!r}: nothing to fit; every configuration has a single load level"
            " or was excluded"
        )
    measured = np.array([p.latency_s for p in used])
    pred = np.array(predicted)
    fit = SystemFit(
        system=system,
        mode="per-configuration",
        points=used,
        excluded=excluded,
        predicted=pred,
        utilization=np.array(utilization),
        r2=r_squared(measured, pred),
        mape=mean_absolute_percentage_error(measured, pred),
        fallback_reason=reason,
        configurations=configs,
        leave_one_k_out_note="needs the six-coefficient model (not identifiable from these data)",
    )
    fit.acceptance_profile = _profile(used)
    _summaries_per_configuration(fit)
    return fit


def _summaries_per_configuration(fit: SystemFit) -> None:
    base = {c.workload: c for c in fit.configurations if c.k == 0}
    per_k: dict[float, list[tuple[ConfigurationFit, ConfigurationFit]]] = defaultdict(list)
    for c in fit.configurations:
        if c.k > 0 and c.workload in base:
            per_k[c.k].append((base[c.workload], c))
    if not base:
        fit.notes.append("no runs without SD: speedup and break-even need a k = 0 baseline")
    for key in sorted(per_k):
        pairs = per_k[key]
        s0 = [d.c1 / s.c1 for d, s in pairs if s.c1 > 0]
        be = [model.breakeven_from_costs(d.c1, d.c2, s.c1, s.c2) for d, s in pairs]
        rates = [float(b.rate) for b in be]
        kinds = {model.BreakEvenKind(int(b.kind)).name.lower() for b in be}
        finite = [r for r in rates if math.isfinite(r)]
        fit.draft_lengths.append(
            DraftLengthSummary(
                k=key,
                acceptance_length=float(np.mean([s.acceptance_length for _, s in pairs])),
                prompt_tokens=_mean_or_none([s.prompt_tokens for _, s in pairs]),
                generation_tokens=_mean_or_none([s.generation_tokens for _, s in pairs]),
                zero_load_speedup=float(np.mean(s0)) if s0 else float("nan"),
                breakeven_arrival_rate=float(np.mean(finite)) if finite else rates[0],
                breakeven_kind=kinds.pop() if len(kinds) == 1 else "mixed",
            )
        )
    by_cfg = {(c.k, c.workload): c for c in fit.configurations}
    labels = dict(zip([id(p) for p in fit.points], workload_labels(fit.points), strict=True))

    def predicted_speedup(sd: Point, nosd: Point) -> float:
        w = labels[id(sd)]
        d, s = by_cfg.get((0.0, w)), by_cfg.get((k_key(sd), w))
        return d.c1 / s.c1 if d and s and s.c1 > 0 else float("nan")

    fit.measured_speedups = _measured_speedups(fit.points, predicted_speedup)


def _mean_or_none(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None
