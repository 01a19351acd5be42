"""The immutable objects the collector renders: one :class:`Snapshot` per poll cycle.

Why immutable: the poller threads publish a new snapshot by swapping one reference, and any
number of concurrent scrapes read the snapshot they got without locks, never a half-updated
mix of two polls.

Extension points (a plug-in needs no change here): a *target hook* registered on
:class:`specwatch.poll.pipeline.Pipeline` copies the target with what it adds, and a family
builder registered on the collector renders it. What a plug-in adds lives in typed *slots*:
each plug-in defines a :class:`Slot` key (``PREDICTION = Slot("live.prediction",
LivePrediction)``), writes it with :meth:`ModelSnapshot.with_slot` /
:meth:`TargetSnapshot.with_model_slot` / :meth:`TargetSnapshot.with_slot`, and reads it with
``snapshot.slot(KEY)``, typed ``LivePrediction | None``. Why keys rather than Protocols
declared here: the poll path cannot import a plug-in's types and has nothing to ask of them;
a key carries the type to the reader, keeps the plug-ins out of this module and out of each
other, and a value of another type reads as absent. Slots are stored in ``extensions``.
``server`` is the poll path's own :class:`~specwatch.poll.sources.ServerCapacity`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from specwatch.poll.sources import ServerCapacity

T = TypeVar("T")

#: The reasons a poll fails, exposed as ``specwatch_target_poll_errors_total{reason}``.
POLL_ERROR_REASONS: tuple[str, ...] = ("timeout", "connection", "tls", "http_status",
                                       "parse", "too_large")
#: Why source series were dropped, ``specwatch_target_series_dropped_total{reason}``:
#: ``max_series`` (the target's cap; whole models beyond it) and ``invalid`` (a model skipped
#: for one page because a counter was NaN, infinite, negative or listed twice).
SERIES_DROP_REASONS: tuple[str, ...] = ("max_series", "invalid")
#: Why models of a target were dropped, ``specwatch_target_models_dropped_total{reason}``:
#: ``max_models`` (more live models on a page than the target's cap; the extra
#: ones are not taken in) and ``vanished_limit`` (a remembered vanished model forgotten,
#: oldest first, to make room). Models forgotten after the retention are not drops.
MODEL_DROP_REASONS: tuple[str, ...] = ("max_models", "vanished_limit")


@dataclass(frozen=True)
class Slot(Generic[T]):
    """A typed key of a snapshot's ``extensions``: ``name`` (unique, prefixed by the plug-in)
    and the type its value has."""

    name: str
    kind: type[T]

    def read(self, extensions: Mapping[str, Any]) -> T | None:
        """The value in ``extensions``, or None when absent or of another type."""
        value = extensions.get(self.name)
        return value if isinstance(value, self.kind) else None


@dataclass(frozen=True)
class WindowSignals:
    """Derived signals of one model over one window.

    ``values`` maps a metric name (``sd_acceptance_rate``...) to its value and holds only the
    signals that have data in this window: a missing key means "absent", never 0.
    ``positions`` maps a per-position metric name to ``{position: value}``.
    ``span_seconds`` and ``requests`` describe the window actually used (the count window's
    span varies; a time window at start-up may be shorter than its nominal length).
    """

    window: str
    values: Mapping[str, float]
    positions: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    span_seconds: float = 0.0
    requests: float = 0.0
    #: Draft volume of the window: drafts (vLLM v1 >= 0.8.5), verify calls (SGLang), else
    #: proposed draft tokens (older vLLM); 0 when nothing was drafted (or SD is off).
    drafts: float = 0.0
    #: Bucket increases of the latency histograms over the window, keyed by
    #: :data:`specwatch.poll.windows.plan.LATENCY_HISTOGRAMS` names: ((upper bound,
    #: cumulative count), ...) sorted by bound, +Inf last. Feeds quantiles (the controller's
    #: before/after record).
    histograms: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class SampleHistogram:
    """Lifetime histogram of per-poll-interval acceptance rates (cumulative bucket counts)."""

    bounds: tuple[float, ...]
    cumulative_counts: tuple[int, ...]  # one per bound, then +Inf (== count)
    sum: float
    count: int


@dataclass(frozen=True)
class ModelSnapshot:
    """Everything exposed for one model of one target."""

    model_name: str
    engine: str
    configured_k: int | None
    windows: tuple[WindowSignals, ...]
    samples: SampleHistogram | None = None
    gauges: Mapping[str, float] = field(default_factory=dict)
    #: True when the latest page has vLLM's SD counters for this model (they exist only with
    #: --speculative-config, whatever the traffic); SGLang shows SD by its gauges instead.
    sd_families_present: bool = False
    #: The plug-ins' slots (:class:`Slot`), by slot name.
    extensions: Mapping[str, Any] = field(default_factory=dict)

    def slot(self, key: Slot[T]) -> T | None:
        """This model's value of a plug-in's slot, or None."""
        return key.read(self.extensions)

    def with_slot(self, key: Slot[T], value: T) -> ModelSnapshot:
        """A copy with the slot set (the original is unchanged)."""
        return dataclasses.replace(self, extensions={**self.extensions, key.name: value})

    def window(self, label: str) -> WindowSignals | None:
        """The window with this label (``"5m"``, ``"1000req"``), or None when absent."""
        for w in self.windows:
            if w.window == label:
                return w
        return None


@dataclass(frozen=True)
class TargetSnapshot:
    """Health and derived data of one target.

    A target that is down has ``up=False`` and an empty ``models`` mapping: no derived
    series are exposed for it (no stale values) until a poll succeeds again.
    """

    name: str
    up: bool
    timestamp: float | None = None  # poll clock time of the last poll (success or failure)
    poll_duration_seconds: float | None = None
    errors_total: Mapping[str, int] = field(
        default_factory=lambda: dict.fromkeys(POLL_ERROR_REASONS, 0))
    counter_resets_total: int = 0
    #: Source series dropped over the exporter's life, by reason (SERIES_DROP_REASONS).
    series_dropped_total: Mapping[str, int] = field(
        default_factory=lambda: dict.fromkeys(SERIES_DROP_REASONS, 0))
    #: Models dropped over the exporter's life, by reason (MODEL_DROP_REASONS).
    models_dropped_total: Mapping[str, int] = field(
        default_factory=lambda: dict.fromkeys(MODEL_DROP_REASONS, 0))
    #: Label values (model names, positions...) cut to the length limit, over its life.
    label_values_truncated_total: int = 0
    last_success_timestamp: float | None = None
    last_error: str | None = None
    engine: str = "unknown"
    models: Mapping[str, ModelSnapshot] = field(default_factory=dict)
    #: What the server's last page says about its capacity; None when it says nothing or the
    #: target is down.
    server: ServerCapacity | None = None
    #: The plug-ins' per-target slots (:class:`Slot`), by slot name.
    extensions: Mapping[str, Any] = field(default_factory=dict)

    def replaced(self, **changes: Any) -> TargetSnapshot:
        """A copy with ``changes`` (by field name): what :func:`dataclasses.replace` gives,
        without running ``__init__`` again, which sets every field through the frozen
        class's guard (no field is computed or checked there): a target hook copies every
        target on every poll."""
        unknown = changes.keys() - _TARGET_FIELDS
        if unknown:
            raise TypeError(f"TargetSnapshot has no field {sorted(unknown)[0]!r}")
        new = object.__new__(TargetSnapshot)
        fields = new.__dict__
        fields.update(self.__dict__)
        fields.update(changes)
        return new

    def slot(self, key: Slot[T]) -> T | None:
        """This target's value of a plug-in's slot, or None."""
        return key.read(self.extensions)

    def with_slot(self, key: Slot[T], value: T) -> TargetSnapshot:
        """A copy with the target's slot set."""
        return self.replaced(extensions={**self.extensions, key.name: value})

    def with_model_slot(self, model_name: str, key: Slot[T], value: T) -> TargetSnapshot:
        """A copy with one model's slot set."""
        models = dict(self.models)
        models[model_name] = models[model_name].with_slot(key, value)
        return self.replaced(models=models)


_TARGET_FIELDS = frozenset(f.name for f in dataclasses.fields(TargetSnapshot))


@dataclass(frozen=True)
class Snapshot:
    """The whole exporter state at one instant; ``targets`` keeps configuration order."""

    version: str
    targets: Mapping[str, TargetSnapshot]
    created_at: float = 0.0
