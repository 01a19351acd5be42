"""What `specwatch calibrate` tells people: JSON, terminal tables, Markdown, PNG plots, drift.

Kept apart from the fit so the fit stays pure numbers, and so matplotlib is imported only when
`--report` asks for plots.

Size: the report is one document (tables, fit quality, plots, the parameters file it
writes) whose sections share the same per-system fit records; kept whole so that it reads
in the order the user sees it.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specwatch import __version__, model
from specwatch.calibrate.leastsq import COEFFICIENTS, k_key, workload_labels
from specwatch.calibrate.results import SystemFit
from specwatch.calibrate.saturation import stated_capacity
from specwatch.model.params import Params, params_from_mapping

#: Coefficients in the order the model reference lists them (params file order).
PARAMS_ORDER = ("a_p", "b_p", "a_v", "b_v", "a_d", "b_d")
SATURATION_ORDER = ("c_v", "knee_v", "c_d", "knee_d")
#: Fitted capacities (tokens; model.md "Capacity"); written only when the data show them.
CAPACITY_ORDER = ("kv_cache_tokens", "kv_cache_tokens_sd", "max_num_seqs")

#: Default tolerance of `--compare`: largest relative change of a predicted latency.
DEFAULT_DRIFT_TOLERANCE = 0.10


def _num(value: float | None) -> float | None:
    """JSON has no NaN or infinity: those become null (the `*_kind` fields say which)."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def _k_label(k: float) -> str:
    return f"{k:g}"


def slug(name: str) -> str:
    """A file-name-safe form of a system name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-").lower() or "system"


# --------------------------------------------------------------------------------------------
# JSON


def system_json(fit: SystemFit) -> dict[str, Any]:
    """The per-system JSON report (the issue's fields first, then the detail)."""
    coef = fit.coefficients
    out: dict[str, Any] = {
        "r2": _num(fit.r2),
        "mape": _num(fit.mape),
        "leave_one_k_out_mape": _num(fit.leave_one_k_out_mape),
        "n_points": fit.n_points,
        "n_excluded": fit.n_excluded,
        "coefficients": (
            {n: float(getattr(coef, n)) for n in PARAMS_ORDER} if coef is not None else None
        ),
        "breakeven_arrival_rate": {
            _k_label(d.k): _num(d.breakeven_arrival_rate) for d in fit.draft_lengths
        },
        "breakeven_kind": {_k_label(d.k): d.breakeven_kind for d in fit.draft_lengths},
        "zero_load_speedup": {_k_label(d.k): _num(d.zero_load_speedup) for d in fit.draft_lengths},
        "mode": fit.mode,
        "identifiable": not fit.not_identifiable and fit.mode == "six-coefficient",
        "not_identifiable": list(fit.not_identifiable),
        "fallback_reason": fit.fallback_reason,
        "variance_inflation": {n: _num(v) for n, v in fit.vif.items()},
        "leave_one_k_out_mape_by_k": {
            _k_label(k): _num(v) for k, v in sorted(fit.leave_one_k_out_by_k.items())
        },
        "leave_one_k_out_note": fit.leave_one_k_out_note,
        "draft_lengths": [
            {
                "k": d.k,
                "acceptance_length": _num(d.acceptance_length),
                "prompt_tokens": _num(d.prompt_tokens),
                "generation_tokens": _num(d.generation_tokens),
                "zero_load_speedup": _num(d.zero_load_speedup),
                "breakeven_arrival_rate": _num(d.breakeven_arrival_rate),
                "breakeven_kind": d.breakeven_kind,
            }
            for d in fit.draft_lengths
        ],
        "measured_speedups": [
            {
                "k": m.k,
                "workload": m.workload,
                "concurrency": m.concurrency,
                "measured": _num(m.measured),
                "predicted": _num(m.predicted),
            }
            for m in fit.measured_speedups
        ],
        "configurations": [
            {
                "k": c.k,
                "workload": c.workload,
                "c1_s": c.c1,
                "c2_s": c.c2,
                "n_points": c.n_points,
                "acceptance_length": _num(c.acceptance_length),
            }
            for c in fit.configurations
        ],
        "acceptance_profile": list(fit.acceptance_profile) if fit.acceptance_profile else None,
        "excluded": [{"source": e.point.source, "reason": e.reason} for e in fit.excluded],
        "notes": list(fit.notes),
        "calibrated_range": (
            fit.calibrated_range.to_mapping() if fit.calibrated_range is not None else None
        ),
        "saturation": _json_safe(fit.saturation),
        "uncertainty": (_json_safe(fit.uncertainty.to_mapping())
                        if fit.uncertainty is not None else None),
        # Every run predicted as `specwatch predict` does (λ -> fixed point -> validity).
        "user_path": _json_safe(fit.user_path),
        # What the runs' servers stated about their capacity (facts the fit took), or None.
        "server_capacity": (stated.to_mapping()
                            if (stated := stated_capacity(fit.points)) else None),
    }
    if coef is not None and fit.mode == "saturation":
        out["coefficients"].update(
            {n: float(getattr(coef, n)) for n in SATURATION_ORDER}
        )
        out["coefficients"].update(
            {n: float(getattr(coef, n)) for n in CAPACITY_ORDER if getattr(coef, n)}
        )
    return out


def _json_safe(value: Any) -> Any:
    """NaN/inf to None so the report stays strict JSON."""
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# --------------------------------------------------------------------------------------------
# parameters file


def reference_points(fit: SystemFit) -> list[dict[str, float]]:
    """Operating points the fit was measured at, per draft length (kept in provenance so a
    later `--compare` can price old and new coefficients where they matter)."""
    by_k: dict[float, list] = defaultdict(list)
    for p in fit.points:
        by_k[k_key(p)].append(p)
    out = []
    for k in sorted(by_k):
        pts = by_k[k]
        out.append(
            {
                "k": k,
                "acceptance_length": round(float(np.mean([p.acceptance_length for p in pts])), 4),
                "prompt_tokens": round(float(np.mean([p.prompt_tokens or 0.0 for p in pts])), 2),
                "generation_tokens": round(float(np.mean([p.generation_tokens for p in pts])), 2),
                "max_arrival_rate": round(max(p.arrival_rate for p in pts), 4),
            }
        )
    return out


def build_params(
    fit: SystemFit,
    *,
    system_name: str,
    data: Sequence[str],
    options: Mapping[str, Any],
    now: _dt.datetime | None = None,
) -> Params:
    """The parameters file for a six-coefficient fit, provenance filled from the fit."""
    if fit.coefficients is None:
        raise ValueError("per-configuration fits have no six coefficients to write")
    coef = fit.coefficients
    now = now or _dt.datetime.now(_dt.UTC)
    doc: dict[str, Any] = {
        "system": system_name,
        "coefficients": {n: float(getattr(coef, n)) for n in PARAMS_ORDER},
    }
    if fit.acceptance_profile:
        doc["acceptance_profile"] = list(fit.acceptance_profile)
        doc["k_max"] = len(fit.acceptance_profile)
    doc["max_utilization"] = float(options.get("max_utilization", model.DEFAULT_MAX_UTILIZATION))
    if fit.mode == "saturation":
        doc["saturation"] = {n: float(getattr(coef, n)) for n in SATURATION_ORDER}
        capacity = {n: float(getattr(coef, n)) for n in CAPACITY_ORDER if getattr(coef, n)}
        method = ("non-negative least squares of the saturation form over the whole load"
                  " range, knees by grid search (model.md, Saturation regime)")
        if capacity:
            doc["capacity"] = capacity
        stated = stated_capacity(fit.points)
        if any(stated is None or getattr(stated, n) is None for n in capacity):
            method += ", KV-cache capacity by grid search (model.md, Fitted capacity)"
    else:
        method = "non-negative least squares of the six-coefficient linear form (model.md," \
            " Fitting)"
    stated = stated_capacity(fit.points)
    if stated:  # what the servers said: the capacity terms take it (model.md)
        doc["server_capacity"] = stated.to_mapping()
        method += ", capacity as the servers stated it (model.md, Server capacity)"
    if fit.calibrated_range is not None:
        doc["calibrated_range"] = fit.calibrated_range.to_mapping()
    if fit.uncertainty is not None:
        doc["uncertainty"] = fit.uncertainty.to_mapping()
    doc["provenance"] = {
        "method": f"specwatch calibrate {__version__}: {method}",
        "fitted_at": now.replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        "r2": round(fit.r2, 6),
        "mape": round(fit.mape, 6),
        "leave_one_k_out_mape": (
            round(fit.leave_one_k_out_mape, 6) if fit.leave_one_k_out_mape is not None else None
        ),
        "n_points": fit.n_points,
        "n_excluded": fit.n_excluded,
        "data": list(data),
        "options": {k: v for k, v in options.items() if v is not None},
        "reference_points": reference_points(fit),
    }
    return params_from_mapping(doc, source="<calibrate>")


# --------------------------------------------------------------------------------------------
# drift


@dataclass(frozen=True)
class Drift:
    """How far a new fit moved from an earlier one."""

    coefficients: dict[str, tuple[float, float, float | None]]  # name -> old, new, rel change
    latency_drift: float | None  # largest relative change of predicted latency
    worst_point: str | None
    tolerance: float
    basis: str

    @property
    def drifted(self) -> bool:
        if self.latency_drift is not None:
            return self.latency_drift > self.tolerance
        return any(
            rel is not None and abs(rel) > self.tolerance
            for _, _, rel in self.coefficients.values()
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": "drifted" if self.drifted else "within_tolerance",
            "tolerance": self.tolerance,
            "latency_drift": _num(self.latency_drift),
            "worst_point": self.worst_point,
            "basis": self.basis,
            "coefficients": {
                n: {"old": o, "new": w, "relative_change": _num(r) if r is not None else None}
                for n, (o, w, r) in self.coefficients.items()
            },
        }


def compare_params(old: Params, new: Params, tolerance: float = DEFAULT_DRIFT_TOLERANCE) -> Drift:
    """Coefficient drift, and the verdict from what operators feel: predicted latency.

    Relative changes of single coefficients mislead (a b_p of 1e-6 s doubling is noise), so
    the verdict prices both coefficient sets at the operating points recorded in the new
    file's provenance (else the old file's): no SD and each measured k, at zero load, half and
    full measured arrival rate. Without recorded operating points it falls back to the
    largest relative change of a coefficient.
    """
    coefs: dict[str, tuple[float, float, float | None]] = {}
    for n in PARAMS_ORDER:
        o = float(getattr(old.coefficients, n))
        w = float(getattr(new.coefficients, n))
        rel = (w - o) / o if o > 0 else (None if w == 0 else math.inf)
        coefs[n] = (o, w, rel)
    refs = new.provenance.get("reference_points") or old.provenance.get("reference_points")
    basis = (
        "reference_points of the new fit"
        if new.provenance.get("reference_points")
        else ("reference_points of the old fit" if refs else "coefficients (no reference points)")
    )
    worst: float | None = None
    worst_at: str | None = None
    if refs:
        for ref in refs:
            k = float(ref["k"])
            e = float(ref["acceptance_length"])
            p = float(ref.get("prompt_tokens", 0.0))
            g = float(ref["generation_tokens"])
            lam_max = float(ref.get("max_arrival_rate", 0.0))
            for lam in (0.0, lam_max / 2, lam_max):
                lo = model.latency(old.model(), lam, k, e, p, g, max_utilization=1.0).latency
                ln = model.latency(new.model(), lam, k, e, p, g, max_utilization=1.0).latency
                lo, ln = float(lo), float(ln)
                change = abs(ln - lo) / lo if math.isfinite(lo) and math.isfinite(ln) else math.inf
                if worst is None or change > worst:
                    worst = change
                    worst_at = f"k={k:g}, E={e:g}, g={g:g}, λ={lam:.3g} req/s"
    return Drift(coefs, worst, worst_at, tolerance, basis)


# --------------------------------------------------------------------------------------------
# terminal


def print_report(
    fits: Sequence[SystemFit], written: Mapping[str, str], drift: Drift | None
) -> None:
    """Human tables on stdout (rich)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for fit in fits:
        console.rule(f"[bold]{fit.system}")
        summary = Table(show_header=False, box=None)
        summary.add_row("mode", fit.mode)
        summary.add_row("points", f"{fit.n_points} used, {fit.n_excluded} excluded")
        summary.add_row("R²", f"{fit.r2:.4f}")
        summary.add_row("MAPE", f"{fit.mape:.2%}")
        loko = (
            f"{fit.leave_one_k_out_mape:.2%}"
            if fit.leave_one_k_out_mape is not None
            else f"n/a ({fit.leave_one_k_out_note})"
        )
        summary.add_row("leave-one-k-out MAPE", loko)
        if fit.fallback_reason:
            summary.add_row("fallback", fit.fallback_reason)
        if fit.coefficients is not None:
            c = fit.coefficients
            summary.add_row(
                "coefficients",
                "  ".join(f"{n}={getattr(c, n) * 1e3:.4g} ms" for n in PARAMS_ORDER),
            )
        if fit.system in written:
            summary.add_row("written", written[fit.system])
        if fit.user_path is not None:
            summary.add_row("user path (predict)", user_path_line(fit.user_path["summary"]))
        console.print(summary)
        if fit.draft_lengths:
            t = Table(title="per draft length")
            for col in ("k", "E", "zero-load speedup", "break-even λ* (req/s)", "kind"):
                t.add_column(col, justify="right")
            for d in fit.draft_lengths:
                t.add_row(
                    _k_label(d.k),
                    f"{d.acceptance_length:.2f}",
                    f"{d.zero_load_speedup:.3f}",
                    _rate(d.breakeven_arrival_rate),
                    d.breakeven_kind,
                )
            console.print(t)
        if fit.measured_speedups:
            t = Table(title="speedup at the lowest common concurrency: measured vs predicted")
            for col in ("k", "workload", "concurrency", "measured", "predicted (λ=0)"):
                t.add_column(col, justify="right")
            for m in fit.measured_speedups:
                t.add_row(
                    _k_label(m.k),
                    m.workload,
                    f"{m.concurrency:g}",
                    f"{m.measured:.3f}",
                    f"{m.predicted:.3f}",
                )
            console.print(t)
        if fit.excluded:
            # One row per reason kind, with the rows it hit: 22 near-identical lines
            # ("concurrency 128 > 64") would bury the fit figures. --json has every point.
            t = Table(title=f"excluded points ({fit.n_excluded})")
            t.add_column("reason")
            t.add_column("n", justify="right")
            t.add_column("where (first ones)")
            groups: dict[str, list[str]] = defaultdict(list)
            example: dict[str, str] = {}
            for e in fit.excluded:
                kind = _reason_kind(e.reason)
                groups[kind].append(_short_source(e.point.source))
                example.setdefault(kind, e.reason)
            for kind, sources in groups.items():
                shown = _compact_sources(sources)
                label = example[kind] if len(sources) == 1 else kind
                t.add_row(label, str(len(sources)), shown)
            console.print(t)
        for note in fit.notes:
            console.print(f"note: {note}")
    if drift is not None:
        print_drift(drift, console)


def user_path_line(sm: Mapping[str, Any]) -> str:
    """One line of the user-path figures: valid share, MAPE over the valid runs, confident
    misses, interval coverage and width, declined runs by reason, the batch-path MAPE."""
    def pct(x: float | None, spec: str = ".1%") -> str:
        return "n/a" if x is None else format(x, spec)
    declined = ", ".join(f"{n} {r}" for r, n in sm["declined"].items()) or "none"
    return (f"{sm['valid']}/{sm['runs']} valid ({pct(sm['valid_share'], '.0%')}); MAPE over"
            f" the valid {pct(sm['mape_valid'], '.2%')}, max {pct(sm['max_error_valid'])};"
            f" valid but off by > 15%: {len(sm['valid_off_by_more_than_15pct'])}; 90%"
            f" interval holds the measured latency for {pct(sm['interval_coverage'])}, median"
            f" ±{pct(sm['median_interval_halfwidth'], '.2%')}; declined: {declined};"
            f" batch-path MAPE {pct(sm['batch_path_mape'], '.2%')}")


def _markdown_user_path(fit: SystemFit) -> list[str]:
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
        lines.append(f"| {_short_source(r['source'])} | {c} | {r['k']:g} |"
                     f" {r['measured_s']:.2f} | {pred} | {e} | {be} | {ivs} |"
                     f" {'yes' if r['valid'] else 'no'} | {', '.join(r['reasons']) or '-'} |")
    return [*lines, ""]


def print_drift(drift: Drift, console: Any | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    console.rule("[bold]drift against the earlier fit")
    t = Table()
    for col in ("coefficient", "old (ms)", "new (ms)", "change"):
        t.add_column(col, justify="right")
    for n, (o, w, rel) in drift.coefficients.items():
        t.add_row(n, f"{o * 1e3:.4g}", f"{w * 1e3:.4g}", "n/a" if rel is None else f"{rel:+.1%}")
    console.print(t)
    if drift.latency_drift is not None:
        console.print(
            f"largest change of predicted latency: {drift.latency_drift:.1%} at {drift.worst_point}"
            f" ({drift.basis})"
        )
    verdict = "DRIFTED" if drift.drifted else "within tolerance"
    console.print(f"verdict: [bold]{verdict}[/bold] (tolerance {drift.tolerance:.0%})")


def _rate(rate: float) -> str:
    if math.isnan(rate):
        return "n/a"
    if math.isinf(rate):
        return "∞"
    return f"{rate:.2f}"


# --------------------------------------------------------------------------------------------
# Markdown + PNG


def write_report_dir(
    directory: Path, fits: Sequence[SystemFit], report: Mapping[str, Any], drift: Drift | None
) -> list[Path]:
    """PNG plots per system plus summary.md and report.json; returns the files written."""
    import json

    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    lines = ["# specwatch calibrate report", ""]
    for fit in fits:
        fit_png = directory / f"{slug(fit.system)}-fit.png"
        res_png = directory / f"{slug(fit.system)}-residuals.png"
        plot_fit(fit, fit_png)
        plot_residuals(fit, res_png)
        written += [fit_png, res_png]
        lines += _markdown_system(fit, fit_png.name, res_png.name)
        if fit.mode == "saturation" and fit.coefficients is not None:
            from specwatch.calibrate.load_range import plot_load_range

            range_png = directory / f"{slug(fit.system)}-load-range.png"
            plot_load_range(fit, range_png)
            written.append(range_png)
            lines += _markdown_saturation(fit, range_png.name)
    if drift is not None:
        lines += ["## Drift against the earlier fit", ""]
        verdict = "**drifted**" if drift.drifted else "within tolerance"
        lines.append(f"Verdict: {verdict} (tolerance {drift.tolerance:.0%}, {drift.basis}).")
        if drift.latency_drift is not None:
            lines.append(
                f"Largest change of predicted latency: {drift.latency_drift:.1%} at"
                f" {drift.worst_point}."
            )
        lines += ["", "| coefficient | old (ms) | new (ms) | change |", "|---|---:|---:|---:|"]
        for n, (o, w, rel) in drift.coefficients.items():
            change = "n/a" if rel is None else f"{rel:+.1%}"
            lines.append(f"| {n} | {o * 1e3:.4g} | {w * 1e3:.4g} | {change} |")
        lines.append("")
    md = directory / "summary.md"
    md.write_text("\n".join(lines), encoding="utf-8")
    js = directory / "report.json"
    js.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return [*written, md, js]


def _markdown_saturation(fit: SystemFit, png: str) -> list[str]:
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
    lines += ["", "| workload | k | measured λ* (req/s) | how | predicted λ* | error |",
              "|---|---:|---:|---|---:|---:|"]
    for b in rep.get("breakeven", []):
        m = "n/a" if b["measured"] is None else f"{b['measured']:.2f}"
        p = "n/a" if b["predicted"] is None else f"{b['predicted']:.2f}"
        e = "n/a" if b["relative_error"] is None else f"{b['relative_error']:+.1%}"
        lines.append(f"| {b['workload']} | {b['k']:g} | {m} | {b['measured_kind'] or '-'} |"
                     f" {p} | {e} |")
    lines += ["", f"![measured vs predicted, whole range]({png})", ""]
    return lines


def _token_range(r: list[float] | None) -> str:
    if not r:
        return "n/a"
    return "–".join("no limit" if not math.isfinite(x) else f"{x:.0f}" for x in r)


def _markdown_system(fit: SystemFit, fit_png: str, res_png: str) -> list[str]:
    lines = [f"## {fit.system}", "", *_markdown_user_path(fit)]
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
            "| k | E | zero-load speedup | break-even λ* (req/s) | kind |",
            "|---:|---:|---:|---:|---|",
        ]
        for d in fit.draft_lengths:
            lines.append(
                f"| {_k_label(d.k)} | {d.acceptance_length:.2f} | {d.zero_load_speedup:.3f} |"
                f" {_rate(d.breakeven_arrival_rate)} | {d.breakeven_kind} |"
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
                f"| {_k_label(m.k)} | {m.workload} | {m.concurrency:g} | {m.measured:.3f} |"
                f" {m.predicted:.3f} |"
            )
        lines.append("")
    lines += [f"![fit]({fit_png})", "", f"![residuals]({res_png})", ""]
    if fit.excluded:
        lines += [f"Excluded points ({fit.n_excluded}):", ""]
        reasons: dict[str, int] = defaultdict(int)
        for e in fit.excluded:
            reasons[_reason_kind(e.reason)] += 1
        lines += [f"- {n} × {why}" for why, n in sorted(reasons.items())]
        lines.append("")
    return lines


def _reason_kind(reason: str) -> str:
    """The reason without its numbers: "queueing", "utilisation λ·C2 …", "concurrency > N"."""
    if reason.startswith("queueing:"):
        return "queueing: TTFT above --max-ttft-ratio × its lowest-load value"
    if ":" in reason:
        return reason.split(":")[0]
    if reason.startswith("concurrency ") and " > " in reason:
        return "concurrency" + reason[reason.index(" > ") :]
    if reason.startswith("utilisation"):
        return "utilisation above the ceiling"
    return reason


def _compact_sources(sources: Sequence[str], limit: int = 8) -> str:
    """ "a.csv row 1", "a.csv row 2" -> "a.csv rows 1, 2" (at most `limit` shown)."""
    by_file: dict[str, list[str]] = defaultdict(list)
    for src in sources:
        for unit in (" row ", " line ", " entry "):
            if unit in src:
                head, num = src.rsplit(unit, 1)
                by_file[f"{head}{unit.rstrip()}"].append(num)
                break
        else:
            by_file[src].append("")
    parts = []
    shown = 0
    for head, nums in by_file.items():
        if shown >= limit:
            break
        take = [n for n in nums if n][: limit - shown]
        shown += max(len(take), 1)
        more = " …" if len([n for n in nums if n]) > len(take) else ""
        plural = "s" if len(take) > 1 else ""
        parts.append(f"{head}{plural} {', '.join(take)}{more}" if take else head)
    return "; ".join(parts) + (" …" if len(by_file) > len(parts) else "")


def _short_source(source: str) -> str:
    """ "path/to/file.csv row 12" -> "file.csv row 12" (the full path is in --json)."""
    head, sep, tail = source.partition(" ")
    if "/" in head and not head.startswith("http"):
        head = head.rsplit("/", 1)[-1]
    return f"{head}{sep}{tail}"


def _curve(
    fit: SystemFit, k: float, e: float, p: float, g: float, lam: np.ndarray, workload: str
) -> np.ndarray:
    if fit.coefficients is not None:
        return model.latency(fit.coefficients, lam, k, e, p, g, max_utilization=1.0).latency
    for c in fit.configurations:
        if c.k == k and c.workload == workload:
            return model.latency_from_costs(c.c1, c.c2, lam)
    return np.full_like(lam, np.nan)


def plot_fit(fit: SystemFit, path: Path) -> None:
    """Measured (markers) and predicted (lines) mean latency against arrival rate, per k, one
    panel per workload; excluded points as grey crosses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    excluded = [e.point for e in fit.excluded]
    all_labels = workload_labels([*fit.points, *excluded])
    labels = all_labels[: len(fit.points)]
    excluded_labels = all_labels[len(fit.points) :]
    workloads = sorted(set(labels))
    ks = sorted({k_key(p) for p in fit.points})
    cmap = plt.get_cmap("viridis", max(len(ks), 2))
    colour = {k: cmap(i) for i, k in enumerate(ks)}
    fig, axes = plt.subplots(
        1, len(workloads), figsize=(6.2 * len(workloads), 4.6), squeeze=False, sharey=True
    )
    for ax, workload in zip(axes[0], workloads, strict=True):
        pts = [p for p, w in zip(fit.points, labels, strict=True) if w == workload]
        for k in ks:
            group = [p for p in pts if k_key(p) == k]
            if not group:
                continue
            lam = np.array([p.arrival_rate for p in group])
            lat = np.array([p.latency_s for p in group])
            name = "no SD" if k == 0 else f"k={_k_label(k)}"
            ax.scatter(lam, lat, color=colour[k], s=22, label=name, zorder=3)
            e = float(np.mean([p.acceptance_length for p in group]))
            pm = float(np.mean([p.prompt_tokens or 0.0 for p in group]))
            gm = float(np.mean([p.generation_tokens or 0.0 for p in group]))
            grid = np.linspace(0.0, lam.max() * 1.05, 120)
            ax.plot(grid, _curve(fit, k, e, pm, gm, grid, workload), color=colour[k], lw=1.2)
        ex_w = [p for p, w in zip(excluded, excluded_labels, strict=True) if w == workload]
        if ex_w and pts:
            # Far-saturated points (10x the latency) would squash the fitted range flat.
            top = 2.0 * max(p.latency_s for p in pts)
            shown = [p for p in ex_w if p.latency_s <= top]
            if shown:
                ax.scatter(
                    [p.arrival_rate for p in shown],
                    [p.latency_s for p in shown],
                    marker="x",
                    color="0.55",
                    s=22,
                    label="excluded",
                    zorder=2,
                )
        ax.set_title(workload)
        ax.set_xlabel("arrival rate λ (req/s)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("mean end-to-end latency (s)")
    axes[0][-1].legend(fontsize=8, loc="upper left", ncol=2)
    how = "model" if fit.coefficients is not None else "per-configuration (C1, C2) fit"
    fig.suptitle(
        f"{fit.system}: measured (points) vs {how} (lines), R² {fit.r2:.3f}, MAPE {fit.mape:.1%}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_residuals(fit: SystemFit, path: Path) -> None:
    """Relative residual (predicted − measured)/measured against arrival rate, per k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = fit.residuals() * 100
    ks = sorted({k_key(p) for p in fit.points})
    cmap = plt.get_cmap("viridis", max(len(ks), 2))
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, k in enumerate(ks):
        idx = [j for j, p in enumerate(fit.points) if k_key(p) == k]
        ax.scatter(
            [fit.points[j].arrival_rate for j in idx],
            res[idx],
            color=cmap(i),
            s=18,
            label="no SD" if k == 0 else f"k={_k_label(k)}",
        )
    ax.axhline(0, color="black", lw=0.8)
    ax.axhspan(-5, 5, color="tab:green", alpha=0.08, label="±5%")
    ax.set_xlabel("arrival rate λ (req/s)")
    ax.set_ylabel("(predicted − measured) / measured (%)")
    ax.set_title(f"{fit.system}: residuals (MAPE {fit.mape:.1%})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = [
    "COEFFICIENTS",
    "DEFAULT_DRIFT_TOLERANCE",
    "Drift",
    "build_params",
    "compare_params",
    "print_drift",
    "print_report",
    "reference_points",
    "slug",
    "system_json",
    "write_report_dir",
]
