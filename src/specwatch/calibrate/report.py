"""What `specwatch calibrate` tells people: the JSON report, the parameters file it writes,
drift against an earlier fit, the terminal tables, and the report directory.

Kept apart from the fit so the fit stays pure numbers. The Markdown sections are in
`calibrate.markdown`, the plots in `calibrate.plots` (matplotlib imported only when `--report`
asks for them), the shared text forms in `calibrate.reportfmt`. JSON is strict: NaN and infinity
become null.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specwatch import __version__, model
from specwatch.calibrate.leastsq import k_key
from specwatch.calibrate.markdown import markdown_saturation, markdown_system
from specwatch.calibrate.plots import plot_fit, plot_residuals
from specwatch.calibrate.reportfmt import (
    PARAMS_ORDER,
    compact_sources,
    k_label,
    rate_text,
    reason_kind,
    short_source,
    user_path_line,
)
from specwatch.calibrate.results import SystemFit
from specwatch.calibrate.saturation import stated_capacity
from specwatch.model.params import Params, params_from_mapping

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


def slug(name: str) -> str:
    """A file-name-safe form of a system name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-").lower() or "system"


# --------------------------------------------------------------------------------------------
# JSON


def system_json(fit: SystemFit) -> dict[str, Any]:
    """The per-system JSON report (the headline figures first, then the detail)."""
    coef = fit.coefficients
    out: dict[str, Any] = {
        **_headline_json(fit),
        **_identifiability_json(fit),
        **_records_json(fit),
        **_evidence_json(fit),
    }
    if coef is not None and fit.mode == "saturation":
        out["coefficients"].update(
            {n: float(getattr(coef, n)) for n in SATURATION_ORDER}
        )
        out["coefficients"].update(
            {n: float(getattr(coef, n)) for n in CAPACITY_ORDER if getattr(coef, n)}
        )
    return out


def _headline_json(fit: SystemFit) -> dict[str, Any]:
    """Fit quality, the coefficients, and break-even and zero-load speedup per draft length."""
    coef = fit.coefficients
    return {
        "r2": _num(fit.r2),
        "mape": _num(fit.mape),
        "leave_one_k_out_mape": _num(fit.leave_one_k_out_mape),
        "n_points": fit.n_points,
        "n_excluded": fit.n_excluded,
        "coefficients": (
            {n: float(getattr(coef, n)) for n in PARAMS_ORDER} if coef is not None else None
        ),
        "breakeven_arrival_rate": {
            k_label(d.k): _num(d.breakeven_arrival_rate) for d in fit.draft_lengths
        },
        "breakeven_kind": {k_label(d.k): d.breakeven_kind for d in fit.draft_lengths},
        "sd_ceiling_arrival_rate": {
            k_label(d.k): _num(d.sd_ceiling_arrival_rate) for d in fit.draft_lengths
        },
        "zero_load_speedup": {k_label(d.k): _num(d.zero_load_speedup) for d in fit.draft_lengths},
    }


def _identifiability_json(fit: SystemFit) -> dict[str, Any]:
    """The mode, what the data could not separate, and the leave-one-k-out errors."""
    return {
        "mode": fit.mode,
        "identifiable": not fit.not_identifiable and fit.mode == "six-coefficient",
        "not_identifiable": list(fit.not_identifiable),
        "fallback_reason": fit.fallback_reason,
        "variance_inflation": {n: _num(v) for n, v in fit.vif.items()},
        "leave_one_k_out_mape_by_k": {
            k_label(k): _num(v) for k, v in sorted(fit.leave_one_k_out_by_k.items())
        },
        "leave_one_k_out_note": fit.leave_one_k_out_note,
    }


def _records_json(fit: SystemFit) -> dict[str, Any]:
    """Per draft length, measured speedups, and per-configuration (C1, C2)."""
    return {
        "draft_lengths": [
            {
                "k": d.k,
                "acceptance_length": _num(d.acceptance_length),
                "prompt_tokens": _num(d.prompt_tokens),
                "generation_tokens": _num(d.generation_tokens),
                "zero_load_speedup": _num(d.zero_load_speedup),
                "breakeven_arrival_rate": _num(d.breakeven_arrival_rate),
                "breakeven_kind": d.breakeven_kind,
                "breakeven_reasons": list(d.breakeven_reasons),
                "sd_ceiling_arrival_rate": _num(d.sd_ceiling_arrival_rate),
                "sd_ceiling_source": d.sd_ceiling_source,
                "sd_ceiling_reasons": list(d.sd_ceiling_reasons),
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
    }


def _evidence_json(fit: SystemFit) -> dict[str, Any]:
    """Acceptance profile, exclusions, notes, and what the parameters file records about
    validity: calibrated range, saturation report, uncertainty, user path, server capacity."""
    return {
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

    console = Console()
    for fit in fits:
        console.rule(f"[bold]{fit.system}")
        console.print(_summary_table(fit, written))
        if fit.draft_lengths:
            console.print(_draft_length_table(fit))
        if fit.measured_speedups:
            console.print(_speedup_table(fit))
        if fit.excluded:
            console.print(_excluded_table(fit))
        for note in fit.notes:
            console.print(f"note: {note}")
    if drift is not None:
        print_drift(drift, console)


def _summary_table(fit: SystemFit, written: Mapping[str, str]) -> Any:
    """Mode, points, fit quality, coefficients, the file written and the user-path line."""
    from rich.table import Table

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
    return summary


def _be_kind(d: Any) -> tuple[str, str, str]:
    """Break-even, kind and SD-ceiling cells (req/s); '†' marks a measured ceiling, '*' a
    figure outside the calibrated range (the table's caption says so)."""
    crossing = d.breakeven_kind in ("pays_below", "pays_above")
    be = rate_text(d.breakeven_arrival_rate) if crossing else "none"
    cap = d.sd_ceiling_arrival_rate
    ceiling = "n/a" if math.isnan(cap) else rate_text(cap)
    ceiling += "†" if d.sd_ceiling_source == "measured" else ""
    return (be + ("*" if crossing and d.breakeven_reasons else ""), d.breakeven_kind,
            ceiling + ("*" if d.sd_ceiling_reasons else ""))


def _draft_length_table(fit: SystemFit) -> Any:
    t = _right_aligned_table(
        "per draft length (req/s)",
        ("k", "E", "zero-load speedup", "break-even", "kind", "SD ceiling"),
        ((k_label(d.k), f"{d.acceptance_length:.2f}", f"{d.zero_load_speedup:.3f}",
          *_be_kind(d)) for d in fit.draft_lengths),
    )
    notes = []
    if any(d.sd_ceiling_source == "measured" for d in fit.draft_lengths):
        notes.append("† measured (the runs stopped rising there)")
    reasons = sorted({r for d in fit.draft_lengths
                      for r in (*d.breakeven_reasons, *d.sd_ceiling_reasons)})
    if reasons:
        notes.append(f"* outside the calibrated range ({', '.join(reasons)})")
    if notes:
        t.caption = "; ".join(notes)
    return t


def _speedup_table(fit: SystemFit) -> Any:
    return _right_aligned_table(
        "speedup at the lowest common concurrency: measured vs predicted",
        ("k", "workload", "concurrency", "measured", "predicted (λ=0)"),
        ((k_label(m.k), m.workload, f"{m.concurrency:g}", f"{m.measured:.3f}",
          f"{m.predicted:.3f}") for m in fit.measured_speedups),
    )


def _right_aligned_table(title: str, columns: Sequence[str],
                         rows: Iterable[Sequence[str]]) -> Any:
    from rich.table import Table

    t = Table(title=title)
    for col in columns:
        t.add_column(col, justify="right")
    for row in rows:
        t.add_row(*row)
    return t


def _excluded_table(fit: SystemFit) -> Any:
    """One row per reason kind, with the rows it hit: near-identical lines ("concurrency 128
    > 64") would bury the fit figures. --json has every point."""
    from rich.table import Table

    t = Table(title=f"excluded points ({fit.n_excluded})")
    t.add_column("reason")
    t.add_column("n", justify="right")
    t.add_column("where (first ones)")
    groups: dict[str, list[str]] = defaultdict(list)
    example: dict[str, str] = {}
    for e in fit.excluded:
        kind = reason_kind(e.reason)
        groups[kind].append(short_source(e.point.source))
        example.setdefault(kind, e.reason)
    for kind, sources in groups.items():
        shown = compact_sources(sources)
        label = example[kind] if len(sources) == 1 else kind
        t.add_row(label, str(len(sources)), shown)
    return t


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


# --------------------------------------------------------------------------------------------
# report directory (Markdown + PNG + JSON)


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
        lines += markdown_system(fit, fit_png.name, res_png.name)
        if fit.mode == "saturation" and fit.coefficients is not None:
            from specwatch.calibrate.load_range import plot_load_range

            range_png = directory / f"{slug(fit.system)}-load-range.png"
            plot_load_range(fit, range_png)
            written.append(range_png)
            lines += markdown_saturation(fit, range_png.name)
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


__all__ = [
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
