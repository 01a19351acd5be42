"""The only module that knows vLLM and SGLang metric names.

It turns one `/metrics` page into *canonical signals*: per-series cumulative values keyed by
``(model_name, signal, identity)``, where ``identity`` is every label except ``model_name``
(``engine``, ``position``, ``finished_reason``, ``is_streaming``, SGLang's ranks...). Keeping
every series apart is what lets :mod:`specwatch.poll.history` detect a counter reset per series
*before* summing over ``engine`` (one data-parallel rank restarting among eight is invisible
in the sum).

Engines and what each one can give (details in the README, "Exporter"):

* **vLLM v1 engine (0.8.5 to 0.33)**: drafts, draft tokens, accepted tokens, accepted tokens
  per position (so the configured k = number of ``position`` series), finished requests,
  e2e latency / prompt / generation / TTFT histograms. Everything specwatch derives.
* **vLLM v1 0.8.3 / 0.8.4**: draft and accepted tokens only (no drafts counter, no
  per-position): acceptance rate only among the SD signals.
* **vLLM v0 engine (up to 0.9.2)**: draft, accepted and emitted token counters plus two
  interval gauges. No drafts counter and no ``engine`` label. Acceptance rate is available
  (v0 counts every token the verifier accepted, even after a rejected prefix, so it reads a
  little higher than v1's); acceptance length, draft length, α and per-position are absent.
* **SGLang (0.5.x)**: no accepted/proposed counters. The cumulative
  ``sglang:spec_verify_calls_total`` and ``sglang:generation_tokens_total`` give a windowed
  acceptance length (see :func:`specwatch.poll.derive.derive_window`); the configured
  chain length comes from the ``sglang:spec_num_steps`` gauge and the proposed tokens per
  verify call from ``sglang:spec_num_draft_tokens`` − 1. No per-position data, so no
  position or heterogeneity signals.

Pitfalls handled here (reference: vllm-metrics.md §7): samples are matched on the *sample*
name (prometheus_client returns counters under the base family name), ``*_created`` samples
are kept apart (they mark resets, they are not values), and ``vllm:iteration_tokens_total``
is a histogram whose samples never match a counter name here.

Size: one module because :class:`PagePlan` must give exactly what :func:`parse_page` gives
(the same rules for every value, the same keys, the same page assembled by ``_page``), and
that equivalence is only checkable with both read side by side.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from specwatch.common.kvcache import engine_kv_cache
from specwatch.poll.fastparse import (
    LABEL_CACHE_MAX_KEY,
    LABEL_CACHE_SIZE,
    RawSample,
    SampleSelector,
    _value,
)

EngineKind = Literal["vllm", "sglang", "auto"]
ENGINE_KINDS: tuple[str, ...] = ("vllm", "sglang", "auto")

# ---- canonical signal names (cumulative counters) -------------------------------------------
DRAFTS = "drafts"  # verify steps with >= 1 draft token (vLLM v1 >= 0.8.5)
DRAFT_TOKENS = "draft_tokens"  # proposed draft tokens
ACCEPTED_TOKENS = "accepted_tokens"  # accepted draft tokens (bonus token excluded)
ACCEPTED_PER_POSITION = "accepted_tokens_per_position"  # identity carries `position`
EMITTED_TOKENS = "emitted_tokens"  # vLLM v0 only
VERIFY_CALLS = "verify_calls"  # SGLang: verification forward passes of finished requests
GENERATION_TOKENS = "generation_tokens"  # all output tokens
PROMPT_TOKENS = "prompt_tokens"  # all prompt tokens
REQUESTS_FINISHED = "requests_finished"  # finished requests (any reason)
E2E_LATENCY_SUM = "e2e_latency_seconds_sum"
E2E_LATENCY_COUNT = "e2e_latency_seconds_count"
PROMPT_LEN_SUM = "request_prompt_tokens_sum"
PROMPT_LEN_COUNT = "request_prompt_tokens_count"
GENERATION_LEN_SUM = "request_generation_tokens_sum"
GENERATION_LEN_COUNT = "request_generation_tokens_count"
TTFT_SUM = "ttft_seconds_sum"
TTFT_COUNT = "ttft_seconds_count"
# Histogram buckets (identity carries `le`): latency quantiles before/after a controller switch.
E2E_LATENCY_BUCKET = "e2e_latency_seconds_bucket"
TTFT_BUCKET = "ttft_seconds_bucket"
#: Inter-token latency (vLLM >= 0.10 ``inter_token_latency_seconds``; SGLang's namesake):
#: the third ratio of a measured A/B pair (issue 16).
ITL_BUCKET = "inter_token_latency_seconds_bucket"
#: Bucket signals: aggregated per `le` (as per-position counters are per `position`).
BUCKET_SIGNALS = frozenset({E2E_LATENCY_BUCKET, TTFT_BUCKET, ITL_BUCKET})

#: Counters vLLM (v0 and v1) registers only when --speculative-config is set: their presence on
#: a page says SD is configured, whatever the traffic.
VLLM_SD_SIGNALS = frozenset({DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS, ACCEPTED_PER_POSITION,
                             EMITTED_TOKENS})

# ---- canonical gauges ---------------------------------------------------------------------
RUNNING = "requests_running"
WAITING = "requests_waiting"
SGLANG_SPEC_STEPS = "sglang_spec_num_steps"
SGLANG_SPEC_DRAFT_TOKENS = "sglang_spec_num_draft_tokens"
V0_ACCEPTANCE_RATE = "v0_draft_acceptance_rate"
V0_EFFICIENCY = "v0_efficiency"

# ---- server facts (info series: the values are in the labels) --------------------------------
#: ``vllm:cache_config_info``: the engine's CacheConfig as labels, value 1, no ``model_name``.
CACHE_CONFIG = "cache_config"
#: The labels of it read here (the rest are settings specwatch does not use): each engine's
#: KV-cache size in tokens (vLLM >= 0.32 writes it; before, blocks x block size gives it).
CACHE_CONFIG_LABELS = ("engine", "kv_cache_size_tokens", "num_gpu_blocks", "block_size")

_VLLM_COUNTERS: dict[str, str] = {
    "vllm:spec_decode_num_drafts_total": DRAFTS,
    "vllm:spec_decode_num_draft_tokens_total": DRAFT_TOKENS,
    "vllm:spec_decode_num_accepted_tokens_total": ACCEPTED_TOKENS,
    "vllm:spec_decode_num_accepted_tokens_per_pos_total": ACCEPTED_PER_POSITION,
    "vllm:spec_decode_num_emitted_tokens_total": EMITTED_TOKENS,
    "vllm:request_success_total": REQUESTS_FINISHED,
    "vllm:generation_tokens_total": GENERATION_TOKENS,
    "vllm:prompt_tokens_total": PROMPT_TOKENS,
    "vllm:e2e_request_latency_seconds_sum": E2E_LATENCY_SUM,
    "vllm:e2e_request_latency_seconds_count": E2E_LATENCY_COUNT,
    "vllm:request_prompt_tokens_sum": PROMPT_LEN_SUM,
    "vllm:request_prompt_tokens_count": PROMPT_LEN_COUNT,
    "vllm:request_generation_tokens_sum": GENERATION_LEN_SUM,
    "vllm:request_generation_tokens_count": GENERATION_LEN_COUNT,
    "vllm:time_to_first_token_seconds_sum": TTFT_SUM,
    "vllm:time_to_first_token_seconds_count": TTFT_COUNT,
    "vllm:e2e_request_latency_seconds_bucket": E2E_LATENCY_BUCKET,
    "vllm:time_to_first_token_seconds_bucket": TTFT_BUCKET,
    "vllm:inter_token_latency_seconds_bucket": ITL_BUCKET,
}
_VLLM_GAUGES: dict[str, str] = {
    "vllm:num_requests_running": RUNNING,
    "vllm:num_requests_waiting": WAITING,
    "vllm:spec_decode_draft_acceptance_rate": V0_ACCEPTANCE_RATE,
    "vllm:spec_decode_efficiency": V0_EFFICIENCY,
}
_VLLM_INFOS: dict[str, str] = {"vllm:cache_config_info": CACHE_CONFIG}
_SGLANG_COUNTERS: dict[str, str] = {
    "sglang:spec_verify_calls_total": VERIFY_CALLS,
    "sglang:generation_tokens_total": GENERATION_TOKENS,
    "sglang:prompt_tokens_total": PROMPT_TOKENS,
    "sglang:num_requests_total": REQUESTS_FINISHED,
    "sglang:e2e_request_latency_seconds_sum": E2E_LATENCY_SUM,
    "sglang:e2e_request_latency_seconds_count": E2E_LATENCY_COUNT,
    "sglang:prompt_tokens_histogram_sum": PROMPT_LEN_SUM,
    "sglang:prompt_tokens_histogram_count": PROMPT_LEN_COUNT,
    "sglang:generation_tokens_histogram_sum": GENERATION_LEN_SUM,
    "sglang:generation_tokens_histogram_count": GENERATION_LEN_COUNT,
    "sglang:time_to_first_token_seconds_sum": TTFT_SUM,
    "sglang:time_to_first_token_seconds_count": TTFT_COUNT,
    "sglang:e2e_request_latency_seconds_bucket": E2E_LATENCY_BUCKET,
    "sglang:time_to_first_token_seconds_bucket": TTFT_BUCKET,
    "sglang:inter_token_latency_seconds_bucket": ITL_BUCKET,
}
_SGLANG_GAUGES: dict[str, str] = {
    "sglang:num_running_reqs": RUNNING,
    "sglang:num_queue_reqs": WAITING,
    "sglang:spec_num_steps": SGLANG_SPEC_STEPS,
    "sglang:spec_num_draft_tokens": SGLANG_SPEC_DRAFT_TOKENS,
}
# Gauges that describe a configuration, the same on every rank: aggregate with max, not sum.
_MAX_GAUGES = frozenset({SGLANG_SPEC_STEPS, SGLANG_SPEC_DRAFT_TOKENS, V0_ACCEPTANCE_RATE,
                         V0_EFFICIENCY})

_TABLES: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "vllm": (_VLLM_COUNTERS, _VLLM_GAUGES),
    "sglang": (_SGLANG_COUNTERS, _SGLANG_GAUGES),
}
_COUNTER_TO_CREATED = {
    name[: -len("_total")] + "_created": sig
    for name, sig in {**_VLLM_COUNTERS, **_SGLANG_COUNTERS}.items()
    if name.endswith("_total")
}

#: Largest counter value taken as real: 2**53, where float64 stops counting integers
#: (thousands of years of tokens at a million a second). Beyond it deltas are noise and
#: sums overflow, so such a value makes its model invalid for the page like NaN does.
MAX_COUNTER_VALUE = float(2**53)

#: Label set of one series minus ``model_name``, sorted: what makes the series unique.
Identity = tuple[tuple[str, str], ...]
#: (model_name, canonical signal, identity)
SeriesKey = tuple[str, str, Identity]


@dataclass(frozen=True)
class ServerCapacity:
    """What a vLLM server says about its own capacity (``vllm:cache_config_info``).

    Summed over the page's engines (each data-parallel engine has its own KV cache, and
    the requests a server runs at once are spread over them). A value one engine does not
    state is None for the server: a sum missing a term would understate the capacity.
    """

    #: KV-cache tokens: ``kv_cache_size_tokens``, else ``num_gpu_blocks`` x ``block_size``.
    kv_cache_tokens: float | None
    #: KV-cache blocks (``num_gpu_blocks``).
    num_gpu_blocks: float | None
    #: Tokens per block (``block_size``), the largest over the engines.
    block_size: float | None
    engines: int


def server_capacity(infos: Mapping[SeriesKey, float]) -> ServerCapacity | None:
    """The server's capacity from its ``vllm:cache_config_info`` series (None: none on the
    page). Two series of one engine that disagree make every value unknown."""
    engines: dict[str, tuple[float | None, float | None, float | None]] = {}
    conflict = False
    for (_, sig, identity) in infos:
        if sig != CACHE_CONFIG:
            continue
        labels = dict(identity)
        found = engine_kv_cache(labels)
        engine = labels.get("engine", "")
        conflict = conflict or engines.setdefault(engine, found) != found
    if not engines:
        return None
    if conflict:
        return ServerCapacity(None, None, None, len(engines))

    def total(i: int) -> float | None:
        vals = [e[i] for e in engines.values()]
        return None if any(v is None for v in vals) else float(sum(vals))  # type: ignore[misc]

    sizes = [e[2] for e in engines.values()]
    return ServerCapacity(kv_cache_tokens=total(0), num_gpu_blocks=total(1),
                          block_size=None if None in sizes else max(sizes),  # type: ignore[type-var]
                          engines=len(engines))


class PageParseError(ValueError):
    """The body is not a Prometheus text page (the poller counts reason="parse")."""


@dataclass(frozen=True)
class ParsedPage:
    """Everything specwatch reads from one page, in canonical names.

    ``counters`` and ``created`` are per series (never summed here); ``gauges`` are already
    aggregated per model because gauges have no reset problem. ``engine`` is the detected
    kind: "vllm", "vllm-v0", "sglang" or "unknown" (a page with no known family).
    """

    engine: str
    counters: Mapping[SeriesKey, float]
    created: Mapping[SeriesKey, float] = field(default_factory=dict)
    gauges: Mapping[tuple[str, str], float] = field(default_factory=dict)
    configured_k: Mapping[str, int] = field(default_factory=dict)
    process_start_time: float | None = None
    #: Counter series left out of ``counters`` because their value is invalid on this page.
    invalid_series: int = 0
    #: Models with an invalid counter series on this page (sorted).
    invalid_models: tuple[str, ...] = ()
    #: Distinct label values cut to the length limit on this page (issue 17).
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


def _tables_for(engine: str) -> list[tuple[dict[str, str], dict[str, str]]]:
    if engine == "auto":
        return list(_TABLES.values())
    return [_TABLES[engine]]


#: How a page is turned into samples: "fast" (only the families read here, see
#: :mod:`specwatch.poll.fastparse`) or "full" (prometheus_client's parser over the whole page).
PARSERS: tuple[str, ...] = ("fast", "full")
PROCESS_START = "process_start_time_seconds"
_PREFIXES = ("vllm:", "sglang:")


# What a sample is to parse_page (_Series.kind).
_COUNTER, _CREATED, _GAUGE, _PROCESS_START, _INFO = range(5)


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


@dataclass(frozen=True)
class _Names:
    counters: dict[str, str]
    gauges: dict[str, str]
    created: dict[str, str]
    infos: dict[str, str]
    selector: SampleSelector
    #: sample key (see fastparse.RawSample: name and labels as written) -> what they mean.
    #: Bounded like the selector's label cache; the same series recur on every poll.
    series: dict[str, _Series] = field(default_factory=dict)

    @property
    def wanted(self) -> frozenset[str]:
        return self.selector.names

    def describe(self, name: str, labels: Mapping[str, str]) -> _Series:
        """What the wanted sample ``name{labels}`` is (one of the tables, or the start time)."""
        if name in self.infos:  # server-wide: only the labels read, no model
            identity: Identity = tuple(sorted(
                (k, labels[k]) for k in CACHE_CONFIG_LABELS if k in labels))
            sig = self.infos[name]
            return _Series(_INFO, sig, "", identity, ("", sig, identity), None, 0)
        model = labels.get("model_name", "")
        identity = tuple(sorted(
            (k, v) for k, v in labels.items() if k != "model_name"))
        longest = max(map(len, labels.values()), default=0)
        position = None
        if name in self.counters:
            kind, sig = _COUNTER, self.counters[name]
            if sig == ACCEPTED_PER_POSITION:
                position = labels.get("position")
        elif name in self.created:
            kind, sig = _CREATED, self.created[name]
        elif name in self.gauges:
            kind, sig = _GAUGE, self.gauges[name]
        else:
            kind, sig = _PROCESS_START, ""
        return _Series(kind, sig, model, identity, (model, sig, identity), position, longest)

    def cached(self, key: str, name: str, labels: Mapping[str, str]) -> _Series:
        """describe(), remembered under the sample key (bounded: issue 17)."""
        found = self.describe(name, labels)
        if len(key) <= LABEL_CACHE_MAX_KEY:
            if len(self.series) >= LABEL_CACHE_SIZE:
                self.series.clear()
            self.series[key] = found
        return found


@functools.cache
def _names(engine: str, buckets: bool = True) -> _Names:
    counter_names: dict[str, str] = {}
    gauge_names: dict[str, str] = {}
    for c, g in _tables_for(engine):
        counter_names.update(c)
        gauge_names.update(g)
    if not buckets:
        counter_names = {n: s for n, s in counter_names.items() if s not in BUCKET_SIGNALS}
    created_names = {n: s for n, s in _COUNTER_TO_CREATED.items()
                     if n.replace("_created", "_total") in counter_names}
    info_names = dict(_VLLM_INFOS) if engine in ("vllm", "auto") else {}
    wanted = {*counter_names, *gauge_names, *created_names, *info_names, PROCESS_START}
    return _Names(counter_names, gauge_names, created_names, info_names,
                  SampleSelector(wanted, prefixes=_PREFIXES))


def _full_samples(text: str, wanted: frozenset[str]) -> tuple[list[RawSample], set[str]]:
    """Every wanted sample through prometheus_client's parser, and the prefixes seen."""
    samples: list[RawSample] = []
    seen: set[str] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name.startswith("vllm:"):
                seen.add("vllm:")
            elif name.startswith("sglang:"):
                seen.add("sglang:")
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


def parse_page(text: str, engine: str = "auto", parser: str = "fast",
               max_label_value_bytes: int | None = None, buckets: bool = True,
               plan: PagePlan | None = None) -> ParsedPage:
    """Parse a `/metrics` body into canonical signals.

    ``engine`` restricts the names considered ("vllm", "sglang") or accepts both ("auto";
    the prefixes never collide). ``parser`` is "fast" (parse only the families read here;
    the same result as "full" on every page prometheus_client accepts, see
    :mod:`specwatch.poll.fastparse`) or "full" (prometheus_client's parser over the whole page:
    the baseline).

    A counter that is NaN, infinite, negative or above MAX_COUNTER_VALUE, or a counter
    series listed twice with different values, is *unknown* on this page: it is left out of
    ``counters``, its key is in ``invalid_counters`` (counted in ``invalid_series``) and the
    rest of its model is read as usual. The history marks every aggregate that series adds
    to as unknown for this poll, so only the signals that read it are absent (a ratio of
    sums missing one term, e.g. one engine's accepted tokens over all engines' draft
    tokens, is never published), and the series catches up at its next valid value.
    ``max_label_value_bytes``: label values longer than this (UTF-8 bytes) are cut by
    :func:`truncate_label_value` and counted in ``truncated_label_values`` (None: kept whole).
    ``buckets``: False leaves the latency histograms' bucket series (:data:`BUCKET_SIGNALS`)
    out: when nothing reads them (no controller, no A/B pair) they are most of the sample
    lines a vLLM page has (65 of 104 on the recorded 0.32 page), so they are neither parsed
    nor checked; the page is otherwise the same as with them, minus those series.
    ``plan``: a :class:`PagePlan` kept per target across its pages (fast parser only): a
    page whose wanted lines are those of the page before, in the same order, only their
    values changed, is parsed from it; the result is the same.
    Raises :class:`PageParseError` when prometheus_client's parser rejects the text, and
    when the text ends inside a line (the last line has no line feed), for both parsers:
    the text format says the last line ends with a line feed, so such a page is one a
    Prometheus rejects, and it is what a page cut in transit looks like (the library
    alone accepts a cut line that still parses, and the fast parser never sees a cut line
    of a family it does not read). A page cut just after a line feed is a valid shorter
    page for every parser; both read the same values from it.
    """
    if engine not in ENGINE_KINDS:
        raise ValueError(f"unknown engine kind {engine!r}")
    if parser not in PARSERS:
        raise ValueError(f"unknown parser {parser!r}")
    if not text.endswith("\n") and text[text.rfind("\n") + 1:].strip():
        raise PageParseError(
            "the page ends inside a line (its last line has no line feed): a cut page")
    names = _names(engine, buckets)
    plan_key = (engine, buckets, max_label_value_bytes)
    if plan is not None and parser == "fast":
        if plan.key == plan_key:
            steady = plan.parse(text, names)
            if steady is not None:
                return steady
        plan.key = None  # rebuilt below when this page allows it

    counters: dict[SeriesKey, float] = {}
    created: dict[SeriesKey, float] = {}
    gauge_series: dict[SeriesKey, float] = {}
    infos: dict[SeriesKey, float] = {}
    positions: dict[str, set[str]] = {}
    process_start: float | None = None
    invalid: set[SeriesKey] = set()
    truncated: set[str] = set()
    # A character is at most 4 UTF-8 bytes: values of fewer characters cannot pass the limit.
    short_enough = (max_label_value_bytes // 4 if max_label_value_bytes is not None
                    else math.inf)
    isfinite = math.isfinite
    # What the plan needs of this page: each sample's kind and key (None: no plan).
    rows: list[tuple[int, SeriesKey]] | None = [] if plan is not None else None
    try:
        selection = names.selector.select(text) if parser == "fast" else None
        if selection is not None:
            samples, saw = selection.samples, selection.saw
            if selection.seen:
                rows = None
        else:
            samples, seen_prefixes = _full_samples(text, names.wanted)
            saw = seen_prefixes.__contains__
            rows = None
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
            if what == _PROCESS_START:
                process_start = value
                continue
            if what == _INFO:
                if isfinite(value):
                    infos[key] = value
                continue
            if longest > short_enough and max_label_value_bytes is not None:
                model, identity = _truncated(model, identity, max_label_value_bytes,
                                             truncated)
                key = (model, sig, identity)
                if rows is not None:
                    rows[-1] = (what, key)
            if what == _COUNTER:
                if position is not None:  # the position exists whatever its value
                    positions.setdefault(model, set()).add(position)
                if not 0 <= value <= MAX_COUNTER_VALUE or counters.get(key, value) != value:
                    invalid.add(key)
                    continue
                counters[key] = value
            elif what == _CREATED:
                if isfinite(value):
                    created[key] = value
            elif isfinite(value):
                gauge_series[key] = value
    except Exception as exc:  # the parser raises ValueError, IndexError, ... on garbage
        raise PageParseError(f"not a Prometheus text exposition: {exc}") from exc

    if rows is not None and plan is not None and not invalid:
        heads = [s[3] for s in samples if s[3] is not None]  # all of them: rows is not None
        plan.learn(plan_key, text, heads, rows, positions, len(truncated))
    return _page(counters, created, gauge_series, positions, process_start, invalid,
                 len(truncated), saw, infos)


def _page(counters: dict[SeriesKey, float], created: dict[SeriesKey, float],
          gauge_series: dict[SeriesKey, float], positions: Mapping[str, set[str]],
          process_start: float | None, invalid: set[SeriesKey],
          truncated: int, saw: Callable[[str], bool],
          infos: Mapping[SeriesKey, float]) -> ParsedPage:
    """The page from its per-series values: invalid counters left out (a series listed
    valid, then again with another value, too), gauges aggregated per model, the configured
    k, the engine kind (``saw``: is a prefix on a sample line?)."""
    if invalid:
        counters = {k: v for k, v in counters.items() if k not in invalid}
    gauges: dict[tuple[str, str], float] = {}
    for (model, sig, identity), value in gauge_series.items():
        ident = dict(identity)
        if sig in _MAX_GAUGES:
            gauges[(model, sig)] = max(value, gauges.get((model, sig), -math.inf))
            continue
        # SGLang reports scheduler gauges on every tensor/pipeline rank of a replica; only
        # rank 0 carries the replica's count. vLLM has one series per engine (sum them).
        if ident.get("tp_rank", "0") != "0" or ident.get("pp_rank", "0") != "0":
            continue
        gauges[(model, sig)] = gauges.get((model, sig), 0.0) + value

    configured_k: dict[str, int] = {m: len(p) for m, p in positions.items()}
    for (model, sig), value in gauges.items():
        if sig == SGLANG_SPEC_STEPS and value >= 1 and model not in configured_k:
            configured_k[model] = int(value)

    # vllm: first: with it on the page sglang:'s presence does not matter, and an absent
    # prefix costs a scan of the whole body on the fast path.
    if saw("vllm:"):
        sigs = {k[1] for k in counters} | {s for _, s in gauges} | {k[1] for k in invalid}
        v0 = ({EMITTED_TOKENS, V0_ACCEPTANCE_RATE, V0_EFFICIENCY} & sigs) and DRAFTS not in sigs
        kind = "vllm-v0" if v0 else "vllm"
    elif saw("sglang:"):
        kind = "sglang"
    else:
        kind = "unknown"
    return ParsedPage(engine=kind, counters=counters, created=created, gauges=gauges,
                      configured_k=configured_k, process_start_time=process_start,
                      invalid_series=len(invalid),
                      invalid_models=tuple(sorted({k[0] for k in invalid})),
                      truncated_label_values=truncated, server=server_capacity(infos),
                      invalid_counters=frozenset(invalid))


#: Most text a target's plan keeps in its heads (name and labels of each wanted line, as
#: written): a vLLM page of 60 models on 4 engines holds about a quarter of it.
PLAN_MAX_HEAD_BYTES = 1 << 20


class PagePlan:
    """What :func:`parse_page` learned from a target's last page: a steady server's next
    page has the same wanted lines in the same order, only their values change.

    Why (issue 15): the selective parse spends about a third of its CPU on Python work per
    wanted line (the finder's groups, the label set, what the sample is, its checks), the
    same every poll for the same lines. With a plan, :meth:`parse` runs the finder and
    compares the lines' heads (name and label set as written) with the plan's at C speed;
    when they are the same, the values go straight to the keys the plan holds.

    Same result as without a plan, always: a plan is learnt only from a page whose first
    line is a comment and whose every wanted line has the canonical shape (no line read
    by the full parser, none examined alone), with no invalid counter and no counter series
    twice; and it is used only for a page with the same first line and exactly the same
    heads, in order, every one with a canonical value. Then the finder gives the same
    samples except for their values (the heads fix names and labels, so what each sample
    is and every label-value cut), and the values get the same rules: a counter outside
    [0, ``MAX_COUNTER_VALUE``] (or NaN) sends the page to the full path, which marks the
    series invalid; created and gauge values are kept only when finite. ``tests/poll/test_page_plan.py``
    compares the two paths on recorded pages and on generated changes.

    One per target (not shared between threads: a target's polls are serialized). Its
    memory is bounded whatever a target sends (issue 17): a page whose wanted heads hold
    more than :data:`PLAN_MAX_HEAD_BYTES` of text is parsed without a plan.
    """

    __slots__ = ("counter_idx", "counter_keys", "first", "heads", "hits", "key", "others",
                 "positions", "truncated")

    def __init__(self) -> None:
        self.key: tuple[str, bool, int | None] | None = None
        self.first = ""
        self.heads: list[str] = []
        self.counter_idx: list[int] = []
        self.counter_keys: list[SeriesKey] = []
        self.others: list[tuple[int, int, SeriesKey]] = []
        self.positions: dict[str, set[str]] = {}
        self.truncated = 0
        #: Pages parsed from the plan (for tests and benchmarks).
        self.hits = 0

    def learn(self, key: tuple[str, bool, int | None], text: str, heads: list[str],
              rows: list[tuple[int, SeriesKey]], positions: dict[str, set[str]],
              truncated: int) -> None:
        """Remember this page when it allows a plan (see the class docstring)."""
        end = text.find("\n")
        first = text[:end]
        if end < 0 or not first.strip().startswith("#") or not heads \
                or sum(map(len, heads)) > PLAN_MAX_HEAD_BYTES:
            return
        counter_idx = [i for i, (what, _) in enumerate(rows) if what == _COUNTER]
        counter_keys = [rows[i][1] for i in counter_idx]
        if len(set(counter_keys)) != len(counter_keys):
            return
        self.first, self.heads, self.positions, self.truncated = first, heads, positions, \
            truncated
        self.counter_idx, self.counter_keys = counter_idx, counter_keys
        self.others = [(i, what, k) for i, (what, k) in enumerate(rows) if what != _COUNTER]
        self.key = key

    def parse(self, text: str, names: _Names) -> ParsedPage | None:
        """The page, when its wanted lines are the plan's; None otherwise."""
        end = text.find("\n")
        if end < 0 or text[:end] != self.first:
            return None
        found = names.selector.lines(text)
        if len(found) != len(self.heads) or [f[0] for f in found] != self.heads:
            return None
        texts = [f[3] for f in found]
        if "" in texts:  # a wanted line outside the canonical shape
            return None
        # fastparse._value, the parser's int-or-float, inlined (a call a line costs more).
        values = [int(v) if v.isdigit() else _value(v) if v[0] in "+-" else float(v)
                  for v in texts]
        counts = [values[i] for i in self.counter_idx]
        for v in counts:
            if not 0 <= v <= MAX_COUNTER_VALUE:
                return None
        created: dict[SeriesKey, float] = {}
        gauge_series: dict[SeriesKey, float] = {}
        infos: dict[SeriesKey, float] = {}
        process_start = None
        isfinite = math.isfinite
        for i, what, k in self.others:
            v = values[i]
            if what == _PROCESS_START:
                process_start = v
            elif what == _INFO:
                if isfinite(v):
                    infos[k] = v
            elif what == _CREATED:
                if isfinite(v):
                    created[k] = v
            elif isfinite(v):
                gauge_series[k] = v
        self.hits += 1

        def saw(prefix: str) -> bool:  # Selection.saw with no line examined alone
            return text.startswith(prefix) or f"\n{prefix}" in text

        return _page(dict(zip(self.counter_keys, counts, strict=True)), created, gauge_series,
                     self.positions, process_start, set(), self.truncated, saw, infos)


def source_metric_names(engine: str = "auto") -> frozenset[str]:
    """Every source sample name specwatch reads (for docs, pre-filters and tests)."""
    names: set[str] = set()
    for c, g in _tables_for(engine):
        names.update(c)
        names.update(g)
    if engine in ("vllm", "auto"):
        names.update(_VLLM_INFOS)
    return frozenset(names)
