"""Response headers for the direct fetch transport: http.client's, without the email parser
for plain header blocks.

Why: ``http.client`` parses every response's header block with the ``email`` package's
feed parser. It is general (folded lines, envelope lines, defects) and, at one poll a
second, it is the largest step of a poll's fetch after the socket calls (about a fifth of
the fetch's CPU, and more once the caches are cold after a second's sleep). vLLM's servers
send a handful of plain ``Name: value`` lines. :func:`parse_headers` builds the same
:class:`http.client.HTTPMessage` directly when every line is plain, and hands any other
block (a folded line, a line with no colon, a control character, no blank line before the
end of the stream) to the library unchanged. :class:`Response` is ``http.client``'s own
response, its ``begin`` the library's code reading headers through :func:`parse_headers`.
``tests/poll/test_http_headers.py`` checks the messages against the library's on generated and
hostile header blocks, and that :class:`Response` uses this parser.
"""

from __future__ import annotations

import email.parser
import http.client
import re
import types
from typing import BinaryIO

#: One plain header line: a name of the characters the email parser accepts in a name (no
#: space, no colon), a colon, the value's leading blanks, the value (printable ASCII, tab,
#: Latin-1 letters; never a character that could start a new line), CRLF or LF.
HEADER_NAME = rb"[!-9;-~]+"
HEADER_VALUE = rb"[\t -~\xa0-\xff]*"
PLAIN = re.compile(rb"(" + HEADER_NAME + rb"):[ \t]*(" + HEADER_VALUE + rb")\r?\n")


def plain_message(lines: list[bytes], cls: type[http.client.HTTPMessage] = http.client.HTTPMessage
                  ) -> http.client.HTTPMessage | None:
    """The message the library makes of ``lines`` (as read by ``http.client``, the blank
    line last) when every header line is plain, else None."""
    if not lines or lines[-1] not in (b"\r\n", b"\n"):
        return None
    headers = []
    match = PLAIN.fullmatch
    for line in lines[:-1]:
        m = match(line)
        if m is None:
            return None
        headers.append((m[1].decode("latin-1"), m[2].decode("latin-1")))
    msg = cls()
    msg._headers = headers  # what the parser's set_raw appends, one pair a line
    msg.set_payload("")  # the parser sets the (empty) body after the blank line
    return msg


def parse_headers(fp: BinaryIO, _class: type[http.client.HTTPMessage] = http.client.HTTPMessage
                  ) -> http.client.HTTPMessage:
    """``http.client.parse_headers``: the same limits (``_read_headers``) and message."""
    lines = http.client._read_headers(fp)  # type: ignore[attr-defined]
    msg = plain_message(lines, _class)
    if msg is not None:
        return msg
    return email.parser.Parser(_class=_class).parsestr(b"".join(lines).decode("iso-8859-1"))


def _with_parse_headers(func: types.FunctionType) -> types.FunctionType:
    """``func`` (a function of ``http.client``) calling :func:`parse_headers` for the
    module's ``parse_headers``: the library's code, not a copy of it."""
    scope = dict(vars(http.client), parse_headers=parse_headers)
    return types.FunctionType(func.__code__, scope, func.__name__, func.__defaults__,
                              func.__closure__)


class Response(http.client.HTTPResponse):
    """``http.client.HTTPResponse`` reading its headers with :func:`parse_headers`."""

    begin = _with_parse_headers(http.client.HTTPResponse.begin)  # type: ignore[arg-type]
