"""The advice of :mod:`specwatch.model.whatif.advise` in words: the lines an operator reads
(enable or keep off, the gain at each load percentile, what bounds the decision, the vLLM
batch-size schedule) and the table `specwatch advise` prints.

Reads only the advice's JSON-ready dict, so the words and the numbers cannot disagree.
"""

from __future__ import annotations

import json
from typing import Any

from specwatch.model.whatif import common
from specwatch.model.whatif.predict import breakeven_interval_text, ceiling_text, range_caveat


def _gain(item: dict[str, Any]) -> str:
    s = item["speedup"]
    if item["latency_sd_s"] is None or item["latency_nosd_s"] is None:
        return "no valid prediction"
    change = (1.0 - 1.0 / s) * 100.0
    verb = "lower" if change >= 0 else "higher"
    return (f"{item['latency_nosd_s']:.3g} s → {item['latency_sd_s']:.3g} s mean latency "
            f"({s:.2f}x, {abs(change):.0f}% {verb})")


def advice_lines(out: dict[str, Any]) -> list[str]:
    """The advice in plain language: the decision, then what bounds it."""
    lines = _enable_lines(out) if out["draft_length"] else _keep_off_lines(out)
    return lines + _peak_lines(out) + _schedule_lines(out)


def _enable_lines(out: dict[str, Any]) -> list[str]:
    k = out["draft_length"]
    pq = out["percentiles"]
    lines = [
        f"Enable speculative decoding with k = {k} (num_speculative_tokens={k}): "
        f"{out['load_weighted_speedup']:.2f}x load-weighted speedup."
    ]
    for q, item in pq.items():
        lines.append(f"  at {q} load ({item['arrival_rate']:g} req/s): {_gain(item)}")
        iv = item.get("speedup_interval")
        if iv is not None:
            lo, hi = iv
            straddles = lo is not None and lo < 1.0 and (hi is None or hi > 1.0)
            lines.append(
                f"    90% interval of the speedup: {lo:.2f}x–"
                f"{'∞' if hi is None else format(hi, '.2f')}x"
                + (": it straddles 1, so the data cannot tell whether SD helps or hurts"
                   " at this load" if straddles else ""))
    cal = out.get("calibrated_range")
    caveat = range_caveat(out.get("breakeven_reasons") or [], cal)
    if out["breakeven_kind"] == "pays_below" and out["breakeven_arrival_rate"] is not None:
        biv = breakeven_interval_text(out.get("breakeven_interval"))
        lines.append(
            f"With k = {k}, the predicted speedup falls to 1 at "
            f"{out['breakeven_arrival_rate']:.3g} req/s (break-even"
            + (f", 90% interval {biv}" if biv else "") + ")" + caveat
            + ": above that arrival rate turn it off (or use the schedule below)."
        )
    elif out["breakeven_kind"] == "pays_everywhere":
        lines.append(f"With k = {k}, SD pays at every load below saturation.")
    elif out["breakeven_kind"] == "pays_to_ceiling":
        lines.append(f"With k = {k}, the predicted speedup stays above 1 up to SD's throughput "
                     "ceiling: no break-even below it.")
    ceiling = ceiling_text(out)
    if ceiling is not None:
        lines.append(f"SD's throughput ceiling at k = {k}: {ceiling}.")
    return lines


def _keep_off_lines(out: dict[str, Any]) -> list[str]:
    best50 = out["percentiles"]["p50"]["optimal_draft_length"]
    below = out.get("below_min_gain")
    if below is not None:
        return [
            f"Keep speculative decoding off: the best static k = {below['draft_length']} "
            f"gains only {below['load_weighted_speedup']:.2f}x load-weighted, below "
            f"--min-gain {out['min_gain']:g}x."
        ]
    if out.get("declined_draft_lengths"):
        named = "; ".join(f"k = {k}: {', '.join(r)}"
                          for k, r in out["declined_draft_lengths"].items())
        reasons = {r for rs in out["declined_draft_lengths"].values() for r in rs}
        todo = ("re-calibrate with runs at these loads" if reasons - {"above_utilization_ceiling"}
                else "these loads are past the model's validity ceiling (max_utilization), "
                "where it is not trusted: measure SD there (an A/B pair) before enabling it")
        return [
            "Keep speculative decoding off for now: no draft length's prediction is vouched "
            f"for at every percentile ({named}); {todo}."
        ]
    if best50 == 0:
        return ["Keep speculative decoding off: at your p50 load no draft length beats "
                "plain decoding."]
    return [
        "No single draft length helps at p50 without slowing down p99: keep SD off, or "
        "use the batch-size schedule below so drafting stops as the batch grows."
    ]


def _peak_lines(out: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    peak = out.get("peak")
    if peak is not None:
        if peak["valid"]:
            stand_in = peak.get("optimal_basis") == "best_vouched"
            lines.append(
                f"At the peak batch ({peak['batch']:g} requests in flight, ≈ "
                f"{peak['arrival_rate']:.3g} req/s): best k = {peak['optimal_draft_length']}, "
                f"{peak['optimal_speedup']:.2f}x predicted"
                + (f" ({peak['optimal_note']})." if stand_in else ".")
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
    return lines


def _other_engine_lines(forms: dict[str, Any] | None) -> list[str]:
    """The same schedule for SGLang and TensorRT-LLM (docs/whatif.md, "Configs the engines
    read")."""
    if not forms:
        return []
    sg = forms["sglang"]
    lines = [
        "The same schedule for SGLang (EAGLE/EAGLE3, --speculative-eagle-topk 1): "
        f"--speculative-adaptive --speculative-num-steps {sg['speculative_num_steps']} "
        "--speculative-adaptive-config FILE, FILE holding "
        + json.dumps(sg["speculative_adaptive_config"], separators=(",", ":"))]
    trt = forms["tensorrt_llm"]
    if trt is None:
        lines.append("TensorRT-LLM's draft_len_schedule cannot express it (its smallest batch "
                     "size must have the largest draft length).")
    else:
        pairs = ", ".join(f"{b}: {k}" for b, k in trt["draft_len_schedule"].items())
        lines.append(f"For TensorRT-LLM (speculative_config, PyTorch backend): max_draft_len: "
                     f"{trt['max_draft_len']}, draft_len_schedule: {{{pairs}}}")
    return lines


def _schedule_lines(out: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    if out["sd_off_above_arrival_rate"] is not None and out["sd_off_above_arrival_rate"] > 0:
        lines.append(f"Whatever k: above {out['sd_off_above_arrival_rate']:.3g} req/s the best "
                     "choice is SD off"
                     + range_caveat(out.get("sd_off_above_reasons") or [],
                                    out.get("calibrated_range")) + ".")
    if out["num_speculative_tokens"] > 0:
        sched = ", ".join(f"[{a}, {b}, {c}]" for a, b, c in out["schedule"])
        lines.append(
            "Batch-size schedule for vLLM (speculative config, batch size = requests in "
            f'flight B = λ·L): "num_speculative_tokens": {out["num_speculative_tokens"]}, '
            f'"num_speculative_tokens_per_batch_size": [{sched}]'
        )
        lines += _other_engine_lines(out.get("engine_forms"))
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
    for q, item in out["percentiles"].items():
        rows.append([q, f(item["arrival_rate"], ".4g"), f(item["latency_nosd_s"], ".3f"),
                     f(item["latency_sd_s"], ".3f"), f(item["speedup"], ".3f"),
                     "—" if item["optimal_draft_length"] is None
                     else str(item["optimal_draft_length"])
                     + ("*" if item.get("optimal_basis") == "best_vouched" else ""),
                     f(item["optimal_speedup"], ".3f")])
    k = out["draft_length"]
    title = (f"specwatch advise · {out['system']} · p = {f(out['prompt_tokens'])}, "
             f"g = {f(out['generation_tokens'])}")
    common.render_table(
        title,
        ["load", "λ (req/s)", "L no SD (s)", f"L k={k} (s)" if k else "L SD (s)",
         "speedup", "best k here", "best S here"],
        rows,
        ["", *out["advice"], *_best_notes(out)],
    )


def _best_notes(out: dict[str, Any]) -> list[str]:
    """A footnote per percentile whose best k is the best vouched one (marked *)."""
    return [f"* {q}: {item['optimal_note']}" for q, item in out["percentiles"].items()
            if item.get("optimal_basis") == "best_vouched"]
