"""The truth of a measured A/B pair from the two sides' own /metrics pages.

Deliberately simple and separate from specwatch (no specwatch import): the counters the
truth needs are summed over labels per page, and a phase's figures are the differences
between the page nearest its start (after it has settled) and the page nearest its end.
Used by tests/plugins/pairs/test_pairs_replay.py (a recorded pair) and tests/live/test_live_pair.py
(a live one).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.parser import text_string_to_metric_families

LAT = "vllm:e2e_request_latency_seconds"
ACC = "vllm:spec_decode_num_accepted_tokens_total"
TOK = "vllm:spec_decode_num_draft_tokens_total"
REQ = "vllm:request_success_total"

Pages = list[tuple[float, dict[str, float]]]


def counters(text: str) -> dict[str, float]:
    """Sums over labels of the few series the truth needs; e2e buckets as 'le=...' keys."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in (f"{LAT}_sum", f"{LAT}_count", ACC, TOK, REQ):
                out[s.name] = out.get(s.name, 0.0) + s.value
            elif s.name == f"{LAT}_bucket":
                key = f"le={float(s.labels['le'])}"
                out[key] = out.get(key, 0.0) + s.value
    return out


def at(pages: Pages, t: float) -> dict[str, float]:
    """The page nearest to time t."""
    return min(pages, key=lambda p: abs(p[0] - t))[1]


def label(edges: Sequence[float], x: float, top: str) -> str:
    """The bin label (``lo-hi``, the exporter's spelling) of x."""
    i = max(j for j, e in enumerate(edges) if x >= e)
    hi = f"{edges[i + 1]:g}" if i + 1 < len(edges) else top
    return f"{edges[i]:g}-{hi}"


def median_bucket(d: dict[str, float], side: str) -> float:
    """Upper bound of the bucket holding the median of one side's bucket increases."""
    prefix = f"{side}:le="
    buckets = {float(k[len(prefix):]): v for k, v in d.items() if k.startswith(prefix)}
    total = buckets[float("inf")]
    return next(b for b in sorted(buckets) if buckets[b] >= total / 2)


def truth(sides: dict[str, Pages], phases: Sequence[tuple[float, float]], settle: float,
          bins: Sequence[float], bands: Sequence[float]
          ) -> dict[tuple[str, str], dict[str, float]]:
    """Per (arrival-rate bin, acceptance band): the pooled counter increases of the phases
    whose steady part (``settle`` seconds after the start to the end; times as in
    ``sides``) falls in it, both sides (``sd:...``, ``base:...``), with ``speedup`` =
    baseline mean e2e latency / SD mean e2e latency, ``acceptance`` (SD) and ``rate``."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for start, end in phases:
        d: dict[str, float] = {}
        for s, pages in sides.items():
            a, b = at(pages, start + settle), at(pages, end)
            for k in b:
                d[f"{s}:{k}"] = b[k] - a.get(k, 0.0)
        rate = d[f"sd:{REQ}"] / (end - start - settle)
        acceptance = d[f"sd:{ACC}"] / d[f"sd:{TOK}"]
        key = (label(bins, rate, "+Inf"), label(bands, acceptance, "1"))
        pooled = out.setdefault(key, {})
        for k, v in d.items():
            pooled[k] = pooled.get(k, 0.0) + v
        pooled.setdefault("acceptance", acceptance)
        pooled.setdefault("rate", rate)
    for pooled in out.values():
        pooled["speedup"] = (pooled[f"base:{LAT}_sum"] / pooled[f"base:{LAT}_count"]) / \
            (pooled[f"sd:{LAT}_sum"] / pooled[f"sd:{LAT}_count"])
    return out
