"""Calibrating one system over its whole load range with the saturation regime.

`fit_system_saturation` is the default of `specwatch calibrate` (`--model saturation`): it
fits the eight coefficients, two knees and (where the data show them) the KV-cache
capacities of `calibrate.saturation` on every usable point, then measures what the
acceptance targets are stated in (model.md, "Measured figures"): per-concurrency error,
leave-one-k-out and leave-one-concurrency-out error, measured vs predicted break-even per
draft length and workload, measured vs predicted best k at each concurrency, and the
calibrated range the parameters file records for validity.

Kept apart from `fit.py` (the linear six-coefficient path, `--model linear`) because
it judges the fit with L(B) at the measured batch, not with the open-loop fixed point: past
the throughput peak a closed-loop run has no open-loop counterpart.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from specwatch import model
from specwatch.calibrate import evidence
from specwatch.calibrate import fit as linear
from specwatch.calibrate import saturation as sat
from specwatch.calibrate.inputs import Point
from specwatch.calibrate.leastsq import (
    k_key,
    mean_absolute_percentage_error,
    r_squared,
    variance_inflation,
    workload_labels,
)
from specwatch.calibrate.results import Excluded, SystemFit
from specwatch.calibrate.summaries import acceptance_profile, summarize_six
from specwatch.model import ceilings

__all__ = ["fit_system_saturation", "plot_load_range"]


#: The calibration's one MAPE (NaN predictions, i.e. points called saturated, count as 100%).
_mape = mean_absolute_percentage_error


def _usable(points: Sequence[Point], options: linear.FitOptions
            ) -> tuple[list[Point], list[Excluded]]:
    used: list[Point] = []
    excluded: list[Excluded] = []
    for p in points:
        why = None
        if p.generation_tokens is None:
            why = "no generation tokens: the model prices tokens per request"
        elif p.sd and p.acceptance_length is None:
            why = "SD run without acceptance length: verify cycles per request unknown"
        elif not (p.latency_s > 0 and p.arrival_rate > 0):
            why = "latency or throughput not positive: no batch in flight to fit"
        elif (options.max_concurrency is not None and p.concurrency is not None
              and p.concurrency > options.max_concurrency):
            why = (f"concurrency {p.concurrency:g} > --max-concurrency "
                   f"{options.max_concurrency:g}")
        if why is None:
            used.append(p)
        else:
            excluded.append(Excluded(p, why))
    return used, excluded


def _measured(points: Sequence[Point]) -> np.ndarray:
    return np.array([p.latency_s for p in points], dtype=float)


def fit_system_saturation(
    system: str, points: Sequence[Point], options: linear.FitOptions | None = None
) -> SystemFit:
    """Fit the saturation form on every usable point; the linear path when it cannot."""
    options = options or linear.FitOptions()
    used, excluded = _usable(points, options)
    if len(used) < len(sat.SATURATION_COEFFICIENTS):
        return linear.fit_system(system, points, options)
    found = sat.fit_saturation(used)
    coef = found.coefficients
    predicted = sat.predicted_latency(coef, used)
    lam, k, e, p, g = (np.array(x, dtype=float) for x in zip(
        *[(q.arrival_rate, q.draft_length, q.acceptance_length if q.sd else 1.0,
           q.prompt_tokens or 0.0, q.generation_tokens) for q in used], strict=True))
    util = lam / model.throughput_ceiling(coef, k, e, p, g)
    measured = _measured(used)
    x = sat.design_matrix(used, coef.knee_v if coef.c_v else math.inf,
                          coef.knee_d if coef.c_d else math.inf, coef.capacity(p, g, k))
    live = [i for i in range(x.shape[1]) if np.any(x[:, i] != 0)]
    vif = np.full(x.shape[1], np.inf)
    vif[live] = variance_inflation(x[:, live])
    vif_map = {n: float(v) for n, v in zip(sat.SATURATION_COEFFICIENTS, vif, strict=True)}
    not_identifiable = [n for n, v in vif_map.items() if not v <= options.vif_limit]
    base = [n for n in not_identifiable if n not in ("c_v", "c_d")]
    if base:
        # The linear part itself is not separable: the linear path says why and falls back
        # to per-configuration (C1, C2) instead of writing coefficients the data cannot carry.
        return linear.fit_system(system, points, options)
    fit = SystemFit(
        system=system,
        mode="saturation",
        points=used,
        excluded=excluded,
        predicted=predicted,
        utilization=util,
        r2=r_squared(measured, predicted),
        mape=_mape(measured, predicted),
        coefficients=coef,
        vif=vif_map,
        not_identifiable=not_identifiable,
    )
    _leave_one_k_out(fit)
    fit.calibrated_range = evidence.calibrated_range(coef, used)
    summarize_six(fit)  # zero-load speedup, break-even per k, measured speedups
    fit.acceptance_profile = acceptance_profile(used)
    fit.uncertainty = evidence.residual_spread(coef, used, predicted,
                                                 fit.calibrated_range)
    fit.user_path = evidence.user_path(evidence.params_of(fit, options.max_utilization),
                                       used, predicted)
    if (note := evidence.transient_note(used)) is not None:
        fit.notes.append(note)
    fit.saturation = _report(fit, found)
    return fit


def _leave_one_k_out(fit: SystemFit) -> None:
    keys = sorted({k_key(p) for p in fit.points})
    errors: list[float] = []
    for key in keys:
        train = [p for p in fit.points if k_key(p) != key]
        test = [p for p in fit.points if k_key(p) == key]
        if len(train) < len(sat.SATURATION_COEFFICIENTS) or not any(p.sd for p in train):
            continue
        coef = sat.fit_saturation(train).coefficients
        err = np.abs(sat.predicted_latency(coef, test) / _measured(test) - 1.0)
        fit.leave_one_k_out_by_k[key] = float(np.mean(err))
        errors.extend(err.tolist())
    if errors:
        fit.leave_one_k_out_mape = float(np.mean(errors))
    else:
        fit.leave_one_k_out_note = "needs at least two draft lengths"


def _per_concurrency(fit: SystemFit) -> list[dict[str, Any]]:
    rel = fit.predicted / _measured(fit.points) - 1.0
    by_c: dict[float, list[float]] = defaultdict(list)
    for p, r in zip(fit.points, rel, strict=True):
        if p.concurrency is not None:
            by_c[p.concurrency].append(float(r))
    return [
        {"concurrency": c, "n": len(v), "mape": float(np.mean(np.abs(v))),
         "max_abs_error": float(np.max(np.abs(v))), "mean_signed_error": float(np.mean(v))}
        for c, v in sorted(by_c.items())
    ]


def _leave_one_concurrency_out(fit: SystemFit) -> list[dict[str, Any]]:
    out = []
    for c in sorted({p.concurrency for p in fit.points if p.concurrency is not None}):
        train = [p for p in fit.points if p.concurrency != c]
        test = [p for p in fit.points if p.concurrency == c]
        if len(train) < len(sat.SATURATION_COEFFICIENTS):
            continue
        coef = sat.fit_saturation(train).coefficients
        out.append({"concurrency": c, "n": len(test),
                    "mape": _mape(_measured(test), sat.predicted_latency(coef, test))})
    return out


def _breakevens(fit: SystemFit) -> list[dict[str, Any]]:
    """Measured against predicted rate where SD stops paying, per workload and k. Measured:
    the crossing of the two latency curves, or SD's ceiling where SD was still faster when its
    curve stopped rising (`measured_kind`). Predicted: the break-even (speedup = 1) where the
    model has one below SD's throughput ceiling, else that ceiling (`predicted_figure` says
    which: near its ceiling a measured SD latency shoots up and crosses no-SD's, while the
    model's stays finite up to it). `predicted` is what the parameters file gives
    (`model.ceilings`: the fit's figures with the measured SD ceilings it records),
    `predicted_fit` the fit's alone; `predicted_breakeven`, `predicted_kind` and
    `predicted_ceiling` are the file's two figures."""
    coef = fit.coefficients
    assert coef is not None
    groups = sat.group_by_workload(fit.points, workload_labels(fit.points))
    cells = [(w, k, by_k[k], by_k.get(0.0, [])) for w, by_k in sorted(groups.items())
             for k in sorted(x for x in by_k if x > 0)]
    if not cells:
        return []
    # One vectorised call: the numeric break-even costs the same for one k or for all.
    args = (
        np.array([k for _, k, _, _ in cells]),
        np.array([np.mean([q.acceptance_length for q in sd]) for _, _, sd, _ in cells]),
        np.array([np.mean([q.prompt_tokens or 0.0 for q in sd]) for _, _, sd, _ in cells]),
        np.array([np.mean([q.generation_tokens for q in sd]) for _, _, sd, _ in cells]),
    )
    # Neither figure depends on the validity ceiling: any value gives the file's.
    params = evidence.params_of(fit, model.DEFAULT_MAX_UTILIZATION)
    be = ceilings.breakeven(params, *args)
    alone = model.breakeven(coef, *args)
    ceiling, _ = ceilings.sd_throughput_ceiling(params, *args)
    ceiling_fit, _ = ceilings.sd_throughput_ceiling(replace(params, calibrated_range=None),
                                                    *args)
    crossing = (model.BreakEvenKind.PAYS_BELOW, model.BreakEvenKind.PAYS_ABOVE)

    def rate(b: model.BreakEven, i: int) -> float | None:
        r = float(b.rate[i])
        return r if int(b.kind[i]) in crossing and math.isfinite(r) else None

    def finite(x: float) -> float | None:
        return x if math.isfinite(x) else None

    out = []
    for i, (workload, k, sd, nosd) in enumerate(cells):
        measured = sat.measured_breakeven(sd, nosd) if nosd else None
        pred_be, fit_be = rate(be, i), rate(alone, i)
        pred = pred_be if pred_be is not None else finite(float(ceiling[i]))
        pred_fit = fit_be if fit_be is not None else finite(float(ceiling_fit[i]))
        out.append({
            "workload": workload, "k": k,
            "predicted": pred,
            "predicted_figure": "breakeven" if pred_be is not None else "sd_ceiling",
            "predicted_breakeven": pred_be,
            "predicted_kind": model.BreakEvenKind(int(be.kind[i])).name.lower(),
            "predicted_ceiling": finite(float(ceiling[i])),
            "predicted_fit": pred_fit,
            "measured": measured[0] if measured else None,
            "measured_kind": measured[1] if measured else None,
            "relative_error": (pred / measured[0] - 1.0
                               if measured and pred is not None else None),
            "relative_error_fit": (pred_fit / measured[0] - 1.0
                                   if measured and pred_fit is not None else None),
        })
    return out


def _best_k(fit: SystemFit) -> list[dict[str, Any]]:
    """Measured vs predicted best SD draft length at each concurrency and workload: at equal
    concurrency (closed loop) the lower latency is also the higher throughput."""
    coef = fit.coefficients
    assert coef is not None
    labels = workload_labels(fit.points)
    cells: dict[tuple[str, float], list[Point]] = defaultdict(list)
    for q, w in zip(fit.points, labels, strict=True):
        if q.sd and q.concurrency is not None:
            cells[(w, q.concurrency)].append(q)
    out = []
    for (w, c), pts in sorted(cells.items()):
        if len({q.draft_length for q in pts}) < 2:
            continue
        pred = sat.predicted_latency(coef, pts)
        mk = min(pts, key=lambda q: q.latency_s).draft_length
        pk = pts[int(np.argmin(pred))].draft_length
        out.append({"workload": w, "concurrency": c, "measured": mk, "predicted": pk})
    return out


def _report(fit: SystemFit, found: sat.SaturationFit) -> dict[str, Any]:
    coef = fit.coefficients
    assert coef is not None
    hi = [i for i, p in enumerate(fit.points) if (p.concurrency or 0) >= 80]
    hi_mape = (_mape(_measured([fit.points[i] for i in hi]), fit.predicted[hi])
               if hi else None)
    return {
        "knee_v_tokens_per_step": coef.knee_v if coef.c_v else None,
        "knee_v_range": list(found.knee_range_v),
        "c_v_s_per_token": coef.c_v,
        "knee_d_tokens_per_step": coef.knee_d if coef.c_d else None,
        "knee_d_range": list(found.knee_range_d),
        "c_d_s_per_token": coef.c_d,
        # Whether the data show a KV-cache capacity (with the drafter / without SD), its
        # value in tokens, the range as good, and why it is or is not set.
        "capacity_sd": found.capacity_sd.to_report() if found.capacity_sd else None,
        "capacity_nosd": found.capacity_nosd.to_report() if found.capacity_nosd else None,
        "relative_rms": found.rms,
        "mape_concurrency_ge_80": hi_mape,
        "per_concurrency": _per_concurrency(fit),
        "leave_one_concurrency_out": _leave_one_concurrency_out(fit),
        "breakeven": _breakevens(fit),
        "best_k": _best_k(fit),
    }


def plot_load_range(fit: SystemFit, path: Any) -> None:
    """Measured (dots) vs predicted (lines) latency against arrival rate, every k and no SD,
    whole range: the predicted curve is λ(B) = B/L(B) against L(B), both branches of it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    coef = fit.coefficients
    assert coef is not None
    groups = sat.group_by_workload(fit.points, workload_labels(fit.points))
    fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 5), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax, (workload, by_k) in zip(axes[0], sorted(groups.items()), strict=True):
        ks = sorted(by_k)
        for i, k in enumerate(ks):
            pts = by_k[k]
            color = "black" if k == 0 else cmap(i / max(len(ks), 1))
            e = float(np.mean([q.acceptance_length if q.sd else 1.0 for q in pts]))
            p = float(np.mean([q.prompt_tokens or 0.0 for q in pts]))
            g = float(np.mean([q.generation_tokens for q in pts]))
            b = np.linspace(0.5, 1.05 * max(q.in_flight for q in pts), 300)
            lat = model.batch_latency(coef, b, k, e, p, g)
            label = "no SD" if k == 0 else f"k={k:g}"
            ax.plot(b / lat, lat, color=color, lw=1.2, label=f"{label} predicted")
            ax.scatter([q.arrival_rate for q in pts], [q.latency_s for q in pts], color=color,
                       s=14)
        ax.set_xlabel("arrival rate λ = B/L (req/s)")
        ax.set_ylabel("mean latency (s)")
        ax.set_title(f"{fit.system}: {workload}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
