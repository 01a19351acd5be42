"""The exporter's metric catalogue: every series specwatch exposes, with its type, labels, HELP
text and the meaning the metrics reference documents. One source of truth.

Why a table: the collectors build their families from it with :func:`gauge`, :func:`counter`
and :func:`histogram`, and scripts/generate_docs.py writes docs/metrics.md's table from it
(:data:`specwatch.app.catalogue.METRICS`: this module's :data:`METRICS`, then each plug-in's
in the reference's order), so the page cannot drift from what `/metrics` serves
(tests/test_docs_generated.py fails when the page is stale, tests/expose/test_metricdefs.py
when a collector serves a family the table does not define).

Adding a series: add a :class:`MetricDef` here, or in the plug-in's ``metrics`` module (which
:func:`register` s its definitions on import), build the family with ``gauge(NAME)`` /
``counter(NAME)`` / ``histogram(NAME)``, then run ``make generate`` to refresh the reference.

Names only: nothing here knows how a value is computed. ``name`` is the family name as
prometheus_client takes it: a counter's exposed name adds ``_total``
(:attr:`MetricDef.exposed_name`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from specwatch.poll import signals

#: A HELP line is one plain sentence of at most this many characters; formulas and caveats
#: go in ``doc`` (docs/metrics.md).
HELP_MAX_CHARS = 100
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


#: The exposition hub's own series: the poll path's derived signals, target health and the
#: exporter's HTTP server. Plug-ins define theirs in their own modules and :func:`register`
#: them.
METRICS: tuple[MetricDef, ...] = (
    MetricDef(
        signals.ACCEPTANCE_RATE, "gauge", ("target", "model_name", "window"),
        help="Share of proposed draft tokens accepted over the window (vLLM's acceptance rate).",
        doc="accepted / proposed draft tokens (vLLM's definition)"),
    MetricDef(
        signals.ACCEPTANCE_LENGTH, "gauge", ("target", "model_name", "window"),
        help="Tokens committed per verify cycle over the window, bonus token included.",
        doc="tokens committed per verify cycle, 1 + accepted / drafts (bonus token included), "
            "1 … k + 1"),
    MetricDef(
        signals.DRAFT_LENGTH, "gauge", ("target", "model_name", "window"),
        help="Draft tokens proposed per draft over the window (the effective draft length).",
        doc="proposed draft tokens per draft: the effective k (below the configured k with "
            "n-gram misses, dynamic SD, suffix decoding)"),
    MetricDef(
        "sd_draft_length_configured", "gauge", ("target", "model_name"),
        help="Configured draft length k (number of position series; SGLang: "
             "speculative_num_steps).",
        doc="configured k: number of `position` series (SGLang: `speculative_num_steps`)"),
    MetricDef(
        "sd_server_kv_cache_tokens", "gauge", ("target",),
        help="KV-cache capacity in tokens, as the server states it (summed over its engines).",
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
        help="Most requests the server runs at once, from the target's max_num_seqs setting.",
        doc="`targets[].max_num_seqs` of the configuration (vLLM's `--max-num-seqs`, which "
            "no vLLM page states); absent when not configured"),
    MetricDef(
        signals.TOKEN_ACCEPTANCE_PROBABILITY, "gauge", ("target", "model_name", "window"),
        help="Per-token acceptance probability of the i.i.d. model (not the acceptance rate).",
        doc="per-token α of the i.i.d. model: E = (1 − α^(k+1)) / (1 − α) solved by bisection "
            "with k = `sd_draft_length`; not the acceptance rate"),
    MetricDef(
        signals.ACCEPTANCE_ALPHA, "gauge", ("target", "model_name", "window", "method"),
        help="Acceptance that does not fall with k: first-position acceptance, else per-token "
             "alpha.",
        doc="the draft-length-independent acceptance α the acceptance alert reads: "
            "`method=\"first_position\"`, the share of drafts whose first token was accepted "
            "(`sd_position_acceptance_rate{position=\"0\"}`), where the engine counts "
            "positions; else `method=\"per_token\"`, `sd_token_acceptance_probability`. "
            "Unlike `sd_acceptance_rate` it does not fall with k by construction (later "
            "positions are accepted less often); at k = 1 it equals the rate. Absent when "
            "neither exists"),
    MetricDef(
        signals.POSITION_ACCEPTANCE_RATE, "gauge", ("target", "model_name", "window", "position"),
        help="Share of drafts whose token at this position was accepted, over the window.",
        doc="share of drafts whose token at `position` was accepted, p_i"),
    MetricDef(
        signals.POSITION_CONDITIONAL_ACCEPTANCE_RATE, "gauge",
        ("target", "model_name", "window", "position"),
        help="Acceptance at this position when the previous one was accepted, over the window.",
        doc="p_i / p_(i−1): acceptance at `position` given the previous one was accepted"),
    MetricDef(
        signals.ACCEPTANCE_HETEROGENEITY, "gauge", ("target", "model_name", "window"),
        help="How much acceptance differs between drafts: 0 all alike, 1 all or nothing.",
        doc="(p_1 − p_0²) / (p_0 (1 − p_0)), 0 … 1: spread of acceptance across drafts (next "
            "section)"),
    MetricDef(
        signals.ARRIVAL_RATE, "gauge", ("target", "model_name", "window"),
        help="Finished requests per second over the window (the arrival rate in steady state).",
        doc="finished requests per second (= arrival rate in steady state; 0 on an idle "
            "server: a true value over elapsed time)"),
    MetricDef(
        signals.EFFECTIVE_BATCH_SIZE, "gauge", ("target", "model_name", "window"),
        help="Mean requests in flight over the window (arrival rate times mean latency).",
        doc="mean requests in flight, Little's law λ · L"),
    MetricDef(
        signals.MEAN_PROMPT_TOKENS, "gauge", ("target", "model_name", "window"),
        help="Mean prompt tokens per finished request over the window.",
        doc="mean prompt tokens per finished request"),
    MetricDef(
        signals.MEAN_GENERATION_TOKENS, "gauge", ("target", "model_name", "window"),
        help="Mean generated tokens per finished request over the window.",
        doc="mean generated tokens per finished request"),
    MetricDef(
        signals.MEAN_LATENCY_SECONDS, "gauge", ("target", "model_name", "window"),
        help="Mean end-to-end request latency over the window.",
        doc="mean end-to-end request latency"),
    MetricDef(
        "sd_acceptance_rate_samples", "histogram", ("target", "model_name"),
        help="Acceptance rate of each poll interval with enough drafts.",
        doc="one observation per poll interval with ≥ `min_drafts_per_sample` drafts: that "
            "interval's acceptance rate; buckets 0.05 wide"),
    MetricDef(
        signals.BIMODALITY_COEFFICIENT, "gauge", ("target", "model_name", "window"),
        help="Bimodality of per-interval acceptance rates; above 5/9 suggests two kinds of "
             "traffic.",
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
        help="Source series of the target not used, by reason (max_series, invalid).",
        doc="source series not used: `max_series` (whole models beyond the target's cap), "
            "`invalid` (a counter series NaN, ±Inf, negative, above 2⁵³ or listed twice with "
            "different values on one page: the windows that end or start at that poll take "
            "the signals that read it from the polls around it, as across a failed poll; it "
            "catches up at its next valid value; or a stated KV-cache total, summed over "
            "engines or blocks × block size, that is not finite: `sd_server_kv_cache_*` is "
            "then absent)"),
    MetricDef(
        "specwatch_target_models_dropped", "counter", ("target", "reason"),
        help="Models of the target dropped to keep the exporter's state bounded, by reason.",
        doc="models dropped to keep the exporter's state bounded: `max_models` (more models "
            "on one page than `targets[].max_models`, default 100; the extra ones, by name "
            "after the models already followed, are not followed; counted on each such "
            "poll), `vanished_limit` (a vanished model forgotten before the end of the "
            "retention, oldest first, when the remembered vanished models pass "
            "`max_models`). The first drop of each reason is logged once"),
    MetricDef(
        "specwatch_target_label_values_truncated", "counter", ("target",),
        help="Label values from the target cut to the length limit (a hash keeps them distinct).",
        doc="distinct label values per poll read from the target (model names, positions) "
            "longer than `global.max_label_value_bytes` (default 256 bytes), cut and "
            "suffixed with `~` and 12 hex digits of their SHA-256, so distinct long values "
            "stay distinct and a series keeps its history"),
    MetricDef(
        "specwatch_target_resets", "counter", ("target",),
        help="Polls in which a source counter of the target restarted (server or engine restart).",
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
        help="Targets known to this exporter, of every shard (it polls those of its own shard).",
        doc="targets known to this exporter, static and `file_sd`, of every shard; it polls "
            "those of its shard (`global.shard_index` of `global.shard_count`)"),
    MetricDef(
        "specwatch_sd_file_read_errors", "counter", (),
        help="file_sd files that could not be read or parsed (their previous targets are kept).",
        doc="with `file_sd`: files that could not be read or parsed (their previous targets "
            "are kept)"),
    MetricDef(
        "specwatch_http_requests_rejected", "counter", ("reason",),
        help="Requests and connections the exporter's HTTP server refused, by reason.",
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
)

#: Every definition the builders know: :data:`METRICS`, then what plug-ins registered.
BY_NAME: dict[str, MetricDef] = {m.name: m for m in METRICS}


def register(defs: Iterable[MetricDef]) -> None:
    """Add a plug-in's definitions to the catalogue (again with the same definition: no-op)."""
    for d in defs:
        known = BY_NAME.setdefault(d.name, d)
        if known != d:
            raise ValueError(f"metric {d.name!r} is defined twice, differently")


def definition(name: str, kind: str) -> MetricDef:
    """The table's entry for ``name``; a KeyError or TypeError names the mistake (a collector
    bug caught by the first test that scrapes it, never a user-facing error)."""
    try:
        d = BY_NAME[name]
    except KeyError:
        raise KeyError(f"metric {name!r} is not in specwatch.expose.metricdefs.METRICS nor "
                       "registered by a plug-in: add it there (then run make generate)"
                       ) from None
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
