"""The direct transport's header parser gives http.client's messages.

Protected behaviour: ``specwatch.poll.fetch.httpheaders.parse_headers`` (plain header blocks
without the email parser) returns a message equal in every attribute to
``http.client.parse_headers`` and consumes the same bytes, on generated header blocks
(names and values over the characters that matter: colons, blanks, CR, LF, vertical tab,
form feed, NEL, Latin-1, folded lines, envelope lines, no blank line at the end) and on the
library's limits (too long a line, too many headers). The direct transport's responses use
it, and ``begin`` is the library's own code (it still calls ``parse_headers``).
"""

from __future__ import annotations

import http.client
import io

import pytest
from helpers.directpoll import poll_direct
from helpers.scriptserver import ScriptServer, chunked, response
from hypothesis import example, given, settings
from hypothesis import strategies as st

from specwatch.poll.fetch import direct as fetchdirect
from specwatch.poll.fetch import httpheaders

CHARS = st.sampled_from(list(b"aZ-_:; \t\r\n\x0b\x0c\x1c\x85\xa0\xe9\x00\x7f!~") +
                        [ord("F")] * 3)
LINE = st.one_of(
    # name: value, with odd characters in either part
    st.tuples(st.binary(min_size=0, max_size=8), st.binary(max_size=12),
              st.sampled_from([b"\r\n", b"\n", b"\r", b""])).map(
        lambda p: p[0].replace(b":", b"") + b":" + p[1] + p[2]),
    st.lists(CHARS, max_size=14).map(bytes).map(lambda b: b + b"\r\n"),
    st.sampled_from([b"From x\r\n", b" folded\r\n", b"\tfolded\r\n", b"no colon\r\n",
                     b": no name\r\n", b"Content-Length: 12\r\n", b"Connection: close\r\n",
                     b"X-A:  spaced  \r\n", b"X-B:\r\n", b"X-C: caf\xe9\r\n",
                     b"Transfer-Encoding: chunked\r\n", b"From: me\r\n"]),
)
END = st.sampled_from([b"\r\n", b"\n", b""])


def comparable(msg: http.client.HTTPMessage) -> dict:
    """Every attribute of a message; defects (exceptions: equal only to themselves) by
    type and text."""
    state = dict(vars(msg))
    state["defects"] = [(type(d), str(d)) for d in msg.defects]
    return state


def both(block: bytes) -> tuple[object, object, bytes, bytes]:
    """Each parser's message (or exception type) and the bytes left in its stream."""
    out = []
    for parse in (httpheaders.parse_headers, http.client.parse_headers):
        fp = io.BytesIO(block)
        try:
            msg: object = comparable(parse(fp))
        except http.client.HTTPException as exc:
            msg = type(exc)
        out.append((msg, fp.read()))
    (a, rest_a), (b, rest_b) = out
    return a, b, rest_a, rest_b


@settings(max_examples=400, deadline=None)
@given(st.lists(LINE, max_size=8), END, st.binary(max_size=6))
@example([b"date: Tue, 01 Dec 2026 17:00:00 GMT\r\n", b"server: uvicorn\r\n",
          b"content-length: 55123\r\n",
          b"content-type: text/plain; version=1.0.0; charset=utf-8\r\n"], b"\r\n", b"BODY")
@example([b"A: x\r\n", b" y\r\n"], b"\r\n", b"")
@example([b"A: x\rB: y\r\n"], b"\r\n", b"")
@example([b"A: x\x85y\r\n"], b"\r\n", b"")
@example([b"A: b\r\n", b"a b: c\r\n"], b"\r\n", b"")
def test_same_message_as_the_library(lines, end, body):
    a, b, rest_a, rest_b = both(b"".join(lines) + end + body)
    assert a == b
    assert rest_a == rest_b


def test_plain_blocks_skip_the_email_parser(monkeypatch):
    """vLLM's header block (and any plain one) never reaches the email parser; a folded
    line does (so the test above compares the fast path, not the library with itself)."""
    calls = []
    real = httpheaders.email.parser.Parser.parsestr
    monkeypatch.setattr(httpheaders.email.parser.Parser, "parsestr",
                        lambda self, text, *a: calls.append(text) or real(self, text, *a))
    plain = (b"date: Tue, 01 Dec 2026 17:00:00 GMT\r\nserver: uvicorn\r\n"
             b"content-length: 55123\r\ncontent-type: text/plain; version=0.0.4\r\n\r\n")
    msg = httpheaders.parse_headers(io.BytesIO(plain))
    assert calls == [] and msg["content-length"] == "55123"
    httpheaders.parse_headers(io.BytesIO(b"A: x\r\n y\r\n\r\n"))
    assert len(calls) == 1


@pytest.mark.parametrize("block", [
    b"A: " + b"x" * 70000 + b"\r\n\r\n",
    b"".join(b"H%d: v\r\n" % i for i in range(101)) + b"\r\n",
], ids=["line-too-long", "too-many-headers"])
def test_the_library_limits_hold(block):
    for parse in (httpheaders.parse_headers, http.client.parse_headers):
        with pytest.raises(http.client.HTTPException):
            parse(io.BytesIO(block))


def test_begin_is_the_library_code_reading_headers_with_the_fast_parser():
    begin = httpheaders.Response.begin
    assert begin.__code__ is http.client.HTTPResponse.begin.__code__
    assert "parse_headers" in begin.__code__.co_names
    assert begin.__globals__["parse_headers"] is httpheaders.parse_headers
    assert http.client.parse_headers is not httpheaders.parse_headers  # nothing patched
    for conn in (fetchdirect._DirectHTTPConnection, fetchdirect._DirectHTTPSConnection):
        assert conn.response_class is httpheaders.Response


def test_a_poll_reads_its_headers_with_the_fast_parser(monkeypatch):
    """A direct-transport poll whose answer the library reads (chunked here: the usual
    Content-Length answer is read by specwatch.poll.fetch.httpfast, tests/poll/test_http_fast.py)
    parses its response headers with httpheaders.parse_headers and gets the body, twice on
    one keep-alive connection."""
    page = b"vllm:num_requests_running 1\n"
    seen = []
    real = httpheaders.plain_message
    monkeypatch.setattr(httpheaders, "plain_message",
                        lambda lines, cls=http.client.HTTPMessage: seen.append(lines)
                        or real(lines, cls))
    with ScriptServer({"/metrics": response(chunked(page),
                                            headers={"Transfer-Encoding": "chunked"})}) as srv:
        assert poll_direct(srv.url()) == [page.decode()] * 2
    assert srv.connections == 1
    assert len(seen) == 2
    assert any(line.lower().startswith(b"transfer-encoding:") for line in seen[0])
