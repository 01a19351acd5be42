"""What a route sees: `Request` in, `Response` out, and the guards every handler gets.

Handlers see plain data objects, not the http.server machinery, so a new route (the controller's
Alertmanager receiver, a `POST`) is one more entry in `WebServer`'s route table and gets the
same protection. A handler that raises gives a 500 for that request only (`run_handler`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = ["MAX_REQUEST_BODY", "Handler", "Request", "Response", "only_get", "run_handler"]

log = logging.getLogger(__name__)

#: Largest request body a handler may receive (the Alertmanager webhook is a few kB).
MAX_REQUEST_BODY = 1024 * 1024


@dataclass(frozen=True)
class Request:
    """One HTTP request as a handler sees it (header names lower-case).

    ``user`` is the basic-auth user when the web config requires one, ``remote`` the peer's
    ``host:port``.
    """

    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]
    body: bytes = b""
    remote: str = ""
    user: str | None = None


@dataclass(frozen=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Response]


def run_handler(handler: Handler, req: Request) -> Response:
    try:
        return handler(req)
    except Exception:
        log.exception("handler for %s failed", req.path)
        return Response(500, b"internal error\n")


def only_get(handler: Handler) -> Handler:
    """Wrap a read-only handler: GET/HEAD pass, other methods get 405."""

    def wrapped(req: Request) -> Response:
        if req.method not in ("GET", "HEAD"):
            return Response(405, b"method not allowed\n", headers={"Allow": "GET, HEAD"})
        return handler(req)

    return wrapped
