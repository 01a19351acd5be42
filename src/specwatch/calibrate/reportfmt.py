"""Text forms of a fit's figures shared by the terminal tables and the Markdown report.

Coefficient order, draft-length and rate labels, exclusion reasons grouped by kind, short and
compacted point sources, and the one-line user-path summary. Pure string formatting.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "PARAMS_ORDER",
    "compact_sources",
    "k_label",
    "or_na",
    "rate_text",
    "reason_kind",
    "short_source",
    "user_path_line",
]

#: Coefficients in the order the model reference lists them (params file order).
PARAMS_ORDER = ("a_p", "b_p", "a_v", "b_v", "a_d", "b_d")


def k_label(k: float) -> str:
    return f"{k:g}"


def rate_text(rate: float) -> str:
    if math.isnan(rate):
        return "n/a"
    if math.isinf(rate):
        return "∞"
    return f"{rate:.2f}"


def figure_cells(d: Any) -> tuple[str, str, str]:
    """A draft length's break-even, SD ceiling and range-reason cells for the report tables
    (`DraftLengthSummary`): a break-even only where the speedup crosses 1 ('none' otherwise:
    the kind says why), the ceiling with its source."""
    crossing = d.breakeven_kind in ("pays_below", "pays_above")
    be = rate_text(d.breakeven_arrival_rate) if crossing else "none"
    cap = d.sd_ceiling_arrival_rate
    ceiling = "n/a" if math.isnan(cap) else f"{rate_text(cap)} ({d.sd_ceiling_source})"
    notes = [f"{name}: {', '.join(r)}" for name, r in
             (("λ*", d.breakeven_reasons if crossing else ()),
              ("ceiling", d.sd_ceiling_reasons)) if r]
    return be, ceiling, "; ".join(notes) or "-"


def or_na(x: float | None, spec: str) -> str:
    """A figure in `spec`, or "n/a" where there is none."""
    return "n/a" if x is None else format(x, spec)


def user_path_line(sm: Mapping[str, Any]) -> str:
    """One line of the user-path figures: valid share (of each run's own latency, and of the
    whole prediction, speedup included), MAPE over the valid runs, confident
    misses, interval coverage and width, declined runs by reason, the batch-path MAPE."""
    def pct(x: float | None, spec: str = ".1%") -> str:
        return or_na(x, spec)
    declined = ", ".join(f"{n} {r}" for r, n in sm["declined"].items()) or "none"
    whole = sm.get("speedup_valid")
    speedup = "" if whole is None else f", {whole} with the speedup (both systems)"
    return (f"{sm['valid']}/{sm['runs']} valid latencies ({pct(sm['valid_share'], '.0%')})"
            f"{speedup}; MAPE over"
            f" the valid {pct(sm['mape_valid'], '.2%')}, max {pct(sm['max_error_valid'])};"
            f" valid but off by > 15%: {len(sm['valid_off_by_more_than_15pct'])}"
            f"{_transient_wrong(sm)}; 90%"
            f" interval holds the measured latency for {pct(sm['interval_coverage'])}, median"
            f" ±{pct(sm['median_interval_halfwidth'], '.2%')}; declined: {declined};"
            f" batch-path MAPE {pct(sm['batch_path_mape'], '.2%')}"
            + (f"; transient runs: {sm['transient_runs']}" if sm.get("transient_runs") else ""))


def _transient_wrong(sm: Mapping[str, Any]) -> str:
    n = sum(bool(w.get("transient")) for w in sm["valid_off_by_more_than_15pct"])
    return f" ({n} of them transient)" if n else ""


def reason_kind(reason: str) -> str:
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


def compact_sources(sources: Sequence[str], limit: int = 8) -> str:
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


def short_source(source: str) -> str:
    """ "path/to/file.csv row 12" -> "file.csv row 12" (the full path is in --json)."""
    head, sep, tail = source.partition(" ")
    if "/" in head and not head.startswith("http"):
        head = head.rsplit("/", 1)[-1]
    return f"{head}{sep}{tail}"
