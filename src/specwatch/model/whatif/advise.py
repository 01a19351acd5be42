"""`specwatch advise`: turn the model into the decision an operator has to make.

Input: the arrival rate at the p50, p95 and p99 of the operator's load (req/s), acceptance,
lengths. Output, in plain language: enable SD or not, with which static k, the expected gain
at each percentile, the arrival rate above which SD should be off, and a batch-size schedule
for vLLM's `num_speculative_tokens_per_batch_size` ([[start_bs, end_bs, K], ...], K = 0
meaning no drafts at that batch size) that follows the best k as load rises.

The static k minimises the load-weighted relative latency L_SD/L_D, weighting each
percentile by the share of time the load spends up to it (p50: 0.50, p95: 0.45, p99: 0.05),
among the k that stay valid at every percentile and do not make p99 slower than no SD (a
tail regression is the failure operators notice). The schedule maps the model's mean number
of requests in flight B = λ·L (Little's law) to the best k at that load; vLLM caps its batch
at max_num_seqs, so where the model would switch SD off beyond that cap the schedule cannot
express it and the advice says so.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import numpy as np

from specwatch.model import uncertainty, validity
from specwatch.model.closed_form import (
    BreakEvenKind,
    Reason,
    breakeven,
    latency,
    optimal_draft_length,
)
from specwatch.model.schedule import (
    SCHEDULE_GRID,
    Workload,
    batch_schedule,
    best_path,
    schedule_k,
)
from specwatch.model.whatif import common
from specwatch.model.whatif.predict import KIND_NAMES

PERCENTILES = ("p50", "p95", "p99")
# Share of time the load spends up to each percentile (the top 1% goes with p99).
WEIGHTS = np.array([0.50, 0.45, 0.05])
EMPTY: dict[str, Any] = {"enable": None, "draft_length": None, "schedule": None}
DEFAULT_MIN_GAIN = 1.1
DEFAULT_PREFILL_RATIO = 4.0


@dataclass(frozen=True)
class Traffic:
    """Load and workload measured elsewhere (``advise --prometheus``, issue 16), in place of
    the typed flags: the core stays pure (no I/O); the reader lives in the calibrate layer."""

    arrival_rates: dict[str, float]  # p50, p95, p99 (req/s)
    prompt_tokens: float
    generation_tokens: float
    prompt_tokens_p95: float | None = None
    generation_tokens_p95: float | None = None
    #: Per-position acceptance (P(first i+1 drafts accepted)); None: use the flags/file.
    acceptance_profile: tuple[float, ...] | None = None
    #: Largest requests-in-flight batch seen (peak vllm:num_requests_running).
    peak_batch: float | None = None
    source: str = ""


def add_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """The options; ``required=False`` when another source (Prometheus) fills the load."""
    common.add_params_argument(parser)
    for q in PERCENTILES:
        parser.add_argument(f"--arrival-rate-{q}", type=float, required=required, metavar="R",
                            help=f"arrival rate at the {q} of your load (req/s)")
    acc = parser.add_mutually_exclusive_group()
    acc.add_argument("--alpha", type=float, metavar="A",
                     help="per-token acceptance probability of the i.i.d. model, in [0, 1)")
    acc.add_argument("--acceptance-length", type=float, metavar="E",
                     help="measured tokens per verify cycle at --draft-length")
    parser.add_argument("--draft-length", type=float, metavar="K",
                        help="the k --acceptance-length was measured at")
    if required:
        common.add_length_arguments(parser)
    else:
        parser.add_argument("--prompt-tokens", type=float, metavar="P",
                            help="mean prompt tokens per request")
        parser.add_argument("--generation-tokens", type=float, metavar="G",
                            help="mean generated tokens per request")
    parser.add_argument("--min-gain", type=float, default=DEFAULT_MIN_GAIN, metavar="X",
                        help="recommend SD only at or above this load-weighted predicted "
                             f"speedup (default {DEFAULT_MIN_GAIN:g})")
    common.add_interval_argument(parser)
    common.add_k_max_argument(parser)
    parser.add_argument("--max-num-seqs", type=int, default=256, metavar="N",
                        help="vLLM max_num_seqs: the schedule's last range ends here "
                             "(default 256)")
    common.add_json_argument(parser)


def compute(args: argparse.Namespace, traffic: Traffic | None = None) -> dict[str, Any]:
    """The advice; ``traffic`` (measured load) replaces the rate and length flags."""
    params = common.load(args)
    if traffic is not None:
        rates = dict(traffic.arrival_rates)
        args.prompt_tokens = traffic.prompt_tokens
        args.generation_tokens = traffic.generation_tokens
    else:
        for flag in ("prompt_tokens", "generation_tokens",
                     *(f"arrival_rate_{q}" for q in PERCENTILES)):
            if getattr(args, flag, None) is None:
                raise common.InputError(f"--{flag.replace('_', '-')}: required (or read the "
                                        "load from --prometheus URL)")
        rates = {
            q: common.finite_nonnegative(f"--arrival-rate-{q}",
                                         getattr(args, f"arrival_rate_{q}"))
            for q in PERCENTILES
        }
    min_gain = getattr(args, "min_gain", DEFAULT_MIN_GAIN)
    if not (np.isfinite(min_gain) and min_gain > 0):
        raise common.InputError(f"--min-gain: expected a positive number, got {min_gain}")
    if not rates["p50"] <= rates["p95"] <= rates["p99"]:
        raise common.InputError(
            "--arrival-rate-p95: percentiles must not decrease: expected p50 <= p95 <= p99, "
            f"got {rates['p50']:g}, {rates['p95']:g}, {rates['p99']:g}"
        )
    p = common.finite_nonnegative("--prompt-tokens", args.prompt_tokens)
    g = common.finite_nonnegative("--generation-tokens", args.generation_tokens)
    if args.max_num_seqs < 1:
        raise common.InputError(
            f"--max-num-seqs: expected an integer >= 1, got {args.max_num_seqs}"
        )
    k_meas = None
    if args.draft_length is not None:
        k_meas = common.finite_nonnegative("--draft-length", args.draft_length)
    if traffic is not None and traffic.acceptance_profile:
        acc = common.Acceptance("measured profile", None, traffic.acceptance_profile)
    else:
        acc = common.acceptance_from(args, params, k_meas)
    ceiling = common.ceiling_of(args, params)
    k_max = common.k_max_of(args, params)
    if acc.profile is not None:
        k_max = min(k_max, len(acc.profile))
    model = params.model()

    lam = np.array([rates[q] for q in PERCENTILES])
    ks = np.arange(1, k_max + 1, dtype=float)
    es = acc.length(ks)
    limit = common.halfwidth_of(args, params)
    # Every k at every percentile judged as predict judges it: a k whose prediction is
    # declined (sensitive, beyond the calibrated load, at a measured ceiling) is not advised.
    judged_grid = validity.assess(params, lam[:, None], ks[None, :], es[None, :], p, g,
                                  max_utilization=ceiling, max_halfwidth=limit)
    grid = judged_grid.prediction
    grid_valid = judged_grid.valid
    best = optimal_draft_length(model, lam, p=p, g=g, k_max=k_max, max_utilization=ceiling,
                                **acc.optimal_kwargs())
    best_ok = best.valid & validity.vouched(
        params, lam, best.k, acc.length(np.maximum(best.k, 0).astype(float)), p, g,
        max_utilization=ceiling, max_halfwidth=limit)
    nosd = grid.nosd
    for i, q in enumerate(PERCENTILES):
        if not bool(best.valid[i]):
            util = float(nosd.utilization[i, 0])
            raise common.InputError(
                f"--arrival-rate-{q}: {rates[q]:g} req/s leaves no valid operating point with "
                f"or without SD (no-SD utilisation λ·C2 = {util:.3g}, ceiling {ceiling:g}): "
                "this is a capacity problem SD cannot fix; add replicas"
            )

    # Static k: the lowest load-weighted relative latency among the k valid at every
    # percentile that do not make p99 slower than no SD; SD off (relative latency 1) unless
    # some k beats it.
    s = np.where(grid_valid, grid.speedup, np.nan)
    eligible = np.all(grid_valid, axis=0) & (s[2] >= 1.0)
    # The k the model alone would have let compete, left out because a prediction of theirs
    # is declined: the advice names them and why.
    model_s = np.where(grid.valid, grid.speedup, np.nan)
    declined_ks = {
        int(ks[j]): sorted({r for i in range(lam.size) if not grid_valid[i, j]
                            for r in judged_grid.names((i, j))})
        for j in np.flatnonzero(np.all(grid.valid, axis=0) & (model_s[2] >= 1.0) & ~eligible)
    }
    with np.errstate(invalid="ignore", divide="ignore"):
        relative = WEIGHTS @ np.where(eligible[None, :], 1.0 / s, np.inf)
    static_k = 0
    if eligible.any() and float(np.min(relative)) < 1.0:
        static_k = int(ks[int(np.argmin(relative))])
    below_min_gain = None
    if static_k and 1.0 / float(relative[static_k - 1]) < min_gain:
        below_min_gain = (static_k, 1.0 / float(relative[static_k - 1]))
        static_k = 0
    sched = batch_schedule(model, _workload(acc, p, g, k_max, ceiling), args.max_num_seqs)
    schedule, b_off = sched.ranges, sched.sd_off_above_batch_size
    num_tokens = max(r[2] for r in schedule)
    peak = None
    sized_by_peak = False
    prefill_ratio = getattr(args, "prefill_ratio", DEFAULT_PREFILL_RATIO)
    if traffic is not None and traffic.peak_batch is not None:
        peak = _peak(model, acc, p, g, k_max, ceiling, traffic.peak_batch, ks, es)
        if g > 0 and p / g >= prefill_ratio and peak["valid"]:
            # Prefill-heavy: the batch swings with long prompts; size by the peak batch.
            sized_by_peak = True
            k_peak = int(peak["optimal_draft_length"])
            static_k = k_peak if k_peak and peak["optimal_speedup"] >= min_gain else 0
            if static_k and not bool(np.all(grid_valid[:, static_k - 1])):
                static_k = 0

    per_q: dict[str, Any] = {}
    for i, q in enumerate(PERCENTILES):
        j = static_k - 1
        per_q[q] = {
            "arrival_rate": rates[q],
            "latency_nosd_s": float(nosd.latency[i, 0]) if bool(nosd.valid[i, 0]) else None,
            "latency_sd_s": float(grid.sd.latency[i, j]) if static_k and bool(grid_valid[i, j])
            else None,
            "speedup": float(s[i, j]) if static_k else 1.0,
            "optimal_draft_length": int(best.k[i]) if bool(best_ok[i]) else None,
            "optimal_speedup": float(best.speedup[i]) if bool(best_ok[i]) else None,
            "utilization": float(grid.sd.utilization[i, j]) if static_k
            else float(nosd.utilization[i, 0]),
            "valid": bool(grid_valid[i, j]) if static_k else bool(nosd.valid[i, 0]),
        }
        lat = per_q[q]["latency_sd_s"] if static_k else per_q[q]["latency_nosd_s"]
        # Requests in flight at this load (Little's law) and the schedule's k for it.
        per_q[q]["batch_size"] = rates[q] * lat if lat is not None else None
        per_q[q]["schedule_draft_length"] = (
            schedule_k(schedule, per_q[q]["batch_size"]) if lat is not None else None)
    # The 90% intervals of the advised configuration at each percentile (the fit's residual
    # spread through the fixed point): the advice says when a speedup's interval straddles 1.
    k_adv = float(static_k)
    judged = validity.assess(params, lam, k_adv, float(es[static_k - 1]) if static_k else 1.0,
                             p, g, max_utilization=ceiling, max_halfwidth=limit)
    for i, q in enumerate(PERCENTILES):
        iv = judged.intervals
        item = per_q[q]
        item["validity_reasons"] = [r for r in judged.names(i)
                                    if r != validity.NO_CALIBRATED_RANGE]
        item["latency_interval"] = item["speedup_interval"] = None
        if iv is not None and static_k and item["valid"]:
            item["latency_interval"] = uncertainty.as_pair(iv.latency_sd[0][i],
                                                           iv.latency_sd[1][i])
            item["speedup_interval"] = uncertainty.as_pair(iv.speedup[0][i], iv.speedup[1][i])
    off_rate = None
    be_kind = None
    be_iv = None
    if static_k:
        be = breakeven(model, static_k, float(es[static_k - 1]), p, g)
        be_kind = KIND_NAMES[int(be.kind)]
        if int(be.kind) == BreakEvenKind.PAYS_BELOW:
            off_rate = float(be.rate)
            if params.uncertainty is not None:
                be_iv = uncertainty.breakeven_interval(model, params.uncertainty, k_adv,
                                                       float(es[static_k - 1]), p, g, off_rate)

    # The arrival rate from which the best choice is SD off (any k), if below saturation.
    nosd_c2 = float(latency(model, 1.0, 0, 1.0, p, g, max_utilization=1.0).utilization)
    lam_top = ceiling / nosd_c2 if nosd_c2 > 0 else 1000.0
    scan = np.linspace(0.0, lam_top, SCHEDULE_GRID)
    scan_best = optimal_draft_length(model, scan, p=p, g=g, k_max=k_max,
                                     max_utilization=ceiling, **acc.optimal_kwargs())
    on = scan_best.valid & (scan_best.k > 0)
    any_off_rate = None
    if on.any() and int(np.flatnonzero(on)[-1]) + 1 < scan.size:
        any_off_rate = float(scan[int(np.flatnonzero(on)[-1]) + 1])
    elif not on.any():
        any_off_rate = 0.0

    out = {
        "system": params.system,
        "acceptance_source": acc.source,
        "alpha": acc.alpha,
        "prompt_tokens": p,
        "generation_tokens": g,
        "max_utilization": ceiling,
        "enable": static_k > 0,
        "draft_length": static_k,
        "load_weighted_speedup": float(1.0 / relative[static_k - 1]) if static_k else 1.0,
        "num_speculative_tokens": num_tokens,
        "schedule": schedule,
        "sd_off_above_batch_size": b_off,
        "max_num_seqs": args.max_num_seqs,
        "percentiles": per_q,
        "breakeven_arrival_rate": off_rate,
        "breakeven_interval": list(be_iv) if be_iv is not None else None,
        "breakeven_kind": be_kind,
        "sd_off_above_arrival_rate": any_off_rate,
        "min_gain": min_gain,
        "declined_draft_lengths": {str(k): r for k, r in declined_ks.items()},
        "below_min_gain": None if below_min_gain is None else {
            "draft_length": below_min_gain[0], "load_weighted_speedup": below_min_gain[1]},
        "peak": peak,
        "sized_by_peak_batch": sized_by_peak,
        "prefill_ratio": prefill_ratio,
        "traffic": None if traffic is None else {
            "source": traffic.source, "prompt_tokens_p95": traffic.prompt_tokens_p95,
            "generation_tokens_p95": traffic.generation_tokens_p95,
            "peak_batch": traffic.peak_batch,
            "acceptance_profile": traffic.acceptance_profile},
        "valid": True,
        "calibrated_range": (params.calibrated_range.to_mapping()
                             if params.calibrated_range is not None else None),
        # The loads advised on, judged against the calibrated range (empty: all inside).
        "validity_reasons": sorted({
            r for q, lam in rates.items()
            for r in validity.range_reasons(params.calibrated_range, lam, None, static_k)
        }) or ([validity.NO_CALIBRATED_RANGE] if params.calibrated_range is None else []),
    }
    if static_k:
        out["load_weighted_speedup"] = float(
            WEIGHTS @ (1.0 / np.where(grid_valid[:, static_k - 1], s[:, static_k - 1], np.inf))
        ) ** -1 if bool(np.all(grid_valid[:, static_k - 1])) else None
    out["advice"] = advice_lines(out)
    return out


def _workload(acc: common.Acceptance, p: float, g: float, k_max: int,
              ceiling: float) -> Workload:
    return Workload(p, g, k_max, ceiling, alpha=acc.alpha if acc.profile is None else None,
                    profile=acc.profile)


def _peak(model: Any, acc: common.Acceptance, p: float, g: float, k_max: int,
          ceiling: float, peak_batch: float, ks: np.ndarray, es: np.ndarray) -> dict[str, Any]:
    """The decision at the peak batch: the arrival rate whose best-path requests in flight
    λ·L equal it (Little's law), and the best k and speedup there."""
    path = best_path(model, _workload(acc, p, g, k_max, ceiling))
    batch = path.batch
    out: dict[str, Any] = {"batch": peak_batch, "arrival_rate": None, "valid": False,
                           "optimal_draft_length": None, "optimal_speedup": None}
    if not batch.size or peak_batch > float(batch.max()):
        out["reason"] = (f"a batch of {peak_batch:g} requests in flight is past the model's "
                         f"validity ceiling {ceiling:g} (largest valid batch "
                         f"{float(batch.max()) if batch.size else 0:.3g})")
        return out
    lam = float(np.interp(peak_batch, batch, path.arrival_rates))
    best = optimal_draft_length(model, np.array([lam]), p=p, g=g, k_max=k_max,
                                max_utilization=ceiling, **acc.optimal_kwargs())
    out.update(arrival_rate=lam, valid=bool(best.valid[0]),
               optimal_draft_length=int(best.k[0]), optimal_speedup=float(best.speedup[0]))
    return out


def _gain(item: dict[str, Any]) -> str:
    s = item["speedup"]
    if item["latency_sd_s"] is None or item["latency_nosd_s"] is None:
        return "no valid prediction"
    change = (1.0 - 1.0 / s) * 100.0
    verb = "lower" if change >= 0 else "higher"
    return (f"{item['latency_nosd_s']:.3g} s → {item['latency_sd_s']:.3g} s mean latency "
            f"({s:.2f}x, {abs(change):.0f}% {verb})")


def advice_lines(out: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    k = out["draft_length"]
    pq = out["percentiles"]
    if k:
        lines.append(
            f"Enable speculative decoding with k = {k} (num_speculative_tokens={k}): "
            f"{out['load_weighted_speedup']:.2f}x load-weighted speedup."
        )
        for q in PERCENTILES:
            lines.append(f"  at {q} load ({pq[q]['arrival_rate']:g} req/s): {_gain(pq[q])}")
            iv = pq[q].get("speedup_interval")
            if iv is not None:
                lo, hi = iv
                straddles = lo is not None and lo < 1.0 and (hi is None or hi > 1.0)
                lines.append(
                    f"    90% interval of the speedup: {lo:.2f}x–"
                    f"{'∞' if hi is None else format(hi, '.2f')}x"
                    + (": it straddles 1, so the data cannot tell whether SD helps or hurts"
                       " at this load" if straddles else ""))
        if out["breakeven_arrival_rate"] is not None:
            biv = out.get("breakeven_interval")
            lines.append(
                f"With k = {k}, SD stops paying above {out['breakeven_arrival_rate']:.3g} req/s"
                + (f" (90% interval {biv[0]:.3g}–{biv[1]:.3g})" if biv else "")
                + ": above that arrival rate turn it off (or use the schedule below)."
            )
        elif out["breakeven_kind"] == "pays_everywhere":
            lines.append(f"With k = {k}, SD pays at every load below saturation.")
    else:
        best50 = pq["p50"]["optimal_draft_length"]
        below = out.get("below_min_gain")
        if below is not None:
            lines.append(
                f"Keep speculative decoding off: the best static k = {below['draft_length']} "
                f"gains only {below['load_weighted_speedup']:.2f}x load-weighted, below "
                f"--min-gain {out['min_gain']:g}x."
            )
        elif out.get("declined_draft_lengths"):
            named = "; ".join(f"k = {k}: {', '.join(r)}"
                              for k, r in out["declined_draft_lengths"].items())
            lines.append(
                "Keep speculative decoding off for now: no draft length's prediction is vouched "
                f"for at every percentile ({named}); re-calibrate with runs at these loads."
            )
        elif best50 == 0:
            lines.append("Keep speculative decoding off: at your p50 load no draft length beats "
                         "plain decoding.")
        else:
            lines.append(
                "No single draft length helps at p50 without slowing down p99: keep SD off, or "
                "use the batch-size schedule below so drafting stops as the batch grows."
            )
    peak = out.get("peak")
    if peak is not None:
        if peak["valid"]:
            lines.append(
                f"At the peak batch ({peak['batch']:g} requests in flight, ≈ "
                f"{peak['arrival_rate']:.3g} req/s): best k = {peak['optimal_draft_length']}, "
                f"{peak['optimal_speedup']:.2f}x predicted."
            )
        else:
            lines.append(f"At the peak batch: no valid prediction ({peak['reason']}).")
    if out.get("sized_by_peak_batch"):
        lines.append(
            f"Prefill-heavy traffic (prompt/generation = "
            f"{out['prompt_tokens'] / out['generation_tokens']:.1f} >= "
            f"{out['prefill_ratio']:g}): the decision is sized by the peak batch, not the "
            "mean load."
        )
    if out["sd_off_above_arrival_rate"] is not None and out["sd_off_above_arrival_rate"] > 0:
        lines.append(f"Whatever k: above {out['sd_off_above_arrival_rate']:.3g} req/s the best "
                     "choice is SD off.")
    if out["num_speculative_tokens"] > 0:
        sched = ", ".join(f"[{a}, {b}, {c}]" for a, b, c in out["schedule"])
        lines.append(
            "Batch-size schedule for vLLM (speculative config, batch size = requests in "
            f'flight B = λ·L): "num_speculative_tokens": {out["num_speculative_tokens"]}, '
            f'"num_speculative_tokens_per_batch_size": [{sched}]'
        )
        b_off = out["sd_off_above_batch_size"]
        if b_off is not None and b_off > out["max_num_seqs"]:
            lines.append(
                f"  Caution: the model turns SD off only at B ≈ {b_off:.0f} requests in flight, "
                f"beyond max_num_seqs = {out['max_num_seqs']}; vLLM queues the rest, so a "
                "batch-size schedule cannot express it: switch on the arrival rate instead "
                "(specwatch controller)."
            )
    return lines


def render(out: dict[str, Any]) -> None:
    f = common.fmt
    rows = []
    for q in PERCENTILES:
        item = out["percentiles"][q]
        rows.append([q, f(item["arrival_rate"], ".4g"), f(item["latency_nosd_s"], ".3f"),
                     f(item["latency_sd_s"], ".3f"), f(item["speedup"], ".3f"),
                     "—" if item["optimal_draft_length"] is None
                     else str(item["optimal_draft_length"]),
                     f(item["optimal_speedup"], ".3f")])
    k = out["draft_length"]
    title = (f"specwatch advise · {out['system']} · p = {f(out['prompt_tokens'])}, "
             f"g = {f(out['generation_tokens'])}")
    common.render_table(
        title,
        ["load", "λ (req/s)", "L no SD (s)", f"L k={k} (s)" if k else "L SD (s)",
         "speedup", "best k here", "best S here"],
        rows,
        ["", *out["advice"]],
    )


def run(args: argparse.Namespace) -> int:
    def body() -> int:
        out = compute(args)
        if args.json:
            common.print_json(out)
        else:
            render(out)
        return 0

    return common.run_guarded(args, body, EMPTY)


__all__ = ["Reason", "add_arguments", "run"]
