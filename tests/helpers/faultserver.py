"""A raw-socket fake target whose behaviour the test switches between polls.

Unlike :mod:`helpers.pageserver` (well-formed HTTP), this server can misbehave at the
transport level: refuse connections (its listening socket is closed and later re-opened on
the same port), accept and never answer, trickle a body, send raw bytes (a truncated
transfer, a body larger than announced, a gzip bomb). It binds 127.0.0.1 on a free port.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Serve:
    """A normal response (Content-Length set, connection closed after it)."""

    body: bytes
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Raw:
    """Send these bytes as the whole response, then close."""

    data: bytes


@dataclass(frozen=True)
class Blackhole:
    """Accept, read nothing, answer nothing (until the server stops)."""


@dataclass(frozen=True)
class Trickle:
    """Headers, then ``body`` one byte every ``interval`` seconds."""

    body: bytes
    interval: float = 1.0


@dataclass(frozen=True)
class TrickleHeaders:
    """A status line, then one header line every ``interval`` seconds, never ending the
    headers (each read returns data, so per-read timeouts never fire)."""

    interval: float = 0.5


@dataclass(frozen=True)
class Endless:
    """Headers without a length, then ``piece`` bytes after bytes until the client leaves."""

    piece: bytes = b"[" * 65536


@dataclass(frozen=True)
class Refuse:
    """No listener: connections are refused."""


Behaviour = Serve | Raw | Blackhole | Trickle | TrickleHeaders | Endless | Refuse


def http_response(body: bytes, status: int = 200, headers: dict[str, str] | None = None,
                  content_length: int | None = None) -> bytes:
    reason = {200: "OK", 500: "Internal Server Error", 503: "Service Unavailable"}.get(
        status, "Status")
    lines = [f"HTTP/1.1 {status} {reason}", "Content-Type: text/plain; version=0.0.4",
             f"Content-Length: {len(body) if content_length is None else content_length}",
             "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class FaultServer:
    def __init__(self, behaviour: Behaviour) -> None:
        self._behaviour = behaviour
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self.port = 0
        self.requests = 0
        #: The request head (request line and headers) of every connection, in order.
        self.heads: list[bytes] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def set(self, behaviour: Behaviour) -> None:
        """Switch behaviour for the next connection (closing or opening the listener)."""
        with self._lock:
            self._behaviour = behaviour
        if isinstance(behaviour, Refuse):
            self._close_listener()
        elif self._listener is None:
            self._open_listener()

    def _open_listener(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(128)
        s.settimeout(0.05)
        self.port = s.getsockname()[1]
        self._listener = s
        self._thread = threading.Thread(target=self._accept, args=(s,), daemon=True)
        self._thread.start()

    def _close_listener(self) -> None:
        s, self._listener = self._listener, None
        if s is not None:
            s.close()
            if self._thread is not None:
                self._thread.join(2)

    def start(self) -> FaultServer:
        self._open_listener()
        if isinstance(self._behaviour, Refuse):
            self._close_listener()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._close_listener()
        for c in list(self._conns):
            with contextlib.suppress(OSError):
                c.close()

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept(self, listener: socket.socket) -> None:
        while not self._stop.is_set() and self._listener is listener:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _read_request(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                return
            data += chunk
        self.heads.append(data.partition(b"\r\n\r\n")[0])

    def _serve(self, conn: socket.socket) -> None:
        self._conns.add(conn)
        with self._lock:
            b = self._behaviour
            self.requests += 1
        try:
            if isinstance(b, Blackhole):
                self._stop.wait(30)
                return
            self._read_request(conn)
            conn.settimeout(30)
            if isinstance(b, Serve):
                conn.sendall(http_response(b.body, b.status, b.headers))
            elif isinstance(b, Raw):
                conn.sendall(b.data)
            elif isinstance(b, Trickle):
                conn.sendall(http_response(b"", content_length=len(b.body)))
                for i in range(len(b.body)):
                    if self._stop.wait(b.interval):
                        return
                    conn.sendall(b.body[i:i + 1])
            elif isinstance(b, Endless):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Connection: close\r\n\r\n")
                while not self._stop.is_set():
                    conn.sendall(b.piece)
            elif isinstance(b, TrickleHeaders):
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                i = 0
                while not self._stop.wait(b.interval):
                    i += 1
                    conn.sendall(b"X-Trickle-%d: x\r\n" % i)
            time.sleep(0.01)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
            self._conns.discard(conn)
