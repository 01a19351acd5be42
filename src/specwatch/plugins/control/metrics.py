"""The controller's series: state, transitions, switch records, and the Alertmanager
receiver's count.

Registered into the catalogue on import (:func:`specwatch.expose.metricdefs.register`), so
``metricdefs.gauge(name)`` builds these families; the metrics reference lists them in the
order of :data:`specwatch.app.catalogue.METRICS`.
"""

from __future__ import annotations

from specwatch.expose.metricdefs import MetricDef, register

_SWITCH_SIDE = ("target", "model_name", "action", "side")

METRICS: tuple[MetricDef, ...] = (
    MetricDef(
        "sd_controller_state", "gauge", ("target", "model_name", "state", "reason"),
        help="Controller state (enabled, disabled, pending): 1 for the current one; reason says "
             "why.",
        doc="[controller](controller.md) state: 1 for the current one of `enabled`, "
            "`disabled`, `pending`, 0 for the other two; only for targets with a controller. "
            "`reason` (the same on the three series) says why the state and the recommended "
            "k are what they are next to the model's `sd_optimal_draft_length`: `agrees`, "
            "`acceptance_guard`, `alert`, `hysteresis`, `stabilization`, `min_interval`, "
            "`no_prediction`, `no_data`, `pending`, `sd_pays` "
            "([controller](controller.md#reason))"),
    MetricDef(
        "sd_controller_recommended_draft_length", "gauge", ("target", "model_name"),
        help="Draft length with the lowest predicted latency at the live load (0 = SD off).",
        doc="best k at the live load; 0 = SD off, also while the acceptance α is below "
            "`min_acceptance_alpha` and SD does not pay; absent without a valid prediction"),
    MetricDef(
        "sd_controller_transitions", "counter", ("target", "model_name", "action"),
        help="Switches decided by the controller, by action (in recommend mode: "
             "recommendations).",
        doc="switches the controller decided, `action` = `disable`, `enable` (both always "
            "present); in `recommend` mode, recommendations"),
    MetricDef(
        "sd_controller_last_transition_timestamp_seconds", "gauge", ("target", "model_name"),
        help="Unix time of the last switch the controller decided.",
        doc="Unix time of the last decided switch"),
    MetricDef(
        "sd_controller_actuation_errors", "counter", ("target", "model_name"),
        help="Controller decisions that did not take effect (not delivered, or not applied in "
             "time).",
        doc="decisions that did not take effect: delivery failed after its retries, or the "
            "server did not report the switch within `pending_timeout_seconds`"),
    MetricDef(
        "sd_controller_models_dropped", "counter", ("target", "reason"),
        help="Models the controller of a target forgot, by reason.",
        doc="models the controller of a target forgot: `retention` (gone from the page longer "
            "than the exporter keeps history), `limit` (more than 100 models at once; least "
            "recently seen first), `vanished_limit` / `target_removed` (the exporter forgot "
            "the model for that reason, so the controller did too)"),
    MetricDef(
        "sd_switch_latency_ratio", "gauge",
        ("target", "model_name", "action", "latency", "percentile"),
        help="Latency after the last SD switch over latency before it (below 1: the switch "
             "helped).",
        doc="quantile of e2e latency (`latency=\"e2e\"`) or TTFT (`\"ttft\"`) over the decision "
            "window after the last switch ÷ the same before it, `percentile` = `50`, `99`. The "
            "label is not `quantile` (architecture.md's spelling): `promtool check metrics` "
            "reserves it for summaries"),
    # The last switch record as calibration points (`calibrate --point-sources
    # switches`): the decision window before the switch and the first complete one after.
    MetricDef(
        "sd_switch_timestamp_seconds", "gauge", ("target", "model_name", "action"),
        help="Unix time of the SD switch of the last complete before/after record.",
        doc="Unix time of the switch behind the last complete before/after record (its "
            "`sd_switch_window_*` figures); a new value is a new record"),
    MetricDef(
        "sd_switch_window_latency_seconds", "gauge", _SWITCH_SIDE,
        help="Mean end-to-end latency in the window before or after the last SD switch.",
        doc="mean e2e latency of the decision window before (`side=\"before\"`) or after "
            "(`\"after\"`) the last switch (a calibration point's L)"),
    MetricDef(
        "sd_switch_window_arrival_rate", "gauge", _SWITCH_SIDE,
        help="Finished requests per second over the decision window before or after the last "
             "switch.",
        doc="finished requests per second of that window (a calibration point's λ)"),
    MetricDef(
        "sd_switch_window_prompt_tokens", "gauge", _SWITCH_SIDE,
        help="Mean prompt tokens over the decision window before or after the last switch.",
        doc="mean prompt tokens of that window"),
    MetricDef(
        "sd_switch_window_generation_tokens", "gauge", _SWITCH_SIDE,
        help="Mean generated tokens over the decision window before or after the last switch.",
        doc="mean generated tokens of that window"),
    MetricDef(
        "sd_switch_window_draft_length", "gauge", _SWITCH_SIDE,
        help="Draft tokens per draft in the window before or after the last SD switch.",
        doc="proposed draft tokens per draft of that window (absent with SD off)"),
    MetricDef(
        "sd_switch_window_acceptance_length", "gauge", _SWITCH_SIDE,
        help="Tokens per verify cycle in the window before or after the last SD switch.",
        doc="tokens per verify cycle of that window (absent with SD off)"),
)
#: The Alertmanager receiver's series (listed last in the reference).
RECEIVER_METRICS: tuple[MetricDef, ...] = (
    MetricDef(
        "specwatch_controller_alerts", "counter", ("outcome",),
        help="Alertmanager alerts the controller received, by outcome.",
        doc="Alertmanager alerts received: `accepted`, `resolved`, `ignored_alertname`, "
            "`ignored_target`, `ignored_model`; only with the receiver configured"),
)
register(METRICS)
register(RECEIVER_METRICS)
