"""vLLM's v1 engine, 0.8.3 to 0.33: the names of ``vllm/v1/metrics/loggers.py`` and
``vllm/v1/spec_decode/metrics.py``.

What it gives: drafts, draft tokens, accepted tokens, accepted tokens per position (so the
configured k is the number of ``position`` series), finished requests, the e2e latency,
prompt, generation and TTFT histograms, inter-token latency (0.10 and later), and the KV
cache each engine states in ``vllm:cache_config_info``: everything specwatch derives.
0.8.3 and 0.8.4 have draft and accepted tokens only (no drafts counter, no per-position):
acceptance rate only among the SD signals. The page is recognised by its ``vllm:`` names;
a page with vLLM v0's interval gauges and no drafts counter is v0's
(:mod:`specwatch.engines.vllm_v0`).
"""

from __future__ import annotations

from collections.abc import Mapping

from specwatch.engines import base
from specwatch.engines.base import CacheInfo, Capabilities, Engine, Histogram, KvCache
from specwatch.engines.registry import register

PREFIX = "vllm:"

#: Sample name -> canonical counter.
COUNTERS: dict[str, str] = {
    "vllm:spec_decode_num_drafts_total": base.DRAFTS,
    "vllm:spec_decode_num_draft_tokens_total": base.DRAFT_TOKENS,
    "vllm:spec_decode_num_accepted_tokens_total": base.ACCEPTED_TOKENS,
    "vllm:spec_decode_num_accepted_tokens_per_pos_total": base.ACCEPTED_PER_POSITION,
    "vllm:request_success_total": base.REQUESTS_FINISHED,
    "vllm:generation_tokens_total": base.GENERATION_TOKENS,
    "vllm:prompt_tokens_total": base.PROMPT_TOKENS,
    "vllm:e2e_request_latency_seconds_sum": base.E2E_LATENCY_SUM,
    "vllm:e2e_request_latency_seconds_count": base.E2E_LATENCY_COUNT,
    "vllm:request_prompt_tokens_sum": base.PROMPT_LEN_SUM,
    "vllm:request_prompt_tokens_count": base.PROMPT_LEN_COUNT,
    "vllm:request_generation_tokens_sum": base.GENERATION_LEN_SUM,
    "vllm:request_generation_tokens_count": base.GENERATION_LEN_COUNT,
    "vllm:time_to_first_token_seconds_sum": base.TTFT_SUM,
    "vllm:time_to_first_token_seconds_count": base.TTFT_COUNT,
    "vllm:e2e_request_latency_seconds_bucket": base.E2E_LATENCY_BUCKET,
    "vllm:time_to_first_token_seconds_bucket": base.TTFT_BUCKET,
    "vllm:inter_token_latency_seconds_bucket": base.ITL_BUCKET,
}
GAUGES: dict[str, str] = {
    "vllm:num_requests_running": base.RUNNING,
    "vllm:num_requests_waiting": base.WAITING,
}
#: ``vllm:cache_config_info``: the engine's CacheConfig as labels, value 1, no ``model_name``.
CACHE_CONFIG_INFO = "vllm:cache_config_info"
#: Its labels read: each engine's KV-cache size in tokens (vLLM >= 0.32 writes it; before,
#: blocks x block size gives it), and the engine index that tells data-parallel engines apart.
CACHE_CONFIG_LABELS = ("engine", "kv_cache_size_tokens", "num_gpu_blocks", "block_size")
#: The counters vLLM registers only with --speculative-config.
SD_COUNTERS = frozenset({base.DRAFTS, base.DRAFT_TOKENS, base.ACCEPTED_TOKENS,
                         base.ACCEPTED_PER_POSITION})

#: Read by the dashboards only; vLLM before 0.11 wrote the KV-cache usage and the time per
#: output token under older names (vLLM's v1 metrics migration renamed them), read as a
#: fallback.
SHOWN = frozenset({
    "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:num_preemptions_total",
    *(f"{family}_{suffix}" for family in (
        "vllm:request_queue_time_seconds", "vllm:request_time_per_output_token_seconds",
        "vllm:time_per_output_token_seconds") for suffix in ("bucket", "count", "sum")),
    "vllm:inter_token_latency_seconds_count", "vllm:inter_token_latency_seconds_sum",
})

#: Bucket upper bounds (vLLM 0.32, ``vllm/v1/metrics/loggers.py``; the recorded pages).
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)


def kv_cache(labels: Mapping[str, str]) -> KvCache:
    """(tokens, blocks, block size) one engine states in its cache_config_info labels;
    tokens is ``kv_cache_size_tokens``, else ``num_gpu_blocks`` x ``block_size`` (older
    vLLM); None where not stated."""
    blocks = base.label_number(labels, "num_gpu_blocks")
    size = base.label_number(labels, "block_size")
    tokens = base.label_number(labels, "kv_cache_size_tokens")
    if tokens is None and blocks is not None and size is not None:
        tokens = blocks * size
    return tokens, blocks, size


CACHE_INFO = CacheInfo(labels=CACHE_CONFIG_LABELS, state=kv_cache)

ENGINE = register(Engine(
    kind="vllm", family="vllm", versions="0.8.3 to 0.33", prefix=PREFIX, order=20,
    counters=COUNTERS, gauges=GAUGES, infos={CACHE_CONFIG_INFO: CACHE_INFO},
    sd_counters=SD_COUNTERS, shown=SHOWN,
    capabilities=Capabilities(
        per_position=True, configured_k="positions", acceptance_length=True, kv_capacity=True,
        acceptance=base.BY_TOKENS, histograms=(
            Histogram(base.E2E_LATENCY_BUCKET, "vllm:e2e_request_latency_seconds", E2E_BUCKETS),
            Histogram(base.TTFT_BUCKET, "vllm:time_to_first_token_seconds", TTFT_BUCKETS),
            Histogram(base.ITL_BUCKET, "vllm:inter_token_latency_seconds", ITL_BUCKETS),
        )),
))
