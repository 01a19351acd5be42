"""The exporter's metric catalogue: every series specwatch exposes, with its type, labels, HELP
text and the meaning the metrics reference documents. One source of truth.

Why a table: the collectors (`specwatch.expose.collector`, the model's
`specwatch.plugins.live.plugin`, the HTTP server's `specwatch.app.serve`, the controller's
`specwatch.plugins.control.controller`) build their families from it with :func:`gauge`,
:func:`counter` and :func:`histogram`, and scripts/generate_docs.py writes docs/metrics.md's
table from it, so the page cannot drift from what `/metrics` serves
(tests/test_docs_generated.py fails when the page is stale, tests/expose/test_metricdefs.py when a
collector serves a family the table does not define).

Adding a series: add a :class:`MetricDef` here (in the order the reference lists it), build
the family with ``gauge(NAME)`` / ``counter(NAME)`` / ``histogram(NAME)`` in the collector,
then run ``make generate`` (or ``python scripts/generate_docs.py``) to refresh the reference.

It lives in the exporter package, the layer that serves ``/metrics``; the layers above it
(``app``, ``control``) import it to name their series. Names only: nothing here knows how a
value is computed. ``name`` is the family name as prometheus_client takes it: a counter's
exposed name adds ``_total`` (:attr:`MetricDef.exposed_name`).

Size: one table on purpose: the reference page lists every series in this order, and most
lines are definitions, not logic.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from specwatch.poll import signals

WINDOW_NOTE = (" Computed from the exporter's own poll history (every poll interval), so all"
               " Prometheus replicas see the same value.")
TYPES = ("gauge", "counter", "histogram")


@dataclass(frozen=True)
class MetricDef:
    """One family: what the exposition says (name, type, labels, help) and what the reference
    says (doc, Markdown; may be longer than the HELP line)."""

    name: str
    type: str
    labels: tuple[str, ...]
    help: str
    doc: str

    @property
    def exposed_name(self) -> str:
        """The name a scrape shows: counters end in ``_total``."""
        return f"{self.name}_total" if self.type == "counter" else self.name


#: Labels of the measured-pair series (issue 16).
_PAIR = ("pair", "target", "model_name", "arrival_rate_bin", "acceptance_band")
_PAIR_STAT = (*_PAIR, "statistic")
_PAIR_SIDE = (*_PAIR, "side")
_SWITCH_SIDE = ("target", "model_name", "action", "side")

METRICS: tuple[MetricDef, ...] = (
    MetricDef(
        signals.ACCEPTANCE_RATE, "gauge", ("target", "model_name", "window"),
        help="Accepted / proposed draft tokens over the window (vLLM's "
             "definition, 0-1)." + WINDOW_NOTE,
        doc="accepted / proposed draft tokens (vLLM's definition)"),
    MetricDef(
        signals.ACCEPTANCE_LENGTH, "gauge", ("target", "model_name", "window"),
        help="Tokens committed per verify cycle over the window: 1 + accepted "
             "/ drafts (bonus token included)." + WINDOW_NOTE,
        doc="tokens committed per verify cycle, 1 + accepted / drafts (bonus token included), "
            "1 … k + 1"),
    MetricDef(
        signals.DRAFT_LENGTH, "gauge", ("target", "model_name", "window"),
        help="Proposed draft tokens per draft over the window (effective k)." + WINDOW_NOTE,
        doc="proposed draft tokens per draft: the effective k (below the configured k with "
            "n-gram misses, dynamic SD, suffix decoding)"),
    MetricDef(
        "sd_draft_length_configured", "gauge", ("target", "model_name"),
        help="Configured draft length k (number of position series; SGLang: "
             "speculative_num_steps).",
        doc="configured k: number of `position` series (SGLang: `speculative_num_steps`)"),
    MetricDef(
        "sd_server_kv_cache_tokens", "gauge", ("target",),
        help="KV-cache capacity in tokens the server states (vLLM cache_config_info: "
             "kv_cache_size_tokens, else num_gpu_blocks x block_size; summed over engines).",
        doc="KV-cache capacity in tokens the server states on its page (vLLM "
            "`vllm:cache_config_info`: `kv_cache_size_tokens`, else `num_gpu_blocks` × "
            "`block_size`), summed over its engines; absent when an engine does not state "
            "it. Compared with the parameters file's `server_capacity` (model.md, *Server "
            "capacity*)"),
    MetricDef(
        "sd_server_kv_cache_blocks", "gauge", ("target",),
        help="KV-cache blocks the server states (vLLM cache_config_info num_gpu_blocks, "
             "summed over engines).",
        doc="KV-cache blocks the server states (`num_gpu_blocks`), summed over its engines"),
    MetricDef(
        "sd_server_max_num_seqs", "gauge", ("target",),
        help="Most requests the server runs at once, as the target's configuration states "
             "it (targets[].max_num_seqs: vLLM does not expose it).",
        doc="`targets[].max_num_seqs` of the configuration (vLLM's `--max-num-seqs`, which "
            "no vLLM page states); absent when not configured"),
    MetricDef(
        signals.TOKEN_ACCEPTANCE_PROBABILITY, "gauge", ("target", "model_name", "window"),
        help="Per-token acceptance probability alpha of the i.i.d. model, "
             "solved from the acceptance length and draft length (not the "
             "acceptance rate)." + WINDOW_NOTE,
        doc="per-token α of the i.i.d. model: E = (1 − α^(k+1)) / (1 − α) solved by bisection "
            "with k = `sd_draft_length`; not the acceptance rate"),
    MetricDef(
        signals.POSITION_ACCEPTANCE_RATE, "gauge", ("target", "model_name", "window", "position"),
        help="Share of drafts whose token at this position was accepted, over "
             "the window." + WINDOW_NOTE,
        doc="share of drafts whose token at `position` was accepted, p_i"),
    MetricDef(
        signals.POSITION_CONDITIONAL_ACCEPTANCE_RATE, "gauge",
        ("target", "model_name", "window", "position"),
        help="Acceptance at this position given the previous position was "
             "accepted, over the window." + WINDOW_NOTE,
        doc="p_i / p_(i−1): acceptance at `position` given the previous one was accepted"),
    MetricDef(
        signals.ACCEPTANCE_HETEROGENEITY, "gauge", ("target", "model_name", "window"),
        help="Share of the maximum possible variance of per-draft acceptance, "
             "(p1 - p0^2) / (p0 (1 - p0)) from positions 0 and 1: 0 "
             "homogeneous traffic, 1 an all-or-nothing mixture. A lower bound "
             "when acceptance decays with position." + WINDOW_NOTE,
        doc="(p_1 − p_0²) / (p_0 (1 − p_0)), 0 … 1: spread of acceptance across drafts (next "
            "section)"),
    MetricDef(
        signals.ARRIVAL_RATE, "gauge", ("target", "model_name", "window"),
        help="Finished requests per second over the window (the arrival rate "
             "in steady state)." + WINDOW_NOTE,
        doc="finished requests per second (= arrival rate in steady state; 0 on an idle "
            "server: a true value over elapsed time)"),
    MetricDef(
        signals.EFFECTIVE_BATCH_SIZE, "gauge", ("target", "model_name", "window"),
        help="Mean requests in flight over the window by Little's law (arrival "
             "rate x mean e2e latency)." + WINDOW_NOTE,
        doc="mean requests in flight, Little's law λ · L"),
    MetricDef(
        signals.MEAN_PROMPT_TOKENS, "gauge", ("target", "model_name", "window"),
        help="Mean prompt tokens per finished request over the window." + WINDOW_NOTE,
        doc="mean prompt tokens per finished request"),
    MetricDef(
        signals.MEAN_GENERATION_TOKENS, "gauge", ("target", "model_name", "window"),
        help="Mean generated tokens per finished request over the window." + WINDOW_NOTE,
        doc="mean generated tokens per finished request"),
    MetricDef(
        signals.MEAN_LATENCY_SECONDS, "gauge", ("target", "model_name", "window"),
        help="Mean end-to-end request latency over the window." + WINDOW_NOTE,
        doc="mean end-to-end request latency"),
    MetricDef(
        "sd_acceptance_rate_samples", "histogram", ("target", "model_name"),
        help="Acceptance rate of each poll interval with enough drafts (one observation per "
             "interval), 0.05-wide buckets.",
        doc="one observation per poll interval with ≥ `min_drafts_per_sample` drafts: that "
            "interval's acceptance rate; buckets 0.05 wide"),
    MetricDef(
        signals.BIMODALITY_COEFFICIENT, "gauge", ("target", "model_name", "window"),
        help="Sarle's bimodality coefficient of the per-poll-interval acceptance rates in "
             "the window that a change over time does not explain (within the segments left "
             "by at most two level shifts, never above the raw coefficient); above 5/9 "
             "suggests two populations that coexist." + WINDOW_NOTE,
        doc="Sarle's coefficient of the samples in the window (≥ `min_bimodality_samples`) "
            "that a change over time does not explain: measured within the segments left by "
            "at most two level shifts, never above the raw coefficient (see *Acceptance "
            "heterogeneity* below); above 5/9 suggests two populations that coexist, a plain "
            "step stays near 0.35"),
    MetricDef(
        "specwatch_target_up", "gauge", ("target",),
        help="1 when the last poll of the target succeeded and parsed, else 0.",
        doc="1 when the last poll succeeded and parsed, else 0"),
    MetricDef(
        "specwatch_target_poll_duration_seconds", "gauge", ("target",),
        help="Duration of the last poll of the target (connect + read).",
        doc="duration of the last poll"),
    MetricDef(
        "specwatch_target_poll_errors", "counter", ("target", "reason"),
        help="Failed polls of the target by reason (timeout, connection, tls, http_status, "
             "parse, too_large).",
        doc="failed polls; reason = `timeout`, `connection`, `tls` (certificate or handshake), "
            "`http_status`, `parse` (not a metrics page, a page that ends inside a line, "
            "bad or unsupported encoding), "
            "`too_large` (body or *decompressed* body over `max_body_bytes`) (all six always "
            "present)"),
    MetricDef(
        "specwatch_target_series_dropped", "counter", ("target", "reason"),
        help="Source series not used, by reason: max_series (the target's cap: whole models "
             "are dropped so that published values stay exact), invalid (a counter series "
             "NaN, negative or conflicting on a page: only the signals that read it are left "
             "out).",
        doc="source series not used: `max_series` (whole models beyond the target's cap), "
            "`invalid` (a counter series NaN, ±Inf, negative, above 2⁵³ or listed twice with "
            "different values on one page: only the signals that read it are left out for "
            "the windows that end or start at that poll; it catches up at its next valid "
            "value)"),
    MetricDef(
        "specwatch_target_models_dropped", "counter", ("target", "reason"),
        help="Models of the target dropped to keep the exporter's state bounded, by reason: "
             "max_models (more models on a page than targets[].max_models; the extra ones "
             "are not followed), vanished_limit (a vanished model forgotten before the "
             "retention ended, oldest first).",
        doc="models dropped to keep the exporter's state bounded: `max_models` (more models "
            "on one page than `targets[].max_models`, default 100; the extra ones, by name "
            "after the models already followed, are not followed; counted on each such "
            "poll), `vanished_limit` (a vanished model forgotten before the end of the "
            "retention, oldest first, when the remembered vanished models pass "
            "`max_models`). The first drop of each reason is logged once"),
    MetricDef(
        "specwatch_target_label_values_truncated", "counter", ("target",),
        help="Label values from the target (model names, positions) longer than "
             "global.max_label_value_bytes, cut and suffixed with a hash of the whole value.",
        doc="distinct label values per poll read from the target (model names, positions) "
            "longer than `global.max_label_value_bytes` (default 256 bytes), cut and "
            "suffixed with `~` and 12 hex digits of their SHA-256, so distinct long values "
            "stay distinct and a series keeps its history"),
    MetricDef(
        "specwatch_target_resets", "counter", ("target",),
        help="Polls of the target in which at least one source counter restarted (server, "
             "engine or adapter restart).",
        doc="polls in which at least one source counter restarted. Named without `counter` "
            "because `promtool check metrics` rejects a counter whose name contains "
            "`_counter_` (architecture.md lists it as `specwatch_target_counter_resets_total`)"),
    MetricDef(
        "specwatch_target_last_success_timestamp_seconds", "gauge", ("target",),
        help="Unix time of the last successful poll of the target.",
        doc="Unix time of the last successful poll"),
    MetricDef(
        "specwatch_build_info", "gauge", ("version",),
        help="specwatch build information (value 1).",
        doc="always 1"),
    MetricDef(
        "specwatch_targets_dropped", "gauge", (),
        help="Configured targets not polled because global.max_targets was reached.",
        doc="configured targets not polled because `global.max_targets` was reached"),
    MetricDef(
        "specwatch_targets_discovered", "gauge", (),
        help="Targets known to this exporter (static and file_sd, every shard); it polls the "
             "ones of its shard (global.shard_index of global.shard_count).",
        doc="targets known to this exporter, static and `file_sd`, of every shard; it polls "
            "those of its shard (`global.shard_index` of `global.shard_count`)"),
    MetricDef(
        "specwatch_sd_file_read_errors", "counter", (),
        help="file_sd files that could not be read or parsed (their previous targets are kept).",
        doc="with `file_sd`: files that could not be read or parsed (their previous targets "
            "are kept)"),
    MetricDef(
        "specwatch_http_requests_rejected", "counter", ("reason",),
        help="Requests and connections the HTTP server refused, by reason (in_flight_limit: "
             "503; connection_limit; timeout: request not received or not answered in time; "
             "tls_handshake; unauthorized: 401; rate_limited: 429; bad_request: 400, "
             "ambiguous framing or HTTP/0.9; auth_rate_limited: 429, too many failed logins "
             "from the address; client_connection_limit: the address holds its share).",
        doc="requests or connections the HTTP server refused: `in_flight_limit` (503), "
            "`connection_limit`, `timeout` (request not received, or handler not done, within "
            "`request_timeout`), `tls_handshake` (failed or over `tls_handshake_timeout`, bad "
            "client certificate), `unauthorized` (401), `rate_limited` (429), `bad_request` "
            "(400: ambiguous framing such as two `Content-Length`s or a `Transfer-Encoding`, "
            "HTTP/0.9), `auth_rate_limited` (429: the address used up "
            "`failed_logins_per_client`), `client_connection_limit` (the address holds "
            "`max_connections_per_client`)"),
    MetricDef(
        "specwatch_http_requests_in_flight", "gauge", (),
        help="Requests being handled (this scrape included).",
        doc="requests being handled, this scrape included"),
    MetricDef(
        "specwatch_web_config_last_reload_successful", "gauge", (),
        help="1 when the last load of the web config file succeeded.",
        doc="with `--web-config`: 1 when the last (re)load of the file succeeded, 0 when it "
            "failed and the previous config is still in use"),
    MetricDef(
        "specwatch_web_config_last_reload_success_timestamp_seconds", "gauge", (),
        help="Unix time of the last successful load of the web config file.",
        doc="with `--web-config`: Unix time of the last successful load"),
    MetricDef(
        "sd_predicted_speedup", "gauge", ("target", "model_name", "window"),
        help="Predicted mean-latency speedup of SD at the live load, L_noSD / L_SD, each "
             "system at its own fixed point (present only when sd_model_valid is 1).",
        doc="predicted L_noSD / L_SD at the live load, k, E, p, g of the model window (each "
            "system at its own fixed point); only while `sd_model_valid` is 1"),
    MetricDef(
        "sd_predicted_latency_seconds", "gauge", ("target", "model_name", "window", "mode"),
        help="Predicted mean end-to-end request latency with SD (mode=\"sd\", the running draft "
             "length) and without (mode=\"nosd\").",
        doc="predicted mean e2e latency with SD at the running k (`mode=\"sd\"`) and without "
            "(`mode=\"nosd\"`); only while `sd_model_valid` is 1"),
    MetricDef(
        "sd_predicted_speedup_lower", "gauge", ("target", "model_name", "window"),
        help="Lower bound of the 90% interval of sd_predicted_speedup (the fit's residual "
             "spread carried through the fixed point); present with it.",
        doc="lower end of the 90% interval of `sd_predicted_speedup`: the calibration's "
            "residual spread of L(B), per utilisation band, carried through the fixed point "
            "([model.md](model.md#uncertainty)); a separate gauge (not a `bound` label) so "
            "that aggregating over any label stays meaningful; present with the point series"),
    MetricDef(
        "sd_predicted_speedup_upper", "gauge", ("target", "model_name", "window"),
        help="Upper bound of the 90% interval of sd_predicted_speedup; present with it.",
        doc="upper end of the 90% interval of `sd_predicted_speedup` (see the lower one)"),
    MetricDef(
        "sd_predicted_latency_lower_seconds", "gauge",
        ("target", "model_name", "window", "mode"),
        help="Lower bound of the 90% interval of sd_predicted_latency_seconds; present with it.",
        doc="lower end of the 90% interval of `sd_predicted_latency_seconds` (per `mode`); "
            "the bound goes before the unit suffix, which Prometheus naming keeps last"),
    MetricDef(
        "sd_predicted_latency_upper_seconds", "gauge",
        ("target", "model_name", "window", "mode"),
        help="Upper bound of the 90% interval of sd_predicted_latency_seconds; present with it.",
        doc="upper end of the 90% interval of `sd_predicted_latency_seconds` (per `mode`); "
            "`sd_model_valid` is 0 with `reason=\"sensitive\"` when the SD one is wider than "
            "±15% (the parameters file's `max_relative_halfwidth`)"),
    MetricDef(
        "sd_breakeven_arrival_rate", "gauge", ("target", "model_name", "window"),
        help="Arrival rate (req/s) at which the predicted speedup of the running configuration "
             "crosses 1; +Inf: SD pays at every load below saturation, 0: it never pays.",
        doc="arrival rate λ* where the running configuration's predicted speedup crosses 1 (SD "
            "pays below it); `+Inf`: pays at every load below saturation; `0`: never pays; "
            "absent when undefined. In the rare case where SD is slower alone but cheaper "
            "under load, SD pays *above* it (`specwatch predict` says which)"),
    MetricDef(
        "sd_optimal_draft_length", "gauge", ("target", "model_name", "window"),
        help="Draft length with the lowest predicted latency at the live load among 0..k_max "
             "(0 = SD off), from the measured per-position acceptance.",
        doc="k in 0 … `k_max` with the lowest predicted latency at the live load, 0 = SD off; "
            "acceptance from the live per-position rates (extended geometrically past the "
            "running k), or from α when there are none; present even when the running "
            "configuration is saturated, absent where that k's own prediction is not valid "
            "(sensitive, beyond the calibrated load: as `sweep`'s best k)"),
    MetricDef(
        "sd_model_utilization", "gauge", ("target", "model_name", "window"),
        help="Model utilisation lambda/lambda_max of the running SD configuration (lambda*C2 "
             "in the linear model): 1 is saturation (may exceed 1: then sd_model_valid is 0).",
        doc="λ/λ_max of the running SD configuration (λ · C2 in the linear model; 1 = "
            "saturation; can exceed 1, then `sd_model_valid` is 0); present whenever the "
            "inputs are"),
    MetricDef(
        "sd_model_valid", "gauge", ("target", "model_name", "window", "reason"),
        help="1 when every model input is present, both systems are below the validity "
             "ceiling, the load is inside the calibrated range and the server is not "
             "queueing, else 0 with reason (then speedup and latencies are absent).",
        doc="1 (`reason=\"\"`) when every input is present, both systems are below the "
            "validity ceiling (`max_utilization`, default 0.9), the load is inside the "
            "parameters file's calibrated range and the server is not queueing; else 0 with "
            "`reason` = `saturated`, `above_utilization_ceiling`, `beyond_calibrated_load`, "
            "`extrapolated_k`, `sensitive` (90% latency interval wider than the file's limit), "
            "`queueing` (waiting requests in the latest poll), "
            "`capacity_mismatch` (the server states another capacity than the file's "
            "`server_capacity`), `missing_input` or `invalid_input`"),
    MetricDef(
        "sd_model_latency_error_ratio", "gauge", ("target", "model_name", "window"),
        help="Predicted mean latency at the observed load over the measured mean latency of "
             "the window, minus 1 (signed; present when both exist). Sustained |error| means "
             "the calibration no longer describes the server.",
        doc="predicted mean latency at the observed load over the measured mean latency of "
            "the window, minus 1 (signed); present when both exist; alert `SDModelDrift`"),
    MetricDef(
        "sd_model_provenance_mismatch", "gauge", ("target", "model_name", "window", "field"),
        help="1 when a provenance field of the parameters file (field=model) or its "
             "server_capacity (field=kv_cache_tokens, kv_cache_tokens_sd, max_num_seqs) "
             "contradicts what the target states.",
        doc="1 when the parameters file's `provenance.<field>` (`model`) contradicts the "
            "target's `model_name`, or its `server_capacity.<field>` (`kv_cache_tokens` for "
            "a server without SD, `kv_cache_tokens_sd` with SD, `max_num_seqs`) what the "
            "server states (`sd_server_kv_cache_tokens` off by more than 5%, "
            "`sd_server_max_num_seqs` different); a capacity mismatch also makes "
            "`sd_model_valid` 0 with reason `capacity_mismatch`; also logged once"),
    MetricDef(
        "specwatch_model_configured", "gauge", ("target",),
        help="1 when the target's configuration names a latency-model parameters file, else 0.",
        doc="1 when the target names a parameters file, else 0 (then no model series exist for "
            "it)"),
    MetricDef(
        "sd_model_speedup_curve", "gauge", ("target", "model_name", "window", "point"),
        help="Predicted speedup L_noSD / L_SD at the arrival rate of grid point `point` "
             "(sd_model_curve_arrival_rate), for the window's measured acceptance, draft "
             "length and request lengths; only points where the prediction is valid.",
        doc="the model's speedup curve at the window's measured k, E, p, g: the predicted "
            "speedup at the arrival rate `sd_model_curve_arrival_rate` with the same labels; "
            "24 grid points (`point` = `00` … `23`) from 0 up to `max_utilization` × the "
            "lower throughput ceiling of the two systems; a point is present only where the "
            "prediction is valid (below the ceiling, inside the calibrated range, calibrated "
            "k; the live `queueing` state does not apply); no inputs, no curve"),
    MetricDef(
        "sd_model_curve_arrival_rate", "gauge", ("target", "model_name", "window", "point"),
        help="Arrival rate (req/s) of grid point `point` of the speedup curve "
             "(sd_model_speedup_curve); present exactly where that point is.",
        doc="arrival rate (req/s) of the curve's grid point `point`: the x of "
            "`sd_model_speedup_curve`, present exactly where it is"),
    MetricDef(
        "sd_model_speedup_curve_lower", "gauge", ("target", "model_name", "window", "point"),
        help="Lower bound of the 90% interval of sd_model_speedup_curve at the same point.",
        doc="lower end of the 90% interval of `sd_model_speedup_curve` (same labels): the "
            "band the XY chart draws around the model line"),
    MetricDef(
        "sd_model_speedup_curve_upper", "gauge", ("target", "model_name", "window", "point"),
        help="Upper bound of the 90% interval of sd_model_speedup_curve at the same point.",
        doc="upper end of the 90% interval of `sd_model_speedup_curve` (same labels)"),
    MetricDef(
        "sd_controller_state", "gauge", ("target", "model_name", "state", "reason"),
        help="Controller state of the target and model: 1 for the current state (enabled: SD "
             "on, disabled: SD off, pending: a switch was requested and the server has not "
             "come back with it yet), 0 for the others. reason: why the state and the "
             "recommended draft length are what they are next to the model's "
             "sd_optimal_draft_length (agrees, acceptance_guard, alert, hysteresis, "
             "stabilization, min_interval, no_prediction, no_data, pending; more may come).",
        doc="[controller](controller.md) state: 1 for the current one of `enabled`, "
            "`disabled`, `pending`, 0 for the other two; only for targets with a controller. "
            "`reason` (the same on the three series) says why the state and the recommended "
            "k are what they are next to the model's `sd_optimal_draft_length`: `agrees`, "
            "`acceptance_guard`, `alert`, `hysteresis`, `stabilization`, `min_interval`, "
            "`no_prediction`, `no_data`, `pending` ([controller](controller.md#reason))"),
    MetricDef(
        "sd_controller_recommended_draft_length", "gauge", ("target", "model_name"),
        help="Draft length with the lowest predicted latency at the live load (0 = SD off), "
             "from the live or the last known good acceptance profile; absent without a valid "
             "prediction.",
        doc="best k at the live load (0 = SD off) among those whose expected acceptance rate "
            "stays ≥ `min_acceptance_rate`; absent without a valid prediction"),
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
        help="Decisions that did not take effect: delivery failed after its retries, or the "
             "server did not report the requested configuration within pending_timeout_seconds.",
        doc="decisions that did not take effect: delivery failed after its retries, or the "
            "server did not report the switch within `pending_timeout_seconds`"),
    MetricDef(
        "sd_controller_models_dropped", "counter", ("target", "reason"),
        help="Models the controller of a target forgot, by reason: retention (gone from the "
             "page for longer than the exporter keeps history), limit (more than 100 models "
             "at once; least recently seen first), vanished_limit or target_removed (the "
             "exporter forgot the model for that reason, so the controller did too).",
        doc="models the controller of a target forgot: `retention` (gone from the page longer "
            "than the exporter keeps history), `limit` (more than 100 models at once; least "
            "recently seen first), `vanished_limit` / `target_removed` (the exporter forgot "
            "the model for that reason, so the controller did too)"),
    MetricDef(
        "sd_switch_latency_ratio", "gauge",
        ("target", "model_name", "action", "latency", "percentile"),
        help="Latency quantile over the decision window after the last switch divided by the "
             "same quantile before it (below 1: the switch helped), for end-to-end latency and "
             "TTFT at the 50th and 99th percentile.",
        doc="quantile of e2e latency (`latency=\"e2e\"`) or TTFT (`\"ttft\"`) over the decision "
            "window after the last switch ÷ the same before it, `percentile` = `50`, `99`. The "
            "label is not `quantile` (architecture.md's spelling): `promtool check metrics` "
            "reserves it for summaries"),
    # The last switch record as calibration points (issue 16, `calibrate --point-sources
    # switches`): the decision window before the switch and the first complete one after.
    MetricDef(
        "sd_switch_timestamp_seconds", "gauge", ("target", "model_name", "action"),
        help="Unix time of the SD switch of the last complete before/after record (the "
             "server came back with the new configuration).",
        doc="Unix time of the switch behind the last complete before/after record (its "
            "`sd_switch_window_*` figures); a new value is a new record"),
    MetricDef(
        "sd_switch_window_latency_seconds", "gauge", _SWITCH_SIDE,
        help="Mean e2e request latency over the decision window before (side=before) or "
             "after (side=after) the last switch.",
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
        help="Proposed draft tokens per draft over the decision window before or after the "
             "last switch (absent on the side with SD off).",
        doc="proposed draft tokens per draft of that window (absent with SD off)"),
    MetricDef(
        "sd_switch_window_acceptance_length", "gauge", _SWITCH_SIDE,
        help="Tokens per verify cycle over the decision window before or after the last "
             "switch (absent on the side with SD off).",
        doc="tokens per verify cycle of that window (absent with SD off)"),
    # Measured A/B pairs (issue 16, specwatch.plugins.pairs.plugin): `target` is the pair's SD side.
    MetricDef(
        "sd_measured_speedup", "gauge", _PAIR_STAT,
        help="Baseline e2e request latency / SD e2e request latency of a pair's targets at the "
             "same arrival rate (> 1: SD is faster), over the finished requests of the bin.",
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
        help="Baseline time to first token / SD time to first token of a pair's targets at the "
             "same arrival rate (> 1: SD is faster), over the finished requests of the bin.",
        doc="the same ratio for time to first token, `statistic` = `p50`, `p99` (only where "
            "the buckets resolve them)"),
    MetricDef(
        "sd_measured_inter_token_latency_ratio", "gauge", _PAIR_STAT,
        help="Baseline inter-token latency / SD inter-token latency of a pair's targets at the "
             "same arrival rate (> 1: SD is faster), over the finished requests of the bin.",
        doc="the same ratio for inter-token latency (`vllm:inter_token_latency_seconds`), "
            "`statistic` = `p50`, `p99`"),
    MetricDef(
        "sd_measured_arrival_rate", "gauge", _PAIR,
        help="Mean arrival rate (requests/s) of a pair's windows in the bin (both sides): where "
             "the measured point sits.",
        doc="mean arrival rate (req/s) of the bin's windows, both sides: the x of a measured "
            "point"),
    MetricDef(
        "sd_measured_requests", "gauge", _PAIR_SIDE,
        help="Finished requests of one side of a pair in the bin (within the retention).",
        doc="finished requests of one side (`sd`, `baseline`) in the bin, within "
            "`pair_options.retention`"),
    MetricDef(
        "sd_pair_current_arrival_rate_bin", "gauge", _PAIR,
        help="1 for the bin and acceptance band the pair is at now (the SD side's current "
             "arrival rate and acceptance rate).",
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
    MetricDef(
        "specwatch_controller_alerts", "counter", ("outcome",),
        help="Alertmanager alerts received by the controller receiver, by outcome (accepted, "
             "resolved, ignored_alertname, ignored_target, ignored_model).",
        doc="Alertmanager alerts received: `accepted`, `resolved`, `ignored_alertname`, "
            "`ignored_target`, `ignored_model`; only with the receiver configured"),
)

BY_NAME: dict[str, MetricDef] = {m.name: m for m in METRICS}


def definition(name: str, kind: str) -> MetricDef:
    """The table's entry for ``name``; a KeyError or TypeError names the mistake (a collector
    bug caught by the first test that scrapes it, never a user-facing error)."""
    try:
        d = BY_NAME[name]
    except KeyError:
        raise KeyError(f"metric {name!r} is not in specwatch.expose.metricdefs.METRICS: "
                       "add it there (then run make generate)") from None
    if d.type != kind:
        raise TypeError(f"metric {name!r} is a {d.type} in metricdefs, built as a {kind}")
    return d


def gauge(name: str, value: float | None = None) -> GaugeMetricFamily:
    """An empty gauge family (or one unlabelled sample ``value``) as the table defines it."""
    d = definition(name, "gauge")
    if value is not None:
        return GaugeMetricFamily(d.name, d.help, value=value)
    return GaugeMetricFamily(d.name, d.help, labels=list(d.labels))


def counter(name: str, value: float | None = None) -> CounterMetricFamily:
    """An empty counter family (or one unlabelled sample ``value``) as the table defines it."""
    d = definition(name, "counter")
    if value is not None:
        return CounterMetricFamily(d.name, d.help, value=value)
    return CounterMetricFamily(d.name, d.help, labels=list(d.labels))


def histogram(name: str) -> HistogramMetricFamily:
    """An empty histogram family as the table defines it."""
    d = definition(name, "histogram")
    return HistogramMetricFamily(d.name, d.help, labels=list(d.labels))
