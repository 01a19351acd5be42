"""The direct transport's usual response, read from the socket, is the library's.

Protected behaviour: :mod:`specwatch.poll.fetch.httpfast` reads an ``HTTP/1.1 200`` head with
plain header lines and a ``Content-Length`` body itself, and hands every other head to
``http.client`` with the bytes it read put back in front of the socket. For generated
responses (status lines, header lines with odd characters and the framing headers given
right, wrong, twice or not at all, bodies plain or chunked), delivered in arbitrary pieces
and then ending (the server closes) or stalling (the server sends nothing more: the
socket's timeout), the outcome equals the library's reading the same socket: the same
exception (type and text), or the same status, framing, header values, body bytes read
with ``read1`` and what is left of the body. A stalling server shows that the fast path
never waits for a byte the library would not wait for. Then: the usual heads take the fast
path (so the comparison is not the library against itself), a poll on a real socket reads
its usual answer without the library, and bytes past the body close the connection.
"""

from __future__ import annotations

import http.client
import io
import socket
from typing import Any

import pytest
from helpers.directpoll import poll_direct
from helpers.scriptserver import Reply, ScriptServer, chunked, response
from hypothesis import example, given, settings
from hypothesis import strategies as st

from specwatch.poll.fetch import httpfast, httpheaders

#: A real vLLM (uvicorn) head; ``{n}`` is the body's length.
UVICORN = (b"HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 17:00:00 GMT\r\nserver: uvicorn\r\n"
           b"content-length: {n}\r\ncontent-type: text/plain; version=1.0.0; charset=utf-8"
           b"\r\n\r\n")
#: Headers whose values the transport reads or the framing depends on.
NAMES = ("Content-Length", "Content-Encoding", "Transfer-Encoding", "Connection", "Location",
         "content-type", "X-A")


class Wire:
    """A connected socket stand-in: ``recv`` hands out ``pieces`` in order (each cut to the
    size asked for), then, for ever, end of stream (``end="eof"``: the server closed) or
    the socket's timeout (``"stall"``: the server sends nothing more). Its ``makefile`` is
    the standard library's socket stream over it, as a socket's is."""

    def __init__(self, pieces: list[bytes], end: str) -> None:
        self.pieces = [p for p in pieces if p]
        self.end = end

    def recv(self, n: int) -> bytes:
        if not self.pieces:
            if self.end == "stall":
                raise TimeoutError("timed out")
            return b""
        piece = self.pieces[0]
        if len(piece) > n:
            self.pieces[0] = piece[n:]
            return piece[:n]
        self.pieces.pop(0)
        return piece

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        data = self.recv(nbytes or len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def makefile(self, mode: str = "rb", buffering: int | None = None) -> Any:
        raw = socket.SocketIO(self, "rb")  # type: ignore[arg-type]
        return raw if buffering == 0 else io.BufferedReader(raw, io.DEFAULT_BUFFER_SIZE)

    def _decref_socketios(self) -> None:  # what SocketIO.close calls on its socket
        pass


class Conn:
    """The connection a :class:`~specwatch.poll.fetch.httpfast.FastResponse` may close."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _read_all(resp: Any) -> tuple[bytes, object, object]:
    """``read1`` until ``b""`` (or an exception): the bytes, the exception (type, text) or
    None, and ``length`` after."""
    out = []
    try:
        for _ in range(10_000):
            data = resp.read1(7)
            if not data:
                break
            out.append(data)
        error = None
    except Exception as exc:
        error = (type(exc), str(exc))
    return b"".join(out), error, resp.length


def _state(resp: Any) -> dict[str, object]:
    return {"status": resp.status, "will_close": resp.will_close, "length": resp.length,
            **{name: resp.getheader(name) for name in NAMES},
            "default": resp.getheader("X-Absent", "dflt"), "read": _read_all(resp)}


def library(pieces: list[bytes], end: str) -> object:
    """What ``http.client`` makes of the stream."""
    resp = http.client.HTTPResponse(Wire(pieces, end), method="GET")  # type: ignore[arg-type]
    try:
        resp.begin()
    except Exception as exc:
        return type(exc), str(exc)
    return _state(resp)


def fast(pieces: list[bytes], end: str) -> tuple[object, bool]:
    """What the transport makes of it, and whether the fast path read it."""
    wire = Wire(pieces, end)
    try:
        head, data = httpfast.read_head(wire)  # type: ignore[arg-type]
    except Exception as exc:
        return (type(exc), str(exc)), False
    if head is not None:
        return _state(httpfast.FastResponse(Conn(), wire, head[0], head[1], data)), True  # type: ignore[arg-type]
    resp = http.client.HTTPResponse(httpfast.ReplayedSocket(wire, data),  # type: ignore[arg-type]
                                    method="GET")
    try:
        resp.begin()
    except Exception as exc:
        return (type(exc), str(exc)), False
    return _state(resp), False


STATUS = st.sampled_from([
    b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 200\r\n", b"HTTP/1.1 200 \r\n", b"HTTP/1.1 200 \x85x\r\n",
    b"HTTP/1.0 200 OK\r\n", b"HTTP/1.1 404 Not Found\r\n", b"HTTP/1.1 301 Moved\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n", b"HTTP/1.1  200 OK\r\n",
    b"HTTP/1.1 200 OK\n", b"HTTP/1.1 200 OK\r\r\n", b"HELLO THERE\r\n", b"\r\n", b"",
    b"HTTP/1.1 2000 OK\r\n", b"HTTP/1.1 200OK\r\n", b"http/1.1 200 OK\r\n",
    b"HTTP/1.2 200 OK\r\n", b" HTTP/1.1 200 OK\r\n"])
#: ``{n}`` becomes the body's length.
FRAMING = st.sampled_from([
    b"Content-Length: {n}\r\n", b"content-length: {n}\r\n", b"Content-Length:{n}\r\n",
    b"Content-Length:  {n}  \r\n", b"Content-Length: +{n}\r\n", b"Content-Length: 0{n}\r\n",
    b"Content-Length: 3\r\n", b"Content-Length: 500\r\n", b"Content-Length: -1\r\n",
    b"Content-Length: \xb2\r\n", b"Content-Length: 1_0\r\n", b"Content-Length:\r\n",
    b"Transfer-Encoding: chunked\r\n", b"Transfer-Encoding: gzip\r\n",
    b"Connection: close\r\n", b"Connection: Keep-Alive, CLOSE\r\n", b"Connection: keep-alive\r\n",
    b"Content-Encoding: gzip\r\n", b"Location: /elsewhere\r\n", b"X-A: a\r\n", b"X-A:  b \r\n",
    b"X-A: caf\xe9\r\n"])
ODD = st.one_of(
    st.tuples(st.binary(max_size=6), st.binary(max_size=10),
              st.sampled_from([b"\r\n", b"\n", b"\r", b""])).map(
        lambda p: p[0].replace(b":", b"") + b":" + p[1] + p[2]),
    st.sampled_from([b" folded\r\n", b"\tfolded\r\n", b"no colon\r\n", b": no name\r\n",
                     b"From x\r\n", b"A: x\x00y\r\n", b"A: x\x7fy\r\n", b"A: x\x0by\r\n"]))
LINE = st.one_of(FRAMING, FRAMING, ODD)
END = st.sampled_from([b"\r\n", b"\r\n", b"\n", b""])


@st.composite
def responses(draw: st.DrawFn) -> tuple[list[bytes], str]:
    body = draw(st.binary(max_size=40))
    if draw(st.booleans()):
        body = chunked(body, 9, complete=draw(st.booleans()))
    lines = draw(st.lists(LINE, max_size=6))
    if draw(st.booleans()):  # mostly a right Content-Length: the fast path's own ground
        lines.insert(draw(st.integers(0, len(lines))), b"Content-Length: {n}\r\n")
    extra = draw(st.sampled_from([b"", b"", b"NEXT"]))  # bytes after the body
    status = draw(st.one_of(st.just(b"HTTP/1.1 200 OK\r\n"), STATUS))
    wire = (status + b"".join(line.replace(b"{n}", b"%d" % len(body)) for line in lines)
            + draw(END) + body + extra)
    cuts = sorted(draw(st.lists(st.integers(0, len(wire)), max_size=4)))
    pieces = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]
    return pieces, draw(st.sampled_from(["eof", "stall"]))


@settings(max_examples=1500, deadline=None)
@given(responses())
@example(([UVICORN.replace(b"{n}", b"4") + b"BODY"], "stall"))
@example(([UVICORN.replace(b"{n}", b"4")[:30], UVICORN.replace(b"{n}", b"4")[30:] + b"BO"],
          "eof"))
@example(([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nabNEXT"], "stall"))
@example(([b"HELLO THERE\r\n"], "stall"))
@example(([b"HTTP/1.1 200 OK\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(101))], "stall"))
@example(([b"HTTP/1.1 200 OK\r\nX-A: a\r\nContent-Length: 2\r\nX-A: b\r\n\r\nab"], "eof"))
@example(([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n"
           b"1\r\na\r\n0\r\n\r\n"], "stall"))
@example(([b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\nab"], "eof"))
@example(([b"HTTP/1.1 200 OK\nContent-Length: 2\n\nab"], "stall"))
@example(([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n", b"\r"], "stall"))
def test_the_same_outcome_as_the_library(case: tuple[list[bytes], str]) -> None:
    pieces, end = case
    ours, _fast = fast(list(pieces), end)
    assert ours == library(list(pieces), end)


@pytest.mark.parametrize("head", [
    UVICORN.replace(b"{n}", b"5"),
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
    b"HTTP/1.1 200\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Encoding: gzip\r\nX-A: caf\xe9\r\n\r\n",
], ids=["uvicorn", "minimal", "keep_alive", "encoded"])
def test_the_usual_heads_take_the_fast_path(head: bytes) -> None:
    for pieces in ([head + b"hello"], [head[:9], head[9:-1], head[-1:] + b"hel", b"lo"]):
        ours, was_fast = fast(pieces, "stall")
        assert was_fast
        assert ours["read"] == (b"hello", None, 0)  # type: ignore[index]


@pytest.mark.parametrize("head", [
    b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\n",
    b"HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n folded\r\n\r\n",
    b"HTTP/1.1 200 OK\nContent-Length: 5\n\n",
    b"HTTP/1.1 200 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(99))
    + b"Content-Length: 5\r\n\r\n",
], ids=["http10", "not_found", "chunked", "close", "length_twice", "folded", "bare_lf",
        "no_length", "too_many_headers"])
def test_other_heads_go_to_the_library(head: bytes) -> None:
    head_and_body = head + b"hello"
    wire = Wire([head_and_body], "eof")
    got, data = httpfast.read_head(wire)  # type: ignore[arg-type]
    assert got is None and data == head_and_body  # every byte read is handed over


def test_a_head_past_the_limit_goes_to_the_library() -> None:
    """A head that never ends (a header line of 70,000 bytes) is handed over at the limit,
    and the library raises its own error, as it would reading the socket itself."""
    wire_bytes = b"HTTP/1.1 200 OK\r\nX-A: " + b"x" * 70_000 + b"\r\n\r\n"
    ours, was_fast = fast([wire_bytes], "stall")
    assert not was_fast
    assert ours == library([wire_bytes], "stall")
    assert ours[0] is http.client.LineTooLong  # type: ignore[index]


def test_bytes_past_the_body_close_the_connection() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    for tail, closed in ((b"", False), (b"NEXT", True)):
        wire, conn = Wire([head + b"hello" + tail], "stall"), Conn()
        got, data = httpfast.read_head(wire)  # type: ignore[arg-type]
        assert got is not None
        resp = httpfast.FastResponse(conn, wire, got[0], got[1], data)  # type: ignore[arg-type]
        assert _read_all(resp) == (b"hello", None, 0)
        resp.close()
        resp.close()
        assert conn.closed is closed


def test_a_poll_reads_the_usual_answer_without_the_library(monkeypatch) -> None:
    """Two polls of a server answering like vLLM, on one keep-alive connection, never
    start the library's response; an answer of another shape (chunked) still does."""
    begun = []
    real = httpheaders.Response.begin
    monkeypatch.setattr(httpheaders.Response, "begin",
                        lambda self: begun.append(self) or real(self))
    page = b"vllm:num_requests_running 1\n" * 3000
    routes = {"/metrics": response(page),
              "/chunked": response(chunked(page), headers={"Transfer-Encoding": "chunked"}),
              "/extra": Reply(response(page).data + b"NEXT")}
    with ScriptServer(routes) as srv:
        for path, begins, connections in (("/metrics", 0, 1), ("/chunked", 2, 1),
                                          ("/extra", 0, 2)):
            begun.clear()
            before = srv.connections
            assert poll_direct(srv.url(path)) == [page.decode()] * 2
            assert len(begun) == begins, path
            # bytes past the body: the next poll opens a new connection
            assert srv.connections - before == connections, path


def test_a_head_trickled_a_byte_at_a_time() -> None:
    """Every byte in a piece of its own (a server trickling its answer): the same outcome as
    the library's, on the fast path for the usual head and through the library for one
    with a bare LF, too many lines (ended or not) or another status line, whichever way
    the stream ends (a stall shows a wait the library would not make)."""
    usual = UVICORN.replace(b"{n}", b"5") + b"hello"
    bare_lf = b"HTTP/1.1 200 OK\r\nContent-Length: 5\n\r\n\r\nhello"
    many = b"HTTP/1.1 200 OK\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(120))
    bad_status = b"HELLO THERE\r\nContent-Length: 5\r\n"
    for wire_bytes, expect_fast in ((usual, True), (bare_lf, False), (many, False),
                                    (many + b"\r\n", False), (bad_status, False)):
        pieces = [wire_bytes[i:i + 1] for i in range(len(wire_bytes))]
        for end in ("eof", "stall"):
            ours, was_fast = fast(list(pieces), end)
            assert ours == library(list(pieces), end)
            assert was_fast is expect_fast
