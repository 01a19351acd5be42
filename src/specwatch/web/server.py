"""The exporter's HTTP server behind a small, stable interface.

``WebServer(listen, routes)`` where ``routes`` maps a path to ``handler(Request) -> Response``
(:mod:`specwatch.web.routing`). Every route gets the same protection, applied to each
request in one order: strict framing (no request smuggling), authentication before any
shared resource is taken, the in-flight slot, the rate limit, then the handler under the
request's deadline. Every connection gets the connection caps (in all and per client
address), deadlines on every read and write and a TLS handshake off the accept loop
(:mod:`specwatch.web.transport`). The guarantees, one by one, are in docs/security.md ("What
the HTTP server guarantees"); the limits in :mod:`specwatch.web.limits`.

Web config (:mod:`specwatch.web.webconfig`): TLS, client certificates, basic auth, security
headers, rate limit. :meth:`WebServer.reload_web_config` swaps it atomically (SIGHUP) and
fails closed. Owns the accept loop, the request handler and the server's lifecycle. May
import: the other ``specwatch.web`` modules, ``specwatch.common``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gzip
import http.client
import io
import logging
import socket
import sys
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from specwatch.common.errors import ConfigError
from specwatch.web import webconfig
from specwatch.web.limits import ConnectionCounters, ServerLimits, WebStats
from specwatch.web.negotiate import accepts_gzip
from specwatch.web.routing import MAX_REQUEST_BODY, Handler, Request, Response, run_handler
from specwatch.web.transport import Deadline, DeadlineReader, DeadlineWriter, handshake

log = logging.getLogger(__name__)


def parse_listen(listen: str, option: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:10440`` for IPv6, ``:10440`` for all interfaces). ``option``
    is the flag an error names (the demo's servers have their own)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{option}: expected HOST:PORT, got {listen!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)



class _RequestHandler(BaseHTTPRequestHandler):
    """http.server's parser over deadline-enforcing socket adapters."""

    server: WebServer  # type: ignore[assignment]
    protocol_version = "HTTP/1.1"
    server_version = "specwatch"
    sys_version = ""

    def __init__(self, sock: socket.socket, addr: tuple, server: WebServer,
                 deadline: Deadline) -> None:
        self._deadline = deadline
        super().__init__(sock, addr, server)  # type: ignore[arg-type]

    def setup(self) -> None:
        self.connection = self.request
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        self.rfile = io.BufferedReader(
            DeadlineReader(self.connection, self._deadline, self._timed_out), 65536)
        self.wfile = DeadlineWriter(self.connection, self._deadline)
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
            fut = srv._executor.submit(run_handler, handler, req)
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
        self._stats = ConnectionCounters()
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
        # there it has no timeout (waking an idle thread periodically costs CPU for nothing).
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
                tls = handshake(conn, cfg.tls, self.limits.handshake_timeout)
                if tls is None:
                    self._stats.reject("tls_handshake")
                    return
                sock = tls  # the TLS socket now owns the file descriptor
                with self._conns_lock:
                    self._conns.discard(conn)
                    self._conns.add(sock)
            _RequestHandler(sock, addr, self, Deadline())
        except Exception as exc:  # one broken connection never escapes its thread
            log.debug("connection from %s failed: %s", addr, exc)
        finally:
            with contextlib.suppress(OSError):
                sock.close()
            with self._conns_lock:
                self._conns.discard(sock)
                self._conns.discard(conn)
            self._stats.closed(str(addr[0]))

