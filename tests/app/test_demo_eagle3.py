"""`specwatch demo --scenario eagle3-k5`: EAGLE-3 at k = 5 with the shipped parameters, run as
an A/B pair. Healthy SD whose vLLM acceptance rate (0.25) reads as failing: the controller
must not act, because what it compares (the first-position acceptance, 0.55) does not fall
with k, and both the predicted and the measured speedup show SD paying (about 1.8-1.9x).

One run of the packaged scenario (30 scenario minutes, 90 wall seconds at --speed 20) with
the demo's real Prometheus feeds every test here; times are scenario time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from specwatch.app import demo as demo_app
from specwatch.cli import demo as demo_cli
from specwatch.sim.scenario import packaged_scenario_path

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("prometheus") is None,
                       reason="needs Debian's prometheus (make setup installs it)"),
]

REPO = Path(__file__).resolve().parents[2]
SPEED = 20.0
#: Scenario seconds after the story's end that the run goes on (the last windows complete).
TAIL_S = 60.0
#: From here on every window of the model (5m) is complete and steady in its phase.
WARM_S = 360.0
SD = 'target="vllm-sim"'


@dataclass
class Run:
    prom: str
    wall0: float
    start: float
    end: float
    phases: list[tuple[str, float, float]]
    demo: demo_app.Demo

    def t(self, wall: float) -> float:
        return (wall - self.wall0) * SPEED

    def series(self, expr: str) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        q = urllib.parse.urlencode({"query": expr, "start": self.start, "end": self.end,
                                    "step": "1"})
        with urllib.request.urlopen(f"{self.prom}/api/v1/query_range?{q}", timeout=60) as r:
            body = json.loads(r.read().decode())
        assert body["status"] == "success", body
        return [(s["metric"], [(self.t(float(ts)), float(v)) for ts, v in s["values"]])
                for s in body["data"]["result"]]

    def steady(self, values: list[tuple[float, float]], margin: float = WARM_S
               ) -> list[tuple[float, float]]:
        """The points at least ``margin`` scenario seconds into their phase."""
        return [(t, v) for t, v in values
                if any(lo + margin <= t <= hi for _, lo, hi in self.phases)]


@pytest.fixture(scope="module")
def run() -> Iterator[Run]:
    parser = argparse.ArgumentParser()
    demo_cli.add_arguments(parser)
    # The user's command: `specwatch demo --scenario eagle3-k5` (A/B pair by default).
    args = parser.parse_args(["--scenario", "eagle3-k5", "--speed", f"{SPEED:g}",
                              "--exporter-listen", "127.0.0.1:0"])
    assert args.pair
    d = demo_app.Demo(demo_cli.options(args))
    try:
        d.start()
        assert d.prometheus_url and d.baseline is not None
        phases, t = [], 0.0
        for ph in d.scenario.models[0].phases:
            phases.append((ph.name, t, t + ph.duration_s))
            t += ph.duration_s
        start = time.time()
        while d.simulator.sim_time_now() < t + TAIL_S:
            time.sleep(1.0)
        time.sleep(2.0)
        yield Run(d.prometheus_url.rstrip("/"), d.simulator.wall0, start, time.time(),
                  phases, d)
    finally:
        d.stop()


def test_the_scenario_runs_the_shipped_parameters_at_k5():
    """The packaged parameters are the shipped example's, byte for byte, and k is 5."""
    folder = packaged_scenario_path("eagle3-k5").parent
    assert (folder / "eagle3-k5-params.yaml").read_bytes() == \
        (REPO / "examples/params/qwen3-32b-h100-eagle3.yaml").read_bytes()
    from specwatch.sim.scenario import load_scenario

    [model] = load_scenario("eagle3-k5").models
    assert model.num_speculative_tokens == 5


def test_vllms_rate_reads_low_while_the_first_position_is_healthy(run: Run) -> None:
    """What an acceptance alert reads on the exporter, 1m window: vLLM's acceptance rate
    below 0.4 throughout the steady phases, the per-position rate at position 0 at or
    above 0.4 at every point (both present at the same times)."""
    [(_, rate)] = run.series(f'sd_acceptance_rate{{{SD}, window="1m"}}')
    [(_, first)] = run.series(
        f'sd_position_acceptance_rate{{{SD}, window="1m", position="0"}}')
    rate_pts, first_pts = dict(run.steady(rate, 120.0)), dict(run.steady(first, 120.0))
    common = sorted(set(rate_pts) & set(first_pts))
    assert len(common) > 40
    print(f"1m window, {len(common)} points: vLLM acceptance rate "
          f"{min(rate_pts.values()):.3f}-{max(rate_pts.values()):.3f} (median "
          f"{statistics.median(rate_pts.values()):.3f}); position 0 "
          f"{min(first_pts.values()):.3f}-{max(first_pts.values()):.3f} (median "
          f"{statistics.median(first_pts.values()):.3f})")
    assert max(rate_pts[t] for t in common) < 0.4
    assert min(first_pts[t] for t in common) >= 0.4
    [(_, alpha)] = run.series(f'sd_token_acceptance_probability{{{SD}, window="5m"}}')
    print(f"per-token α (5m): median {statistics.median(v for _, v in run.steady(alpha)):.3f}")


def test_the_acceptance_alert_stays_silent_and_nothing_pages(run: Run) -> None:
    """The shipped rules, as the demo's Prometheus loads them: the acceptance alert reads the
    k-independent α (the first-position acceptance here, ~0.55), so it is never even pending
    on this healthy k = 5 SD, although vLLM's rate (~0.25) is below its 0.4; and no critical
    alert (a page) goes pending, since SD makes requests faster."""
    [(labels, alpha)] = run.series(f'sd_acceptance_alpha{{{SD}, window="1m"}}')
    assert labels["method"] == "first_position"
    steady = [v for _, v in run.steady(alpha, 120.0)]
    assert len(steady) > 40 and min(steady) >= 0.4
    alerts: dict[str, set[str]] = {}
    for labels, _ in run.series('ALERTS{alertname=~"SD.+"}'):
        alerts.setdefault(labels["alertname"], set()).add(labels["alertstate"])
    print(f"alerts during the run: {alerts}; 1m α {min(steady):.3f}-{max(steady):.3f}")
    assert "SDAcceptanceRateLow" not in alerts
    assert run.series('ALERTS{severity="critical"}') == []


def test_predicted_and_measured_speedups_show_sd_paying(run: Run) -> None:
    """The predicted speedup (model window, 5m) is 1.7-2.1x in both phases, and the A/B
    pair measures a mean speedup whose 90% interval lies above enable_above_speedup (1.2)
    in the bin of each phase (2-4 and 4-6 req/s)."""
    [(_, predicted)] = run.series(f'sd_predicted_speedup{{{SD}, window="5m"}}')
    pts = [v for _, v in run.steady(predicted)]
    assert len(pts) > 40
    print(f"predicted speedup: {min(pts):.2f}-{max(pts):.2f} (median "
          f"{statistics.median(pts):.2f})")
    assert min(pts) >= 1.7 and max(pts) <= 2.1
    end = run.t(run.end)
    measured: dict[str, tuple[float, float, float]] = {}
    for labels, values in run.series(f'sd_measured_speedup{{{SD}, statistic="mean"}}'):
        measured[labels["arrival_rate_bin"]] = (values[-1][1], 0.0, 0.0)
    for bound in ("lower", "upper"):
        for labels, values in run.series(
                f'sd_measured_speedup_{bound}{{{SD}, statistic="mean"}}'):
            mean, lo, hi = measured[labels["arrival_rate_bin"]]
            measured[labels["arrival_rate_bin"]] = (
                mean, values[-1][1] if bound == "lower" else lo,
                values[-1][1] if bound == "upper" else hi)
    print(f"measured speedup at {end / 60:.1f} min, per bin (mean, 90% interval): "
          + ", ".join(f"{b}: {m:.2f} [{lo:.2f}, {hi:.2f}]"
                      for b, (m, lo, hi) in sorted(measured.items())))
    assert {"2-4", "4-6"} <= set(measured)
    for b in ("2-4", "4-6"):
        mean, lo, _hi = measured[b]
        assert 1.6 <= mean <= 2.2 and lo >= 1.2, (b, measured[b])


def test_the_controller_does_not_act(run: Run) -> None:
    """SD stays on at every evaluation (no switch-off recommended, none pending), and once
    its window is complete the controller agrees with the model."""
    states: dict[str, int] = {}
    for labels, values in run.series(f'sd_controller_state{{{SD}}} == 1'):
        key = f"{labels['state']} ({labels['reason']})"
        states[key] = states.get(key, 0) + len(values)
    print(f"controller state (reason), evaluations: {states}")
    assert states and all(k.startswith("enabled ") for k in states), states
    [(_, disables)] = run.series(
        f'sd_controller_transitions_total{{{SD}, action="disable"}}')
    assert {v for _, v in disables} == {0.0}
    late = run.series(f'sd_controller_state{{{SD}, state="enabled", reason!="agrees"}} == 1')
    assert not [t for _, vs in late for t, _ in run.steady(vs)], late
    ctl = run.demo.exporter.controller
    [mc] = ctl.targets["vllm-sim"].models.values()
    print(f"controller at the end: {mc.status().detail}")
