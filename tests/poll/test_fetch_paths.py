"""The poller's direct transport (http.client) against the requests transport.

A target reached directly is fetched on one ``http.client`` connection (a third of the CPU of
``requests``); a target behind a proxy from the environment keeps ``requests``. The fast
path is tested against the library: for a matrix of server behaviours (framing, encodings,
redirects, statuses, short and oversize bodies, stalls, TLS) both transports must return the
same page or fail with the same reason (and the same message where it is specwatch's own),
and send the same request. Then what only the direct transport does: one connection reused
poll after poll, reconnecting when the server closed it, and the choice of transport from
the proxy environment. Real sockets on 127.0.0.1 (helpers.scriptserver, helpers.faultserver)
and a real TLS PKI (helpers.certs).
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from helpers import testsecrets
from helpers.certs import PKI, make_pki
from helpers.faultserver import Blackhole, FaultServer, Refuse, Trickle, TrickleHeaders
from helpers.scriptserver import Reply, ScriptServer, chunked, response

from specwatch.poll.fetch import client as fetchmod
from specwatch.poll.fetch.client import PollError, PollTarget, fetch, new_session
from specwatch.poll.poller import Poller

PAGE = (Path(__file__).resolve().parents[1] / "fixtures/vllm-0.32-cpu-ngram/snap_1795971826019.prom"
        ).read_bytes()
CAP = 2 * len(PAGE)
TRANSPORTS = ("direct", "requests")
#: Reasons whose message is specwatch's own text on both transports (compared whole).
SAME_MESSAGE = ("too_large", "http_status", "parse")


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki-fetch"))


@dataclass(frozen=True)
class Case:
    """``serve(pki)`` yields the URL to poll; ``target`` holds extra PollTarget fields
    (``PKI`` in a value is replaced by the fixture's CA file); ``expect``: "ok" (the page)
    or the poll error reason."""

    name: str
    serve: Callable[[PKI], contextlib.AbstractContextManager[str]]
    expect: str
    target: dict[str, Any] = field(default_factory=dict)


def scripted(routes: dict[str, Reply], tls: bool = False, client_cert: bool = False,
             host: str = "127.0.0.1") -> Callable[[PKI], contextlib.AbstractContextManager[str]]:
    @contextlib.contextmanager
    def serve(pki: PKI) -> Iterator[str]:
        ctx = pki.server_context(client_cert) if tls else None
        with ScriptServer(routes, host=host, ssl_context=ctx) as srv:
            yield srv.url()
    return serve


def faulty(behaviour: object) -> Callable[[PKI], contextlib.AbstractContextManager[str]]:
    @contextlib.contextmanager
    def serve(pki: PKI) -> Iterator[str]:
        with FaultServer(behaviour) as srv:  # type: ignore[arg-type]
            yield srv.url
    return serve


def redirect_away(status: int = 302) -> Callable[[PKI], contextlib.AbstractContextManager[str]]:
    """/metrics redirects to /page on another server (another port)."""
    @contextlib.contextmanager
    def serve(pki: PKI) -> Iterator[str]:
        with ScriptServer({"/page": response(PAGE)}) as other, ScriptServer(
                {"/metrics": response(b"", status, {"Location": other.url("/page")})}) as srv:
            yield srv.url()
    return serve


def _corrupt_gzip() -> bytes:
    data = bytearray(gzip.compress(PAGE))
    data[len(data) // 2] ^= 0xFF
    return bytes(data)


GZ = gzip.compress(PAGE)
HTTP10_UNFRAMED = Reply(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + PAGE,
                        close=True)
TE = {"Transfer-Encoding": "chunked"}

CASES = [
    Case("plain", scripted({"/metrics": response(PAGE)}), "ok"),
    Case("connection_close", scripted({"/metrics": response(PAGE, close=True)}), "ok"),
    Case("http10_content_length",
         scripted({"/metrics": response(PAGE, version="HTTP/1.0", close=True)}), "ok"),
    Case("http10_until_close", scripted({"/metrics": HTTP10_UNFRAMED}), "ok"),
    Case("chunked", scripted({"/metrics": response(chunked(PAGE), headers=TE)}), "ok"),
    Case("gzip_anyway", scripted({"/metrics": response(GZ, headers={
        "Content-Encoding": "gzip"})}), "ok"),
    Case("x_gzip", scripted({"/metrics": response(GZ, headers={
        "Content-Encoding": "x-gzip"})}), "ok"),
    Case("deflate", scripted({"/metrics": response(zlib.compress(PAGE), headers={
        "Content-Encoding": "deflate"})}), "ok"),
    Case("chunked_gzip", scripted({"/metrics": response(chunked(GZ, 1000), headers={
        **TE, "Content-Encoding": "gzip"})}), "ok"),
    Case("redirect_same_origin_relative", scripted({
        "/metrics": response(b"moved\n", 302, {"Location": "/real"}),
        "/real": response(PAGE)}), "ok"),
    Case("redirect_same_origin_308_query", scripted({
        "/metrics": response(b"", 308, {"Location": "/real?x=1"}),
        "/real?x=1": response(PAGE)}), "ok"),
    Case("redirect_elsewhere_refused", redirect_away(), "http_status"),
    Case("redirect_elsewhere_followed_with_any", redirect_away(301), "ok",
         {"follow_redirects": "any"}),
    Case("redirect_refused_with_none", scripted({
        "/metrics": response(b"", 302, {"Location": "/real"}), "/real": response(PAGE)}),
         "http_status", {"follow_redirects": "none"}),
    Case("redirect_loop", scripted({"/metrics": response(b"", 302, {"Location": "/metrics"})}),
         "connection"),
    Case("not_found", scripted({"/other": response(PAGE)}), "http_status"),
    Case("server_error", scripted({"/metrics": response(b"boom\n", 500)}), "http_status"),
    Case("short_body", scripted({"/metrics": Reply(response(
        PAGE[:5000], content_length=len(PAGE)).data, close=True)}), "connection"),
    Case("chunked_cut_short", scripted({"/metrics": Reply(response(
        chunked(PAGE, complete=False)[:30000], headers=TE).data, close=True)}), "connection"),
    Case("oversize_announced", scripted({"/metrics": response(PAGE)}), "too_large",
         {"max_body_bytes": len(PAGE) // 2}),
    Case("oversize_until_close", scripted({"/metrics": HTTP10_UNFRAMED}), "too_large",
         {"max_body_bytes": len(PAGE) // 2}),
    Case("oversize_chunked", scripted({"/metrics": response(chunked(PAGE), headers=TE)}),
         "too_large", {"max_body_bytes": len(PAGE) // 2}),
    Case("oversize_decompressed", scripted({"/metrics": response(GZ, headers={
        "Content-Encoding": "gzip"})}), "too_large", {"max_body_bytes": len(PAGE) // 2}),
    Case("gzip_bomb", scripted({"/metrics": response(
        gzip.compress(b"\n" * (8 << 20), 9), headers={"Content-Encoding": "gzip"})}),
         "too_large"),
    Case("gzip_corrupt", scripted({"/metrics": response(_corrupt_gzip(), headers={
        "Content-Encoding": "gzip"})}), "parse"),
    Case("gzip_without_end", scripted({"/metrics": response(GZ[:-20], headers={
        "Content-Encoding": "gzip"})}), "parse"),
    Case("unsupported_encoding", scripted({"/metrics": response(PAGE, headers={
        "Content-Encoding": "br"})}), "parse"),
    Case("not_utf8", scripted({"/metrics": response(b"vllm:x 1\n\xff\xfe\n")}), "parse"),
    Case("closed_without_answer", scripted({"/metrics": Reply(b"", close=True)}),
         "connection"),
    Case("garbage_status_line", scripted({"/metrics": Reply(b"HELLO THERE\r\n\r\n",
                                                            close=True)}), "connection"),
    Case("refused", faulty(Refuse()), "connection"),
    Case("never_answers", faulty(Blackhole()), "timeout", {"timeout_seconds": 0.5}),
    Case("trickled_body", faulty(Trickle(PAGE[:200], interval=0.05)), "timeout",
         {"timeout_seconds": 0.5}),
    Case("trickled_headers", faulty(TrickleHeaders(0.05)), "timeout",
         {"timeout_seconds": 0.5}),
    Case("tls_with_ca_file", scripted({"/metrics": response(PAGE)}, tls=True), "ok",
         {"verify": "PKI"}),
    Case("tls_unknown_ca", scripted({"/metrics": response(PAGE)}, tls=True), "tls"),
    Case("tls_wrong_host", scripted({"/metrics": response(PAGE)}, tls=True, host="127.0.0.2"),
         "tls", {"verify": "PKI"}),
    Case("tls_insecure_wrong_host", scripted({"/metrics": response(PAGE)}, tls=True,
                                             host="127.0.0.2"), "ok", {"verify": False}),
    Case("tls_client_cert", scripted({"/metrics": response(PAGE)}, tls=True, client_cert=True),
         "ok", {"verify": "PKI", "cert": "CLIENT"}),
    Case("tls_client_cert_missing", scripted({"/metrics": response(PAGE)}, tls=True,
                                             client_cert=True), "tls", {"verify": "PKI"}),
    Case("plain_http_to_tls_port", scripted({"/metrics": response(PAGE)}, tls=True),
         "connection", {"scheme": "http"}),
]


def outcome(url: str, transport: str, **kw: Any) -> tuple[str, str]:
    """("ok", body) or (reason, message) of one fetch on a fresh session."""
    session = new_session(url, transport)
    try:
        return "ok", fetch(session, PollTarget("t", url, **kw))
    except PollError as exc:
        return exc.reason, str(exc)
    finally:
        session.close()


# insecure_skip_verify on the requests transport: the poller silences this warning itself.
@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_both_transports_return_the_same_page_or_error(case: Case, pki: PKI,
                                                       monkeypatch) -> None:
    """The direct transport gives what the requests transport gives: the same page, or the
    same reason (the same message where the message is specwatch's own; the OpenSSL reason
    for TLS), and that is the expected outcome of the case."""
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    kw = {"timeout_seconds": 5.0, "max_body_bytes": CAP, **case.target}
    scheme = kw.pop("scheme", None)
    if kw.get("verify") == "PKI":
        kw["verify"] = str(pki.ca)
    if kw.get("cert") == "CLIENT":
        kw["cert"] = (str(pki.client.cert), str(pki.client.key))
    got = {}
    for transport in TRANSPORTS:
        with case.serve(pki) as url:
            if scheme:
                url = url.replace("https:", f"{scheme}:")
            got[transport] = outcome(url, transport, **kw)
    (reason, text), (other_reason, other_text) = got["direct"], got["requests"]
    assert reason == other_reason, got
    assert reason == case.expect, got
    if reason == "ok":
        assert text == other_text == PAGE.decode()
    elif reason in SAME_MESSAGE:
        assert text == other_text
    elif reason == "tls":
        assert text.startswith("TLS: ") and other_text.startswith("TLS: ")
    print(f"\n{case.name}: {reason}: direct {text[:100]!r} | requests {other_text[:100]!r}")


def _header_lines(head: bytes) -> tuple[bytes, set[tuple[bytes, bytes]]]:
    line, *rest = head.split(b"\r\n")
    return line, {(k.strip().lower(), v.strip()) for k, _, v in
                  (h.partition(b":") for h in rest)}


def test_both_transports_send_the_same_request() -> None:
    """The same request line and headers (Accept, Accept-Encoding: identity, User-Agent,
    Connection, Host, the configured headers, basic auth) on both transports, names
    compared case-blind, order aside."""
    heads = {}
    target = {"headers": {"X-Api-Key": testsecrets.TARGET_API_KEY, "accept": "text/plain"},
              "basic_auth": ("scraper", testsecrets.TARGET_BASIC_PASSWORD)}
    with ScriptServer({"/metrics?x=a%20b": response(PAGE)}) as srv:
        for i, transport in enumerate(TRANSPORTS):
            assert outcome(srv.url("/metrics?x=a%20b"), transport, **target)[0] == "ok"
            heads[transport] = _header_lines(srv.heads[i])
    assert heads["direct"] == heads["requests"]
    line, headers = heads["direct"]
    assert line == b"GET /metrics?x=a%20b HTTP/1.1"
    names = {k for k, _ in headers}
    assert {b"accept-encoding", b"user-agent", b"host", b"x-api-key",
            b"authorization"} <= names
    assert (b"accept", b"text/plain") in headers  # the configured header wins, once
    assert (b"accept-encoding", b"identity") in headers


@pytest.mark.usefixtures("fetch_path")
@pytest.mark.parametrize("announced", [True, False], ids=["connection_close", "silent_close"])
def test_a_connection_the_server_closed_is_replaced(announced: bool) -> None:
    """A server that closes the connection after every answer (saying so or not): every
    poll succeeds on a new connection, on both transports."""
    reply = response(PAGE, close=True) if announced else Reply(response(PAGE).data,
                                                                close=True)
    with ScriptServer({"/metrics": reply}) as srv:
        poller = Poller([PollTarget("t", srv.url())], 60, lambda r: None)
        try:
            results = []
            for _ in range(4):
                results.append(poller.poll_now("t"))
                # The server's close has arrived before the next poll: a poll sent before
                # it arrives is the race of test_a_reused_connection_closed_before_the_
                # answer_is_retried_once (retried on the direct transport only).
                time.sleep(0.1)
        finally:
            poller.stop(timeout=5)
    assert [r.error_reason for r in results] == [None] * 4, results
    assert srv.connections == 4


def test_a_reused_connection_closed_before_the_answer_is_retried_once() -> None:
    """The race a 5 s poll interval meets with uvicorn's 5 s keep-alive timeout: the server
    closes the idle connection just as the next request goes out. The direct transport
    sends the GET once more on a new connection (requests, with urllib3's retries off,
    would fail that poll); a second failure on the fresh connection is not retried."""
    with ScriptServer({"/metrics": lambda n: response(PAGE) if n == 0 else
                       Reply(b"", close=True)}) as srv:
        url = srv.url()
        session = new_session(url, "direct")
        try:
            assert fetch(session, PollTarget("t", url)) == PAGE.decode()
            assert fetch(session, PollTarget("t", url)) == PAGE.decode()
        finally:
            session.close()
    assert srv.connections == 2
    assert len(srv.heads) == 3  # the first poll, the lost request, the retry
    with ScriptServer({"/metrics": Reply(b"", close=True)}) as srv:
        assert outcome(srv.url(), "direct")[0] == "connection"
    assert srv.connections == 1


@pytest.mark.usefixtures("fetch_path")
def test_a_reused_connection_is_under_the_deadline_guard() -> None:
    """The second poll goes out on the first poll's keep-alive connection, and the server
    then trickles header lines on it (each read gets data, so no socket timeout fires):
    the poll still ends at its 1 s total deadline, on both transports."""
    trickle = Reply(b"HTTP/1.1 200 OK\r\n" + b"X-Trickle: x\r\n" * 2000, interval=0.05,
                    piece=16)
    with ScriptServer({"/metrics": lambda n: response(PAGE) if n == 0 else trickle}) as srv:
        poller = Poller([PollTarget("t", srv.url(), timeout_seconds=1.0)], 60, lambda r: None)
        try:
            first = poller.poll_now("t")
            t0 = time.monotonic()
            second = poller.poll_now("t")
            took = time.monotonic() - t0
        finally:
            poller.stop(timeout=5)
    assert first.error_reason is None
    assert second.error_reason == "timeout", second
    assert srv.connections == 1
    assert took < 1.0 + 1.5, took


@pytest.mark.usefixtures("fetch_path")
def test_polls_on_new_connections_leave_no_descriptor_behind() -> None:
    """Thirty polls of a server that closes every connection (plain and TLS handshakes
    alike open a new socket, and the guard may hold a duplicate of it): the process holds
    no more open descriptors afterwards than after the first poll."""
    import os

    with ScriptServer({"/metrics": response(PAGE, close=True)}) as srv:
        poller = Poller([PollTarget("t", srv.url())], 60, lambda r: None)
        try:
            assert poller.poll_now("t").error_reason is None
            before = len(os.listdir("/proc/self/fd"))
            errors = [poller.poll_now("t").error_reason for _ in range(30)]
            time.sleep(0.2)  # the server's threads close their ends
            after = len(os.listdir("/proc/self/fd"))
        finally:
            poller.stop(timeout=5)
    assert errors == [None] * 30
    assert after <= before + 2, (before, after)


@pytest.mark.usefixtures("fetch_path")
def test_stop_cuts_a_tls_handshake_short() -> None:
    """A TLS target that accepts the connection and never answers the handshake, with a
    30 s deadline: stop() ends the poll at once (the socket is under the guard before the
    handshake starts)."""
    with FaultServer(Blackhole()) as srv:
        url = srv.url.replace("http:", "https:")
        poller = Poller([PollTarget("t", url, timeout_seconds=30.0)], 60, lambda r: None)
        poller.start()
        deadline = time.monotonic() + 10
        while srv.requests < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # the poll waits for the server's TLS hello now
        t0 = time.monotonic()
        poller.stop(timeout=10)
        took = time.monotonic() - t0
    assert srv.requests >= 1
    assert took < 2.0, took


@pytest.mark.usefixtures("fetch_path")
def test_the_environment_ca_bundle_serves_verify_true(pki: PKI, monkeypatch) -> None:
    """verify True means REQUESTS_CA_BUNDLE (then CURL_CA_BUNDLE) when set, as requests
    does, on both transports."""
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    with ScriptServer({"/metrics": response(PAGE)}, ssl_context=pki.server_context()) as srv:
        monkeypatch.setenv("CURL_CA_BUNDLE", str(pki.ca))
        poller = Poller([PollTarget("t", srv.url())], 60, lambda r: None)
        try:
            assert poller.poll_now("t").error_reason is None
        finally:
            poller.stop(timeout=5)
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(pki.other_ca))
        poller = Poller([PollTarget("t", srv.url())], 60, lambda r: None)
        try:
            assert poller.poll_now("t").error_reason == "tls"
        finally:
            poller.stop(timeout=5)


class _Proxy:
    """A forward proxy stand-in: answers every absolute-form GET with the page itself and
    records the request lines (the real target behind it is never contacted)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                owner.lines.append(self.requestline)
                self.send_response(200)
                self.send_header("Content-Length", str(len(PAGE)))
                self.end_headers()
                self.wfile.write(PAGE)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY",
              "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


def test_the_transport_follows_the_proxy_environment(monkeypatch) -> None:
    """No proxy: direct. HTTP_PROXY set: requests, and the poll really goes through the
    proxy. NO_PROXY naming the target's host: direct again, to the target itself."""
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    proxy = _Proxy()
    try:
        with ScriptServer({"/metrics": response(PAGE)}) as srv:
            url = srv.url()
            assert isinstance(new_session(url), fetchmod.DirectSession)
            monkeypatch.setenv("HTTP_PROXY", proxy.url)
            session = new_session(url)
            assert isinstance(session, fetchmod.RequestsSession)
            poller = Poller([PollTarget("t", url)], 60, lambda r: None)
            try:
                assert poller.poll_now("t").error_reason is None
            finally:
                poller.stop(timeout=5)
            assert proxy.lines == [f"GET {url} HTTP/1.1"]
            assert srv.connections == 0
            monkeypatch.setenv("NO_PROXY", "127.0.0.1")
            assert isinstance(new_session(url), fetchmod.DirectSession)
            assert outcome(url, "auto")[0] == "ok"
            assert srv.connections == 1 and len(proxy.lines) == 1
    finally:
        proxy.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_client_certificate_is_never_presented_to_another_origin(transport: str,
                                                                    pki: PKI) -> None:
    """A client certificate is a credential like a header or a password: with
    ``follow_redirects: any`` a redirect to another scheme, host or port goes without it
    (that origin, which asks for one, refuses the handshake), while a redirect to the
    target's own origin keeps it."""
    cert = (str(pki.client.cert), str(pki.client.key))
    tls = pki.server_context(client_cert=True)
    with ScriptServer({"/page": response(PAGE)}, ssl_context=tls) as other, ScriptServer(
            {"/metrics": response(b"", 302, {"Location": other.url("/page")})},
            ssl_context=pki.server_context()) as srv:
        away = outcome(srv.url(), transport, verify=str(pki.ca), cert=cert,
                       follow_redirects="any", timeout_seconds=5.0)
    assert away[0] == "tls", away
    with ScriptServer({"/metrics": response(b"", 302, {"Location": "/page"}),
                       "/page": response(PAGE)}, ssl_context=tls) as srv:
        home = outcome(srv.url(), transport, verify=str(pki.ca), cert=cert,
                       follow_redirects="any", timeout_seconds=5.0)
    assert home == ("ok", PAGE.decode()), home


def test_finished_polls_leave_no_guard_waiting_for_its_deadline() -> None:
    """A target that fails at once (connection refused), polled far more often than its
    timeout, must not pile up one deadline guard per poll until each deadline passes: the
    watchdog holds at most twice the polls in flight plus a small constant (bounded
    state; tests/test_resources.py saw +467 kB over 1,000 such polls)."""
    from specwatch.poll.fetch.guard import _WATCHDOG

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/metrics"
    session = new_session(url, "direct")
    target = PollTarget("dead", url, timeout_seconds=30.0)
    try:
        for _ in range(1000):
            with pytest.raises(PollError):
                fetch(session, target)
    finally:
        session.close()
    assert len(_WATCHDOG._heap) <= 2 * _WATCHDOG.COMPACT_FROM
