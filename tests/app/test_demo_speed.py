"""`specwatch demo --speed X` keeps its promises at any X.

The simulator and the exporter agree on time: the exporter stamps its polls with the
simulated clock and the page is in simulated seconds, so the exporter's windows, rates and
latency model are the scenario's own. Prometheus runs on the wall clock, so the demo renders
the rules with every duration (``for``, range windows) divided by X, Prometheus scrapes the
simulator's wall-time view (rates per wall second equal to the scenario's) and the exporter's
timestamps are served on the wall clock. The whole story against a real Prometheus, at the
default speed: tests/app/test_demo_story.py (slow).
"""

from __future__ import annotations

import argparse
import re
import shutil
import time

import pytest
import yaml
from helpers.scrape import scrape

from specwatch.app import demo, demo_time
from specwatch.cli import demo as demo_cli


def demo_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo_cli.add_arguments(parser)
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
    assert demo_time.scaled_alert_durations({"alerts": {"A": {"for": "10m"}}}, 7.0) == {
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


def test_range_windows_of_the_rules_are_divided_by_the_speed() -> None:
    """The recording rules' 5m window (and every other range of the rendered rules) counts
    wall seconds in Prometheus: at --speed 20 it is 15 s, five scenario minutes, while the
    recorded names keep their `rate5m`."""
    assert demo_time.scaled_ranges("rate(x[5m]) / last_over_time(y[2m:30s])", 20.0) \
        == "rate(x[15s]) / last_over_time(y[6s:1500ms])"
    d = demo.Demo(demo_args("--speed", "20"))
    try:
        [path] = d.scaled_rule_files()
        rules = [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]
    finally:
        shutil.rmtree(d.tmp, ignore_errors=True)
    records = {r["record"]: r["expr"] for r in rules if "record" in r}
    name = "model_name:vllm_request_success:rate5m"
    assert "[15s]" in records[name] and "[5m]" not in records[name]
    assert not any(re.search(r"\[\d+m\]", r["expr"]) for r in rules)


def test_the_simulators_wall_time_view_reads_scenario_rates_in_prometheus() -> None:
    """`/metrics?timebase=wall` of a simulated-clock simulator at speed X: every cumulative
    sample divided by X (a per-wall-second rate() is then the scenario's rate), histogram
    quantiles and means unchanged, gauges unchanged, `_created` on the wall clock."""
    from specwatch.sim.scenario import load_scenario
    from specwatch.sim.server import SimulatorServer

    speed = 20.0
    wall = [1_000_000.0]
    server = SimulatorServer(load_scenario("demo"), "127.0.0.1:0", speed, seed=3,
                             clock=lambda: wall[0], simulated_clock=True)
    server.start()
    try:
        wall[0] += 30.0  # 600 scenario seconds
        server.step()
        sim = scrape(server.url + "/metrics")
        view = scrape(server.url + "/metrics?timebase=wall")
    finally:
        server.stop()
    assert sim.keys() == view.keys()
    checked = {"cumulative": 0, "gauge": 0, "created": 0}
    for key, value in sim.items():
        name = key[0]
        if not name.startswith("vllm:"):
            continue
        if name.endswith("_created"):
            assert view[key] == pytest.approx(server.wall_time(value))
            assert view[key] <= wall[0]
            checked["created"] += 1
        elif name.endswith(("_total", "_bucket", "_count", "_sum")):
            assert view[key] == pytest.approx(value / speed)
            checked["cumulative"] += 1
        else:
            assert view[key] == value
            checked["gauge"] += 1
    assert min(checked.values()) > 0, checked


def test_exporter_timestamps_are_served_on_the_wall_clock() -> None:
    """The demo's exporter runs on the simulated clock; Prometheus reads its timestamps as
    ages against the wall clock (time() - ...): they are mapped back, whatever the
    encoding the scraper asks for."""
    from specwatch.web.routing import Request, Response

    page = (b'# TYPE specwatch_target_last_success_timestamp_seconds gauge\n'
            b'specwatch_target_last_success_timestamp_seconds{target="a"} 2000.0\n'
            b'sd_controller_last_transition_timestamp_seconds{target="a",model_name="m}"} '
            b'1500\n'
            b'sd_acceptance_rate{target="a"} 0.5\n')
    seen = []

    def inner(req: Request) -> Response:
        seen.append(dict(req.headers))
        return Response(200, page)

    handler = demo_time.wall_timestamps(inner, lambda t: 1000.0 + (t - 1000.0) / 10.0)
    resp = handler(Request("GET", "/metrics", {}, {"accept-encoding": "gzip"}))
    assert "accept-encoding" not in seen[0]
    assert resp.body.splitlines()[1:] == [
        b'specwatch_target_last_success_timestamp_seconds{target="a"} 1100.0',
        b'sd_controller_last_transition_timestamp_seconds{target="a",model_name="m}"} 1050.0',
        b'sd_acceptance_rate{target="a"} 0.5']
