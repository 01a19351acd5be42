"""Polling targets behind authentication and TLS, against a real HTTPS fake vLLM.

The fake target (http.server behind an ``ssl`` context from the generated test PKI) checks
the ``Authorization`` header and, for mutual TLS, the client certificate. Each test runs the
real exporter (config file → poller → pipeline → /metrics) and checks the target's health
series, and that no secret appears in the exposition, the landing page, the target's
last error, or the reprs of the config objects (the suite-wide conftest checks the logs).
"""

from __future__ import annotations

import base64
import contextlib
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import testsecrets
from helpers.certs import PKI, make_pki
from helpers.scrape import parse_exposition, select

from specwatch.app import settings as app_settings
from specwatch.app.serve import ServeApp
from specwatch.common.errors import ConfigError

PAGE = (Path(__file__).resolve().parents[1] / "fixtures/vllm-0.32-cpu-ngram/snap_1795971826019.prom"
        ).read_bytes()


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki-targets"))


@contextlib.contextmanager
def https_target(pki: PKI, expect_auth: str | None, require_client_cert: bool = False):
    """An HTTPS /metrics server; answers 401 unless ``Authorization == expect_auth``."""
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            auth = self.headers.get("Authorization")
            seen.append(auth)
            ok = expect_auth is None or auth == expect_auth
            body = PAGE if ok else b"unauthorized\n"
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    ctx = pki.server_context(require_client_cert)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    try:
        yield f"https://127.0.0.1:{srv.server_address[1]}/metrics", seen
    finally:
        srv.shutdown()
        srv.server_close()


def run_exporter(tmp_path: Path, target_yaml: str) -> tuple[dict, str, ServeApp]:
    """Build the exporter from a one-target config, poll once, return the scraped series,
    the raw page and the app (stopped)."""
    cfg_file = tmp_path / "specwatch.yaml"
    cfg_file.write_text("global: {listen: '127.0.0.1:0', timeout: 3}\ntargets:\n"
                        + target_yaml)
    cfg = app_settings.build_config(str(cfg_file), [], None, 60)
    app = ServeApp(cfg)
    app.start(poll=False)
    try:
        app.poller.poll_now("t")
        host, port = app.web.address
        body = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read().decode()
        landing = urllib.request.urlopen(f"http://{host}:{port}/", timeout=5).read().decode()
    finally:
        app.stop()
    return parse_exposition(body), body + landing, app


def assert_no_secret(text: str, app: ServeApp) -> None:
    snap = app.pipeline.snapshot.targets["t"]
    for secret in testsecrets.ALL:
        assert secret not in text
        assert secret not in (snap.last_error or "")
        assert secret not in repr(app.cfg)
        assert secret not in repr(list(app.poller.targets.values()))


def up_and_reason(series: dict) -> tuple[float, dict[str, float]]:
    up = next(iter(select(series, "specwatch_target_up", target="t").values()))
    errors = {dict(k[1])["reason"]: v for k, v in
              select(series, "specwatch_target_poll_errors_total", target="t").items()}
    return up, {k: v for k, v in errors.items() if v}


@pytest.mark.usefixtures("fetch_path")
def test_bearer_token_from_file_with_custom_ca(pki, tmp_path):
    """A bearer token read from a file reaches the target; the target's certificate is
    verified against tls.ca_file."""
    token = tmp_path / "token"
    token.write_text(testsecrets.TARGET_BEARER_TOKEN + "\n")
    with https_target(pki, f"Bearer {testsecrets.TARGET_BEARER_TOKEN}") as (url, seen):
        series, text, app = run_exporter(tmp_path, (
            f"  - name: t\n    url: {url}\n    auth: {{type: bearer, token_file: {token}}}\n"
            f"    tls: {{ca_file: {pki.ca}}}\n"))
    assert up_and_reason(series) == (1.0, {})
    assert seen == [f"Bearer {testsecrets.TARGET_BEARER_TOKEN}"]
    assert select(series, "sd_draft_length_configured", target="t")
    assert_no_secret(text, app)


@pytest.mark.usefixtures("fetch_path")
def test_bearer_token_from_environment(pki, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECWATCH_TEST_TOKEN", testsecrets.TARGET_BEARER_TOKEN)
    with https_target(pki, f"Bearer {testsecrets.TARGET_BEARER_TOKEN}") as (url, _seen):
        series, text, app = run_exporter(tmp_path, (
            f"  - name: t\n    url: {url}\n"
            f"    auth: {{type: bearer, token_env: SPECWATCH_TEST_TOKEN}}\n"
            f"    tls: {{ca_file: {pki.ca}}}\n"))
    assert up_and_reason(series) == (1.0, {})
    assert_no_secret(text, app)


@pytest.mark.usefixtures("fetch_path")
def test_basic_auth_from_password_file(pki, tmp_path):
    pw = tmp_path / "pw"
    pw.write_text(testsecrets.TARGET_BASIC_PASSWORD)
    expected = "Basic " + base64.b64encode(
        f"scraper:{testsecrets.TARGET_BASIC_PASSWORD}".encode()).decode()
    with https_target(pki, expected) as (url, _seen):
        series, text, app = run_exporter(tmp_path, (
            f"  - name: t\n    url: {url}\n"
            f"    auth: {{type: basic, username: scraper, password_file: {pw}}}\n"
            f"    tls: {{ca_file: {pki.ca}}}\n"))
    assert up_and_reason(series) == (1.0, {})
    assert_no_secret(text, app)


@pytest.mark.usefixtures("fetch_path")
def test_wrong_token_is_http_status_and_never_echoed(pki, tmp_path):
    """A rejected token: down with reason http_status (HTTP 401); the token is nowhere."""
    token = tmp_path / "token"
    token.write_text(testsecrets.TARGET_BEARER_TOKEN)
    with https_target(pki, "Bearer something-else") as (url, _seen):
        series, text, app = run_exporter(tmp_path, (
            f"  - name: t\n    url: {url}\n    auth: {{type: bearer, token_file: {token}}}\n"
            f"    tls: {{ca_file: {pki.ca}}}\n"))
    assert up_and_reason(series) == (0.0, {"http_status": 1.0})
    assert app.pipeline.snapshot.targets["t"].last_error == "http_status: HTTP 401"
    assert_no_secret(text, app)


@pytest.mark.usefixtures("fetch_path")
def test_unknown_ca_is_reason_tls(pki, tmp_path, monkeypatch):
    """Without tls.ca_file the private CA is not trusted: down with reason tls. A
    REQUESTS_CA_BUNDLE in the environment does not override a configured ca_file."""
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    with https_target(pki, None) as (url, _seen):
        series, _, app = run_exporter(tmp_path, f"  - name: t\n    url: {url}\n")
        assert up_and_reason(series) == (0.0, {"tls": 1.0})
        assert "certificate verify failed" in app.pipeline.snapshot.targets["t"].last_error
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(pki.other_ca))
        series, _, _ = run_exporter(tmp_path, (
            f"  - name: t\n    url: {url}\n    tls: {{ca_file: {pki.ca}}}\n"))
        assert up_and_reason(series) == (1.0, {})


@pytest.mark.usefixtures("fetch_path")
def test_insecure_skip_verify(pki, tmp_path):
    with https_target(pki, None) as (url, _seen):
        series, _, _ = run_exporter(tmp_path, (
            f"  - name: t\n    url: {url}\n    tls: {{insecure_skip_verify: true}}\n"))
    assert up_and_reason(series) == (1.0, {})


@pytest.mark.usefixtures("fetch_path")
@pytest.mark.parametrize("with_cert", [True, False])
def test_client_certificate_for_mutual_tls(pki, tmp_path, with_cert):
    """A target that requires a client certificate: served with tls.cert_file/key_file,
    refused (down, reason tls or connection) without."""
    cert = (f", cert_file: {pki.client.cert}, key_file: {pki.client.key}" if with_cert
            else "")
    with https_target(pki, None, require_client_cert=True) as (url, _seen):
        series, _, _ = run_exporter(tmp_path, (
            f"  - name: t\n    url: {url}\n    tls: {{ca_file: {pki.ca}{cert}}}\n"))
    up, errors = up_and_reason(series)
    if with_cert:
        assert (up, errors) == (1.0, {})
    else:
        assert up == 0.0 and set(errors) <= {"tls", "connection"} and sum(errors.values()) == 1


@pytest.mark.parametrize(("tls", "message"), [
    ("{ca_file: /nonexistent/ca.pem}", "targets[0].tls.ca_file: cannot read"),
    ("{cert_file: CERT}", "targets[0].tls: missing key_file"),
    ("{key_file: KEY, cert_file: /nonexistent.crt}", "targets[0].tls.cert_file: cannot read"),
    ("{cert_file: CERT, key_file: OTHERKEY}",
     "targets[0].tls: cannot load the client certificate and key: the key does not match"),
    ("{insecure_skip_verify: true, ca_file: CA}", "targets[0].tls.ca_file: set together"),
    ("{ca_file: CA, verify: false}", "targets[0].tls.verify: unknown key"),
])
def test_bad_target_tls_config(pki, tmp_path, tls, message):
    tls = (tls.replace("OTHERKEY", str(pki.other_client.key))
           .replace("CERT", str(pki.client.cert)).replace("KEY", str(pki.client.key))
           .replace("CA", str(pki.ca)))
    f = tmp_path / "c.yaml"
    f.write_text(f"targets:\n  - url: https://127.0.0.1:1/metrics\n    tls: {tls}\n")
    with pytest.raises(ConfigError, match=None) as err:
        app_settings.build_config(str(f), [], None, None)
    assert message in str(err.value), str(err.value)


def test_credentials_in_the_url_are_rejected_without_echoing_them(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("targets:\n  - url: http://scraper:"
                 f"{testsecrets.TARGET_BASIC_PASSWORD}@127.0.0.1:1/metrics\n")
    with pytest.raises(ConfigError) as err:
        app_settings.build_config(str(f), [], None, None)
    assert "targets[0].url: credentials in the URL are not allowed" in str(err.value)
    assert testsecrets.TARGET_BASIC_PASSWORD not in str(err.value)
