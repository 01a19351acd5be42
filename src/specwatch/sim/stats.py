"""What one simulated vLLM engine counts, and how it is rendered as vLLM 0.33's /metrics page.

The names, types, label names, HELP texts and default histogram buckets are vLLM v0.33.0's
(``vllm/v1/metrics/loggers.py``, ``vllm/v1/spec_decode/metrics.py``,
``vllm/v1/metrics/buckets.py``), as in the README's vLLM metric reference. The page is
rendered by prometheus_client itself (a custom collector registered in the simulator's own
`CollectorRegistry`), so the text and OpenMetrics encodings, the ``_created`` samples of a
single API server and the float formatting are exactly those a vLLM server produces.

The engine updates plain Python numbers (`EngineStats`); families are built only when
/metrics is scraped. That keeps the discrete-event loop free of prometheus_client's locks and
lets tests run the simulation without any HTTP at all.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Sample

# vllm/v1/metrics/buckets.py (v0.33.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
WAITING_REASONS = ("capacity", "deferred")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
COMPLETIONS_HANDLER = "/v1/chat/completions"


def request_tokens_buckets(max_model_len: int) -> tuple[int, ...]:
    """vLLM's ``build_1_2_5_buckets(max_model_len)``: 1, 2, 5, 10, ... up to max_model_len."""
    out: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return tuple(out)
            out.append(value)
        exponent += 1


class Histogram:
    """A cumulative-at-render histogram: per-bucket counts, sum and count (vLLM semantics:
    a value equal to a bound falls in that bound's bucket, as ``le`` says)."""

    __slots__ = ("_bounds_array", "bounds", "count", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self._bounds_array = np.asarray(self.bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def observe_n(self, value: float, n: int) -> None:
        """Observe the same value n times (the gap every member of a step shares)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.total += value * n
        self.count += n

    def observe_many(self, values: np.ndarray) -> None:
        """Observe every value of an array (one engine step's inter-token gaps)."""
        if not values.size:
            return
        idx = np.searchsorted(self._bounds_array, values, side="left")
        binned = np.bincount(idx, minlength=len(self.counts))
        for i in np.flatnonzero(binned).tolist():
            self.counts[i] += int(binned[i])
        self.total += float(values.sum())
        self.count += int(values.size)

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        acc = 0
        for bound, c in zip((*self.bounds, float("inf")), self.counts, strict=True):
            acc += c
            out.append((_le(bound), float(acc)))
        return out


def _le(bound: float) -> str:
    # prometheus_client's own formatting of bucket bounds (floatToGoString)
    from prometheus_client.utils import floatToGoString

    return floatToGoString(bound)


class EngineStats:
    """Counters, gauges and histograms of one engine (one ``engine`` label value).

    Created fresh at every (re)start: that is what a vLLM restart does to its counters.
    `created` is the Unix time the series were created (the ``_created`` samples).
    """

    def __init__(self, model_name: str, engine: int, k: int, max_model_len: int,
                 created: float) -> None:
        self.model_name = model_name
        self.engine = str(engine)
        self.k = k
        self.created = created
        # speculative decoding (vllm/v1/spec_decode/metrics.py)
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * k
        # scheduler gauges
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0
        # counters
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.num_preemptions = 0
        self.prompt_tokens = 0
        self.prompt_tokens_cached = 0
        self.generation_tokens = 0
        self.request_success = dict.fromkeys(FINISH_REASONS, 0)
        self.http_2xx = 0
        tokens = request_tokens_buckets(max_model_len)
        self.h_prompt = Histogram(tokens)
        self.h_generation = Histogram(tokens)
        self.h_iteration = Histogram(ITERATION_TOKENS_BUCKETS)
        self.h_max_generation = Histogram(tokens)
        self.h_params_n = Histogram(PARAMS_N_BUCKETS)
        self.h_params_max_tokens = Histogram(tokens)
        self.h_ttft = Histogram(TTFT_BUCKETS)
        self.h_itl = Histogram(ITL_BUCKETS)
        self.h_tpot = Histogram(ITL_BUCKETS)
        self.h_e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.h_queue = Histogram(REQUEST_LATENCY_BUCKETS)
        self.h_inference = Histogram(REQUEST_LATENCY_BUCKETS)
        self.h_prefill = Histogram(REQUEST_LATENCY_BUCKETS)
        self.h_decode = Histogram(REQUEST_LATENCY_BUCKETS)
        self.h_preemptions = Histogram(NUM_PREEMPTIONS_BUCKETS)
        self.h_kv_computed = Histogram(tokens)

    @property
    def finished(self) -> int:
        return sum(self.request_success.values())


# --------------------------------------------------------------------------- rendering

_EM = ("engine", "model_name")

# (family name, HELP, attribute) in vLLM's registration order
_SPEC_COUNTERS = (
    ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", "num_drafts"),
    ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", "num_draft_tokens"),
    ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
     "num_accepted_tokens"),
)
_WAITING_BY_REASON_HELP = (
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
    "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, "
    "blocked status). Sum of all reasons equals vllm:num_requests_waiting."
)
_SLEEP_HELP = (
    "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
    "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2."
)
_CACHED_BY_SOURCE_HELP = (
    "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host "
    "(offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
    "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
    "vllm:external_prefix_cache_hits."
)
_HISTOGRAMS = (
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", "h_prompt"),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.",
     "h_generation"),
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
     "h_iteration"),
    ("vllm:request_max_num_generation_tokens",
     "Histogram of maximum number of requested generation tokens.", "h_max_generation"),
    ("vllm:request_params_n", "Histogram of the n request parameter.", "h_params_n"),
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
     "h_params_max_tokens"),
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
     "h_ttft"),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
     "h_itl"),
    ("vllm:request_time_per_output_token_seconds",
     "Histogram of time_per_output_token_seconds per request.", "h_tpot"),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
     "h_e2e"),
    ("vllm:request_queue_time_seconds",
     "Histogram of time spent in WAITING phase for request.", "h_queue"),
    ("vllm:request_inference_time_seconds",
     "Histogram of time spent in RUNNING phase for request.", "h_inference"),
    ("vllm:request_prefill_time_seconds",
     "Histogram of time spent in PREFILL phase for request.", "h_prefill"),
    ("vllm:request_decode_time_seconds",
     "Histogram of time spent in DECODE phase for request.", "h_decode"),
    ("vllm:request_num_preemptions",
     "Histogram of the number of times a request was preempted.", "h_preemptions"),
    ("vllm:request_prefill_kv_computed_tokens",
     "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
     "h_kv_computed"),
)


def _counter(name: str, doc: str, labels: Sequence[str]) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=list(labels))


def _histogram_family(name: str, doc: str, engines: Iterable[EngineStats],
                      attr: str) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=list(_EM))
    for st in engines:
        h: Histogram = getattr(st, attr)
        labels = {"engine": st.engine, "model_name": st.model_name}
        fam.add_metric([st.engine, st.model_name], h.cumulative(), h.total)
        # HistogramMetricFamily has no `created` argument; prometheus_client's Histogram adds
        # this sample itself, and the exposition turns it into the *_created gauge.
        fam.samples.append(Sample(name + "_created", labels, st.created))
    return fam


def vllm_families(engines: Sequence[EngineStats], cache_config: Sequence[dict[str, str]] = (),
                  http_created: float | None = None) -> Iterator[Metric]:
    """Yield vLLM 0.33's families, in its registration order, for the given engines.

    Engines with k = 0 (SD off) contribute no speculative-decoding series, and when no engine
    has SD the four families are absent, as in vLLM without ``--speculative-config``.
    """
    yield from _spec_decode_families([st for st in engines if st.k > 0])
    yield from _scheduler_gauges(engines)
    yield from _cache_and_token_counters(engines)
    yield from _request_families(engines)
    for name, doc, attr in _HISTOGRAMS:
        yield _histogram_family(name, doc, engines, attr)
    if cache_config:
        labels = sorted(cache_config[0])
        fam = GaugeMetricFamily("vllm:cache_config_info",
                                "Information of the LLMEngine CacheConfig", labels=labels)
        for info in cache_config:
            fam.add_metric([info[name] for name in labels], 1.0)
        yield fam
    # prometheus-fastapi-instrumentator (API server): one series per handler/method/status seen
    total = sum(st.http_2xx for st in engines)
    if total and http_created is not None:
        fam = _counter("http_requests", "Total number of requests by method, status and handler.",
                       ("handler", "method", "status"))
        fam.add_metric([COMPLETIONS_HANDLER, "POST", "2xx"], total, created=http_created)
        yield fam


def _spec_decode_families(spec: Sequence[EngineStats]) -> Iterator[Metric]:
    """The speculative-decoding counters of the engines running SD (none: no families)."""
    if not spec:
        return
    for name, doc, attr in _SPEC_COUNTERS:
        fam = _counter(name, doc, _EM)
        for st in spec:
            fam.add_metric([st.engine, st.model_name], getattr(st, attr), created=st.created)
        yield fam
    fam = _counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                   "Accepted tokens per draft position.", (*_EM, "position"))
    for st in spec:
        for pos, value in enumerate(st.accepted_per_pos):
            fam.add_metric([st.engine, st.model_name, str(pos)], value, created=st.created)
    yield fam


def _gauge(name: str, doc: str, values: Iterable[tuple[list[str], float]],
           extra: Sequence[str] = ()) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(name, doc, labels=[*_EM, *extra])
    for labels, value in values:
        fam.add_metric(labels, value)
    return fam


def _scheduler_gauges(engines: Sequence[EngineStats]) -> Iterator[Metric]:
    """The scheduler's gauges: running, waiting (by reason), sleep state, KV-cache usage."""
    yield _gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                 (([st.engine, st.model_name], st.running) for st in engines))
    yield _gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                 (([st.engine, st.model_name], st.waiting) for st in engines))
    yield _gauge("vllm:num_requests_waiting_by_reason", _WAITING_BY_REASON_HELP,
                 (([st.engine, st.model_name, r], st.waiting if r == "capacity" else 0)
                  for st in engines for r in WAITING_REASONS), ("reason",))
    yield _gauge("vllm:engine_sleep_state", _SLEEP_HELP,
                 (([st.engine, st.model_name, s], 1 if s == "awake" else 0)
                  for st in engines for s in SLEEP_STATES), ("sleep_state",))
    yield _gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                 (([st.engine, st.model_name], st.kv_cache_usage) for st in engines))


def _simple_counter(engines: Sequence[EngineStats], name: str, doc: str,
                    attr: str | None) -> CounterMetricFamily:
    """One counter per engine from `attr` of its stats (None: always 0)."""
    fam = _counter(name, doc, _EM)
    for st in engines:
        fam.add_metric([st.engine, st.model_name], getattr(st, attr) if attr else 0,
                       created=st.created)
    return fam


def _cache_and_token_counters(engines: Sequence[EngineStats]) -> Iterator[Metric]:
    """Prefix and multi-modal cache counters, preemptions, prompt and generation tokens."""
    yield _simple_counter(engines, "vllm:prefix_cache_queries",
                          "Prefix cache queries, in terms of number of queried tokens.",
                          "prefix_cache_queries")
    yield _simple_counter(engines, "vllm:prefix_cache_hits",
                          "Prefix cache hits, in terms of number of cached tokens.",
                          "prefix_cache_hits")
    yield _simple_counter(engines, "vllm:external_prefix_cache_queries",
                          "External prefix cache queries from KV connector cross-instance cache "
                          "sharing, in terms of number of queried tokens.", None)
    yield _simple_counter(engines, "vllm:external_prefix_cache_hits",
                          "External prefix cache hits from KV connector cross-instance cache "
                          "sharing, in terms of number of cached tokens.", None)
    yield _simple_counter(engines, "vllm:mm_cache_queries",
                          "Multi-modal cache queries, in terms of number of queried items.", None)
    yield _simple_counter(engines, "vllm:mm_cache_hits",
                          "Multi-modal cache hits, in terms of number of cached items.", None)
    yield _simple_counter(engines, "vllm:num_preemptions",
                          "Cumulative number of preemption from the engine.", "num_preemptions")
    yield _simple_counter(engines, "vllm:prompt_tokens", "Number of prefill tokens processed.",
                          "prompt_tokens")
    fam = _counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                   (*_EM, "source"))
    for st in engines:
        split = {"local_compute": st.prompt_tokens - st.prompt_tokens_cached,
                 "local_cache_hit": st.prompt_tokens_cached, "external_kv_transfer": 0}
        for src in PROMPT_SOURCES:
            fam.add_metric([st.engine, st.model_name, src], split[src], created=st.created)
    yield fam
    yield _simple_counter(engines, "vllm:prompt_tokens_cached",
                          "Number of cached prompt tokens (local + external).",
                          "prompt_tokens_cached")
    fam = _counter("vllm:prompt_tokens_cached_by_source", _CACHED_BY_SOURCE_HELP,
                   (*_EM, "source"))
    for st in engines:
        for src in CACHED_SOURCES:
            value = st.prompt_tokens_cached if src == "device" else 0
            fam.add_metric([st.engine, st.model_name, src], value, created=st.created)
    yield fam
    yield _simple_counter(engines, "vllm:generation_tokens",
                          "Number of generation tokens processed.", "generation_tokens")


def _request_families(engines: Sequence[EngineStats]) -> Iterator[Metric]:
    """Finished requests by reason (per engine) and admission rejections (per model)."""
    fam = _counter("vllm:request_success", "Count of successfully processed requests.",
                   ("engine", "finished_reason", "model_name"))
    for st in engines:
        for reason in FINISH_REASONS:
            fam.add_metric([st.engine, reason, st.model_name], st.request_success[reason],
                           created=st.created)
    yield fam
    # vLLM registers this one per model (API-server side), without the engine label.
    fam = _counter("vllm:admission_rejections",
                   "Number of admission attempts rejected by a queue limit, by reason.",
                   ("model_name", "reason"))
    seen: set[str] = set()
    for st in engines:
        if st.model_name in seen:
            continue
        seen.add(st.model_name)
        for reason in ADMISSION_REASONS:
            fam.add_metric([st.model_name, reason], 0, created=st.created)
    yield fam
