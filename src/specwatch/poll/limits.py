"""Per-target series cap: keep whole models, drop (and count) the rest.

Why whole models: the derived signals are ratios of sums over a model's series (accepted /
draft tokens summed over ``engine``). Dropping an arbitrary subset of series would keep a
model with, say, seven of eight ranks' accepted tokens and all eight ranks' draft tokens and
publish a wrong acceptance rate. Dropping a model entirely leaves every value that is still
published exact, and the drop is visible in ``specwatch_target_series_dropped_total``.

Which models stay: models kept before stay kept (a new adapter cannot evict a model an
operator is watching), then in name order, greedily while they fit.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Collection

from specwatch.poll.sources import ParsedPage


def series_count(page: ParsedPage) -> int:
    """Source series specwatch keeps from a page (counters, created samples, gauges)."""
    return len(page.counters) + len(page.created) + len(page.gauges)


def cap_series(page: ParsedPage, max_series: int, keep_first: Collection[str] = ()
               ) -> tuple[ParsedPage, int]:
    """``page`` reduced to at most ``max_series`` series by dropping whole models.

    Returns the page (the same object when nothing is dropped) and the number of series
    dropped.
    """
    total = series_count(page)
    if total <= max_series:
        return page, 0
    per_model: Counter[str] = Counter()
    for key in page.counters:
        per_model[key[0]] += 1
    for key in page.created:
        per_model[key[0]] += 1
    for model, _sig in page.gauges:
        per_model[model] += 1
    kept: set[str] = set()
    used = 0
    for model in sorted(per_model, key=lambda m: (m not in keep_first, m)):
        if used + per_model[model] <= max_series:
            kept.add(model)
            used += per_model[model]
    capped = dataclasses.replace(
        page,
        counters={k: v for k, v in page.counters.items() if k[0] in kept},
        created={k: v for k, v in page.created.items() if k[0] in kept},
        gauges={k: v for k, v in page.gauges.items() if k[0] in kept},
        configured_k={m: k for m, k in page.configured_k.items() if m in kept},
        invalid_counters=frozenset(k for k in page.invalid_counters if k[0] in kept))
    return capped, total - used
