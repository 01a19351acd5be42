"""The measured A/B pairs' series: `target` is the pair's SD side.

Registered into the catalogue on import (:func:`specwatch.expose.metricdefs.register`), so
``metricdefs.gauge(name)`` builds these families; the metrics reference lists them in the
order of :data:`specwatch.app.catalogue.METRICS`.
"""

from __future__ import annotations

from specwatch.expose.metricdefs import MetricDef, register

#: Labels of the measured-pair series.
_PAIR = ("pair", "target", "model_name", "arrival_rate_bin", "acceptance_band")
_PAIR_STAT = (*_PAIR, "statistic")
_PAIR_SIDE = (*_PAIR, "side")

METRICS: tuple[MetricDef, ...] = (
    MetricDef(
        "sd_measured_speedup", "gauge", _PAIR_STAT,
        help="Baseline latency over SD latency of an A/B pair at the same load (above 1: SD is "
             "faster).",
        doc="measured A/B pair (`pairs:`, [exporter](exporter.md#measured-ab-pairs)): baseline "
            "e2e latency ÷ SD e2e latency over the bin's finished requests, `statistic` = "
            "`mean`, `p50`, `p99`; only where both sides have `pair_options.min_requests` in "
            "the bin (absent otherwise, never 0); a quantile only where the buckets resolve it; "
            "`acceptance_band`: the SD side's acceptance rate band the bin belongs to"),
    MetricDef(
        "sd_measured_speedup_lower", "gauge", _PAIR_STAT,
        help="Lower end of the 90% interval of the measured mean speedup (statistic=mean).",
        doc="lower end of the 90% interval of `sd_measured_speedup{statistic=\"mean\"}` "
            "(delta method on the two means, [exporter](exporter.md#measured-ab-pairs)); a "
            "separate series, not a `bound` label, so that aggregating over labels stays "
            "meaningful"),
    MetricDef(
        "sd_measured_speedup_upper", "gauge", _PAIR_STAT,
        help="Upper end of the 90% interval of the measured mean speedup (statistic=mean).",
        doc="upper end of that interval (what `SDMeasuredSlowdown` compares with 1)"),
    MetricDef(
        "sd_measured_ttft_ratio", "gauge", _PAIR_STAT,
        help="Baseline time to first token over SD's, of an A/B pair at the same load (above 1: "
             "SD faster).",
        doc="the same ratio for time to first token, `statistic` = `p50`, `p99` (only where "
            "the buckets resolve them)"),
    MetricDef(
        "sd_measured_inter_token_latency_ratio", "gauge", _PAIR_STAT,
        help="Baseline inter-token latency over SD's, of an A/B pair at equal load (above 1: SD "
             "faster).",
        doc="the same ratio for inter-token latency (`vllm:inter_token_latency_seconds`), "
            "`statistic` = `p50`, `p99`"),
    MetricDef(
        "sd_measured_arrival_rate", "gauge", _PAIR,
        help="Mean arrival rate (req/s) of an A/B pair's windows in this bin.",
        doc="mean arrival rate (req/s) of the bin's windows, both sides: the x of a measured "
            "point"),
    MetricDef(
        "sd_measured_requests", "gauge", _PAIR_SIDE,
        help="Finished requests of one side of a pair in the bin (within the retention).",
        doc="finished requests of one side (`sd`, `baseline`) in the bin, within "
            "`pair_options.retention`"),
    MetricDef(
        "sd_pair_current_arrival_rate_bin", "gauge", _PAIR,
        help="1 for the arrival-rate bin and acceptance band an A/B pair is in now.",
        doc="1 for the bin and acceptance band of the pair's current arrival rate and "
            "acceptance (what `SDMeasuredSlowdown` joins on and the measured points are "
            "filtered by)"),
    MetricDef(
        "sd_measured_latency_seconds", "gauge", _PAIR_SIDE,
        help="Mean e2e request latency of one side of a pair over the bin's finished requests.",
        doc="mean e2e latency of one side in the bin (a calibration point's L)"),
    MetricDef(
        "sd_measured_side_arrival_rate", "gauge", _PAIR_SIDE,
        help="Finished requests per second of one side of a pair, over the bin's windows.",
        doc="finished requests per second of one side in the bin (a calibration point's λ)"),
    MetricDef(
        "sd_measured_prompt_tokens", "gauge", _PAIR_SIDE,
        help="Mean prompt tokens of one side of a pair in the bin.",
        doc="mean prompt tokens of one side in the bin"),
    MetricDef(
        "sd_measured_generation_tokens", "gauge", _PAIR_SIDE,
        help="Mean generated tokens of one side of a pair in the bin.",
        doc="mean generated tokens of one side in the bin"),
    MetricDef(
        "sd_measured_acceptance_length", "gauge", _PAIR_SIDE,
        help="Tokens per verify cycle of one side of a pair in the bin (absent on a side "
             "without SD).",
        doc="tokens per verify cycle of one side in the bin (absent without SD)"),
    MetricDef(
        "sd_measured_draft_length", "gauge", _PAIR_SIDE,
        help="Proposed draft tokens per draft of one side of a pair in the bin (absent on a "
             "side without SD).",
        doc="proposed draft tokens per draft of one side in the bin (absent without SD)"),
)
register(METRICS)
