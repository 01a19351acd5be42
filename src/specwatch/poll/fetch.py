"""One poll's HTTP GET of a target's page: deadline, size cap, TLS, redirects, two transports.

Why each rule:

* **Total deadline per poll** (connect + TLS handshake + headers + body): socket timeouts
  apply per operation, so a server trickling one byte a second (or one header line every
  half second) would never time out. Every socket a poll opens or reuses is registered with
  a :class:`_Guard`; one watchdog thread shuts the sockets of a poll down at its deadline
  (``recv`` then returns at once, wherever the poll is: headers, TLS handshake, body), and
  the poller's ``stop()`` does the same to every poll in flight, so shutdown never waits for
  a target. The body is also read with ``read1`` and the socket timeout lowered to the time
  left before every read.
* **Maximum body size**: a runaway page (LoRA label explosion, a misrouted URL serving a
  file) is cut off and counted as ``too_large`` instead of filling memory; a Content-Length
  over the cap fails before any body byte is read. The body is requested with
  ``Accept-Encoding: identity``; a server that compresses anyway is decompressed
  incrementally with the same cap on the *decompressed* bytes, so a gzip bomb costs at most
  ``max_body_bytes`` of memory. A body shorter than its Content-Length is an error, never a
  silently truncated page.
* **TLS to targets**: ``verify`` (a CA bundle path, True, or False for
  insecure_skip_verify) and the client ``cert`` apply to every request; ``verify: True``
  means ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE`` from the environment when set, else
  certifi's bundle, as ``requests`` does; a configured CA file is never replaced by the
  environment. Host names are checked unless verification is off. A certificate problem is
  reason ``tls`` with OpenSSL's reason.
* **One session per target** keeps its keep-alive connection; sessions are never shared,
  so a stuck target cannot hold a connection another target needs.
* **Two transports, one behaviour.** A target reached directly (no proxy from the
  environment for its URL) gets a :class:`DirectSession`: one persistent
  ``http.client`` connection, a fraction of the CPU of ``requests`` (0.25-0.3 ms against
  0.65-1.1 ms for the 55 KB vLLM page, ``bench/bench_fetch.py``), which matters at hundreds
  of targets. A target whose URL goes through ``HTTP(S)_PROXY``/``ALL_PROXY`` (and is not
  excluded by ``NO_PROXY``) gets a :class:`RequestsSession`, so proxies work exactly as
  ``requests`` handles them. The environment is read once, when the session is made.
  ``tests/poll/test_fetch_paths.py`` checks that both give the same bodies and errors over a
  matrix of server behaviours, and the poller's behaviour tests run on both.
* **The request is built once.** The direct transport's GET is the same bytes poll after
  poll (request line, Host, the merged headers): ``http.client``'s ``request()`` spends
  about 18 µs of CPU building and validating them (of about 240 µs a fetch), so they are
  built once per target (and header dict) by the library's own
  ``request()`` against a capturing socket (:func:`_request_bytes`), then sent as they
  are, and the response is read the way ``getresponse()`` reads it (:func:`_response`).
* **The usual answer is read from the socket.** ``HTTP/1.1 200``, plain header lines and a
  ``Content-Length`` body (every vLLM page) are read with ``recv`` into one buffer and
  parsed with one regular expression (:mod:`specwatch.poll.httpfast`): about 55 µs of
  CPU a fetch less than through ``http.client``'s buffered file and line reads (0.12
  against 0.17 ms for the 55 KB page, ``bench/bench_fetch.py``). Any other answer is read
  by the library from the same bytes, so it behaves exactly as before.
* **Reconnects**: a keep-alive connection the server has closed (seen readable before the
  request) is replaced before use; a request on a reused connection that the server closes
  before answering is sent once more on a new connection (a GET, safe to repeat): uvicorn
  closes idle connections after 5 s, the default poll interval.
* Secrets (bearer tokens, passwords) go into the request headers only; they are never
  logged, and error messages are redacted (:func:`_short`).
* **Redirects** are followed here, per ``follow_redirects`` (same_host by default), at most
  :data:`MAX_REDIRECTS`, never with a configured header or credential (password, bearer
  token, client certificate) to another scheme, host or port.

Size: one module because the two transports must be read side by side: they share the
deadline guard, the body rules (:func:`_read_body`), the redirect rule and the error
reasons, and equivalence is the point. The poller (scheduling) is ``poller.py``.
"""

from __future__ import annotations

import base64
import contextlib
import heapq
import http.client
import os
import select
import socket
import ssl
import sys
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests
from requests.utils import DEFAULT_CA_BUNDLE_PATH
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.util.ssl_ import create_urllib3_context

from specwatch import __version__
from specwatch.common import redact
from specwatch.poll import httpfast, httpheaders


@dataclass(frozen=True)
class PollTarget:
    """How to fetch one target. ``basic_auth`` is (user, password); ``headers`` may carry a
    bearer token. Both are kept out of ``repr`` so they never reach a log line."""

    name: str
    url: str
    timeout_seconds: float = 3.0
    max_body_bytes: int = 16 * 1024 * 1024
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    verify: bool | str = True
    cert: tuple[str, str] | None = None
    #: same_host | any | none (see the module docstring).
    follow_redirects: str = "same_host"


#: Redirects followed per poll (a loop must not eat the deadline).
MAX_REDIRECTS = 3
_REDIRECT_STATUSES = (301, 302, 303, 307, 308)  # requests' REDIRECT_STATI
_BASE_HEADERS = {"Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
                 "Accept-Encoding": "identity",
                 "User-Agent": f"specwatch/{__version__}"}


class PollError(Exception):
    """A failed poll: ``reason`` is one of POLL_ERROR_REASONS."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# -- the deadline guard -----------------------------------------------------------------------


class _Guard:
    """The sockets of one poll and its deadline; :meth:`fire` shuts them down."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.fired = False
        self.done = False
        self._socks: list[socket.socket] = []
        self._owned: list[socket.socket] = []
        self._lock = threading.Lock()

    def watch(self, sock: socket.socket, owned: bool = False) -> None:
        """Shut ``sock`` down when the guard fires; an ``owned`` socket (a duplicate made
        for the guard) is closed by :meth:`release`."""
        with self._lock:
            self._socks.append(sock)
            if owned:
                self._owned.append(sock)
            fired = self.fired
        if fired:
            _shutdown(sock)

    def fire(self) -> None:
        with self._lock:
            if self.done or self.fired:
                return
            self.fired = True
            socks = list(self._socks)
        for sock in socks:
            _shutdown(sock)

    def release(self) -> None:
        """The poll is over: the guard never fires again; its duplicates are closed."""
        with self._lock:
            self.done = True
            owned, self._owned = self._owned, []
        for sock in owned:
            sock.close()


def _shutdown(sock: socket.socket) -> None:
    # The plain socket's shutdown even for an SSLSocket: SSLSocket.shutdown drops its SSL
    # object, which the reading thread may be using. A socket detached by wrap_socket or
    # closed has no descriptor any more: OSError, ignored (never another socket's fd).
    with contextlib.suppress(OSError, ValueError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Watchdog:
    """One thread for every poll's deadline: fires each :class:`_Guard` when due."""

    #: Heap size from which finished guards are dropped before a new one is added.
    COMPACT_FROM = 64

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Guard]] = []
        self._count = 0
        self._thread: threading.Thread | None = None
        self._compact_at = self.COMPACT_FROM

    def add(self, guard: _Guard) -> None:
        with self._cond:
            self._count += 1
            if len(self._heap) >= self._compact_at:
                # A finished poll's guard would otherwise wait in the heap until its
                # deadline: a target failing fast (connection refused) polled often would
                # pile up timeout / interval of them. Dropping them when the heap has
                # doubled since the last pass keeps it within twice the polls in flight
                # (plus COMPACT_FROM) at O(1) amortised cost a poll.
                self._heap = [e for e in self._heap if not e[2].done]
                heapq.heapify(self._heap)
                self._compact_at = max(self.COMPACT_FROM, 2 * len(self._heap))
            heapq.heappush(self._heap, (guard.deadline, self._count, guard))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="specwatch-deadline")
                self._thread.start()
            # Woken only when this deadline is the next one due: otherwise the thread
            # already waits for an earlier one and finds this one then (one thread switch a
            # poll saved: issue 15).
            if self._heap[0][2] is guard:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                deadline, _, guard = self._heap[0]
                left = deadline - time.monotonic()
                if left > 0 and not guard.done:
                    self._cond.wait(left)
                    continue
                heapq.heappop(self._heap)
            if not guard.done:
                guard.fire()


_WATCHDOG = _Watchdog()
_current = threading.local()


def _watch(sock: socket.socket | None) -> None:
    """Register ``sock`` with the poll running in this thread (new or reused)."""
    guard = getattr(_current, "guard", None)
    if guard is not None and sock is not None:
        guard.watch(sock)


# -- the entry point --------------------------------------------------------------------------


def fetch(session: FetchSession, target: PollTarget,
          monotonic: Callable[[], float] = time.monotonic,
          guard: _Guard | None = None) -> str:
    """GET the target's page within its deadline and size cap; raise PollError otherwise.

    ``guard`` (made here when not given) holds the poll's sockets: the watchdog shuts them
    down at the deadline whatever the server does, and the poller's ``stop()`` at once."""
    deadline = monotonic() + target.timeout_seconds
    if guard is None:
        guard = _Guard(time.monotonic() + target.timeout_seconds)
    _current.guard = guard
    _WATCHDOG.add(guard)
    try:
        if isinstance(session, DirectSession):
            return session.fetch(target, monotonic, deadline, guard)
        return _fetch_requests(session, target, monotonic, deadline, guard)
    finally:
        guard.release()
        _current.guard = None


def new_session(url: str, path: str = "auto") -> FetchSession:
    """The session of one target: ``direct`` (http.client), ``requests``, or ``auto``: the
    requests path only when the environment routes the URL through a proxy."""
    env = _environment(url)
    if path == "requests" or (path == "auto" and env.get("proxies")):
        return RequestsSession(url, env)
    if path not in ("auto", "direct"):
        raise ValueError(f"unknown fetch path {path!r}")
    return DirectSession(url, env.get("verify", True))


def _environment(url: str) -> dict[str, Any]:
    """What ``requests`` takes from the environment for ``url``: proxies (after NO_PROXY)
    and the CA bundle (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE)."""
    with requests.Session() as probe:
        return probe.merge_environment_settings(url, {}, None, None, None)


# -- the body: shared by both transports ------------------------------------------------------


def _read_body(read1: Callable[[int], bytes], settimeout: Callable[[float], None],
               length: str | None, encoding: str, target: PollTarget,
               monotonic: Callable[[], float], deadline: float, guard: _Guard) -> str:
    """Read a 200 response's body within the deadline and the cap, decompressing a body
    sent compressed anyway; transport errors become ``timeout`` or ``connection``."""
    cap = target.max_body_bytes
    if length and length.isdigit() and int(length) > cap:
        raise PollError("too_large", f"Content-Length {length} > {cap}")
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        decomp = None
    elif encoding in ("gzip", "x-gzip", "deflate"):
        decomp = zlib.decompressobj(zlib.MAX_WBITS | (16 if "gzip" in encoding else 0))
    else:
        raise PollError("parse", f"unsupported Content-Encoding {encoding[:40]!r}")
    chunks: list[bytes] = []
    total = 0  # decoded bytes
    wire = 0  # bytes received
    try:
        while True:
            left = deadline - monotonic()
            if left <= 0:
                raise PollError("timeout",
                                f"body not complete within {target.timeout_seconds:g}s")
            settimeout(left)
            data = read1(65536)
            if not data:
                break
            wire += len(data)
            if wire > cap:
                raise PollError("too_large", f"body over {cap} bytes")
            if decomp is not None:
                # At most one byte past the cap is ever inflated: a bomb stops here.
                data = decomp.decompress(data, cap - total + 1)
            total += len(data)
            if total > cap:
                raise PollError("too_large", f"decompressed body over {cap} bytes")
            chunks.append(data)
        if decomp is not None:
            tail = decomp.flush(cap - total + 1)
            total += len(tail)
            if total > cap:
                raise PollError("too_large", f"decompressed body over {cap} bytes")
            chunks.append(tail)
            if not decomp.eof:
                raise PollError("parse", f"{encoding} body ends before its end marker")
    except PollError:
        raise
    except zlib.error as exc:
        raise PollError("parse", f"corrupt {encoding} body: {exc}") from exc
    except Exception as exc:  # socket timeout, reset, short body (IncompleteRead)
        if guard.fired or "timed out" in str(exc).lower() or isinstance(exc, TimeoutError):
            raise PollError("timeout", f"body not complete within "
                                       f"{target.timeout_seconds:g}s") from exc
        raise PollError("connection", type(exc).__name__ + ": " + _short(exc)) from exc
    if guard.fired:
        # Shut down at the deadline: what was read (even a "complete" response: http.client
        # takes end-of-file for the end of the headers) is cut short, never a page.
        raise _deadline_error(target, "no complete response")
    body = b"".join(chunks)
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PollError("parse", f"body is not UTF-8 ({exc.reason} at byte {exc.start})") \
            from exc


def _check_redirect(target: PollTarget, status: int, same: bool, hop: int) -> None:
    """Raise unless hop ``hop`` may follow this redirect: ``follow_redirects`` allows it
    (``same``: to the target's own origin) and it is not one past :data:`MAX_REDIRECTS`.
    The caller then sends the target's credentials (headers, password, client
    certificate) only when ``same``."""
    if target.follow_redirects == "none" or (not same and target.follow_redirects == "same_host"):
        where = "to its own origin" if same else "to another scheme, host or port"
        raise PollError("http_status", f"HTTP {status}: redirect {where} not followed "
                                       f"(follow_redirects: {target.follow_redirects})")
    if hop == MAX_REDIRECTS:
        raise PollError("connection", f"more than {MAX_REDIRECTS} redirects")


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the scheme's default port filled in."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(scheme)


def _deadline_error(target: PollTarget, what: str) -> PollError:
    return PollError("timeout", f"{what} within {target.timeout_seconds:g}s (total deadline: "
                                f"connect, headers and body)")


def _tls_reason(exc: BaseException) -> str:
    """The OpenSSL reason of a TLS failure (e.g. CERTIFICATE_VERIFY_FAILED), not the URL."""
    text = redact.redact(str(exc))
    for marker in ("certificate verify failed", "CERTIFICATE_VERIFY_FAILED", "hostname",
                   "wrong version number", "tlsv1 alert", "sslv3 alert", "handshake"):
        i = text.find(marker)
        if i >= 0:
            end = text.find(")", i)
            return text[i:end if end > 0 else i + 120][:160]
    return _short(exc, 160)


def _short(exc: BaseException, limit: int = 200) -> str:
    # Redacted before it is cut: an exception may quote a header value or the URL.
    text = redact.redact(str(exc))
    return text if len(text) <= limit else text[:limit] + "..."


# -- the direct transport: http.client --------------------------------------------------------


class _DirectHTTPConnection(http.client.HTTPConnection):
    """A connection whose socket is registered with the poll's guard when it is made; its
    responses read plain header blocks without the email parser (:mod:`.httpheaders`)."""

    response_class = httpheaders.Response

    def connect(self) -> None:
        super().connect()
        _watch(self.sock)


class _DirectHTTPSConnection(http.client.HTTPSConnection):
    """TLS with the handshake under the guard: the TCP socket is registered, then the TLS
    socket before the handshake starts (``wrap_socket`` detaches the TCP socket object, so
    shutting that one down would do nothing once wrapped)."""

    _context: ssl.SSLContext
    response_class = httpheaders.Response

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        _watch(self.sock)
        sock = self._context.wrap_socket(self.sock, server_hostname=self.host,
                                         do_handshake_on_connect=False)
        self.sock = sock
        _watch(sock)
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
        self.url = _prepared_url(url)
        self.home = _origin(self.url)
        #: The request target of ``url`` (path and query), split once: every poll sends it.
        self.path = _request_target(self.url)
        #: The verify setting of a target that did not set one (True or the env's bundle).
        self.default_verify = default_verify
        self._conn: http.client.HTTPConnection | None = None
        self._contexts: dict[tuple[bool | str, tuple[str, str] | None], ssl.SSLContext] = {}
        self._headers_for: PollTarget | None = None
        self._own_headers: dict[str, str] = {}
        self._base_headers = dict(_BASE_HEADERS, Connection="keep-alive")
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
              guard: _Guard) -> str:
        verify = self.default_verify if target.verify is True else target.verify
        url, headers = self.url, self._headers(target)
        extra: dict[tuple[str, str, int | None], http.client.HTTPConnection] = {}
        conn: http.client.HTTPConnection | None = None
        resp: http.client.HTTPResponse | httpfast.FastResponse | None = None
        cert = target.cert
        try:
            try:
                for hop in range(MAX_REDIRECTS + 1):
                    origin = self.home if hop == 0 else _origin(url)
                    conn, sock, resp = self._send(origin, url, headers, verify, cert,
                                                  extra, monotonic, deadline, guard)
                    if resp.status not in _REDIRECT_STATUSES or \
                            resp.getheader("location") is None:
                        break
                    status = resp.status
                    location = urljoin(url, resp.getheader("location", ""))
                    _discard(conn, resp)
                    same = _origin(location) == self.home
                    _check_redirect(target, status, same, hop)
                    url = _prepared_url(location)
                    # Another origin gets none of the target's credentials: no configured
                    # header, no password, no client certificate.
                    headers = self._headers(target) if same else self._base_headers
                    cert = target.cert if same else None
            except PollError:
                raise
            except Exception as exc:
                if guard.fired:
                    raise _deadline_error(target, "no complete response") from exc
                if isinstance(exc, TimeoutError):
                    raise PollError("timeout", f"no response within "
                                               f"{target.timeout_seconds:g}s") from exc
                if isinstance(exc, ssl.SSLError | ssl.CertificateError):
                    raise PollError("tls", "TLS: " + _tls_reason(exc)) from exc
                raise PollError("connection", type(exc).__name__ + ": " + _short(exc)) \
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

            body = _read_body(read1, settimeout, resp.getheader("Content-Length"),
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
              monotonic: Callable[[], float], deadline: float, guard: _Guard,
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
                _watch(sock)
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

    Why: ``request()`` costs about 18 µs of CPU a call (putrequest/putheader's validation
    regular expressions, encoding, joins) for bytes that are the same on every poll. They
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
    by :mod:`specwatch.poll.httpfast` directly from the socket; any other is read by
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


def _prepared_url(url: str) -> str:
    """The URL as requests would send it (IDNA host, quoted path, no fragment)."""
    prepared = requests.PreparedRequest()
    prepared.prepare_url(url, None)
    return str(prepared.url)


# -- the requests transport (targets behind a proxy) ------------------------------------------


class _Guarded:
    """Mixin for urllib3 connections: registers the socket with the poll running in this
    thread (new or reused), for plain and TLS connections alike.

    A new connection's socket is registered as a duplicate (same connection, its own
    descriptor, closed when the poll ends): urllib3 wraps the socket for TLS, which detaches
    the original socket object before the handshake, so only a duplicate lets the guard cut
    a handshake short (a server that never answers it held ``stop()`` for the whole
    deadline before)."""

    sock: socket.socket | None

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()  # type: ignore[misc]
        guard = getattr(_current, "guard", None)
        if guard is not None:
            guard.watch(sock.dup(), owned=True)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        _watch(self.sock)
        super().request(*args, **kwargs)  # type: ignore[misc]


class _GuardedHTTPConnection(_Guarded, HTTPConnection):
    pass


class _GuardedHTTPSConnection(_Guarded, HTTPSConnection):
    pass


class _GuardedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _GuardedHTTPConnection


class _GuardedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _GuardedHTTPSConnection


class RequestsSession(requests.Session):
    """The session of one target behind a proxy, with the environment read once.

    A plain session re-reads ``os.environ`` (proxy variables, CA bundle) and looks for a
    ``.netrc`` on every request: about half the CPU of polling a 55 KB page. Here the proxy
    settings for the target's URL and ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE`` are resolved
    when the session is made and ``trust_env`` is turned off (so ``.netrc`` is not read:
    target credentials come from the configuration only).
    """

    def __init__(self, url: str, env: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.max_redirects = MAX_REDIRECTS
        adapter = requests.adapters.HTTPAdapter()
        adapter.poolmanager.pool_classes_by_scheme = {"http": _GuardedHTTPPool,
                                                      "https": _GuardedHTTPSPool}
        self.mount("http://", adapter)
        self.mount("https://", adapter)
        if env is None:
            env = self.merge_environment_settings(url, {}, None, None, None)
        self.trust_env = False
        self.proxies.update(env.get("proxies") or {})
        #: The verify setting of a target that did not set one (True or the env's bundle).
        self.default_verify: bool | str = env.get("verify", True)
        #: The target's request, prepared once (URL, headers, auth never change for a
        #: session: a changed target gets a new session).
        self.prepared: requests.PreparedRequest | None = None


FetchSession = DirectSession | RequestsSession


def _set_socket_timeout(raw: object, seconds: float) -> None:
    """Lower the read timeout of the response's socket (best effort: urllib3 internals)."""
    conn = getattr(raw, "_connection", None)
    sock = getattr(conn, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.settimeout(max(seconds, 0.001))


def _fetch_requests(session: requests.Session, target: PollTarget,
                    monotonic: Callable[[], float], deadline: float, guard: _Guard) -> str:
    try:
        verify = target.verify
        if verify is True:  # the environment's CA bundle, as requests itself would use
            verify = getattr(session, "default_verify", True)
        prepared = getattr(session, "prepared", None)
        if prepared is None:
            prepared = session.prepare_request(requests.Request(
                "GET", target.url, headers={**_BASE_HEADERS, **target.headers},
                auth=target.basic_auth))
            if isinstance(session, RequestsSession):
                session.prepared = prepared
        request = prepared.copy()
        # Redirects are followed here, not by requests: requests only drops Authorization
        # and Cookie on a cross-host redirect, so an X-Api-Key would follow a redirect
        # anywhere.
        home = _origin(target.url)
        cert = target.cert
        for hop in range(MAX_REDIRECTS + 1):
            left = max(deadline - monotonic(), 0.001)
            resp = session.send(request, stream=True, allow_redirects=False,
                                timeout=(left, left), verify=verify, cert=cert)
            if not resp.is_redirect:
                break
            status = resp.status_code
            location = urljoin(resp.url or target.url, resp.headers.get("location", ""))
            resp.close()
            same = _origin(location) == home
            _check_redirect(target, status, same, hop)
            request = session.prepare_request(requests.Request(
                "GET", location,
                headers={**_BASE_HEADERS, **target.headers} if same else _BASE_HEADERS,
                auth=target.basic_auth if same else None))
            cert = target.cert if same else None  # nor the client certificate
    except requests.exceptions.Timeout as exc:
        raise PollError("timeout", f"no response within {target.timeout_seconds:g}s") from exc
    except requests.exceptions.RequestException as exc:
        if guard.fired:
            raise _deadline_error(target, "no complete response") from exc
        if isinstance(exc, requests.exceptions.SSLError):
            raise PollError("tls", "TLS: " + _tls_reason(exc)) from exc
        raise PollError("connection", type(exc).__name__ + ": " + _short(exc)) from exc
    with resp:
        if resp.status_code != 200:
            raise PollError("http_status", f"HTTP {resp.status_code}")
        raw = resp.raw
        return _read_body(lambda n: raw.read1(n, decode_content=False),
                          lambda seconds: _set_socket_timeout(raw, seconds),
                          resp.headers.get("Content-Length"),
                          resp.headers.get("Content-Encoding", ""), target, monotonic,
                          deadline, guard)
