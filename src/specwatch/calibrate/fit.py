"""Fitting the linear latency model to measurement points (model.md, "Fitting";
`--model linear`).

`fit_system` decides which points are excluded and why (past the utilisation ceiling, queueing
at the server, above a concurrency cap), fits the six coefficients by least squares
(`calibrate.leastsq`), checks that the data can separate all six (variance inflation), and
measures how well the fit predicts a draft length it has not seen (leave-one-k-out). When the
six cannot be separated, each configuration gets its own (C1, C2) so speedup and break-even are
still measured-backed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from specwatch import model
from specwatch.calibrate import evidence
from specwatch.calibrate.inputs import Point
from specwatch.calibrate.leastsq import (
    COEFFICIENTS,
    design_matrix,
    fit_coefficients,
    fmt_k,
    k_key,
    mean_absolute_percentage_error,
    model_inputs,
    predict_points,
    r_squared,
    variance_inflation,
    workload_labels,
)
from specwatch.calibrate.results import ConfigurationFit, Excluded, SystemFit
from specwatch.calibrate.summaries import (
    acceptance_profile,
    summarize_per_configuration,
    summarize_six,
)

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


@dataclass(frozen=True)
class FitOptions:
    """What to exclude and how strict identifiability is (CLI flags map to these)."""

    max_utilization: float = model.DEFAULT_MAX_UTILIZATION
    max_concurrency: float | None = None
    max_ttft_ratio: float | None = DEFAULT_MAX_TTFT_RATIO
    vif_limit: float = DEFAULT_VIF_LIMIT


class FitError(Exception):
    """The data cannot be fitted at all (too few points); carries a user-facing message."""


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
                    f" lowest load of k={fmt_k(k)} on {workload} (limit"
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
        lam, k, e, p, g = model_inputs(pts)
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
    fit.calibrated_range = evidence.calibrated_range(coef_obj, used)
    summarize_six(fit)
    if not any(p.draft_length == 0 for p in used):
        fit.notes.append(
            "no runs without SD: the no-SD latency behind speedup and break-even is the"
            " verify cost extrapolated to one token per step; add a baseline run to check it"
        )
    fit.acceptance_profile = acceptance_profile(used)
    fit.configurations = _configurations(used, options)
    lam, k, e, p, g = model_inputs(used)
    batch = model.batch_latency(coef_obj, lam * measured, k, e, p, g)
    fit.uncertainty = evidence.residual_spread(coef_obj, used, batch,
                                                 fit.calibrated_range)
    fit.user_path = evidence.user_path(
        evidence.params_of(fit, options.max_utilization), used, batch)
    if (note := evidence.transient_note(used)) is not None:
        fit.notes.append(note)
    return fit


def _identifiability_reason(points: Sequence[Point], names: Sequence[str]) -> str:
    ks = sorted({k_key(p) for p in points})
    workloads = sorted(set(workload_labels(points)))
    loads = len({round(p.in_flight, 3) for p in points})
    hints = []
    if len(ks) < 3:
        hints.append(f"only draft lengths {', '.join(fmt_k(k) for k in ks)}")
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
            fit.leave_one_k_out_note = f"too few points left without k={fmt_k(key)}"
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
                    f"k={fmt_k(key)} on {workload} has a single load level; a"
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
    fit.acceptance_profile = acceptance_profile(used)
    summarize_per_configuration(fit)
    return fit
