"""End to end: the real `specwatch serve` in webhook mode against the simulator.

The target is `specwatch simulate`'s server (in-process, real time) running a short
acceptance-drop scenario: healthy acceptance, a drop far below 0.4 (α ≈ 0.15, where the
model finds no k paying beyond the hysteresis band), recovery. A local webhook
receiver plays the deployer: it applies each decision to the simulator through
``POST /sim/restart`` (0 draft tokens to switch SD off, the recommended k to switch it on),
a restart with a new SD configuration as vLLM needs. The exporter runs as a subprocess (the
real CLI, config file, poller, HTTP server and actuation thread).

Expected: exactly one `disable` call (low acceptance), then one `enable` (the re-enable
probe, priced by the model at the live load with the profile remembered from the healthy
phase) once the minimum interval has passed, which the scenario places after the recovery;
then no further call. While SD is off nothing is drafted, so the recovery itself is
invisible: the probe is what finds it.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from helpers.scrape import fetch_text, parse_exposition, select

from specwatch.sim.scenario import load_scenario, packaged_scenario_path
from specwatch.sim.server import SimulatorServer

HEALTHY_S, DROP_S = 3.0, 2.0
SCENARIO = """\
version: 1
description: controller end-to-end test - healthy, acceptance drop, recovery (short)
seed: 11
models:
  - model_name: sim/controller
    params: {params}
    num_speculative_tokens: 3
    prompt_tokens: {{dist: lognormal, mean: 600, cv: 0.5, min: 16, max: 4000}}
    generation_tokens: {{dist: lognormal, mean: 150, cv: 0.5, min: 8, max: 1000}}
    phases:
      - name: healthy
        duration_s: {healthy}
        arrival_rate: 6
        acceptance: {{dist: beta, mean: 0.8, concentration: 40}}
      - name: acceptance-drop
        duration_s: {drop}
        arrival_rate: 6
        acceptance: {{dist: beta, mean: 0.15, concentration: 40}}
      - name: recovered
        duration_s: 600
        arrival_rate: 6
        acceptance: {{dist: beta, mean: 0.8, concentration: 40}}
"""
# The probe comes min_switch_interval_seconds after the switch-off, itself after the drop
# began: 3 s > the drop's 2 s, so the probe always lands in the recovered phase.
MIN_SWITCH_INTERVAL_S = 3.0


class Deployer:
    """The webhook receiver: records decisions and restarts the simulator accordingly."""

    def __init__(self, sim_url: str) -> None:
        self.calls: list[tuple[str, dict]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.calls.append((self.headers["Idempotency-Key"], payload))
                k = 0 if payload["action"] == "disable" else \
                    payload["speculative_config_update"]["num_speculative_tokens"]
                req = urllib.request.Request(
                    f"{sim_url}/sim/restart", method="POST",
                    data=json.dumps({"num_speculative_tokens": k,
                                     "downtime_s": 0.3}).encode())
                with urllib.request.urlopen(req, timeout=5) as resp:
                    status = resp.status
                self.send_response(200 if status == 200 else 502)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/switch"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_webhook_mode_against_the_simulator_disables_once_then_enables_once(tmp_path):
    params = packaged_scenario_path("demo-params")
    scenario_file = tmp_path / "controller-e2e.yaml"
    scenario_file.write_text(SCENARIO.format(params=params, healthy=HEALTHY_S, drop=DROP_S))
    sim_port = _free_port()
    sim_url = f"http://127.0.0.1:{sim_port}"
    deployer = Deployer(sim_url)
    cfg = tmp_path / "specwatch.yaml"
    cfg.write_text(
        "global:\n  poll_interval: 0.1\n  windows: [1s]\n  model_window: 1s\n"
        "  count_window: 0\n"
        f"targets:\n  - name: sim\n    url: {sim_url}/metrics\n    params: {params}\n"
        "    controller:\n      mode: webhook\n      stabilization_seconds: 0.5\n"
        f"      min_switch_interval_seconds: {MIN_SWITCH_INTERVAL_S}\n"
        "      min_drafts_per_window: 50\n      min_requests_per_window: 2\n"
        "      pending_timeout_seconds: 10\n"
        f"      webhook:\n        url: {deployer.url}\n        timeout: 5s\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "specwatch", "serve", "--config", str(cfg),
         "--listen", "127.0.0.1:0", "--log-level", "info"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    port: list[int] = []

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            m = re.search(r"serving on http://[^:]+:(\d+)/metrics", line)
            if m:
                port.append(int(m.group(1)))

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    sim = None
    try:
        deadline = time.monotonic() + 20
        while not port:
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.05)
        # The exporter polls from now on; the scenario's clock starts with the simulator.
        sim = SimulatorServer(load_scenario(scenario_file), f"127.0.0.1:{sim_port}", speed=1.0,
                              seed=11)
        sim.start()
        deadline = time.monotonic() + 40
        while len(deployer.calls) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.05)
        time.sleep(2.0)  # long enough for another switch if the controller flapped
        base = f"http://127.0.0.1:{port[0]}"
        text = fetch_text(f"{base}/metrics")
        status = json.loads(fetch_text(f"{base}/controller"))
        sim_status = sim.status()
    finally:
        proc.terminate()
        proc.wait(10)
        reader.join(5)
        deployer.close()
        if sim is not None:
            sim.stop()

    actions = [p["action"] for _, p in deployer.calls]
    assert actions == ["disable", "enable"], "".join(lines)
    (key1, off), (key2, on) = deployer.calls
    assert key1 == off["decision_id"] != key2 == on["decision_id"]
    assert off["reason_code"] == "low_acceptance" and off["model"] == "sim/controller"
    assert on["reason_code"] == "predicted_speedup"
    assert on["acceptance"]["source"] == "remembered"
    assert on["acceptance"]["independent_alpha"] >= 0.4
    assert on["predicted_speedup"]["best"] >= 1.2
    assert 1 <= on["recommended_draft_length"] <= 8
    assert on["schedule"][0][0] == 1 and on["schedule"][-1][1] == 256
    assert sim_status["models"][0]["phase"] == "recovered"
    assert sim_status["models"][0]["num_speculative_tokens"] == on["recommended_draft_length"]

    series = parse_exposition(text)
    assert list(select(series, "sd_controller_transitions_total", action="disable").values()) \
        == [1.0]
    assert list(select(series, "sd_controller_transitions_total", action="enable").values()) \
        == [1.0]
    assert list(select(series, "sd_controller_state", state="enabled").values()) == [1.0]
    assert list(select(series, "sd_controller_actuation_errors_total").values()) == [0.0]
    assert status["targets"]["sim"]["models"]["sim/controller"]["state"] == "enabled"

    events = [json.loads(m.group(1)) for line in lines
              if (m := re.search(r"specwatch\.controller\.events: (\{.*\})$", line.strip()))]
    kinds = [e["event"] for e in events]
    assert kinds.count("decision") == 2 and kinds.count("switch_confirmed") == 2, kinds
    latency = [e for e in events if e["event"] == "switch_latency"]
    assert latency and latency[0]["action"] == "disable" and latency[0]["after"], kinds
    # The series holds the last switch's record (the disable's, or the enable's once its
    # first full window after the switch is in).
    assert select(series, "sd_switch_latency_ratio", latency="e2e", percentile="99")
