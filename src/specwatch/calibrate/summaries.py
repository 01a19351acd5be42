"""What a fit says about speculative decoding, per draft length and against measurement.

Zero-load speedup and break-even per draft length (from the six coefficients, or from paired
per-configuration (C1, C2)), the speedup measured at the lowest concurrency both sides ran
against the predicted one, and the mean per-position acceptance profile. Each `summarize_*`
fills a `SystemFit`'s draft_lengths and measured_speedups.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from specwatch import model
from specwatch.calibrate import evidence
from specwatch.calibrate.inputs import Point
from specwatch.calibrate.leastsq import k_key, need_e, need_g, workload_labels
from specwatch.calibrate.results import (
    ConfigurationFit,
    DraftLengthSummary,
    MeasuredSpeedup,
    SystemFit,
)
from specwatch.model import ceilings, validity

__all__ = [
    "acceptance_profile",
    "measured_speedups",
    "summarize_per_configuration",
    "summarize_six",
]


def summarize_six(fit: SystemFit) -> None:
    """Zero-load speedup and break-even per draft length, and the measured speedup check."""
    coef = fit.coefficients
    assert coef is not None
    # The break-even the parameters file gives (bounded by its measured ceilings; the
    # validity ceiling does not enter it).
    params = evidence.params_of(fit, model.DEFAULT_MAX_UTILIZATION)
    by_k: dict[float, list[Point]] = defaultdict(list)
    for p in fit.points:
        by_k[k_key(p)].append(p)
    for key in sorted(k for k in by_k if k > 0):
        pts = by_k[key]
        e = float(np.mean([need_e(p) for p in pts]))
        p_tok = float(np.mean([p.prompt_tokens or 0.0 for p in pts]))
        g_tok = float(np.mean([need_g(p) for p in pts]))
        s0 = float(model.speedup(coef, 0.0, key, e, p_tok, g_tok))
        be = ceilings.breakeven(params, key, e, p_tok, g_tok)
        rate = float(be.rate)
        cap, measured = ceilings.sd_throughput_ceiling(params, key, e, p_tok, g_tok)
        cap_rate = float(cap)
        source = "measured" if bool(measured) else "model"
        fit.draft_lengths.append(
            DraftLengthSummary(
                k=key,
                acceptance_length=e,
                prompt_tokens=p_tok,
                generation_tokens=g_tok,
                zero_load_speedup=s0,
                breakeven_arrival_rate=rate,
                breakeven_kind=model.BreakEvenKind(int(be.kind)).name.lower(),
                sd_ceiling_arrival_rate=cap_rate,
                sd_ceiling_source=source if math.isfinite(cap_rate) else None,
                breakeven_reasons=tuple(validity.figure_reasons(params, rate, key, e, p_tok,
                                                                g_tok)),
                sd_ceiling_reasons=(tuple(validity.figure_reasons(
                    params, cap_rate, key, e, p_tok, g_tok, at_ceiling=True))
                    if source == "model" else ()),
            )
        )

    def predicted_speedup(sd: Point, nosd: Point) -> float:
        return float(
            model.speedup(
                coef, 0.0, sd.draft_length, need_e(sd), sd.prompt_tokens or 0.0, need_g(sd)
            )
        )

    fit.measured_speedups = measured_speedups(fit.points, predicted_speedup)


def summarize_per_configuration(fit: SystemFit) -> None:
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
                sd_ceiling_arrival_rate=(float(np.mean([1.0 / s.c2 for _, s in pairs]))
                                         if all(s.c2 > 0 for _, s in pairs) else math.nan),
                sd_ceiling_source="model" if all(s.c2 > 0 for _, s in pairs) else None,
            )
        )
    by_cfg = {(c.k, c.workload): c for c in fit.configurations}
    labels = dict(zip([id(p) for p in fit.points], workload_labels(fit.points), strict=True))

    def predicted_speedup(sd: Point, nosd: Point) -> float:
        w = labels[id(sd)]
        d, s = by_cfg.get((0.0, w)), by_cfg.get((k_key(sd), w))
        return d.c1 / s.c1 if d and s and s.c1 > 0 else float("nan")

    fit.measured_speedups = measured_speedups(fit.points, predicted_speedup)


def measured_speedups(
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


def acceptance_profile(points: Sequence[Point]) -> tuple[float, ...] | None:
    """Mean per-position acceptance of the runs at the largest draft length that report it."""
    with_profile = [p for p in points if p.per_position]
    if not with_profile:
        return None
    longest = max(len(p.per_position or ()) for p in with_profile)
    rows = np.array([p.per_position for p in with_profile if len(p.per_position or ()) == longest])
    profile = np.minimum.accumulate(np.clip(rows.mean(axis=0), 0.0, 1.0))
    return tuple(round(float(v), 4) for v in profile)


def _mean_or_none(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None
