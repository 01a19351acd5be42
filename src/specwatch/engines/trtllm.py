"""TensorRT-LLM's OpenAI server (trtllm-serve): the names of ``tensorrt_llm/metrics/
collector.py`` (``MetricsCollector``), served on ``/prometheus/metrics`` when
``return_perf_metrics`` is set (the version and files are cited in
``tests/fixtures/engines-constructed/README.md``).

What it gives: drafted and accepted tokens per position of each finished request (label
``token_position``, read as ``position``): their sums are the draft and accepted tokens,
position 0's drafted count the drafts; the configured k (``max_draft_len``, the
``spec_num_tokens`` label of ``speculative_config_info``); finished requests, generated and
prompt tokens, the e2e latency and TTFT histograms, running and waiting requests, and the KV
cache (``kv_cache_max_blocks`` x ``kv_cache_tokens_per_block``, with
``enable_iter_perf_stats``). So every acceptance signal is derived (rate, length, draft
length, α, per-position rates, heterogeneity), and arrival rate, batch size, mean latency and
the server's KV capacity. The per-request counters are read rather than the per-iteration
``spec_decode_num_*_tokens_total``: those count requests still running, the drafts and the
finished requests do not. What it cannot give: mean prompt and generated lengths (no length
histograms) and the inter-token latency histogram (it has time per output token). Its
counters are created on first use: their absence says nothing about SD being configured.
"""

from __future__ import annotations

from collections.abc import Mapping

from specwatch.engines import base
from specwatch.engines.base import Capabilities, Engine, Histogram, Reading
from specwatch.engines.registry import register

PREFIX = "trtllm_"
#: The engine's position label, read as the canonical ``position``.
POSITION = {"token_position": "position"}

COUNTERS: dict[str, str] = {
    "trtllm_request_success_total": base.REQUESTS_FINISHED,
    "trtllm_generation_tokens_total": base.GENERATION_TOKENS,
    "trtllm_prompt_tokens_total": base.PROMPT_TOKENS,
    "trtllm_e2e_request_latency_seconds_sum": base.E2E_LATENCY_SUM,
    "trtllm_e2e_request_latency_seconds_count": base.E2E_LATENCY_COUNT,
    "trtllm_time_to_first_token_seconds_sum": base.TTFT_SUM,
    "trtllm_time_to_first_token_seconds_count": base.TTFT_COUNT,
    "trtllm_e2e_request_latency_seconds_bucket": base.E2E_LATENCY_BUCKET,
    "trtllm_time_to_first_token_seconds_bucket": base.TTFT_BUCKET,
}
GAUGES: dict[str, str] = {
    "trtllm_num_requests_running": base.RUNNING,
    "trtllm_num_requests_waiting": base.WAITING,
    "trtllm_kv_cache_max_blocks": base.KV_CACHE_BLOCKS,
    "trtllm_kv_cache_tokens_per_block": base.KV_CACHE_BLOCK_SIZE,
}
READINGS: dict[str, tuple[Reading, ...]] = {
    "trtllm_spec_decode_drafted_tokens_total": (
        Reading(base.DRAFT_TOKENS),
        Reading(base.DRAFTS, where=(("token_position", base.FIRST_POSITION),)),
    ),
    "trtllm_spec_decode_accepted_tokens_total": (
        Reading(base.ACCEPTED_TOKENS),
        Reading(base.ACCEPTED_PER_POSITION, rename=POSITION),
    ),
    "trtllm_speculative_config_info": (
        Reading(base.SPEC_STEPS, value_label="spec_num_tokens", gauge=True),
    ),
}
SD_COUNTERS = frozenset({base.DRAFTS, base.DRAFT_TOKENS, base.ACCEPTED_TOKENS,
                         base.ACCEPTED_PER_POSITION})

#: Default bucket upper bounds of ``MetricsCollector`` (configurable per server).
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)


class TensorRTLLM(Engine):
    def sd_configured(self, sd_counters_present: bool, gauges: Mapping[str, float]
                      ) -> bool | None:
        """On when ``speculative_config_info`` states a draft length or a spec-decode
        counter is on the page; None otherwise (the info series is written only with a
        speculative config, and the counters only once used)."""
        steps = gauges.get(base.SPEC_STEPS)
        if (steps is not None and steps >= 1) or sd_counters_present:
            return True
        return None


ENGINE = register(TensorRTLLM(
    kind="trtllm", family="trtllm", versions="trtllm-serve, MetricsCollector of 2026",
    prefix=PREFIX, order=40, counters=COUNTERS, gauges=GAUGES, readings=READINGS,
    max_gauges=frozenset({base.SPEC_STEPS, base.KV_CACHE_BLOCKS, base.KV_CACHE_BLOCK_SIZE}),
    sd_counters=SD_COUNTERS,
    capabilities=Capabilities(
        per_position=True, configured_k="gauge", acceptance_length=True, kv_capacity=True,
        acceptance=base.BY_TOKENS, histograms=(
            Histogram(base.E2E_LATENCY_BUCKET, "trtllm_e2e_request_latency_seconds",
                      E2E_BUCKETS),
            Histogram(base.TTFT_BUCKET, "trtllm_time_to_first_token_seconds", TTFT_BUCKETS),
        )),
))
