"""The exporter's HTTP server behind a small, stable interface.

``WebServer(listen, routes)`` where ``routes`` maps a path to ``handler(Request) -> Response``.
Handlers see plain data objects, not the http.server machinery, so new routes (the
controller's Alertmanager receiver, ``POST``) are one more dict entry and every route gets
the same protection. A handler that raises gives a 500 for that request only.

What the transport guarantees for every endpoint (anchors-reliability §1.2, §2.1, §3, §7):

* **Slowloris-safe deadlines.** A new connection must send its request within
  ``request_timeout``; from the first byte of a request, reading it and running the handler
  share one deadline of ``request_timeout``, and writing the response gets another (so a
  connection is never held longer than about twice ``request_timeout`` plus
  ``idle_timeout`` between keep-alive requests). ``http.server`` only has per-``recv`` socket
  timeouts (one byte every few seconds would hold a thread forever), so reads and writes go
  through small deadline-enforcing socket adapters; parsing stays ``http.server``'s.
* **A cap on concurrent requests** (``max_requests_in_flight``, 40 like node_exporter's
  ``--web.max-requests``): above it a request gets ``503`` at once. A handler that overruns
  the deadline also gets ``503`` and keeps its slot until it returns (client_golang's
  ``Timeout`` / ``MaxRequestsInFlight``).
* **A cap on open connections** (``max_connections``): one thread serves one connection, so
  this bounds threads; above it new connections are closed at once. One client address may
  hold at most ``max_connections_per_client`` of them (600 half-open sockets from one host
  must not lock every other scraper out).
* **Authentication before work.** With basic auth on, the credential is checked before the
  request takes an in-flight slot or a rate-limiter token; a verified credential is answered
  from the cache (bcrypt runs once per distinct credential), and an address that keeps
  failing gets 429 without bcrypt running (:class:`~specwatch.web.webconfig.FailureLimiter`).
  A wrong-password flood therefore costs the real scraper nothing but CPU share.
* **Strict framing.** Two ``Content-Length`` headers, a non-numeric one, any
  ``Transfer-Encoding`` and HTTP/0.9 are refused (400, connection closed): no request can be
  smuggled behind another.
* **TLS handshakes off the accept loop, under a deadline.** The listening socket is plain
  TCP; each accepted socket is wrapped and its handshake driven non-blocking in the
  connection's own thread with a total ``handshake_timeout``. prometheus_client wraps the
  *listening* socket, so one client that never sends a ClientHello stalls every HTTPS scrape.
* **Web config** (:mod:`specwatch.web.webconfig`): TLS, client certificates, basic auth, security
  headers, rate limit (429). :meth:`WebServer.reload_web_config` swaps it atomically (SIGHUP):
  requests in flight finish under the config they started with, new connections and requests
  use the new one, and a bad new file keeps the old config. A reload that would turn TLS or
  basic auth off is refused (error log, old config kept) unless the server started without it.

Counters of what was refused (``specwatch_http_requests_rejected_total{reason}``) are in
:meth:`WebServer.stats`.

Size: one module because every protection above acts on the same connection, in one order
(framing, authentication, in-flight slot, rate limit, deadline); split apart, a new route
or a new check could take a shared resource before the checks that guard it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gzip
import http.client
import io
import logging
import math
import selectors
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from specwatch.common.errors import ConfigError
from specwatch.web import webconfig
from specwatch.web.negotiate import accepts_gzip

log = logging.getLogger(__name__)

#: Largest request body a handler may receive (the Alertmanager webhook is a few kB).
MAX_REQUEST_BODY = 1024 * 1024

#: Reasons in ``specwatch_http_requests_rejected_total{reason}``.
REJECT_REASONS: tuple[str, ...] = ("in_flight_limit", "connection_limit", "timeout",
                                   "tls_handshake", "unauthorized", "rate_limited",
                                   "bad_request", "auth_rate_limited",
                                   "client_connection_limit")


@dataclass(frozen=True)
class Request:
    """One HTTP request as a handler sees it (header names lower-case).

    ``user`` is the basic-auth user when the web config requires one, ``remote`` the peer's
    ``host:port``.
    """

    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]
    body: bytes = b""
    remote: str = ""
    user: str | None = None


@dataclass(frozen=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Response]


@dataclass(frozen=True)
class ServerLimits:
    """Bounds of the HTTP server (config ``global.http_server``)."""

    max_requests_in_flight: int = 40
    max_connections: int = 512
    #: Open connections from one client address: one host (or 600 half-open sockets from
    #: it) cannot take the whole ``max_connections``.
    max_connections_per_client: int = 64
    #: Failed logins one client address may make at once (then one per
    #: ``failed_login_interval``); past them it gets 429 and bcrypt does not run.
    failed_logins_per_client: int = 10
    failed_login_interval: float = 1.0
    request_timeout: float = 10.0
    idle_timeout: float = 60.0
    handshake_timeout: float = 5.0


@dataclass(frozen=True)
class WebStats:
    """Counters and gauges of the HTTP server at one instant."""

    rejected: Mapping[str, int]
    in_flight: int
    connections: int
    tls: bool
    web_config_reload_success: bool
    web_config_reload_timestamp: float | None


def parse_listen(listen: str, option: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:10440`` for IPv6, ``:10440`` for all interfaces). ``option``
    is the flag an error names (the demo's servers have their own)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{option}: expected HOST:PORT, got {listen!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class _Deadline:
    """The deadline shared by a connection's reader and writer.

    ``waiting`` is True while the connection waits for the first byte of a request; the first
    byte starts the request's own deadline.
    """

    def __init__(self) -> None:
        self.at = math.inf
        self.waiting = True
        self.request_timeout = 10.0

    def left(self) -> float:
        return self.at - time.monotonic()


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock: socket.socket, deadline: _Deadline,
                 on_timeout: Callable[[bool], None]) -> None:
        self._sock = sock
        self._d = deadline
        self._on_timeout = on_timeout

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        left = self._d.left()
        if left <= 0:
            self._on_timeout(self._d.waiting)
            raise TimeoutError("request deadline exceeded")
        self._sock.settimeout(left)
        try:
            n = self._sock.recv_into(b)
        except TimeoutError:
            self._on_timeout(self._d.waiting)
            raise
        if n and self._d.waiting:
            self._d.waiting = False
            self._d.at = time.monotonic() + self._d.request_timeout
        return n


class _DeadlineWriter(io.RawIOBase):
    """Unbuffered writer: every write completes before the deadline or raises."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self._sock = sock
        self._d = deadline

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        sent = 0
        while sent < len(view):
            left = self._d.left()
            if left <= 0:
                raise TimeoutError("response deadline exceeded")
            self._sock.settimeout(left)
            sent += self._sock.send(view[sent:sent + 65536])
        return sent


class _Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rejected = dict.fromkeys(REJECT_REASONS, 0)
        self.in_flight = 0
        self.connections = 0
        self.per_client: dict[str, int] = {}  # open connections per client address

    def closed(self, client: str) -> None:
        with self.lock:
            self.connections -= 1
            n = self.per_client.get(client, 0) - 1
            if n > 0:
                self.per_client[client] = n
            else:
                self.per_client.pop(client, None)

    def reject(self, reason: str) -> None:
        with self.lock:
            self.rejected[reason] += 1


class _RequestHandler(BaseHTTPRequestHandler):
    """http.server's parser over deadline-enforcing socket adapters."""

    server: WebServer  # type: ignore[assignment]
    protocol_version = "HTTP/1.1"
    server_version = "specwatch"
    sys_version = ""

    def __init__(self, sock: socket.socket, addr: tuple, server: WebServer,
                 deadline: _Deadline) -> None:
        self._deadline = deadline
        super().__init__(sock, addr, server)  # type: ignore[arg-type]

    def setup(self) -> None:
        self.connection = self.request
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        self.rfile = io.BufferedReader(
            _DeadlineReader(self.connection, self._deadline, self._timed_out), 65536)
        self.wfile = _DeadlineWriter(self.connection, self._deadline)
        self._first = True

    def _timed_out(self, waiting: bool) -> None:
        # A keep-alive connection idling between requests is normal; a request that does
        # not arrive (or not completely) within its deadline is a refusal worth counting.
        if not waiting or self._first:
            self.server._stats.reject("timeout")

    def handle_one_request(self) -> None:
        d = self._deadline
        d.waiting = True
        d.request_timeout = self.server.limits.request_timeout
        d.at = time.monotonic() + (self.server.limits.request_timeout if self._first
                                   else self.server.limits.idle_timeout)
        try:
            super().handle_one_request()
        except (OSError, ValueError) as exc:  # reset by peer, write timeout, closed file
            log.debug("connection from %s ended: %s", self.address_string(), exc)
            self.close_connection = True
        self._first = False

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s - %s", self.address_string(), format % args)

    def parse_request(self) -> bool:
        """http.server's parser, then the framing rules that stop request smuggling.

        A request whose length is ambiguous is refused and its connection closed: two
        ``Content-Length`` headers (equal or not), one that is not plain digits (``int()``
        would read ``+5`` or ``1_0``), or any ``Transfer-Encoding`` (a scrape and the
        Alertmanager webhook send a ``Content-Length``; a proxy in front that chose the other
        header would see a different request boundary). HTTP/0.9 (a request line without a
        version) has no headers at all, so no Host, no auth header and no framing: refused.
        """
        words = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n").split()
        problem = None
        if len(words) == 2:  # refused before http.server waits for headers 0.9 never sends
            self.command, self.path = words
            self.requestline = " ".join(words)
            self.request_version = "HTTP/1.0"  # answer with a status line and headers
            self.headers = http.client.HTTPMessage()
            problem = "HTTP/0.9 is not supported"
        elif not super().parse_request():
            return False
        else:
            lengths = self.headers.get_all("Content-Length") or []
            if len(lengths) > 1:
                problem = "more than one Content-Length"
            elif lengths and not _is_digits(lengths[0].strip(" \t")):
                problem = "Content-Length is not a decimal number"
            elif self.headers.get_all("Transfer-Encoding"):
                problem = "Transfer-Encoding is not accepted (send a Content-Length)"
        if problem is None:
            return True
        self.server._stats.reject("bad_request")
        log.debug("bad request from %s: %s", self.address_string(), problem)
        self._refuse(Response(400, f"bad request: {problem}\n".encode()),
                     self.server._web_config, head=False)
        return False

    def _handle(self) -> None:
        srv = self.server
        cfg = srv._web_config
        parts = urlsplit(self.path)
        headers = {k.lower(): v for k, v in self.headers.items()}
        head = self.command == "HEAD"
        stats = srv._stats
        # Authentication comes first, before anything shared is taken: a client without the
        # password never holds an in-flight slot or a rate-limiter token, and a verified
        # credential is answered from the cache without queueing behind wrong passwords'
        # bcrypt runs.
        user = None
        if cfg.auth is not None and parts.path not in srv.own_auth_paths:
            user = self._authenticate(cfg, headers, head)
            if user is None:
                return
        with stats.lock:
            admitted = stats.in_flight < srv.limits.max_requests_in_flight
            if admitted:
                stats.in_flight += 1
        if not admitted:
            stats.reject("in_flight_limit")
            self._refuse(Response(503, b"too many requests in flight, retry later\n",
                                  headers={"Retry-After": "1"}), cfg, head)
            return
        abandoned = False  # a handler past the deadline keeps its slot until it returns
        try:
            limiter = srv._limiter
            if limiter is not None and not limiter.allow():
                stats.reject("rate_limited")
                self._refuse(Response(429, b"rate limit exceeded\n"), cfg, head)
                return
            try:
                length = int(headers.get("content-length") or 0)
            except ValueError:
                length = -1
            if length < 0 or length > MAX_REQUEST_BODY:
                self._refuse(Response(413 if length > 0 else 400,
                                      b"bad or too large request body\n"), cfg, head)
                return
            body = self.rfile.read(length) if length > 0 else b""
            handler = srv.routes.get(parts.path)
            if handler is None:
                self._send(Response(404, b"not found\n"), cfg, head)
                return
            req = Request(method=self.command, path=parts.path, query=parse_qs(parts.query),
                          headers=headers, body=body,
                          remote=f"{self.client_address[0]}:{self.client_address[1]}",
                          user=user)
            fut = srv._executor.submit(_run_handler, handler, req)
            try:
                resp = fut.result(timeout=max(0.0, self._deadline.left()))
            except concurrent.futures.TimeoutError:
                abandoned = True
                fut.add_done_callback(lambda _f: srv._release_slot())
                stats.reject("timeout")
                log.warning("handler for %s did not finish within %gs", parts.path,
                            srv.limits.request_timeout)
                self._refuse(Response(503, b"request timed out\n"), cfg, head)
                return
            self._send(resp, cfg, head, gzip_ok=accepts_gzip(headers.get("accept-encoding")))
        finally:
            # Released here, after the answer is written: a client that gets its answer
            # and sends the next request at once must never find its own slot still taken.
            if not abandoned:
                srv._release_slot()

    def _authenticate(self, cfg: webconfig.WebConfig, headers: Mapping[str, str],
                      head: bool) -> str | None:
        """The basic-auth user, or None after answering 401 (or 429 when this client
        address has used up its failed attempts: then bcrypt does not run at all)."""
        assert cfg.auth is not None
        srv = self.server
        client = self.client_address[0]
        creds = webconfig.parse_basic(headers.get("authorization"))
        ok = cfg.auth.cached(*creds) if creds is not None else None
        if ok is None:
            if not srv._auth_failures.acquire(client):
                srv._stats.reject("auth_rate_limited")
                self._refuse(Response(429, b"too many failed logins, retry later\n",
                                      headers={"Retry-After": "1"}), cfg, head)
                return None
            ok = creds is not None and cfg.auth.check(*creds)
            if ok:
                srv._auth_failures.succeeded(client)
        if ok and creds is not None:
            return creds[0]
        srv._stats.reject("unauthorized")
        self._refuse(Response(401, b"unauthorized\n", headers={
            "WWW-Authenticate": 'Basic realm="specwatch", charset="UTF-8"'}), cfg, head)
        return None

    def _refuse(self, resp: Response, cfg: webconfig.WebConfig, head: bool) -> None:
        self.close_connection = True
        self._send(resp, cfg, head, close=True)

    def _send(self, resp: Response, cfg: webconfig.WebConfig, head: bool,
              gzip_ok: bool = False, close: bool = False) -> None:
        # Writing gets its own request_timeout (Go's WriteTimeout): a handler that used the
        # whole budget still gets its answer (or its 503) out, and a client that does not
        # read is still cut off.
        self._deadline.at = time.monotonic() + self.server.limits.request_timeout
        body = resp.body
        headers = dict(resp.headers)
        if (gzip_ok and len(body) > 1024 and resp.status == 200
                and "Content-Encoding" not in headers):  # a handler may send it encoded
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        self.send_response(resp.status)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in {**cfg.headers, **headers}.items():
            self.send_header(k, v)
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _handle  # noqa: N815


def _is_digits(text: str) -> bool:
    return 0 < len(text) <= 18 and text.isascii() and text.isdigit()


def _run_handler(handler: Handler, req: Request) -> Response:
    try:
        return handler(req)
    except Exception:
        log.exception("handler for %s failed", req.path)
        return Response(500, b"internal error\n")


def only_get(handler: Handler) -> Handler:
    """Wrap a read-only handler: GET/HEAD pass, other methods get 405."""

    def wrapped(req: Request) -> Response:
        if req.method not in ("GET", "HEAD"):
            return Response(405, b"method not allowed\n", headers={"Allow": "GET, HEAD"})
        return handler(req)

    return wrapped


class WebServer:
    """A hardened threaded HTTP(S) server with a route table.

    ``address`` is the bound (host, port) once started. ``web_config_file`` is an
    exporter-toolkit web config (TLS, basic auth...); ``limits`` the timeouts and caps.
    ``routes`` may be extended until :meth:`start` (and is read per request).
    ``listen_option`` is the command-line flag that set ``listen``, named by its errors.
    """

    def __init__(self, listen: str, routes: Mapping[str, Handler],
                 web_config_file: str | None = None,
                 limits: ServerLimits | None = None,
                 listen_option: str = "--listen") -> None:
        self.listen = listen
        self.listen_option = listen_option
        self.routes: dict[str, Handler] = dict(routes)
        #: Routes whose handler authenticates the request itself (the controller's
        #: Alertmanager receiver and its bearer token: one Authorization header cannot carry
        #: both that and the web config's basic auth). TLS and every limit still apply.
        self.own_auth_paths: set[str] = set()
        self.web_config_file = web_config_file
        self.limits = limits or ServerLimits()
        self._web_config = webconfig.WebConfig()
        self._limiter: webconfig.RateLimiter | None = None
        self._auth_failures = webconfig.FailureLimiter(self.limits.failed_logins_per_client,
                                                       self.limits.failed_login_interval)
        self._stats = _Stats()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.limits.max_requests_in_flight, thread_name_prefix="specwatch-h")
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._reload_ok = True
        self._reload_ts: float | None = None
        self._started_with = (False, False)  # (TLS, basic auth) at start(): fail closed

    # -- web config ------------------------------------------------------------------------
    def _apply(self, cfg: webconfig.WebConfig) -> None:
        self._limiter = webconfig.RateLimiter(*cfg.rate_limit) if cfg.rate_limit else None
        self._web_config = cfg

    def reload_web_config(self) -> bool:
        """Re-read the web config file; on any error keep the current one (and say so)."""
        if not self.web_config_file:
            return True
        try:
            cfg = webconfig.load(self.web_config_file)
        except ConfigError as exc:
            log.error("web config reload failed, keeping the previous one: %s", exc)
            self._reload_ok = False
            return False
        # Fail closed: a reload never turns TLS or basic auth off when the server was
        # started with it (an empty or half-written file, all keys removed by mistake);
        # that takes a restart, a deliberate act.
        old = self._web_config
        lost = [what for what, had, has, started in (
            ("TLS", old.tls, cfg.tls, self._started_with[0]),
            ("basic auth", old.auth, cfg.auth, self._started_with[1]))
            if had is not None and has is None and started]
        if lost:
            log.error("web config reload from %s refused, keeping the previous one: it would "
                      "turn %s off (the server was started with it; restart to turn it off)",
                      self.web_config_file, " and ".join(lost))
            self._reload_ok = False
            return False
        self._apply(cfg)
        self._reload_ok = True
        self._reload_ts = time.time()
        log.info("web config reloaded from %s (TLS %s, basic auth %s)", self.web_config_file,
                 "on" if cfg.tls else "off", "on" if cfg.auth else "off")
        return True

    @property
    def web_config(self) -> webconfig.WebConfig:
        return self._web_config

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Load the web config (ConfigError when bad), bind, start accepting."""
        if self.web_config_file:
            self._apply(webconfig.load(self.web_config_file))
            self._reload_ts = time.time()
        self._started_with = (self._web_config.tls is not None,
                              self._web_config.auth is not None)
        host, port = parse_listen(self.listen, self.listen_option)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._sock = socket.create_server((host, port), family=family, backlog=128)
        except OSError as exc:
            raise ConfigError(f"{self.listen_option} {self.listen}: cannot bind: "
                              f"{exc.strerror or exc}") from exc
        # accept() blocks: stop() shuts the socket down, which wakes it at once on Linux, so
        # there it has no timeout (a wake-up of an idle thread costs cold caches: 0.06 ms of
        # CPU a second for a 2 s timeout, 4% of one target polled every second; issue 15).
        # Elsewhere the timeout is the fallback: the thread wakes every 2 s to see a stop.
        self._sock.settimeout(None if sys.platform.startswith("linux") else 2.0)
        self._thread = threading.Thread(target=self._accept_loop, name="specwatch-http",
                                        daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        assert self._sock is not None, "start() first"
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    @property
    def scheme(self) -> str:
        return "https" if self._web_config.tls else "http"

    def stats(self) -> WebStats:
        s = self._stats
        with s.lock:
            return WebStats(rejected=dict(s.rejected), in_flight=s.in_flight,
                            connections=s.connections, tls=self._web_config.tls is not None,
                            web_config_reload_success=self._reload_ok,
                            web_config_reload_timestamp=self._reload_ts)

    def stop(self) -> None:
        """Stop accepting, close open connections, let running handlers finish."""
        self._stop.set()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        with self._conns_lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- internals -------------------------------------------------------------------------
    def _release_slot(self) -> None:
        with self._stats.lock:
            self._stats.in_flight -= 1

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, addr = self._sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return
                log.warning("accept failed: %s", exc)
                time.sleep(0.05)  # e.g. EMFILE: do not spin
                continue
            if self._stop.is_set():  # accepted while stopping
                with contextlib.suppress(OSError):
                    conn.close()
                return
            s = self._stats
            client = str(addr[0])
            per_client = min(self.limits.max_connections_per_client,
                             self.limits.max_connections)
            with s.lock:
                refused = ("connection_limit" if s.connections >= self.limits.max_connections
                           else "client_connection_limit"
                           if s.per_client.get(client, 0) >= per_client else None)
                if refused is None:
                    s.connections += 1
                    s.per_client[client] = s.per_client.get(client, 0) + 1
            if refused is not None:
                s.reject(refused)
                with contextlib.suppress(OSError):
                    conn.close()
                continue
            try:
                threading.Thread(target=self._serve_connection, args=(conn, addr),
                                 name="specwatch-conn", daemon=True).start()
            except RuntimeError:  # cannot start a thread: shed this connection
                s.closed(client)
                conn.close()

    def _serve_connection(self, conn: socket.socket, addr: tuple) -> None:
        cfg = self._web_config  # one config for the whole connection's TLS setup
        sock: socket.socket = conn
        with self._conns_lock:
            self._conns.add(conn)
        try:
            if cfg.tls is not None:
                tls = _handshake(conn, cfg.tls, self.limits.handshake_timeout)
                if tls is None:
                    self._stats.reject("tls_handshake")
                    return
                sock = tls  # the TLS socket now owns the file descriptor
                with self._conns_lock:
                    self._conns.discard(conn)
                    self._conns.add(sock)
            _RequestHandler(sock, addr, self, _Deadline())
        except Exception as exc:  # one broken connection never escapes its thread
            log.debug("connection from %s failed: %s", addr, exc)
        finally:
            with contextlib.suppress(OSError):
                sock.close()
            with self._conns_lock:
                self._conns.discard(sock)
                self._conns.discard(conn)
            self._stats.closed(str(addr[0]))


def _handshake(conn: socket.socket, tls: webconfig.TLSServer,
               timeout: float) -> ssl.SSLSocket | None:
    """A server-side TLS handshake with a total deadline; None (socket closed) when it fails
    or overruns."""
    deadline = time.monotonic() + timeout
    try:
        conn.setblocking(False)
        s = tls.context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
    except (OSError, ValueError) as exc:
        log.debug("TLS setup failed: %s", exc)
        with contextlib.suppress(OSError):
            conn.close()
        return None
    try:
        return _drive_handshake(s, tls, timeout, deadline)
    finally:
        if s.fileno() != -1 and s.gettimeout() == 0.0:  # failed: still non-blocking
            with contextlib.suppress(OSError):
                s.close()


def _drive_handshake(s: ssl.SSLSocket, tls: webconfig.TLSServer, timeout: float,
                     deadline: float) -> ssl.SSLSocket | None:
    with selectors.DefaultSelector() as sel:
        while True:
            try:
                s.do_handshake()
                break
            except ssl.SSLWantReadError:
                events = selectors.EVENT_READ
            except ssl.SSLWantWriteError:
                events = selectors.EVENT_WRITE
            except (OSError, ValueError) as exc:  # bad certificate, plain HTTP, reset...
                log.debug("TLS handshake failed: %s", exc)
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                log.debug("TLS handshake did not finish within %gs", timeout)
                return None
            sel.register(s, events)
            ready = sel.select(left)
            sel.unregister(s)
            if not ready and deadline - time.monotonic() <= 0:
                log.debug("TLS handshake did not finish within %gs", timeout)
                return None
    if tls.allowed_sans is not None:
        sans = webconfig.peer_sans(s.getpeercert())
        if not any(v in tls.allowed_sans for v in sans):
            log.debug("client certificate SANs %s not in client_allowed_sans", sans)
            return None
    s.setblocking(True)
    return s
