"""The HTTP server's bounds and counters: the configured limits, what was refused and why.

`ServerLimits` are the timeouts and caps of `global.http_server` (docs/security.md, "HTTP server
limits"); `ConnectionCounters` is the live state they are checked against (requests in flight,
open connections in all and per client address) and the refusals by reason (`REJECT_REASONS`,
the `reason` label of `specwatch_http_requests_rejected_total`), read out as a `WebStats`. Every
change holds the counters' lock.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["REJECT_REASONS", "ConnectionCounters", "ServerLimits", "WebStats"]

#: Reasons in ``specwatch_http_requests_rejected_total{reason}``.
REJECT_REASONS: tuple[str, ...] = ("in_flight_limit", "connection_limit", "timeout",
                                   "tls_handshake", "unauthorized", "rate_limited",
                                   "bad_request", "auth_rate_limited",
                                   "client_connection_limit")


@dataclass(frozen=True)
class ServerLimits:
    """Bounds of the HTTP server (config ``global.http_server``)."""

    max_requests_in_flight: int = 40
    max_connections: int = 512
    #: Open connections from one client address: one host (or 600 half-open sockets from
    #: it) cannot take the whole ``max_connections``.
    max_connections_per_client: int = 64
    #: Failed logins one client address may make at once (then one per
    #: ``failed_login_interval``); past them it gets 429 and bcrypt does not run.
    failed_logins_per_client: int = 10
    failed_login_interval: float = 1.0
    request_timeout: float = 10.0
    idle_timeout: float = 60.0
    handshake_timeout: float = 5.0


@dataclass(frozen=True)
class WebStats:
    """Counters and gauges of the HTTP server at one instant."""

    rejected: Mapping[str, int]
    in_flight: int
    connections: int
    tls: bool
    web_config_reload_success: bool
    web_config_reload_timestamp: float | None


class ConnectionCounters:
    """Requests in flight, open connections (in all and per client address), refusals."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rejected = dict.fromkeys(REJECT_REASONS, 0)
        self.in_flight = 0
        self.connections = 0
        self.per_client: dict[str, int] = {}  # open connections per client address

    def closed(self, client: str) -> None:
        with self.lock:
            self.connections -= 1
            n = self.per_client.get(client, 0) - 1
            if n > 0:
                self.per_client[client] = n
            else:
                self.per_client.pop(client, None)

    def reject(self, reason: str) -> None:
        with self.lock:
            self.rejected[reason] += 1

