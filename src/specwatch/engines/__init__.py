"""The serving engines specwatch reads: one module per engine, behind one typed interface.

Each engine module holds what specwatch knows about one engine (a version range of it): its
metric names, mapped onto the canonical signals of :mod:`specwatch.engines.base`; how a page
is recognised as its own; its capabilities (per-position counters, configured k, acceptance
length, stated KV capacity, latency histograms and their bucket layouts); and the readings
only it knows (configuration gauges, KV-cache labels). It registers its
:class:`~specwatch.engines.base.Engine` in :mod:`specwatch.engines.registry` on import, and
the registry imports every module of this package on first use, like node_exporter's
collectors: one file per engine, holding its names and its registration.

Nothing outside this package names an engine or one of its metrics (the import-linter
contract ``engines-alone-name-engines``): the poll path, derive, the controller, calibration
and the mixin's tests ask the registry.

How to add an engine:

1. Write ``src/specwatch/engines/<engine>.py``: the sample names it writes -> canonical
   signals (``counters``, ``gauges``, ``infos``), its ``prefix``, ``kind`` and ``family``
   (the target's ``engine:`` setting that reads it), an ``order`` (a kind tried earlier
   wins a page both recognise), the counters it registers only with SD configured
   (``sd_counters``), its :class:`~specwatch.engines.base.Capabilities`, and
   ``register(Engine(...))``. A family whose series do not map one to one onto signals
   (one family as two signals, one series of it, the engine's own position label, a value
   held in a label) goes in ``readings`` (:class:`~specwatch.engines.base.Reading`).
   Subclass :class:`~specwatch.engines.base.Engine` where a reading is the engine's own
   (``recognises``, ``sd_configured``, ``proposed_per_verify``, ``capacity_from_gauges``).
2. Add its pages under ``tests/fixtures/`` (recorded, else built from the engine's source,
   version and file cited in the fixture's README) and a test that reads them.

Acceptance is derived from the counters a page has: draft and accepted tokens (drafts and
per position where counted) or verify calls with generation tokens and finished requests
(:mod:`specwatch.poll.formulas`). An engine with neither needs a canonical signal and a
formula of its own in :mod:`specwatch.engines.base` and :mod:`specwatch.poll.windows.derive`.
"""

from specwatch.engines.base import (
    CacheInfo,
    Capabilities,
    Engine,
    Histogram,
    PageView,
    Reading,
)
from specwatch.engines.registry import by_kind, engines, register, unregister

__all__ = ["CacheInfo", "Capabilities", "Engine", "Histogram", "PageView", "Reading",
           "by_kind", "engines", "register", "unregister"]
