"""End to end, measured A/B pair (issue 16): simulator pair → exporter → real Prometheus.

The packaged ``pair`` scenario (a stepped load ramp: 2, 5, 7.5 and 11 req/s, break-even
about 10) runs twice, 20 times faster than real time: once with SD (k = 3) and once with
SD off, same seed and traffic. The exporter pairs the two targets with a 5 s window and
arrival-rate bins that put each step in its own bin; Prometheus scrapes it and evaluates
the mixin's SDMeasuredSlowdown with its pending time shortened to 5 s.

The ground truth is the simulator's own latency records (every finished request's e2e
latency, in page seconds), not the exporter's code: per step, baseline mean / SD mean over
the requests that finished in the step after its first window. Checked: the measured
speedup exists for every step's bin and is within 10% of the truth, it is above 1 below
break-even and below 1 past it, and the alert fires on the live stack at the last step.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from specwatch.app.demo import free_port
from specwatch.app.serve import ServeApp
from specwatch.calibrate.measured import read_pair_points
from specwatch.calibrate.prometheus import PrometheusQuery
from specwatch.cli import main
from specwatch.exporter import config
from specwatch.mixin.render import dump_rules, render_rules
from specwatch.sim.scenario import load_scenario
from specwatch.sim.server import SimulatorServer, baseline_scenario

SPEED = 20.0
BINS = [0, 70, 125, 185, 1000]  # page req/s: the steps are at 40, 100, 150 and 220
LABELS = ["0-70", "70-125", "125-185", "185-1000"]
SEGMENT_S = 5.0
STEP_S = 600.0  # simulated seconds per load step (30 s of wall time)

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="needs Debian's prometheus (make setup installs it)")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read().decode())


def query(prom: str, expr: str) -> list[dict[str, Any]]:
    data = get_json(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert data["status"] == "success", data
    return data["data"]["result"]


def truth(server: SimulatorServer, start_s: float, end_s: float) -> float:
    """Mean e2e latency (page seconds) of the requests that finished in [start, end)."""
    with server.lock:
        rec = np.array(server.sim.records)
    sel = (rec[:, 0] >= start_s) & (rec[:, 0] < end_s)
    assert sel.sum() > 100
    return float(rec[sel, 1].mean())


def check_calibration_points(prom: str, sd: SimulatorServer, base: SimulatorServer,
                             phases: Any, sim_now: float,
                             capsys: pytest.CaptureFixture[str]) -> None:
    """`calibrate --prometheus --point-sources pairs`: one (λ, L) point per bin and side,
    L within 10% and λ within 15% of the simulator's own records, counted as pair
    points."""
    with capsys.disabled():
        print(capsys.readouterr().out)  # what the test printed so far
    rc = main(["calibrate", "--prometheus", prom, "--start", "now-10m", "--step", "1s",
               "--json", "--point-sources", "pairs", "--max-ttft-ratio", "off"])
    out = capsys.readouterr().out
    doc = json.loads(out)
    with capsys.disabled():
        print("calibrate exit", rc, "point sources", doc.get("point_sources"))
        fit = next(iter(doc["systems"].values()))
        print("fit:", {k: fit.get(k) for k in ("mode", "identifiable", "not_identifiable",
                                               "fallback_reason", "coefficients", "r2")})
    model = phases and sd.scenario.models[0].model_name
    assert doc["point_sources"] == {model: {"pairs": 8}}
    points = read_pair_points(PrometheusQuery(prom, time.time() - 600, time.time(), 1.0))
    start = 0.0
    by_bin = {}
    for label, ph in zip(LABELS, phases, strict=True):
        # The last step holds on (the scenario does not loop): it ends at sim_now.
        by_bin[label] = (start, sim_now if label == LABELS[-1]
                         else min(start + ph.duration_s, sim_now))
        start += ph.duration_s
    for p in points:
        side, label = p.source.split()[2], p.source.split()[4]  # "pair ab sd MODEL BIN ..."
        server = sd if side == "sd" else base
        lo, hi = by_bin[label]
        lo += SEGMENT_S * SPEED
        with server.lock:
            rec = np.array(server.sim.records)
        sel = (rec[:, 0] >= lo) & (rec[:, 0] < hi)
        rate = sel.sum() / ((hi - lo) / SPEED)
        with capsys.disabled():
            print(p.source, p.arrival_rate, rate, p.latency_s, rec[sel, 1].mean())
        assert p.draft_length == (3 if side == "sd" else 0)
        assert p.latency_s == pytest.approx(float(rec[sel, 1].mean()), rel=0.10), p.source
        # A bin also holds the segment that straddles the step into it (λ between the two
        # steps): λ within 15% of the step's own rate.
        assert p.arrival_rate == pytest.approx(rate, rel=0.15), p.source


def test_measured_speedup_matches_the_simulators_truth_and_alerts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Each step 30 s of wall time (six 5 s segments), so the step changes (a segment that
    # straddles one) weigh little; the last step holds on.
    packaged = load_scenario("pair")
    model = packaged.models[0]
    steps = tuple(dataclasses.replace(ph, duration_s=STEP_S) for ph in model.phases)
    scenario = dataclasses.replace(packaged, loop=False, models=(
        dataclasses.replace(model, phases=steps),))
    phases = scenario.models[0].phases
    prom_port, exp_port, sd_port, base_port = (free_port() for _ in range(4))
    rules = render_rules({"alerts": {"SDMeasuredSlowdown": {"for": "5s"}}})
    (tmp_path / "rules.yaml").write_text(dump_rules(rules))
    prom_cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(tmp_path / "rules.yaml")],
                "scrape_configs": [{"job_name": "specwatch", "static_configs": [
                    {"targets": [f"127.0.0.1:{exp_port}"]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom_cfg))
    prom = f"http://127.0.0.1:{prom_port}"
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    exp_cfg = {
        "global": {"listen": f"127.0.0.1:{exp_port}", "poll_interval": "500ms",
                   "windows": ["5s", "15s"], "count_window": 0},
        "targets": [{"name": "sd", "url": f"http://127.0.0.1:{sd_port}/metrics",
                     "engine": "vllm"},
                    {"name": "baseline", "url": f"http://127.0.0.1:{base_port}/metrics",
                     "engine": "vllm"}],
        "pairs": [{"name": "ab", "sd": "sd", "baseline": "baseline"}],
        "pair_options": {"window": "5s", "min_requests": 100, "arrival_rate_bins": BINS},
    }
    (tmp_path / "specwatch.yaml").write_text(yaml.safe_dump(exp_cfg))
    app = ServeApp(config.build_config(str(tmp_path / "specwatch.yaml"), [], None, None))
    sd = base = None
    try:
        app.start()
        # The simulators start last: scenario time 0 is now, with everything watching.
        sd = SimulatorServer(scenario, f"127.0.0.1:{sd_port}", SPEED,
                             record_latencies=2_000_000)
        base = SimulatorServer(baseline_scenario(scenario), f"127.0.0.1:{base_port}", SPEED,
                               record_latencies=2_000_000)
        base.wall0 = sd.wall0  # one clock: both sides are in the same step
        sd.start()
        base.start()
        total_s = sum(p.duration_s for p in phases)
        # Run through the ramp. Past break-even the SD side's queue grows, so its mean
        # latency depends on where the measurement stops: the truth stops where the
        # exporter's last segment ended (its poll time), read right after one was added
        # and before the next (segments are 5 s apart; Prometheus has 2 s to scrape).
        end_wall = sd.wall0 + total_s / SPEED
        while time.time() < end_wall:
            time.sleep(0.5)
        model_name = scenario.models[0].model_name
        pair_sides = app.pairs._sides
        seen = pair_sides[("sd", model_name)].last_end
        while pair_sides[("sd", model_name)].last_end == seen:
            time.sleep(0.05)
        last_end = pair_sides[("sd", model_name)].last_end
        time.sleep(2.0)
        sim_now = (last_end - sd.wall0) * SPEED
        rows = query(prom, 'sd_measured_speedup{statistic="mean"}')
        measured = {r["metric"]["arrival_rate_bin"]: float(r["value"][1]) for r in rows}
        start = 0.0
        expected = {}
        for label, ph in zip(LABELS, phases, strict=True):
            end = sim_now if label == LABELS[-1] else min(start + ph.duration_s, sim_now)
            lo = start + SEGMENT_S * SPEED  # after the step's first window
            expected[label] = truth(base, lo, end) / truth(sd, lo, end)
            start += ph.duration_s
        print("measured", measured, "truth", expected)
        assert set(LABELS) <= set(measured), measured
        for label in LABELS:
            assert measured[label] == pytest.approx(expected[label], rel=0.10), label
        assert min(measured[b] for b in LABELS[:3]) > 1.0 > measured[LABELS[3]]
        for metric in ("sd_measured_speedup", "sd_measured_ttft_ratio",
                       "sd_measured_inter_token_latency_ratio"):
            stats = {r["metric"]["statistic"] for r in query(prom, metric)}
            assert {"p50", "p99"} <= stats, metric
        # The live alert: the pair is past break-even now, measured slower.
        deadline = time.monotonic() + 15
        firing = []
        while time.monotonic() < deadline and not firing:
            alerts = get_json(f"{prom}/api/v1/alerts")["data"]["alerts"]
            firing = [a for a in alerts if a["labels"]["alertname"] == "SDMeasuredSlowdown"
                      and a["state"] == "firing"]
            time.sleep(0.5)
        assert firing and firing[0]["labels"]["arrival_rate_bin"] == LABELS[3], alerts
        check_calibration_points(prom, sd, base, phases, sim_now, capsys)
    finally:
        app.stop()
        for server in (sd, base):
            if server is not None:
                server.stop()
        proc.terminate()
        proc.wait(timeout=15)
        log.close()
