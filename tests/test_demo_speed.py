"""`specwatch demo --speed X` keeps its promises at any X (issue 18, item 7).

The simulator and the exporter agree on time: the exporter stamps its polls with the
simulated clock and the page is in simulated seconds, so the exporter's windows, rates and
latency model are the scenario's own. Prometheus runs on the wall clock, so the demo renders
the alerts' ``for`` divided by X. Before, at ``--speed 4`` the 1m window held 4 simulated
minutes, every rate read X times too high, and SDAcceptanceRateLow (``for: 10m`` of wall
time) never fired within the 15-minute drop.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest
import yaml
from helpers.scrape import scrape
from specwatch.app import demo


def demo_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_alert_for_durations_are_divided_by_the_speed() -> None:
    """At --speed 10 the rendered SDAcceptanceRateLow waits 60 s (10 simulated minutes) and
    keeps firing for 12 s; every alert of the mixin is scaled."""
    d = demo.Demo(demo_args("--speed", "10"))
    try:
        [path] = d.scaled_rule_files()
        rules = {r["alert"]: r for g in yaml.safe_load(path.read_text())["groups"]
                 for r in g["rules"] if "alert" in r}
    finally:
        shutil.rmtree(d.tmp, ignore_errors=True)
    assert rules["SDAcceptanceRateLow"]["for"] == "60s"
    assert rules["SDAcceptanceRateLow"]["keep_firing_for"] == "12s"
    assert rules["SDAcceptanceBimodal"]["for"] == "180s"
    assert rules["SpecwatchTargetDown"]["for"] == "30s"
    assert demo.scaled_alert_durations({"alerts": {"A": {"for": "10m"}}}, 7.0) == {
        "alerts": {"A": {"for": "85714ms"}}}


def test_exporter_measures_in_simulated_time_at_speed_10() -> None:
    """In the quiet phase (0.5 req/s) at --speed 10 the exporter's arrival rate is the
    scenario's 0.5 req/s, not 5 (requests per wall second), and its 1m window spans about a
    simulated minute (the polls are 5 simulated seconds apart)."""
    d = demo.Demo(demo_args("--speed", "10", "--prometheus", "off",
                            "--exporter-listen", "127.0.0.1:0"))
    try:
        d.start()
        time.sleep(12.0)  # 120 simulated seconds: still the quiet phase (0-180 s)
        sim_t = d.simulator.sim_time_now()
        series = scrape(d.exporter_url() + "/metrics")
        model = d.scenario.models[0].model_name
        snap = d.exporter.pipeline.snapshot.targets["vllm-sim"].models[model]
        one_minute = snap.window("1m")
    finally:
        d.stop()
    assert sim_t < 180.0, "the quiet phase is over: the machine is too slow for the test"
    rate = series[("sd_arrival_rate", frozenset({("target", "vllm-sim"),
                                                  ("model_name", model),
                                                  ("window", "5m")}))]
    print(f"--speed 10, quiet phase (0.5 req/s): arrival rate {rate:.3f} req/s, "
          f"1m window spans {one_minute.span_seconds:.0f} s")
    assert 0.2 < rate < 1.0  # on the wall clock it read 10 times the truth
    assert 55.0 <= one_minute.span_seconds <= 70.0


def prom_query(prom: str, expr: str) -> list[dict[str, Any]]:
    url = f"{prom}api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read().decode())["data"]["result"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="needs Debian's prometheus (make setup installs it)")
def test_demo_at_speed_10_fires_the_alert_and_crosses_break_even() -> None:
    """`specwatch demo --speed 10` with Prometheus, as a user runs it (about 3 minutes):
    the predicted speedup falls below 1 in the load phases and SDAcceptanceRateLow fires
    within the acceptance-drop phase (13:00-31:00 simulated), judged by the simulator's own
    clock (/sim/status) when Prometheus reports it."""
    speed = 10.0
    proc = subprocess.Popen(
        [sys.executable, "-m", "specwatch", "demo", "--speed", str(speed),
         "--exporter-listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    t0 = time.monotonic()
    try:
        banner = []
        while True:
            line = proc.stdout.readline()
            assert line, "".join(banner)
            banner.append(line)
            if line.startswith("Working files"):
                break
        text = "".join(banner)
        prom = re.search(r"Prometheus\s+(\S+)", text).group(1)
        sim = re.search(r"simulated vLLM\s+(\S+)/metrics", text).group(1)

        def sim_status() -> tuple[float, str]:
            with urllib.request.urlopen(sim + "/sim/status", timeout=5) as resp:
                status = json.loads(resp.read().decode())
            return status["sim_time_s"], status["models"][0]["phase"]

        speedups: list[tuple[float, str, float]] = []
        pending = fired = None
        while time.monotonic() - t0 < 240.0:
            sim_t, phase = sim_status()
            if phase == "bimodal":
                break
            for r in prom_query(prom, 'sd_predicted_speedup{window="5m"}'):
                speedups.append((sim_t, phase, float(r["value"][1])))
            states = {r["metric"]["alertstate"] for r in prom_query(
                prom, 'ALERTS{alertname="SDAcceptanceRateLow"}')}
            if "pending" in states and pending is None:
                pending = (sim_t, phase)
            if "firing" in states:
                fired = (sim_t, phase)
                break
            time.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    values = [v for _, _, v in speedups]
    below = next(((t, ph) for t, ph, v in speedups if v < 1.0), None)
    print(f"--speed 10: predicted speedup {max(values):.2f} → {min(values):.2f}, first below 1 "
          f"at {below} (simulated s, phase); SDAcceptanceRateLow pending at {pending}, firing "
          f"at {fired}; the drop phase is 780-1860 simulated s; "
          f"{time.monotonic() - t0:.0f} s wall")
    assert max(values) > 1.0 > min(values)
    assert pending is not None and pending[1] == "acceptance-drop"
    assert fired is not None and fired[1] == "acceptance-drop"
