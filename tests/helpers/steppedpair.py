"""A simulated A/B pair on a clock the test owns and steps (the live pair end-to-end tests).

Why: on the wall clock, a simulator's driver thread and the exporter's poller run when the
scheduler lets them, so under machine load the instant a page describes and the stamp the
exporter gives its poll drift apart by speed x delay, differently for every poll and side,
and what the exporter measures moves with the load (the docstring of
tests/plugins/pairs/test_pairs_e2e.py has the details). Here nothing moves unless the test moves it:

* :class:`SteppedClock` is the only clock: both simulators (speed 1, ``simulated_clock``:
  its seconds are simulated seconds) and the exporter (``ServeApp(cfg, clock=clock)``,
  started with ``start(poll=False)``) read it;
* the simulators have no driver of their own (a one-hour tick): :func:`step_pair` sets
  the clock, brings both simulations to exactly that instant, then polls both sides over
  HTTP, so every poll stamp is the instant its page describes, on both sides.

The simulations are seeded, so the exporter's state after each step is the same on every
run, loaded or not; only the wall time it takes changes.

Prometheus stays on the wall clock. :func:`wait_until_prometheus_shows` waits until its
latest scrape holds exactly the pair series the exporter shows now, compared by content:
a scrape's timestamp does not say which state it holds (the first scrape stamped after the
test's last poll was seen holding the page from before that poll, so a read right after it
gave another figure on every run).
"""

from __future__ import annotations

import math
import time

from promsim import query, wait_for_scrape_after

from specwatch.app.serve import ServeApp
from specwatch.sim.scenario import Scenario
from specwatch.sim.server import SimulatorServer, baseline_scenario

#: A simulator's driver tick when the test steps it (never reached in a test's lifetime).
NO_DRIVER_TICK = 3600.0


class SteppedClock:
    """A clock that moves only when told (Unix seconds; starts on a whole second so that
    poll stamps a whole number of seconds apart are exactly that far apart in floating
    point)."""

    def __init__(self) -> None:
        self.start = float(math.floor(time.time()))
        self.t = self.start

    def __call__(self) -> float:
        return self.t


def stepped_pair(scenario: Scenario, sd_port: int, base_port: int, clock: SteppedClock,
                 record_latencies: int = 0) -> tuple[SimulatorServer, SimulatorServer]:
    """The SD side (``scenario``) and its baseline (the same traffic, SD off) on ``clock``,
    not started: speed 1 on the simulated clock, no driver thread (:func:`step_pair`)."""
    sd = SimulatorServer(scenario, f"127.0.0.1:{sd_port}", 1.0, clock=clock,
                         tick=NO_DRIVER_TICK, record_latencies=record_latencies,
                         simulated_clock=True)
    base = SimulatorServer(baseline_scenario(scenario), f"127.0.0.1:{base_port}", 1.0,
                           clock=clock, tick=NO_DRIVER_TICK,
                           record_latencies=record_latencies, simulated_clock=True)
    return sd, base


def step_pair(clock: SteppedClock, t: float, app: ServeApp,
              sides: tuple[tuple[SimulatorServer, str], ...]) -> None:
    """Move ``clock`` to ``t``, bring each simulator to that instant and poll its exporter
    target (``(server, target name)``) over HTTP; a failed poll fails the test."""
    clock.t = t
    for server, name in sides:
        server.step()
        result = app.poller.poll_now(name)
        assert result.error_reason is None, result


#: The pair families (specwatch.plugins.pairs.plugin) as Prometheus stores them.
PAIR_SERIES = '{job="specwatch",__name__=~"sd_measured_.*|sd_pair_.*"}'
#: Labels Prometheus adds to what it scrapes.
TARGET_LABELS = ("__name__", "instance", "job")

SeriesState = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def pair_series(app: ServeApp) -> SeriesState:
    """Every pair sample the exporter shows now: (name, labels) -> value."""
    assert app.pairs is not None
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in app.pairs.families() for s in fam.samples}


def wait_until_prometheus_shows(prom: str, app: ServeApp, timeout: float = 60.0,
                                poll: float = 0.05) -> float:
    """Until the latest samples Prometheus holds of the pair series are exactly what the
    exporter shows now (same series, same values: Prometheus keeps float64 values
    exactly, and a series that left the page is stale); returns the timestamp of the
    latest successful scrape, which holds them (with no pair series yet: of a successful
    scrape after now)."""
    want = pair_series(app)
    if not want:
        return wait_for_scrape_after(prom, time.time(), timeout=timeout, poll=poll)
    deadline = time.monotonic() + timeout
    got: SeriesState = {}
    while time.monotonic() < deadline:
        got = {(r["metric"]["__name__"],
                tuple(sorted((k, v) for k, v in r["metric"].items()
                             if k not in TARGET_LABELS))): float(r["value"][1])
               for r in query(prom, PAIR_SERIES)}
        if got == want:
            # The latest successful scrape: the one that holds them or a later one (the
            # page does not change until the test polls again).
            rows = query(prom, 'timestamp(up{job="specwatch"} == 1)')
            return float(rows[0]["value"][1])
        time.sleep(poll)
    raise AssertionError(f"Prometheus at {prom} did not show the exporter's pair series in"
                         f" {timeout}s: {len(want)} series expected, {len(got)} seen")
