"""The pipeline's published :class:`Snapshot`, made when read.

Protected behaviour: a reader gets one immutable object holding the latest snapshot of
every target in configuration order; the same object until a target is published again
(the collector caches the exposition per snapshot object); a publish, a target set change
or a dropped result of a removed target never changes a snapshot already handed out.
"""

from __future__ import annotations

from helpers.paths import FIXTURES

from specwatch.poll.pipeline import Pipeline, PollResult
from specwatch.poll.windows import derive

PAGES = sorted((FIXTURES / "vllm-0.32-cpu-ngram").glob("snap_*.prom"),
               key=lambda p: int(p.stem.split("_")[1]))


def _pipeline() -> Pipeline:
    return Pipeline([("a", "auto"), ("b", "auto"), ("c", "auto")],
                    derive.DeriveConfig(count_window=20), 5.0, clock=lambda: 0.0)


def _poll(p: Pipeline, target: str, k: int) -> None:
    p.apply(PollResult(target, 10.0 + k, 10.0 + k, 0.01, body=PAGES[k].read_text(),
                       monotonic=10.0 + 5 * k))


def test_the_same_object_until_a_publish_then_every_target_latest_in_order() -> None:
    p = _pipeline()
    first = p.snapshot
    assert p.snapshot is first and list(first.targets) == ["a", "b", "c"]
    assert not any(t.up for t in first.targets.values())
    _poll(p, "b", 0)
    second = p.snapshot
    assert second is not first and p.snapshot is second
    assert list(second.targets) == ["a", "b", "c"] and second.targets["b"].up
    assert second.created_at == 10.0
    assert not first.targets["b"].up  # a snapshot handed out before never changes
    _poll(p, "a", 1)
    _poll(p, "b", 2)
    third = p.snapshot
    assert third.targets["a"].up and third.targets["b"].timestamp == 12.0
    assert second.targets["b"].timestamp == 10.0 and not second.targets["a"].up
    assert third.created_at == 12.0


def test_target_set_changes_and_results_of_removed_targets() -> None:
    p = _pipeline()
    _poll(p, "a", 0)
    _poll(p, "c", 1)
    before = p.snapshot
    p.set_targets([("c", "auto"), ("d", "auto")])
    after = p.snapshot
    assert list(after.targets) == ["c", "d"]
    assert after.targets["c"] is before.targets["c"] and not after.targets["d"].up
    assert list(before.targets) == ["a", "b", "c"]
    _poll(p, "a", 2)  # removed: dropped, nothing published
    assert p.snapshot is after
