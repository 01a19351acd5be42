"""A raw-socket HTTP server answering each path with scripted bytes, keep-alive included.

Unlike :mod:`helpers.faultserver` (one behaviour, one response per connection), each
connection here may carry several requests: the reply for a path says whether the
connection stays open after it, so tests see how a client reuses connections (``connections``
counts the accepted ones, ``heads`` records every request head). A reply may also be a
function of the request's number on its connection (0, 1, ...), e.g. to close a reused
connection without answering. Plain HTTP, or TLS with ``ssl_context``; binds ``host`` on a
free port.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Reply:
    """Send ``data`` (a whole raw response); then close the connection when ``close``.
    ``data=b""`` with ``close`` closes without answering. With ``interval``, ``data`` is
    sent ``piece`` bytes at a time, one piece every ``interval`` seconds."""

    data: bytes
    close: bool = False
    interval: float = 0.0
    piece: int = 1


def response(body: bytes, status: int = 200, headers: dict[str, str] | None = None,
             content_length: int | None = None, close: bool = False,
             version: str = "HTTP/1.1") -> Reply:
    """A well-formed response (Content-Length unless a Transfer-Encoding header is given)."""
    lines = [f"{version} {status} {'OK' if status == 200 else 'Status'}",
             "Content-Type: text/plain; version=0.0.4"]
    headers = dict(headers or {})
    if "Transfer-Encoding" not in headers:
        lines.append(f"Content-Length: {len(body) if content_length is None else content_length}")
    if close:
        lines.append("Connection: close")
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return Reply(("\r\n".join(lines) + "\r\n\r\n").encode() + body, close=close)


def chunked(body: bytes, size: int = 4000, complete: bool = True) -> bytes:
    """``body`` in chunked transfer coding (without its last chunk unless ``complete``)."""
    out = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size])
                   for i in range(0, len(body), size))
    return out + (b"0\r\n\r\n" if complete else b"")


Route = Reply | Callable[[int], Reply]


class ScriptServer:
    def __init__(self, routes: dict[str, Route], host: str = "127.0.0.1",
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.routes = routes
        self.host = host
        self.ssl_context = ssl_context
        self.connections = 0
        self.heads: list[bytes] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._socks: set[socket.socket] = set()
        self._listener = socket.create_server((host, 0))
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def url(self, path: str = "/metrics", host: str | None = None) -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://{host or self.host}:{self.port}{path}"

    def __enter__(self) -> ScriptServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)
        self._listener.close()
        for s in list(self._socks):
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        self._socks.add(conn)
        try:
            conn.settimeout(10)
            if self.ssl_context is not None:
                conn = self.ssl_context.wrap_socket(conn, server_side=True)
                self._socks.add(conn)
            with self._lock:
                self.connections += 1
            buf = b""
            for n in range(1000):
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                with self._lock:
                    self.heads.append(head)
                path = head.split(b" ", 2)[1].decode()
                route = self.routes.get(path, response(b"not here\n", 404))
                reply = route(n) if callable(route) else route
                if reply.interval:
                    for i in range(0, len(reply.data), reply.piece):
                        if self._stop.wait(reply.interval):
                            return
                        conn.sendall(reply.data[i:i + reply.piece])
                elif reply.data:
                    conn.sendall(reply.data)
                if reply.close:
                    return
        except (OSError, ssl.SSLError, IndexError):
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
            self._socks.discard(conn)
