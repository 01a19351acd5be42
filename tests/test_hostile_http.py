"""Issue 17, items 5, 6 and 9: the HTTP server against hostile clients.

Strict framing (no request smuggling, no HTTP/0.9), log lines that a value from outside cannot
forge, authentication before any shared resource is taken (a wrong-password flood and
half-open sockets from one address leave the real scraper served), and a reload that cannot
silently turn TLS or auth off.

Every test talks to a real server on 127.0.0.1 through raw sockets (to send exactly the bytes
a hostile client would) or http.client. A second loopback address (127.0.0.2, routed to
``lo`` on Linux) stands for "another client".
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import io
import logging
import re
import socket
import time

import bcrypt
import pytest
from helpers import testsecrets
from specwatch.common import redact
from specwatch.web.server import Response, ServerLimits, WebServer

OTHER_CLIENT = "127.0.0.2"


@pytest.fixture(scope="module")
def web_hash() -> str:
    return bcrypt.hashpw(testsecrets.WEB_PASSWORD.encode(), bcrypt.gensalt(10)).decode()


@contextlib.contextmanager
def server(routes: dict | None = None, web_config: str | None = None,
           limits: ServerLimits | None = None):
    got: list[bytes] = []

    def echo(req):
        got.append(req.body)
        return Response(200, b"ok " + req.method.encode() + b" " + req.body + b"\n")

    srv = WebServer("127.0.0.1:0", routes or {"/metrics": lambda r: Response(200, b"up 1\n"),
                                              "/echo": echo},
                    web_config_file=web_config, limits=limits)
    srv.got = got  # type: ignore[attr-defined]
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def raw_exchange(srv: WebServer, data: bytes, wait: float = 2.0) -> bytes:
    """Send ``data`` on one connection, read until the server closes it (or ``wait``)."""
    with socket.create_connection(srv.address, timeout=wait) as s:
        s.sendall(data)
        out = b""
        deadline = time.monotonic() + wait
        with contextlib.suppress(OSError):
            while time.monotonic() < deadline:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
    return out


def statuses(reply: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"HTTP/1\.[01] (\d{3}) ", reply)]


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


# -- item 9: strict HTTP ----------------------------------------------------------------------

SMUGGLED = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("framing", [
    b"Content-Length: 0\r\nContent-Length: %d\r\n" % len(SMUGGLED),
    b"Content-Length: %d\r\nContent-Length: %d\r\n" % (len(SMUGGLED), len(SMUGGLED)),
    b"Content-Length: 0, %d\r\n" % len(SMUGGLED),
    b"Content-Length: +%d\r\n" % len(SMUGGLED),
    b"Transfer-Encoding: chunked\r\n",
    b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n" % len(SMUGGLED),
    b"Transfer-Encoding: identity\r\n",
], ids=["conflicting-cl", "duplicate-cl", "cl-list", "cl-plus", "te-chunked", "te-and-cl",
        "te-identity"])
def test_ambiguous_request_framing_is_refused_and_nothing_is_smuggled(framing):
    """Issue 17 item 9: a request with two Content-Lengths, a non-numeric one or any
    Transfer-Encoding gets one 400 and its connection closed; the bytes after it are never
    read as a second request (old code answered 200 twice: a smuggled request)."""
    with server() as srv:
        req = b"POST /echo HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n" + SMUGGLED
        if b"chunked" in framing:
            req = (b"POST /echo HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n0\r\n\r\n"
                   + SMUGGLED)
        reply = raw_exchange(srv, req)
        assert statuses(reply) == [400], reply[:300]
        assert srv.got == []  # the handler never ran
        assert srv.stats().rejected["bad_request"] == 1


def test_http_0_9_is_refused():
    """Issue 17 item 9: ``GET /metrics`` without a version (HTTP/0.9: no headers, so no
    auth and no framing) is refused with a 400, not answered with the page."""
    with server() as srv:
        reply = raw_exchange(srv, b"GET /metrics\r\n")
    assert statuses(reply) == [400], reply[:200]
    assert b"up 1" not in reply


def test_what_prometheus_and_common_clients_send_still_works():
    """The strict rules refuse nothing a scraper or the Alertmanager webhook sends:
    keep-alive GETs, a POST with one Content-Length, ``Content-Length: 0``, HEAD."""
    with server() as srv:
        reply = raw_exchange(srv, (
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nUser-Agent: Prometheus/2.45.0\r\n"
            b"Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;"
            b"q=0.5,*/*;q=0.1\r\nAccept-Encoding: gzip\r\n"
            b"X-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n"
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
            b"Content-Type: application/json\r\n\r\nhello"
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
            b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), wait=3)
        assert statuses(reply) == [200, 200, 200, 200], reply
        assert srv.got == [b"hello"]
        conn = http.client.HTTPConnection(*srv.address, timeout=5)
        conn.request("POST", "/echo", body=b'{"a": 1}')
        assert conn.getresponse().read() == b'ok POST {"a": 1}\n'
        conn.close()


def test_a_newline_in_a_logged_value_cannot_forge_a_log_line():
    """Issue 17 item 9: control characters in a logged value are escaped by the filter every
    specwatch command installs, so one record is one line whatever the value holds."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.addFilter(redact.RedactingFilter())
    logger = logging.getLogger("specwatch.test.forge")
    logger.addHandler(handler)
    try:
        evil = "llama\nERROR forged: controller disabled speculative decoding\x1b[2J\u2028x"
        logger.warning("model %s: %d polls", evil, 3)
        logger.warning("models %(m)s", {"m": evil})
        logger.warning("error: %s", ValueError(evil))
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert lines[0] == ("WARNING model llama\\nERROR forged: controller disabled speculative "
                        "decoding\\x1b[2J\\u2028x: 3 polls")
    assert all(line.startswith("WARNING ") for line in lines)
