"""Delivery of controller decisions: retries with backoff, idempotency, failures surfaced.

Real sockets (a local HTTP receiver) and real child processes; the retry sleep is replaced
by a recorder, so no test waits for a backoff.
"""

from __future__ import annotations

import json
import sys
import threading

import pytest
from helpers import testsecrets
from helpers.controlkit import Receiver, decision, make_actuator

from specwatch.plugins.control.actuation import (
    Actuator,
    CommandDelivery,
    DeliveryError,
    Outcome,
    WebhookDelivery,
)


@pytest.fixture
def receiver_factory():
    made = []

    def make(statuses):
        r = Receiver(statuses)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def test_transient_webhook_failures_are_retried_with_doubling_backoff(receiver_factory):
    """503, 503, then 200: three POSTs of the same payload with the same Idempotency-Key,
    waits of 2 s then 4 s, one successful outcome."""
    r = receiver_factory([503, 503, 200])
    bearer = f"Bearer {testsecrets.WEBHOOK_HEADER_SECRET}"
    act, waits, done = make_actuator(
        WebhookDelivery(r.url, {"Authorization": bearer}, timeout=5.0))
    out = act.run_one(decision())
    assert out == Outcome(True, 3, "HTTP 200")
    assert waits == [2.0, 4.0]
    assert [c[0]["idempotency-key"] for c in r.calls] == ["d1"] * 3
    assert all(c[1]["decision_id"] == "d1" and c[0]["authorization"] == bearer
               for c in r.calls)
    assert done == [(decision(), out)]


def test_failure_after_all_attempts_is_reported_once(receiver_factory):
    """Always 503 with 4 attempts and a 5 s cap: waits 2, 4, 5; one failed outcome."""
    r = receiver_factory([503])
    act, waits, done = make_actuator(WebhookDelivery(r.url, {}, 5.0), attempts=4,
                                     max_backoff=5.0)
    out = act.run_one(decision())
    assert not out.ok and out.attempts == 4 and out.detail.startswith("HTTP 503")
    assert waits == [2.0, 4.0, 5.0]
    assert len(r.calls) == 4 and len(done) == 1


def test_client_error_is_permanent(receiver_factory):
    """A 400 (the receiver rejects the payload) is not retried; a 429 is."""
    r = receiver_factory([400])
    act, waits, _ = make_actuator(WebhookDelivery(r.url, {}, 5.0))
    assert act.run_one(decision()).attempts == 1 and waits == []
    r2 = receiver_factory([429, 200])
    act2, _, _ = make_actuator(WebhookDelivery(r2.url, {}, 5.0))
    assert act2.run_one(decision()) == Outcome(True, 2, "HTTP 200")


def test_unreachable_receiver_is_a_transient_failure():
    """Connection refused: retried, then reported with the error."""
    act, waits, _ = make_actuator(WebhookDelivery("http://127.0.0.1:9/x", {}, 2.0),
                                  attempts=3)
    out = act.run_one(decision())
    assert not out.ok and out.attempts == 3 and "ConnectionError" in out.detail
    assert waits == [2.0, 4.0]


def test_a_decision_is_never_delivered_twice(receiver_factory):
    """The worker thread delivers each decision id once; resubmitting it is refused."""
    r = receiver_factory([200])
    done = threading.Event()
    act = Actuator("a", WebhookDelivery(r.url, {}, 5.0), lambda d, o: done.set())
    act.start()
    try:
        assert act.submit(decision("x"))
        assert not act.submit(decision("x"))
        assert done.wait(10)
        assert act.submit(decision("y"))
    finally:
        act.stop(5)
    assert [c[1]["decision_id"] for c in r.calls][:1] == ["x"]
    assert sum(c[1]["decision_id"] == "x" for c in r.calls) == 1


SCRIPT = """
import json, os, sys
payload = json.load(sys.stdin)
with open(sys.argv[1], "a") as fh:
    fh.write(json.dumps({"payload": payload, "env": {k: v for k, v in os.environ.items()
                                                  if k.startswith("SPECWATCH_")}}) + "\\n")
n = sum(1 for _ in open(sys.argv[1]))
sys.exit(0 if n >= int(sys.argv[2]) else 3)
"""


def test_command_gets_payload_on_stdin_and_env_and_is_retried(tmp_path):
    """A command that fails (exit 3) once then succeeds: two runs, payload on stdin, the
    SPECWATCH_* environment set, no shell involved."""
    script = tmp_path / "deploy.py"
    script.write_text(SCRIPT)
    log = tmp_path / "calls.jsonl"
    act, waits, _ = make_actuator(
        CommandDelivery([sys.executable, str(script), str(log), "2"], timeout=30.0))
    out = act.run_one(decision())
    assert out == Outcome(True, 2, "exit 0")
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 2 and waits == [2.0]
    assert calls[0]["payload"]["decision_id"] == "d1"
    assert calls[0]["env"] == {"SPECWATCH_DECISION_ID": "d1", "SPECWATCH_ACTION": "disable",
                               "SPECWATCH_TARGET": "vllm-a", "SPECWATCH_MODEL": "m",
                               "SPECWATCH_DRAFT_LENGTH": "2"}


def test_missing_command_is_permanent(tmp_path):
    act, _, _ = make_actuator(CommandDelivery([str(tmp_path / "nope")], timeout=5.0))
    out = act.run_one(decision())
    assert not out.ok and out.attempts == 1 and "cannot run" in out.detail


def test_delivery_error_carries_permanence():
    assert DeliveryError("x", permanent=True).permanent
    assert not DeliveryError("x").permanent


def test_a_trickling_receiver_ends_at_the_total_deadline():
    """A receiver answering one byte every 0.5 s: the attempt ends at the webhook's timeout
    (connect to last byte), not once per byte read."""
    import time

    from helpers.faultserver import FaultServer, Trickle

    with FaultServer(Trickle(b"x" * 40, interval=0.5)) as server:
        delivery = WebhookDelivery(server.url, {}, timeout=1.0)
        t0 = time.monotonic()
        with pytest.raises(DeliveryError, match="within 1s"):
            delivery(decision())
        took = time.monotonic() - t0
        delivery.close()
    assert took < 2.5, took


def test_an_endless_reply_is_refused_at_the_cap():
    from helpers.faultserver import Endless, FaultServer

    with FaultServer(Endless()) as server:
        delivery = WebhookDelivery(server.url, {}, timeout=5.0)
        with pytest.raises(DeliveryError, match="bytes"):
            delivery(decision())
        delivery.close()
