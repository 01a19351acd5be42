"""Hostile targets.

A target that trickles its headers cannot stretch a poll past its deadline or delay
shutdown; a redirect cannot carry configured secrets to another origin. Real sockets on
127.0.0.1 (helpers.faultserver), the real poller, and a real ``specwatch serve`` process for
the SIGTERM case.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import testsecrets
from helpers.controlkit import decision, make_actuator
from helpers.faultserver import FaultServer, TrickleHeaders

from specwatch.app import settings as app_settings
from specwatch.common import redact
from specwatch.common.errors import ConfigError
from specwatch.plugins.control.actuation import WebhookDelivery
from specwatch.plugins.control.settings import settings_from_raw
from specwatch.poll import config
from specwatch.poll.poller import Poller, PollTarget

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.usefixtures("fetch_path")
def test_trickled_headers_cannot_stretch_a_poll_past_its_deadline():
    """A server sending one header line every 0.2 s never lets a per-read
    timeout fire; the poll still ends at its 2 s total deadline as a ``timeout`` (old code:
    33.5 s with a 3 s deadline). The bound allows 1.5 s of scheduling noise on a loaded box."""
    with FaultServer(TrickleHeaders(0.2)) as srv:
        results = []
        poller = Poller([PollTarget("t", srv.url, timeout_seconds=2.0)], 60, results.append)
        try:
            t0 = time.monotonic()
            res = poller.poll_now("t")
            took = time.monotonic() - t0
        finally:
            poller.stop(timeout=5)
    print(f"\ntrickled headers: poll ended after {took:.2f}s (deadline 2s): "
          f"{res.error_reason}: {res.error_message}")
    assert res.error_reason == "timeout"
    assert took < 2.0 + 1.5


@pytest.mark.usefixtures("fetch_path")
def test_poller_stop_cuts_polls_in_flight_short():
    """``stop()`` does not wait for a poll's deadline (30 s here)."""
    with FaultServer(TrickleHeaders(0.2)) as srv:
        poller = Poller([PollTarget("t", srv.url, timeout_seconds=30.0)], 60, lambda r: None)
        poller.start()
        deadline = time.monotonic() + 10
        while srv.requests < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # the poll is reading headers now
        t0 = time.monotonic()
        poller.stop(timeout=10)
        took = time.monotonic() - t0
    assert srv.requests >= 1
    assert took < 2.0, took


@pytest.mark.skipif(not hasattr(signal, "SIGTERM"), reason="POSIX signals")
def test_serve_exits_within_2s_of_sigterm_whatever_the_targets_do(tmp_path):
    """`specwatch serve` polling a header-trickling target with a 30 s
    deadline exits (code 0) within 2 s of SIGTERM (old code: 17 s)."""
    with FaultServer(TrickleHeaders(0.2)) as srv:
        cfg = tmp_path / "specwatch.yaml"
        cfg.write_text(f"global: {{listen: '127.0.0.1:0', timeout: 30s, poll_interval: 60s}}\n"
                       f"targets: [{{name: slow, url: '{srv.url}'}}]\n")
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        proc = subprocess.Popen([sys.executable, "-m", "specwatch", "serve", "--config",
                                 str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env)
        try:
            deadline = time.monotonic() + 20
            while srv.requests < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert srv.requests >= 1, "the poll never started"
            time.sleep(0.5)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=20)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    print(f"\nSIGTERM to exit with a trickling target: {took:.2f}s")
    assert proc.returncode == 0, out
    assert took < 2.0, (took, out[-2000:])
    assert "Traceback" not in out


# -- item 4: secrets --------------------------------------------------------------------------


class Recorder:
    """An HTTP server recording each request's headers; ``/metrics`` answers per ``route``:
    a redirect (``("redirect", url)``) or a tiny page."""

    def __init__(self, redirect_to: str | None = None) -> None:
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.redirect_to = redirect_to
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                owner.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                if self.path == "/metrics" and owner.redirect_to is not None:
                    self.send_response(302)
                    self.send_header("Location", owner.redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = b"vllm:num_requests_running{model_name=\"m\"} 1\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        self.port = self.server.server_address[1]

    def url(self, path: str = "/metrics", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


SECRET_HEADERS = {"X-Api-Key": testsecrets.TARGET_API_KEY}
BEARER = {"Authorization": f"Bearer {testsecrets.TARGET_BEARER_TOKEN}"}


def _poll(url: str, mode: str | None, basic: bool = False):
    kwargs = {} if mode is None else {"follow_redirects": mode}
    target = PollTarget("t", url, timeout_seconds=5.0, headers={**SECRET_HEADERS, **BEARER},
                        basic_auth=("scraper", testsecrets.TARGET_BASIC_PASSWORD)
                        if basic else None, **kwargs)
    poller = Poller([target], 60, lambda r: None)
    try:
        return poller.poll_now("t")
    finally:
        poller.stop(timeout=5)


@pytest.mark.usefixtures("fetch_path")
@pytest.mark.parametrize("mode", [None, "same_host", "none"])
def test_a_redirect_to_another_origin_is_refused_by_default(mode):
    """With follow_redirects same_host (the default) or none, a redirect to
    another port is not followed: the other server sees no request at all and the poll
    fails as http_status (old code: X-Api-Key followed the redirect)."""
    other = Recorder()
    first = Recorder(redirect_to=other.url("/stolen"))
    try:
        res = _poll(first.url(), mode)
    finally:
        first.close()
        other.close()
    assert res.error_reason == "http_status", res
    assert "not followed" in res.error_message
    assert other.seen == []


@pytest.mark.usefixtures("fetch_path")
@pytest.mark.parametrize("other_host", ["127.0.0.1", "localhost"])
def test_follow_any_sends_no_configured_header_to_another_origin(other_host):
    """``follow_redirects: any`` follows a redirect to another port or host
    name, but every configured header (X-Api-Key, Authorization) and the basic-auth
    credentials stay behind: the other server sees only specwatch's own headers."""
    other = Recorder()
    first = Recorder(redirect_to=other.url("/page", host=other_host))
    try:
        res = _poll(first.url(), "any", basic=True)
    finally:
        first.close()
        other.close()
    assert res.error_reason is None, res
    assert [p for p, _ in other.seen] == ["/page"]
    headers = other.seen[0][1]
    assert "x-api-key" not in headers and "authorization" not in headers
    assert headers["user-agent"].startswith("specwatch/")
    assert first.seen[0][1]["x-api-key"] == testsecrets.TARGET_API_KEY


@pytest.mark.usefixtures("fetch_path")
def test_a_redirect_to_the_same_origin_keeps_the_headers():
    """same_host follows a redirect on the target's own scheme, host and port with its
    headers (a relative Location, as vLLM behind a path-rewriting proxy sends)."""
    srv = Recorder(redirect_to="/real")
    try:
        res = _poll(srv.url(), None)
    finally:
        srv.close()
    assert res.error_reason is None, res
    assert [p for p, _ in srv.seen] == ["/metrics", "/real"]
    assert srv.seen[1][1]["x-api-key"] == testsecrets.TARGET_API_KEY
    assert srv.seen[1][1]["authorization"] == BEARER["Authorization"]


def test_follow_redirects_is_validated(tmp_path):
    """An unknown follow_redirects value is one clear config error naming the key."""
    with pytest.raises(ConfigError, match=r"targets\[0\]\.follow_redirects: expected one of "
                                          r"same_host, any, none"):
        app_settings.build_config(_write(tmp_path, "targets: [{url: 'http://a:1/metrics', "
                                             "follow_redirects: always}]\n"), [], None, None)


def _write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "specwatch.yaml"
    p.write_text(text)
    return str(p)


@pytest.mark.usefixtures("fetch_path")
def test_secrets_from_every_source_never_reach_a_log_line(tmp_path, monkeypatch, caplog):
    """Webhook headers from a file and from the environment (one with a
    trailing newline, which requests refuses with an InvalidHeader quoting it), a webhook
    URL ``?token=``, a target header and a target URL query token are all registered for
    redaction in every printed form; the failure lines of the webhook delivery and of the
    poll carry none of them (old code: the header value and the URL token were logged; the
    suite-wide check in conftest fails any test whose records contain them)."""
    monkeypatch.setenv("SW_HOOK_SECRET", testsecrets.WEBHOOK_HEADER_SECRET + "\n")
    secret_file = tmp_path / "hook-key"
    secret_file.write_text(testsecrets.GENERIC_SECRET + "\n")
    raw = {"mode": "webhook", "webhook": {
        "url": f"http://127.0.0.1:9/hook?token={testsecrets.WEBHOOK_URL_TOKEN}",
        "headers_from_env": {"X-Hook-Token": "SW_HOOK_SECRET"},
        "headers_from_file": {"X-Hook-Key": str(secret_file)}}}
    s = settings_from_raw(raw, "cfg.yaml", "targets[0].controller", {"5m": 300.0}, "5m")
    for secret in (testsecrets.WEBHOOK_HEADER_SECRET, testsecrets.WEBHOOK_URL_TOKEN,
                   testsecrets.GENERIC_SECRET):
        for form in redact.forms(secret):
            assert redact.redact(f"x{form}x") == f"x{redact.REDACTED}x"
    assert s.webhook_url is not None
    act, _, _ = make_actuator(WebhookDelivery(s.webhook_url, s.webhook_headers, 2.0),
                                 attempts=2, backoff=0.01)
    caplog.set_level(logging.DEBUG)
    out = act.run_one(decision())
    assert not out.ok
    # A poll whose URL carries a token and whose failure message quotes the URL.
    url = f"http://127.0.0.1:9/metrics?access_token={testsecrets.TARGET_BEARER_TOKEN}"
    tc = config.build_target({"url": url, "headers": SECRET_HEADERS}, "targets[0]", "cfg",
                             2.0, 1 << 20)
    poller = Poller([PollTarget("t", tc.url, 2.0, headers=tc.headers)], 60, lambda r: None)
    try:
        res = poller.poll_now("t")
    finally:
        poller.stop(timeout=5)
    assert res.error_reason == "connection"
    printed = caplog.text + out.detail + res.error_message
    assert "delivering" in caplog.text  # the failure lines were written
    for secret in testsecrets.ALL:
        for form in redact.forms(secret):
            assert form not in printed, form
