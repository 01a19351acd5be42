"""SGLang 0.5.x: the names of ``sglang/srt/observability/metrics_collector.py``.

SGLang has no accepted or proposed token counters. The cumulative
``sglang:spec_verify_calls_total`` and ``sglang:generation_tokens_total`` give a windowed
acceptance length (:func:`specwatch.poll.formulas.verify_acceptance_length`); the configured
chain length comes from the ``sglang:spec_num_steps`` gauge and the proposed tokens per
verify call from ``sglang:spec_num_draft_tokens`` - 1. No per-position data, so no position
or heterogeneity signals; no KV-cache size stated. SGLang writes its scheduler gauges on every
tensor and pipeline rank (only rank 0 carries the replica's count) and serves through
prometheus_client's multi-process collector (no ``_created`` samples).
"""

from __future__ import annotations

from collections.abc import Mapping

from specwatch.engines import base
from specwatch.engines.base import Capabilities, Engine, Histogram
from specwatch.engines.registry import register

PREFIX = "sglang:"

COUNTERS: dict[str, str] = {
    "sglang:spec_verify_calls_total": base.VERIFY_CALLS,
    "sglang:generation_tokens_total": base.GENERATION_TOKENS,
    "sglang:prompt_tokens_total": base.PROMPT_TOKENS,
    "sglang:num_requests_total": base.REQUESTS_FINISHED,
    "sglang:e2e_request_latency_seconds_sum": base.E2E_LATENCY_SUM,
    "sglang:e2e_request_latency_seconds_count": base.E2E_LATENCY_COUNT,
    "sglang:prompt_tokens_histogram_sum": base.PROMPT_LEN_SUM,
    "sglang:prompt_tokens_histogram_count": base.PROMPT_LEN_COUNT,
    "sglang:generation_tokens_histogram_sum": base.GENERATION_LEN_SUM,
    "sglang:generation_tokens_histogram_count": base.GENERATION_LEN_COUNT,
    "sglang:time_to_first_token_seconds_sum": base.TTFT_SUM,
    "sglang:time_to_first_token_seconds_count": base.TTFT_COUNT,
    "sglang:e2e_request_latency_seconds_bucket": base.E2E_LATENCY_BUCKET,
    "sglang:time_to_first_token_seconds_bucket": base.TTFT_BUCKET,
    "sglang:inter_token_latency_seconds_bucket": base.ITL_BUCKET,
}
GAUGES: dict[str, str] = {
    "sglang:num_running_reqs": base.RUNNING,
    "sglang:num_queue_reqs": base.WAITING,
    "sglang:spec_num_steps": base.SPEC_STEPS,
    "sglang:spec_num_draft_tokens": base.SPEC_DRAFT_TOKENS,
}

#: Bucket upper bounds (SGLang 0.5.23, ``metrics_collector.py``; the constructed page).
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0,
               100.0, 200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0)
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0,
                100.0, 200.0, 400.0)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06,
               0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)


class SGLang(Engine):
    def sd_configured(self, sd_counters_present: bool, gauges: Mapping[str, float]
                      ) -> bool | None:
        """On when the ``spec_num_steps`` gauge says a chain of at least one step; None
        without the gauge (the configuration is not visible)."""
        steps = gauges.get(base.SPEC_STEPS)
        return None if steps is None else steps >= 1

    def proposed_per_verify(self, gauges: Mapping[str, float], configured_k: int | None
                            ) -> float | None:
        """SGLang's ``spec_accept_rate`` divides by ``speculative_num_draft_tokens - 1`` (or
        by ``speculative_num_steps`` when the former is unset); the gauges carry both."""
        n = gauges.get(base.SPEC_DRAFT_TOKENS)
        if n is not None and n >= 2:
            return n - 1
        steps = gauges.get(base.SPEC_STEPS)
        if steps is not None and steps >= 1:
            return steps
        return None


ENGINE = register(SGLang(
    kind="sglang", family="sglang", versions="0.5.x", prefix=PREFIX, order=30,
    counters=COUNTERS, gauges=GAUGES,
    max_gauges=frozenset({base.SPEC_STEPS, base.SPEC_DRAFT_TOKENS}),
    rank_labels=("tp_rank", "pp_rank"),
    capabilities=Capabilities(
        per_position=False, configured_k="gauge", acceptance_length=True, kv_capacity=False,
        acceptance=base.BY_VERIFY_CALLS, histograms=(
            Histogram(base.E2E_LATENCY_BUCKET, "sglang:e2e_request_latency_seconds",
                      E2E_BUCKETS),
            Histogram(base.TTFT_BUCKET, "sglang:time_to_first_token_seconds", TTFT_BUCKETS),
            Histogram(base.ITL_BUCKET, "sglang:inter_token_latency_seconds", ITL_BUCKETS),
        )),
))
