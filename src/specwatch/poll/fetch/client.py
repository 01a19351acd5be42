"""One poll's HTTP GET of a target's page: a total deadline, a size cap, TLS, redirects, and
two transports with one behaviour.

* **Total deadline per poll** (connect + TLS handshake + headers + body):
  :mod:`specwatch.poll.fetch.guard`.
* **Body size cap, redirects, error reasons**: :mod:`specwatch.poll.fetch.rules`.
* **TLS to targets**: ``verify`` (a CA bundle path, True, or False for
  insecure_skip_verify) and the client ``cert`` apply to every request; ``verify: True``
  means ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE`` from the environment when set, else
  certifi's bundle, as ``requests`` does. A certificate problem is reason ``tls``.
* **One session per target** keeps its keep-alive connection; sessions are never shared.
* **Two transports**: a target reached directly gets a
  :class:`~specwatch.poll.fetch.direct.DirectSession` (``http.client``); one whose URL goes
  through ``HTTP(S)_PROXY``/``ALL_PROXY`` (and is not excluded by ``NO_PROXY``) gets a
  :class:`~specwatch.poll.fetch.proxied.RequestsSession`. ``tests/poll/test_fetch_paths.py``
  checks that both give the same bodies and errors over a matrix of server behaviours.

The poller (scheduling) is :mod:`specwatch.poll.poller`. Measurements:
docs/performance.md, "The poll path".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import requests

from specwatch.poll.fetch import guard as fetchguard
from specwatch.poll.fetch.direct import DirectSession
from specwatch.poll.fetch.guard import Guard
from specwatch.poll.fetch.proxied import RequestsSession, fetch_requests
from specwatch.poll.fetch.rules import MAX_REDIRECTS, PollError, PollTarget, short_message

__all__ = ["MAX_REDIRECTS", "DirectSession", "FetchSession", "Guard", "PollError",
           "PollTarget", "RequestsSession", "fetch", "new_session", "short_message"]

FetchSession = DirectSession | RequestsSession


def fetch(session: FetchSession, target: PollTarget,
          monotonic: Callable[[], float] = time.monotonic,
          guard: Guard | None = None) -> str:
    """GET the target's page within its deadline and size cap; raise PollError otherwise.

    ``guard`` (made here when not given) holds the poll's sockets: the watchdog shuts them
    down at the deadline whatever the server does, and the poller's ``stop()`` at once."""
    deadline = monotonic() + target.timeout_seconds
    if guard is None:
        guard = Guard(time.monotonic() + target.timeout_seconds)
    fetchguard.enter(guard)
    try:
        if isinstance(session, DirectSession):
            return session.fetch(target, monotonic, deadline, guard)
        return fetch_requests(session, target, monotonic, deadline, guard)
    finally:
        fetchguard.leave(guard)


def new_session(url: str, path: str = "auto") -> FetchSession:
    """The session of one target: ``direct`` (http.client), ``requests``, or ``auto``: the
    requests path only when the environment routes the URL through a proxy."""
    env = _environment(url)
    if path == "requests" or (path == "auto" and env.get("proxies")):
        return RequestsSession(url, env)
    if path not in ("auto", "direct"):
        raise ValueError(f"unknown fetch path {path!r}")
    return DirectSession(url, env.get("verify", True))


def _environment(url: str) -> dict[str, Any]:
    """What ``requests`` takes from the environment for ``url``: proxies (after NO_PROXY)
    and the CA bundle (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE)."""
    with requests.Session() as probe:
        return probe.merge_environment_settings(url, {}, None, None, None)
