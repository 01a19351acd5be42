"""Background poller: every target every interval, concurrently, one poll in flight per target.

* **One poll in flight per target**: a slow target is skipped, not stacked, so specwatch
  never piles load on a struggling inference server.
* **Polls of fast targets run back to back; a slow target gets its own worker.** Every
  wake-up from idle costs a poll its cold caches, so the scheduler wakes at most once a
  *tick* (:attr:`Poller.tick`: a twentieth of the interval, at most 0.25 s; a poll starts up
  to one tick after its slot), and the due polls of targets whose last poll ended within a
  quarter of a tick (:attr:`Poller.fast_seconds`) go to one worker that runs them one after
  the other. A target whose last poll took longer (or that has not been polled yet) gets a
  worker of its own. When the oldest poll queued behind a target that turned slow has
  waited a tick, another worker takes over the batch. Work that can wait for the end of the
  batch (the exporter's renders) is left to ``after_run`` (see the class docstring).
  Measurements: docs/performance.md, "Concurrency: slow targets cannot stretch the cycle".
* **Every poll has a deadline guard** (:mod:`specwatch.poll.fetch.client`); :meth:`Poller.stop`
  fires the guards of the polls in flight, so shutdown never waits for a target.
* **One session per target** (:func:`~specwatch.poll.fetch.client.new_session`), made when the
  target appears and replaced when it changes: its keep-alive connection is never shared,
  so a stuck target cannot hold a connection another target needs.
* Secrets (bearer tokens, passwords) live in the target and its session only; error
  messages are redacted before they are stored.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import logging
import math
import queue
import threading
import time
import zlib
from collections.abc import Callable, Sequence

from specwatch.poll.fetch import client as _fetch
from specwatch.poll.fetch.client import (
    MAX_REDIRECTS,
    FetchSession,
    Guard,
    PollError,
    PollTarget,
    fetch,
    short_message,
)
from specwatch.poll.pipeline import PollResult

__all__ = ["MAX_REDIRECTS", "PollError", "PollTarget", "Poller", "fetch"]

log = logging.getLogger(__name__)


class _Drain:
    """The job that tells a worker to drain the batch of fast targets' polls."""


_DRAIN = _Drain()


def _session(url: str) -> FetchSession:
    """A target's session, the transport chosen from the environment (looked up through the
    module, so a test can pin the transport with ``monkeypatch``)."""
    return _fetch.new_session(url)


class Poller:
    """Schedules polls and hands each :class:`PollResult` to ``on_result``.

    ``clock`` gives the wall time stamped on results (inject a fake one in tests), ``stamp``
    (optional) their ``monotonic`` time, the clock windows are measured on; scheduling always
    uses ``time.monotonic``.

    **Concurrency.** The polls due are queued for a pool of worker threads, at most
    ``max_concurrent`` (default: no limit below the number of targets; the pool only grows to
    the number of polls actually in flight, and one-in-flight-per-target bounds that by the
    number of targets; workers are kept and reused). Fast targets' polls are batched (module
    docstring; ``batch=False`` gives every poll a job of its own): a batch gets one worker, and
    one more whenever its oldest poll has waited a tick, so a batch keeps up with the tick
    whether its servers answer slowly or fast. A poll that waits on a slow server holds
    one thread and no CPU until its deadline, so with one worker per target the longest poll of
    a cycle is bounded by the deadline (``timeout``), not by how many servers are slow; the CPU
    work of all polls (parse, derive) is serialized by the GIL and adds up to ``targets x CPU
    per poll``. With a bound P below the number of targets, S slow targets hold workers for
    ``timeout x ceil(S / P)`` in the worst case, and the fast ones queue behind them: keep
    ``timeout x ceil(S / P) + targets x CPU per poll`` below the interval (README, "Performance
    and scale").

    **Changing targets.** :meth:`set_targets` replaces the target set while running (file_sd
    discovery): new targets are polled at once, removed ones stop (a poll in flight finishes
    and its result is dropped by the pipeline), changed ones get a fresh session.

    **After a run of polls.** ``after_run`` (optional) is called by a worker once it has run
    its polls in a row and before it waits for more: when it finds the batch empty after
    draining it (and after every :attr:`longest_run` polls of a drain that does not end, so
    the work never waits long), and after a target's own poll. Work that may wait until the
    polls of a batch are done runs there together (the exporter renders its exposition lines
    then): the same reason polls run back to back, each kind of work warm in the caches after
    the one before. It must not block; an exception is logged.
    """

    def __init__(self, targets: Sequence[PollTarget], interval: float,
                 on_result: Callable[[PollResult], object],
                 clock: Callable[[], float] = time.time,
                 max_concurrent: int | None = None, spread: bool = True,
                 stamp: Callable[[], float] | None = None, batch: bool = True,
                 after_run: Callable[[], object] | None = None) -> None:
        self.targets: dict[str, PollTarget] = {}
        self.stamp = stamp
        self.after_run = after_run
        #: The most polls a worker drains in a row before it calls ``after_run``.
        self.longest_run = 50
        self.interval = float(interval)
        self.on_result = on_result
        self.clock = clock
        self._sessions: dict[str, FetchSession] = {}
        self._inflight: set[str] = set()  # targets with a poll queued or running
        self._retired: list[tuple[str, FetchSession]] = []
        self._guards: set[Guard] = set()  # polls in flight (stop() cuts them short)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # The scheduler's sleep: a lock held while it sleeps, released to wake it early (one
        # C call a wait; threading.Event builds a Condition and a lock on every wait).
        self._wake = threading.Lock()
        self._wake.acquire()
        self._thread: threading.Thread | None = None
        self._version = 0  # bumped by set_targets: the scheduler re-reads the targets
        # The workers: threads taking target names from one queue. A thread is started
        # only when no worker is free, so a large bound costs nothing until that many polls
        # are in flight at once. ``_spare``: workers minus polls queued or running (below 0:
        # polls waiting for a worker, at the bound).
        self.max_concurrent = max_concurrent
        self.spread = spread
        self._queue: queue.SimpleQueue[str | _Drain | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._spare = 0
        self._max_workers = max_concurrent or 1 << 16
        # Back-to-back polls (module docstring): the scheduler wakes at most once a tick;
        # the due polls of fast targets wait in ``_batch`` (name, when queued) for the
        # ``_draining`` workers that run them.
        #: The scheduler's shortest sleep, and the longest a batched poll waits for a worker.
        self.tick = min(0.25, self.interval / 20) if batch else 0.0
        #: A target whose last poll ended within this many seconds is batched.
        self.fast_seconds = self.tick / 4
        self._batch: collections.deque[tuple[str, float]] = collections.deque()
        self._fast: set[str] = set()
        self._draining = 0
        self.set_targets(targets)

    def set_targets(self, targets: Sequence[PollTarget]) -> None:
        """Replace the target set (safe while polling; see the class docstring)."""
        new = {t.name: t for t in targets}
        with self._lock:
            for name, old in list(self.targets.items()):
                if new.get(name) != old:  # removed or changed: retire its session
                    self._fast.discard(name)  # (and forget how fast it was)
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
        self._wakeup()

    def poll_now(self, name: str) -> PollResult:
        """Poll one target synchronously in the calling thread and deliver the result."""
        with self._lock:
            target = self.targets[name]
            session = self._sessions[name]
        started_wall = self.clock()
        t0 = time.monotonic()
        body, reason, message = None, None, ""
        guard = Guard(t0 + target.timeout_seconds)
        with self._lock:
            self._guards.add(guard)
        if self._stop.is_set():
            guard.fire()
        try:
            body = fetch(session, target, guard=guard)
        except PollError as exc:
            reason, message = exc.reason, str(exc)
        except Exception as exc:  # never let a poll kill its worker
            reason, message = "connection", f"{type(exc).__name__}: {short_message(exc)}"
        finally:
            with self._lock:
                self._guards.discard(guard)
        duration = time.monotonic() - t0
        result = PollResult(target=name, started=started_wall, finished=self.clock(),
                            duration_seconds=duration, body=body, error_reason=reason,
                            error_message=message,
                            monotonic=self.stamp() if self.stamp is not None else None)
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
        self._wakeup()
        with self._lock:
            guards = list(self._guards)
        for g in guards:
            g.fire()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._lock:
            workers = list(self._workers)
        for _ in workers:
            self._queue.put(None)  # after the queued polls, which a stopped poller skips
        for w in workers:
            w.join()
        with self._lock:
            sessions = list(self._sessions.values()) + [s for _, s in self._retired]
            self._retired.clear()
        for s in sessions:
            s.close()

    def _wakeup(self) -> None:
        """Wake the scheduler now (targets changed, stopping)."""
        with contextlib.suppress(RuntimeError):  # already released: a wake-up is pending
            self._wake.release()

    def _submit(self, name: str) -> None:
        """Queue a poll of ``name`` unless one is queued or running (never stacked): a fast
        target's in the batch (:meth:`_kick` gives it a worker), any other as a job of its
        own."""
        with self._lock:
            if name in self._inflight or self._stop.is_set():
                return
            self._inflight.add(name)
            if name in self._fast:
                self._batch.append((name, time.monotonic()))
                return
            worker = self._queue_job(name)
        if worker is not None:
            worker.start()

    def _kick(self, now: float) -> float | None:
        """Give the batch a worker when none drains it, or one more when its oldest poll
        has waited a tick (the workers draining it wait on servers slower than their last
        poll, or cannot keep up one after the other). Returns when to look again (None:
        the batch is empty, or its one poll was just given a drainer of its own)."""
        with self._lock:
            if not self._batch or self._stop.is_set():
                return None
            oldest = self._batch[0][1]
            if self._draining and now - oldest < self.tick:
                return oldest + self.tick
            worker = None
            queued = self._draining < self._max_workers
            if queued:
                self._draining += 1
                worker = self._queue_job(_DRAIN)
            # A lone poll given its own drainer has nothing queued behind it: no need to
            # look again (a poll batched later is looked at when it is queued). One target
            # polled every second: one scheduler wake-up a poll instead of two.
            alone = queued and len(self._batch) == 1
        if worker is not None:
            worker.start()
        return None if alone else now + self.tick

    def _queue_job(self, job: str | _Drain) -> threading.Thread | None:
        """Queue a job (a target's name, or :data:`_DRAIN`); called with the lock held.
        Returns a new worker for the caller to start (after releasing the lock) when no
        worker is free and the bound allows one more."""
        self._spare -= 1
        worker = None
        if self._spare < 0 and len(self._workers) < self._max_workers:
            self._spare += 1
            worker = threading.Thread(target=self._work, daemon=True,
                                      name=f"specwatch-poll_{len(self._workers)}")
            self._workers.append(worker)
        self._queue.put(job)
        return worker

    def _work(self) -> None:
        """A worker: runs the queued jobs until stop() queues its end (None).

        A plain queue and threads, not ThreadPoolExecutor: a poll needs no Future, and
        the executor's bookkeeping (Future, work item, idle semaphore, done callback, each
        with its own lock) cost about as much CPU per poll as fetching a small page on a
        direct connection."""
        while True:
            job = self._queue.get()
            if job is None:
                return
            if isinstance(job, _Drain):
                if not self._drain():
                    continue  # another worker had drained the batch: no run of polls
            else:
                try:
                    self._poll(job)
                finally:
                    with self._lock:
                        self._spare += 1
            self._after_run()

    def _after_run(self) -> None:
        """Call ``after_run`` (see the class docstring); never raises."""
        hook = self.after_run
        if hook is not None:
            try:
                hook()
            except Exception:
                log.exception("the work after a run of polls failed")

    def _drain(self) -> int:
        """Poll the batched targets one after the other until the batch is empty (once the
        poller stops, :meth:`_poll` drops the polls left, as it does a queued job's).
        Returns how many it took from the batch."""
        ran = 0
        while True:
            with self._lock:
                if not self._batch:
                    self._draining -= 1
                    self._spare += 1
                    return ran
                name = self._batch.popleft()[0]
            self._poll(name)
            ran += 1
            if ran % self.longest_run == 0:  # a batch refilled faster than it drains
                self._after_run()

    def _poll(self, name: str) -> None:
        """One scheduled poll; then the target is free for its next slot, and its next poll
        is batched when this one ended within :attr:`fast_seconds`."""
        result = None
        try:
            if not self._stop.is_set():  # stop() drops the polls still queued
                result = self._poll_scheduled(name)
        except Exception:  # poll_now contains its own failures; this is a last resort
            log.exception("poll of %s failed", name)
        finally:
            fast = result is not None and result.duration_seconds < self.fast_seconds
            with self._lock:
                self._inflight.discard(name)
                if fast and name in self.targets:  # a removed target is forgotten
                    self._fast.add(name)
                else:
                    self._fast.discard(name)
                retired = [s for n, s in self._retired if n == name] if self._retired else []
                if retired:
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
                # Still running from the last slot: this one is skipped, never stacked.
                self._submit(name)
            # Until the next slot, but at least a tick after this wake-up: the fast targets
            # due meanwhile then run back to back in one worker (module docstring), not
            # each in a worker of its own contending for the GIL. Sooner when the batch may
            # need another worker.
            again = self._kick(time.monotonic())
            wake = max(heap[0][0], now + self.tick) if heap else now + 1.0
            if again is not None:
                wake = min(wake, again)
            self._wake.acquire(timeout=min(max(wake - time.monotonic(), 0.0), 1.0))
