"""The sweep behind `specwatch sweep`: predicted speedup against arrival rate for each k.

Draws the whole picture `predict` gives one point of: where each k stops paying (its
break-even), which k is best at each load, and from which load on SD should be off. The
table goes to stdout; `--csv` writes every (λ, k) point in long form for other tools, and
`--plot` a PNG (matplotlib, Agg backend: no display needed). The options are declared in
:mod:`specwatch.cli.sweep`.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from specwatch.model import bestk, validity
from specwatch.model.closed_form import (
    MAX_DRAFT_LENGTH,
    Reason,
    reason_text,
    speedup,
)
from specwatch.model.params import Params
from specwatch.model.whatif import common
from specwatch.model.whatif.predict import (
    KIND_NAMES,
    breakeven_fields,
    breakeven_interval_text,
    breakeven_text,
    ceiling_fields,
    ceiling_text,
    range_caveat,
)

MAX_POINTS = 10_000
EMPTY: dict[str, Any] = {"arrival_rates": [], "curves": [], "best_draft_length": []}


def parse_draft_lengths(text: str) -> list[int]:
    """'1-8' / '1,2,4' / '1-3,6' → sorted distinct integers in [1, 64]."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d{1,9})(?:\s*-\s*(\d{1,9}))?", part)
        if not m:
            raise common.InputError(
                f"--draft-lengths: expected integers and ranges like '1-8' or '1,2,4', "
                f"got {text!r}"
            )
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        if lo > hi:
            raise common.InputError(f"--draft-lengths: range {part!r} runs backwards")
        if lo < 1 or hi > MAX_DRAFT_LENGTH:  # before the range is built
            raise common.InputError(
                f"--draft-lengths: expected draft lengths in [1, {MAX_DRAFT_LENGTH}] (0, SD "
                f"off, is always the baseline), got {text!r}"
            )
        out.update(range(lo, hi + 1))
    return sorted(out)


def parse_arrival_rates(text: str) -> np.ndarray:
    """'START:STOP:N' → N evenly spaced rates, both ends included."""
    parts = text.split(":")
    try:
        if len(parts) != 3:
            raise ValueError
        start, stop, n = float(parts[0]), float(parts[1]), int(parts[2])
    except ValueError:
        raise common.InputError(
            f"--arrival-rates: expected START:STOP:N (req/s, req/s, points), got {text!r}"
        ) from None
    if not (math.isfinite(start) and math.isfinite(stop)) or start < 0 or stop <= start:
        raise common.InputError(
            f"--arrival-rates: expected 0 <= START < STOP (finite req/s), got {text!r}"
        )
    if not 2 <= n <= MAX_POINTS:
        raise common.InputError(f"--arrival-rates: N must be in [2, {MAX_POINTS}], got {n}")
    return np.linspace(start, stop, n)


@dataclass(frozen=True)
class SweepInputs:
    """The sweep as the command line gives it (validated by :func:`compute`)."""

    model: common.ModelOptions
    alpha: float | None
    prompt_tokens: float
    generation_tokens: float
    draft_lengths: str  # '1-8', '1,2,4' or '1-3,6'
    arrival_rates: str  # 'START:STOP:N'


def compute(inputs: SweepInputs) -> dict[str, Any]:
    params = common.load(inputs.model)
    p = common.finite_nonnegative("--prompt-tokens", inputs.prompt_tokens)
    g = common.finite_nonnegative("--generation-tokens", inputs.generation_tokens)
    ks = parse_draft_lengths(inputs.draft_lengths)
    lams = parse_arrival_rates(inputs.arrival_rates)
    ceiling = common.ceiling_of(inputs.model, params)
    acc = common.acceptance_from(common.AcceptanceOptions(alpha=inputs.alpha), params, None)
    if acc.profile is not None and max(ks) > len(acc.profile):
        raise common.InputError(
            f"--draft-lengths: the parameters file's acceptance_profile covers k <= "
            f"{len(acc.profile)}; give --alpha to extrapolate with the i.i.d. model"
        )
    k_arr = np.asarray(ks, dtype=float)
    e_arr = acc.length(k_arr)
    limit = common.halfwidth_of(inputs.model, params)
    judged = validity.assess(params, lams[:, None], k_arr[None, :], e_arr[None, :], p, g,
                             max_utilization=ceiling, max_halfwidth=limit)
    # The best k is the model's fastest where its own prediction is vouched for (the same
    # judgement as its column), else the best vouched k where the two cannot be told apart
    # (model.bestk); never next to a blank column.
    best = bestk.best_draft_length(params, lams, p, g, draft_lengths=ks,
                                   max_utilization=ceiling, max_halfwidth=limit,
                                   **acc.optimal_kwargs())
    best_ok = best.shown
    pred = judged.prediction
    nosd_valid = pred.nosd.valid[:, 0]
    cal = params.calibrated_range
    return {
        "system": params.system,
        "acceptance_source": acc.source,
        "alpha": acc.alpha,
        "acceptance_profile": list(acc.profile) if acc.profile else None,
        "prompt_tokens": p,
        "generation_tokens": g,
        "max_utilization": ceiling,
        "arrival_rates": lams,
        "draft_lengths": ks,
        "latency_nosd_s": np.where(nosd_valid, pred.nosd.latency[:, 0], np.nan),
        "utilization_nosd": pred.nosd.utilization[:, 0],
        "curves": _curves(params, judged, lams.size, ks, e_arr, p, g),
        "best_draft_length": best.k,
        "best_speedup": best.speedup,
        "best_basis": [b or None for b in best.basis.tolist()],
        "best_notes": [best.note(i) for i in range(lams.size)],
        "sd_off_above_arrival_rate": (off := common.sd_off_above(lams, best.k, best_ok)),
        "sd_off_above_reasons": (validity.range_reasons(cal, off, None, 0) if off else []),
        "valid": True,
        "calibrated_range": cal.to_mapping() if cal is not None else None,
        "max_interval_halfwidth": limit,
        "interval_level": params.uncertainty.level if params.uncertainty is not None else None,
    }


def _curves(params: Params, judged: validity.Assessment, n_lams: int, ks: list[int],
            e_arr: np.ndarray, p: float, g: float) -> list[dict[str, Any]]:
    """One curve per draft length: speedup, latency and their intervals at every swept λ
    (NaN where declined), with the draft length's break-even."""
    model = params.model()
    k_arr = np.asarray(ks, dtype=float)
    s0 = speedup(model, 0.0, k_arr, e_arr, p, g)
    pred = judged.prediction
    grid = (n_lams, len(ks))
    iv = judged.intervals
    nan = np.full(grid, np.nan)
    s_lo, s_hi = (np.broadcast_to(x, grid) for x in iv.speedup) if iv is not None else (nan,
                                                                                      nan)
    l_lo, l_hi = ((np.broadcast_to(x, grid) for x in iv.latency_sd) if iv is not None
                  else (nan, nan))
    curves = []
    for j, k in enumerate(ks):
        reasons = [judged.names((i, j)) for i in range(n_lams)]
        valid = judged.valid[:, j]
        curves.append({
            "draft_length": k,
            "acceptance_length": float(e_arr[j]),
            "isolated_speedup": float(s0[j]),
            **breakeven_fields(params, float(k), float(e_arr[j]), p, g),
            **ceiling_fields(params, float(k), float(e_arr[j]), p, g),
            "speedup": np.where(valid, pred.speedup[:, j], np.nan),
            "speedup_lower": np.where(valid, s_lo[:, j], np.nan),
            "speedup_upper": np.where(valid, s_hi[:, j], np.nan),
            "latency_sd_s": np.where(pred.sd.valid[:, j], pred.sd.latency[:, j], np.nan),
            "latency_sd_lower": np.where(pred.sd.valid[:, j], l_lo[:, j], np.nan),
            "latency_sd_upper": np.where(pred.sd.valid[:, j], l_hi[:, j], np.nan),
            "utilization": pred.sd.utilization[:, j],
            "valid": valid,
            "reason": [reason_text(r) for r in pred.reason[:, j]],
            "validity_reasons": reasons,
        })
    return curves


def write_csv(out: dict[str, Any], path: str) -> None:
    fields = ["arrival_rate", "draft_length", "acceptance_length", "latency_sd_s",
              "latency_nosd_s", "speedup", "utilization_sd", "utilization_nosd", "valid",
              "reason", "best_draft_length", "speedup_lower", "speedup_upper",
              "latency_sd_lower", "latency_sd_upper"]
    try:
        fh = open(path, "w", newline="", encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise common.InputError(f"--csv: cannot write {path}: {exc.strerror}") from None
    with fh:
        w = csv.writer(fh)
        w.writerow(fields)
        for i, lam in enumerate(out["arrival_rates"]):
            for c in out["curves"]:
                row = [lam, c["draft_length"], c["acceptance_length"], c["latency_sd_s"][i],
                       out["latency_nosd_s"][i], c["speedup"][i], c["utilization"][i],
                       out["utilization_nosd"][i], int(c["valid"][i]), c["reason"][i],
                       out["best_draft_length"][i], c["speedup_lower"][i],
                       c["speedup_upper"][i], c["latency_sd_lower"][i],
                       c["latency_sd_upper"][i]]
                w.writerow(["" if isinstance(v, float) and not math.isfinite(v) else
                            (f"{v:.9g}" if isinstance(v, (float, np.floating)) else v)
                            for v in (common.clean(x) if not isinstance(x, str) else x
                                      for x in row)])


def _spans(lams: np.ndarray, mask: np.ndarray) -> list[tuple[float, float]]:
    """Contiguous λ intervals where mask holds (half a grid step beyond each end)."""
    if lams.size < 2:
        return []
    half = (lams[1] - lams[0]) / 2
    spans = []
    i = 0
    while i < mask.size:
        if mask[i]:
            j = i
            while j + 1 < mask.size and mask[j + 1]:
                j += 1
            spans.append((max(lams[0], lams[i] - half), min(lams[-1], lams[j] + half)))
            i = j + 1
        else:
            i += 1
    return spans


def _mark_figures(ax: Any, c: dict[str, Any], lams: np.ndarray, color: Any) -> None:
    """One curve's SD throughput ceiling (a tick on the speedup-1 line) and break-even (a
    dot on it, hollow when λ* lies past the last valid point of its curve)."""
    cap = c.get("sd_ceiling_arrival_rate")
    if cap is not None and lams[0] <= cap <= lams[-1]:
        ax.plot([cap], [1.0], marker="|", ms=14, mew=2, color=color, ls="", zorder=4)
    rate = c["breakeven_arrival_rate"]
    if rate is not None and lams[0] <= rate <= lams[-1]:
        ok_lams = lams[np.asarray(c["valid"])]
        inside = ok_lams.size > 0 and rate <= ok_lams[-1] + (lams[1] - lams[0])
        ax.plot([rate], [1.0], marker="o", ms=7, mec=color if not inside else "black",
                mfc=color if inside else "white", mew=1.5, ls="", zorder=5)


def write_plot(out: dict[str, Any], path: str) -> None:
    # Without matplotlib the ModuleNotFoundError reaches the command line, which names the
    # extra and the pip command for this install (from a clone or from the index).
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    lams = out["arrival_rates"]
    best = np.asarray(out["best_draft_length"])
    fig, (ax, axk) = plt.subplots(
        2, 1, sharex=True, figsize=(9, 6.5), gridspec_kw={"height_ratios": [3, 1]},
        constrained_layout=True,
    )
    cmap = plt.get_cmap("viridis")
    n = len(out["curves"])
    for j, c in enumerate(out["curves"]):
        color = cmap(j / max(1, n - 1) * 0.9)
        ax.plot(lams, c["speedup"], color=color, lw=1.8,
                label=f"k = {c['draft_length']} (E = {c['acceptance_length']:.2f})")
        lo, hi = np.asarray(c["speedup_lower"]), np.asarray(c["speedup_upper"])
        if np.isfinite(lo).any():
            ax.fill_between(lams, lo, hi, color=color, alpha=0.15, lw=0)
        _mark_figures(ax, c, lams, color)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    off = _spans(lams, best == 0)
    none = _spans(lams, best < 0)
    for i, (a, b) in enumerate(off):
        ax.axvspan(a, b, color="tab:red", alpha=0.12, lw=0,
                   label="SD off (no k beats no-SD)" if i == 0 else None)
        axk.axvspan(a, b, color="tab:red", alpha=0.12, lw=0)
    for i, (a, b) in enumerate(none):
        ax.axvspan(a, b, color="grey", alpha=0.25, lw=0, hatch="//",
                   label=f"no best k vouched for (utilisation > {out['max_utilization']:g}"
                   " or its prediction declined)"
                   if i == 0 else None)
        axk.axvspan(a, b, color="grey", alpha=0.25, lw=0, hatch="//")
    if any(np.isfinite(np.asarray(c["speedup_lower"])).any() for c in out["curves"]):
        level = out.get("interval_level") or 0.9
        ax.fill_between([], [], [], color="grey", alpha=0.15, lw=0,
                        label=f"{level:.0%} interval (fit's residual spread)")
    if any(c["breakeven_arrival_rate"] is not None for c in out["curves"]):
        ax.plot([], [], marker="o", ls="", color="grey", mec="black",
                label="break-even λ* (speedup 1)")
        ax.plot([], [], marker="o", ls="", mfc="white", mec="grey",
                label="λ* past the validity ceiling")
    ax.plot([], [], marker="|", ms=14, mew=2, ls="", color="grey",
            label="SD throughput ceiling")
    acc = (f"α = {out['alpha']:.3g}" if out["alpha"] is not None
           else "per-position acceptance profile")
    # Two lines: a long system name and the inputs do not fit the figure's width in one.
    ax.set_title(f"{out['system']}: predicted speedup vs arrival rate\n"
                 f"{acc}, prompt {out['prompt_tokens']:g} tokens, "
                 f"generation {out['generation_tokens']:g} tokens", fontsize=10)
    ax.set_ylabel("speedup L_noSD / L_SD")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right", ncol=2)
    shown = np.where(best >= 0, best, np.nan)
    axk.step(lams, shown, where="mid", color="black", lw=1.5)
    axk.set_ylabel("best k")
    axk.set_xlabel("arrival rate λ (req/s)")
    axk.set_ylim(-0.5, max(out["draft_lengths"]) + 0.5)
    axk.grid(alpha=0.3)
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise common.InputError(f"--plot: cannot write {path}: {exc.strerror}") from None
    finally:
        plt.close(fig)


def render(out: dict[str, Any]) -> None:
    f = common.fmt
    ks = out["draft_lengths"]
    headers = ["λ (req/s)", *[f"S k={k}" for k in ks], "best k", "best S"]
    rows = []
    for i, lam in enumerate(out["arrival_rates"]):
        b = int(out["best_draft_length"][i])
        mark = "*" if out["best_basis"][i] == bestk.BEST_VOUCHED else ""
        rows.append([f(lam, ".4g"), *[f(c["speedup"][i], ".3f") for c in out["curves"]],
                     "—" if b < 0 else ("0 (off)" if b == 0 else str(b)) + mark,
                     f(out["best_speedup"][i], ".3f")])
    acc = (f"α = {out['alpha']:.4g}" if out["alpha"] is not None
           else "acceptance profile " + ", ".join(f"{x:g}" for x in out["acceptance_profile"]))
    title = (f"specwatch sweep · {out['system']} · {acc}, p = {f(out['prompt_tokens'])}, "
             f"g = {f(out['generation_tokens'])} · speedup L_noSD/L_SD (— = not valid)")
    notes = ["break-even (speedup = 1) and SD's throughput ceiling per draft length:"]
    cal = out.get("calibrated_range")
    for c in out["curves"]:
        kind = c["breakeven_kind"]
        rate = c["breakeven_arrival_rate"]
        text = ("none below SD's throughput ceiling" if kind == "pays_to_ceiling" else
                breakeven_text(rate if rate is not None else math.inf,
                               {v: k for k, v in KIND_NAMES.items()}[kind]))
        biv = breakeven_interval_text(c.get("breakeven_interval"))
        text += (f", 90% interval {biv}" if biv else "") \
            + range_caveat(c.get("breakeven_reasons") or [], cal)
        ceiling = ceiling_text({**c, "calibrated_range": cal}, brief=True)
        notes.append(f"  k = {c['draft_length']} (E = {c['acceptance_length']:.3f}, isolated "
                     f"speedup {c['isolated_speedup']:.3f}x): break-even {text}"
                     + (f"; SD ceiling {ceiling}" if ceiling else ""))
    stand_ins = [i for i, b in enumerate(out["best_basis"]) if b == bestk.BEST_VOUCHED]
    if stand_ins:
        i = stand_ins[0]
        notes.append(f"* at {f(out['arrival_rates'][i], '.4g')} req/s (the first so "
                     f"marked): {out['best_notes'][i]}")
    if out["sd_off_above_arrival_rate"] is not None:
        notes.append(f"best choice is SD off from {out['sd_off_above_arrival_rate']:.4g} req/s "
                     "on (within the swept range)"
                     + range_caveat(out.get("sd_off_above_reasons") or [], cal))
    common.render_table(title, headers, rows, notes)


__all__ = ["Reason", "SweepInputs", "compute", "render", "write_csv", "write_plot"]
