"""What both fetch transports share: the target, the error reasons, the request headers, the
body rules, the redirect rule and the redacted error messages.

* **Maximum body size**: a runaway page is cut off and counted as ``too_large`` instead of
  filling memory; a Content-Length over the cap fails before any body byte is read. The
  body is requested with ``Accept-Encoding: identity``; a server that compresses anyway is
  decompressed incrementally with the same cap on the *decompressed* bytes. A body shorter
  than its Content-Length is an error, never a silently truncated page.
* **Redirects** are followed per ``follow_redirects`` (same_host by default), at most
  :data:`MAX_REDIRECTS`, never with a configured header or credential to another scheme,
  host or port.
* Secrets go into the request headers only; error messages are redacted
  (:func:`short_message`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from specwatch import __version__
from specwatch.common import redact
from specwatch.poll.fetch.guard import Guard


@dataclass(frozen=True)
class PollTarget:
    """How to fetch one target. ``basic_auth`` is (user, password); ``headers`` may carry a
    bearer token. Both are kept out of ``repr`` so they never reach a log line."""

    name: str
    url: str
    timeout_seconds: float = 3.0
    max_body_bytes: int = 16 * 1024 * 1024
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    verify: bool | str = True
    cert: tuple[str, str] | None = None
    #: same_host | any | none (see the module docstring).
    follow_redirects: str = "same_host"


#: Redirects followed per poll (a loop must not eat the deadline).
MAX_REDIRECTS = 3
REDIRECT_STATUSES = (301, 302, 303, 307, 308)  # requests' REDIRECT_STATI
BASE_HEADERS = {"Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
                 "Accept-Encoding": "identity",
                 "User-Agent": f"specwatch/{__version__}"}


class PollError(Exception):
    """A failed poll: ``reason`` is one of POLL_ERROR_REASONS."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def read_body(read1: Callable[[int], bytes], settimeout: Callable[[float], None],
               length: str | None, encoding: str, target: PollTarget,
               monotonic: Callable[[], float], deadline: float, guard: Guard) -> str:
    """Read a 200 response's body within the deadline and the cap, decompressing a body
    sent compressed anyway; transport errors become ``timeout`` or ``connection``."""
    cap = target.max_body_bytes
    if length and length.isdigit() and int(length) > cap:
        raise PollError("too_large", f"Content-Length {length} > {cap}")
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        decomp = None
    elif encoding in ("gzip", "x-gzip", "deflate"):
        decomp = zlib.decompressobj(zlib.MAX_WBITS | (16 if "gzip" in encoding else 0))
    else:
        raise PollError("parse", f"unsupported Content-Encoding {encoding[:40]!r}")
    chunks: list[bytes] = []
    total = 0  # decoded bytes
    wire = 0  # bytes received
    try:
        while True:
            left = deadline - monotonic()
            if left <= 0:
                raise PollError("timeout",
                                f"body not complete within {target.timeout_seconds:g}s")
            settimeout(left)
            data = read1(65536)
            if not data:
                break
            wire += len(data)
            if wire > cap:
                raise PollError("too_large", f"body over {cap} bytes")
            if decomp is not None:
                # At most one byte past the cap is ever inflated: a bomb stops here.
                data = decomp.decompress(data, cap - total + 1)
            total += len(data)
            if total > cap:
                raise PollError("too_large", f"decompressed body over {cap} bytes")
            chunks.append(data)
        if decomp is not None:
            tail = decomp.flush(cap - total + 1)
            total += len(tail)
            if total > cap:
                raise PollError("too_large", f"decompressed body over {cap} bytes")
            chunks.append(tail)
            if not decomp.eof:
                raise PollError("parse", f"{encoding} body ends before its end marker")
    except PollError:
        raise
    except zlib.error as exc:
        raise PollError("parse", f"corrupt {encoding} body: {exc}") from exc
    except Exception as exc:  # socket timeout, reset, short body (IncompleteRead)
        if guard.fired or "timed out" in str(exc).lower() or isinstance(exc, TimeoutError):
            raise PollError("timeout", f"body not complete within "
                                       f"{target.timeout_seconds:g}s") from exc
        raise PollError("connection", type(exc).__name__ + ": " + short_message(exc)) from exc
    if guard.fired:
        # Shut down at the deadline: what was read (even a "complete" response: http.client
        # takes end-of-file for the end of the headers) is cut short, never a page.
        raise deadline_error(target, "no complete response")
    body = b"".join(chunks)
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PollError("parse", f"body is not UTF-8 ({exc.reason} at byte {exc.start})") \
            from exc


def check_redirect(target: PollTarget, status: int, same: bool, hop: int) -> None:
    """Raise unless hop ``hop`` may follow this redirect: ``follow_redirects`` allows it
    (``same``: to the target's own origin) and it is not one past :data:`MAX_REDIRECTS`.
    The caller then sends the target's credentials (headers, password, client
    certificate) only when ``same``."""
    if target.follow_redirects == "none" or (not same and target.follow_redirects == "same_host"):
        where = "to its own origin" if same else "to another scheme, host or port"
        raise PollError("http_status", f"HTTP {status}: redirect {where} not followed "
                                       f"(follow_redirects: {target.follow_redirects})")
    if hop == MAX_REDIRECTS:
        raise PollError("connection", f"more than {MAX_REDIRECTS} redirects")


def url_origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the scheme's default port filled in."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(scheme)


def deadline_error(target: PollTarget, what: str) -> PollError:
    return PollError("timeout", f"{what} within {target.timeout_seconds:g}s (total deadline: "
                                f"connect, headers and body)")


def tls_reason(exc: BaseException) -> str:
    """The OpenSSL reason of a TLS failure (e.g. CERTIFICATE_VERIFY_FAILED), not the URL."""
    text = redact.redact(str(exc))
    for marker in ("certificate verify failed", "CERTIFICATE_VERIFY_FAILED", "hostname",
                   "wrong version number", "tlsv1 alert", "sslv3 alert", "handshake"):
        i = text.find(marker)
        if i >= 0:
            end = text.find(")", i)
            return text[i:end if end > 0 else i + 120][:160]
    return short_message(exc, 160)


def short_message(exc: BaseException, limit: int = 200) -> str:
    # Redacted before it is cut: an exception may quote a header value or the URL.
    text = redact.redact(str(exc))
    return text if len(text) <= limit else text[:limit] + "..."
