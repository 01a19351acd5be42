"""The direct transport: one persistent ``http.client`` connection per target.

A target reached directly (no proxy from the environment for its URL) gets a
:class:`DirectSession`, a fraction of the CPU of ``requests`` at hundreds of targets:

* the GET is the same bytes poll after poll, so they are built once per target and header
  dict by the library's own ``request()`` against a capturing socket
  (:func:`_request_bytes`), then sent as they are;
* the usual answer (``HTTP/1.1 200``, plain headers, a ``Content-Length`` body) is read from
  the socket by :mod:`specwatch.poll.fetch.httpfast`; any other answer is read by the library
  from the same bytes (:func:`_response`);
* a keep-alive connection the server has closed is replaced before use, and a request on a
  reused connection that the server closes before answering is sent once more on a new
  connection (a GET, safe to repeat).

It behaves as the requests transport does (``tests/poll/test_fetch_paths.py``).
"""

from __future__ import annotations

import base64
import http.client
import os
import select
import socket
import ssl
import sys
from collections.abc import Callable, Mapping
from urllib.parse import urljoin, urlsplit

import requests
from requests.utils import DEFAULT_CA_BUNDLE_PATH
from urllib3.util.ssl_ import create_urllib3_context

from specwatch.poll.fetch import httpfast, httpheaders
from specwatch.poll.fetch.guard import Guard, watch
from specwatch.poll.fetch.rules import (
    BASE_HEADERS,
    MAX_REDIRECTS,
    REDIRECT_STATUSES,
    PollError,
    PollTarget,
    check_redirect,
    deadline_error,
    read_body,
    short_message,
    tls_reason,
    url_origin,
)


class _DirectHTTPConnection(http.client.HTTPConnection):
    """A connection whose socket is registered with the poll's guard when it is made; its
    responses read plain header blocks without the email parser (:mod:`.httpheaders`)."""

    response_class = httpheaders.Response

    def connect(self) -> None:
        super().connect()
        watch(self.sock)


class _DirectHTTPSConnection(http.client.HTTPSConnection):
    """TLS with the handshake under the guard: the TCP socket is registered, then the TLS
    socket before the handshake starts (``wrap_socket`` detaches the TCP socket object, so
    shutting that one down would do nothing once wrapped)."""

    _context: ssl.SSLContext
    response_class = httpheaders.Response

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        watch(self.sock)
        sock = self._context.wrap_socket(self.sock, server_hostname=self.host,
                                         do_handshake_on_connect=False)
        self.sock = sock
        watch(sock)
        sock.do_handshake()


def _dropped(sock: socket.socket) -> bool:
    """True when an idle keep-alive socket is readable: the server closed it (or sent
    something unasked), so it must not carry the next request."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class DirectSession:
    """One target reached directly: a persistent ``http.client`` connection to its origin.

    The URL is normalized by ``requests`` (IDNA host, quoted path) once, so the request line
    is the one the requests path would send. Redirects to another origin use a connection
    made for that hop and closed when the poll ends.
    """

    def __init__(self, url: str, default_verify: bool | str = True) -> None:
        self.url = prepared_url(url)
        self.home = url_origin(self.url)
        #: The request target of ``url`` (path and query), split once: every poll sends it.
        self.path = _request_target(self.url)
        #: The verify setting of a target that did not set one (True or the env's bundle).
        self.default_verify = default_verify
        self._conn: http.client.HTTPConnection | None = None
        self._contexts: dict[tuple[bool | str, tuple[str, str] | None], ssl.SSLContext] = {}
        self._headers_for: PollTarget | None = None
        self._own_headers: dict[str, str] = {}
        self._base_headers = dict(BASE_HEADERS, Connection="keep-alive")
        #: The usual poll's request bytes: (the header dict they were built from, held so
        #: compared by identity, the bytes). The rest they depend on is the session's own
        #: (its home origin's connection class, host and port, and ``path``).
        self._raw: tuple[dict[str, str], bytes] | None = None

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _headers(self, target: PollTarget) -> dict[str, str]:
        """Base headers, the target's headers over them (names compared case-blind, as
        requests merges them), then basic auth (made once per target). A new target gets
        a new dict and a returned dict is never changed: :meth:`_request_for` relies on
        that to know its cached bytes by the dict's identity."""
        if self._headers_for is not target:
            merged = {k.lower(): (k, v) for k, v in self._base_headers.items()}
            merged.update({k.lower(): (k, v) for k, v in target.headers.items()})
            if target.basic_auth is not None:
                user, password = target.basic_auth
                token = base64.b64encode(f"{user}:{password}".encode("latin1")).decode()
                merged["authorization"] = ("Authorization", f"Basic {token}")
            self._own_headers = dict(merged.values())
            self._headers_for = target
        return self._own_headers

    def _request_for(self, conn: http.client.HTTPConnection, path: str,
                     headers: dict[str, str], usual: bool) -> bytes:
        """The request bytes for ``conn``: the usual poll's (``usual``: the target's own
        URL on its home connection, whose class, host and port, and the path, are fixed
        for the session) are built once and reused while the header dict is the same (a
        changed target gets a new dict); a redirect hop's are built for that hop."""
        if not usual:
            return _request_bytes(conn, path, headers)
        cached = self._raw
        if cached is not None and cached[0] is headers:
            return cached[1]
        raw = _request_bytes(conn, path, headers)  # raises before caching when invalid
        self._raw = (headers, raw)
        return raw

    def _context(self, verify: bool | str, cert: tuple[str, str] | None) -> ssl.SSLContext:
        """The TLS context requests/urllib3 would build for (verify, cert), made once."""
        key = (verify, cert)
        ctx = self._contexts.get(key)
        if ctx is None:
            ctx = create_urllib3_context(cert_reqs=ssl.CERT_REQUIRED if verify
                                         else ssl.CERT_NONE)
            if verify:
                where = DEFAULT_CA_BUNDLE_PATH if verify is True else verify
                if isinstance(where, str) and os.path.isdir(where):
                    ctx.load_verify_locations(capath=where)
                else:
                    ctx.load_verify_locations(cafile=where)
            if cert is not None:
                ctx.load_cert_chain(cert[0], cert[1])
            ctx.set_alpn_protocols(["http/1.1"])
            self._contexts[key] = ctx
        return ctx

    def _connect(self, origin: tuple[str, str, int | None], verify: bool | str,
                 cert: tuple[str, str] | None, left: float) -> http.client.HTTPConnection:
        scheme, host, port = origin
        conn: http.client.HTTPConnection
        if scheme == "https":
            conn = _DirectHTTPSConnection(host, port, timeout=left,
                                          context=self._context(verify, cert))
        elif scheme == "http":
            conn = _DirectHTTPConnection(host, port, timeout=left)
        else:
            raise PollError("connection", f"unsupported URL scheme {scheme[:20]!r}")
        try:
            conn.connect()
        except BaseException:
            conn.close()  # a failed handshake leaves its socket on the connection
            raise
        return conn

    def fetch(self, target: PollTarget, monotonic: Callable[[], float], deadline: float,
              guard: Guard) -> str:
        verify = self.default_verify if target.verify is True else target.verify
        url, headers = self.url, self._headers(target)
        extra: dict[tuple[str, str, int | None], http.client.HTTPConnection] = {}
        conn: http.client.HTTPConnection | None = None
        resp: http.client.HTTPResponse | httpfast.FastResponse | None = None
        cert = target.cert
        try:
            try:
                for hop in range(MAX_REDIRECTS + 1):
                    origin = self.home if hop == 0 else url_origin(url)
                    conn, sock, resp = self._send(origin, url, headers, verify, cert,
                                                  extra, monotonic, deadline, guard)
                    if resp.status not in REDIRECT_STATUSES or \
                            resp.getheader("location") is None:
                        break
                    status = resp.status
                    location = urljoin(url, resp.getheader("location", ""))
                    _discard(conn, resp)
                    same = url_origin(location) == self.home
                    check_redirect(target, status, same, hop)
                    url = prepared_url(location)
                    # Another origin gets none of the target's credentials: no configured
                    # header, no password, no client certificate.
                    headers = self._headers(target) if same else self._base_headers
                    cert = target.cert if same else None
            except PollError:
                raise
            except Exception as exc:
                if guard.fired:
                    raise deadline_error(target, "no complete response") from exc
                if isinstance(exc, TimeoutError):
                    raise PollError("timeout", f"no response within "
                                               f"{target.timeout_seconds:g}s") from exc
                if isinstance(exc, ssl.SSLError | ssl.CertificateError):
                    raise PollError("tls", "TLS: " + tls_reason(exc)) from exc
                raise PollError("connection", type(exc).__name__ + ": " + short_message(exc)) \
                    from exc
            if resp.status != 200:
                raise PollError("http_status", f"HTTP {resp.status}")

            def settimeout(seconds: float) -> None:
                sock.settimeout(max(seconds, 0.001))

            def read1(n: int) -> bytes:
                data = resp.read1(n)
                if not data and resp.length:  # the server closed before Content-Length
                    raise http.client.IncompleteRead(b"", resp.length)
                return data

            body = read_body(read1, settimeout, resp.getheader("Content-Length"),
                              resp.getheader("Content-Encoding", ""), target, monotonic,
                              deadline, guard)
            resp.close()  # complete: the connection is ready for the next poll
            conn = None
            return body
        finally:
            if conn is not None:  # a poll that failed leaves its connection unusable
                conn.close()
            if resp is not None:  # it holds the socket when the server ends the connection
                resp.close()
            for other in extra.values():
                other.close()

    def _send(self, origin: tuple[str, str, int | None], url: str, headers: dict[str, str],
              verify: bool | str, cert: tuple[str, str] | None,
              extra: dict[tuple[str, str, int | None], http.client.HTTPConnection],
              monotonic: Callable[[], float], deadline: float, guard: Guard,
              ) -> tuple[http.client.HTTPConnection, socket.socket,
                         http.client.HTTPResponse | httpfast.FastResponse]:
        """Send the GET on the origin's connection (made or reused) and read the headers;
        a reused connection the server dropped is replaced, and a request it closes
        without an answer is sent once more on a new connection. Returns the socket too:
        http.client lets go of it at once when the response ends the connection.

        The request goes out as the bytes ``conn.request("GET", path, headers=headers)``
        would send (:meth:`_request_for`: built once for the usual poll), and the response
        is read as ``getresponse()`` reads it (:func:`_response`); ``request()`` and
        ``getresponse()`` are never called on a session's connections, so their state
        machine stays idle (``_discard``, ``close()`` and the response's methods do not
        depend on it)."""
        path = self.path if url is self.url else _request_target(url)
        home = origin == self.home
        usual = home and url is self.url  # the target's own request: its bytes are cached
        conn = self._conn if home else extra.get(origin)
        for attempt in (0, 1):
            left = max(deadline - monotonic(), 0.001)
            sock = conn.sock if conn is not None else None
            reused = sock is not None and not _dropped(sock)
            if conn is None or sock is None or not reused:
                if conn is not None:
                    conn.close()
                conn = self._connect(origin, verify, cert, left)
                sock = conn.sock
                if home:
                    self._conn = conn
                else:
                    extra[origin] = conn
            else:
                watch(sock)
                sock.settimeout(left)
            assert sock is not None
            try:
                raw = self._request_for(conn, path, headers, usual)
                sys.audit("http.client.send", conn, raw)  # as HTTPConnection.send does
                sock.sendall(raw)
                return conn, sock, _response(conn, sock)
            except Exception as exc:
                conn.close()  # never reused half-way through an exchange
                if reused and not attempt and not guard.fired and isinstance(exc, _RETRY):
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover


class _Capture:
    """A socket stand-in for :func:`_request_bytes`: keeps what ``http.client`` sends."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.sent.append(bytes(data))


def _request_bytes(conn: http.client.HTTPConnection, path: str,
                   headers: Mapping[str, str]) -> bytes:
    """The bytes ``conn.request("GET", path, headers=headers)`` sends.

    Why: ``request()`` validates and encodes on every call (putrequest/putheader's
    regular expressions, encoding, joins) bytes that are the same on every poll. They
    are the library's own: its ``request()`` runs on a blank connection of ``conn``'s
    class, host and port (what the request line and Host depend on: IPv6 brackets, the
    port unless it is the class's default) whose socket only records, so a header or path
    the library rejects raises the same exception here. The direct transport never
    tunnels (a target behind a proxy gets the requests transport), so no tunnel state is
    carried over."""
    blank = http.client.HTTPConnection.__new__(type(conn))
    http.client.HTTPConnection.__init__(blank, conn.host, conn.port)
    capture = _Capture()
    blank.sock = capture  # type: ignore[assignment]
    blank.request("GET", path, headers=headers)
    return b"".join(capture.sent)


def _response(conn: http.client.HTTPConnection, sock: socket.socket
              ) -> http.client.HTTPResponse | httpfast.FastResponse:
    """Read the response to the request just sent on ``sock`` as ``conn.getresponse()``
    does (the connection's request state aside, never used here): the connection is
    closed when the server drops it while the headers are read, and handed to the
    response (``conn.sock`` cleared) when the response ends the connection.

    The usual answer (``HTTP/1.1 200``, plain headers, a ``Content-Length`` body) is read
    by :mod:`specwatch.poll.fetch.httpfast` directly from the socket; any other is read by
    the library, from the bytes read so far and then the socket."""
    try:
        head, data = httpfast.read_head(sock)
    except ConnectionError:
        conn.close()
        raise
    if head is not None:
        return httpfast.FastResponse(conn, sock, head[0], head[1], data)
    resp = conn.response_class(httpfast.ReplayedSocket(sock, data), method="GET")
    try:
        try:
            resp.begin()
        except ConnectionError:
            conn.close()
            raise
        if resp.will_close:
            conn.close()  # the response keeps the socket until it is read or closed
        return resp
    except BaseException:
        resp.close()
        raise


#: A reused connection failing this way was closed by the server while idle: sent again.
_RETRY = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
          ConnectionAbortedError, ssl.SSLEOFError)


def _discard(conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
    """Finish a redirect response: a short body is read so the connection can carry the
    next hop; anything else closes the connection."""
    if resp.length is not None and resp.length <= 65536 and not resp.will_close:
        try:
            resp.read()
            return
        except (OSError, http.client.HTTPException):
            pass
    resp.close()
    conn.close()


def _request_target(url: str) -> str:
    """What the request line names: the URL's path ("/" when empty) and its query."""
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def prepared_url(url: str) -> str:
    """The URL as requests would send it (IDNA host, quoted path, no fragment)."""
    prepared = requests.PreparedRequest()
    prepared.prepare_url(url, None)
    return str(prepared.url)
