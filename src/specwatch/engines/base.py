"""The interface every engine module fills in, and the canonical signals it maps onto.

A *canonical signal* is what specwatch derives from, whatever the engine: a cumulative counter
("draft_tokens"), a histogram's bucket series ("e2e_latency_seconds_bucket"), a gauge
("requests_running") or a server fact ("cache_config"). An engine module says which of its
metric samples carries which signal (:class:`Engine`), how a page is recognised as its own,
what it can give (:class:`Capabilities`), and the readings that only it knows (its
configuration gauges, what its cache info labels state). The poll path, derive, the
controller, calibration and the mixin read engines through :mod:`specwatch.engines.registry`
only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

# ---- canonical signal names (cumulative counters) -------------------------------------------
DRAFTS = "drafts"  # verify steps with >= 1 draft token
DRAFT_TOKENS = "draft_tokens"  # proposed draft tokens
ACCEPTED_TOKENS = "accepted_tokens"  # accepted draft tokens (bonus token excluded)
ACCEPTED_PER_POSITION = "accepted_tokens_per_position"  # identity carries `position`
FIRST_POSITION = "0"  # the `position` of the first draft token (counted from 0)
EMITTED_TOKENS = "emitted_tokens"  # tokens emitted by verify steps (accepted + bonus)
VERIFY_CALLS = "verify_calls"  # verification forward passes of finished requests
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
#: Inter-token latency: the third ratio of a measured A/B pair.
ITL_BUCKET = "inter_token_latency_seconds_bucket"
#: Bucket signals: aggregated per `le` (as per-position counters are per `position`).
BUCKET_SIGNALS = frozenset({E2E_LATENCY_BUCKET, TTFT_BUCKET, ITL_BUCKET})

# ---- canonical gauges ---------------------------------------------------------------------
RUNNING = "requests_running"
WAITING = "requests_waiting"
#: The configured draft chain length, stated by a gauge.
SPEC_STEPS = "spec_num_steps"
#: Tokens per verify call counting the root token, stated by a gauge.
SPEC_DRAFT_TOKENS = "spec_num_draft_tokens"
#: The engine's own acceptance rate and efficiency over its last logging interval.
INTERVAL_ACCEPTANCE_RATE = "interval_acceptance_rate"
INTERVAL_EFFICIENCY = "interval_efficiency"
#: The KV cache stated by gauges (engines without an info series): blocks, tokens per block.
KV_CACHE_BLOCKS = "kv_cache_blocks"
KV_CACHE_BLOCK_SIZE = "kv_cache_block_size"

# ---- server facts (info series: the values are in the labels) -----------------------------
#: The engine's cache configuration (value 1, no ``model_name``): its KV-cache size.
CACHE_CONFIG = "cache_config"

#: Acceptance from draft and accepted token counters (and drafts, per position, if counted).
BY_TOKENS = "tokens"
#: Acceptance from verify calls: (generation tokens - finished requests) / verify calls.
BY_VERIFY_CALLS = "verify_calls"
#: The counters each acceptance reading needs on a page.
ACCEPTANCE_READS: dict[str, frozenset[str]] = {
    BY_TOKENS: frozenset({DRAFT_TOKENS, ACCEPTED_TOKENS}),
    BY_VERIFY_CALLS: frozenset({VERIFY_CALLS, GENERATION_TOKENS, REQUESTS_FINISHED}),
}

#: (tokens, blocks, block size) one engine instance states about its KV cache; None: not stated.
KvCache = tuple[float | None, float | None, float | None]


@dataclass(frozen=True)
class Histogram:
    """A latency histogram an engine writes: the canonical bucket signal, the engine's family
    (without ``_bucket``) and its bucket upper bounds (+Inf left out), from the engine's source;
    ``()`` where they differ across the versions the module covers (the page's are read)."""

    signal: str
    family: str
    buckets: tuple[float, ...]


@dataclass(frozen=True)
class Reading:
    """One canonical series read from a sample family whose series do not map one to one:
    a family that gives two signals (each drafted token per position, and their sum), one
    series of a family (position 0's drafted tokens are the drafts), a label named otherwise
    (the engine's position label), or a gauge whose value is in a label (a configuration
    info series stating k).

    ``where``: the labels a series must have (others of the family are not this reading);
    ``rename``: the engine's label names -> canonical ones (``position``); ``value_label``:
    the label whose number is the value (the sample's own value is not read); ``gauge``:
    the signal is a gauge (else a counter, with the counter value rules)."""

    signal: str
    where: tuple[tuple[str, str], ...] = ()
    rename: Mapping[str, str] = field(default_factory=dict)
    value_label: str | None = None
    gauge: bool = False


@dataclass(frozen=True)
class Capabilities:
    """What an engine's page can give (docs/metrics.md has the table per engine)."""

    #: Accepted tokens per draft position: position rates, heterogeneity, k from positions.
    per_position: bool
    #: How the configured k is known: "positions" (the count of position series), "gauge"
    #: (:data:`SPEC_STEPS`) or None (not stated).
    configured_k: str | None
    #: Acceptance length (tokens committed per verify step) derivable.
    acceptance_length: bool
    #: The server's KV-cache size stated on the page.
    kv_capacity: bool
    histograms: tuple[Histogram, ...] = ()
    #: How acceptance is read (:mod:`specwatch.poll.windows.derive` takes the reading whose counters
    #: a page has): :data:`BY_TOKENS` (draft and accepted token counters),
    #: :data:`BY_VERIFY_CALLS` (verify calls, generation tokens, finished requests) or None.
    acceptance: str | None = None


@dataclass(frozen=True)
class CacheInfo:
    """An info series stating a KV-cache size: the labels read (the rest are settings
    specwatch does not use; ``engine`` tells a server's instances apart), how one instance's
    labels state (tokens, blocks, block size), and its canonical signal (an engine whose
    labels read differently names its own)."""

    labels: tuple[str, ...]
    state: Callable[[Mapping[str, str]], KvCache]
    signal: str = CACHE_CONFIG


class PageView:
    """What :meth:`Engine.recognises` may ask of a parsed page: whether a metric prefix is on
    a sample line (``saw``, remembered: a missing prefix costs a scan of the body) and which
    canonical signals it carries (computed on first use)."""

    __slots__ = ("_saw", "_seen", "_signals", "_signals_of")

    def __init__(self, saw: Callable[[str], bool],
                 signals: Callable[[], frozenset[str]]) -> None:
        self._saw = saw
        self._signals_of = signals
        self._signals: frozenset[str] | None = None
        self._seen: dict[str, bool] = {}

    def saw(self, prefix: str) -> bool:
        found = self._seen.get(prefix)
        if found is None:
            found = self._seen[prefix] = self._saw(prefix)
        return found

    @property
    def signals(self) -> frozenset[str]:
        found = self._signals
        if found is None:
            found = self._signals = self._signals_of()
        return found


@dataclass(frozen=True)
class Engine:
    """One serving engine (a version range of it) as specwatch reads it.

    Subclass it in the engine's module where a reading is the engine's own (override
    :meth:`recognises`, :meth:`sd_configured`, :meth:`proposed_per_verify`), create one
    instance and pass it to :func:`specwatch.engines.registry.register`.
    """

    #: The kind a recognised page reports (``ParsedPage.engine``, ``sd_target_info``).
    kind: str
    #: The ``engine:`` value of a target that reads this engine's names (one family may hold
    #: several kinds: vLLM's v0 and v1 engines share their names).
    family: str
    #: The versions the names below were checked against, in words.
    versions: str
    #: The prefix of every metric name the engine writes (e.g. ``"vllm:"``).
    prefix: str
    #: Recognition and listing order: a kind tried earlier wins a page both recognise.
    order: int
    #: Sample name -> canonical counter signal (counters, histogram _sum/_count/_bucket).
    counters: Mapping[str, str]
    #: Sample name -> canonical gauge signal.
    gauges: Mapping[str, str] = field(default_factory=dict)
    #: Sample name -> the canonical series read from it, where its series do not map one to
    #: one onto a signal (:class:`Reading`; such pages take the parse's slower path).
    readings: Mapping[str, tuple[Reading, ...]] = field(default_factory=dict)
    #: Sample name -> the KV-cache info series it is.
    infos: Mapping[str, CacheInfo] = field(default_factory=dict)
    #: Gauges that state a configuration, the same on every rank: aggregated with max.
    max_gauges: frozenset[str] = frozenset()
    #: Labels of the ranks of one replica that all write its scheduler gauges: only the
    #: series whose rank labels are all "0" (or absent) carry the replica's count.
    rank_labels: tuple[str, ...] = ()
    #: Counters the engine registers only when speculative decoding is configured: one on
    #: a page says SD is on, whatever the traffic.
    sd_counters: frozenset[str] = frozenset()
    #: The model of its series that carry no ``model_name`` (an engine that serves one model
    #: per server and labels none); "" for an engine that labels every series.
    unlabelled_model: str = ""
    #: Sample names the mixin's dashboards and rules read straight from the engine beyond
    #: the ones above (panels of the engine's own state: KV-cache usage, queue time...).
    shown: frozenset[str] = frozenset()
    capabilities: Capabilities = Capabilities(False, None, False, False)

    def recognises(self, page: PageView) -> bool:
        """Is ``page`` this engine's? (Default: one of its names is on it.)"""
        return page.saw(self.prefix)

    def sd_configured(self, sd_counters_present: bool, gauges: Mapping[str, float]
                      ) -> bool | None:
        """Is speculative decoding configured, from the newest page: its SD-only counters
        present, its gauges; None when the page does not say."""
        return sd_counters_present if self.sd_counters else None

    def proposed_per_verify(self, gauges: Mapping[str, float], configured_k: int | None
                            ) -> float | None:
        """Draft tokens proposed per verify call when the engine states them through its
        gauges (the denominator of an acceptance rate read from verify calls); None: not
        this engine's reading."""
        return None

    def names(self) -> frozenset[str]:
        """Every sample name of this engine that specwatch reads or shows."""
        return frozenset({*self.counters, *self.gauges, *self.readings, *self.infos,
                          *self.shown})

    def capacity_from_gauges(self, gauges: Mapping[tuple[str, str], float]) -> KvCache | None:
        """(tokens, blocks, block size) the server states through its gauges, keyed
        (model, canonical gauge), for an engine without a KV-cache info series; None: not
        stated (the default). Default reading: :data:`KV_CACHE_BLOCKS` x
        :data:`KV_CACHE_BLOCK_SIZE` of one model, when the engine maps both."""
        if not {KV_CACHE_BLOCKS, KV_CACHE_BLOCK_SIZE} <= set(self.gauges.values()):
            return None
        models = {m for m, _ in gauges}
        if len(models) != 1:
            return None  # a server of several models states no one total
        model = next(iter(models))
        blocks = gauges.get((model, KV_CACHE_BLOCKS))
        size = gauges.get((model, KV_CACHE_BLOCK_SIZE))
        if blocks is None or size is None or not (blocks > 0 and size > 0):
            return None
        return blocks * size, blocks, size

    def metric(self, signal: str) -> str:
        """The engine's sample name of a canonical counter, gauge or info signal."""
        for table in (self.counters, self.gauges):
            for name, sig in table.items():
                if sig == signal:
                    return name
        for name, readings in self.readings.items():
            if any(r.signal == signal for r in readings):
                return name
        if signal == CACHE_CONFIG and self.infos:
            return next(iter(self.infos))
        raise KeyError(f"{self.kind} writes no {signal!r}")


def label_number(labels: Mapping[str, str], name: str) -> float | None:
    """A positive finite number written in a label (None when absent, unparsable, or not
    yet known: engines write "None" before they profile)."""
    try:
        v = float(labels.get(name, ""))
    except ValueError:
        return None
    return v if math.isfinite(v) and v > 0 else None
