"""The direct transport's usual response, read without ``http.client``'s stream objects.

A vLLM server answers a poll the same way every time: ``HTTP/1.1 200``, a few plain header
lines, a body framed by ``Content-Length``. :func:`read_head` reads that shape with ``recv``
on the socket and one regular expression, and :class:`FastResponse` serves the body from the
bytes already received, then from the socket. Anything else goes to the library, unchanged:
the bytes read so far are put back in front of the socket's own stream
(:class:`ReplayedSocket`), so the library reads exactly the bytes it would have read and
decides as it would.

Invariant: what the fast path gives is what the library's response gives for the same
bytes (status, ``getheader``, ``read1``); the one difference is on the connection. Which
answers go to the library, and why the two agree: docs/performance.md, "The direct
transport's response read". ``tests/poll/test_http_fast.py`` checks it against
``http.client`` on generated and hostile responses.
"""

from __future__ import annotations

import http.client
import io
import re
import socket
from typing import Any

from specwatch.poll.fetch import httpheaders

#: Bytes of head read, at most, before the library is left to decide (its own limits: a
#: line of 65,536 bytes, 100 lines).
HEAD_LIMIT = 65536
#: What one ``recv`` asks for: the head and, usually, the whole of a vLLM page's body.
RECV_SIZE = 65536
#: Header lines the library reads at most (``http.client._MAXHEADERS``, the blank line
#: counted); one more raises there.
_MAX_LINES = http.client._MAXHEADERS  # type: ignore[attr-defined]

#: The status line the library reads as version 11, status 200 (the reason is not read).
_STATUS_TEXT = rb"HTTP/1\.1 200(?: [^\r\n]*)?\r\n"
_STATUS = re.compile(_STATUS_TEXT)
_PLAIN_LINE = (rb"(" + httpheaders.HEADER_NAME + rb"):[ \t]*(" + httpheaders.HEADER_VALUE
               + rb")\r\n")
#: A plain header line (:data:`specwatch.poll.fetch.httpheaders.PLAIN`) ended by CRLF.
_PLAIN_CRLF = re.compile(_PLAIN_LINE)
#: The usual head: the status line, plain header lines, a blank line.
_HEAD = re.compile(_STATUS_TEXT + rb"((?:" + httpheaders.HEADER_NAME + rb":[ \t]*"
                   + httpheaders.HEADER_VALUE + rb"\r\n)*)\r\n")
_BARE_LF = re.compile(rb"(?<!\r)\n")
_DIGITS = re.compile(r"[0-9]+")
#: The headers the poll reads or the framing depends on: given twice, the library's
#: choice (the first, or all joined) is left to it.
_SINGLE = ("content-length", "transfer-encoding", "connection", "content-encoding")


class FastResponse:
    """A 200 response with a ``Content-Length`` body, read from the socket directly.

    Offers what the direct transport uses of ``http.client.HTTPResponse``: ``status``,
    ``length`` (body bytes not yet returned), ``will_close``, :meth:`getheader`,
    :meth:`read1`, :meth:`close`."""

    status = 200
    will_close = False

    def __init__(self, conn: http.client.HTTPConnection, sock: socket.socket,
                 headers: dict[str, list[str]], length: int, rest: bytes) -> None:
        self._conn = conn
        self._sock: socket.socket | None = sock
        self._headers = headers
        self.length = length
        #: Body bytes received with the head (at most ``length``; more closes the
        #: connection when the response is closed).
        self._rest = rest[:length]
        self._extra = len(rest) > length

    def getheader(self, name: str, default: Any = None) -> Any:
        """``HTTPResponse.getheader``: the value, several joined by ", ", else ``default``."""
        values = self._headers.get(name.lower())
        if not values:
            return default
        return values[0] if len(values) == 1 else ", ".join(values)

    def read1(self, n: int = -1) -> bytes:
        """At most ``n`` bytes of the body (all that is left when ``n`` < 0) with at most
        one ``recv``; ``b""`` once the body is complete or the stream ended early."""
        sock = self._sock
        if sock is None:
            return b""
        if n < 0 or n > self.length:
            n = self.length
        rest = self._rest
        if rest:
            data = rest if len(rest) <= n else rest[:n]
            self._rest = rest[len(data):]
        else:
            data = sock.recv(n) if n else b""
            if not data and n:
                self._sock = None  # the server closed the connection early
                return data
        self.length -= len(data)
        return data

    def close(self) -> None:
        """Done with the response: a server that sent more than the body loses its
        connection (see the module docstring); otherwise it carries the next poll."""
        self._sock = None
        if self._extra:
            self._extra = False
            self._conn.close()


class _Prefixed(io.RawIOBase):
    """A raw stream: ``prefix``, then ``raw`` (the socket's own ``SocketIO``)."""

    def __init__(self, prefix: bytes, raw: io.RawIOBase) -> None:
        super().__init__()
        self._prefix = memoryview(prefix)
        self._raw = raw

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int | None:
        p = self._prefix
        if p:
            n = min(len(b), len(p))
            b[:n] = p[:n]
            self._prefix = p[n:]
            return n
        return self._raw.readinto(b)

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


class ReplayedSocket:
    """Stands for the socket in ``http.client.HTTPResponse(sock)``: its ``makefile`` is the
    socket's own stream with the bytes already read from it in front, buffered as the
    socket's ``makefile("rb")`` is."""

    def __init__(self, sock: socket.socket, prefix: bytes) -> None:
        self._sock = sock
        self._prefix = prefix

    def makefile(self, mode: str = "rb") -> io.BufferedReader:
        if mode != "rb":
            raise ValueError(f"unsupported mode {mode!r}")
        raw = self._sock.makefile("rb", buffering=0)
        return io.BufferedReader(_Prefixed(self._prefix, raw))  # type: ignore[arg-type]


def read_head(sock: socket.socket) -> tuple[tuple[dict[str, list[str]], int] | None, bytes]:
    """Read a response head from ``sock``: ((headers, Content-Length), the bytes after the
    head) when it is the usual one; (None, every byte read) when the library must decide.

    Raises what the socket raises (a timeout, a reset), and, when the server closed the
    connection before the first byte, ``RemoteDisconnected`` with the library's message.
    A head that comes in pieces is checked piece by piece (each byte once), so a server
    trickling it a byte at a time costs time linear in its length, as with the library."""
    data = sock.recv(RECV_SIZE)
    if not data:
        raise http.client.RemoteDisconnected("Remote end closed connection without response")
    end = data.find(b"\r\n\r\n")
    if end < 0:
        buf = bytearray(data)
        scan = _Scan()
        while True:
            if not scan.may_continue(buf):
                return None, bytes(buf)
            more = sock.recv(RECV_SIZE)
            if not more:
                return None, bytes(buf)
            start = max(len(buf) - 3, 0)
            buf += more
            end = buf.find(b"\r\n\r\n", start)
            if end >= 0:
                break
        data = bytes(buf)
    head = _HEAD.fullmatch(data, 0, end + 4)
    if head is None:
        return None, data
    parsed = _headers(head.group(1))
    if parsed is None:
        return None, data
    return parsed, data[end + 4:]


class _Scan:
    """What the bytes of an unfinished head (no blank line yet) showed so far."""

    def __init__(self) -> None:
        self.done = 0  # bytes checked
        self.lines = 0  # line ends among them
        self.status = False  # the first line is complete and the usual status line

    def may_continue(self, buf: bytearray) -> bool:
        """Could ``buf`` still start the usual head, within the limits? When not, the
        library reads it (and decides) at once, without waiting for more."""
        if len(buf) >= HEAD_LIMIT:
            return False
        back = max(self.done - 1, 0)  # a CR at the end of the last piece
        if _BARE_LF.search(buf, back) is not None:
            return False
        if not self.status:
            first = buf.find(b"\r\n", back)
            if first >= 0:
                if _STATUS.fullmatch(buf, 0, first + 2) is None:
                    return False
                self.status = True
        self.lines += buf.count(b"\n", self.done)
        self.done = len(buf)
        return self.lines < _MAX_LINES


def _headers(block: bytes) -> tuple[dict[str, list[str]], int] | None:
    """The header lines of a usual head, by lowercase name, and its Content-Length; None
    when the library must decide (see the module docstring)."""
    lines = _PLAIN_CRLF.findall(block)  # the whole block: _HEAD matched it
    if len(lines) >= _MAX_LINES:
        return None
    headers: dict[str, list[str]] = {}
    for name, value in lines:
        headers.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))
    for name in _SINGLE:
        if len(headers.get(name, ())) > 1:
            return None
    if "transfer-encoding" in headers:
        return None
    connection = headers.get("connection")
    if connection and "close" in connection[0].lower():
        return None
    length = headers.get("content-length")
    if not length or _DIGITS.fullmatch(length[0]) is None:
        return None
    return headers, int(length[0])
