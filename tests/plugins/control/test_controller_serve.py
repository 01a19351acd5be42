"""The controller inside the real exporter: config, HTTP receiver, series, promtool.

`ServeApp` runs in-process with a fake clock: vLLM-shaped pages (tests/helpers/vllmpage.py)
go through the real pipeline (sources, history, derive, live model, controller hook), and
the real HTTP server answers /metrics, /controller and the Alertmanager receiver. One test
sends alerts through a real Alertmanager (Debian `prometheus-alertmanager`).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from helpers import testsecrets
from helpers.controlkit import RECOMMEND, Clock, Receiver, webhook_payload
from helpers.scrape import parse_exposition, select
from helpers.vllmpage import VllmState

from specwatch.app import settings as app_settings
from specwatch.app.serve import ServeApp
from specwatch.cli import main
from specwatch.poll.pipeline import PollResult

REPO = Path(__file__).resolve().parents[3]

ROOT = Path(__file__).resolve().parents[3]
PARAMS = ROOT / "examples/params/qwen3-32b-h100-eagle3.yaml"
TOKEN = testsecrets.RECEIVER_TOKEN
GOOD = (0.8, 0.6, 0.45)
BAD = (0.2, 0.05, 0.01)


class Harness:
    """One exporter with targets a (controlled) and b (not), driven poll by poll."""

    def __init__(self, tmp_path: Path, controller_block: str, receiver: bool = True,
                 web_config: str | None = None) -> None:
        token = tmp_path / "token"
        token.write_text(TOKEN + "\n")
        cfg = tmp_path / "specwatch.yaml"
        text = ("global:\n  windows: [1m]\n  model_window: 1m\n  count_window: 0\n"
                "targets:\n"
                f"  - name: a\n    url: http://127.0.0.1:1/metrics\n    params: {PARAMS}\n"
                f"    controller:\n{controller_block}"
                "  - name: b\n    url: http://127.0.0.1:2/metrics\n")
        if receiver:
            text += ("controller:\n  alertmanager:\n"
                     f"    token_file: {token}\n    alerts: [SDAcceptanceRateLow]\n")
        cfg.write_text(text)
        self.clock = Clock()
        self.app = ServeApp(app_settings.build_config(str(cfg), [], "127.0.0.1:0", 5.0,
                                                web_config=web_config), clock=self.clock)
        self.app.start(poll=False)
        host, port = self.app.web.address
        self.base = f"http://{host}:{port}"
        self.state = {"a": VllmState(model="m"), "b": VllmState(model="m")}

    def poll(self, seconds: float = 5.0, profile=GOOD, lam: float = 4.0, latency: float = 2.0,
             ttft: float = 0.1, down: bool = False) -> None:
        self.clock.t += seconds
        for name, st in self.state.items():
            st.advance(seconds, lam, profile, latency, ttft)
            body = None if down and name == "a" else st.render()
            self.app.pipeline.apply(PollResult(
                name, self.clock.t, self.clock.t, 0.01, body=body,
                error_reason="connection" if body is None else None))

    def metrics(self) -> dict:
        return parse_exposition(_get(self.base + "/metrics")[1])

    def status(self) -> dict:
        return json.loads(_get(self.base + "/controller")[1])["targets"]["a"]["models"]["m"]

    def post(self, body: bytes, token: str | None = TOKEN, method: str = "POST"):
        req = urllib.request.Request(self.base + "/controller/alertmanager", data=body,
                                     method=method)
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, resp.read().decode(), dict(resp.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(), dict(exc.headers)

    def close(self) -> None:
        self.app.stop()


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, resp.read().decode()


def alert(target: str, status: str = "firing", starts: str = "2027-01-15T08:00:00Z",
          name: str = "SDAcceptanceRateLow", fp: str = "f1", **labels: str) -> dict:
    return {"status": status, "labels": {"alertname": name, "target": target,
                                         "model_name": "m", **labels},
            "annotations": {}, "startsAt": starts, "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prom", "fingerprint": fp}


@pytest.fixture
def harness(tmp_path):
    made = []

    def make(block: str = RECOMMEND, receiver: bool = True,
             web_config: str | None = None) -> Harness:
        h = Harness(tmp_path, block, receiver, web_config)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def test_receiver_refuses_requests_without_the_right_token(harness):
    """No Authorization header, a wrong token, or another scheme: 401 with
    WWW-Authenticate, and the alert has no effect."""
    h = harness()
    body = webhook_payload(alert("a"))
    for token in (None, "wrong", TOKEN + "x"):
        status, _, headers = h.post(body, token=token)
        assert status == 401
        assert headers["WWW-Authenticate"].startswith("Bearer")
    req = urllib.request.Request(h.base + "/controller/alertmanager", data=body, method="POST",
                                 headers={"Authorization": f"Basic {TOKEN}"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=5)
    assert exc.value.code == 401
    series = h.metrics()
    assert all(v == 0 for v in select(series, "specwatch_controller_alerts_total").values())


def test_receiver_keeps_its_bearer_token_when_the_web_config_requires_basic_auth(
        harness, tmp_path):
    """With basic auth on every route (web config), Alertmanager still reaches the receiver
    with the bearer token alone, while /metrics without basic auth is refused."""
    import bcrypt

    wc = tmp_path / "web.yml"
    wc.write_text("basic_auth_users:\n  prom: "
                  + bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode() + "\n")
    h = harness(web_config=str(wc))
    with pytest.raises(urllib.error.HTTPError) as exc:
        _get(h.base + "/metrics")
    assert exc.value.code == 401
    status, text, _ = h.post(webhook_payload(alert("nope")))
    assert status == 200 and json.loads(text)["alerts"][0]["outcome"] == "ignored_target"
    assert h.post(webhook_payload(alert("nope")), token="bad")[0] == 401


@pytest.mark.parametrize(("body", "message"), [
    (b"not json", "not JSON"),
    (json.dumps({"version": "3", "alerts": []}).encode(), 'version: expected "4"'),
    (json.dumps({"version": "4", "alerts": {}}).encode(), "alerts: expected a list"),
    (json.dumps({"version": "4", "alerts": [{"status": "firing", "labels": {"alertname": "X"},
                                             "startsAt": "yesterday"}]}).encode(),
     "alerts[0].startsAt: not an RFC 3339 time"),
    (json.dumps({"version": "4", "alerts": [{"status": "pending", "labels": {}}]}).encode(),
     "alerts[0].status: expected firing or resolved"),
])
def test_receiver_rejects_malformed_payloads(harness, body, message):
    """A body that is not an Alertmanager v4 webhook: 400 naming the field."""
    h = harness()
    status, text, _ = h.post(body)
    assert status == 400 and message in text


def test_receiver_ignores_unknown_targets_other_alerts_and_other_methods(harness):
    """Alerts for a target without a controller (b), an unknown target, or an alert name
    not configured are answered 200 and ignored (counted by outcome); GET is 405."""
    h = harness()
    h.poll()
    status, text, _ = h.post(webhook_payload(
        alert("b", fp="1"), alert("nope", fp="2"), alert("a", name="SDBimodal", fp="3")))
    assert status == 200
    outcomes = [a["outcome"] for a in json.loads(text)["alerts"]]
    assert outcomes == ["ignored_target", "ignored_target", "ignored_alertname"]
    series = h.metrics()
    assert select(series, "specwatch_controller_alerts_total", outcome="ignored_target") \
        == {("specwatch_controller_alerts_total",
             frozenset({("outcome", "ignored_target")})): 2.0}
    assert h.status()["condition"] is None
    status, _, _ = h.post(b"", method="GET")
    assert status == 405


def test_alert_through_the_receiver_switches_off_with_the_same_guards(harness):
    """A firing SDAcceptanceRateLow for a/m while acceptance looks fine to the exporter, at
    12 req/s, where the model vouches for no speedup (its best k is saturated): nothing
    while the target is down (stale data), then a switch-off at the first fresh poll, the
    alert having held for more than the stabilization window (60 s). The state's reason is
    then `no_prediction`: the model has no valid prediction at that load."""
    h = harness()
    for _ in range(20):  # 100 s of healthy traffic: window complete
        h.poll(lam=12.0)
    starts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(h.clock.t))
    status, text, _ = h.post(webhook_payload(alert("a", starts=starts)))
    assert status == 200 and json.loads(text)["alerts"][0]["outcome"] == "accepted"
    for _ in range(16):  # 80 s with the target down: no decision on stale data
        h.poll(down=True, lam=12.0)
        assert h.status()["state"] == "enabled"
        assert h.status()["blocked"] == "target down: no fresh data"
    h.poll(lam=12.0)  # first fresh poll: the alert has held for 80 s >= 60 s
    st = h.status()
    assert st["state"] == "disabled" and st["last_decision"]["reason_code"] == "alert"
    series = h.metrics()
    assert select(series, "sd_controller_state", target="a", state="disabled") \
        == {("sd_controller_state", frozenset({("target", "a"), ("model_name", "m"),
                                                ("state", "disabled"),
                                                ("reason", "no_prediction")})): 1.0}
    assert list(select(series, "sd_controller_transitions_total", target="a",
                       action="disable").values()) == [1.0]
    assert not select(series, "sd_controller_state", target="b")


def test_alert_while_the_model_says_sd_pays_is_held_and_the_state_says_why(harness):
    """The same alert at 4 req/s, where the model predicts SD paying well above
    enable_above_speedup: no switch-off in 10 minutes; the state series' reason is
    `sd_pays` and GET /controller says, in words, which signals disagree."""
    h = harness()
    for _ in range(20):
        h.poll()
    starts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(h.clock.t))
    status, _, _ = h.post(webhook_payload(alert("a", starts=starts)))
    assert status == 200
    for _ in range(120):
        h.poll()
    st = h.status()
    assert st["state"] == "enabled" and st["reason"] == "sd_pays", st
    assert st["waiting"].startswith("keeping SD on, the signals disagree: Alertmanager "
                                    "alert SDAcceptanceRateLow firing; but SD pays: the "
                                    "model predicts "), st["waiting"]
    series = h.metrics()
    assert select(series, "sd_controller_state", target="a", state="enabled") \
        == {("sd_controller_state", frozenset({("target", "a"), ("model_name", "m"),
                                                ("state", "enabled"),
                                                ("reason", "sd_pays")})): 1.0}
    assert list(select(series, "sd_controller_transitions_total", target="a",
                       action="disable").values()) == [0.0]


WEBHOOK = ("      mode: webhook\n      stabilization_seconds: 60\n"
           "      min_switch_interval_seconds: 120\n      min_drafts_per_window: 100\n"
           "      min_requests_per_window: 5\n      retry_backoff_seconds: 10ms\n"
           "      max_retry_backoff_seconds: 20ms\n      max_attempts: 3\n"
           "      webhook:\n        url: {url}\n        timeout: 2s\n"
           "        headers_from_file:\n          Authorization: {auth}\n")


def _wait(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


def test_switch_delivery_confirmation_and_latency_record_pass_promtool(harness, tmp_path):
    """Webhook mode end to end in-process: low acceptance for 60 s -> one POST (with the
    header read from a file); the server comes back without SD -> disabled; the first full
    window after the switch gives sd_switch_latency_ratio (latency 2 s -> 3 s: P50 ratio
    from the histogram buckets); every controller series passes promtool check metrics."""
    auth = tmp_path / "deployer-auth"
    auth.write_text(f"Bearer {testsecrets.WEBHOOK_HEADER_SECRET}\n")
    r = Receiver([200])
    try:
        h = harness(WEBHOOK.format(url=r.url, auth=auth))
        for _ in range(15):
            h.poll()
        for _ in range(13):  # 60 s of a full low-acceptance window, then 60 s held
            h.poll(profile=BAD)
        assert h.status()["state"] == "enabled"
        for _ in range(12):
            h.poll(profile=BAD)
        assert h.status()["state"] == "pending"
        _wait(lambda: len(r.calls) == 1)
        headers, payload = r.calls[0]
        assert headers["authorization"] == f"Bearer {testsecrets.WEBHOOK_HEADER_SECRET}"
        assert headers["idempotency-key"] == payload["decision_id"]
        assert payload["action"] == "disable" and payload["reason_code"] == "low_acceptance"
        assert payload["target"] == "a" and payload["model"] == "m"
        assert payload["acceptance"]["source"] == "live"
        assert payload["arrival_rate"] == pytest.approx(4.0)
        # No draft length keeps the expected acceptance rate >= 0.4 with this profile:
        # the model recommends k = 0 and there is no schedule to hand to vLLM.
        assert payload["recommended_draft_length"] == 0 and payload["schedule"] is None
        _wait(lambda: h.status()["pending"]["delivered"])
        h.state["a"].restart(sd=False)  # what the deployer did
        h.poll(latency=3.0)
        assert h.status()["state"] == "disabled"
        for _ in range(12):
            h.poll(latency=3.0)
        series = h.metrics()
        ratios = select(series, "sd_switch_latency_ratio", target="a")
        got = {(dict(k[1])["latency"], dict(k[1])["percentile"]): v for k, v in ratios.items()}
        # Each request's latency is spread 50% at 0.8x, 49% at 1x, 1% at 3x of the mean.
        # Before (2 s): 99% in (1.5, 2] -> P50 = 1.5 + 0.5·(0.5/0.99).
        # After (3 s): 50% at 2.4 s fills (2, 2.5] -> P50 = 2 + 0.5·(0.5/0.5) = 2.5.
        p50_before = 1.5 + 0.5 * (0.5 / 0.99)
        p50_after = 2.5
        assert got[("e2e", "50")] == pytest.approx(p50_after / p50_before)
        assert got[("ttft", "50")] == pytest.approx(1.0)
        # The same record as calibration points: the mean latency (0.5·0.8 + 0.49·1 +
        # 0.01·3 = 0.92 of the nominal) of 2 s before (SD on, k = 3) and 3 s after (SD off:
        # no draft or acceptance length), at the 4 req/s load.
        lat = {dict(k[1])["side"]: v for k, v in
               select(series, "sd_switch_window_latency_seconds", target="a").items()}
        assert lat == pytest.approx({"before": 0.92 * 2.0, "after": 0.92 * 3.0})
        rate = {dict(k[1])["side"]: v for k, v in
                select(series, "sd_switch_window_arrival_rate", target="a").items()}
        assert rate == pytest.approx({"before": 4.0, "after": 4.0})
        k = {dict(key[1])["side"]: v for key, v in
             select(series, "sd_switch_window_draft_length", target="a").items()}
        assert k == pytest.approx({"before": 3.0})
        assert len(select(series, "sd_switch_timestamp_seconds", target="a",
                          action="disable")) == 1
        assert list(select(series, "sd_controller_actuation_errors_total",
                           target="a").values()) == [0.0]
        text = _get(h.base + "/metrics")[1]
        promtool = shutil.which("promtool")
        assert promtool, "promtool missing: run make setup"
        check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                               text=True, timeout=30)
        assert check.returncode == 0, check.stdout + check.stderr
        for name in ("sd_controller_state", "sd_controller_recommended_draft_length",
                     "sd_controller_transitions_total",
                     "sd_controller_last_transition_timestamp_seconds",
                     "sd_controller_actuation_errors_total", "sd_switch_latency_ratio",
                     "sd_switch_timestamp_seconds", "sd_switch_window_latency_seconds"):
            assert f"\n{name}{{" in text, name
    finally:
        r.close()


def test_failed_delivery_is_retried_then_counted_and_state_restored(harness, tmp_path):
    """Receiver answering 500: 3 attempts, then sd_controller_actuation_errors_total 1 and
    the state back to enabled (SD is still on); no further POST for that decision."""
    auth = tmp_path / "deployer-auth"
    auth.write_text("Bearer x\n")
    r = Receiver([500])
    try:
        h = harness(WEBHOOK.format(url=r.url, auth=auth))
        for _ in range(15):
            h.poll()
        for _ in range(25):
            h.poll(profile=BAD)
        assert h.status()["last_decision"]["action"] == "disable"
        _wait(lambda: h.status()["actuation_errors"] == 1)
        assert len(r.calls) == 3
        assert len({c[0]["idempotency-key"] for c in r.calls}) == 1
        h.poll(profile=BAD)
        assert h.status()["state"] == "enabled"
        assert list(select(h.metrics(), "sd_controller_actuation_errors_total",
                           target="a").values()) == [1.0]
        time.sleep(0.2)
        assert len(r.calls) == 3
    finally:
        r.close()


@pytest.mark.parametrize(("block", "message"), [
    ("      enable_above_speedup: 1.0\n", "enable_above_speedup: must be above"),
    ("      mode: webhook\n", "targets[0].controller.webhook: mode webhook needs"),
    ("      mode: command\n      command: {argv: []}\n", "command.argv: mode command needs"),
    ("      min_acceptance_rate: 1.5\n", "min_acceptance_rate: expected a number in [0, 1]"),
    ("      mode: shell\n", "controller.mode: expected one of recommend, webhook, command"),
    ("      stabilisation_seconds: 5\n", "controller.stabilisation_seconds: unknown key"),
    ("      mode: webhook\n      webhook:\n        url: http://x/\n        headers_from_env:\n"
     "          Authorization: SPECWATCH_NO_SUCH_VAR\n",
     "webhook.headers_from_env.Authorization: environment variable"),
])
def test_bad_controller_config_exits_2_naming_the_key(tmp_path, capsys, block, message):
    """Each bad controller block: one message with the file and key path, exit 2."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"targets:\n  - url: http://127.0.0.1:1/\n    controller:\n{block}")
    assert main(["serve", "--config", str(cfg), "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert str(cfg) in err and message in err, err
    assert "Traceback" not in err


def test_missing_receiver_token_file_exits_2(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("targets:\n  - url: http://127.0.0.1:1/\n"
                   f"controller:\n  alertmanager:\n    token_file: {tmp_path}/none\n")
    assert main(["serve", "--config", str(cfg), "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert "controller.alertmanager.token_file: cannot read" in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_alertmanager_delivers_to_the_receiver(harness, tmp_path):
    """A real Alertmanager (webhook_configs with a bearer credentials_file) routes a pushed
    SDAcceptanceRateLow alert to the receiver, which accepts it for target a."""
    am_bin = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if am_bin is None:
        pytest.fail("prometheus-alertmanager missing: run make setup")
    h = harness()
    h.clock.t = time.time()  # Alertmanager stamps real times
    h.poll()
    token = tmp_path / "am-token"
    token.write_text(TOKEN)
    port = _free_port()
    am_cfg = tmp_path / "am.yml"
    am_cfg.write_text(
        "route:\n  receiver: controller\n  group_by: [alertname, target, model_name]\n"
        "  group_wait: 0s\n  group_interval: 1s\n"
        "receivers:\n  - name: controller\n    webhook_configs:\n"
        f"      - url: {h.base}/controller/alertmanager\n        send_resolved: true\n"
        "        http_config:\n          authorization:\n"
        f"            credentials_file: {token}\n")
    proc = subprocess.Popen(
        [am_bin, f"--config.file={am_cfg}", f"--storage.path={tmp_path / 'am-data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        api = f"http://127.0.0.1:{port}/api/v2/alerts"
        body = json.dumps([{"labels": {"alertname": "SDAcceptanceRateLow", "target": "a",
                                       "model_name": "m", "severity": "warning"}}]).encode()
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(urllib.request.Request(
                    api, data=body, method="POST",
                    headers={"Content-Type": "application/json"}), timeout=2).close()
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)

        def accepted() -> bool:
            series = h.metrics()
            return list(select(series, "specwatch_controller_alerts_total",
                               outcome="accepted").values()) == [1.0]
        _wait(accepted, timeout=20)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_controller_off_by_default(harness, tmp_path):
    """Without a controller block nothing is added: no series, no routes."""
    cfg = tmp_path / "plain.yaml"
    cfg.write_text("targets:\n  - name: x\n    url: http://127.0.0.1:1/metrics\n")
    app = ServeApp(app_settings.build_config(str(cfg), [], "127.0.0.1:0", 5.0))
    assert app.controller is None
    assert "/controller/alertmanager" not in app.web.routes
    assert "/controller" not in app.web.routes


_ = threading  # the receiver helper runs its own threads


def _worst_case_alert(rule: dict, value: str) -> dict:
    """An SDAcceptanceRateLow notification entry as Alertmanager's webhook sends it, with
    every label value and every templated part of an annotation replaced by ``value``."""
    labels = {"alertname": rule["alert"], **rule.get("labels", {})}
    # The series' labels (target, model_name, window), the scrape's (job, instance,
    # cluster) and a few external labels of the Prometheus that evaluates the rule.
    for name in ("target", "model_name", "window", "job", "instance", "cluster",
                 "replica", "region", "environment"):
        labels[name] = value
    annotations = {k: re.sub(r"\{\{.*?\}\}", lambda _m: value, v)
                   for k, v in rule["annotations"].items()}
    generator = ("http://prometheus.monitoring.svc.cluster.local:9090/graph?g0.expr="
                 + urllib.parse.quote(rule["expr"], safe="") + "&g0.tab=1")
    return {"status": "firing", "labels": labels, "annotations": annotations,
            "startsAt": "2027-01-15T08:00:00.123456789Z",
            "endsAt": "2027-01-15T09:00:00.123456789Z",
            "generatorURL": generator, "fingerprint": "0123456789abcdef"}


def test_shipped_max_alerts_keeps_every_notification_under_the_body_limit(harness):
    """The shipped Alertmanager config caps what one notification to the receiver holds
    (max_alerts) so that it stays under the receiver's body limit (a 413 is not retried by
    Alertmanager: the group would be lost): max_alerts alerts of the worst case (every label
    value at the exporter's 256-byte cap, each character JSON-escaped to 6 bytes), with
    the group's common labels and annotations, are accepted; and the answer stays short."""
    from deploytools import ALERTMANAGER_CONFIG

    from specwatch.web.routing import MAX_REQUEST_BODY

    am = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    hook = next(r for r in am["receivers"] if r["name"] == "specwatch-controller"
                )["webhook_configs"][0]
    max_alerts = hook.get("max_alerts", 0)
    assert max_alerts > 0, "max_alerts 0 means no limit"
    rules = yaml.safe_load((REPO / "alerts" / "specwatch-alerts.yaml").read_text())
    rule = next(r for g in rules["groups"] for r in g["rules"]
                if r.get("alert") == "SDAcceptanceRateLow")
    worst = _worst_case_alert(rule, "\u2028" * 256)  # json.dumps writes each as \u2028
    alerts = [{**worst, "fingerprint": f"{i:016x}"} for i in range(max_alerts)]
    body = json.dumps({
        "version": "4", "groupKey": "{}/{alertname=\"SDAcceptanceRateLow\"}:"
        + json.dumps(worst["labels"]), "truncatedAlerts": 7, "status": "firing",
        "receiver": "specwatch-controller", "groupLabels": worst["labels"],
        "commonLabels": worst["labels"], "commonAnnotations": worst["annotations"],
        "externalURL": "http://alertmanager.monitoring.svc.cluster.local:9093",
        "alerts": alerts}).encode()
    print(f"\nworst-case notification of {max_alerts} alerts: {len(body)} bytes "
          f"({len(json.dumps(worst))} per alert), limit {MAX_REQUEST_BODY}")
    assert len(body) <= MAX_REQUEST_BODY
    h = harness()
    h.poll()
    status, text, _ = h.post(body)
    assert status == 200, text[:200]
    answer = json.loads(text)
    assert answer["received"] == max_alerts
    assert sum(answer["outcomes"].values()) == max_alerts
    assert len(text) < 2048 and "0123456789abcdef" not in text


def test_controller_reads_the_live_models_prediction_of_the_running_configuration(harness):
    """The controller's assessment of the running configuration is the live model's own
    prediction for it (sd_predicted_speedup of the same target and window), handed over
    by the application: the two plug-ins never import each other."""
    h = harness(RECOMMEND)
    for _ in range(20):
        h.poll()
    live = list(select(h.metrics(), "sd_predicted_speedup", target="a").values())
    assert live, "the live model published no prediction for target a"
    assessment = h.status()["assessment"]
    assert assessment is not None and assessment["current_speedup"] is not None, assessment
    assert assessment["current_speedup"] == pytest.approx(live[0], rel=1e-6)


def test_the_old_min_acceptance_rate_key_sets_the_alpha_guard_with_a_warning(tmp_path, caplog):
    """`min_acceptance_rate` (the key before the guard compared the k-independent α) still
    works: it sets min_acceptance_alpha and a warning says so; both keys at once exit 2."""
    from specwatch.plugins.control.controller import from_config

    cfg = tmp_path / "c.yaml"
    cfg.write_text("targets:\n  - name: a\n    url: http://127.0.0.1:1/\n    controller:\n"
                   "      min_acceptance_rate: 0.3\n")
    with caplog.at_level("WARNING"):
        ctl = from_config(app_settings.build_config(str(cfg), [], "127.0.0.1:0", 5.0), {}, {})
    assert ctl is not None and ctl.targets["a"].settings.min_acceptance_alpha == 0.3
    assert "targets[0].controller.min_acceptance_rate is deprecated: it now sets " \
        "min_acceptance_alpha" in caplog.text


def test_both_acceptance_keys_at_once_exit_2(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("targets:\n  - url: http://127.0.0.1:1/\n    controller:\n"
                   "      min_acceptance_rate: 0.3\n      min_acceptance_alpha: 0.4\n")
    assert main(["serve", "--config", str(cfg), "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert "targets[0].controller.min_acceptance_rate: the deprecated name of " \
        "min_acceptance_alpha; set only min_acceptance_alpha" in err, err
    assert "Traceback" not in err
