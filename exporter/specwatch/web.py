"""The exporter's HTTP server behind a small, stable interface.

``WebServer(listen, routes)`` where ``routes`` maps a path to ``handler(Request) -> Response``.
Handlers see plain data objects, not the http.server machinery, so the transport can later be
hardened (TLS, basic auth, a concurrency cap, read timeouts: the reliability issue) or
replaced without touching any handler, and new routes (the controller's Alertmanager receiver,
``POST``) are one more dict entry. A handler that raises gives a 500 for that request only.
"""

from __future__ import annotations

import gzip
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from specwatch.errors import ConfigError

log = logging.getLogger(__name__)

#: Largest request body a handler may receive (the Alertmanager webhook is a few kB).
MAX_REQUEST_BODY = 1024 * 1024


@dataclass(frozen=True)
class Request:
    """One HTTP request as a handler sees it (header names lower-case)."""

    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]
    body: bytes = b""


@dataclass(frozen=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Response]


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:10440`` for IPv6, ``:10440`` for all interfaces)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--listen: expected HOST:PORT, got {listen!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], routes: Mapping[str, Handler]) -> None:
        import socket

        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        self.routes = routes
        super().__init__(addr, _RequestHandler)


class _RequestHandler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "specwatch"

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s - %s", self.address_string(), format % args)

    def _handle(self) -> None:
        parts = urlsplit(self.path)
        handler = self.server.routes.get(parts.path)
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_REQUEST_BODY:
            self._send(Response(413, b"request body too large\n"), head=False)
            return
        body = self.rfile.read(length) if length > 0 else b""
        if handler is None:
            self._send(Response(404, b"not found\n"), head=self.command == "HEAD")
            return
        req = Request(method=self.command, path=parts.path, query=parse_qs(parts.query),
                      headers={k.lower(): v for k, v in self.headers.items()}, body=body)
        try:
            resp = handler(req)
        except Exception:
            log.exception("handler for %s failed", parts.path)
            resp = Response(500, b"internal error\n")
        self._send(resp, head=self.command == "HEAD",
                   gzip_ok="gzip" in req.headers.get("accept-encoding", ""))

    def _send(self, resp: Response, head: bool, gzip_ok: bool = False) -> None:
        body = resp.body
        headers = dict(resp.headers)
        if gzip_ok and len(body) > 1024 and resp.status == 200:
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        self.send_response(resp.status)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _handle  # noqa: N815


def only_get(handler: Handler) -> Handler:
    """Wrap a read-only handler: GET/HEAD pass, other methods get 405."""

    def wrapped(req: Request) -> Response:
        if req.method not in ("GET", "HEAD"):
            return Response(405, b"method not allowed\n", headers={"Allow": "GET, HEAD"})
        return handler(req)

    return wrapped


class WebServer:
    """A threaded HTTP server with a route table; ``address`` is the bound (host, port)."""

    def __init__(self, listen: str, routes: Mapping[str, Handler]) -> None:
        self.listen = listen
        self.routes: dict[str, Handler] = dict(routes)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        host, port = parse_listen(self.listen)
        try:
            self._server = _Server((host, port), self.routes)
        except OSError as exc:
            raise ConfigError(f"--listen {self.listen}: cannot bind: {exc.strerror}") from exc
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.2},
                                        name="specwatch-http", daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None, "start() first"
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
