"""End to end: the real `specwatch serve` in webhook mode switches SD off, then back on.

The simulator (`specwatch simulate`) cannot restart itself with another SD configuration,
so the vLLM target is a scripted page source (tests/helpers/pageserver.py with a Dynamic
step, pages from tests/helpers/vllmpage.py) whose counters advance with real time. A local
webhook receiver plays the deployer: on `disable` it restarts the fake server without SD,
on `enable` with SD and the k the payload asks for. The script: healthy acceptance, then a
drop (after the exporter has seen healthy windows), and the traffic recovers while SD is
off (invisible to any exporter: with SD off nothing is drafted). Expected: exactly one
`disable` call, then one `enable` (the re-enable probe, priced by the model with the
remembered profile), and nothing more.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from helpers.pageserver import Dynamic, Page, PageSequenceServer
from helpers.scrape import fetch_text, parse_exposition, select
from helpers.vllmpage import VllmState

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "examples/params/qwen3-32b-h100-eagle3.yaml"
GOOD = (0.8, 0.6, 0.45)
BAD = (0.2, 0.05, 0.01)
DROP_AFTER_POLLS = 15


class FakeVllm:
    """Counters advance with wall time at 5 req/s; acceptance drops after some polls."""

    def __init__(self) -> None:
        self.state = VllmState(model="qwen3")
        self.profile = GOOD
        self.polls = 0
        self.last = time.monotonic()
        self.lock = threading.Lock()

    def render(self) -> Page:
        with self.lock:
            now = time.monotonic()
            self.state.advance(now - self.last, 5.0, self.profile,
                               latency=2.0 if self.state.sd else 3.0, ttft=0.1)
            self.last = now
            self.polls += 1
            if self.polls == DROP_AFTER_POLLS:
                self.profile = BAD
            return Page(self.state.render())

    def restart(self, sd: bool, k: int | None = None, profile=None) -> None:
        with self.lock:
            self.state.restart(sd, k)
            if profile is not None:
                self.profile = profile
            self.last = time.monotonic()


class Deployer:
    """The webhook receiver: records calls and applies them to the fake server."""

    def __init__(self, fake: FakeVllm) -> None:
        self.calls: list[tuple[str, dict]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.calls.append((self.headers["Idempotency-Key"], payload))
                if payload["action"] == "disable":
                    fake.restart(sd=False, profile=GOOD)  # the hard traffic ends meanwhile
                else:
                    fake.restart(sd=True,
                                 k=payload["speculative_config_update"]["num_speculative_tokens"])
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/switch"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_serve_webhook_mode_disables_once_then_enables_once(tmp_path):
    fake = FakeVllm()
    deployer = Deployer(fake)
    with PageSequenceServer([Dynamic(fake.render)]) as server:
        cfg = tmp_path / "specwatch.yaml"
        cfg.write_text(
            "global:\n  poll_interval: 0.1\n  windows: [1s]\n  model_window: 1s\n"
            "  count_window: 0\n"
            f"targets:\n  - name: vllm\n    url: {server.url}\n    params: {PARAMS}\n"
            "    controller:\n      mode: webhook\n      stabilization_seconds: 0.5\n"
            "      min_switch_interval_seconds: 1.5\n      min_drafts_per_window: 50\n"
            "      min_requests_per_window: 2\n      pending_timeout_seconds: 10\n"
            f"      webhook:\n        url: {deployer.url}\n        timeout: 2s\n")
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
        try:
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline and not (
                    len(deployer.calls) >= 2 and proc.poll() is None):
                assert proc.poll() is None, "".join(lines)
                time.sleep(0.05)
            assert len(deployer.calls) >= 2, "".join(lines)
            time.sleep(2.0)  # long enough for another switch if the controller flapped
            assert port, "".join(lines)
            text = fetch_text(f"http://127.0.0.1:{port[0]}/metrics")
            status = json.loads(fetch_text(f"http://127.0.0.1:{port[0]}/controller"))
        finally:
            proc.terminate()
            proc.wait(10)
            reader.join(5)
            deployer.close()

    actions = [p["action"] for _, p in deployer.calls]
    assert actions == ["disable", "enable"], "".join(lines)
    (key1, off), (key2, on) = deployer.calls
    assert key1 == off["decision_id"] != key2 == on["decision_id"]
    assert off["reason_code"] == "low_acceptance" and off["model"] == "qwen3"
    assert on["reason_code"] == "predicted_speedup"
    assert on["acceptance"]["source"] == "remembered"
    # The last window measured with an acceptance rate still >= 0.4 (healthy traffic, or
    # the start of the drop mixed in), never the low one.
    assert on["acceptance"]["rate"] >= 0.4
    assert all(r > b for r, b in zip(on["acceptance"]["per_position"], BAD, strict=True))
    assert on["predicted_speedup"]["best"] >= 1.2
    assert on["recommended_draft_length"] >= 1

    series = parse_exposition(text)
    assert list(select(series, "sd_controller_transitions_total", action="disable").values()) \
        == [1.0]
    assert list(select(series, "sd_controller_transitions_total", action="enable").values()) \
        == [1.0]
    assert list(select(series, "sd_controller_state", state="enabled").values()) == [1.0]
    assert list(select(series, "sd_controller_actuation_errors_total").values()) == [0.0]
    assert status["targets"]["vllm"]["models"]["qwen3"]["state"] == "enabled"

    events = [json.loads(m.group(1)) for line in lines
              if (m := re.search(r"specwatch\.controller\.events: (\{.*\})$", line.strip()))]
    kinds = [e["event"] for e in events]
    assert kinds.count("decision") == 2 and kinds.count("switch_confirmed") == 2, kinds
    assert any(e["event"] == "switch_latency" and e["action"] == "disable" for e in events), \
        kinds
