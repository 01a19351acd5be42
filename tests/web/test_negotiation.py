"""Content negotiation by RFC 9110 quality values: ``Accept-Encoding: gzip;q=0`` gets no gzip
(on the exporter's /metrics, which gzips itself, and on any route of the web server), and
``Accept`` ranges are taken in the client's order of preference, q=0 refused."""

from __future__ import annotations

import gzip
import http.client

import pytest

from specwatch.app import settings as app_settings
from specwatch.app.serve import ServeApp
from specwatch.sim.scenario import load_scenario
from specwatch.sim.server import render_page
from specwatch.sim.simulation import Simulation
from specwatch.web.negotiate import accepts_gzip, by_preference
from specwatch.web.routing import Response
from specwatch.web.server import WebServer

# (Accept-Encoding, gzip expected)
ENCODINGS = [
    ("gzip", True),
    ("GZIP", True),
    ("x-gzip", True),
    ("gzip, deflate, br", True),
    ("gzip;q=0", False),
    ("gzip; q=0.000", False),
    ("gzip;q=0, *", False),
    ("*", True),
    ("*;q=0", False),
    ("identity;q=1, gzip;q=0.5", False),
    ("gzip;q=0.5, identity;q=0.5", True),
    ("gzip;q=1.0, identity;q=0", True),
    ("deflate, br", False),
    ("gzip;q=2", False),  # not a qvalue: the element is left out
    ("gzip;q=x", False),
    ("", False),
    (None, False),
]


@pytest.mark.parametrize(("header", "want"), ENCODINGS)
def test_accepts_gzip(header, want):
    assert accepts_gzip(header) is want


def test_by_preference():
    assert by_preference("text/plain;q=0.3, application/openmetrics-text;version=1.0.0;q=0.5"
                         ) == "application/openmetrics-text;version=1.0.0,text/plain"
    assert by_preference("application/openmetrics-text;q=0, text/plain") == "text/plain"
    assert by_preference(None) == ""
    assert by_preference("application/json, text/plain;version=0.0.4;q=0.9, "
                         "application/openmetrics-text;q=0.5") == "text/plain;version=0.0.4"


def _get(port: int, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@pytest.fixture
def exporter_port():
    cfg = app_settings.build_config(None, ["http://127.0.0.1:9/metrics"], "127.0.0.1:0", 60)
    app = ServeApp(cfg)
    app.start(poll=False)
    try:
        yield app.web.address[1]
    finally:
        app.stop()


@pytest.mark.parametrize(("header", "want"), [e for e in ENCODINGS if e[0] is not None])
def test_exporter_metrics_gzip_follows_qvalues(exporter_port, header, want):
    status, headers, body = _get(exporter_port, "/metrics", {"Accept-Encoding": header})
    assert status == 200
    assert (headers.get("content-encoding") == "gzip") is want, headers
    text = gzip.decompress(body) if want else body
    assert b"specwatch_target_up" in text


@pytest.mark.parametrize(("accept", "openmetrics"), [
    ("application/openmetrics-text;q=0, text/plain", False),
    ("application/openmetrics-text;version=1.0.0;q=0.1, text/plain;version=0.0.4;q=0.9", False),
    # Prometheus' own scrape Accept header: OpenMetrics is its first choice.
    ("application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;"
     "version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2", True),
    ("text/plain;q=0.2, application/openmetrics-text;version=1.0.0;q=0.8", True),
    ("application/json, application/openmetrics-text;version=1.0.0;q=0.5", True),
])
def test_exporter_accept_follows_qvalues(exporter_port, accept, openmetrics):
    status, headers, body = _get(exporter_port, "/metrics", {"Accept": accept})
    assert status == 200
    assert headers["content-type"].startswith("application/openmetrics-text") is openmetrics
    assert body.rstrip().endswith(b"# EOF") is openmetrics


def test_simulator_accept_follows_qvalues():
    sim = Simulation(load_scenario("demo"))
    _, ctype = render_page(sim, "application/openmetrics-text;q=0, text/plain",
                           process_collectors=False)
    assert ctype.startswith("text/plain")


@pytest.mark.parametrize(("header", "want"), [
    ("gzip", True), ("gzip;q=0", False), ("identity, gzip;q=0.1", False), ("*", True)])
def test_web_server_gzip_follows_qvalues(header, want):
    """Any route's answer over 1 KiB is gzipped by the server only when the client takes it."""
    srv = WebServer("127.0.0.1:0", {"/big": lambda r: Response(200, b"x" * 4096)})
    srv.start()
    try:
        status, headers, body = _get(srv.address[1], "/big", {"Accept-Encoding": header})
    finally:
        srv.stop()
    assert status == 200
    assert (headers.get("content-encoding") == "gzip") is want, headers
    assert (gzip.decompress(body) if want else body) == b"x" * 4096
