"""The shipped Alertmanager routes merged into another team's Alertmanager, as deploy/README
tells users to (the specwatch route as the first child of their root route, the four
receivers, the inhibit rules, the template), checked with the real `amtool`:

- the merged file passes `amtool check-config`;
- another team's alerts, `severity="critical"` ones and ones named like specwatch's included,
  reach that team's receivers and never specwatch's;
- every alert the mixin generates (alerts/specwatch-alerts.yaml, with its own labels) reaches
  the receiver of its severity (and the controller for SDAcceptanceRateLow).
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import yaml
from deploytools import ALERTMANAGER_CONFIG, REPO, run, system_tool

SD_RECEIVERS = {"oncall-pagerduty", "slack-sd-alerts", "slack-sd-info", "specwatch-controller"}
BY_SEVERITY = {"critical": "oncall-pagerduty", "warning": "slack-sd-alerts",
               "info": "slack-sd-info"}

# A platform team's Alertmanager as kube-prometheus-stack users write it: a default receiver,
# routes by team and by severity (a catch-all for critical pages), the Watchdog to a null
# receiver, and the chart's critical-inhibits-warning rule.
FOREIGN = """
global:
  resolve_timeout: 5m
  smtp_smarthost: smtp.example.com:587
  smtp_from: alertmanager@example.com
route:
  receiver: platform-email
  group_by: [alertname, namespace]
  group_wait: 30s
  group_interval: 5m
  repeat_interval: 12h
  routes:
    - receiver: "null"
      matchers: [alertname="Watchdog"]
    - receiver: db-pager
      matchers: [team="db"]
    - receiver: platform-pager
      matchers: [severity="critical"]
    - receiver: platform-slack
      matchers: [severity=~"warning|info"]
inhibit_rules:
  - source_matchers: [severity="critical"]
    target_matchers: [severity=~"warning|info"]
    equal: [namespace, alertname]
receivers:
  - name: "null"
  - name: platform-email
    email_configs:
      - to: platform@example.com
  - name: db-pager
    pagerduty_configs:
      - routing_key: 0123456789abcdef0123456789abcdef
  - name: platform-pager
    pagerduty_configs:
      - routing_key: fedcba9876543210fedcba9876543210
  - name: platform-slack
    slack_configs:
      - api_url: https://hooks.slack.com/services/T000/B000/XXXX
        channel: "#platform"
"""


def merged(tmp_path: Path) -> Path:
    """The foreign config with the shipped specwatch route merged in as its first child, the
    shipped receivers, inhibit rules and templates added (deploy/README, section 4)."""
    shipped = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    config = yaml.safe_load(FOREIGN)
    (route,) = [r for r in shipped["route"]["routes"]
                if r.get("matchers") == ['component="specwatch"']]
    config["route"]["routes"].insert(0, copy.deepcopy(route))
    config["receivers"] += shipped["receivers"]
    config["inhibit_rules"] += shipped["inhibit_rules"]
    config["templates"] = shipped["templates"]
    shutil.copytree(ALERTMANAGER_CONFIG.parent / "templates", tmp_path / "templates")
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _receivers(config: Path, labels: dict[str, str]) -> list[str]:
    """The receivers `amtool config routes test` sends ``labels`` to, in tree order."""
    result = run([system_tool("amtool"), "config", "routes", "test",
                  f"--config.file={config}", *[f"{k}={v}" for k, v in labels.items()]])
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip().split(",")


def _verify(config: Path, labels: dict[str, str], expected: list[str]) -> bool:
    result = run([system_tool("amtool"), "config", "routes", "test",
                  f"--config.file={config}", f"--verify.receivers={','.join(expected)}",
                  *[f"{k}={v}" for k, v in labels.items()]])
    return result.returncode == 0


def _generated_alerts() -> list[dict]:
    doc = yaml.safe_load((REPO / "alerts" / "specwatch-alerts.yaml").read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def test_the_merged_config_is_valid(tmp_path: Path) -> None:
    result = run([system_tool("amtool"), "check-config", str(merged(tmp_path))])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "9 receivers" in result.stdout and "3 inhibit rules" in result.stdout


@pytest.mark.parametrize(("labels", "expected"), [
    ({"alertname": "NodeDown", "severity": "critical", "namespace": "kube-system"},
     ["platform-pager"]),
    ({"alertname": "PostgresReplicationLag", "severity": "critical", "team": "db"},
     ["db-pager"]),
    ({"alertname": "KubePodCrashLooping", "severity": "warning"}, ["platform-slack"]),
    # Another team's alerts named like specwatch's, with its labels but not its component.
    ({"alertname": "SDAcceptanceRateLow", "severity": "critical", "target": "t"},
     ["platform-pager"]),
    ({"alertname": "SpecwatchTargetDown", "severity": "warning", "component": "gateway"},
     ["platform-slack"]),
    ({"alertname": "Watchdog", "severity": "none"}, ["null"]),
])
def test_other_teams_alerts_never_reach_the_sd_receivers(tmp_path: Path, labels, expected
                                                         ) -> None:
    config = merged(tmp_path)
    receivers = _receivers(config, labels)
    assert not SD_RECEIVERS & set(receivers), (labels, receivers)
    assert receivers == expected


def test_every_sd_alert_reaches_its_receiver_under_the_foreign_root(tmp_path: Path) -> None:
    """Each generated alert, with its own labels (severity, component), goes to the receiver
    of its severity; SDAcceptanceRateLow also to the controller. None reaches the foreign
    team's receivers."""
    config = merged(tmp_path)
    alerts = _generated_alerts()
    assert {"SDAcceptanceRateLow", "SpecwatchTargetDown", "SDMeasuredSlowdown"} <= {
        r["alert"] for r in alerts}
    for rule in alerts:
        labels = {"alertname": rule["alert"], **rule["labels"], "target": "t",
                  "model_name": "m", "namespace": "llm"}
        expected = [BY_SEVERITY[rule["labels"]["severity"]]]
        if rule["alert"] == "SDAcceptanceRateLow":
            expected.insert(0, "specwatch-controller")
        assert _receivers(config, labels) == expected, rule["alert"]


def test_the_check_is_live(tmp_path: Path) -> None:
    """amtool really verifies against the merged tree: without the component label an SD
    alert takes the foreign route, and a wrong expectation exits non-zero."""
    config = merged(tmp_path)
    assert _receivers(config, {"alertname": "SDModelInvalid", "severity": "warning"}) == [
        "platform-slack"]
    assert not _verify(config, {"alertname": "NodeDown", "severity": "critical"},
                       ["oncall-pagerduty"])
