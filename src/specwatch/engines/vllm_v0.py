"""vLLM's v0 engine, up to 0.9.2: the names of ``vllm/engine/metrics.py``.

What it gives: draft, accepted and emitted token counters and two interval gauges (its own
acceptance rate and efficiency), no drafts counter, no per-position counter, no ``engine``
label. Acceptance rate is derived (v0 counts every token the verifier accepted, even after a
rejected prefix, so it reads a little higher than v1's); acceptance length, draft length,
α and per-position are absent, and so is the configured k. Its names are v1's
(:mod:`specwatch.engines.vllm_v1`) less the drafts and per-position counters and
inter-token latency, plus the emitted tokens and the two gauges; a target with
``engine: vllm`` reads both. A ``vllm:`` page with an emitted-tokens counter or an interval
gauge and no drafts counter is v0's.
"""

from __future__ import annotations

from specwatch.engines import base, vllm_v1
from specwatch.engines.base import Capabilities, Engine, Histogram, PageView
from specwatch.engines.registry import register

_V1_ONLY = frozenset({base.DRAFTS, base.ACCEPTED_PER_POSITION, base.ITL_BUCKET})
COUNTERS: dict[str, str] = {
    **{name: sig for name, sig in vllm_v1.COUNTERS.items() if sig not in _V1_ONLY},
    "vllm:spec_decode_num_emitted_tokens_total": base.EMITTED_TOKENS,
}
GAUGES: dict[str, str] = {
    **vllm_v1.GAUGES,
    "vllm:spec_decode_draft_acceptance_rate": base.INTERVAL_ACCEPTANCE_RATE,
    "vllm:spec_decode_efficiency": base.INTERVAL_EFFICIENCY,
}
#: What only v0 writes: with one of them and no drafts counter, a ``vllm:`` page is v0's.
V0_SIGNALS = frozenset({base.EMITTED_TOKENS, base.INTERVAL_ACCEPTANCE_RATE,
                        base.INTERVAL_EFFICIENCY})


class VllmV0(Engine):
    def recognises(self, page: PageView) -> bool:
        return (page.saw(self.prefix) and bool(V0_SIGNALS & page.signals)
                and base.DRAFTS not in page.signals)


ENGINE = register(VllmV0(
    kind="vllm-v0", family="vllm", versions="0.5 to 0.9.2", prefix=vllm_v1.PREFIX, order=10,
    counters=COUNTERS, gauges=GAUGES,
    infos={vllm_v1.CACHE_CONFIG_INFO: vllm_v1.CACHE_INFO},
    max_gauges=frozenset({base.INTERVAL_ACCEPTANCE_RATE, base.INTERVAL_EFFICIENCY}),
    sd_counters=frozenset({base.DRAFT_TOKENS, base.ACCEPTED_TOKENS, base.EMITTED_TOKENS}),
    shown=frozenset({"vllm:gpu_cache_usage_perc", "vllm:num_preemptions_total",
                     *(f"vllm:time_per_output_token_seconds_{suffix}"
                       for suffix in ("bucket", "count", "sum"))}),
    # The bucket bounds grew across v0's releases (0.4's e2e histogram stops at 60 s).
    capabilities=Capabilities(
        per_position=False, configured_k=None, acceptance_length=False, kv_capacity=True,
        acceptance=base.BY_TOKENS, histograms=(
            Histogram(base.E2E_LATENCY_BUCKET, "vllm:e2e_request_latency_seconds", ()),
            Histogram(base.TTFT_BUCKET, "vllm:time_to_first_token_seconds", ()),
        )),
))
