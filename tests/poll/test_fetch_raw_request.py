"""The direct transport sends request bytes built once, and reads responses without
``getresponse()``.

``http.client``'s ``request()`` costs about 18 µs of CPU a poll building the same bytes
every time, so :class:`~specwatch.poll.fetch.client.DirectSession` builds them once (by the
library's own ``request()`` against a capturing socket) and sends them as they are. Checked
here: the bytes on the wire are exactly the library's for the same connection, path and
headers (ports, IPv6, queries, percent-encoding, header overrides, basic auth, TLS); a
header the library rejects fails the poll as it did; a changed target gets new bytes; and,
over real sockets, keep-alive reuse, the retry after an idle close, ``Connection: close``
and a same-origin redirect, with ``request()`` and ``getresponse()`` never called on a live
connection.
"""

from __future__ import annotations

import base64
import http.client
import io
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from helpers import testsecrets
from helpers.certs import PKI, make_pki
from helpers.scriptserver import Reply, ScriptServer, response

from specwatch import __version__
from specwatch.poll.fetch import client as fetchmod
from specwatch.poll.fetch import direct as fetchdirect
from specwatch.poll.fetch import rules as fetchrules
from specwatch.poll.fetch.client import PollError, PollTarget, fetch, new_session

PAGE = b"# HELP vllm:num_requests_running x\nvllm:num_requests_running 1\n"
#: The library's own request(), kept before any test replaces it.
LIBRARY_REQUEST = http.client.HTTPConnection.request


class FakeSocket:
    """A connected socket stand-in: records what is sent, answers ``reply``."""

    def __init__(self, reply: bytes = b"") -> None:
        self.sent: list[bytes] = []
        self.reply = io.BytesIO(reply)

    def sendall(self, data: bytes) -> None:
        self.sent.append(bytes(data))

    def recv(self, n: int) -> bytes:
        return self.reply.read(n)

    def makefile(self, mode: str, buffering: int | None = None) -> io.BytesIO:
        return io.BytesIO(self.reply.read())  # what recv has not read yet

    def settimeout(self, seconds: float | None) -> None:
        pass

    def close(self) -> None:
        pass


def library_bytes(url: str, headers: dict[str, str]) -> bytes:
    """What ``http.client`` sends for ``request("GET", path, headers=headers)`` on a
    connection it makes itself from the URL's scheme and netloc (host and port parsed by
    the library, IPv6 brackets included)."""
    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.netloc)
    sock = FakeSocket()
    conn.sock = sock  # type: ignore[assignment]
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    LIBRARY_REQUEST(conn, "GET", path, headers=headers)
    return b"".join(sock.sent)


def _offline(monkeypatch: pytest.MonkeyPatch, reply: bytes) -> list[FakeSocket]:
    """Make the direct transport's connections "connect" to a :class:`FakeSocket`
    answering ``reply`` (no network: any host, IPv6, TLS classes); returns the sockets."""
    socks: list[FakeSocket] = []

    def connect(self: http.client.HTTPConnection) -> None:
        socks.append(FakeSocket(reply))
        self.sock = socks[-1]  # type: ignore[assignment]

    monkeypatch.setattr(fetchdirect._DirectHTTPConnection, "connect", connect)
    monkeypatch.setattr(fetchdirect._DirectHTTPSConnection, "connect", connect)
    return socks


@pytest.fixture
def no_live_request(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``request()`` may run only on the capturing blank connection that builds the bytes,
    ``getresponse()`` never: either on a live connection fails the poll. Returns the path of
    every build, so a test sees when the bytes were built again."""
    built: list[str] = []

    def request(self: http.client.HTTPConnection, method: str, url: str, *args: Any,
                **kwargs: Any) -> None:
        if not isinstance(self.sock, fetchdirect._Capture):
            raise AssertionError("http.client request() on a live connection")
        built.append(url)
        LIBRARY_REQUEST(self, method, url, *args, **kwargs)

    def getresponse(self: http.client.HTTPConnection) -> http.client.HTTPResponse:
        raise AssertionError("http.client getresponse() called")

    monkeypatch.setattr(http.client.HTTPConnection, "request", request)
    monkeypatch.setattr(http.client.HTTPConnection, "getresponse", getresponse)
    return built


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki-raw"))


_BASIC = base64.b64encode(f"scraper:{testsecrets.TARGET_BASIC_PASSWORD}".encode()).decode()

#: (id, URL, extra PollTarget fields, lines the request must hold, lines it must not).
EQUIVALENCE: list[tuple[str, str, dict[str, Any], list[str], list[str]]] = [
    ("default_port", "http://example.com/metrics", {},
     ["GET /metrics HTTP/1.1", "Host: example.com", "Accept-Encoding: identity",
      "Connection: keep-alive"], []),
    ("other_port", "http://example.com:8080/metrics", {}, ["Host: example.com:8080"], []),
    ("explicit_default_port", "http://example.com:80/metrics", {}, ["Host: example.com"],
     []),
    ("empty_path", "http://example.com:8080", {}, ["GET / HTTP/1.1"], []),
    ("ipv6", "http://[::1]:9100/metrics", {}, ["Host: [::1]:9100"], []),
    ("ipv6_default_port", "http://[2001:db8::7]/metrics", {}, ["Host: [2001:db8::7]"], []),
    ("query", "http://example.com:8080/metrics?x=1%202&name=a", {},
     ["GET /metrics?x=1%202&name=a HTTP/1.1"], []),
    ("percent_encoded_path", "http://example.com/a b/m%C3%A9trics/\u00e9", {},
     ["GET /a%20b/m%C3%A9trics/%C3%A9 HTTP/1.1"], []),
    ("headers_override_base_case_blind", "http://example.com/metrics",
     {"headers": {"accept": "text/plain", "USER-AGENT": "probe/1",
                  "X-Api-Key": testsecrets.TARGET_API_KEY}},
     ["accept: text/plain", "USER-AGENT: probe/1", f"X-Api-Key: {testsecrets.TARGET_API_KEY}"],
     ["Accept: text/plain;version=0.0.4;q=1,*/*;q=0.1",
      f"User-Agent: specwatch/{__version__}"]),
    ("host_header_from_target", "http://example.com:8080/metrics",
     {"headers": {"host": "virtual.example"}}, ["host: virtual.example"],
     ["Host: example.com:8080"]),
    ("accept_encoding_from_target", "http://example.com/metrics",
     {"headers": {"accept-encoding": "gzip"}}, ["accept-encoding: gzip"],
     ["Accept-Encoding: identity"]),
    ("basic_auth", "http://example.com/metrics",
     {"basic_auth": ("scraper", testsecrets.TARGET_BASIC_PASSWORD),
      "headers": {"Authorization": "Bearer overridden"}},
     [f"Authorization: Basic {_BASIC}"], ["Authorization: Bearer overridden"]),
    ("https_default_port", "https://example.com/metrics", {}, ["Host: example.com"], []),
    ("https_explicit_443", "https://example.com:443/metrics", {}, ["Host: example.com"], []),
    ("https_8443", "https://example.com:8443/metrics", {}, ["Host: example.com:8443"], []),
    ("https_on_port_80", "https://example.com:80/metrics", {}, ["Host: example.com:80"], []),
    ("http_on_port_443", "http://example.com:443/metrics", {}, ["Host: example.com:443"], []),
]


@pytest.mark.parametrize(("url", "kw", "lines", "absent"), [c[1:] for c in EQUIVALENCE],
                         ids=[c[0] for c in EQUIVALENCE])
def test_the_request_on_the_wire_is_the_library_s(url: str, kw: dict[str, Any],
                                                  lines: list[str], absent: list[str],
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  no_live_request: list[str]) -> None:
    """What a poll sends is byte for byte what ``http.client``'s ``request("GET", path,
    headers=...)`` sends on a connection the library makes from the URL (request line,
    Host with the port rules of the connection's scheme and IPv6 brackets, header order and
    case, Accept-Encoding and Host left to a configured header, CRLFs), with ``request()``
    never run on the live connection."""
    socks = _offline(monkeypatch, response(PAGE).data)
    session = fetchmod.DirectSession(url)
    target = PollTarget("t", url, **kw)
    try:
        assert fetch(session, target) == PAGE.decode()
    finally:
        session.close()
    sent = b"".join(socks[0].sent)
    assert sent == library_bytes(session.url, dict(session._headers(target)))
    assert sent.endswith(b"\r\n\r\n")
    head = sent.decode("latin-1").split("\r\n")
    for line in lines:
        assert line in head, (line, head)
    for line in absent:
        assert line not in head, (line, head)
    assert no_live_request == [head[0].split(" ")[1]]  # built once, for this poll


BAD_HEADERS = [{"X-Bad": "a\r\nInjected: 1"}, {"X-Bad": "a\nb"}, {"X\nBad": "a"},
               {"X-Bad:": "a"}, {" X-Bad": "a"}]


@pytest.mark.parametrize("headers", BAD_HEADERS, ids=["crlf_value", "lf_value",
                                                      "lf_in_name", "colon_in_name",
                                                      "leading_space_in_name"])
def test_a_header_the_library_rejects_fails_the_poll_as_before(
        headers: dict[str, str]) -> None:
    """A header ``http.client`` rejects raises the library's exception while the bytes are
    built, at the point ``request()`` raised it before: the poll fails with reason
    ``connection`` and the message ``<ExceptionType>: <library message>`` (redacted, as
    fetch reports any transport error), every time (a failed build is not cached), nothing
    reaches the server, and the next good poll on the session works."""
    with pytest.raises(Exception) as library:
        library_bytes("http://127.0.0.1/metrics", {**fetchrules.BASE_HEADERS, **headers})
    with ScriptServer({"/metrics": response(PAGE)}) as srv:
        session = new_session(srv.url(), "direct")
        good = PollTarget("t", srv.url())
        bad = PollTarget("t", srv.url(), headers=headers)
        try:
            assert fetch(session, good) == PAGE.decode()
            for _ in range(2):
                with pytest.raises(PollError) as err:
                    fetch(session, bad)
                assert err.value.reason == "connection"
                assert type(err.value.__cause__) is type(library.value)
                assert str(err.value) == (f"{type(library.value).__name__}: "
                                          f"{fetchrules.short_message(library.value)}")
            assert fetch(session, good) == PAGE.decode()
        finally:
            session.close()
    assert len(srv.heads) == 2  # the good polls only


def test_the_request_is_rebuilt_when_the_target_changes(no_live_request: list[str]) -> None:
    """The cached bytes belong to the headers they were built from: a new PollTarget with
    other headers gets its own bytes at its first poll (and keeps them), going back gets
    the first headers again; every request on the wire is the library's for its headers."""
    with ScriptServer({"/metrics": response(PAGE)}) as srv:
        url = srv.url()
        session = new_session(url, "direct")
        assert isinstance(session, fetchmod.DirectSession)
        one = PollTarget("t", url, headers={"X-Token": "one"})
        two = PollTarget("t", url, headers={"X-Token": "two"}, basic_auth=("u", "p"))
        expected = []
        try:
            for target in (one, one, two, two, one):
                assert fetch(session, target) == PAGE.decode()
                expected.append(library_bytes(url, dict(session._headers(target))))
        finally:
            session.close()
    assert [head + b"\r\n\r\n" for head in srv.heads] == expected
    tokens = [line for head in srv.heads for line in head.split(b"\r\n")
              if line.startswith(b"X-Token")]
    assert tokens == [b"X-Token: one"] * 2 + [b"X-Token: two"] * 2 + [b"X-Token: one"]
    assert no_live_request == ["/metrics"] * 3  # one, two, one again
    assert srv.connections == 1


def _serve(pki: PKI, tls: bool, routes: dict[str, Reply | Callable[[int], Reply]]
           ) -> ScriptServer:
    return ScriptServer(routes, ssl_context=pki.server_context() if tls else None)


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_polls_on_a_keep_alive_connection_reuse_the_bytes(
        tls: bool, pki: PKI, no_live_request: list[str]) -> None:
    """Six polls on one keep-alive connection (plain and TLS: ``sendall`` on an SSLSocket):
    every poll gets the page over the one connection (one handshake), the bytes are built
    at the first poll only, and every request the server reads is the library's."""
    with _serve(pki, tls, {"/metrics": response(PAGE)}) as srv:
        url = srv.url()
        session = new_session(url, "direct")
        target = PollTarget("t", url, verify=str(pki.ca))
        try:
            for _ in range(6):
                assert fetch(session, target) == PAGE.decode()
            expected = library_bytes(url, dict(session._headers(target)))  # type: ignore[union-attr]
        finally:
            session.close()
    assert srv.connections == 1
    assert [head + b"\r\n\r\n" for head in srv.heads] == [expected] * 6
    assert no_live_request == ["/metrics"]


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_a_request_lost_on_an_idle_closed_connection_is_sent_again(
        tls: bool, pki: PKI, no_live_request: list[str]) -> None:
    """The server closes the reused connection as the next request arrives (uvicorn's
    keep-alive timeout): the error reading the answer (RemoteDisconnected, or a TLS EOF)
    still leads to one retry on a new connection, with the same cached bytes."""
    with _serve(pki, tls, {"/metrics": lambda n: response(PAGE) if n == 0 else
                           Reply(b"", close=True)}) as srv:
        url = srv.url()
        session = new_session(url, "direct")
        target = PollTarget("t", url, verify=str(pki.ca))
        try:
            assert fetch(session, target) == PAGE.decode()
            assert fetch(session, target) == PAGE.decode()
        finally:
            session.close()
    assert srv.connections == 2
    assert len(srv.heads) == 3  # the first poll, the lost request, the retry
    assert len(set(srv.heads)) == 1
    assert no_live_request == ["/metrics"]


def test_a_connection_the_server_closed_while_idle_is_replaced(
        no_live_request: list[str]) -> None:
    """A server that closes after each answer without saying so: the closed socket is seen
    before the next poll and replaced; the bytes stay cached across connections."""
    import time

    with ScriptServer({"/metrics": Reply(response(PAGE).data, close=True)}) as srv:
        url = srv.url()
        session = new_session(url, "direct")
        try:
            for _ in range(3):
                assert fetch(session, PollTarget("t", url)) == PAGE.decode()
                time.sleep(0.1)  # the server's close arrives before the next poll
        finally:
            session.close()
    assert srv.connections == 3
    assert len(srv.heads) == 3
    assert no_live_request == ["/metrics"] * 3  # a new PollTarget each poll: new headers


def test_connection_close_hands_the_socket_to_the_response(no_live_request: list[str]
                                                           ) -> None:
    """``Connection: close`` in the answer: as ``getresponse()`` does, the connection lets
    go of its socket (``conn.sock`` is None after the poll), the body is still read whole,
    and the next poll opens a new connection with the same bytes."""
    with ScriptServer({"/metrics": response(PAGE, close=True)}) as srv:
        url = srv.url()
        session = new_session(url, "direct")
        assert isinstance(session, fetchmod.DirectSession)
        target = PollTarget("t", url)
        try:
            for _ in range(3):
                assert fetch(session, target) == PAGE.decode()
                assert session._conn is not None and session._conn.sock is None
        finally:
            session.close()
    assert srv.connections == 3
    assert len(set(srv.heads)) == 1 and len(srv.heads) == 3
    assert no_live_request == ["/metrics"]


def test_a_same_origin_redirect_shares_the_connection(no_live_request: list[str]) -> None:
    """A redirect to the target's own origin: the hop is sent on the same keep-alive
    connection after the redirect's body is read, built for that hop (the library's bytes
    for its path, the target's headers), while the usual request stays cached."""
    with ScriptServer({"/metrics": response(b"", 302, {"Location": "/page?p=1"}),
                       "/page?p=1": response(PAGE)}) as srv:
        url = srv.url()
        session = new_session(url, "direct")
        target = PollTarget("t", url, headers={"X-Api-Key": testsecrets.TARGET_API_KEY})
        try:
            for _ in range(2):
                assert fetch(session, target) == PAGE.decode()
            headers = dict(session._headers(target))  # type: ignore[union-attr]
        finally:
            session.close()
    assert srv.connections == 1
    first, hop = (library_bytes(srv.url(p), headers) for p in ("/metrics", "/page?p=1"))
    assert [head + b"\r\n\r\n" for head in srv.heads] == [first, hop, first, hop]
    assert no_live_request == ["/metrics", "/page?p=1", "/page?p=1"]
