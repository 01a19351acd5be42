"""prometheus_client custom collector: fresh metric families from the latest snapshot.

Why a custom collector: families are rebuilt on every scrape from one immutable snapshot, so
a label set that disappears (a target down, a model unloaded) disappears from the next
scrape, and two concurrent scrapes never race on shared metric objects
(writing_exporters.md, "Collectors"). collect() does no I/O and never raises: a failure in
one part is logged and the rest, health series first, is still exposed (in client_python a
raising collector turns the whole page into a 500).

Extension point: ``add_family_builder(fn)`` with ``fn(snapshot) -> Iterable[Metric]`` renders
data that hooks attached to the snapshot (issue 3 predictions, issue 7 controller state).

Names, types, labels and HELP texts come from `specwatch.exporter.metricdefs`, the table the
metrics reference is generated from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from specwatch.exporter import derive, metricdefs
from specwatch.exporter.snapshot import POLL_ERROR_REASONS, SERIES_DROP_REASONS, Snapshot

log = logging.getLogger(__name__)

FamilyBuilder = Callable[[Snapshot], Iterable[Metric]]

#: Names of the per-window gauges, in exposition order (type, labels, HELP: metricdefs).
WINDOW_GAUGES: tuple[str, ...] = (
    derive.ACCEPTANCE_RATE, derive.ACCEPTANCE_LENGTH, derive.DRAFT_LENGTH,
    derive.TOKEN_ACCEPTANCE_PROBABILITY, derive.ACCEPTANCE_HETEROGENEITY, derive.ARRIVAL_RATE,
    derive.EFFECTIVE_BATCH_SIZE, derive.MEAN_PROMPT_TOKENS, derive.MEAN_GENERATION_TOKENS,
    derive.MEAN_LATENCY_SECONDS, derive.BIMODALITY_COEFFICIENT,
)
POSITION_GAUGES: tuple[str, ...] = (
    derive.POSITION_ACCEPTANCE_RATE, derive.POSITION_CONDITIONAL_ACCEPTANCE_RATE,
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
    info = metricdefs.gauge("specwatch_build_info")
    info.add_metric([snap.version], 1.0)
    yield info
    up = metricdefs.gauge("specwatch_target_up")
    duration = metricdefs.gauge("specwatch_target_poll_duration_seconds")
    errors = metricdefs.counter("specwatch_target_poll_errors")
    resets = metricdefs.counter("specwatch_target_resets")
    dropped = metricdefs.counter("specwatch_target_series_dropped")
    last = metricdefs.gauge("specwatch_target_last_success_timestamp_seconds")
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
    gauges = {name: metricdefs.gauge(name) for name in WINDOW_GAUGES}
    pos_gauges = {name: metricdefs.gauge(name) for name in POSITION_GAUGES}
    configured = metricdefs.gauge("sd_draft_length_configured")
    samples = metricdefs.histogram("sd_acceptance_rate_samples")
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
