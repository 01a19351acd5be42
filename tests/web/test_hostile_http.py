"""The HTTP server against hostile clients.

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
import ssl
import threading
import time
from pathlib import Path

import bcrypt
import pytest
from helpers import testsecrets
from helpers.certs import PKI, make_pki

from specwatch.common import redact
from specwatch.web.limits import ServerLimits
from specwatch.web.routing import Response
from specwatch.web.server import WebServer

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
    """A request with two Content-Lengths, a non-numeric one or any
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
    """``GET /metrics`` without a version (HTTP/0.9: no headers, so no
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
    """Control characters in a logged value are escaped by the filter every
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


# -- item 5: authentication before work -------------------------------------------------------


def write_web_config(tmp_path: Path, text: str, name: str = "web.yml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def scrape_share(srv: WebServer, seconds: float, headers: dict[str, str] | None = None,
                 timeout: float = 5.0) -> tuple[int, int]:
    """(answered with 200, attempted) for one scraper polling ``/metrics`` every 0.1 s
    from 127.0.0.1 for ``seconds`` (a scrape counts when its 200 arrives within
    ``timeout``, Prometheus' scrape_timeout role)."""
    ok = tried = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        tried += 1
        conn = http.client.HTTPConnection(*srv.address, timeout=timeout)
        try:
            conn.request("GET", "/metrics", headers=headers or {})
            resp = conn.getresponse()
            ok += resp.status == 200 and resp.read() == b"up 1\n"
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.1)
    return ok, tried


class Flood:
    """``clients`` threads sending GETs with a fresh wrong password each, from ``source``."""

    def __init__(self, srv: WebServer, clients: int, source: str) -> None:
        self.srv, self.source = srv, source
        self.stop = threading.Event()
        self.sent = 0
        self.statuses: dict[int, int] = {}
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(clients)]

    def _run(self, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            conn = http.client.HTTPConnection(*self.srv.address, timeout=10,
                                              source_address=(self.source, 0))
            try:
                conn.request("GET", "/metrics",
                             headers=basic(testsecrets.WEB_USER, f"wrong-{i}-{n}"))
                status = conn.getresponse().status
                self.statuses[status] = self.statuses.get(status, 0) + 1
            except OSError:
                pass
            finally:
                conn.close()
            self.sent += 1

    def __enter__(self) -> Flood:
        for t in self.threads:
            t.start()
        time.sleep(0.5)  # the flood is under way before the first measured scrape
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(15)


def _flood_run(tmp_path: Path, web_hash: str, source: str, seconds: float
               ) -> tuple[int, int, Flood, int]:
    wc = write_web_config(tmp_path, f"basic_auth_users:\n  {testsecrets.WEB_USER}: "
                                    f"'{web_hash}'\n")
    good = basic(testsecrets.WEB_USER, testsecrets.WEB_PASSWORD)
    with server(web_config=wc) as srv:
        # Prometheus scrapes all the time: its credential was verified before the attack.
        assert scrape_share(srv, 0.01, good) == (1, 1)
        with Flood(srv, 40, source) as flood:
            ok, tried = scrape_share(srv, seconds, good)
        auth = srv.web_config.auth
        assert auth is not None
        return ok, tried, flood, auth.bcrypt_calls


@pytest.mark.parametrize("source", [OTHER_CLIENT, "127.0.0.1"], ids=["other", "same"])
def test_wrong_password_flood_leaves_the_real_scraper_served(tmp_path, web_hash, source):
    """40 clients sending wrong passwords (a new one each time) while the
    real scraper polls: at least 95% of its scrapes are answered, from another address or
    from the scraper's own (old code: 51 × 503, 1 × 200: the flood took every in-flight
    slot and queued on one bcrypt lock). bcrypt runs at most burst + one per second for the
    flooding address, and once for the scraper's credential."""
    seconds = 6.0
    ok, tried, flood, bcrypt_calls = _flood_run(tmp_path, web_hash, source, seconds)
    print(f"\nflood from {source}: scraper {ok}/{tried} answered ({ok / tried:.1%}); "
          f"flood sent {flood.sent}: {flood.statuses}; bcrypt ran {bcrypt_calls} times")
    assert ok / tried >= 0.95, (ok, tried, flood.statuses)
    assert flood.statuses.get(429, 0) > flood.statuses.get(401, 0)
    # burst (10) + refill (1/s over the run and the flood's warm-up) + the scraper's one
    assert bcrypt_calls <= 10 + seconds + 3 + 1


@pytest.mark.slow
def test_wrong_password_flood_for_a_minute(tmp_path, web_hash):
    """The same flood held for 60 s (make test-all)."""
    ok, tried, flood, _ = _flood_run(tmp_path, web_hash, OTHER_CLIENT, 60.0)
    print(f"\n60 s flood: scraper {ok}/{tried} answered ({ok / tried:.1%}); {flood.statuses}")
    assert ok / tried >= 0.95


def test_a_verified_credential_runs_bcrypt_once(tmp_path, web_hash):
    """30 scrapes with the right password cost one bcrypt, not 30."""
    wc = write_web_config(tmp_path, f"basic_auth_users:\n  {testsecrets.WEB_USER}: "
                                    f"'{web_hash}'\n")
    good = basic(testsecrets.WEB_USER, testsecrets.WEB_PASSWORD)
    with server(web_config=wc) as srv:
        ok, tried = 0, 30
        for _ in range(tried):
            conn = http.client.HTTPConnection(*srv.address, timeout=5)
            conn.request("GET", "/metrics", headers=good)
            ok += conn.getresponse().status == 200
            conn.close()
        assert ok == tried
        assert srv.web_config.auth is not None and srv.web_config.auth.bcrypt_calls == 1


def test_failed_logins_are_limited_per_client_address(tmp_path, web_hash):
    """After ``failed_logins_per_client`` wrong passwords an address gets
    429 without bcrypt running; another address still gets its own attempts, and the right
    password (verified once before) still passes from the blocked address."""
    wc = write_web_config(tmp_path, f"basic_auth_users:\n  {testsecrets.WEB_USER}: "
                                    f"'{web_hash}'\n")
    good = basic(testsecrets.WEB_USER, testsecrets.WEB_PASSWORD)

    def status(srv: WebServer, headers: dict[str, str], source: str = "127.0.0.1") -> int:
        conn = http.client.HTTPConnection(*srv.address, timeout=10,
                                          source_address=(source, 0))
        try:
            conn.request("GET", "/metrics", headers=headers)
            return conn.getresponse().status
        finally:
            conn.close()

    limits = ServerLimits(failed_logins_per_client=3, failed_login_interval=3600)
    with server(web_config=wc, limits=limits) as srv:
        assert status(srv, good) == 200
        got = [status(srv, basic(testsecrets.WEB_USER, f"wrong-{i}")) for i in range(6)]
        assert got == [401, 401, 401, 429, 429, 429]
        auth = srv.web_config.auth
        assert auth is not None and auth.bcrypt_calls == 1 + 3
        assert status(srv, good) == 200  # cached: not locked out by the attacker
        assert status(srv, basic(testsecrets.WEB_USER, "x1"), OTHER_CLIENT) == 401
        assert srv.stats().rejected["auth_rate_limited"] == 3


def test_half_open_sockets_from_one_address_leave_the_scraper_served():
    """600 connections from one address that never send a byte take at
    most ``max_connections_per_client`` (64) of the 512; the scraper from another address
    gets at least 95% of its scrapes answered (old code: the 600 filled the cap, 25 of 45
    probes reset)."""
    with server() as srv:
        socks = []
        try:
            for _ in range(600):
                s = socket.socket()
                s.bind((OTHER_CLIENT, 0))
                s.settimeout(5)
                with contextlib.suppress(OSError):
                    s.connect(srv.address)
                socks.append(s)
            ok, tried = scrape_share(srv, 4.0)
            held = srv.stats().connections
        finally:
            for s in socks:
                s.close()
        refused = srv.stats().rejected.get("client_connection_limit", 0)
    print(f"\n600 half-open sockets: scraper {ok}/{tried} answered ({ok / tried:.1%}); "
          f"{refused} refused, {held} connections held")
    assert ok / tried >= 0.95, (ok, tried)
    assert refused >= 600 - 64 - 5


# -- item 6: fail closed on reload ------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.mark.parametrize("new_text", ["", "# all keys removed\n", "http_server_config: {}\n",
                                      "tls_server_config:\nbasic_auth_users:\n"],
                         ids=["empty", "comment-only", "other-keys", "empty-sections"])
def test_a_reload_that_would_turn_tls_and_auth_off_is_refused(tmp_path, pki, web_hash,
                                                             new_text, caplog):
    """Started with TLS and basic auth, a reload of a file without them
    is refused with an ERROR log; the server keeps answering over TLS with auth (old code:
    TLS and auth turned off, logged at INFO)."""
    wc = tmp_path / "web.yml"
    wc.write_text(f"tls_server_config:\n  cert_file: {pki.server.cert}\n"
                  f"  key_file: {pki.server.key}\n"
                  f"basic_auth_users:\n  {testsecrets.WEB_USER}: '{web_hash}'\n")
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    good = basic(testsecrets.WEB_USER, testsecrets.WEB_PASSWORD)

    def status(headers: dict[str, str]) -> int:
        conn = http.client.HTTPSConnection(*srv.address, context=ctx, timeout=5)
        try:
            conn.request("GET", "/metrics", headers=headers)
            return conn.getresponse().status
        finally:
            conn.close()

    with server(web_config=str(wc)) as srv:
        assert (status(good), status({})) == (200, 401)
        wc.write_text(new_text)
        caplog.set_level(logging.INFO)
        assert srv.reload_web_config() is False
        assert srv.scheme == "https" and srv.stats().web_config_reload_success is False
        assert (status(good), status({})) == (200, 401)
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert refused and refused[0].levelno == logging.ERROR
    assert "TLS and basic auth" in refused[0].getMessage()


def test_a_server_started_without_auth_may_reload_it_on_and_off(tmp_path, web_hash):
    """Fail closed only protects what the server started with: started open, a reload may
    add basic auth and a later one may remove it again."""
    wc = tmp_path / "web.yml"
    wc.write_text("")
    with server(web_config=str(wc)) as srv:
        wc.write_text(f"basic_auth_users:\n  {testsecrets.WEB_USER}: '{web_hash}'\n")
        assert srv.reload_web_config() and srv.web_config.auth is not None
        wc.write_text("")
        assert srv.reload_web_config() and srv.web_config.auth is None
