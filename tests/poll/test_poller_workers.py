"""The poller's workers: bounded concurrency, one poll in flight per target, reuse, stop.

The fetch is replaced by a function the test controls, so these pin the scheduling and the
worker pool alone (the transports have their own tests: test_fetch_paths.py)."""

from __future__ import annotations

import threading
import time

import pytest

from specwatch.poll import poller as poller_mod
from specwatch.poll.pipeline import PollResult
from specwatch.poll.poller import Poller, PollTarget


class Gate:
    """A fetch that blocks until released (or until its poll's guard fires on stop())."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.lock = threading.Lock()
        self.running: dict[str, int] = {}
        self.peak = 0
        self.peak_per_target = 0
        self.calls: list[str] = []

    def __call__(self, session, target, monotonic=time.monotonic, guard=None) -> str:
        with self.lock:
            self.calls.append(target.name)
            self.running[target.name] = self.running.get(target.name, 0) + 1
            self.peak = max(self.peak, sum(self.running.values()))
            self.peak_per_target = max(self.peak_per_target, self.running[target.name])
        try:
            while not self.open.wait(0.01):
                if guard is not None and guard.fired:
                    raise poller_mod.PollError("timeout", "stopped")
            return "page"
        finally:
            with self.lock:
                self.running[target.name] -= 1


def _workers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("specwatch-poll")}


def _wait(cond, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


@pytest.fixture
def gate(monkeypatch) -> Gate:
    g = Gate()
    monkeypatch.setattr(poller_mod, "fetch", g)
    return g


def _targets(n: int) -> list[PollTarget]:
    return [PollTarget(f"t{i}", f"http://127.0.0.1:9/m{i}") for i in range(n)]


def test_max_concurrent_bounds_the_polls_in_flight_and_the_rest_wait(gate):
    """Five targets, a bound of two: two polls run, three wait for a free worker (none is
    lost), and no third worker thread is started."""
    before = _workers()
    results: list[PollResult] = []
    p = Poller(_targets(5), 60.0, results.append, max_concurrent=2)
    p.start()
    try:
        _wait(lambda: gate.peak == 2)
        time.sleep(0.3)
        assert gate.peak == 2 and len(gate.calls) == 2
        assert len(_workers() - before) == 2
        gate.open.set()
        _wait(lambda: len(results) == 5)
        assert sorted(r.target for r in results) == [f"t{i}" for i in range(5)]
        assert all(r.body == "page" for r in results)
        assert len(_workers() - before) == 2
    finally:
        gate.open.set()
        p.stop()


def test_a_slow_target_is_never_stacked_and_workers_are_reused(gate):
    """A poll that outlasts several intervals holds its slot: no second poll of that target
    starts while it runs; once polls end quickly, one worker serves them all."""
    before = _workers()
    results: list[PollResult] = []
    p = Poller(_targets(1), 0.05, results.append)
    p.start()
    try:
        _wait(lambda: len(gate.calls) == 1)
        time.sleep(0.4)  # eight slots pass while the first poll runs
        assert gate.calls == ["t0"] and gate.peak_per_target == 1
        gate.open.set()
        _wait(lambda: len(results) >= 6)
        assert gate.peak_per_target == 1
        assert len(_workers() - before) == 1
    finally:
        gate.open.set()
        p.stop()


def test_stop_drops_the_queued_polls_and_ends_every_worker(gate):
    """stop() cuts the running poll short (its guard fires), drops the polls still queued
    behind the bound, and returns with no worker thread left."""
    before = _workers()
    results: list[PollResult] = []
    p = Poller(_targets(4), 60.0, results.append, max_concurrent=1)
    p.start()
    _wait(lambda: len(gate.calls) == 1)
    t0 = time.monotonic()
    p.stop(timeout=5)
    assert time.monotonic() - t0 < 2.0
    assert len(gate.calls) == 1  # the three queued polls never ran
    assert [r.error_reason for r in results] == ["timeout"]
    assert not (_workers() - before)


def test_a_result_handler_that_raises_keeps_the_worker(gate):
    """A failing result handler is logged; the worker goes on to the next polls."""
    gate.open.set()
    before = _workers()
    seen: list[str] = []

    def on_result(r: PollResult) -> None:
        seen.append(r.target)
        raise RuntimeError("handler bug")

    p = Poller(_targets(1), 0.05, on_result)
    p.start()
    try:
        _wait(lambda: len(seen) >= 4)
        assert len(_workers() - before) == 1
    finally:
        p.stop()


def test_results_carry_the_stamp_clock(gate):
    """With ``stamp`` every result carries the clock windows are measured on (ServeApp's
    history clock), so the pipeline needs no copy of the result to stamp it."""
    gate.open.set()
    results: list[PollResult] = []
    p = Poller(_targets(1), 60.0, results.append, stamp=lambda: 1234.5)
    try:
        assert p.poll_now("t0").monotonic == 1234.5
    finally:
        p.stop()
    q = Poller(_targets(1), 60.0, results.append)
    try:
        assert q.poll_now("t0").monotonic is None
    finally:
        q.stop()


class Recorder:
    """A fetch that answers at once, except for the targets in ``hold`` (until released),
    and records which thread ran each poll and when it started."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str, float]] = []  # (target, thread, monotonic start)
        self.hold: set[str] = set()
        self.release = threading.Event()

    def __call__(self, session, target, monotonic=time.monotonic, guard=None) -> str:
        with self.lock:
            self.calls.append((target.name, threading.current_thread().name, time.monotonic()))
        if target.name in self.hold:
            while not self.release.wait(0.01):
                if guard is not None and guard.fired:
                    raise poller_mod.PollError("timeout", "stopped")
        return "page"

    def rounds(self, name: str) -> list[float]:
        with self.lock:
            return [t for n, _, t in self.calls if n == name]


@pytest.fixture
def recorder(monkeypatch) -> Recorder:
    r = Recorder()
    monkeypatch.setattr(poller_mod, "fetch", r)
    return r


def test_fast_targets_due_together_run_back_to_back_in_one_worker(recorder):
    """Once a target's last poll was fast, its polls due in the same tick run one
    after the other in one worker (warm caches, one wake-up), not one thread each."""
    # A 2 s interval: a poll counts as fast under 25 ms, which a loaded machine still meets.
    p = Poller(_targets(5), 2.0, lambda r: None, spread=False)
    p.start()
    try:
        _wait(lambda: all(len(recorder.rounds(f"t{i}")) >= 3 for i in range(5)))
    finally:
        p.stop()
    with recorder.lock:
        calls = list(recorder.calls)
    later = [c for c in calls if sum(1 for d in calls[:calls.index(c)] if d[0] == c[0]) >= 1]
    # After its first poll, every round of the five targets ran in a single thread.
    by_round: dict[int, set[str]] = {}
    seen: dict[str, int] = {}
    for name, thread, _ in later:
        seen[name] = seen.get(name, 0) + 1
        by_round.setdefault(seen[name], set()).add(thread)
    assert len(by_round) >= 2
    assert all(len(threads) == 1 for threads in by_round.values()), by_round


def test_a_target_that_turns_slow_holds_its_batch_back_at_most_about_a_tick(recorder):
    """A batched target whose server stops answering delays the polls queued behind it only
    until the scheduler sees the oldest waiting a tick: another worker takes them over. Its
    own next poll is no longer batched (it was slow)."""
    p = Poller(_targets(3), 2.0, lambda r: None, spread=False)
    assert p.tick == pytest.approx(0.1)
    p.start()
    try:
        _wait(lambda: all(len(recorder.rounds(f"t{i}")) >= 2 for i in range(3)))
        recorder.hold.add("t0")  # from its next poll on, t0 answers only when released
        _wait(lambda: len(recorder.rounds("t0")) >= 3)
        held_at = recorder.rounds("t0")[2]
        _wait(lambda: all(len(recorder.rounds(f"t{i}")) >= 3 for i in (1, 2)))
        for name in ("t1", "t2"):
            started = recorder.rounds(name)[2]
            # Queued behind t0 in the same tick: taken over after about a tick, far
            # before t0's poll ends (it is held until released).
            assert started - held_at < 0.5, (name, started - held_at)
        assert len(recorder.rounds("t0")) == 3  # never stacked
        assert "t0" in p._fast  # batched until its slow poll ends
        recorder.release.set()
        # Known as slow as soon as that poll ends (its next one is about 1.7 s later).
        _wait(lambda: "t0" not in p._fast, seconds=1.0)
    finally:
        recorder.release.set()
        p.stop()


def test_stop_drops_the_batched_polls_not_yet_run(recorder):
    """stop() while a worker drains the batch: the poll running is cut short, the batched
    polls behind it never run, and no worker is left."""
    before = _workers()
    results: list[PollResult] = []
    p = Poller(_targets(4), 1.0, results.append, spread=False, max_concurrent=1)
    p.start()
    _wait(lambda: all(len(recorder.rounds(f"t{i}")) >= 1 for i in range(4)))
    recorder.hold.add("t0")
    _wait(lambda: len(recorder.rounds("t0")) >= 2)
    p.stop(timeout=5)
    assert all(len(recorder.rounds(f"t{i}")) == 1 for i in (1, 2, 3))
    assert results[-1].target == "t0" and results[-1].error_reason == "timeout"
    assert not (_workers() - before)


def test_without_batching_every_poll_has_a_worker_of_its_own(recorder):
    """``batch=False`` keeps the former dispatch: polls due together run concurrently."""
    p = Poller(_targets(3), 0.5, lambda r: None, spread=False, batch=False)
    assert p.tick == 0.0
    recorder.hold.update({"t0", "t1", "t2"})
    p.start()
    try:
        _wait(lambda: all(len(recorder.rounds(f"t{i}")) >= 1 for i in range(3)))
        with recorder.lock:
            gate_threads = {t for _, t, _ in recorder.calls}
        assert len(gate_threads) == 3
    finally:
        recorder.release.set()
        p.stop()


def test_a_removed_target_is_forgotten_by_the_batching(recorder):
    """State stays bounded under target churn (file_sd): a removed target leaves no trace in
    the set of fast targets, also when its last poll ends after the removal."""
    p = Poller(_targets(3), 1.0, lambda r: None, spread=False)
    p.start()
    try:
        _wait(lambda: p._fast == {"t0", "t1", "t2"})
        n = len(recorder.rounds("t1"))
        recorder.hold.add("t1")
        _wait(lambda: len(recorder.rounds("t1")) > n)
        assert "t1" in p._inflight
        _wait(lambda: "t2" not in p._inflight and "t2" in p._fast)
        p.set_targets(_targets(1))  # t1 is removed while its poll is in flight, t2 idle
        recorder.release.set()
        _wait(lambda: "t1" not in p._inflight)
        time.sleep(0.3)
        assert p._fast <= {"t0"}
    finally:
        recorder.release.set()
        p.stop()


class CountingLock:
    """The scheduler's sleep lock, counting its sleeps (one per scheduler wake-up)."""

    def __init__(self, lock) -> None:
        self.lock = lock
        self.sleeps: list[float] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self.sleeps.append(time.monotonic())
        return self.lock.acquire(blocking, timeout)

    def release(self) -> None:
        self.lock.release()


def test_a_lone_batched_poll_costs_one_scheduler_wake_up(recorder):
    """One target polled every second is batched alone. Its drainer has nothing
    queued behind it, so the scheduler does not wake a tick later to look at the batch: one
    wake-up a poll, not two (each wake-up of an idle thread costs cold caches)."""
    p = Poller(_targets(1), 1.0, lambda r: None, spread=False)
    p._wake = CountingLock(p._wake)
    p.start()
    try:
        _wait(lambda: len(recorder.rounds("t0")) >= 2)  # batched from its second poll
        first = recorder.rounds("t0")[1]
        _wait(lambda: len(recorder.rounds("t0")) >= 5)
        last = recorder.rounds("t0")[4]
    finally:
        p.stop()
    sleeps = [t for t in p._wake.sleeps if first <= t <= last]
    assert len(sleeps) <= 4, [round(t - first, 3) for t in sleeps]  # one per poll: 3 or 4


def test_after_run_follows_a_run_of_batched_polls_not_each_poll(recorder):
    """``after_run`` (the exporter's renders) is called by the worker once it has
    run the batched polls of a tick one after the other, after their results, not between
    two of them: the five targets' rounds give about one call per round, each after the
    polls that worker ran since its previous call."""
    events: list[tuple[str, str]] = []  # (what, thread); list.append is atomic

    def on_result(r: PollResult) -> None:
        events.append((r.target, threading.current_thread().name))

    def after_run() -> None:
        events.append(("after", threading.current_thread().name))

    p = Poller(_targets(5), 2.0, on_result, spread=False, after_run=after_run)
    p.start()
    try:
        _wait(lambda: all(len(recorder.rounds(f"t{i}")) >= 4 for i in range(5)))
    finally:
        p.stop()
    polls = [e for e in events if e[0] != "after"]
    afters = [e for e in events if e[0] == "after"]
    # Every call comes after at least one poll of its thread since that thread's last call.
    ran: dict[str, int] = {}
    for what, thread in events:
        if what == "after":
            assert ran.get(thread, 0) >= 1, events
            ran[thread] = 0
        else:
            ran[thread] = ran.get(thread, 0) + 1
    # The first round gives each target a worker (and a call) of its own; then the batched
    # rounds: one call per round, a few more if a loaded machine splits a round.
    batched_polls = len(polls) - 5
    assert len(afters) - 5 <= batched_polls / 2, events


def test_after_run_follows_a_targets_own_poll(recorder):
    """Without batching, every poll is a run of its own: each result is followed by one
    call of ``after_run`` in the same thread."""
    events: list[tuple[str, str]] = []

    def on_result(r: PollResult) -> None:
        events.append(("poll", threading.current_thread().name))

    def after_run() -> None:
        events.append(("after", threading.current_thread().name))

    p = Poller(_targets(1), 0.05, on_result, spread=False, batch=False, after_run=after_run)
    p.start()
    try:
        _wait(lambda: sum(1 for e in events if e[0] == "after") >= 4)
    finally:
        p.stop()
    whats = [what for what, _ in events]
    n = len(whats) - len(whats) % 2
    assert whats[:n] == ["poll", "after"] * (n // 2), whats
    assert all(events[i][1] == events[i + 1][1] for i in range(0, n, 2))


def test_an_after_run_that_raises_is_logged_and_polling_goes_on(recorder, caplog):
    """A failing ``after_run`` is logged; the worker keeps polling."""
    results: list[PollResult] = []
    calls: list[int] = []

    def after_run() -> None:
        calls.append(1)
        raise RuntimeError("render bug")

    p = Poller(_targets(1), 0.05, results.append, after_run=after_run)
    p.start()
    try:
        _wait(lambda: len(results) >= 4 and len(calls) >= 3)
    finally:
        p.stop()
    assert "the work after a run of polls failed" in caplog.text


def test_a_long_drain_calls_after_run_every_longest_run_polls(recorder):
    """A batch refilled as fast as it drains never lets its worker wait: ``after_run`` is
    then called after every ``longest_run`` polls, so the work left for it (renders) never
    waits for the end of the drain."""
    events: list[tuple[str, str]] = []

    def on_result(r: PollResult) -> None:
        events.append((r.target, threading.current_thread().name))

    def after_run() -> None:
        events.append(("after", threading.current_thread().name))

    p = Poller(_targets(5), 2.0, on_result, spread=False, after_run=after_run)
    p.longest_run = 2
    p.start()
    try:
        _wait(lambda: all(len(recorder.rounds(f"t{i}")) >= 3 for i in range(5)))
    finally:
        p.stop()
    ran: dict[str, int] = {}
    for what, thread in events:
        if what == "after":
            ran[thread] = 0
        else:
            ran[thread] = ran.get(thread, 0) + 1
            assert ran[thread] <= 2, events
