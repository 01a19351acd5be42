"""The connection's transport: deadline-enforcing socket adapters and the TLS handshake.

`http.server` only has per-`recv` socket timeouts (one byte every few seconds would hold a
thread forever), so a connection's reads and writes go through `DeadlineReader` and
`DeadlineWriter`, which share one `Deadline`: every read and write completes before it or raises
`TimeoutError`. `handshake` drives a server-side TLS handshake non-blocking under a total
deadline, in the connection's own thread (never on the accept loop), and checks the client
certificate's SANs. Parsing stays `http.server`'s.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import selectors
import socket
import ssl
import time
from collections.abc import Callable

from specwatch.web import webconfig

__all__ = ["Deadline", "DeadlineReader", "DeadlineWriter", "handshake"]

log = logging.getLogger(__name__)


class Deadline:
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


class DeadlineReader(io.RawIOBase):
    """Buffered-reader source: each read waits at most until the deadline; the first byte
    of a request starts that request's own deadline."""

    def __init__(self, sock: socket.socket, deadline: Deadline,
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


class DeadlineWriter(io.RawIOBase):
    """Unbuffered writer: every write completes before the deadline or raises."""

    def __init__(self, sock: socket.socket, deadline: Deadline) -> None:
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


def handshake(conn: socket.socket, tls: webconfig.TLSServer,
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
