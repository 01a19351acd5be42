"""State stays bounded whatever a target sends (the exporter's poll path).

Protected behaviour:

* a target that renames its models every poll: at most ``max_models`` live and as many
  vanished models per target, the oldest vanished forgotten first, every drop counted in
  ``specwatch_target_models_dropped_total{reason}`` and logged once, a forget hook told of
  every forgotten model; RSS and the /metrics series count stay flat (short run here, a
  minutes-long one under ``make test-all``);
* label values longer than the limit are cut with a stable hash suffix and counted: a 5 MB
  model name gives a /metrics page of kilobytes;
* windows use the pipeline's (monotonic) clock: a backward wall-clock jump does not change a
  rate; ``ServeApp`` wires ``time.monotonic`` unless a clock is injected.
"""

from __future__ import annotations

import gc
import logging
import time

import pytest

from specwatch.app import settings as app_settings
from specwatch.expose.collector import SpecwatchCollector
from specwatch.poll import sources
from specwatch.poll.pipeline import Pipeline, PollResult
from specwatch.poll.windows import derive


def rotating_page(poll: int, names: int, requests: float) -> str:
    """A vLLM-shaped page of ``names`` models whose names are new at every poll."""
    lines = ["# TYPE vllm:request_success_total counter",
             "# TYPE vllm:spec_decode_num_drafts_total counter",
             "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
             "# TYPE vllm:spec_decode_num_accepted_tokens_total counter"]
    for i in range(names):
        m = f'model_name="p{poll}-m{i}",engine="0"'
        lines += [f'vllm:request_success_total{{{m},finished_reason="stop"}} {requests}',
                  f"vllm:spec_decode_num_drafts_total{{{m}}} {requests * 10}",
                  f"vllm:spec_decode_num_draft_tokens_total{{{m}}} {requests * 30}",
                  f"vllm:spec_decode_num_accepted_tokens_total{{{m}}} {requests * 20}"]
    return "\n".join(lines) + "\n"


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def series_count(body: bytes) -> int:
    return sum(1 for line in body.split(b"\n") if line and not line.startswith(b"#"))


def drive_rotating_names(polls: int, names: int, max_models: int = 100
                         ) -> tuple[list[int], list[int], Pipeline, list[tuple]]:
    """Poll one target whose ``names`` model names change every poll; returns the RSS and
    /metrics series count after each poll, the pipeline and the forget-hook calls."""
    p = Pipeline([("t", "vllm")], derive.DeriveConfig(), 1.0, max_models={"t": max_models})
    col = SpecwatchCollector(lambda: p.snapshot)
    p.add_publish_listener(col.prerender)
    forgotten: list[tuple] = []
    p.add_forget_hook(lambda *args: forgotten.append(args))
    rss, series = [], []
    for i in range(polls):
        t = 1000.0 + i
        p.apply(PollResult("t", t, t, 0.01, body=rotating_page(i, names, 10.0 * i)))
        series.append(series_count(col.exposition(p.snapshot, False)))
        if i % 10 == 0:
            gc.collect()
        rss.append(rss_bytes())
    return rss, series, p, forgotten


def test_rotating_model_names_keep_models_series_and_memory_bounded(caplog):
    caplog.set_level(logging.WARNING, logger="specwatch.poll.pipeline")
    rss, series, p, forgotten = drive_rotating_names(polls=120, names=300)
    hist = p.target_history("t")
    assert len(hist.models) <= 200  # 100 live + 100 remembered vanished
    assert len(hist.present_models) == 100
    assert len(hist._slot) <= 200 * 4  # raw state of the series of remembered models only
    snap = p.snapshot.targets["t"]
    assert snap.models_dropped_total["max_models"] == 120 * 200  # 200 left out per poll
    assert snap.models_dropped_total["vanished_limit"] == 119 * 100 - 100
    assert len(forgotten) == snap.models_dropped_total["vanished_limit"]
    assert all(reason == "vanished_limit" for _t, _m, reason in forgotten)
    # The oldest vanished go first: the first models forgotten are those kept at poll 0
    # (the first 100 by name).
    assert {m for _t, m, _r in forgotten[:100]} == set(sorted(f"p0-m{i}"
                                                              for i in range(300))[:100])
    drops = [r for r in caplog.records if "dropping models" in r.getMessage()]
    assert len(drops) == 2  # once per reason, not once per poll
    assert max(series[20:]) == series[20]  # flat /metrics
    # Flat memory after warm-up: a leak of the former kind (one model history per name)
    # grows tens of MB over these 100 polls of 300 new names.
    assert rss[-1] - rss[20] < 8 * 1024 * 1024, (rss[20], rss[-1])


@pytest.mark.slow
def test_rotating_model_names_for_minutes():
    """The long run (make test-all, minutes): 1,500 polls of 1,000 new names each."""
    rss, series, p, _ = drive_rotating_names(polls=1500, names=1000)
    assert len(p.target_history("t").models) <= 200
    assert max(series[100:]) == series[100]
    # Flat: the second half never needs more memory than the first half after warm-up
    # (the parser's label caches fill and clear, the allocator settles: that is the first
    # half's plateau; the unbounded history grew ~22 MB a poll at this rate).
    first, second = max(rss[300:900]), max(rss[900:])
    assert second - first < 8 * 1024 * 1024, (first, second)


def named_page(names: list[str], requests: float) -> str:
    lines = ["# TYPE vllm:request_success_total counter",
             "# TYPE vllm:spec_decode_num_drafts_total counter"]
    for name in names:
        m = f'model_name="{name}",engine="0"'
        lines += [f'vllm:request_success_total{{{m},finished_reason="stop"}} {requests}',
                  f"vllm:spec_decode_num_drafts_total{{{m}}} {requests * 10}"]
    return "\n".join(lines) + "\n"


def test_huge_label_values_are_cut_with_a_stable_hash_and_counted(caplog):
    caplog.set_level(logging.WARNING, logger="specwatch.poll.pipeline")
    huge = "x" * 1_000_000
    twin = huge[:-1] + "y"  # the same first bytes: must stay a different series
    p = Pipeline([("t", "vllm")], derive.DeriveConfig(), 5.0)
    col = SpecwatchCollector(lambda: p.snapshot)
    for i in range(3):
        p.apply(PollResult("t", 1000.0 + 5 * i, 1000.0 + 5 * i, 0.01,
                           body=named_page([huge, twin, "small"], 10.0 * i)))
    snap = p.snapshot.targets["t"]
    assert snap.up, snap.last_error
    names = sorted(snap.models)
    assert len(names) == 3 and all(len(n.encode()) <= 256 for n in names)
    assert "small" in names and names[0] != names[1]
    cut = sorted([sources.truncate_label_value(huge, 256),
                  sources.truncate_label_value(twin, 256)])  # stable: the same every poll
    assert sorted(set(names) - {"small"}) == cut and cut[0].startswith("xxxx")
    assert snap.label_values_truncated_total == 3 * 2
    assert snap.models[cut[0]].window("1m") is not None  # one history over the three polls
    body = col.exposition(p.snapshot, False)
    assert len(body) < 50_000
    assert b'specwatch_target_label_values_truncated_total{target="t"} 6.0' in body
    assert len([r for r in caplog.records if "longer than 256" in r.getMessage()]) == 1


def test_truncation_keeps_utf8_whole_and_short_values_untouched():
    assert sources.truncate_label_value("short", 256) == "short"
    cut = sources.truncate_label_value("é" * 300, 64)
    assert len(cut.encode()) <= 64 and cut.startswith("é") and "~" in cut
    cut.encode("utf-8")  # no half character


class FakeClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_backward_wall_clock_jump_does_not_change_rates():
    """Polls every 5 s by the monotonic clock while the wall clock jumps back an hour:
    the arrival rate stays 2 requests per second."""
    mono = FakeClock(50.0)
    p = Pipeline([("t", "vllm")], derive.DeriveConfig(windows=(("1m", 60.0),)), 5.0,
                 clock=mono)
    wall = 1.7e9
    for i in range(30):
        if i == 15:
            wall -= 3600.0  # NTP step backwards
        mono.t += 5.0
        wall += 5.0
        p.apply(PollResult("t", wall, wall, 0.01, body=rotating_page(0, 1, 10.0 * i)))
        w = p.snapshot.targets["t"].models["p0-m0"].window("1m")
        if i >= 2:
            assert w.values[derive.ARRIVAL_RATE] == pytest.approx(2.0), i
    assert p.snapshot.targets["t"].last_success_timestamp == wall  # people see wall time


def test_serve_app_measures_windows_on_the_monotonic_clock():
    """ServeApp stamps each poll with time.monotonic (or the injected clock: tests, the
    demo's simulated time); the result's wall time is kept for timestamps."""
    from specwatch.app.serve import ServeApp

    cfg = app_settings.build_config(None, ["a=http://127.0.0.1:9/metrics"], "127.0.0.1:0", 5.0)
    assert ServeApp(cfg).history_clock is time.monotonic
    fake = FakeClock(10.0)
    app = ServeApp(cfg, clock=fake)
    assert app.poller.on_result == app.on_poll_result
    for i in range(3):
        fake.t = 10.0 + 5 * i
        app.on_poll_result(PollResult("a", 9e9 - i, 9e9 - i, 0.01,
                                      body=rotating_page(0, 1, 10.0 * i)))
    hist = app.pipeline.target_history("a").models["p0-m0"].entries
    assert list(hist.times()) == [10.0, 15.0, 20.0]
    assert app.pipeline.snapshot.targets["a"].last_success_timestamp == 9e9 - 2


def test_removed_target_forgets_its_models():
    p = Pipeline([("a", "vllm"), ("b", "vllm")], derive.DeriveConfig(), 5.0)
    forgotten: list[tuple] = []
    p.add_forget_hook(lambda *args: forgotten.append(args))
    p.apply(PollResult("a", 1.0, 1.0, 0.01, body=rotating_page(0, 2, 1.0)))
    p.set_targets([("b", "vllm")])
    assert sorted(forgotten) == [("a", "p0-m0", "target_removed"),
                                 ("a", "p0-m1", "target_removed")]
