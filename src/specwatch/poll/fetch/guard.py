"""The total deadline of a poll: the sockets it opens or reuses, shut down when it is due.

Socket timeouts apply per operation, so a server trickling one byte a second would never
time out. Every socket a poll opens or reuses is registered with the poll's :class:`Guard`;
one watchdog thread shuts the sockets of a poll down at its deadline (``recv`` then returns
at once, wherever the poll is: headers, TLS handshake, body), and the poller's ``stop()``
fires every guard in flight, so shutdown never waits for a target.

Invariant: a released guard never fires; a socket registered after its guard fired is shut
down at once.
"""

from __future__ import annotations

import contextlib
import heapq
import socket
import threading
import time


class Guard:
    """The sockets of one poll and its deadline; :meth:`fire` shuts them down."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.fired = False
        self.done = False
        self._socks: list[socket.socket] = []
        self._owned: list[socket.socket] = []
        self._lock = threading.Lock()

    def watch(self, sock: socket.socket, owned: bool = False) -> None:
        """Shut ``sock`` down when the guard fires; an ``owned`` socket (a duplicate made
        for the guard) is closed by :meth:`release`."""
        with self._lock:
            self._socks.append(sock)
            if owned:
                self._owned.append(sock)
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

    def release(self) -> None:
        """The poll is over: the guard never fires again; its duplicates are closed."""
        with self._lock:
            self.done = True
            owned, self._owned = self._owned, []
        for sock in owned:
            sock.close()


def _shutdown(sock: socket.socket) -> None:
    # The plain socket's shutdown even for an SSLSocket: SSLSocket.shutdown drops its SSL
    # object, which the reading thread may be using. A socket detached by wrap_socket or
    # closed has no descriptor any more: OSError, ignored (never another socket's fd).
    with contextlib.suppress(OSError, ValueError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Watchdog:
    """One thread for every poll's deadline: fires each :class:`Guard` when due."""

    #: Heap size from which finished guards are dropped before a new one is added.
    COMPACT_FROM = 64

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Guard]] = []
        self._count = 0
        self._thread: threading.Thread | None = None
        self._compact_at = self.COMPACT_FROM

    def add(self, guard: Guard) -> None:
        with self._cond:
            self._count += 1
            if len(self._heap) >= self._compact_at:
                # A finished poll's guard would otherwise wait in the heap until its
                # deadline: a target failing fast (connection refused) polled often would
                # pile up timeout / interval of them. Dropping them when the heap has
                # doubled since the last pass keeps it within twice the polls in flight
                # (plus COMPACT_FROM) at O(1) amortised cost a poll.
                self._heap = [e for e in self._heap if not e[2].done]
                heapq.heapify(self._heap)
                self._compact_at = max(self.COMPACT_FROM, 2 * len(self._heap))
            heapq.heappush(self._heap, (guard.deadline, self._count, guard))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="specwatch-deadline")
                self._thread.start()
            # Woken only when this deadline is the next one due: otherwise the thread
            # already waits for an earlier one and finds this one then.
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


def current() -> Guard | None:
    """The guard of the poll running in this thread, if any."""
    return getattr(_current, "guard", None)


def enter(guard: Guard) -> None:
    """Start a poll in this thread under ``guard``: its deadline is watched from now on."""
    _current.guard = guard
    _WATCHDOG.add(guard)


def leave(guard: Guard) -> None:
    """End the poll of ``guard`` in this thread (it never fires after this)."""
    guard.release()
    _current.guard = None


def watch(sock: socket.socket | None) -> None:
    """Register ``sock`` with the poll running in this thread (new or reused)."""
    guard = current()
    if guard is not None and sock is not None:
        guard.watch(sock)
