"""The one registry of engines: each engine module registers its :class:`Engine` on import.

Every module of the :mod:`specwatch.engines` package is imported on the first question
asked here, so the registry holds the same engines whatever was imported first; an engine
outside the package (a plug-in, a test) is added with :func:`register`. Everything that reads
a page asks here: which names a target's ``engine:`` setting reads, which engine a page is,
which counters say SD is configured.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Mapping

from specwatch.engines.base import SPEC_STEPS, CacheInfo, Engine, PageView

#: The ``engine:`` setting that reads every registered engine's names.
AUTO = "auto"
#: The kind of a page no registered engine recognises.
UNKNOWN = "unknown"

_lock = threading.RLock()
_engines: dict[str, Engine] = {}
_discovered = False
_generation = 0
_ordered: tuple[Engine, ...] | None = None  # engines(), kept until the registry changes
_cache_infos: dict[str, CacheInfo] | None = None  # cache_infos(), likewise
_sd_counters: frozenset[str] | None = None  # sd_counters() (read for every model of a poll)


def _discover() -> None:
    """Import every module of this package once (each engine module registers itself)."""
    global _discovered
    if _discovered:
        return
    with _lock:
        if _discovered:
            return
        package = importlib.import_module(__package__ or "specwatch.engines")
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
            importlib.import_module(f"{package.__name__}.{info.name}")
        _discovered = True


def register(engine: Engine) -> Engine:
    """Add ``engine`` (its module calls this on import); returns it. A second engine of the
    same kind is an error, the same one again a no-op."""
    with _lock:
        old = _engines.get(engine.kind)
        if old is engine:
            return engine
        if old is not None:
            raise ValueError(f"engine kind {engine.kind!r} is registered twice")
        if engine.kind in (AUTO, UNKNOWN):
            raise ValueError(f"{engine.kind!r} is not an engine kind")
        _engines[engine.kind] = engine
        _changed()
    return engine


def unregister(kind: str) -> None:
    """Remove an engine added with :func:`register` (a test's own, when it is done)."""
    with _lock:
        if _engines.pop(kind, None) is not None:
            _changed()


def _changed() -> None:
    global _generation, _ordered, _cache_infos, _sd_counters
    _generation += 1
    _ordered = _cache_infos = _sd_counters = None


def generation() -> int:
    """A number that changes whenever an engine is added or removed (for caches of names)."""
    _discover()
    return _generation


def engines() -> tuple[Engine, ...]:
    """Every registered engine, in recognition order."""
    global _ordered
    _discover()
    found = _ordered
    if found is None:
        with _lock:
            found = _ordered = tuple(sorted(_engines.values(), key=lambda e: (e.order, e.kind)))
    return found


def by_kind(kind: str) -> Engine | None:
    """The engine of a page's kind (None: "unknown" or not registered)."""
    _discover()
    return _engines.get(kind)


def get(kind: str) -> Engine:
    """The engine of ``kind``; KeyError when none is registered."""
    found = by_kind(kind)
    if found is None:
        raise KeyError(f"no engine of kind {kind!r} is registered")
    return found


def families() -> tuple[str, ...]:
    """The ``engine:`` values a target may name, in order (without "auto")."""
    return tuple(dict.fromkeys(e.family for e in engines()))


def config_kinds() -> tuple[str, ...]:
    """Every valid ``engine:`` setting: the families, then "auto"."""
    return (*families(), AUTO)


def for_setting(setting: str) -> tuple[Engine, ...]:
    """The engines whose names a target with ``engine: setting`` reads."""
    found = engines()
    if setting == AUTO:
        return found
    return tuple(e for e in found if e.family == setting)


def recognise(page: PageView) -> str:
    """The kind of the first engine that recognises ``page``, else "unknown"."""
    for engine in engines():
        if engine.recognises(page):
            return engine.kind
    return UNKNOWN


def prefixes() -> tuple[str, ...]:
    """Every engine's metric-name prefix (each once, in order)."""
    return tuple(dict.fromkeys(e.prefix for e in engines()))


def sd_counters() -> frozenset[str]:
    """The canonical counters some engine registers only when SD is configured."""
    global _sd_counters
    found = _sd_counters
    if found is None:
        found = _sd_counters = frozenset().union(*(e.sd_counters for e in engines()))
    return found


def max_gauges() -> frozenset[str]:
    """Canonical gauges that state a configuration: aggregated over ranks with max."""
    return frozenset().union(*(e.max_gauges for e in engines()))


def rank_labels() -> tuple[str, ...]:
    """Every engine's replica rank labels (each once, in order)."""
    return tuple(dict.fromkeys(label for e in engines() for label in e.rank_labels))


def k_gauges() -> frozenset[str]:
    """Canonical gauges that state the configured k (engines with ``configured_k="gauge"``)."""
    return frozenset(SPEC_STEPS for e in engines() if e.capabilities.configured_k == "gauge")


def cache_infos() -> Mapping[str, CacheInfo]:
    """Canonical info signal -> how to read its series, over every engine."""
    global _cache_infos
    found = _cache_infos
    if found is None:
        found = _cache_infos = {info.signal: info for e in engines()
                                for info in e.infos.values()}
    return found


def sd_configured(kind: str, sd_counters_present: bool, gauges: Mapping[str, float]
                  ) -> bool | None:
    """Is SD configured on a page of ``kind`` (None: the page does not say)."""
    engine = by_kind(kind)
    return None if engine is None else engine.sd_configured(sd_counters_present, gauges)


def proposed_per_verify(gauges: Mapping[str, float], configured_k: int | None
                        ) -> float | None:
    """Draft tokens proposed per verify call: what an engine's gauges state, else k."""
    for engine in engines():
        found = engine.proposed_per_verify(gauges, configured_k)
        if found is not None:
            return found
    return float(configured_k) if configured_k else None
