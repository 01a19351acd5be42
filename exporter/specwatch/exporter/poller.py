"""Background poller: every target every interval, concurrently, one poll in flight per target.

Why each rule:

* **Total deadline per poll** (connect + headers + body): ``requests`` timeouts apply per
  socket operation, so a server trickling one byte a second (or one header line every half
  second) would never time out. Every socket a poll opens or reuses is registered with a
  :class:`_Guard`; one watchdog thread shuts the sockets of a poll down at its deadline
  (``recv`` then returns at once, wherever the poll is: headers, TLS handshake, body), and
  :meth:`Poller.stop` does the same to every poll in flight, so shutdown never waits for a
  target. The body is also read with ``read1`` and the socket timeout lowered to the time
  left before every read.
* **Maximum body size**: a runaway page (LoRA label explosion, a misrouted URL serving a
  file) is cut off and counted as ``too_large`` instead of filling memory. The body is
  requested with ``Accept-Encoding: identity``; a server that compresses anyway is
  decompressed incrementally with the same cap on the *decompressed* bytes, so a gzip bomb
  costs at most ``max_body_bytes`` of memory. A body shorter than its Content-Length is an
  error, never a silently truncated page.
* **TLS to targets**: ``verify`` (a CA bundle path, True, or False for
  insecure_skip_verify) and the client ``cert`` are passed on every request, because a
  session-level ``verify`` is silently replaced by ``REQUESTS_CA_BUNDLE`` from the
  environment. A certificate problem is reason ``tls``.
* **One session per target** reuses its keep-alive connection; sessions are never shared,
  so a stuck target cannot hold a connection another target needs.
* **One poll in flight per target**: a slow target is skipped, not stacked, so specwatch
  never piles load on a struggling inference server, and a slow target never delays the
  others (each has its own worker).
* Secrets (bearer tokens, passwords) go into the session only; they are never logged.
* **Redirects** are followed here, per ``follow_redirects`` (same_host by default), never
  with a configured header or credential to another scheme, host or port.

Size: one module because the deadline guard, the redirect rules and the body limits all act
on one request of one poll; the scheduler is the rest and shares the guard (stop() cuts the
polls in flight short).
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import math
import socket
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from specwatch import __version__
from specwatch.common import redact
from specwatch.exporter.pipeline import PollResult

log = logging.getLogger(__name__)


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
    #: same_host | any | none (see :func:`_fetch`).
    follow_redirects: str = "same_host"


#: Redirects followed per poll (a loop must not eat the deadline).
MAX_REDIRECTS = 3


class PollError(Exception):
    """A failed poll: ``reason`` is one of POLL_ERROR_REASONS."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class _Guard:
    """The sockets of one poll and its deadline; :meth:`fire` shuts them down."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.fired = False
        self.done = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.append(sock)
            fired = self.fired
        if fired:
            _shutdown(sock)

    def fire(self) -> None:
        with self._lock:
            if self.done or self.fired:
                return
            self.fired = True
            socks = list(self._socks)
        for sock in socks:
            _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    # The plain socket's shutdown even for an SSLSocket: SSLSocket.shutdown drops its SSL
    # object, which the reading thread may be using.
    with contextlib.suppress(OSError, ValueError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Watchdog:
    """One thread for every poll's deadline: fires each :class:`_Guard` when due."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Guard]] = []
        self._count = 0
        self._thread: threading.Thread | None = None

    def add(self, guard: _Guard) -> None:
        with self._cond:
            self._count += 1
            heapq.heappush(self._heap, (guard.deadline, self._count, guard))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="specwatch-deadline")
                self._thread.start()
            # Woken only when this deadline is the next one due: otherwise the thread
            # already waits for an earlier one and finds this one then (one thread switch a
            # poll saved: issue 15).
            if self._heap[0][2] is guard:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                deadline, _, guard = self._heap[0]
                left = deadline - time.monotonic()
                if left > 0 and not guard.done:
                    self._cond.wait(left)
                    continue
                heapq.heappop(self._heap)
            if not guard.done:
                guard.fire()


_WATCHDOG = _Watchdog()
_current = threading.local()


def _watch(sock: socket.socket | None) -> None:
    guard = getattr(_current, "guard", None)
    if guard is not None and sock is not None:
        guard.watch(sock)


class _Guarded:
    """Mixin for urllib3 connections: registers the socket with the poll running in this
    thread (new or reused), for plain and TLS connections alike."""

    sock: socket.socket | None

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()  # type: ignore[misc]
        _watch(sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        _watch(self.sock)
        super().request(*args, **kwargs)  # type: ignore[misc]


class _GuardedHTTPConnection(_Guarded, HTTPConnection):
    pass


class _GuardedHTTPSConnection(_Guarded, HTTPSConnection):
    pass


class _GuardedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _GuardedHTTPConnection


class _GuardedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _GuardedHTTPSConnection


def _set_socket_timeout(raw: object, seconds: float) -> None:
    """Lower the read timeout of the response's socket (best effort: urllib3 internals)."""
    conn = getattr(raw, "_connection", None)
    sock = getattr(conn, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.settimeout(max(seconds, 0.001))


def fetch(session: requests.Session, target: PollTarget,
          monotonic: Callable[[], float] = time.monotonic,
          guard: _Guard | None = None) -> str:
    """GET the target's page within its deadline and size cap; raise PollError otherwise.

    ``guard`` (made here when not given) holds the poll's sockets: the watchdog shuts them
    down at the deadline whatever the server does, and :meth:`Poller.stop` at once."""
    deadline = monotonic() + target.timeout_seconds
    if guard is None:
        guard = _Guard(time.monotonic() + target.timeout_seconds)
    _current.guard = guard
    _WATCHDOG.add(guard)
    try:
        return _fetch(session, target, monotonic, deadline, guard)
    finally:
        guard.done = True
        _current.guard = None


def _fetch(session: requests.Session, target: PollTarget, monotonic: Callable[[], float],
           deadline: float, guard: _Guard) -> str:
    base_headers = {"Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
                    "Accept-Encoding": "identity",
                    "User-Agent": f"specwatch/{__version__}"}
    try:
        verify = target.verify
        if verify is True:  # the environment's CA bundle, as requests itself would use
            verify = getattr(session, "default_verify", True)
        prepared = getattr(session, "prepared", None)
        if prepared is None:
            prepared = session.prepare_request(requests.Request(
                "GET", target.url, headers={**base_headers, **target.headers},
                auth=target.basic_auth))
            if isinstance(session, _TargetSession):
                session.prepared = prepared
        request = prepared.copy()
        # Redirects are followed here, not by requests: requests only drops Authorization
        # and Cookie on a cross-host redirect, so an X-Api-Key would follow a redirect
        # anywhere. same_host (default): only to the target's own scheme, host and port,
        # with its headers; any: also elsewhere, with none of the configured headers or
        # credentials; none: a redirect is an error.
        home = _origin(target.url)
        for hop in range(MAX_REDIRECTS + 1):
            left = max(deadline - monotonic(), 0.001)
            resp = session.send(request, stream=True, allow_redirects=False,
                                timeout=(left, left), verify=verify, cert=target.cert)
            if not resp.is_redirect:
                break
            status = resp.status_code
            location = urljoin(resp.url or target.url, resp.headers.get("location", ""))
            resp.close()
            same = _origin(location) == home
            if target.follow_redirects == "none" or (
                    not same and target.follow_redirects == "same_host"):
                where = "to its own origin" if same else "to another scheme, host or port"
                raise PollError("http_status", f"HTTP {status}: redirect {where} not followed "
                                               f"(follow_redirects: {target.follow_redirects})")
            if hop == MAX_REDIRECTS:
                raise PollError("connection", f"more than {MAX_REDIRECTS} redirects")
            request = session.prepare_request(requests.Request(
                "GET", location,
                headers={**base_headers, **target.headers} if same else base_headers,
                auth=target.basic_auth if same else None))
    except requests.exceptions.Timeout as exc:
        raise PollError("timeout", f"no response within {target.timeout_seconds:g}s") from exc
    except requests.exceptions.RequestException as exc:
        if guard.fired:
            raise _deadline_error(target, "no complete response") from exc
        if isinstance(exc, requests.exceptions.SSLError):
            raise PollError("tls", "TLS: " + _tls_reason(exc)) from exc
        raise PollError("connection", type(exc).__name__ + ": " + _short(exc)) from exc
    with resp:
        if resp.status_code != 200:
            raise PollError("http_status", f"HTTP {resp.status_code}")
        length = resp.headers.get("Content-Length")
        if length and length.isdigit() and int(length) > target.max_body_bytes:
            raise PollError("too_large", f"Content-Length {length} > {target.max_body_bytes}")
        encoding = resp.headers.get("Content-Encoding", "").strip().lower()
        if encoding in ("", "identity"):
            decomp = None
        elif encoding in ("gzip", "x-gzip", "deflate"):
            decomp = zlib.decompressobj(zlib.MAX_WBITS | (16 if "gzip" in encoding else 0))
        else:
            raise PollError("parse", f"unsupported Content-Encoding {encoding[:40]!r}")
        cap = target.max_body_bytes
        chunks: list[bytes] = []
        total = 0  # decoded bytes
        wire = 0  # bytes received
        raw = resp.raw
        try:
            while True:
                left = deadline - monotonic()
                if left <= 0:
                    raise PollError("timeout",
                                      f"body not complete within {target.timeout_seconds:g}s")
                _set_socket_timeout(raw, left)
                data = raw.read1(65536, decode_content=False)
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
        except Exception as exc:  # socket timeout, reset, short body (urllib3 ProtocolError)
            if guard.fired or "timed out" in str(exc).lower() or isinstance(exc, TimeoutError):
                raise PollError("timeout", f"body not complete within "
                                  f"{target.timeout_seconds:g}s") from exc
            raise PollError("connection", type(exc).__name__ + ": " + _short(exc)) from exc
    if guard.fired:
        # Shut down at the deadline: what was read (even a "complete" response: http.client
        # takes end-of-file for the end of the headers) is cut short, never a page.
        raise _deadline_error(target, "no complete response")
    body = b"".join(chunks)
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PollError("parse", f"body is not UTF-8 ({exc.reason} at byte {exc.start})") \
            from exc


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the scheme's default port filled in."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(scheme)


def _deadline_error(target: PollTarget, what: str) -> PollError:
    return PollError("timeout", f"{what} within {target.timeout_seconds:g}s (total deadline: "
                                f"connect, headers and body)")


def _tls_reason(exc: BaseException) -> str:
    """The OpenSSL reason of a TLS failure (e.g. CERTIFICATE_VERIFY_FAILED), not the URL."""
    text = redact.redact(str(exc))
    for marker in ("certificate verify failed", "CERTIFICATE_VERIFY_FAILED", "hostname",
                   "wrong version number", "tlsv1 alert", "sslv3 alert", "handshake"):
        i = text.find(marker)
        if i >= 0:
            end = text.find(")", i)
            return text[i:end if end > 0 else i + 120][:160]
    return _short(exc, 160)


def _short(exc: BaseException, limit: int = 200) -> str:
    # Redacted before it is cut: an exception may quote a header value or the URL.
    text = redact.redact(str(exc))
    return text if len(text) <= limit else text[:limit] + "..."


class _TargetSession(requests.Session):
    """The session of one target, with the environment read once, not on every poll.

    A plain session re-reads ``os.environ`` (proxy variables, CA bundle) and looks for a
    ``.netrc`` on every request: about half the CPU of polling a 55 KB page. Here the proxy
    settings for the target's URL and ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE`` are resolved
    when the session is made and ``trust_env`` is turned off (so ``.netrc`` is not read:
    target credentials come from the configuration only).
    """

    def __init__(self, url: str) -> None:
        super().__init__()
        self.max_redirects = MAX_REDIRECTS
        adapter = requests.adapters.HTTPAdapter()
        adapter.poolmanager.pool_classes_by_scheme = {"http": _GuardedHTTPPool,
                                                      "https": _GuardedHTTPSPool}
        self.mount("http://", adapter)
        self.mount("https://", adapter)
        env = self.merge_environment_settings(url, {}, None, None, None)
        self.trust_env = False
        self.proxies.update(env.get("proxies") or {})
        #: The verify setting of a target that did not set one (True or the env's bundle).
        self.default_verify: bool | str = env.get("verify", True)
        #: The target's request, prepared once (URL, headers, auth never change for a
        #: session: a changed target gets a new session).
        self.prepared: requests.PreparedRequest | None = None


def _session(url: str) -> requests.Session:
    return _TargetSession(url)


class Poller:
    """Schedules polls and hands each :class:`PollResult` to ``on_result``.

    ``clock`` gives the wall time stamped on results (inject a fake one in tests);
    scheduling always uses ``time.monotonic``.

    **Concurrency.** Every target due in a cycle is submitted at once to a thread pool of
    at most ``max_concurrent`` workers (default: no limit below the number of targets; the
    pool only grows to the number of polls actually in flight, and one-in-flight-per-target
    bounds that by the number of targets). A poll that waits on a slow server holds one
    thread and no CPU until its deadline, so with one worker per target the longest poll of
    a cycle is bounded by the deadline (``timeout``), not by how many servers are slow; the
    CPU work of all polls (parse, derive) is serialized by the GIL and adds up to
    ``targets x CPU per poll``. With a bound P below the number of targets, S slow targets
    hold workers for ``timeout x ceil(S / P)`` in the worst case, and the fast ones queue
    behind them: keep ``timeout x ceil(S / P) + targets x CPU per poll`` below the
    interval (README, "Performance and scale").

    **Changing targets.** :meth:`set_targets` replaces the target set while running (file_sd
    discovery): new targets are polled at once, removed ones stop (a poll in flight finishes
    and its result is dropped by the pipeline), changed ones get a fresh session.
    """

    def __init__(self, targets: Sequence[PollTarget], interval: float,
                 on_result: Callable[[PollResult], object],
                 clock: Callable[[], float] = time.time,
                 max_concurrent: int | None = None, spread: bool = True) -> None:
        self.targets: dict[str, PollTarget] = {}
        self.interval = float(interval)
        self.on_result = on_result
        self.clock = clock
        self._sessions: dict[str, requests.Session] = {}
        self._inflight: dict[str, Future[PollResult | None]] = {}
        self._retired: list[tuple[str, requests.Session]] = []
        self._guards: set[_Guard] = set()  # polls in flight (stop() cuts them short)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._version = 0  # bumped by set_targets: the scheduler re-reads the targets
        # ThreadPoolExecutor starts a thread only when no idle one is free, so a large
        # max_workers costs nothing until that many polls are in flight at once.
        self.max_concurrent = max_concurrent
        self.spread = spread
        self._executor = ThreadPoolExecutor(max_workers=max_concurrent or 1 << 16,
                                            thread_name_prefix="specwatch-poll")
        self.set_targets(targets)

    def set_targets(self, targets: Sequence[PollTarget]) -> None:
        """Replace the target set (safe while polling; see the class docstring)."""
        new = {t.name: t for t in targets}
        with self._lock:
            for name, old in list(self.targets.items()):
                if new.get(name) != old:  # removed or changed: retire its session
                    session = self._sessions.pop(name)
                    if name in self._inflight:
                        self._retired.append((name, session))
                    else:
                        session.close()
            for name in new:
                if name not in self._sessions:
                    self._sessions[name] = _session(new[name].url)
            self.targets = new
            self._version += 1
        if any(t.verify is False for t in targets):
            # The operator chose insecure_skip_verify (logged once at start-up); urllib3
            # would otherwise warn on every poll.
            import urllib3

            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        self._wake.set()

    def poll_now(self, name: str) -> PollResult:
        """Poll one target synchronously in the calling thread and deliver the result."""
        with self._lock:
            target = self.targets[name]
            session = self._sessions[name]
        started_wall = self.clock()
        t0 = time.monotonic()
        body, reason, message = None, None, ""
        guard = _Guard(t0 + target.timeout_seconds)
        with self._lock:
            self._guards.add(guard)
        if self._stop.is_set():
            guard.fire()
        try:
            body = fetch(session, target, guard=guard)
        except PollError as exc:
            reason, message = exc.reason, str(exc)
        except Exception as exc:  # never let a poll kill its worker
            reason, message = "connection", f"{type(exc).__name__}: {_short(exc)}"
        finally:
            with self._lock:
                self._guards.discard(guard)
        duration = time.monotonic() - t0
        result = PollResult(target=name, started=started_wall, finished=self.clock(),
                            duration_seconds=duration, body=body, error_reason=reason,
                            error_message=message)
        try:
            self.on_result(result)
        except Exception:
            log.exception("handling the poll result of %s failed", name)
        return result

    def _poll_scheduled(self, name: str) -> PollResult | None:
        """A scheduled poll: skipped when the target was removed since it was queued."""
        try:
            return self.poll_now(name)
        except KeyError:
            return None

    def start(self) -> None:
        """Start the scheduler thread (first polls go out at once)."""
        self._thread = threading.Thread(target=self._run, name="specwatch-scheduler",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop scheduling, cut the polls in flight short (their sockets are shut down, so
        none waits for its deadline) and wait for them to return."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            guards = list(self._guards)
        for g in guards:
            g.fire()
        if self._thread is not None:
            self._thread.join(timeout)
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            sessions = list(self._sessions.values()) + [s for _, s in self._retired]
            self._retired.clear()
        for s in sessions:
            s.close()

    def _done(self, name: str, fut: Future[PollResult | None]) -> None:
        with self._lock:
            if self._inflight.get(name) is fut:
                del self._inflight[name]
            retired = [s for n, s in self._retired if n == name]
            self._retired = [(n, s) for n, s in self._retired if n != name]
        for s in retired:
            s.close()

    def phase(self, name: str) -> float:
        """The target's fixed offset in the interval, a fraction in [0, 1) (0 when unspread)."""
        return zlib.crc32(name.encode()) / 2**32 if self.spread else 0.0

    def _run(self) -> None:
        # Each target is polled at once when it appears (fresh data at start-up), then on
        # its own slots anchor + k x interval, the anchor set by its phase: polls spread
        # evenly over the interval instead of all at once (less contention for the GIL,
        # fewer bodies in memory together, a steady load on the fleet), like Prometheus
        # spreads scrapes. A late loop keeps the slots (no drift); a slot whose previous
        # poll still runs is skipped. A heap of due times: each wake-up costs O(log N) per
        # due target, not a scan of every target.
        heap: list[tuple[float, int, str]] = []
        anchor: dict[str, float] = {}
        generation: dict[str, int] = {}
        seen_version = -1
        counter = 0
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                version = self._version
                names = list(self.targets) if version != seen_version else None
            if names is not None:
                seen_version = version
                for gone in anchor.keys() - set(names):
                    del anchor[gone]  # its heap entries are skipped below
                for name in names:
                    if name not in anchor:
                        phase = self.phase(name)
                        # The second poll comes 0.5 to 1.5 intervals after the first.
                        anchor[name] = now + (phase if phase >= 0.5 else phase + 1.0) \
                            * self.interval
                        counter += 1
                        generation[name] = counter
                        heapq.heappush(heap, (now, counter, name))
            while heap and heap[0][0] <= now:
                _, gen, name = heapq.heappop(heap)
                if name not in anchor or generation.get(name) != gen:
                    continue  # removed (or removed and added again: a newer entry exists)
                k = math.floor((now - anchor[name]) / self.interval) + 1
                heapq.heappush(heap, (anchor[name] + max(k, 0) * self.interval, gen, name))
                with self._lock:
                    busy = name in self._inflight
                if busy:
                    continue  # still running from the last slot: skip this one, never stack
                try:
                    fut = self._executor.submit(self._poll_scheduled, name)
                except RuntimeError:  # executor shut down
                    return
                with self._lock:
                    self._inflight[name] = fut
                fut.add_done_callback(lambda f, n=name: self._done(n, f))
            wait = heap[0][0] - time.monotonic() if heap else 1.0
            self._wake.wait(min(max(wait, 0.0), 1.0))
            self._wake.clear()
