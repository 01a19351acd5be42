"""`specwatch simulate --speed`: a speed the simulator cannot keep is refused on the command
line, and at any speed it accepts /metrics keeps answering and SIGTERM stops it.

``--speed inf`` or ``1e6`` spun at 100% CPU holding the simulation's lock for good: /metrics
stopped answering and SIGTERM was not heard.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from specwatch.cli import main
from specwatch.cli.numbers import MAX_SPEED
from specwatch.sim.scenario import load_scenario
from specwatch.sim.server import SimulatorServer

SPECWATCH = [sys.executable, "-m", "specwatch"]


@pytest.mark.parametrize("value", ["inf", "nan", "1e6", "10000", "0", "-1", ""])
def test_speeds_the_simulator_cannot_keep_are_one_line(capsys, value):
    assert main(["simulate", "--listen", "127.0.0.1:0", "--speed", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"specwatch simulate: error: --speed: expected a number in "
                          f"(0, {MAX_SPEED:g}], got {value!r}") and err.count("\n") == 1, err


def test_a_step_far_behind_releases_the_lock_and_hears_stop():
    """A driver step a million simulated seconds behind (a speed far past what the machine
    keeps up with) lets a scrape take the lock within a second and ends soon after stop().

    The second is of this process' CPU time (the step's work while the scrape waits), not of
    the wall clock: on a loaded machine the process gets a share of a core, and wall time
    stretches with the load while the step's work before it lets go does not."""
    wall = [1000.0]
    server = SimulatorServer(load_scenario("demo"), "127.0.0.1:0", speed=1.0,
                             clock=lambda: wall[0])
    wall[0] += 1e6
    stepper = threading.Thread(target=server.step, daemon=True)
    stepper.start()
    time.sleep(0.3)
    assert stepper.is_alive(), "the step was expected to take long"
    started = time.process_time()
    acquired = server.lock.acquire(timeout=60.0)
    waited = time.process_time() - started
    assert acquired, "a scrape could not take the simulation's lock"
    server.lock.release()
    assert waited < 1.0
    server.stop()
    stepper.join(timeout=5.0)
    assert not stepper.is_alive(), "the step did not stop"
    assert 0 < server.sim.now < 1e6


def test_at_the_highest_speed_metrics_answer_and_sigterm_stops_it():
    proc = subprocess.Popen([*SPECWATCH, "simulate", "--listen", "127.0.0.1:0", "--speed",
                             f"{MAX_SPEED:g}", "--log-level", "info"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        deadline = time.monotonic() + 30
        assert proc.stdout is not None
        while time.monotonic() < deadline and url is None:
            line = proc.stdout.readline()
            if "simulated vLLM on http://" in line:
                url = line.split(" on ", 1)[1].split()[0]
        assert url, "no startup line"
        for _ in range(3):
            time.sleep(1.0)
            with urllib.request.urlopen(url, timeout=5) as resp:
                assert resp.status == 200 and b"vllm:request_success_total" in resp.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
