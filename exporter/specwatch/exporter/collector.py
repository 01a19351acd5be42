"""prometheus_client custom collector: fresh metric families from the latest snapshot.

Why a custom collector: families are rebuilt on every scrape from one immutable snapshot, so
a label set that disappears (a target down, a model unloaded) disappears from the next
scrape, and two concurrent scrapes never race on shared metric objects
(writing_exporters.md, "Collectors"). collect() does no I/O and never raises: a failure in
one part is logged and the rest, health series first, is still exposed (in client_python a
raising collector turns the whole page into a 500).

Extension point: ``add_family_builder(fn)`` with ``fn(snapshot) -> Iterable[Metric]`` renders
data that hooks attached to the snapshot (issue 3 predictions, issue 7 controller state).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from specwatch.exporter import derive
from specwatch.exporter.snapshot import POLL_ERROR_REASONS, SERIES_DROP_REASONS, Snapshot

log = logging.getLogger(__name__)

FamilyBuilder = Callable[[Snapshot], Iterable[Metric]]

_WINDOW_NOTE = (" Computed from the exporter's own poll history (every poll interval), so all"
                " Prometheus replicas see the same value.")

#: (metric name, help) of the per-window gauges, in exposition order.
WINDOW_GAUGES: tuple[tuple[str, str], ...] = (
    (derive.ACCEPTANCE_RATE, "Accepted / proposed draft tokens over the window (vLLM's"
     " definition, 0-1)."),
    (derive.ACCEPTANCE_LENGTH, "Tokens committed per verify cycle over the window:"
     " 1 + accepted / drafts (bonus token included)."),
    (derive.DRAFT_LENGTH, "Proposed draft tokens per draft over the window (effective k)."),
    (derive.TOKEN_ACCEPTANCE_PROBABILITY, "Per-token acceptance probability alpha of the"
     " i.i.d. model, solved from the acceptance length and draft length (not the acceptance"
     " rate)."),
    (derive.ACCEPTANCE_HETEROGENEITY, "Share of the maximum possible variance of per-draft"
     " acceptance, (p1 - p0^2) / (p0 (1 - p0)) from positions 0 and 1: 0 homogeneous traffic,"
     " 1 an all-or-nothing mixture. A lower bound when acceptance decays with position."),
    (derive.ARRIVAL_RATE, "Finished requests per second over the window (the arrival rate in"
     " steady state)."),
    (derive.EFFECTIVE_BATCH_SIZE, "Mean requests in flight over the window by Little's law"
     " (arrival rate x mean e2e latency)."),
    (derive.MEAN_PROMPT_TOKENS, "Mean prompt tokens per finished request over the window."),
    (derive.MEAN_GENERATION_TOKENS, "Mean generated tokens per finished request over the"
     " window."),
    (derive.MEAN_LATENCY_SECONDS, "Mean end-to-end request latency over the window."),
    (derive.BIMODALITY_COEFFICIENT, "Sarle's bimodality coefficient of the per-poll-interval"
     " acceptance rates in the window; above 5/9 suggests two populations."),
)
POSITION_GAUGES: tuple[tuple[str, str], ...] = (
    (derive.POSITION_ACCEPTANCE_RATE, "Share of drafts whose token at this position was"
     " accepted, over the window."),
    (derive.POSITION_CONDITIONAL_ACCEPTANCE_RATE, "Acceptance at this position given the"
     " previous position was accepted, over the window."),
)


class SpecwatchCollector(Collector):
    """Renders ``get_snapshot()`` on each collect()."""

    def __init__(self, get_snapshot: Callable[[], Snapshot | None]) -> None:
        self._get_snapshot = get_snapshot
        self._builders: list[FamilyBuilder] = []

    def add_family_builder(self, builder: FamilyBuilder) -> None:
        """Register extra families rendered from the snapshot (see module docstring)."""
        self._builders.append(builder)

    def describe(self) -> list[Metric]:
        # Unchecked collector: the family set depends on the data.
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            snap = self._get_snapshot()
        except Exception:
            log.exception("could not read the snapshot")
            return
        if snap is None:
            return
        parts: list[Callable[[Snapshot], Iterable[Metric]]] = [
            health_families, derived_families, *self._builders]
        for part in parts:
            try:
                families = list(part(snap))
            except Exception:
                log.exception("building metric families with %r failed", part)
                continue
            yield from families


def health_families(snap: Snapshot) -> Iterator[Metric]:
    """specwatch_build_info and the per-target health series (always present per target)."""
    info = GaugeMetricFamily("specwatch_build_info", "specwatch build information (value 1).",
                             labels=["version"])
    info.add_metric([snap.version], 1.0)
    yield info
    up = GaugeMetricFamily("specwatch_target_up",
                           "1 when the last poll of the target succeeded and parsed, else 0.",
                           labels=["target"])
    duration = GaugeMetricFamily("specwatch_target_poll_duration_seconds",
                                 "Duration of the last poll of the target (connect + read).",
                                 labels=["target"])
    errors = CounterMetricFamily("specwatch_target_poll_errors",
                                 "Failed polls of the target by reason (timeout, connection,"
                                 " tls, http_status, parse, too_large).",
                                 labels=["target", "reason"])
    resets = CounterMetricFamily("specwatch_target_resets",
                                 "Polls of the target in which at least one source counter"
                                 " restarted (server, engine or adapter restart).",
                                 labels=["target"])
    dropped = CounterMetricFamily("specwatch_target_series_dropped",
                                  "Source series not used, by reason: max_series (the target's"
                                  " cap), invalid (a model skipped for a page with a NaN,"
                                  " negative or conflicting counter). Whole models are dropped"
                                  " so that published values stay exact.",
                                  labels=["target", "reason"])
    last = GaugeMetricFamily("specwatch_target_last_success_timestamp_seconds",
                             "Unix time of the last successful poll of the target.",
                             labels=["target"])
    for name, t in snap.targets.items():
        up.add_metric([name], 1.0 if t.up else 0.0)
        if t.poll_duration_seconds is not None:
            duration.add_metric([name], t.poll_duration_seconds)
        for reason in POLL_ERROR_REASONS:
            errors.add_metric([name, reason], float(t.errors_total.get(reason, 0)))
        resets.add_metric([name], float(t.counter_resets_total))
        for reason in SERIES_DROP_REASONS:
            dropped.add_metric([name, reason], float(t.series_dropped_total.get(reason, 0)))
        if t.last_success_timestamp is not None:
            last.add_metric([name], t.last_success_timestamp)
    yield from (up, duration, errors, resets, dropped, last)


def derived_families(snap: Snapshot) -> Iterator[Metric]:
    """The sd_* series of every target that is up (a down target exposes none)."""
    gauges = {name: GaugeMetricFamily(name, help_ + _WINDOW_NOTE,
                                      labels=["target", "model_name", "window"])
              for name, help_ in WINDOW_GAUGES}
    pos_gauges = {name: GaugeMetricFamily(name, help_ + _WINDOW_NOTE,
                                          labels=["target", "model_name", "window", "position"])
                  for name, help_ in POSITION_GAUGES}
    configured = GaugeMetricFamily(
        "sd_draft_length_configured",
        "Configured draft length k (number of position series; SGLang: speculative_num_steps).",
        labels=["target", "model_name"])
    samples = HistogramMetricFamily(
        "sd_acceptance_rate_samples",
        "Acceptance rate of each poll interval with enough drafts (one observation per"
        " interval), 0.05-wide buckets.", labels=["target", "model_name"])
    for tname, target in snap.targets.items():
        if not target.up:
            continue
        for mname, model in target.models.items():
            if model.configured_k is not None:
                configured.add_metric([tname, mname], float(model.configured_k))
            for w in model.windows:
                for name, value in w.values.items():
                    fam = gauges.get(name)
                    if fam is not None:
                        fam.add_metric([tname, mname, w.window], value)
                for name, per_pos in w.positions.items():
                    fam = pos_gauges.get(name)
                    if fam is not None:
                        for pos, value in per_pos.items():
                            fam.add_metric([tname, mname, w.window, pos], value)
            h = model.samples
            if h is not None:
                buckets = [(_fmt_bound(b), float(n)) for b, n in
                           zip(h.bounds, h.cumulative_counts, strict=False)]
                buckets.append(("+Inf", float(h.count)))
                samples.add_metric([tname, mname], buckets, h.sum)
    for fam in (*gauges.values(), *pos_gauges.values(), configured, samples):
        if fam.samples:
            yield fam


def _fmt_bound(b: float) -> str:
    return repr(float(b))
