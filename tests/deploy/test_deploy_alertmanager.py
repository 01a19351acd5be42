"""Alertmanager routes to on-call (deploy/alertmanager/), checked with the real Alertmanager
tools from Debian's prometheus-alertmanager package:

- `amtool check-config` on the file;
- `amtool config routes test --verify.receivers` pins every generated alert (by its own
  severity label) and a fixed set of label sets to their receivers;
- `amtool template render` renders the notification templates with alert data;
- a real `prometheus-alertmanager` process loads the file and its inhibition rule is observed
  through the v2 API: a target that is down mutes that target's SD alerts and no other's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from deploytools import ALERTMANAGER_CONFIG, REPO, free_port, generator, run, system_tool

CONTROLLER = "specwatch-controller"
BY_SEVERITY = {"critical": "oncall-pagerduty", "warning": "slack-sd-alerts",
               "info": "slack-sd-info"}
# The label every mixin alert carries (config.libsonnet, alertLabels) and the routes match.
BUNDLE_LABEL = {"component": "specwatch"}


def _routes_test(labels: dict[str, str], expected: list[str]) -> subprocess.CompletedProcess:
    """`amtool config routes test` with --verify.receivers (exit 1 on a mismatch)."""
    return run([system_tool("amtool"), "config", "routes", "test",
                f"--config.file={ALERTMANAGER_CONFIG}",
                f"--verify.receivers={','.join(expected)}",
                *[f"{k}={v}" for k, v in labels.items()]])


def _generated_alerts() -> list[dict]:
    alerts = []
    for path in generator().rule_files(REPO):
        for group in yaml.safe_load(path.read_text())["groups"]:
            alerts += [r for r in group["rules"] if "alert" in r]
    return alerts


def test_amtool_check_config_passes():
    """amtool check-config accepts the file (receivers with *_file secrets, templates)."""
    result = run([system_tool("amtool"), "check-config", ALERTMANAGER_CONFIG])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 receivers" in result.stdout and "2 inhibit rules" in result.stdout


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"alertname": "SDAcceptanceRateLow", "severity": "critical"},
         [CONTROLLER, "oncall-pagerduty"]),
        # The controller gets the low-acceptance alert whatever severity a team gives it.
        ({"alertname": "SDAcceptanceRateLow", "severity": "warning"},
         [CONTROLLER, "slack-sd-alerts"]),
        ({"alertname": "SDPredictedSpeedupLow", "severity": "warning"}, ["slack-sd-alerts"]),
        ({"alertname": "SDAcceptanceBimodal", "severity": "info"}, ["slack-sd-info"]),
        ({"alertname": "SpecwatchTargetDown", "severity": "critical"}, ["oncall-pagerduty"]),
        # Anything without a known severity still reaches people.
        ({"alertname": "SomethingElse"}, ["slack-sd-alerts"]),
    ],
)
def test_routes_pin_label_sets_to_receivers(labels, expected):
    """Each label set (of a specwatch alert: component="specwatch") resolves to exactly these
    receivers, in routing-tree order."""
    labels = {**labels, **BUNDLE_LABEL, "target": "vllm-a", "model_name": "qwen3-8b"}
    result = _routes_test(labels, expected)
    assert result.returncode == 0, result.stdout + result.stderr


def test_routes_test_is_live():
    """amtool really verifies: a wrong expectation exits non-zero."""
    result = _routes_test({"alertname": "SDAcceptanceRateLow", "severity": "critical",
                           **BUNDLE_LABEL}, ["slack-sd-info"])
    assert result.returncode != 0


def test_every_generated_alert_reaches_the_receivers_of_its_severity():
    """Each alert the mixin generates, with its own severity label, goes to that severity's
    receiver; SDAcceptanceRateLow also goes to the specwatch controller."""
    alerts = _generated_alerts()
    for rule in alerts:
        severity = rule["labels"]["severity"]
        assert severity in BY_SEVERITY, f"{rule['alert']}: severity {severity!r} has no route"
        expected = [BY_SEVERITY[severity]]
        if rule["alert"] == "SDAcceptanceRateLow":
            expected.insert(0, CONTROLLER)
        labels = {"alertname": rule["alert"], **rule["labels"], "target": "t",
                  "model_name": "m"}
        result = _routes_test(labels, expected)
        assert result.returncode == 0, f"{rule['alert']}: {result.stdout}{result.stderr}"
    names = {r["alert"] for r in alerts}
    if names:
        assert {"SDAcceptanceRateLow", "SpecwatchTargetDown"} <= names


def test_grouping_secrets_and_controller_receiver():
    """Notifications are grouped by target and model; every secret is read from a file; the
    controller receiver posts to the exporter's Alertmanager endpoint with a bearer token
    file and hears about resolution."""
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    assert config["route"]["group_by"] == ["target", "model_name"]
    receivers = {r["name"]: r for r in config["receivers"]}
    for receiver in receivers.values():
        for slack in receiver.get("slack_configs", []):
            assert "api_url" not in slack and slack["api_url_file"].startswith("/etc/")
        for pd in receiver.get("pagerduty_configs", []):
            assert "routing_key" not in pd and pd["routing_key_file"].startswith("/etc/")
    (webhook,) = receivers[CONTROLLER]["webhook_configs"]
    assert webhook["url"].endswith(":10440/controller/alertmanager")
    assert webhook["send_resolved"] is True
    auth = webhook["http_config"]["authorization"]
    assert auth["type"] == "Bearer" and "credentials" not in auth
    assert auth["credentials_file"].startswith("/etc/")


def test_notification_templates_render(tmp_path: Path):
    """The Slack/PagerDuty templates render a firing group with the alert's summary,
    description and runbook link."""
    data = {
        "receiver": "slack-sd-alerts", "status": "firing",
        "alerts": [{
            "status": "firing",
            "labels": {"alertname": "SDAcceptanceRateLow", "severity": "critical",
                       "target": "vllm-a", "model_name": "qwen3-8b"},
            "annotations": {"summary": "Speculative decoding acceptance rate is low.",
                            "description": "The 5m acceptance rate is 31%.",
                            "runbook_url": "https://example.org/runbook.md#sdacceptanceratelow"},
            "startsAt": "2026-01-01T00:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
        }],
        "groupLabels": {"target": "vllm-a", "model_name": "qwen3-8b"},
        "commonLabels": {"alertname": "SDAcceptanceRateLow", "severity": "critical",
                         "target": "vllm-a", "model_name": "qwen3-8b"},
        "commonAnnotations": {}, "externalURL": "http://alertmanager:9093",
    }
    data_file = tmp_path / "data.json"
    data_file.write_text(json.dumps(data))
    templates = ALERTMANAGER_CONFIG.parent / "templates" / "*.tmpl"
    result = run([system_tool("amtool"), "template", "render", f"--template.glob={templates}",
                  f"--template.data={data_file}",
                  '--template.text={{ template "specwatch.title" . }}\n'
                  '{{ template "specwatch.text" . }}'])
    assert result.returncode == 0, result.stderr
    title, *text = result.stdout.splitlines()
    assert title == "[FIRING:1] vllm-a / qwen3-8b SDAcceptanceRateLow"
    assert "*SDAcceptanceRateLow* (critical)" in text
    assert "The 5m acceptance rate is 31%." in text
    assert "Runbook: https://example.org/runbook.md#sdacceptanceratelow" in text


def _api(port: int, path: str, body: object | None = None) -> object:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v2/{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}, method="GET" if body is None else "POST")
    with urllib.request.urlopen(request, timeout=5) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


@pytest.fixture
def alertmanager(tmp_path: Path):
    """A real Alertmanager on a free loopback port, loaded with the unmodified config (secret
    files absent: they are read only when a notification is sent)."""
    etc = tmp_path / "etc"
    shutil.copytree(ALERTMANAGER_CONFIG.parent, etc)
    port = free_port()
    process = subprocess.Popen(
        [system_tool("prometheus-alertmanager"), f"--config.file={etc / 'alertmanager.yml'}",
         f"--storage.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                _api(port, "status")
                break
            except OSError:
                if process.poll() is not None:
                    pytest.fail(f"alertmanager exited: {process.stderr.read()}")
                if time.monotonic() > deadline:
                    pytest.fail("alertmanager did not start within 20 s")
                time.sleep(0.1)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)


def _settled(port: int, key: tuple[str, str], want: dict[tuple[str, str], str]
             ) -> dict[tuple[str, str], dict]:
    """Each alert's status keyed by two labels, polled until every alert in `want` is listed
    in its wanted state or 10 s pass. Alertmanager marks an alert inhibited asynchronously,
    after it lists it, so the first listing of all alerts may still show one `active`."""
    states: dict[tuple[str, str], dict] = {}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states = {(a["labels"][key[0]], a["labels"][key[1]]): a["status"]
                  for a in _api(port, "alerts")}
        if all(states.get(k, {}).get("state") == v for k, v in want.items()):
            break
        time.sleep(0.1)
    return states


def test_target_down_inhibits_that_targets_sd_alerts_only(alertmanager: int):
    """With SpecwatchTargetDown firing for target a, a's SD alerts are suppressed (inhibited
    by it) while target b's identical alert stays active, and a's own down alert pages."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def alert(**labels: str) -> dict:
        return {"labels": {**labels, **BUNDLE_LABEL}, "annotations": {"summary": "test"},
                "startsAt": now}

    _api(alertmanager, "alerts", [
        alert(alertname="SpecwatchTargetDown", severity="warning", target="a"),
        alert(alertname="SDAcceptanceRateLow", severity="critical", target="a",
              model_name="m"),
        alert(alertname="SDPredictedSpeedupLow", severity="warning", target="a",
              model_name="m"),
        alert(alertname="SDAcceptanceRateLow", severity="critical", target="b",
              model_name="m"),
    ])
    want = {("SDAcceptanceRateLow", "a"): "suppressed", ("SDPredictedSpeedupLow", "a"):
            "suppressed", ("SDAcceptanceRateLow", "b"): "active",
            ("SpecwatchTargetDown", "a"): "active"}
    states = _settled(alertmanager, ("alertname", "target"), want)
    assert states[("SDAcceptanceRateLow", "a")]["state"] == "suppressed"
    assert states[("SDAcceptanceRateLow", "a")]["inhibitedBy"]
    assert states[("SDPredictedSpeedupLow", "a")]["state"] == "suppressed"
    assert states[("SDAcceptanceRateLow", "b")]["state"] == "active"
    assert states[("SpecwatchTargetDown", "a")]["state"] == "active"


def test_breakeven_alert_inhibits_the_speedup_alert_of_the_same_model(alertmanager: int):
    """SDArrivalRateAboveBreakeven (the cause: load) mutes SDPredictedSpeedupLow for the same
    target and model, not for another model on that target."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def alert(name: str, model: str) -> dict:
        return {"labels": {"alertname": name, "severity": "warning", "target": "a",
                           "model_name": model, **BUNDLE_LABEL},
                "annotations": {"summary": "test"}, "startsAt": now}

    _api(alertmanager, "alerts", [
        alert("SDArrivalRateAboveBreakeven", "m1"),
        alert("SDPredictedSpeedupLow", "m1"),
        alert("SDPredictedSpeedupLow", "m2"),
    ])
    want = {("SDArrivalRateAboveBreakeven", "m1"): "active",
            ("SDPredictedSpeedupLow", "m1"): "suppressed",
            ("SDPredictedSpeedupLow", "m2"): "active"}
    states = {key: status["state"] for key, status in
              _settled(alertmanager, ("alertname", "model_name"), want).items()}
    assert states == {("SDArrivalRateAboveBreakeven", "m1"): "active",
                      ("SDPredictedSpeedupLow", "m1"): "suppressed",
                      ("SDPredictedSpeedupLow", "m2"): "active"}
