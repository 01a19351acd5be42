"""The cached exposition writes exactly what prometheus_client writes for collect().

Protected behaviour: ``/metrics`` is served from bytes rendered once per target
snapshot and joined once per snapshot; those bytes (Prometheus text and OpenMetrics, plain and
gzip) equal prometheus_client's encoding of the collector's ``collect()`` (the interface
registry users keep), including escaped label values, down targets, builders registered per
scrape and per snapshot; a snapshot served twice is not rendered twice, and a new snapshot
re-renders only the targets that changed.
"""

from __future__ import annotations

import gzip
import zlib

import pytest
from helpers.paths import FIXTURES
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.openmetrics import exposition as om_exposition
from prometheus_client.utils import floatToGoString

from specwatch.app import settings as app_settings
from specwatch.expose import collector as collector_mod
from specwatch.expose.collector import SpecwatchCollector, gzip_join
from specwatch.poll.pipeline import Pipeline, PollResult
from specwatch.poll.windows import derive

PAGES = sorted((FIXTURES / "vllm-0.32-cpu-ngram").glob("snap_*.prom"),
               key=lambda p: int(p.stem.split("_")[1]))
ODD = 'we"ird\\model\nname é'
#: The render before any test wraps it.
RENDER_TARGET = collector_mod.render_target


def pipeline_with_data() -> Pipeline:
    names = ["a", 't"b\\', "down", "never"]
    p = Pipeline([(n, "vllm") for n in names], derive.DeriveConfig(), 5.0)
    texts = [path.read_text() for path in PAGES[-12:]]
    esc = ODD.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    for i, text in enumerate(texts):
        t = 1000.0 + 5 * i
        p.apply(PollResult("a", t, t, 0.01, body=text))
        p.apply(PollResult('t"b\\', t, t, 0.02,
                           body=text.replace('model_name="tiny-llama"', f'model_name="{esc}"')))
        p.apply(PollResult("down", t, t, 3.0, error_reason="timeout", error_message="slow"))
    return p


def reference(col: SpecwatchCollector, openmetrics: bool) -> bytes:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(col)
    return om_exposition.generate_latest(reg) if openmetrics else generate_latest(reg)


def served(col: SpecwatchCollector, snap, openmetrics: bool) -> bytes:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(col.per_scrape())
    tail = om_exposition.generate_latest(reg) if openmetrics else generate_latest(reg)
    return col.exposition(snap, openmetrics) + tail


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_cached_bytes_equal_prometheus_client_encoding(openmetrics):
    p = pipeline_with_data()
    col = SpecwatchCollector(lambda: p.snapshot)

    def per_scrape(_snap):
        g = GaugeMetricFamily("x_per_scrape", "changes between snapshots", labels=["k"])
        g.add_metric(['v"1'], 2.5)
        return [g]

    def per_snapshot(snap):
        g = GaugeMetricFamily("x_per_snapshot", "from the snapshot", labels=["target"])
        for name in snap.targets:
            g.add_metric([name], 1.0)
        return [g]

    col.add_family_builder(per_scrape)
    col.add_family_builder(per_snapshot, per_snapshot=True)
    want = reference(col, openmetrics)
    got = served(col, p.snapshot, openmetrics)
    assert b"sd_acceptance_rate{" in got and b'model_name="we\\"ird\\\\model\\nname' in got
    assert b"specwatch_target_models_dropped_total" in got
    assert got == want


def test_gzip_body_is_one_member_with_the_same_bytes():
    p = pipeline_with_data()
    col = SpecwatchCollector(lambda: p.snapshot)
    tail = b"# tail\nx 1.0\n"
    body = gzip_join(col.exposition_deflate(p.snapshot, False), tail)
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    plain = d.decompress(body) + d.flush()
    assert d.eof and d.unused_data == b""  # one gzip member (clients that stop after one)
    assert plain == col.exposition(p.snapshot, False) + tail == gzip.decompress(body)


def test_gzip_scrape_keeps_only_the_deflate_stream(monkeypatch):
    """A gzip scrape (what Prometheus asks for) caches the deflate stream of the snapshot,
    not its text too (megabytes for a large fleet, held until the next scrape,
    peak RSS); a second gzip scrape of the snapshot is served from the cache."""
    p = pipeline_with_data()
    col = SpecwatchCollector(lambda: p.snapshot)
    pages: list[int] = []
    real = col._render_page

    def counting(snap, openmetrics):
        pages.append(1)
        return real(snap, openmetrics)

    monkeypatch.setattr(col, "_render_page", counting)
    first = col.exposition_deflate(p.snapshot, False)
    assert col.exposition_deflate(p.snapshot, False) is first and len(pages) == 1
    _snap, cache = col._page
    assert set(cache) == {"text.z"}
    assert zlib.decompressobj(-15).decompress(first[0]) == col.exposition(p.snapshot, False)


def test_a_snapshot_is_rendered_once_and_only_changed_targets_again(rendered_targets):
    p = pipeline_with_data()
    col = SpecwatchCollector(lambda: p.snapshot)
    rendered = rendered_targets
    p.add_publish_listener(col.prerender)
    p.apply(PollResult("down", 1500.0, 1500.0, 3.0, error_reason="timeout"))
    assert rendered == []  # nobody scraped yet: nothing rendered ahead
    first = col.exposition(p.snapshot, False)
    assert sorted(rendered) == sorted(p.snapshot.targets)
    assert col.exposition(p.snapshot, False) is first  # same snapshot: the cached bytes
    rendered.clear()
    p.apply(PollResult("a", 2000.0, 2000.0, 0.01, body=PAGES[-1].read_text()))
    assert rendered == ["a"]  # rendered when published
    second = col.exposition(p.snapshot, False)
    assert rendered == ["a"] and second != first
    assert second == reference(col, False)


def _without_process(body: bytes) -> list[bytes]:
    own = (b"process_", b"python_", b"# HELP process_", b"# TYPE process_", b"# HELP python_",
           b"# TYPE python_", b"specwatch_http_requests_in_flight")
    return [line for line in body.split(b"\n")
            if not any(line.startswith(p) or line.startswith(b"# HELP " + p)
                       or line.startswith(b"# TYPE " + p) for p in own)]


@pytest.mark.parametrize("accept", ["", "application/openmetrics-text;version=1.0.0"])
@pytest.mark.parametrize("encoding", ["", "gzip"])
def test_serve_metrics_handler_equals_the_registry(accept, encoding):
    """What GET /metrics answers equals the registry's encoding (process metrics aside:
    they move between two calls), gzip or not, text or OpenMetrics."""
    from specwatch.app.serve import ServeApp
    from specwatch.web.routing import Request

    cfg = app_settings.build_config(None, ["a=http://127.0.0.1:9/metrics"], "127.0.0.1:0", 5.0)
    app = ServeApp(cfg)
    for i, path in enumerate(PAGES[-6:]):
        t = 1000.0 + 5 * i
        app.pipeline.apply(PollResult("a", t, t, 0.01, body=path.read_text()))
    headers = {"accept": accept, "accept-encoding": encoding}
    resp = app.metrics_handler(Request("GET", "/metrics", {}, headers))
    body = resp.body
    if encoding:
        assert resp.headers["Content-Encoding"] == "gzip"
        body = gzip.decompress(body)
    if accept:
        want = om_exposition.generate_latest(app.registry)
        assert resp.content_type.startswith("application/openmetrics-text")
    else:
        want = generate_latest(app.registry)
    assert b"sd_acceptance_rate{" in body
    assert _without_process(body) == _without_process(want)


def test_identical_page_skips_the_parse_but_advances_the_windows(monkeypatch):
    """An idle server sends the same bytes every poll: parsed once, and the windows still
    move (the span grows, the rate falls as the time passes without requests)."""
    from specwatch.poll import sources

    calls: list[int] = []
    real = sources.parse_page

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sources, "parse_page", counting)
    p = Pipeline([("a", "vllm")], derive.DeriveConfig(windows=(("1m", 60.0),)), 5.0)
    texts = [path.read_text() for path in PAGES[-3:]]
    for i, text in enumerate(texts + [texts[-1]] * 5):
        p.apply(PollResult("a", 1000.0 + 5 * i, 1000.0 + 5 * i, 0.01, body=text))
    assert len(calls) == 3  # the five repeats of the last page were not parsed
    spans = []
    m = next(iter(p.snapshot.targets["a"].models.values()))
    spans.append(m.window("1m").span_seconds)
    p.apply(PollResult("a", 1040.0, 1040.0, 0.01, body=texts[-1]))
    m = next(iter(p.snapshot.targets["a"].models.values()))
    assert m.window("1m").span_seconds == spans[0] + 5.0
    p.apply(PollResult("a", 1045.0, 1045.0, 0.01, body=texts[0]))  # bytes changed: parsed
    assert len(calls) == 4


def test_serve_app_builds_window_histograms_only_for_the_controller_and_pairs():
    from specwatch.app.serve import ServeApp

    cfg = app_settings.build_config(None, ["a=http://127.0.0.1:9/metrics"], "127.0.0.1:0", 5.0)
    app = ServeApp(cfg)
    assert app.controller is None and app.pipeline.derive_config.histograms is False
    for i, path in enumerate(PAGES[-3:]):
        t = 1000.0 + 5 * i
        app.pipeline.apply(PollResult("a", t, t, 0.01, body=path.read_text()))
    m = next(iter(app.pipeline.snapshot.targets["a"].models.values()))
    assert m.windows and all(w.histograms == {} for w in m.windows)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _scrape_every_15s_poll_every_5s(monkeypatch, scrape_offsets: list[float],
                                    run: int | None = None):
    """Two targets polled every 5 s (offsets 0 and 2 s), scraped at the given offsets of
    each 15 s cycle, for ten cycles; returns (renders ahead of the scrapes, renders during
    scrapes, scrapes whose bytes differed from a fresh render). ``run``: None renders at
    publish (``prerender``); a number queues the renders (``prerender_later``) and renders
    them after every ``run`` polls (``render_queued``, as the poller's worker does after its
    run of polls)."""
    p = pipeline_with_data()
    clock = Clock(0.0)
    col = SpecwatchCollector(lambda: p.snapshot, clock=clock)
    counts = {"publish": 0, "scrape": 0}
    where = ["publish"]
    real = RENDER_TARGET  # (not a counting wrapper of an earlier call)

    def counting(t):
        counts[where[0]] += 1
        return real(t)

    monkeypatch.setattr(collector_mod, "render_target", counting)
    p.add_publish_listener(col.prerender if run is None else col.prerender_later)
    polls = 0
    texts = [path.read_text() for path in PAGES]
    events = []
    for cycle in range(10):
        base = 15.0 * cycle
        for k in range(3):
            events += [(base + 5 * k, "poll", "a"), (base + 5 * k + 2, "poll", 't"b\\')]
        events += [(base + off, "scrape", "") for off in scrape_offsets]
    wrong = 0
    for i, (t, kind, name) in enumerate(sorted(events)):
        clock.t = 5000.0 + t
        if kind == "poll":
            where[0] = "publish"
            p.apply(PollResult(name, clock.t, clock.t, 0.01, body=texts[i % len(texts)]))
            polls += 1
            if run is not None and polls % run == 0:
                col.render_queued()
        else:
            where[0] = "scrape"
            body = col.exposition(p.snapshot, False)
            where[0] = "check"
            wrong += body != reference(col, False)
    return counts["publish"], counts["scrape"], wrong


@pytest.mark.parametrize(("offset", "per_cycle"), [(12.5, 2), (12.2, 3)])
def test_a_snapshot_replaced_before_the_next_scrape_is_not_rendered_ahead(
        monkeypatch, offset, per_cycle):
    """Polled every 5 s, scraped every 15 s: once the scrape period is known, a target is
    rendered at publish time only when the next scrape is due before its next poll (about
    one render in three instead of every poll), no scrape has to render a target itself,
    and every scrape serves exactly what a fresh render gives."""
    publish, in_scrape, wrong = _scrape_every_15s_poll_every_5s(monkeypatch, [offset])
    assert wrong == 0
    # 60 polls. Nothing is rendered before the first scrape, every poll until the third
    # teaches the period: 6 of each target. Then, per scrape, each target's last poll
    # before it (a's 2.5 or 2.2 s before, b's 0.5 or 0.2 s before). A poll due within the
    # margin for jitter before the scrape (0.1 s plus 1% of the period: 0.25 s) may come
    # after it, so b's poll before that one is rendered too when the scrape is at 12.2 s.
    assert publish == 2 * 6 + 7 * per_cycle, publish
    assert in_scrape == 4  # the first scrape renders all four targets; then none is stale


def test_scrapes_at_unexpected_times_still_serve_fresh_lines(monkeypatch):
    """Scrapes at irregular offsets (two Prometheus replicas, jitter): whatever the
    prediction, each scrape serves exactly what a fresh render gives, because a scrape
    renders the targets it finds stale."""
    publish, in_scrape, wrong = _scrape_every_15s_poll_every_5s(monkeypatch, [1.0, 13.9])
    assert wrong == 0
    assert publish + in_scrape <= 60 + 20 * 2  # never more renders than before, plus scrapes


@pytest.mark.parametrize("offsets", [[12.5], [12.2], [11.0], [1.0, 13.9]])
def test_renders_after_each_poll_are_the_renders_at_publish(monkeypatch, offsets):
    """``prerender_later`` with the queue rendered after every poll renders exactly what
    ``prerender`` renders at publish, and every scrape serves a fresh render."""
    at_publish = _scrape_every_15s_poll_every_5s(monkeypatch, offsets)
    after_each = _scrape_every_15s_poll_every_5s(monkeypatch, offsets, run=1)
    assert after_each == at_publish
    assert after_each[2] == 0


@pytest.mark.parametrize("offsets", [[12.5], [12.2], [11.0], [1.0, 13.9]])
@pytest.mark.parametrize("run", [2, 3, 7])
def test_renders_after_a_run_of_polls_serve_the_same_bytes_and_never_render_more(
        monkeypatch, offsets, run):
    """Renders left until after a run of polls (``specwatch serve`` renders after
    each run of its poller's worker): a scrape that comes in between renders what it finds
    stale itself, so every scrape still serves exactly a fresh render, and there are never
    more renders in all than at publish (a snapshot replaced in the queue is never
    rendered)."""
    ahead, in_scrape, wrong = _scrape_every_15s_poll_every_5s(monkeypatch, offsets, run=run)
    at_publish = _scrape_every_15s_poll_every_5s(monkeypatch, offsets)
    assert wrong == 0
    assert ahead + in_scrape <= at_publish[0] + at_publish[1]


def _scraped_three_times(p: Pipeline, clock: Clock) -> SpecwatchCollector:
    """A collector scraped at 0, 15 and 30 s (it knows the 15 s period), publishing later."""
    col = SpecwatchCollector(lambda: p.snapshot, clock=clock)
    p.add_publish_listener(col.prerender_later)
    for t in (0.0, 15.0, 30.0):
        clock.t = t
        p.apply(PollResult("down", 900.0 + t, 900.0 + t, 3.0, error_reason="timeout"))
        col.exposition(p.snapshot, False)
    return col


def _two_polls_of_a(monkeypatch, times: tuple[float, float]
                    ) -> tuple[Pipeline, SpecwatchCollector, list[object]]:
    """Target "a" polled at ``times`` after :func:`_scraped_three_times` (scrape due at
    45 s), publishing through ``prerender_later``; returns the pipeline, the collector and
    the list of the targets rendered since (none yet: nothing renders before
    ``render_queued``)."""
    p = pipeline_with_data()
    clock = Clock(0.0)
    col = _scraped_three_times(p, clock)
    rendered: list[object] = []
    monkeypatch.setattr(collector_mod, "render_target",
                        lambda t: rendered.append(t) or RENDER_TARGET(t))
    texts = [path.read_text() for path in PAGES[-2:]]
    for t, text in zip(times, texts, strict=True):
        clock.t = t
        p.apply(PollResult("a", 2000.0 + t, 2000.0 + t, 0.01, body=text))
    return p, col, rendered


def test_only_the_newest_queued_snapshot_of_a_target_is_rendered(monkeypatch):
    """Two polls of one target before the queue is rendered (at 31 and 44 s, both read by
    the scrape due at 45 s): one render, of the newest snapshot; nothing is rendered
    before ``render_queued``."""
    p, col, rendered = _two_polls_of_a(monkeypatch, (31.0, 44.0))
    assert rendered == []
    col.render_queued()
    assert rendered == [p.snapshot.targets["a"]]
    col.render_queued()  # the queue is empty now
    assert len(rendered) == 1
    assert col.exposition(p.snapshot, False) == reference(col, False)
    assert len(rendered) == 1  # the scrape found it rendered


def test_a_queued_snapshot_replaced_before_the_next_scrape_is_dropped(monkeypatch):
    """A target queued at 31 s and polled again at 36 s, before the scrape due at 45 s: the
    newer snapshot is not rendered ahead (its next poll, at 41 s, comes first), and the
    older one leaves the queue unrendered."""
    _p, col, rendered = _two_polls_of_a(monkeypatch, (31.0, 36.0))
    col.render_queued()
    assert rendered == []
    assert col._queued == {}


def test_a_failing_queued_render_is_logged_and_the_rest_are_rendered(monkeypatch, caplog):
    """``render_queued`` never raises: a target whose render fails is logged, and the other
    queued targets are rendered."""
    p = pipeline_with_data()
    clock = Clock(0.0)
    col = _scraped_three_times(p, clock)
    real = collector_mod.render_target

    def failing(t):
        if t.name == "a":
            raise RuntimeError("render bug")
        return real(t)

    monkeypatch.setattr(collector_mod, "render_target", failing)
    texts = [path.read_text() for path in PAGES[-2:]]
    clock.t = 31.0
    p.apply(PollResult("a", 2031.0, 2031.0, 0.01, body=texts[0]))
    p.apply(PollResult('t"b\\', 2031.0, 2031.0, 0.01, body=texts[1]))
    col.render_queued()
    assert "rendering the series of target a failed" in caplog.text
    assert col._targets['t"b\\'][0] is p.snapshot.targets['t"b\\']
    assert col._queued == {}


def test_a_target_whose_render_fails_is_left_out_of_the_scrape_and_logged(monkeypatch,
                                                                          caplog):
    """A scrape whose render of one target fails serves the others' lines (and the health
    and build families), logs the failure, and does not raise."""
    p = pipeline_with_data()
    col = SpecwatchCollector(lambda: p.snapshot)

    def failing(t):
        if t.name == "a":
            raise RuntimeError("render bug")
        return RENDER_TARGET(t)

    monkeypatch.setattr(collector_mod, "render_target", failing)
    body = col.exposition(p.snapshot, False)
    assert "rendering the series of target a failed" in caplog.text
    assert b'target="a"' not in body
    assert b'target="down"' in body and b"specwatch_build_info{" in body


def test_serve_renders_published_targets_after_the_pollers_run(monkeypatch):
    """``specwatch serve`` leaves a published target's render to the end of the poller
    worker's run of polls (its ``after_run``), not to the publish."""
    from specwatch.app.serve import ServeApp
    from specwatch.web.routing import Request

    cfg = app_settings.build_config(None, ["a=http://127.0.0.1:9/metrics"], "127.0.0.1:0", 5.0)
    app = ServeApp(cfg)
    rendered: list[object] = []
    real = collector_mod.render_target
    monkeypatch.setattr(collector_mod, "render_target",
                        lambda t: rendered.append(t) or real(t))
    app.metrics_handler(Request("GET", "/metrics", {}, {}))  # scraped: renders ahead now
    rendered.clear()
    app.pipeline.apply(PollResult("a", 1000.0, 1000.0, 0.01, body=PAGES[-1].read_text()))
    assert rendered == []
    app.poller.after_run()
    assert rendered == [app.pipeline.snapshot.targets["a"]]


_EDGES = [0.0, -0.0, 5e-324, -5e-324, 1e-5, 1.5e-7, 0.1, 1.0, 999999.0, 999999.9999999999,
          1e6, 1e6 - 2**-33, 1e6 + 2**-32, 1234567.0, 1e15, 1e16, 1e22, 1.7976931348623157e308,
          -1e6, -1234567.0, -1e16, -1e300, float("inf"), float("-inf"), float("nan"),
          0, 1, 7, -3, 10**7, True]


@settings(max_examples=3000, deadline=None)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                 st.floats(min_value=1e5, max_value=1e7), st.integers(-10**9, 10**9)))
def test_go_float_is_the_librarys_float_to_go_string(x: float) -> None:
    """The fast path writes every value as prometheus_client's floatToGoString does."""
    assert collector_mod.go_float(x) == floatToGoString(x)


@pytest.mark.parametrize("x", _EDGES)
def test_go_float_at_the_edges(x: float) -> None:
    """Around its 1e6 limit, the exponent forms, signed zeros, ±Inf, NaN, ints and bools."""
    assert collector_mod.go_float(x) == floatToGoString(x)


def test_a_poll_a_second_before_the_scrape_replaces_its_predecessor_unrendered(monkeypatch):
    """Polled every 5 s and scraped every 15 s, one second after one of the target's polls:
    the snapshot that poll replaces is not rendered ahead (the margin for jitter is 0.25 s
    plus 2% of the period, not a second), so once the period is known each target is
    rendered once per scrape, and every scrape still serves exactly a fresh render."""
    publish, in_scrape, wrong = _scrape_every_15s_poll_every_5s(monkeypatch, [11.0])
    assert wrong == 0
    # Nothing before the first scrape (at 11 s); from it to the third (at 41 s), when the
    # period is known, every poll: 6 of each target; then each of the 7 scrapes left
    # reads one snapshot of each (a tenth of the period plus 0.2 s, the former margin,
    # also rendered the poll of target a four seconds before each scrape: 33 renders).
    assert publish == 2 * (6 + 7), publish
    assert in_scrape == 4  # only the first scrape renders, all four targets
