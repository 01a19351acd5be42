"""The requests transport, for targets whose URL the environment routes through a proxy, and
:func:`send`, the one client of every other outbound request (Prometheus queries, webhooks)
with the same total deadline and body cap.

Proxies work exactly as ``requests`` handles them; the environment is read once, when the
session is made. Sockets are registered with the poll's guard through urllib3 connection
classes (:class:`_Guarded`). Redirects are followed here, not by requests, with the rule
both transports share (:func:`specwatch.poll.fetch.rules.check_redirect`).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import requests
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from specwatch.poll.fetch import guard as fetchguard
from specwatch.poll.fetch.guard import Guard, current, watch
from specwatch.poll.fetch.rules import (
    BASE_HEADERS,
    MAX_REDIRECTS,
    PollError,
    PollTarget,
    check_redirect,
    deadline_error,
    read_body,
    short_message,
    tls_reason,
    url_origin,
)


class _Guarded:
    """Mixin for urllib3 connections: registers the socket with the poll running in this
    thread (new or reused), for plain and TLS connections alike.

    A new connection's socket is registered as a duplicate (same connection, its own
    descriptor, closed when the poll ends): urllib3 wraps the socket for TLS, which detaches
    the original socket object before the handshake, so only a duplicate lets the guard cut
    a handshake short (a server that never answers it held ``stop()`` for the whole
    deadline before)."""

    sock: socket.socket | None

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()  # type: ignore[misc]
        guard = current()
        if guard is not None:
            guard.watch(sock.dup(), owned=True)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        watch(self.sock)
        super().request(*args, **kwargs)  # type: ignore[misc]


class _GuardedHTTPConnection(_Guarded, HTTPConnection):
    pass


class _GuardedHTTPSConnection(_Guarded, HTTPSConnection):
    pass


class _GuardedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _GuardedHTTPConnection


class _GuardedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _GuardedHTTPSConnection


class RequestsSession(requests.Session):
    """The session of one target behind a proxy, with the environment read once.

    A plain session re-reads ``os.environ`` (proxy variables, CA bundle) and looks for a
    ``.netrc`` on every request: about half the CPU of polling a 55 KB page. Here the proxy
    settings for the target's URL and ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE`` are resolved
    when the session is made and ``trust_env`` is turned off (so ``.netrc`` is not read:
    target credentials come from the configuration only).
    """

    def __init__(self, url: str, env: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.max_redirects = MAX_REDIRECTS
        adapter = requests.adapters.HTTPAdapter()
        adapter.poolmanager.pool_classes_by_scheme = {"http": _GuardedHTTPPool,
                                                      "https": _GuardedHTTPSPool}
        self.mount("http://", adapter)
        self.mount("https://", adapter)
        if env is None:
            env = self.merge_environment_settings(url, {}, None, None, None)
        self.trust_env = False
        self.proxies.update(env.get("proxies") or {})
        #: The verify setting of a target that did not set one (True or the env's bundle).
        self.default_verify: bool | str = env.get("verify", True)
        #: The target's request, prepared once (URL, headers, auth never change for a
        #: session: a changed target gets a new session).
        self.prepared: requests.PreparedRequest | None = None




def _set_socket_timeout(raw: object, seconds: float) -> None:
    """Lower the read timeout of the response's socket (best effort: urllib3 internals)."""
    conn = getattr(raw, "_connection", None)
    sock = getattr(conn, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.settimeout(max(seconds, 0.001))


def fetch_requests(session: requests.Session, target: PollTarget,
                    monotonic: Callable[[], float], deadline: float, guard: Guard) -> str:
    try:
        verify = target.verify
        if verify is True:  # the environment's CA bundle, as requests itself would use
            verify = getattr(session, "default_verify", True)
        prepared = getattr(session, "prepared", None)
        if prepared is None:
            prepared = session.prepare_request(requests.Request(
                "GET", target.url, headers={**BASE_HEADERS, **target.headers},
                auth=target.basic_auth))
            if isinstance(session, RequestsSession):
                session.prepared = prepared
        request = prepared.copy()
        # Redirects are followed here, not by requests: requests only drops Authorization
        # and Cookie on a cross-host redirect, so an X-Api-Key would follow a redirect
        # anywhere.
        home = url_origin(target.url)
        cert = target.cert
        for hop in range(MAX_REDIRECTS + 1):
            left = max(deadline - monotonic(), 0.001)
            resp = session.send(request, stream=True, allow_redirects=False,
                                timeout=(left, left), verify=verify, cert=cert)
            if not resp.is_redirect:
                break
            status = resp.status_code
            location = urljoin(resp.url or target.url, resp.headers.get("location", ""))
            resp.close()
            same = url_origin(location) == home
            check_redirect(target, status, same, hop)
            request = session.prepare_request(requests.Request(
                "GET", location,
                headers={**BASE_HEADERS, **target.headers} if same else BASE_HEADERS,
                auth=target.basic_auth if same else None))
            cert = target.cert if same else None  # nor the client certificate
    except requests.exceptions.Timeout as exc:
        raise PollError("timeout", f"no response within {target.timeout_seconds:g}s") from exc
    except requests.exceptions.RequestException as exc:
        if guard.fired:
            raise deadline_error(target, "no complete response") from exc
        if isinstance(exc, requests.exceptions.SSLError):
            raise PollError("tls", "TLS: " + tls_reason(exc)) from exc
        raise PollError("connection", type(exc).__name__ + ": " + short_message(exc)) from exc
    with resp:
        if resp.status_code != 200:
            raise PollError("http_status", f"HTTP {resp.status_code}")
        raw = resp.raw
        return read_body(lambda n: raw.read1(n, decode_content=False),
                          lambda seconds: _set_socket_timeout(raw, seconds),
                          resp.headers.get("Content-Length"),
                          resp.headers.get("Content-Encoding", ""), target, monotonic,
                          deadline, guard)


@dataclass(frozen=True)
class Reply:
    """One answer of :func:`send`: any status, the body read whole within the cap."""

    status: int
    text: str


#: What :func:`send` asks for: compressed answers it can inflate under the body cap.
_QUERY_HEADERS = {"Accept-Encoding": "gzip, deflate", "User-Agent": BASE_HEADERS["User-Agent"]}


def send(session: requests.Session, method: str, url: str, *, timeout: float,
         max_body_bytes: int, params: Mapping[str, str] | None = None,
         data: bytes | None = None, headers: Mapping[str, str] | None = None) -> Reply:
    """One outbound request (a Prometheus query, a webhook) with the poll's rules: a total
    deadline of ``timeout`` seconds from connect to the last body byte
    (:mod:`specwatch.poll.fetch.guard`: a server trickling bytes is cut off at it), a body
    cap (:func:`~specwatch.poll.fetch.rules.read_body`), no redirect followed. Any HTTP
    status is an answer; every failure is a :class:`PollError` (``timeout``,
    ``too_large``, ``connection``, ``tls``, ``parse``). ``session`` should be a
    :class:`RequestsSession` (its sockets are the ones the deadline can shut)."""
    target = PollTarget(name=url, url=url, timeout_seconds=timeout,
                        max_body_bytes=max_body_bytes)
    start = time.monotonic()
    deadline = start + timeout
    guard = Guard(deadline)
    fetchguard.enter(guard)
    try:
        try:
            resp = session.request(method, url, params=params, data=data,
                                   headers={**_QUERY_HEADERS, **(headers or {})},
                                   stream=True, allow_redirects=False,
                                   timeout=(timeout, timeout))
        except requests.exceptions.RequestException as exc:
            if guard.fired or isinstance(exc, requests.exceptions.Timeout):
                raise deadline_error(target, "no complete response") from exc
            if isinstance(exc, requests.exceptions.SSLError):
                raise PollError("tls", "TLS: " + tls_reason(exc)) from exc
            raise PollError("connection", type(exc).__name__ + ": " + short_message(exc)) \
                from exc
        with resp:
            raw = resp.raw
            text = read_body(lambda n: raw.read1(n, decode_content=False),
                             lambda seconds: _set_socket_timeout(raw, seconds),
                             resp.headers.get("Content-Length"),
                             resp.headers.get("Content-Encoding", ""), target,
                             time.monotonic, deadline, guard)
            return Reply(resp.status_code, text)
    finally:
        fetchguard.leave(guard)
