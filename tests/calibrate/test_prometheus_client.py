"""The HTTP client behind ``advise --prometheus`` and ``calibrate --prometheus``: a hostile
or broken server gives one line and exit 2, within the total deadline and the body cap.

Protects: ``--timeout 2`` against a server that sends its answer one byte every 0.5 s ends
in about 2 s (the deadline covers the whole query, connect to last byte, not each read); an
endless answer is refused at the body cap (never a MemoryError); answers that are JSON but
not Prometheus' (``[]``, a sample value ``"x"``, a result that is not a list, a metric that
is not an object) and JSON nested 100,000 deep are each one line naming what was wrong,
never an AttributeError, IndexError, KeyError, TypeError, ValueError or RecursionError.
The servers are real sockets on 127.0.0.1 (helpers.faultserver).
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import pytest
from helpers.faultserver import Endless, FaultServer, Serve, Trickle

from specwatch.cli import main

PARAMS = Path(__file__).resolve().parents[2] / "src/specwatch/sim/data/scenarios/demo-params.yaml"
COMMANDS = {
    "advise": lambda url: ["advise", "--params", str(PARAMS), "--prometheus", url,
                           "--timeout", "2"],
    "calibrate": lambda url: ["calibrate", "--prometheus", url, "--start", "now-1h",
                              "--timeout", "2"],
}


def _vector(value: object) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {}, "value": [1.0, value]}]}}).encode()


def _matrix(values: object) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"model_name": "m"}, "values": values}]}}).encode()


def _one_line(capsys: pytest.CaptureFixture[str], rc: int) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_trickling_answer_ends_at_the_total_deadline(command, capsys):
    body = _vector("1") if command == "advise" else _matrix([[1.0, "1"]])
    with FaultServer(Trickle(body, interval=0.5)) as server:
        t0 = time.monotonic()
        rc = main(COMMANDS[command](server.url))
        took = time.monotonic() - t0
    line = _one_line(capsys, rc)
    assert "within 2 s" in line or "within 2s" in line, line
    assert took < 4.0, took


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_endless_answer_is_refused_at_the_body_cap(command, capsys):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with FaultServer(Endless()) as server:
        rc = main(COMMANDS[command](server.url))
    line = _one_line(capsys, rc)
    assert "bytes" in line and "Prometheus" in line, line
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 400, grown_mib


#: (body, what the line says): JSON that is not a Prometheus answer.
MALFORMED = {
    "list": (b"[]", "expected a JSON object"),
    "nested": (b"[" * 100_000 + b"]" * 100_000, "nested"),
    "not-json": (b"<html>hello</html>", "without JSON"),
    "data-list": (b'{"status": "success", "data": []}', "data"),
    "result-object": (b'{"status": "success", "data": {"resultType": "KIND", '
                      b'"result": {}}}', "result"),
    "metric-list": (b'{"status": "success", "data": {"resultType": "KIND", "result": '
                    b'[{"metric": [], "value": [1, "1"], "values": [[1, "1"]]}]}}', "metric"),
    "error-object": (b'{"status": "error", "errorType": {"a": 1}, "error": ["x"]}',
                     "refused"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_json_that_is_not_a_prometheus_answer_is_one_line(command, case, capsys):
    body, says = MALFORMED[case]
    kind = b"vector" if command == "advise" else b"matrix"
    with FaultServer(Serve(body.replace(b"KIND", kind))) as server:
        rc = main(COMMANDS[command](server.url))
    line = _one_line(capsys, rc)
    assert says in line, line


@pytest.mark.parametrize("value", ["x", None, [1], ""])
def test_a_vector_value_that_is_not_a_number_is_one_line(value, capsys):
    with FaultServer(Serve(_vector(value))) as server:
        rc = main(COMMANDS["advise"](server.url))
    line = _one_line(capsys, rc)
    assert "sample" in line, line


@pytest.mark.parametrize("values", [[[1.0, "x"]], [[1.0]], [["t", "1"]], "x", [None]])
def test_a_matrix_value_that_is_not_a_number_is_one_line(values, capsys):
    with FaultServer(Serve(_matrix(values))) as server:
        rc = main(COMMANDS["calibrate"](server.url))
    line = _one_line(capsys, rc)
    assert "sample" in line, line
