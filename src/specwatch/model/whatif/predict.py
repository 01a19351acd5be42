"""The prediction behind `specwatch predict`: SD and no-SD latency, speedup, utilisation,
break-even, best k.

One operating point in, every number the model knows about it out, so an operator can
answer "what latency at this load and k, and does SD make my requests faster?" from the
parameters file alone. Each answer carries its own verdict: `valid` is the latency asked for
(SD at k; no SD at k = 0), judged on that system's evidence; `speedup_valid` is the
comparison, which needs the no-SD latency at the same rate too. A declined answer carries a
reason naming the option to change. The options are declared in :mod:`specwatch.cli.predict`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specwatch.model import bestk, ceilings, uncertainty, validity
from specwatch.model.closed_form import BreakEvenKind, Reason
from specwatch.model.params import Params
from specwatch.model.whatif import common

KIND_NAMES = {
    BreakEvenKind.PAYS_BELOW: "pays_below",
    BreakEvenKind.PAYS_EVERYWHERE: "pays_everywhere",
    BreakEvenKind.NEVER_PAYS: "never_pays",
    BreakEvenKind.PAYS_ABOVE: "pays_above",
    BreakEvenKind.UNDEFINED: "undefined",
    BreakEvenKind.PAYS_TO_CEILING: "pays_to_ceiling",
}

EMPTY: dict[str, Any] = {
    "latency_sd_s": None,
    "latency_nosd_s": None,
    "speedup": None,
    "latency_interval": None,
    "speedup_interval": None,
    "breakeven_interval": None,
    "utilization": None,
    "valid": False,
    "validity_reasons": ["invalid_input"],
    "speedup_valid": False,
    "speedup_reasons": ["invalid_input"],
    "latency_sd_valid": False,
    "latency_sd_reasons": ["invalid_input"],
    "latency_nosd_valid": False,
    "latency_nosd_reasons": ["invalid_input"],
    "calibrated_range": None,
    "breakeven_arrival_rate": None,
    "breakeven_reasons": [],
    "breakeven_measured_ceiling": None,
    "sd_ceiling_arrival_rate": None,
    "sd_ceiling_source": None,
    "sd_ceiling_interval": None,
    "sd_ceiling_reasons": [],
    "optimal_draft_length": None,
    "optimal_basis": None,
    "optimal_note": None,
}


def breakeven_text(rate: float, kind: int) -> str:
    """The break-even in words (the rate where the predicted speedup crosses 1, or why none)."""
    kind = BreakEvenKind(int(kind))
    if kind == BreakEvenKind.PAYS_BELOW:
        return f"{rate:.3g} req/s (SD pays below it)"
    if kind == BreakEvenKind.PAYS_ABOVE:
        return f"{rate:.3g} req/s (SD pays only above it)"
    if kind == BreakEvenKind.PAYS_EVERYWHERE:
        return "none: SD pays at every load below saturation"
    if kind == BreakEvenKind.PAYS_TO_CEILING:
        return ("none below SD's throughput ceiling: the predicted speedup stays above 1 up "
                "to it")
    if kind == BreakEvenKind.NEVER_PAYS:
        return "none: SD never pays"
    return "undefined"


def range_caveat(reasons: list[str], cal: dict[str, Any] | None) -> str:
    """' (outside the calibrated range …: reasons)' for a figure with range reasons, else ''
    (the reasons `predict` gives at that rate)."""
    if not reasons:
        return ""
    top = f", up to {cal['max_arrival_rate']:.3g} req/s" if cal else ""
    return f" (outside the calibrated range{top}: {', '.join(reasons)})"


def breakeven_interval_text(pair: list[float | None] | None) -> str:
    """The 90% interval of a break-even in words: 'a–b req/s', or 'above a req/s' where the
    optimistic end has no crossing (the speedup stays above 1 there)."""
    if not pair:
        return ""
    lo, hi = pair
    if hi is None:
        return f"above {common.fmt(lo, '.3g')} req/s"
    return f"{common.fmt(lo, '.3g')}–{common.fmt(hi, '.3g')} req/s"


def ceiling_text(out: dict[str, Any], brief: bool = False) -> str | None:
    """SD's throughput ceiling in words, or None (SD off, or no ceiling); `brief` for a
    table's note."""
    rate = out.get("sd_ceiling_arrival_rate")
    if rate is None:
        return None
    measured = out.get("sd_ceiling_source") == "measured"
    caveat = range_caveat(out.get("sd_ceiling_reasons") or [], out.get("calibrated_range"))
    iv = out.get("sd_ceiling_interval")
    span = (f", 90% interval {breakeven_interval_text(iv)}" if iv else "")
    if brief:
        return f"{rate:.4g} req/s ({'measured' if measured else 'model'}{span}){caveat}"
    src = ("measured: the calibration runs of this k on these lengths stopped rising there"
           if measured else "the model's")
    return f"{rate:.3g} req/s, past which SD no longer keeps up ({src}{span}){caveat}"


def ceiling_fields(params: Params, k: float, e: float, p: float, g: float) -> dict[str, Any]:
    """SD's throughput ceiling for JSON: rate, source (measured / model), range reasons."""
    rate, measured = ceilings.sd_throughput_ceiling(params, k, e, p, g)
    r = float(rate)
    if not math.isfinite(r):
        return {"sd_ceiling_arrival_rate": None, "sd_ceiling_source": None,
                "sd_ceiling_interval": None, "sd_ceiling_reasons": []}
    src = "measured" if bool(measured) else "model"
    iv = ceilings.sd_ceiling_interval(params, r, bool(measured))
    return {"sd_ceiling_arrival_rate": r, "sd_ceiling_source": src,
            "sd_ceiling_interval": uncertainty.as_pair(*iv) if iv is not None else None,
            "sd_ceiling_reasons": (validity.figure_reasons(params, r, k, e, p, g,
                                                           at_ceiling=True)
                                   if src == "model" else [])}


def breakeven_fields(params: Params, k: float, e: float, p: float, g: float,
                     with_interval: bool = True) -> dict[str, Any]:
    """The break-even for JSON: rate (None unless a finite crossing), kind, 90% interval,
    range reasons, and SD's measured ceiling at this k (None where none bounds it)."""
    be = ceilings.breakeven(params, k, e, p, g)
    rate = float(be.rate)
    finite = math.isfinite(rate) and int(be.kind) in (BreakEvenKind.PAYS_BELOW,
                                                      BreakEvenKind.PAYS_ABOVE)
    iv = (ceilings.breakeven_interval(params, k, e, p, g, rate)
          if finite and with_interval else None)
    return {
        "breakeven_arrival_rate": rate if finite else None,
        "breakeven_interval": uncertainty.as_pair(*iv) if iv is not None else None,
        "breakeven_kind": KIND_NAMES[BreakEvenKind(int(be.kind))],
        "breakeven_reasons": (validity.figure_reasons(params, rate, k, e, p, g)
                              if finite else []),
        "breakeven_measured_ceiling": ceilings.sd_ceiling(params, k, p, g),
    }


@dataclass(frozen=True)
class PredictInputs:
    """One operating point as the command line gives it (validated by :func:`compute`)."""

    model: common.ModelOptions
    acceptance: common.AcceptanceOptions
    arrival_rate: float
    draft_length: float
    prompt_tokens: float
    generation_tokens: float


def compute(inputs: PredictInputs) -> dict[str, Any]:
    """The prediction as a JSON-ready dict (raises InputError on bad input)."""
    params = common.load(inputs.model)
    lam = common.finite_nonnegative("--arrival-rate", inputs.arrival_rate)
    k = common.finite_nonnegative("--draft-length", inputs.draft_length)
    p = common.finite_nonnegative("--prompt-tokens", inputs.prompt_tokens)
    g = common.finite_nonnegative("--generation-tokens", inputs.generation_tokens)
    ceiling = common.ceiling_of(inputs.model, params)
    k_max = common.k_max_of(inputs.model, params)
    acc, e = _acceptance_at(inputs.acceptance, params, k)
    limit = common.halfwidth_of(inputs.model, params)
    judged = validity.assess(params, lam, k, e, p, g, max_utilization=ceiling,
                             max_halfwidth=limit)
    out: dict[str, Any] = {
        "system": params.system,
        "arrival_rate": lam,
        "draft_length": k,
        "acceptance_length": e,
        "alpha": acc.alpha if acc is not None else None,
        "acceptance_source": acc.source if acc is not None else "sd_off",
        "prompt_tokens": p,
        "generation_tokens": g,
        "max_utilization": ceiling,
    }
    out.update(_prediction(params, judged, lam, k, e, p, g, limit))
    out.update(_optimal(params, acc, lam, p, g, k_max, ceiling, limit))
    reason = _reason(params, judged, k, ceiling, limit, out["interval_halfwidth"])
    if reason is not None:
        out["reason"] = reason
    if out["valid"] and not out["speedup_valid"]:
        out["speedup_reason"] = _speedup_reason(judged)
    return out


def _acceptance_at(opts: common.AcceptanceOptions, params: Params,
                   k: float) -> tuple[common.Acceptance | None, float]:
    """The acceptance model and E(k); (None, 1) for k = 0 (SD off)."""
    if k == 0:
        if opts.acceptance_length is not None:
            common.check_acceptance_length("--acceptance-length", opts.acceptance_length, 0)
        if opts.alpha is not None:
            common.check_alpha("--alpha", opts.alpha)
        return None, 1.0
    acc = common.acceptance_from(opts, params, k)
    if opts.acceptance_length is not None:
        return acc, float(opts.acceptance_length)
    if acc.profile is not None and (k != round(k) or k > len(acc.profile)):
        raise common.InputError(
            f"--draft-length: the parameters file's acceptance_profile covers k <= "
            f"{len(acc.profile)} (integers); give --alpha or --acceptance-length"
        )
    return acc, float(acc.length(k))


def _prediction(params: Params, judged: validity.Assessment, lam: float, k: float, e: float,
                p: float, g: float, limit: float) -> dict[str, Any]:
    """Latencies, speedup, their intervals, utilisation, validity and break-even."""
    pred = judged.prediction
    model_ok = bool(pred.valid)
    usable_sd = bool(pred.sd.valid)
    usable_nosd = bool(pred.nosd.valid)
    both = bool(judged.valid)
    iv = judged.intervals
    figures = {**breakeven_fields(params, k, e, p, g, with_interval=iv is not None),
               **(ceiling_fields(params, k, e, p, g) if k > 0 else {})}
    return dict(
        latency_sd_s=float(pred.sd.latency) if usable_sd else None,
        latency_nosd_s=float(pred.nosd.latency) if usable_nosd else None,
        speedup=float(pred.speedup) if both else None,
        latency_interval=(uncertainty.as_pair(*iv.latency_sd) if iv is not None and usable_sd
                          else None),
        latency_nosd_interval=(uncertainty.as_pair(*iv.latency_nosd)
                               if iv is not None and usable_nosd else None),
        speedup_interval=(uncertainty.as_pair(*iv.speedup) if iv is not None and model_ok
                          else None),
        interval_halfwidth=(float(iv.halfwidth) if iv is not None and usable_sd else None),
        max_interval_halfwidth=limit,
        interval_level=(params.uncertainty.level if params.uncertainty is not None else None),
        utilization=float(pred.sd.utilization),
        utilization_nosd=float(pred.nosd.utilization),
        valid=bool(judged.valid_sd),
        validity_reasons=judged.names_sd(),
        speedup_valid=both,
        speedup_reasons=judged.names(),
        latency_sd_valid=bool(judged.valid_sd),
        latency_sd_reasons=judged.names_sd(),
        latency_nosd_valid=bool(judged.valid_nosd),
        latency_nosd_reasons=judged.names_nosd(),
        calibrated_range=(params.calibrated_range.to_mapping()
                          if params.calibrated_range is not None else None),
        **figures,
    )


def _optimal(params: Params, acc: common.Acceptance | None, lam: float, p: float, g: float,
             k_max: int, ceiling: float, limit: float) -> dict[str, Any]:
    """The best k at this load and its basis (`model.bestk`: the model's optimum where its
    own prediction is vouched for, else the best vouched k where the optimum's gain over it
    lies inside its 90% latency interval); none with SD off."""
    none: dict[str, Any] = {"optimal_draft_length": None, "optimal_speedup": None,
                            "optimal_basis": None, "optimal_note": None,
                            "model_optimal_draft_length": None, "optimal_gain": None,
                            "optimal_gain_allowance": None}
    if acc is None:
        return none
    best = bestk.best_draft_length(params, lam, p, g, k_max=k_max, max_utilization=ceiling,
                                   max_halfwidth=limit, **acc.optimal_kwargs())
    shown = bool(best.shown)
    k_opt = int(best.optimum.k)
    return {**none,
            "optimal_draft_length": int(best.k) if shown else None,
            "optimal_speedup": float(best.speedup) if shown else None,
            "optimal_basis": str(best.basis) if shown else None,
            "optimal_note": best.note(),
            "model_optimal_draft_length": k_opt if k_opt >= 0 else None,
            "optimal_gain": float(best.gain),
            "optimal_gain_allowance": float(best.allowance)}


def _reason(params: Params, judged: validity.Assessment, k: float, ceiling: float, limit: float,
            half: float | None) -> str | None:
    """Why the latency asked for (SD at k; no SD at k = 0) is declined, in words naming the
    option to change (None: valid and inside the calibrated range)."""
    pred = judged.prediction
    reasons = judged.names_sd()
    model_ok = bool(pred.sd.valid)
    valid = bool(judged.valid_sd)
    range_bad = [r for r in reasons if r in (validity.BEYOND_CALIBRATED_LOAD,
                                             validity.EXTRAPOLATED_K)]
    if validity.SATURATED in reasons and int(pred.sd.reason) != Reason.SATURATED:
        return (
            f"--arrival-rate: at or past the throughput ceiling measured for k = {k:g} on "
            "a workload of these lengths (more requests in flight brought no more "
            "throughput there): the latency is not a function of the arrival rate, the "
            "queue sets it (saturated)"
        )
    if model_ok and range_bad:
        cal = params.calibrated_range
        assert cal is not None
        return (
            f"--arrival-rate/--draft-length: outside the calibrated range "
            f"({', '.join(range_bad)}; calibrated up to {cal.max_arrival_rate:g} req/s, "
            f"{cal.max_in_flight:g} requests in flight"
            + (f", utilisation {cal.max_utilization_seen:g}"
               if cal.max_utilization_seen is not None else "")
            + (f"; runs with throughput headroom held up to "
               f"{cal.headroom_in_flight(k):g} requests in flight"
               if cal.headroom_in_flight(k) is not None else "")
            + f", k in {list(cal.draft_lengths)}): re-calibrate with data "
            "at this load before trusting it"
        )
    if model_ok and not valid:
        return (
            f"--arrival-rate: the 90% latency interval is ±{half:.0%} (limit "
            f"±{limit:.0%}): this close to the throughput ceiling the fit's residual spread "
            "moves the latency more than the number can carry (sensitive)"
            if half is not None and math.isfinite(half) else
            "--arrival-rate: the pessimistic fit saturates at this load: the latency has no "
            "upper bound (sensitive)"
        )
    if not valid:
        which = " (with SD)" if k != 0 else ""
        return (f"{common.invalid_reason(int(pred.sd.reason), float(pred.sd.utilization), ceiling)}"
                f"{which}")
    return None


def _speedup_reason(judged: validity.Assessment) -> str:
    """Why the speedup is declined while the latency asked for is vouched for: the no-SD
    latency at the same rate is not (its reasons), or the two together are not."""
    nosd = judged.names_nosd()
    if nosd:
        return ("the latency without SD at this arrival rate is not vouched for"
                f" ({', '.join(nosd)}): re-calibrate with no-SD runs at this load to compare")
    return f"the two latencies together are not vouched for ({', '.join(judged.names())})"


def interval_text(pair: list[float | None] | None, spec: str) -> str:
    """'[lo, hi]' for a table ('—' without an interval, '∞' for an open upper bound)."""
    if not pair:
        return "—"
    lo, hi = pair
    return f"[{common.fmt(lo, spec)}, {'∞' if hi is None else common.fmt(hi, spec)}]"


def render(out: dict[str, Any]) -> None:
    f = common.fmt
    rows = [
        ["mean latency (s)", f(out["latency_sd_s"], ".3f"), f(out["latency_nosd_s"], ".3f")],
        ["90% interval (s)", interval_text(out.get("latency_interval"), ".3f"),
         interval_text(out.get("latency_nosd_interval"), ".3f")],
        ["utilisation λ·C2", f(out["utilization"]), f(out["utilization_nosd"])],
    ]
    alpha = "" if out["alpha"] is None else f" (α = {out['alpha']:.3g})"
    title = (f"specwatch predict · {out['system']} · λ = {f(out['arrival_rate'])} req/s, "
             f"k = {f(out['draft_length'])}, E = {f(out['acceptance_length'], '.4g')}{alpha}, "
             f"p = {f(out['prompt_tokens'])}, g = {f(out['generation_tokens'])}")
    notes = []
    if out["speedup"] is not None:
        notes.append(f"speedup: {out['speedup']:.3f}x "
                     f"({'faster' if out['speedup'] > 1 else 'slower'} with SD), 90% interval "
                     f"{interval_text(out.get('speedup_interval'), '.3f')}")
    rate = out["breakeven_arrival_rate"]
    kind = {v: k for k, v in KIND_NAMES.items()}[out["breakeven_kind"]]
    biv = breakeven_interval_text(out.get("breakeven_interval"))
    notes.append("break-even arrival rate (speedup = 1): "
                 + breakeven_text(rate if rate is not None else math.inf, kind)
                 + (f", 90% interval {biv}" if biv else "")
                 + range_caveat(out.get("breakeven_reasons") or [], out.get("calibrated_range")))
    ceiling = ceiling_text(out)
    if ceiling is not None:
        notes.append(f"SD throughput ceiling: {ceiling}")
    if out["optimal_draft_length"] is not None:
        k_opt = out["optimal_draft_length"]
        notes.append(
            "optimal draft length at this load: "
            + ("0 (SD off)" if k_opt == 0 else f"{k_opt} ({out['optimal_speedup']:.3f}x)")
            + (f" ({out['optimal_note']})" if out.get("optimal_note") else "")
        )
    elif out.get("optimal_note"):
        notes.append(f"optimal draft length at this load: {out['optimal_note']}")
    notes.append("valid: yes" if out["valid"] else f"valid: NO: {out['reason']}")
    if out["valid"] and not out["speedup_valid"]:
        notes.append(f"speedup: not vouched for: {out['speedup_reason']}")
    common.render_table(title, ["", "with SD", "without SD"], rows, notes)
