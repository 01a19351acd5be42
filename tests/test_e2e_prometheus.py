"""End to end with real components: simulator → exporter → Prometheus with the mixin's rules.

Three real processes (`specwatch simulate`, `specwatch serve`, Debian's `prometheus`) run the
packaged acceptance-drop scenario 30 times faster than real time: 10 s healthy, 30 s with
acceptance below 0.4, then recovered. Prometheus' clock is the wall clock, so time is
compressed the other way round: the exporter's window is 10 s, vLLM's recording rules use
a 20 s rate window and SDAcceptanceRateLow waits 10 s, all through the mixin's own config
(`specwatch.mixin.render.render_rules` overrides), not by editing rule files.

Checked through the Prometheus HTTP API, against the scenario's truth (not the exporter's
code): the derived series exist and match the phase (acceptance rate and length, arrival
rate, the recording rule from vLLM's counters, the model's predicted speedup), and the alert
is silent in the healthy phase, goes pending and then fires in the acceptance-drop phase.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from promsim import scrape_job, scraping_prometheus

from specwatch.app.demo import free_port, scaled_params_file
from specwatch.mixin.render import dump_rules, render_rules
from specwatch.model.closed_form import predict
from specwatch.sim.scenario import load_scenario

SPEED = 30.0
WINDOW = "10s"
RATE_WINDOW = "20s"
FOR = "10s"
ALERT = "SDAcceptanceRateLow"

# Slow (a live stack on the wall clock for tens of seconds): `make test-all` and CI.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("prometheus") is None,
                       reason="needs Debian's prometheus (make setup installs it)"),
]


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read().decode())


def wait_until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except OSError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


class Stack:
    """The three processes; `stop()` ends every one of them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.scenario = load_scenario("acceptance-drop")
        self.sim_port = free_port()
        self.exp_port = free_port()
        self.sim = f"http://127.0.0.1:{self.sim_port}"
        self.prom = ""  # Prometheus' URL, once started
        self.exit = contextlib.ExitStack()  # stops Prometheus

    def spawn(self, argv: list[str], name: str) -> None:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL))

    def start(self) -> None:
        rules = render_rules({"exporterWindow": WINDOW, "rateWindow": RATE_WINDOW,
                              "alerts": {ALERT: {"for": FOR, "keepFiringFor": "",
                                                 "window": WINDOW,
                                                 "missingSampleGrace": ""}}})
        (self.tmp / "rules.yaml").write_text(dump_rules(rules))
        params = scaled_params_file(self.scenario, 0, SPEED, self.tmp)
        exporter_cfg = {
            "global": {"listen": f"127.0.0.1:{self.exp_port}", "poll_interval": "1s",
                       "windows": [WINDOW], "model_window": WINDOW, "count_window": 500},
            "targets": [{"name": "sim", "url": f"{self.sim}/metrics", "engine": "vllm",
                         "params": str(params)}],
        }
        (self.tmp / "specwatch.yaml").write_text(yaml.safe_dump(exporter_cfg))
        self.prom = self.exit.enter_context(scraping_prometheus(self.tmp, [
            scrape_job("specwatch", f"127.0.0.1:{self.exp_port}"),
            {**scrape_job("vllm", f"127.0.0.1:{self.sim_port}"),
             "metric_relabel_configs": [{"source_labels": ["__name__"],
                                         "regex": "vllm_(.*)", "target_label": "__name__",
                                         "replacement": "vllm:$1"}]},
        ], [self.tmp / "rules.yaml"]))
        self.spawn([sys.executable, "-m", "specwatch", "serve", "--config",
                    str(self.tmp / "specwatch.yaml")], "exporter")
        # The simulator starts last: scenario time 0 is now, with everything watching.
        self.spawn([sys.executable, "-m", "specwatch", "simulate", "--listen",
                    f"127.0.0.1:{self.sim_port}", "--scenario", "acceptance-drop",
                    "--speed", str(SPEED)], "simulator")
        wait_until(lambda: get_json(f"{self.sim}/sim/status")["up"], 30, "the simulator")

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.exit.close()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.tmp.glob("*.log")))

    # ----------------------------------------------------------------- queries

    def status(self) -> dict[str, Any]:
        return get_json(f"{self.sim}/sim/status")

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        data = get_json(url)
        assert data["status"] == "success", data
        return data["data"]["result"]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def alert_state(self) -> str:
        alerts = get_json(f"{self.prom}/api/v1/alerts")["data"]["alerts"]
        states = {a["state"] for a in alerts if a["labels"].get("alertname") == ALERT}
        return "firing" if "firing" in states else "pending" if "pending" in states else "inactive"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path)
    try:
        s.start()
        yield s
    except BaseException:
        print(s.logs())
        raise
    finally:
        s.stop()


def truth(stack: Stack, phase_index: int) -> dict[str, Any]:
    spec = stack.scenario.models[0]
    phase = spec.phases[phase_index]
    return phase.acceptance.truth(spec.num_speculative_tokens, phase.generation_tokens)


def check_phase_series(stack: Stack, phase_index: int) -> None:
    """The exporter's series in Prometheus match the phase's truth."""
    spec = stack.scenario.models[0]
    phase = spec.phases[phase_index]
    want = truth(stack, phase_index)
    sel = f'{{job="specwatch", window="{WINDOW}"}}'
    rate = stack.value(f"sd_acceptance_rate{sel}")
    length = stack.value(f"sd_acceptance_length{sel}")
    arrivals = stack.value(f"sd_arrival_rate{sel}")
    print(f"{phase.name}: acceptance rate {rate} (truth {want['acceptance_rate']:.3f}), "
          f"length {length} (truth {want['acceptance_length']:.3f}), arrival rate "
          f"{arrivals} (truth {phase.arrival_rate.mean * SPEED:g}/s)")
    assert rate == pytest.approx(want["acceptance_rate"], abs=0.07)
    assert length == pytest.approx(want["acceptance_length"], rel=0.07)
    assert arrivals == pytest.approx(phase.arrival_rate.mean * SPEED, rel=0.25)
    recorded = stack.value(f"model_name:vllm_spec_decode_acceptance_rate:ratio_rate{RATE_WINDOW}")
    assert recorded == pytest.approx(want["acceptance_rate"], abs=0.08)


def test_alert_fires_in_the_acceptance_drop_and_not_before(stack: Stack) -> None:
    """Healthy phase: derived series at the truth, no alert. Acceptance-drop phase: the
    series follow the drop, SDAcceptanceRateLow goes pending, then fires."""
    spec = stack.scenario.models[0]
    healthy_end = spec.phases[0].duration_s
    drop_end = healthy_end + spec.phases[1].duration_s
    seen: list[tuple[float, str, str]] = []
    checked_healthy = checked_drop = checked_model = False
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        st = stack.status()
        t, phase = st["sim_time_s"], st["models"][0]["phase"]
        state = stack.alert_state()
        seen.append((t, phase, state))
        if phase == "healthy":
            assert state == "inactive", f"{ALERT} {state} at sim time {t:.0f}s, before the drop"
            if not checked_healthy and t > healthy_end * 0.8:
                check_phase_series(stack, 0)
                checked_healthy = True
            if not checked_model and t > healthy_end * 0.6:
                speedup = stack.value('sd_predicted_speedup{job="specwatch"}')
                if speedup is not None:
                    check_model(stack, speedup)
                    checked_model = True
        elif phase == "acceptance-drop":
            if not checked_drop and t > drop_end - 0.2 * spec.phases[1].duration_s:
                check_phase_series(stack, 1)
                checked_drop = True
        else:
            break
        time.sleep(0.5)
    states_in_drop = [s for _, p, s in seen if p == "acceptance-drop"]
    print("alert states in the drop:", "".join(s[0] for s in states_in_drop))
    assert checked_healthy and checked_drop and checked_model, seen[-3:]
    assert "pending" in states_in_drop, states_in_drop
    assert "firing" in states_in_drop, states_in_drop
    assert states_in_drop.index("pending") < states_in_drop.index("firing")


def check_model(stack: Stack, speedup: float) -> None:
    """The live model, fed the parameters divided by --speed, predicts for the simulated
    (faster) server what the model predicts for the scenario's own system and load."""
    from specwatch.model.params import load_params

    spec = stack.scenario.models[0]
    phase = spec.phases[0]
    e = truth(stack, 0)["acceptance_length"]
    coef = load_params(spec.params).model()
    want = float(predict(coef, phase.arrival_rate.mean, spec.num_speculative_tokens, e,
                         phase.prompt_tokens.mean(), phase.generation_tokens.mean()).speedup)
    valid = stack.value('sd_model_valid{job="specwatch"}')
    print(f"predicted speedup {speedup:.3f} (model on the scenario: {want:.3f}), valid {valid}")
    assert valid == 1.0
    assert speedup == pytest.approx(want, rel=0.08)
