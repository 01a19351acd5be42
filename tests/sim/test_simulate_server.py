"""`specwatch simulate` over real sockets: /metrics, the restart gap, the CLI and its errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.scrape import parse_exposition

from specwatch.sim.scenario import Restart, load_scenario
from specwatch.sim.server import SimulatorServer

SPECWATCH = [sys.executable, "-m", "specwatch"]


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, resp.read().decode()


def total(series: dict, name: str) -> float:
    return sum(v for (n, _), v in series.items() if n == name)


def test_server_answers_like_vllm_and_status_tells_the_phase() -> None:
    """/metrics (text format), /health, /v1/models and /sim/status over HTTP, with simulated
    time running --speed times faster than the wall clock."""
    server = SimulatorServer(load_scenario("demo"), "127.0.0.1:0", speed=60.0)
    server.start()
    try:
        time.sleep(1.0)
        status, body = get(f"{server.url}/metrics")
        assert status == 200
        series = parse_exposition(body)
        assert total(series, "vllm:request_success_total") > 0
        assert get(f"{server.url}/health")[0] == 200
        models = json.loads(get(f"{server.url}/v1/models")[1])
        assert [m["id"] for m in models["data"]] == ["demo/llama-8b-eagle3"]
        st = json.loads(get(f"{server.url}/sim/status")[1])
        assert st["up"] and st["speed"] == 60.0 and st["sim_time_s"] >= 50.0
        assert st["models"][0]["phase"] == "quiet"
        assert st["models"][0]["truth"]["acceptance_rate"] == pytest.approx(0.573, abs=0.01)
    finally:
        server.stop()


def test_scripted_restart_refuses_connections_then_counters_restart() -> None:
    """During a whole-server restart the port refuses connections (as a restarting vLLM);
    afterwards the same port answers with counters back near 0 and new _created stamps."""
    sc = load_scenario("demo")
    sc = replace(sc, restarts=(Restart(at_s=40.0, downtime_s=40.0),))
    server = SimulatorServer(sc, "127.0.0.1:0", speed=40.0, tick=0.02)
    server.start()
    url = f"{server.url}/metrics"
    try:
        deadline = time.monotonic() + 10
        before: dict = {}
        while time.monotonic() < deadline and server.sim_time_now() < 38.0:
            before = parse_exposition(get(url)[1])
            time.sleep(0.05)
        while server.sim_time_now() < 50.0:
            time.sleep(0.02)
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            get(url, timeout=1.0)
        while server.sim_time_now() < 85.0:
            time.sleep(0.05)
        after = parse_exposition(get(url)[1])
        created_before = total(before, "vllm:spec_decode_num_drafts_created")
        created_after = total(after, "vllm:spec_decode_num_drafts_created")
        assert created_after > created_before
        assert total(after, "vllm:request_success_total") < total(
            before, "vllm:request_success_total") + 5
    finally:
        server.stop()


def test_cli_serves_and_stops_cleanly_on_sigint(tmp_path: Path) -> None:
    """`specwatch simulate` binds, serves, and exits 0 on SIGINT."""
    proc = subprocess.Popen([*SPECWATCH, "simulate", "--listen", "127.0.0.1:0", "--speed", "20",
                             "--scenario", "demo", "--log-level", "info"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        deadline = time.monotonic() + 30
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if "simulated vLLM on http://" in line:
                url = line.split(" on ", 1)[1].split()[0]
                break
        assert url, "no startup line"
        assert get(url)[0] == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(("content", "expected"), [
    ("models: []\n", "models: at least one model is required"),
    ("models:\n  - model_name: m\n    params: p.yaml\n    phases: []\n",
     "models[0].phases: at least one phase is required"),
    ("models:\n  - model_name: m\n    params: p.yaml\n    speed: 3\n    phases: []\n",
     "models[0].speed: unknown key"),
    ("models:\n  - model_name: m\n    params: p.yaml\n    prompt_tokens: 10\n"
     "    generation_tokens: 10\n    acceptance: 0.7\n"
     "    phases: [{duration_s: 10, arrival_rate: {from: 1, to: -2}}]\n",
     "models[0].phases[0].arrival_rate.to: expected a number in [0, inf], got -2"),
    ("models:\n  - model_name: m\n    params: p.yaml\n    prompt_tokens: 10\n"
     "    generation_tokens: 10\n    acceptance: {dist: beta, mean: 1.5, concentration: 3}\n"
     "    phases: [{duration_s: 10, arrival_rate: 1}]\n",
     "models[0].acceptance.mean: expected a number in (0, 1), got 1.5"),
    ("models:\n  - model_name: m\n    params: p.yaml\n    prompt_tokens: 10\n"
     "    generation_tokens: 10\n"
     "    phases: [{duration_s: 10, arrival_rate: 1}]\n",
     "models[0].phases[0].acceptance: required"),
    ("models:\n  - model_name: m\n    params: p.yaml\n    prompt_tokens: 10\n"
     "    generation_tokens: 10\n    acceptance: {dist: mixture, components: [0.5, 0.5]}\n"
     "    phases: [{duration_s: 10, arrival_rate: 1}]\n",
     "models[0].acceptance.components[0]: expected a mapping with weight and dist"),
    ("models:\n  - model_name: m\n    params: p.yaml\n    prompt_tokens: 10\n"
     "    generation_tokens: {dist: zipf, mean: 3}\n    acceptance: 0.7\n"
     "    phases: [{duration_s: 10, arrival_rate: 1}]\n",
     "models[0].generation_tokens.dist: unknown distribution 'zipf'"),
    ("models:\n  - model_name: m\n    params: p.yaml\n    prompt_tokens: 10\n"
     "    generation_tokens: 10\n    acceptance: 0.7\n"
     "    phases: [{duration_s: 10, arrival_rate: 1}]\n"
     "restarts: [{at_s: 5, model_name: other}]\n",
     "restarts[0].model_name: no model named 'other'"),
    ("models:\n  - model_name: m\n    params: missing-params.yaml\n    prompt_tokens: 10\n"
     "    generation_tokens: 10\n    acceptance: 0.7\n"
     "    phases: [{duration_s: 10, arrival_rate: 1}]\n",
     "missing-params.yaml: parameters file not found"),
    ("models: [\n", "not valid YAML"),
])
def test_bad_scenario_is_one_clear_error_with_exit_2(tmp_path: Path, content: str,
                                                     expected: str) -> None:
    """A bad scenario ends with exit 2 and one message naming the file and the key path
    (never a traceback, never a silently ignored key)."""
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    res = subprocess.run([*SPECWATCH, "simulate", "--scenario", str(path), "--listen",
                          "127.0.0.1:0"], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert str(path) in res.stderr or "missing-params.yaml" in res.stderr
    assert expected in res.stderr, res.stderr


def test_unknown_packaged_scenario_name_lists_the_packaged_ones() -> None:
    res = subprocess.run([*SPECWATCH, "simulate", "--scenario", "no-such-scenario"],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2
    assert "demo" in res.stderr and "no-such-scenario" in res.stderr


def post(url: str, body: object) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_restart_over_http_switches_sd_off_and_on() -> None:
    """POST /sim/restart with num_speculative_tokens 0 brings the server back without SD
    (no spec_decode families, counters reset), and with k = 5 back with five positions:
    what a controller's deployer does. Bad requests get a 400 naming the field."""
    server = SimulatorServer(load_scenario("demo"), "127.0.0.1:0", speed=40.0, tick=0.02)
    server.start()
    url = server.url
    try:
        time.sleep(0.5)
        assert total(parse_exposition(get(f"{url}/metrics")[1]),
                     "vllm:spec_decode_num_drafts_total") > 0
        assert post(f"{url}/sim/restart", {"num_speculative_tokens": -1})[0] == 400
        code, text = post(f"{url}/sim/restart", {"model_name": "nope"})
        assert code == 400 and "model_name" in text
        code, text = post(f"{url}/sim/restart", {"num_speculative_tokens": 0,
                                                 "downtime_s": 0.3})
        assert code == 200, text
        time.sleep(1.0)
        page = parse_exposition(get(f"{url}/metrics")[1])
        assert not [n for n, _ in page if n.startswith("vllm:spec_decode")]
        assert total(page, "vllm:request_success_total") > 0
        status = json.loads(get(f"{url}/sim/status")[1])
        assert status["models"][0]["num_speculative_tokens"] == 0
        assert post(f"{url}/sim/restart", {"num_speculative_tokens": 5})[0] == 200
        time.sleep(0.5)
        page = parse_exposition(get(f"{url}/metrics")[1])
        positions = {dict(labels)["position"] for n, labels in page
                     if n == "vllm:spec_decode_num_accepted_tokens_per_pos_total"}
        assert positions == {"0", "1", "2", "3", "4"}
    finally:
        server.stop()
