"""The Markdown summary (`summary.md`) of `specwatch calibrate --report DIR`.

One section per system: fit quality, coefficients, per-draft-length and measured-speedup tables,
the user-path runs that were declined or off by more than 5%, excluded points by reason, and for
the saturation form the whole-range section (knees, capacities, per-concurrency errors,
break-even). Returns lines; writes nothing.
"""

from __future__ import annotations

import math
from collections import defaultdict

from specwatch.calibrate.reportfmt import (
    PARAMS_ORDER,
    figure_cells,
    k_label,
    or_na,
    reason_kind,
    short_source,
    user_path_line,
)
from specwatch.calibrate.results import SystemFit

__all__ = ["markdown_saturation", "markdown_system", "markdown_user_path"]


def markdown_system(fit: SystemFit, fit_png: str, res_png: str) -> list[str]:
    lines = [f"## {fit.system}", "", *markdown_user_path(fit)]
    loko = (
        f"{fit.leave_one_k_out_mape:.2%}"
        if fit.leave_one_k_out_mape is not None
        else f"n/a ({fit.leave_one_k_out_note})"
    )
    lines += [
        f"- mode: {fit.mode}",
        f"- points: {fit.n_points} used, {fit.n_excluded} excluded",
        f"- R² {fit.r2:.4f}, MAPE {fit.mape:.2%}, leave-one-k-out MAPE {loko}",
    ]
    if fit.fallback_reason:
        lines.append(f"- fallback: {fit.fallback_reason}")
    if fit.coefficients is not None:
        c = fit.coefficients
        lines.append(
            "- coefficients (ms): "
            + ", ".join(f"{n} = {getattr(c, n) * 1e3:.4g}" for n in PARAMS_ORDER)
        )
    lines.append("")
    if fit.draft_lengths:
        lines += [
            "| k | E | zero-load speedup | break-even λ* (req/s) | kind | SD ceiling (req/s) |"
            " outside the calibrated range (reasons) |",
            "|---:|---:|---:|---:|---|---:|---|",
        ]
        for d in fit.draft_lengths:
            be, ceiling, notes = figure_cells(d)
            lines.append(
                f"| {k_label(d.k)} | {d.acceptance_length:.2f} | {d.zero_load_speedup:.3f} |"
                f" {be} | {d.breakeven_kind} | {ceiling} | {notes} |"
            )
        lines.append("")
    if fit.measured_speedups:
        lines += [
            "Speedup at the lowest concurrency both systems ran:",
            "",
            "| k | workload | concurrency | measured | predicted (λ = 0) |",
            "|---:|---|---:|---:|---:|",
        ]
        for m in fit.measured_speedups:
            lines.append(
                f"| {k_label(m.k)} | {m.workload} | {m.concurrency:g} | {m.measured:.3f} |"
                f" {m.predicted:.3f} |"
            )
        lines.append("")
    lines += [f"![fit]({fit_png})", "", f"![residuals]({res_png})", ""]
    if fit.excluded:
        lines += [f"Excluded points ({fit.n_excluded}):", ""]
        reasons: dict[str, int] = defaultdict(int)
        for e in fit.excluded:
            reasons[reason_kind(e.reason)] += 1
        lines += [f"- {n} × {why}" for why, n in sorted(reasons.items())]
        lines.append("")
    return lines


def markdown_user_path(fit: SystemFit) -> list[str]:
    """Per-run table of the user-path check (only the runs that are declined or off by more
    than 5%: the others are summarised in the line above it)."""
    up = fit.user_path
    if up is None:
        return []
    lines = ["### On the user's path (`specwatch predict` from each run's arrival rate)", "",
             user_path_line(up["summary"]), "",
             "| run | c | k | measured (s) | predicted (s) | error | batch-path error |"
             " 90% interval | valid | reasons |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in up["runs"]:
        err = r["error"]
        if r["valid"] and err is not None and abs(err) <= 0.05:
            continue
        iv = r["interval"]
        ivs = ("—" if iv is None else
               f"[{iv[0]:.2f}, {'∞' if iv[1] is None else format(iv[1], '.2f')}]")
        c = "—" if r["concurrency"] is None else f"{r['concurrency']:g}"
        pred = "—" if r["predicted_s"] is None else f"{r['predicted_s']:.2f}"
        e = "—" if err is None else f"{err:+.1%}"
        be = "—" if r["batch_path_error"] is None else f"{r['batch_path_error']:+.1%}"
        run = short_source(r["source"]) + (" (transient)" if r.get("transient") else "")
        lines.append(f"| {run} | {c} | {r['k']:g} |"
                     f" {r['measured_s']:.2f} | {pred} | {e} | {be} | {ivs} |"
                     f" {'yes' if r['valid'] else 'no'} | {', '.join(r['reasons']) or '-'} |")
    return [*lines, ""]


def markdown_saturation(fit: SystemFit, png: str) -> list[str]:
    """Whole-range section: knees with units, per-concurrency errors, break-even, best k."""
    rep = fit.saturation or {}
    c = fit.coefficients
    assert c is not None
    lines = ["### Whole load range (saturation regime)", ""]
    kv, kd = rep.get("knee_v_tokens_per_step"), rep.get("knee_d_tokens_per_step")
    lines.append(
        f"- verifier knee: {kv:g} tokens per verify step (as good: {rep['knee_v_range']}), "
        f"past it {c.c_v * 1e6:.4g} µs per token" if kv is not None
        else "- verifier knee: not seen in the data (no compute-bound verify term)"
    )
    lines.append(
        f"- drafter knee: {kd:g} tokens per draft step (as good: {rep['knee_d_range']}), "
        f"past it {c.c_d * 1e6:.4g} µs per draft token" if kd is not None
        else "- drafter knee: not seen in the data (no compute-bound draft term)"
    )
    for label, key in (("KV-cache capacity with the drafter", "capacity_sd"),
                       ("KV-cache capacity without SD", "capacity_nosd")):
        cap = rep.get(key)
        if cap is None:
            continue
        floor = (f"; the runs' TTFT allow no less than {cap['floor_tokens_from_ttft']:.0f}"
                 " tokens (requests running λ·(L − TTFT))"
                 if cap.get("floor_tokens_from_ttft") else "")
        if cap["kv_cache_tokens"] is not None:
            lines.append(
                f"- {label}: {cap['kv_cache_tokens']:.0f} tokens (≈"
                f" {cap['requests_at_mean_length']:.0f} requests of the mean length; as good:"
                f" {_token_range(cap['as_good_range_tokens'])}), {cap['reason']}{floor}")
        else:
            lines.append(f"- {label}: not set, {cap['reason']}{floor}")
    hi = rep.get("mape_concurrency_ge_80")
    if hi is not None:
        lines.append(f"- MAPE at concurrency >= 80: {hi:.2%}")
    if fit.calibrated_range is not None:
        r = fit.calibrated_range
        lines.append(f"- calibrated range: λ <= {r.max_arrival_rate:g} req/s, B <= "
                     f"{r.max_in_flight:g} in flight, k in {list(r.draft_lengths)}")
        held = ", ".join(f"{what} {v:g}" for what, v in (
            ("SD", r.headroom_in_flight_sd), ("no SD", r.headroom_in_flight_nosd),
            ("tokens per verify step", r.headroom_tokens_per_step)) if v is not None)
        if held:
            lines.append("- vouched for up to what a run with throughput headroom held (a run "
                         f"of its curve at higher load served >= 10% more): {held}")
    lines += ["", "| concurrency | n | MAPE | max error | leave-this-concurrency-out MAPE |",
              "|---:|---:|---:|---:|---:|"]
    loco = {x["concurrency"]: x["mape"] for x in rep.get("leave_one_concurrency_out", [])}
    for row in rep.get("per_concurrency", []):
        lo = loco.get(row["concurrency"])
        lines.append(f"| {row['concurrency']:g} | {row['n']} | {row['mape']:.2%} |"
                     f" {row['max_abs_error']:.2%} | {'n/a' if lo is None else f'{lo:.2%}'} |")
    lines += ["", "Predicted λ*: what the parameters file gives (the fit's, bounded by the SD"
              " ceilings the runs measured); the fit's alone beside it.", "",
              "| workload | k | measured λ* (req/s) | how | predicted λ* | error |"
              " fit alone | error |",
              "|---|---:|---:|---|---:|---:|---:|---:|"]
    for b in rep.get("breakeven", []):
        m = or_na(b["measured"], ".2f")
        lines.append(f"| {b['workload']} | {b['k']:g} | {m} | {b['measured_kind'] or '-'} |"
                     f" {or_na(b['predicted'], '.2f')} | {or_na(b['relative_error'], '+.1%')} |"
                     f" {or_na(b.get('predicted_fit'), '.2f')} |"
                     f" {or_na(b.get('relative_error_fit'), '+.1%')} |")
    lines += ["", f"![measured vs predicted, whole range]({png})", ""]
    return lines


def _token_range(r: list[float] | None) -> str:
    if not r:
        return "n/a"
    return "–".join("no limit" if not math.isfinite(x) else f"{x:.0f}" for x in r)
