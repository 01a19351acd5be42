"""One `/metrics` page read into canonical signals, through the engine modules.

It turns one page into *canonical signals* (:mod:`specwatch.engines.base`): per-series
cumulative values keyed by ``(model_name, signal, identity)``, where ``identity`` is every
label except ``model_name`` (``engine``, ``position``, ``finished_reason``, ``is_streaming``,
ranks...). Keeping every series apart is what lets :mod:`specwatch.poll.windows.history` detect a
counter reset per series *before* summing over ``engine`` (one data-parallel rank restarting
among eight is invisible in the sum).

Which sample carries which signal, how a page is recognised and what each engine can give
are the engine modules' (:mod:`specwatch.engines`; asked through
:mod:`specwatch.engines.registry`); none is named here.

Pitfalls handled here (reference: vllm-metrics.md §7): samples are matched on the *sample*
name (prometheus_client returns counters under the base family name), ``*_created`` samples
are kept apart (they mark resets, they are not values), and a histogram whose samples end in
``_total_bucket`` never matches a counter name.

The page plan (:mod:`specwatch.poll.pageplan`) builds on this module, not the other way round.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from prometheus_client.parser import text_string_to_metric_families

from specwatch.engines import registry
from specwatch.engines.base import (  # noqa: F401  (the canonical names, read through here)
    ACCEPTED_PER_POSITION,
    ACCEPTED_TOKENS,
    BUCKET_SIGNALS,
    CACHE_CONFIG,
    DRAFT_TOKENS,
    DRAFTS,
    E2E_LATENCY_BUCKET,
    E2E_LATENCY_COUNT,
    E2E_LATENCY_SUM,
    EMITTED_TOKENS,
    FIRST_POSITION,
    GENERATION_LEN_COUNT,
    GENERATION_LEN_SUM,
    GENERATION_TOKENS,
    INTERVAL_ACCEPTANCE_RATE,
    INTERVAL_EFFICIENCY,
    ITL_BUCKET,
    PROMPT_LEN_COUNT,
    PROMPT_LEN_SUM,
    PROMPT_TOKENS,
    REQUESTS_FINISHED,
    RUNNING,
    SPEC_DRAFT_TOKENS,
    SPEC_STEPS,
    TTFT_BUCKET,
    TTFT_COUNT,
    TTFT_SUM,
    VERIFY_CALLS,
    WAITING,
    Engine,
    PageView,
    Reading,
)
from specwatch.poll.capacity import ServerCapacity, gauge_capacity, server_capacity
from specwatch.poll.fastparse import (
    LABEL_CACHE_MAX_KEY,
    LABEL_CACHE_SIZE,
    RawSample,
    SampleSelector,
    before_eof,
)

#: The ``engine:`` settings of the built-in engines (the families, then "auto").
ENGINE_KINDS: tuple[str, ...] = registry.config_kinds()

#: Largest counter value taken as real: 2**53, where float64 stops counting integers
#: (thousands of years of tokens at a million a second). Beyond it deltas are noise and
#: sums overflow, so such a value makes its model invalid for the page like NaN does.
MAX_COUNTER_VALUE = float(2**53)

#: Label set of one series minus ``model_name``, sorted: what makes the series unique.
Identity = tuple[tuple[str, str], ...]
#: (model_name, canonical signal, identity)
SeriesKey = tuple[str, str, Identity]


class PageParseError(ValueError):
    """The body is not a Prometheus text page (the poller counts reason="parse")."""


@dataclass(frozen=True)
class ParsedPage:
    """Everything specwatch reads from one page, in canonical names.

    ``counters`` and ``created`` are per series (never summed here); ``gauges`` are already
    aggregated per model because gauges have no reset problem. ``engine`` is the detected
    kind: the ``kind`` of the engine module that recognised the page, or "unknown" (a page
    with no known family).
    """

    engine: str
    counters: Mapping[SeriesKey, float]
    created: Mapping[SeriesKey, float] = field(default_factory=dict)
    gauges: Mapping[tuple[str, str], float] = field(default_factory=dict)
    configured_k: Mapping[str, int] = field(default_factory=dict)
    process_start_time: float | None = None
    #: Counter series left out of ``counters`` because their value is invalid on this page,
    #: and capacity totals left unknown because they are not finite (``server.overflowed``).
    invalid_series: int = 0
    #: Models with an invalid counter series on this page (sorted).
    invalid_models: tuple[str, ...] = ()
    #: Distinct label values cut to the length limit on this page.
    truncated_label_values: int = 0
    #: What the server says about its capacity (vLLM's cache_config_info); None: not said.
    server: ServerCapacity | None = None
    #: The keys of the invalid counter series: their value on this page is unknown (the
    #: history marks what they add to as unknown for this poll; see parse_page).
    invalid_counters: frozenset[SeriesKey] = frozenset()

    @functools.cached_property
    def models(self) -> frozenset[str]:
        """Model names with at least one recognised series on this page (computed once)."""
        return frozenset({k[0] for k in self.counters} | {m for m, _ in self.gauges}
                         | {k[0] for k in self.invalid_counters})

    def only_models(self, keep: frozenset[str]) -> ParsedPage:
        """This page restricted to the models in ``keep``."""
        return dataclasses.replace(
            self,
            counters={k: v for k, v in self.counters.items() if k[0] in keep},
            created={k: v for k, v in self.created.items() if k[0] in keep},
            gauges={k: v for k, v in self.gauges.items() if k[0] in keep},
            configured_k={m: k for m, k in self.configured_k.items() if m in keep},
            invalid_counters=frozenset(k for k in self.invalid_counters if k[0] in keep))


#: How a page is turned into samples: "fast" (only the families read here, see
#: :mod:`specwatch.poll.fastparse`) or "full" (prometheus_client's parser over the whole page).
PARSERS: tuple[str, ...] = ("fast", "full")
PROCESS_START = "process_start_time_seconds"


# What a sample is to parse_page (_Series.kind).
COUNTER_SAMPLE, CREATED_SAMPLE, GAUGE_SAMPLE, PROCESS_START_SAMPLE, INFO_SAMPLE = range(5)
#: A sample of a family read through an engine's :class:`~specwatch.engines.base.Reading`
#: (``sig`` holds the sample name): the parse's slower path, and no page plan.
READINGS_SAMPLE = 5


class _Series(NamedTuple):
    """Everything parse_page derives from a sample's name and labels, not from its value:
    computed once per series (see _Names.series) instead of once per sample and poll."""

    kind: int
    sig: str
    model: str
    identity: Identity
    #: (model, sig, identity): the key of counters, created and gauge_series.
    key: SeriesKey
    #: The ``position`` label of a per-position counter, else None.
    position: str | None
    #: Longest label value in characters (truncation is needed only above limit / 4).
    longest: int


class _ReadSeries(NamedTuple):
    """One canonical series a :class:`~specwatch.engines.base.Reading` gives for a sample."""

    sig: str
    identity: Identity
    position: str | None
    value_label: str | None
    gauge: bool


@dataclass(frozen=True)
class _Names:
    counters: dict[str, str]
    gauges: dict[str, str]
    created: dict[str, str]
    infos: dict[str, str]
    #: Info sample name -> the labels read from it.
    info_labels: dict[str, tuple[str, ...]]
    #: Sample name -> its readings (see :data:`READINGS_SAMPLE`).
    readings: dict[str, tuple[Reading, ...]]
    selector: SampleSelector
    #: sample key (see fastparse.RawSample: name and labels as written) -> what they mean.
    #: Bounded like the selector's label cache; the same series recur on every poll.
    series: dict[str, _Series] = field(default_factory=dict)
    #: (sample name, identity) -> the series its readings give, bounded likewise.
    read_series: dict[tuple[str, Identity], tuple[_ReadSeries, ...]] = field(
        default_factory=dict)
    #: Sample name -> the model of its series without ``model_name`` (Engine.unlabelled_model).
    unlabelled: dict[str, str] = field(default_factory=dict)

    @property
    def wanted(self) -> frozenset[str]:
        return self.selector.names

    def describe(self, name: str, labels: Mapping[str, str]) -> _Series:
        """What the wanted sample ``name{labels}`` is (one of the tables, or the start time)."""
        if name in self.infos:  # server-wide: only the labels read, no model
            identity: Identity = tuple(sorted(
                (k, labels[k]) for k in self.info_labels[name] if k in labels))
            sig = self.infos[name]
            return _Series(INFO_SAMPLE, sig, "", identity, ("", sig, identity), None, 0)
        model = labels.get("model_name") or self.unlabelled.get(name, "")
        identity = tuple(sorted(
            (k, v) for k, v in labels.items() if k != "model_name"))
        longest = max(map(len, labels.values()), default=0)
        position = None
        if name in self.counters:
            kind, sig = COUNTER_SAMPLE, self.counters[name]
            if sig == ACCEPTED_PER_POSITION:
                position = labels.get("position")
        elif name in self.created:
            kind, sig = CREATED_SAMPLE, self.created[name]
        elif name in self.gauges:
            kind, sig = GAUGE_SAMPLE, self.gauges[name]
        elif name in self.readings:
            kind, sig = READINGS_SAMPLE, name
        else:
            kind, sig = PROCESS_START_SAMPLE, ""
        return _Series(kind, sig, model, identity, (model, sig, identity), position, longest)

    def read(self, name: str, identity: Identity) -> tuple[_ReadSeries, ...]:
        """The series the readings of sample ``name`` give for one identity (remembered)."""
        found = self.read_series.get((name, identity))
        if found is not None:
            return found
        labels = dict(identity)
        out = []
        for r in self.readings[name]:
            if any(labels.get(k) != v for k, v in r.where):
                continue
            ident = tuple(sorted((r.rename.get(k, k), v) for k, v in identity))
            position = dict(ident).get("position") if r.signal == ACCEPTED_PER_POSITION \
                else None
            out.append(_ReadSeries(r.signal, ident, position, r.value_label, r.gauge))
        if len(self.read_series) >= LABEL_CACHE_SIZE:
            self.read_series.clear()
        found = self.read_series[(name, identity)] = tuple(out)
        return found

    def cached(self, key: str, name: str, labels: Mapping[str, str]) -> _Series:
        """describe(), remembered under the sample key (bounded by :data:`LABEL_CACHE_SIZE`)."""
        found = self.describe(name, labels)
        if len(key) <= LABEL_CACHE_MAX_KEY:
            if len(self.series) >= LABEL_CACHE_SIZE:
                self.series.clear()
            self.series[key] = found
        return found


def _names(engine: str, buckets: bool = True) -> _Names:
    """The names a target with ``engine: engine`` reads (kept until an engine is added)."""
    return _names_of(engine, buckets, registry.generation())


@functools.cache
def _names_of(engine: str, buckets: bool, generation: int) -> _Names:
    counter_names: dict[str, str] = {}
    gauge_names: dict[str, str] = {}
    infos: dict[str, str] = {}
    info_labels: dict[str, tuple[str, ...]] = {}
    readings: dict[str, tuple[Reading, ...]] = {}
    unlabelled: dict[str, str] = {}
    for e in registry.for_setting(engine):
        counter_names.update(e.counters)
        gauge_names.update(e.gauges)
        readings.update(e.readings)
        if e.unlabelled_model:
            unlabelled.update(dict.fromkeys((*e.counters, *e.gauges), e.unlabelled_model))
        for name, info in e.infos.items():
            infos[name] = info.signal
            info_labels[name] = info.labels
    if not buckets:
        counter_names = {n: s for n, s in counter_names.items() if s not in BUCKET_SIGNALS}
        readings = {n: kept for n, rs in readings.items()
                    if (kept := tuple(r for r in rs if r.signal not in BUCKET_SIGNALS))}
    created_names = {n[: -len("_total")] + "_created": s for n, s in counter_names.items()
                     if n.endswith("_total")}
    wanted = {*counter_names, *gauge_names, *created_names, *infos, *readings, PROCESS_START}
    return _Names(counter_names, gauge_names, created_names, infos, info_labels, readings,
                  SampleSelector(wanted, prefixes=registry.prefixes()), unlabelled=unlabelled)


def _full_samples(text: str, wanted: frozenset[str]) -> tuple[list[RawSample], set[str]]:
    """Every wanted sample through prometheus_client's parser, and the prefixes seen."""
    samples: list[RawSample] = []
    seen: set[str] = set()
    prefixes = registry.prefixes()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            seen.update(p for p in prefixes if name.startswith(p))
            if name in wanted:
                samples.append((name, sample.labels, sample.value, None))
    return samples, seen


#: Default longest label value taken from a target, in UTF-8 bytes (``global.
#: max_label_value_bytes``).
DEFAULT_MAX_LABEL_VALUE_BYTES = 256


def truncate_label_value(value: str, limit: int) -> str:
    """``value`` if it fits in ``limit`` UTF-8 bytes, else its start and ``~`` + the first
    12 hex digits of its SHA-256, ``limit`` bytes at most.

    Why a hash suffix: two long model names that share their first bytes must stay two
    series; the suffix is stable, so a name cut the same way on every poll keeps its history.
    """
    raw = value.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return value
    suffix = "~" + hashlib.sha256(raw).hexdigest()[:12]
    keep = max(0, limit - len(suffix))
    return raw[:keep].decode("utf-8", "ignore") + suffix


def _truncated(model: str, identity: Identity, limit: int, seen: set[str]
               ) -> tuple[str, Identity]:
    out = truncate_label_value(model, limit)
    if out is not model:
        seen.add(out)
    ident = []
    for k, v in identity:
        short = truncate_label_value(v, limit)
        if short is not v:
            seen.add(short)
        ident.append((k, short))
    return out, tuple(ident)


class SteadyPlan(Protocol):
    """What :func:`parse_page` asks of a target's plan
    (:class:`specwatch.poll.pageplan.PagePlan`)."""

    key: tuple[str, bool, int | None] | None

    def parse(self, text: str, selector: SampleSelector) -> ParsedPage | None:
        """The page, when its wanted lines are the plan's; None otherwise."""

    def learn(self, key: tuple[str, bool, int | None], text: str, heads: list[str],
              rows: list[tuple[int, SeriesKey]], positions: dict[str, set[str]],
              truncated: int) -> None:
        """Remember this page when it allows a plan."""


def parse_page(text: str, engine: str = "auto", parser: str = "fast",
               max_label_value_bytes: int | None = None, buckets: bool = True,
               plan: SteadyPlan | None = None) -> ParsedPage:
    """Parse a `/metrics` body into canonical signals.

    ``engine`` restricts the names considered to one family of engines (a target's
    ``engine:`` setting, :func:`specwatch.engines.registry.config_kinds`) or accepts every
    engine's ("auto"; the prefixes never collide). ``parser`` is "fast" (parse only the
    families read here; the same result as "full" on every page prometheus_client accepts, see
    :mod:`specwatch.poll.fastparse`) or "full" (prometheus_client's parser over the whole page:
    the baseline).

    A counter that is NaN, infinite, negative or above MAX_COUNTER_VALUE, or a counter
    series listed twice with different values, is *unknown* on this page: it is left out of
    ``counters``, its key is in ``invalid_counters`` (counted in ``invalid_series``) and the
    rest of its model is read as usual (docs/exporter.md, "Invalid counters").
    ``max_label_value_bytes``: label values longer than this (UTF-8 bytes) are cut by
    :func:`truncate_label_value` and counted in ``truncated_label_values`` (None: kept whole).
    ``buckets``: False leaves the latency histograms' bucket series (:data:`BUCKET_SIGNALS`)
    out, neither parsed nor checked; the page is otherwise the same.
    ``plan``: a :class:`~specwatch.poll.pageplan.PagePlan` kept per target across its pages
    (fast parser only): a page whose wanted lines are those of the page before, in the same
    order, only their values changed, is parsed from it; the result is the same.
    The page ends at an OpenMetrics ``# EOF`` line: what follows is never read, by either
    parser (the fast one's finder stops there; the full one reads ``fastparse.before_eof``)
    or a plan.
    Raises :class:`PageParseError` when prometheus_client's parser rejects the text, and
    when the text ends inside a line (the last line has no line feed), for both parsers:
    such a page is one a Prometheus rejects, and it is what a page cut in transit looks
    like. A page cut just after a line feed is a valid shorter page for every parser.
    """
    if engine not in registry.config_kinds():
        raise ValueError(f"unknown engine kind {engine!r}")
    if parser not in PARSERS:
        raise ValueError(f"unknown parser {parser!r}")
    if not text.endswith("\n") and text[text.rfind("\n") + 1:].strip() \
            and not (cut := before_eof(text)).endswith("\n") \
            and cut[cut.rfind("\n") + 1:].strip():
        raise PageParseError(
            "the page ends inside a line (its last line has no line feed): a cut page")
    names = _names(engine, buckets)
    plan_key = (engine, buckets, max_label_value_bytes)
    if plan is not None and parser == "fast":
        if plan.key == plan_key:
            steady = plan.parse(text, names.selector)
            if steady is not None:
                return steady
        plan.key = None  # rebuilt below when this page allows it
    # What the plan needs of this page: each sample's kind and key (None: no plan).
    rows: list[tuple[int, SeriesKey]] | None = [] if plan is not None else None
    try:
        selection = names.selector.select(text) if parser == "fast" else None
        if selection is not None:
            samples, saw = selection.samples, selection.saw
            if selection.seen:
                rows = None
        else:
            samples, seen_prefixes = _full_samples(before_eof(text), names.wanted)
            saw = seen_prefixes.__contains__
            rows = None
        got = _Read(rows)
        got.read(samples, names, max_label_value_bytes)
    except Exception as exc:  # the parser raises ValueError, IndexError, ... on garbage
        raise PageParseError(f"not a Prometheus text exposition: {exc}") from exc
    if got.rows is not None and plan is not None and not got.invalid:
        heads = [s[3] for s in samples if s[3] is not None]  # all of them: rows is not None
        plan.learn(plan_key, text, heads, got.rows, got.positions, len(got.truncated))
    return assemble_page(got.counters, got.created, got.gauge_series, got.positions,
                         got.process_start, got.invalid, len(got.truncated), saw, got.infos)


class _Read:
    """The values of a page's wanted samples by series, with the value rules applied."""

    __slots__ = ("counters", "created", "gauge_series", "infos", "invalid", "positions",
                 "process_start", "rows", "truncated")

    def __init__(self, rows: list[tuple[int, SeriesKey]] | None) -> None:
        self.counters: dict[SeriesKey, float] = {}
        self.created: dict[SeriesKey, float] = {}
        self.gauge_series: dict[SeriesKey, float] = {}
        self.infos: dict[SeriesKey, float] = {}
        self.positions: dict[str, set[str]] = {}
        self.process_start: float | None = None
        self.invalid: set[SeriesKey] = set()
        self.truncated: set[str] = set()
        #: Each sample's kind and key, for a plan (None: this page allows none).
        self.rows = rows

    def read(self, samples: list[RawSample], names: _Names,
             max_label_value_bytes: int | None) -> None:
        """Take every sample: what it is (remembered per sample key), its label values cut
        to the limit, and its value checked (counters) or kept when finite."""
        counters, created, gauge_series = self.counters, self.created, self.gauge_series
        positions, invalid, truncated, rows = (self.positions, self.invalid, self.truncated,
                                               self.rows)
        # A character is at most 4 UTF-8 bytes: values of fewer characters cannot pass the
        # limit.
        short_enough = (max_label_value_bytes // 4 if max_label_value_bytes is not None
                        else math.inf)
        isfinite = math.isfinite
        known = names.series.get
        for name, labels, value, sample_key in samples:
            series = known(sample_key) if sample_key is not None else None
            if series is None:
                if sample_key is None:
                    rows = None
                series = (names.cached(sample_key, name, labels) if sample_key is not None
                          else names.describe(name, labels))
            what, sig, model, identity, key, position, longest = series
            if rows is not None:
                rows.append((what, key))
            if what == PROCESS_START_SAMPLE:
                self.process_start = value
                continue
            if what == INFO_SAMPLE:
                if isfinite(value):
                    self.infos[key] = value
                continue
            if longest > short_enough and max_label_value_bytes is not None:
                model, identity = _truncated(model, identity, max_label_value_bytes,
                                             truncated)
                key = (model, sig, identity)
                if rows is not None:
                    rows[-1] = (what, key)
            if what == COUNTER_SAMPLE:
                if position is not None:  # the position exists whatever its value
                    positions.setdefault(model, set()).add(position)
                if not 0 <= value <= MAX_COUNTER_VALUE or counters.get(key, value) != value:
                    invalid.add(key)
                    continue
                counters[key] = value
            elif what == CREATED_SAMPLE:
                if isfinite(value):
                    created[key] = value
            elif what == READINGS_SAMPLE:
                rows = None  # a plan replays one key per line
                self.read_readings(names.read(sig, identity), model, labels, value)
            elif isfinite(value):
                gauge_series[key] = value
        self.rows = rows

    def read_readings(self, found: tuple[_ReadSeries, ...], model: str,
                      labels: Mapping[str, str], value: float) -> None:
        """Each series a sample's readings give, with the value rules of its kind."""
        for sig, identity, position, value_label, gauge in found:
            key = (model, sig, identity)
            v = value if value_label is None else _label_value(labels, value_label)
            if gauge:
                if math.isfinite(v):
                    self.gauge_series[key] = v
                continue
            if position is not None:
                self.positions.setdefault(model, set()).add(position)
            if not 0 <= v <= MAX_COUNTER_VALUE or self.counters.get(key, v) != v:
                self.invalid.add(key)
                continue
            self.counters[key] = v


def _label_value(labels: Mapping[str, str], name: str) -> float:
    """The number a label holds (NaN when it holds none)."""
    try:
        return float(labels.get(name, "nan"))
    except ValueError:
        return math.nan


def assemble_page(counters: dict[SeriesKey, float], created: dict[SeriesKey, float],
                  gauge_series: dict[SeriesKey, float], positions: Mapping[str, set[str]],
                  process_start: float | None, invalid: set[SeriesKey],
                  truncated: int, saw: Callable[[str], bool],
                  infos: Mapping[SeriesKey, float]) -> ParsedPage:
    """The page from its per-series values: invalid counters left out (a series listed
    valid, then again with another value, too), gauges aggregated per model, the configured
    k, the engine kind (``saw``: is a prefix on a sample line?)."""
    if invalid:
        counters = {k: v for k, v in counters.items() if k not in invalid}
    max_gauges, k_gauges, rank_labels, engines = _page_rules(registry.generation())
    gauges: dict[tuple[str, str], float] = {}
    for (model, sig, identity), value in gauge_series.items():
        if sig in max_gauges:
            gauges[(model, sig)] = max(value, gauges.get((model, sig), -math.inf))
            continue
        # Engines that report scheduler gauges on every rank of a replica carry the
        # replica's count on rank 0 only; one series per engine is summed.
        if rank_labels and identity and _off_rank_zero(identity, rank_labels):
            continue
        gauges[(model, sig)] = gauges.get((model, sig), 0.0) + value

    configured_k: dict[str, int] = {m: len(p) for m, p in positions.items()}
    for (model, sig), value in gauges.items():
        if sig in k_gauges and value >= 1 and model not in configured_k:
            configured_k[model] = int(value)

    def signals() -> frozenset[str]:
        return frozenset({k[1] for k in counters} | {s for _, s in gauges}
                         | {k[1] for k in invalid})

    view = PageView(saw, signals)
    kind = next((e.kind for e in engines if e.recognises(view)), registry.UNKNOWN)
    server = server_capacity(infos)
    if server is None and (engine := registry.by_kind(kind)) is not None:
        server = gauge_capacity(engine.capacity_from_gauges(gauges))
    return ParsedPage(engine=kind, counters=counters, created=created, gauges=gauges,
                      configured_k=configured_k, process_start_time=process_start,
                      invalid_series=len(invalid) + (server.overflowed if server else 0),
                      invalid_models=tuple(sorted({k[0] for k in invalid})),
                      truncated_label_values=truncated, server=server,
                      invalid_counters=frozenset(invalid))


def _off_rank_zero(identity: tuple[tuple[str, str], ...], rank_labels: tuple[str, ...]
                   ) -> bool:
    """Does a series with these labels come from a rank other than 0?"""
    ident = dict(identity)
    return any(ident.get(label, "0") != "0" for label in rank_labels)


@functools.cache
def _page_rules(generation: int) -> tuple[frozenset[str], frozenset[str], tuple[str, ...],
                                          tuple[Engine, ...]]:
    """The gauges aggregated with max, those stating the configured k, the rank labels, and
    the engines in recognition order (as :func:`specwatch.engines.registry.recognise`)."""
    return (registry.max_gauges(), registry.k_gauges(), registry.rank_labels(),
            registry.engines())


def source_metric_names(engine: str = "auto") -> frozenset[str]:
    """Every source sample name specwatch reads (for docs, pre-filters and tests)."""
    names: set[str] = set()
    for e in registry.for_setting(engine):
        names.update(e.counters)
        names.update(e.gauges)
        names.update(e.readings)
        names.update(e.infos)
    return frozenset(names)
