"""What a server says about its own capacity: its engine's KV-cache info series (vLLM's
``cache_config_info``), summed over the page's engine instances.

What each instance states is its engine module's reading (:class:`specwatch.engines.base.
CacheInfo`); owned here is the rule that a
value one engine does not state (or two series of one engine that disagree) is unknown for
the server: a sum missing a term would understate the capacity. A total that is not finite
(stated sizes near the float range, summed or multiplied) is unknown too, and counted.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from specwatch.engines import registry


@dataclass(frozen=True)
class ServerCapacity:
    """What a server says about its own capacity (its KV-cache info series).

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
    #: Totals left unknown because they are not finite (e.g. two engines stating 1e308
    #: tokens): the page counts them with its invalid series.
    overflowed: int = 0


def gauge_capacity(stated: tuple[float | None, float | None, float | None] | None
                   ) -> ServerCapacity | None:
    """The capacity an engine states through its gauges (one instance); None: not stated.
    A total that is not finite is unknown and counted, as for the info series."""
    if stated is None:
        return None
    tokens, blocks, size = stated
    if tokens is not None and not math.isfinite(tokens):
        return ServerCapacity(None, blocks, size, engines=1, overflowed=1)
    return ServerCapacity(tokens, blocks, size, engines=1)


#: Most info series whose capacity is remembered (a page states one per engine instance).
CACHED_INFO_SERIES = 16


def server_capacity(infos: Mapping[tuple[str, str, tuple[tuple[str, str], ...]], float]
                    ) -> ServerCapacity | None:
    """The server's capacity from its KV-cache info series, keyed as the parsed page's
    series (:data:`specwatch.poll.sources.SeriesKey`; None: none on the page). Two series
    of one engine instance that disagree make every value unknown.

    It reads the series' keys only (their labels), which a server repeats on every poll:
    the answer for a few series is remembered per key set and registry generation."""
    if not infos:
        return None
    keys = tuple(infos)
    if len(keys) > CACHED_INFO_SERIES:
        return _capacity(keys, registry.generation())
    return _capacity_cached(keys, registry.generation())


def _capacity(keys: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...],
              generation: int) -> ServerCapacity | None:
    """:func:`server_capacity` of the series ``keys`` (``generation``: the registry's, part
    of the cache key)."""
    engines: dict[str, tuple[float | None, float | None, float | None]] = {}
    conflict = False
    readers = registry.cache_infos()
    for (_, sig, identity) in keys:
        reader = readers.get(sig)
        if reader is None:
            continue
        labels = dict(identity)
        found = reader.state(labels)
        engine = labels.get("engine", "")
        conflict = conflict or engines.setdefault(engine, found) != found
    if not engines:
        return None
    if conflict:
        return ServerCapacity(None, None, None, len(engines))

    overflowed = 0

    def total(i: int) -> float | None:
        nonlocal overflowed
        vals = [e[i] for e in engines.values()]
        if any(v is None for v in vals):
            return None
        value = float(sum(vals))  # type: ignore[arg-type]
        if not math.isfinite(value):  # a term or the sum past the float range
            overflowed += 1
            return None
        return value

    tokens, blocks = total(0), total(1)
    sizes = [e[2] for e in engines.values()]
    return ServerCapacity(kv_cache_tokens=tokens, num_gpu_blocks=blocks,
                          block_size=None if None in sizes else max(sizes),  # type: ignore[type-var]
                          engines=len(engines), overflowed=overflowed)


_capacity_cached = functools.lru_cache(maxsize=256)(_capacity)
