"""Keep secrets out of log lines: every secret specwatch reads is registered here.

Code never formats a token or password into a message in the first place (the test suite
checks every log record of every test); this filter is the second line of defence for text
that comes from elsewhere (a library's exception message quoting a header, say).
"""

from __future__ import annotations

import logging
import threading

REDACTED = "<redacted>"
_lock = threading.Lock()
_secrets: frozenset[str] = frozenset()


def register(secret: str) -> None:
    """Remember a secret (ignored when shorter than 4 characters: too many false hits)."""
    global _secrets
    if len(secret) >= 4:
        with _lock:
            _secrets = _secrets | {secret}


def redact(text: str) -> str:
    """``text`` with every registered secret replaced by ``<redacted>``."""
    for s in _secrets:
        if s in text:
            text = text.replace(s, REDACTED)
    return text


class RedactingFilter(logging.Filter):
    """A handler filter that rewrites records containing a registered secret."""

    def filter(self, record: logging.LogRecord) -> bool:
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
