"""Poller and serving robustness: deadlines, size cap, error reasons, isolation, no 500s."""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest
from helpers.pageserver import Page, PageSequenceServer, Stall, Trickle, fixture_pages
from helpers.paths import FIXTURES
from helpers.scrape import scrape, select

from specwatch.app import settings as app_settings
from specwatch.app.serve import ServeApp
from specwatch.poll import config
from specwatch.poll.pipeline import PollResult
from specwatch.poll.poller import Poller, PollTarget
from specwatch.poll.snapshot import Slot

# Every test here runs on both transports (conftest.fetch_path: direct and requests).
pytestmark = pytest.mark.usefixtures("fetch_path")

REPLAY = FIXTURES / "vllm-0.32-cpu-ngram"
PAGE = (FIXTURES / "constructed" / "vllm-0.33-spec-decode.prom"
        ).read_text()


def poll_once(step, **target_kw) -> PollResult:
    with PageSequenceServer([step]) as server:
        results: list[PollResult] = []
        poller = Poller([PollTarget("t", server.url, **target_kw)], 1.0, results.append)
        try:
            return poller.poll_now("t")
        finally:
            poller.stop()


def test_stalled_server_times_out_within_deadline():
    r = poll_once(Stall(5.0), timeout_seconds=0.5)
    assert r.error_reason == "timeout"
    assert r.duration_seconds < 2.0


def test_trickling_server_hits_the_total_deadline():
    """Each byte arrives well within a socket timeout, but the whole body would take 60 s:
    the total deadline ends the poll."""
    r = poll_once(Trickle("x" * 600, chunk_bytes=1, interval_seconds=0.1), timeout_seconds=0.5)
    assert r.error_reason == "timeout"
    assert r.duration_seconds < 2.0


def test_body_over_the_cap_is_too_large():
    assert poll_once(Page(PAGE), max_body_bytes=4096).error_reason == "too_large"
    # Without a Content-Length (streamed body) the cap is enforced while reading.
    r = poll_once(Trickle(PAGE[:8000], chunk_bytes=4000, interval_seconds=0.0),
                  max_body_bytes=4096)
    assert r.error_reason == "too_large"


def test_http_error_status_and_refused_connection():
    assert poll_once(Page("oops", status=500)).error_reason == "http_status"
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    poller = Poller([PollTarget("t", f"http://127.0.0.1:{port}/metrics")], 1.0, lambda r: None)
    try:
        assert poller.poll_now("t").error_reason == "connection"
    finally:
        poller.stop()


def test_headers_and_basic_auth_are_sent():
    seen: dict[str, str] = {}

    with PageSequenceServer([Page(PAGE)]) as server:
        import http.server

        orig = http.server.BaseHTTPRequestHandler.parse_request

        def spy(self):
            ok = orig(self)
            seen.update({k.lower(): v for k, v in self.headers.items()})
            return ok

        http.server.BaseHTTPRequestHandler.parse_request = spy
        try:
            poller = Poller([PollTarget("t", server.url, headers={"X-Org": "a"},
                                        basic_auth=("u", "p"))], 1.0, lambda r: None)
            assert poller.poll_now("t").error_reason is None
            poller.stop()
        finally:
            http.server.BaseHTTPRequestHandler.parse_request = orig
    assert seen["x-org"] == "a"
    assert seen["authorization"].startswith("Basic ")
    assert seen["accept-encoding"] == "identity"


def test_bad_targets_do_not_affect_good_one_or_the_endpoint():
    """Real scheduler, three targets: a good one, one that stalls, one serving HTML. The good
    target keeps its derived series, the others are down with the right reason, /metrics
    answers fast throughout, and the stalled target never has two polls in flight."""
    html = "<html><body>proxy login</body></html>\n"
    replay = [Page(t) for _, t in fixture_pages(REPLAY)[:40]]
    with PageSequenceServer(replay, advance="per_request") as good, \
            PageSequenceServer([Stall(30.0)]) as slow, \
            PageSequenceServer([Page(html, content_type="text/html")]) as bad:
        cfg = app_settings.build_config(
            None, [f"good={good.url}", f"slow={slow.url}", f"bad={bad.url}"], "127.0.0.1:0",
            0.1)
        cfg = config.ServeConfig(**{**cfg.__dict__, "targets": tuple(
            config.TargetConfig(**{**t.__dict__, "timeout": 0.6}) for t in cfg.targets)})
        app = ServeApp(cfg)
        app.start()
        try:
            host, port = app.web.address
            url = f"http://{host}:{port}/metrics"
            t_end = time.monotonic() + 2.5
            worst = 0.0
            while time.monotonic() < t_end:
                t0 = time.monotonic()
                series = scrape(url)
                worst = max(worst, time.monotonic() - t0)
                time.sleep(0.05)
            up = {dict(k[1])["target"]: v for k, v in
                  select(series, "specwatch_target_up").items()}
            assert up == {"good": 1.0, "slow": 0.0, "bad": 0.0}
            errs = {(dict(k[1])["target"], dict(k[1])["reason"]): v for k, v in
                    select(series, "specwatch_target_poll_errors_total").items()}
            assert errs[("slow", "timeout")] >= 2
            assert errs[("bad", "parse")] >= 5
            assert errs[("good", "timeout")] == 0 and errs[("good", "parse")] == 0
            assert select(series, "sd_acceptance_rate", target="good")
            assert not [k for k in series if k[0].startswith("sd_")
                        and dict(k[1])["target"] != "good"]
            assert worst < 1.0, f"/metrics took {worst:.2f}s while a target stalled"
            # 2.5 s with a 0.6 s deadline: at most one poll at a time means <= 5 requests.
            assert slow.requests <= 5
        finally:
            app.stop()


def test_broken_extension_never_breaks_metrics():
    """A hook and a family builder that raise: /metrics still answers 200 with health and
    derived series (client_python would otherwise turn the page into a 500)."""
    with PageSequenceServer([Page(PAGE)]) as server:
        cfg = app_settings.build_config(None, [f"t={server.url}"], "127.0.0.1:0", 1.0)
        app = ServeApp(cfg)

        def bad_hook(target):
            raise RuntimeError("hook bug")

        def bad_builder(snapshot):
            raise RuntimeError("builder bug")
            yield  # pragma: no cover

        app.pipeline.add_target_hook(bad_hook)
        app.collector.add_family_builder(bad_builder)
        app.start(poll=False)
        try:
            app.poller.poll_now("t")
            app.poller.poll_now("t")
            host, port = app.web.address
            series = scrape(f"http://{host}:{port}/metrics")
            assert select(series, "specwatch_target_up", target="t")
            assert select(series, "sd_arrival_rate", target="t")
            req = urllib.request.Request(f"http://{host}:{port}/metrics",
                                         headers={"Accept": "application/openmetrics-text"})
            with urllib.request.urlopen(req, timeout=5) as resp:
                assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
                assert resp.read().decode().endswith("# EOF\n")
            with pytest.raises(urllib.error.HTTPError) as exc:
                urllib.request.urlopen(f"http://{host}:{port}/nope", timeout=5)
            assert exc.value.code == 404
        finally:
            app.stop()


def test_hook_can_attach_model_data():
    """The extension point plug-ins use: a hook fills a typed slot of a model's snapshot."""
    seen: Slot[float] = Slot("test.seen", float)
    with PageSequenceServer([Page(PAGE)]) as server:
        cfg = app_settings.build_config(None, [f"t={server.url}"], "127.0.0.1:0", 1.0)
        app = ServeApp(cfg)

        def attach(target):
            for name, model in target.models.items():
                w = model.window("5m")
                if w is not None:
                    target = target.with_model_slot(name, seen, w.span_seconds)
            return target

        app.pipeline.add_target_hook(attach)
        app.poller.poll_now("t")
        app.poller.poll_now("t")
        app.poller.stop()
        snap = app.pipeline.snapshot.targets["t"]
        (model,) = snap.models.values()
        value = model.slot(seen)
        assert value is not None and value > 0
