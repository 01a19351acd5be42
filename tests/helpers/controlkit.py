"""Controller test kit shared by the actuation, controller and hostile-state tests: a scripted
webhook receiver, a decision, an actuator that records its waits, a settable clock, an
Alertmanager webhook payload and a recommend-mode controller block."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from specwatch.plugins.control.actuation import Actuator, Decision, Outcome


def decision(i: str = "d1") -> Decision:
    return Decision(id=i, target="vllm-a", model="m", action="disable",
                    reason_code="low_acceptance", reason="acceptance 0.1 < 0.4",
                    decided_at=1000.0, payload={"decision_id": i, "action": "disable",
                                                "recommended_draft_length": 2})


class Receiver:
    """A local webhook receiver answering a scripted list of statuses (last one repeats)."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.calls: list[tuple[dict[str, str], dict]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                owner.calls.append(({k.lower(): v for k, v in self.headers.items()},
                                    json.loads(body)))
                status = owner.statuses[min(len(owner.calls), len(owner.statuses)) - 1]
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def make_actuator(deliver, attempts=5, backoff=2.0, max_backoff=60.0):
    waits: list[float] = []
    done: list[tuple[Decision, Outcome]] = []
    act = Actuator("a", deliver, lambda d, o: done.append((d, o)), max_attempts=attempts,
                   backoff_seconds=backoff, max_backoff_seconds=max_backoff,
                   wait=lambda s: waits.append(s) or False)
    return act, waits, done


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def webhook_payload(*alerts: dict) -> bytes:
    return json.dumps({"version": "4", "groupKey": "{}:{}", "truncatedAlerts": 0,
                       "status": "firing", "receiver": "specwatch-controller",
                       "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
                       "externalURL": "http://am", "alerts": list(alerts)}).encode()


RECOMMEND = ("      mode: recommend\n      stabilization_seconds: 60\n"
             "      min_switch_interval_seconds: 120\n      min_drafts_per_window: 100\n"
             "      min_requests_per_window: 5\n")
