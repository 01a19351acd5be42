"""A target snapshot the pipeline has replaced is freed when its successor is published.

Protected behaviour (the resident memory of a large fleet): the collector's caches keep
neither a target's earlier snapshots (their windows, models and frozen history arrays) nor
the lines rendered for them alive until the next scrape; the bytes served stay the same.
"""

from __future__ import annotations

import weakref

from helpers.paths import FIXTURES

from specwatch.expose.collector import SpecwatchCollector
from specwatch.poll.pipeline import Pipeline, PollResult
from specwatch.poll.windows import derive

PAGES = sorted((FIXTURES / "vllm-0.32-cpu-ngram").glob("snap_*.prom"),
               key=lambda p: int(p.stem.split("_")[1]))


def test_a_replaced_target_snapshot_is_freed_when_the_next_one_is_published(
        rendered_targets: list[str]) -> None:
    rendered = rendered_targets
    p = Pipeline([("a", "vllm"), ("b", "vllm")], derive.DeriveConfig(), 5.0)
    col = SpecwatchCollector(lambda: p.snapshot)
    p.add_publish_listener(col.prerender)
    texts = [path.read_text() for path in PAGES[-3:]]
    for name in ("a", "b"):
        p.apply(PollResult(name, 1000.0, 1000.0, 0.01, body=texts[0]))
    col.exposition(p.snapshot, False)  # renders both targets and caches the page
    assert sorted(rendered) == ["a", "b"]
    old_a = weakref.ref(p.snapshot.targets["a"])
    kept_b = p.snapshot.targets["b"]
    p.apply(PollResult("a", 1005.0, 1005.0, 0.01, body=texts[1]))
    assert old_a() is None  # freed by reference counting, no collector pass needed
    # The target not polled again keeps its rendered lines: the next scrape reuses them.
    assert p.snapshot.targets["b"] is kept_b
    served = col.exposition(p.snapshot, False)
    assert sorted(rendered) == ["a", "a", "b"]  # a's new snapshot once (at its publish)
    assert served == SpecwatchCollector(lambda: p.snapshot).exposition(p.snapshot, False)
