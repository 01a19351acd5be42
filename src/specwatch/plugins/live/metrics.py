"""The live model's series: predictions, validity and the speedup curve.

Registered into the catalogue on import (:func:`specwatch.expose.metricdefs.register`), so
``metricdefs.gauge(name)`` builds these families; the metrics reference lists them in the
order of :data:`specwatch.app.catalogue.METRICS`.
"""

from __future__ import annotations

from specwatch.expose.metricdefs import MetricDef, register

PREDICTED_SPEEDUP = "sd_predicted_speedup"
PREDICTED_LATENCY = "sd_predicted_latency_seconds"
BREAKEVEN_ARRIVAL_RATE = "sd_breakeven_arrival_rate"
SD_CEILING_ARRIVAL_RATE = "sd_throughput_ceiling_arrival_rate"
OPTIMAL_DRAFT_LENGTH = "sd_optimal_draft_length"
MODEL_UTILIZATION = "sd_model_utilization"
MODEL_VALID = "sd_model_valid"
MODEL_LATENCY_ERROR = "sd_model_latency_error_ratio"
MODEL_PROVENANCE_MISMATCH = "sd_model_provenance_mismatch"
MODEL_CONFIGURED = "specwatch_model_configured"
MODEL_SPEEDUP_CURVE = "sd_model_speedup_curve"
MODEL_CURVE_ARRIVAL_RATE = "sd_model_curve_arrival_rate"
MODEL_SPEEDUP_CURVE_LOWER = "sd_model_speedup_curve_lower"
MODEL_SPEEDUP_CURVE_UPPER = "sd_model_speedup_curve_upper"
PREDICTED_SPEEDUP_LOWER = "sd_predicted_speedup_lower"
PREDICTED_SPEEDUP_UPPER = "sd_predicted_speedup_upper"
PREDICTED_LATENCY_LOWER = "sd_predicted_latency_lower_seconds"
PREDICTED_LATENCY_UPPER = "sd_predicted_latency_upper_seconds"

METRICS: tuple[MetricDef, ...] = (
    MetricDef(
        PREDICTED_SPEEDUP, "gauge", ("target", "model_name", "window"),
        help="Predicted mean-latency speedup of SD at the live load (while sd_model_valid is 1).",
        doc="predicted L_noSD / L_SD at the live load, k, E, p, g of the model window (each "
            "system at its own fixed point); only while `sd_model_valid` is 1"),
    MetricDef(
        PREDICTED_LATENCY, "gauge", ("target", "model_name", "window", "mode"),
        help="Predicted mean end-to-end latency with SD (mode=sd) and without (mode=nosd).",
        doc="predicted mean e2e latency with SD at the running k (`mode=\"sd\"`) and without "
            "(`mode=\"nosd\"`); only while `sd_model_valid` is 1"),
    MetricDef(
        PREDICTED_SPEEDUP_LOWER, "gauge", ("target", "model_name", "window"),
        help="Lower end of the 90% interval of sd_predicted_speedup.",
        doc="lower end of the 90% interval of `sd_predicted_speedup`: the calibration's "
            "residual spread of L(B), per utilisation band, carried through the fixed point "
            "([model.md](model.md#uncertainty)); a separate gauge (not a `bound` label) so "
            "that aggregating over any label stays meaningful; present with the point series"),
    MetricDef(
        PREDICTED_SPEEDUP_UPPER, "gauge", ("target", "model_name", "window"),
        help="Upper bound of the 90% interval of sd_predicted_speedup; present with it.",
        doc="upper end of the 90% interval of `sd_predicted_speedup` (see the lower one)"),
    MetricDef(
        PREDICTED_LATENCY_LOWER, "gauge",
        ("target", "model_name", "window", "mode"),
        help="Lower bound of the 90% interval of sd_predicted_latency_seconds; present with it.",
        doc="lower end of the 90% interval of `sd_predicted_latency_seconds` (per `mode`); "
            "the bound goes before the unit suffix, which Prometheus naming keeps last"),
    MetricDef(
        PREDICTED_LATENCY_UPPER, "gauge",
        ("target", "model_name", "window", "mode"),
        help="Upper bound of the 90% interval of sd_predicted_latency_seconds; present with it.",
        doc="upper end of the 90% interval of `sd_predicted_latency_seconds` (per `mode`); "
            "`sd_model_valid` is 0 with `reason=\"sensitive\"` when the SD one is wider than "
            "±15% (the parameters file's `max_relative_halfwidth`)"),
    MetricDef(
        BREAKEVEN_ARRIVAL_RATE, "gauge", ("target", "model_name", "window"),
        help="Arrival rate (req/s) where the predicted speedup of the running k crosses 1; "
             "+Inf: no crossing.",
        doc="break-even: the arrival rate λ* where the running configuration's predicted "
            "speedup crosses 1 (SD pays below it); `+Inf`: no crossing (SD pays at every load "
            "below saturation, or up to its throughput ceiling, "
            "`sd_throughput_ceiling_arrival_rate`); `0`: never pays; absent when undefined. "
            "In the rare case where SD is slower alone but cheaper under load, SD pays *above* "
            "it (`specwatch predict` says which, and whether it lies outside the calibrated "
            "range)"),
    MetricDef(
        SD_CEILING_ARRIVAL_RATE, "gauge", ("target", "model_name", "window"),
        help="Arrival rate (req/s) past which SD at the running k no longer keeps up.",
        doc="SD's throughput ceiling at the running configuration: the arrival rate past "
            "which SD no longer keeps up, the lower of the model's ceiling and the one the "
            "calibration runs measured for this k on these lengths. A separate figure from "
            "the break-even: the predicted speedup may still be well above 1 just below it "
            "(`specwatch predict` says which source set it, and whether it lies outside the "
            "calibrated range); absent with SD off or when undefined"),
    MetricDef(
        OPTIMAL_DRAFT_LENGTH, "gauge", ("target", "model_name", "window"),
        help="Draft length with the lowest predicted latency at the live load (0 = SD off).",
        doc="k in 0 … `k_max` with the lowest predicted latency at the live load, 0 = SD off; "
            "acceptance from the live per-position rates (extended geometrically past the "
            "running k), or from α when there are none; present even when the running "
            "configuration is saturated; where that k's own prediction is not valid "
            "(sensitive, beyond the calibrated load) the best vouched k when the fastest "
            "one's predicted gain over it lies inside the two 90% latency intervals, else "
            "absent (the best k of `predict` and `sweep`: "
            "[model.md](model.md#best-k))"),
    MetricDef(
        MODEL_UTILIZATION, "gauge", ("target", "model_name", "window"),
        help="Load of the running SD configuration as a share of its capacity; 1 is saturation.",
        doc="λ/λ_max of the running SD configuration (λ · C2 in the linear model; 1 = "
            "saturation; can exceed 1, then `sd_model_valid` is 0); present whenever the "
            "inputs are"),
    MetricDef(
        MODEL_VALID, "gauge", ("target", "model_name", "window", "reason"),
        help="1 when the model's prediction holds at the live load, else 0 with a reason.",
        doc="1 (`reason=\"\"`) when every input is present, both systems are below the "
            "validity ceiling (`max_utilization`, default 0.9), the load is inside the "
            "parameters file's calibrated range and the server is not queueing; else 0 with "
            "`reason` = `saturated`, `above_utilization_ceiling`, `beyond_calibrated_load`, "
            "`extrapolated_k`, `sensitive` (90% latency interval wider than the file's limit), "
            "`queueing` (waiting requests in the latest poll), "
            "`capacity_mismatch` (the server states another capacity than the file's "
            "`server_capacity`), `missing_input` or `invalid_input`"),
    MetricDef(
        MODEL_LATENCY_ERROR, "gauge", ("target", "model_name", "window"),
        help="Predicted over measured mean latency, minus 1; a lasting error means recalibrate.",
        doc="predicted mean latency at the observed load over the measured mean latency of "
            "the window, minus 1 (signed); present when both exist; alert `SDModelDrift`"),
    MetricDef(
        MODEL_PROVENANCE_MISMATCH, "gauge", ("target", "model_name", "window", "field"),
        help="1 when the parameters file's model or capacity contradicts what the target states.",
        doc="1 when the parameters file's `provenance.<field>` (`model`) contradicts the "
            "target's `model_name`, or its `server_capacity.<field>` (`kv_cache_tokens` for "
            "a server without SD, `kv_cache_tokens_sd` with SD, `max_num_seqs`) what the "
            "server states (`sd_server_kv_cache_tokens` off by more than 5%, "
            "`sd_server_max_num_seqs` different); a capacity mismatch also makes "
            "`sd_model_valid` 0 with reason `capacity_mismatch`; also logged once"),
    MetricDef(
        MODEL_CONFIGURED, "gauge", ("target",),
        help="1 when the target's configuration names a latency-model parameters file, else 0.",
        doc="1 when the target names a parameters file, else 0 (then no model series exist for "
            "it)"),
    MetricDef(
        MODEL_SPEEDUP_CURVE, "gauge", ("target", "model_name", "window", "point"),
        help="Predicted speedup at the arrival rate of this curve point, for the live acceptance.",
        doc="the model's speedup curve at the window's measured k, E, p, g: the predicted "
            "speedup at the arrival rate `sd_model_curve_arrival_rate` with the same labels; "
            "24 grid points (`point` = `00` … `23`) from 0 up to `max_utilization` × the "
            "lower throughput ceiling of the two systems; a point is present only where the "
            "prediction is valid (below the ceiling, inside the calibrated range, calibrated "
            "k; the live `queueing` state does not apply); no inputs, no curve"),
    MetricDef(
        MODEL_CURVE_ARRIVAL_RATE, "gauge", ("target", "model_name", "window", "point"),
        help="Arrival rate (req/s) of this point of the speedup curve (sd_model_speedup_curve).",
        doc="arrival rate (req/s) of the curve's grid point `point`: the x of "
            "`sd_model_speedup_curve`, present exactly where it is"),
    MetricDef(
        MODEL_SPEEDUP_CURVE_LOWER, "gauge", ("target", "model_name", "window", "point"),
        help="Lower bound of the 90% interval of sd_model_speedup_curve at the same point.",
        doc="lower end of the 90% interval of `sd_model_speedup_curve` (same labels): the "
            "band the XY chart draws around the model line"),
    MetricDef(
        MODEL_SPEEDUP_CURVE_UPPER, "gauge", ("target", "model_name", "window", "point"),
        help="Upper bound of the 90% interval of sd_model_speedup_curve at the same point.",
        doc="upper end of the 90% interval of `sd_model_speedup_curve` (same labels)"),
)
register(METRICS)
