"""Resources stay flat while targets fail: memory (tracemalloc and RSS) and threads,
measured in the test over 1,000+ failed polls of a dead target driven by the real scheduler,
and threads over a target that never answers.

Why: a poller that leaks a session, a socket, a thread or a log buffer per failed poll
grows without bound on a dead target (php-fpm_exporter#253: linear RSS growth). Tolerances
are absolute and generous against noise, and far below what a per-poll leak produces over
1,000 polls (a 1 kB leak per poll is 1 MB).
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
import time
import tracemalloc
import urllib.request

from helpers.faultserver import Blackhole, FaultServer

from specwatch.app import settings as app_settings
from specwatch.app.serve import ServeApp


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/metrics"  # nothing listens: connection refused


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


_APP_THREADS = ("specwatch-poll", "specwatch-scheduler", "specwatch-http", "specwatch-conn",
                "specwatch-h")


def _exporter_threads() -> int:
    """Threads of the exporter's poller and HTTP server: not the fake target's, and not the
    leftovers of other tests in the same process (other components' names differ)."""
    return sum(1 for t in threading.enumerate() if t.name.startswith(_APP_THREADS))


def _wait_connections_closed(app: ServeApp) -> None:
    """The scrape's server-side connection thread ends just after the client closes."""
    deadline = time.monotonic() + 5
    while app.web.stats().connections and time.monotonic() < deadline:
        time.sleep(0.01)


def _wait_errors(app: ServeApp, name: str, n: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        total = sum(app.pipeline.snapshot.targets[name].errors_total.values())
        if total >= n:
            return total
        time.sleep(0.02)
    return sum(app.pipeline.snapshot.targets[name].errors_total.values())


def test_memory_and_threads_flat_over_1000_failed_polls(caplog):
    """1,000 failed polls (connection refused) after a 200-poll warm-up, with the real
    scheduler and scrapes in between: traced memory grows < 256 kB, RSS < 4 MB, and the
    exporter's thread count stays within its pools (+2)."""
    # pytest keeps every captured record: at DEBUG that alone would look like a leak.
    caplog.set_level(logging.WARNING)
    cfg = app_settings.build_config(None, [f"dead={_dead_url()}"], "127.0.0.1:0", 0.002)
    app = ServeApp(cfg)
    app.start(poll=False)
    host, port = app.web.address
    url = f"http://{host}:{port}/metrics"
    try:
        app.poller.start()
        assert _wait_errors(app, "dead", 200, 60) >= 200
        urllib.request.urlopen(url, timeout=5).read()
        _wait_connections_closed(app)
        gc.collect()
        # Traced from here on: what is still allocated at the end is the growth.
        tracemalloc.start()
        threads0, mem0, rss0 = _exporter_threads(), tracemalloc.get_traced_memory()[0], \
            _rss_bytes()
        for step in range(1, 11):
            _wait_errors(app, "dead", 200 + 100 * step, 60)
            urllib.request.urlopen(url, timeout=5).read()
        polls = _wait_errors(app, "dead", 1200, 60)
        _wait_connections_closed(app)
        gc.collect()
        threads1, mem1, rss1 = _exporter_threads(), tracemalloc.get_traced_memory()[0], \
            _rss_bytes()
        snap = app.pipeline.snapshot.targets["dead"]
    finally:
        tracemalloc.stop()
        app.stop()
    assert polls >= 1200 and not snap.up
    assert snap.errors_total["connection"] == sum(snap.errors_total.values())
    print(f"\n{polls - 200} failed polls: traced {mem1 - mem0:+d} B, RSS {rss1 - rss0:+d} B, "
          f"threads {threads0} -> {threads1}")
    assert mem1 - mem0 < 256 * 1024, (mem0, mem1)
    assert rss1 - rss0 < 4 * 1024 * 1024, (rss0, rss1)
    # Tolerance 2: thread pools (bounded: poll workers, HTTP handler workers) may add a
    # worker when a task is submitted just before the previous worker marked itself idle.
    # A per-poll leak would add hundreds.
    assert threads1 <= threads0 + 2, (threads0, threads1)


def test_threads_do_not_pile_up_on_a_target_that_never_answers(caplog, tmp_path):
    """A blackhole target polled every 50 ms with a 300 ms deadline for 2 s: at most one
    poll in flight (slots are skipped, not stacked), every poll ends at its deadline, and
    the thread count stays flat."""
    caplog.set_level(logging.WARNING)
    with FaultServer(Blackhole()) as hole:
        cfg_text = (f"global: {{listen: '127.0.0.1:0', timeout: 300ms}}\n"
                    f"targets: [{{name: hole, url: '{hole.url}'}}]\n")
        path = tmp_path / "specwatch.yaml"
        path.write_text(cfg_text)
        cfg = app_settings.build_config(str(path), [], None, 0.05)
        app = ServeApp(cfg)
        app.start(poll=False)
        try:
            app.poller.start()
            _wait_errors(app, "hole", 1, 10)
            threads0 = _exporter_threads()
            samples = []
            t_end = time.monotonic() + 2.0
            while time.monotonic() < t_end:
                samples.append(_exporter_threads())
                time.sleep(0.05)
            timeouts = app.pipeline.snapshot.targets["hole"].errors_total["timeout"]
        finally:
            app.stop()
    # 2 s / 300 ms: about 6 polls ran, one at a time (scheduled every 50 ms: 40 slots).
    assert 4 <= timeouts <= 12, timeouts
    assert max(samples) <= threads0 + 1, (threads0, max(samples))
