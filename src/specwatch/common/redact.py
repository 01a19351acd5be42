"""Keep secrets out of log lines: every secret specwatch reads is registered here.

Code never formats a token or password into a message in the first place (the test suite
checks every log record of every test); this filter is the second line of defence for text
that comes from elsewhere (a library's exception message quoting a header, say).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlsplit, urlunsplit

REDACTED = "<redacted>"
_lock = threading.Lock()
#: Registered forms, longest first (so a secret that contains another is replaced whole).
_secrets: tuple[str, ...] = ()


def forms(secret: str) -> set[str]:
    """Every way ``secret`` can appear in printed text: raw, stripped, as ``repr`` and
    ``ascii`` print it (``\\n``, ``\\x00``, ``\\'``), as the log filter escapes it, and
    URL-encoded (``%2F`` and ``+`` for spaces), so a value that went through any of these
    still matches."""
    out = {secret, secret.strip(), repr(secret)[1:-1], ascii(secret)[1:-1],
           escape_controls(secret), quote(secret, safe=""), quote_plus(secret, safe=""),
           quote(secret, safe="/:@!$&'()*+,;=")}
    return {f for f in out if len(f) >= 4}


def register(secret: str) -> None:
    """Remember a secret in all its printable forms (:func:`forms`; a form shorter than 4
    characters is ignored: too many false hits)."""
    global _secrets
    new = forms(secret)
    if new:
        with _lock:
            _secrets = tuple(sorted(set(_secrets) | new, key=len, reverse=True))


#: Query parameter names whose values are credentials (``?token=``, ``?api_key=``,
#: ``?sig=``...). Other query values are not secrets (a ``?format=`` must not turn every
#: "prometheus" in the logs into <redacted>).
_SECRET_PARAM = re.compile(r"token|key|secret|pass|auth|sig|credential|session|code|jwt",
                           re.IGNORECASE)


#: Request headers whose values are never secrets; every other configured header value is
#: registered for redaction (X-Api-Key, X-Auth-Token, a signature...).
PLAIN_HEADERS = frozenset({"accept", "accept-encoding", "accept-language", "user-agent",
                           "content-type", "cache-control", "host"})


def register_header(name: str, value: str) -> None:
    """Register a configured request header's value (and the part after ``Bearer ``)
    unless the header is one that never carries a credential."""
    if name.lower() not in PLAIN_HEADERS:
        register(value)
        register(value.partition(" ")[2])


def registered() -> tuple[str, ...]:
    """Every registered form (the test suite checks each log record against them)."""
    return _secrets


def register_url(url: str) -> None:
    """Register the secrets a URL can carry: the userinfo password (and user) and the values
    of query parameters named like credentials (:data:`_SECRET_PARAM`)."""
    parts = urlsplit(url)
    if parts.password:
        register(parts.password)
        register(unquote(parts.password))
    for name, value in parse_qsl(parts.query, keep_blank_values=False):
        if _SECRET_PARAM.search(name):
            register(value)
    for raw in parts.query.split("&"):  # the raw (still URL-encoded) form too
        name, _, value = raw.partition("=")
        if value and _SECRET_PARAM.search(unquote(name)):
            register(value)


def display_url(url: str) -> str:
    """``url`` fit for a log line: no userinfo, no query (``?...`` when it had one)."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, "..." if parts.query else "", ""))


def redact(text: str) -> str:
    """``text`` with every registered secret replaced by ``<redacted>`` (longest first, so a
    secret that contains another is replaced whole)."""
    for s in _secrets:
        if s in text:
            text = text.replace(s, REDACTED)
    return text


#: C0 controls, DEL, C1 controls and the Unicode line/paragraph separators: whatever a
#: terminal or a log shipper could take as the end of a line or an escape sequence.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_controls(text: str) -> str:
    """``text`` with control characters written as escapes (``\\n``, ``\\x1b``, ``\\u2028``).

    Values that come from outside (a model name from a target's page, a header, a request
    line) are formatted into log lines; a newline in one would forge a second log line.
    """
    if not _CONTROLS.search(text):
        return text
    return _CONTROLS.sub(lambda m: _NAMED.get(m.group()) or (
        f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}"),
        text)


def _escape_arg(arg: object) -> object:
    if isinstance(arg, str):
        return escape_controls(arg)
    if arg is None or isinstance(arg, (int, float)):
        return arg  # keeps %d and %.3f working
    text = str(arg)
    return escape_controls(text) if _CONTROLS.search(text) else arg


def escape_record_args(record: logging.LogRecord) -> None:
    """Escape control characters in a record's arguments (the format string is code's own)."""
    args = record.args
    if not args:
        return
    if isinstance(args, Mapping):
        record.args = {k: _escape_arg(v) for k, v in args.items()}
    elif isinstance(args, tuple):
        record.args = tuple(_escape_arg(a) for a in args)


class RedactingFilter(logging.Filter):
    """A handler filter that escapes control characters in a record's arguments and
    rewrites records containing a registered secret."""

    def filter(self, record: logging.LogRecord) -> bool:
        escape_record_args(record)
        if not _secrets:
            return True
        msg = record.getMessage()
        clean = redact(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            text = logging.Formatter().formatException(record.exc_info)
            if redact(text) != text:
                record.exc_info = None
                record.exc_text = redact(text)
        return True


def install(logger: logging.Logger | None = None) -> None:
    """Add the filter to every handler of ``logger`` (the root logger by default)."""
    target = logger or logging.getLogger()
    for h in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in h.filters):
            h.addFilter(RedactingFilter())
