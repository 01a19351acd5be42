"""The hardened HTTP server over real sockets: limits, timeouts, TLS, client certificates,
basic auth, reload.

Every test binds 127.0.0.1 on a free port; certificates are generated per session with
`cryptography` (helpers.certs). Time limits in assertions are functional deadlines (a scrape
must not wait for a stalled client), set well above what a loaded 2-core machine needs.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bcrypt
import pytest
from helpers import testsecrets
from helpers.certs import PKI, make_pki
from helpers.faultserver import FaultServer, Serve
from helpers.scrape import parse_exposition

from specwatch.app import settings as app_settings
from specwatch.app.serve import ServeApp
from specwatch.web.limits import ServerLimits
from specwatch.web.routing import Request, Response
from specwatch.web.server import WebServer
from specwatch.web.webconfig import BasicAuth

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def web_hash() -> str:
    # Cost 10 is what the toolkit docs recommend (htpasswd -nBC 10).
    return bcrypt.hashpw(testsecrets.WEB_PASSWORD.encode(), bcrypt.gensalt(10)).decode()


@contextlib.contextmanager
def server(routes: dict | None = None, web_config: str | None = None,
           limits: ServerLimits | None = None, listen: str = "127.0.0.1:0"):
    srv = WebServer(listen, routes or {"/metrics": lambda r: Response(200, b"up 1\n")},
                    web_config_file=web_config, limits=limits)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def get(srv: WebServer, path: str = "/metrics", headers: dict | None = None,
        ctx: ssl.SSLContext | None = None, timeout: float = 5.0
        ) -> tuple[int, dict[str, str], bytes]:
    host, port = srv.address
    conn = (http.client.HTTPSConnection(host, port, context=ctx, timeout=timeout)
            if ctx is not None else http.client.HTTPConnection(host, port, timeout=timeout))
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def wait_rejected(srv: WebServer, reason: str, at_least: int, timeout: float = 5.0) -> int:
    """The rejection counter once it reaches ``at_least`` (the server counts a refused
    connection just after closing it, so the client may notice first)."""
    deadline = time.monotonic() + timeout
    while srv.stats().rejected[reason] < at_least and time.monotonic() < deadline:
        time.sleep(0.02)
    return srv.stats().rejected[reason]


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def client_ctx(pki: PKI, cert=None, maximum: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
    if maximum is not None:
        ctx.maximum_version = maximum
    return ctx


def write_web_config(tmp_path: Path, text: str, name: str = "web.yml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def tls_config(pki: PKI, extra: str = "") -> str:
    return (f"tls_server_config:\n  cert_file: {pki.server.cert}\n"
            f"  key_file: {pki.server.key}\n{extra}")


# -- load and limits --------------------------------------------------------------------------


def _exporter_app(tmp_path: Path, good: FaultServer) -> ServeApp:
    cfg = app_settings.build_config(None, [f"vllm={good.url}"], "127.0.0.1:0", 5.0)
    app = ServeApp(cfg)
    app.start(poll=False)
    app.poller.poll_now("vllm")
    return app


def _scrape_storm(url_host: str, port: int, clients: int, seconds: float) -> tuple[int, list]:
    """``clients`` threads scraping /metrics (keep-alive) for ``seconds``; (count, errors)."""
    stop = time.monotonic() + seconds
    errors: list[str] = []
    counts = [0] * clients

    def worker(i: int) -> None:
        conn = http.client.HTTPConnection(url_host, port, timeout=10)
        while time.monotonic() < stop:
            try:
                conn.request("GET", "/metrics")
                resp = conn.getresponse()
                body = resp.read()
                if resp.status != 200 or b"specwatch_target_up" not in body:
                    errors.append(f"status {resp.status}")
                counts[i] += 1
            except Exception as exc:  # every failure is a finding
                errors.append(repr(exc))
                conn.close()
                conn = http.client.HTTPConnection(url_host, port, timeout=10)
        conn.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
    return sum(counts), errors


def test_40_concurrent_scrapes_short_run_no_error(tmp_path):
    """40 clients scraping the real exporter at once for 3 s: every answer is a 200 with
    the full page (40 is node_exporter's default request cap, so none may be refused)."""
    with FaultServer(Serve((ROOT / "tests/fixtures/vllm-0.32-cpu-ngram/"
                            "snap_1795971826019.prom").read_bytes())) as good:
        app = _exporter_app(tmp_path, good)
        try:
            host, port = app.web.address
            n, errors = _scrape_storm(host, port, 40, 3.0)
            assert errors == [], errors[:5]
            assert n >= 40
            assert app.web.stats().rejected["in_flight_limit"] == 0
        finally:
            app.stop()


@pytest.mark.slow
def test_40_concurrent_scrapes_for_30_seconds_no_error(tmp_path):
    """The full-length run: 40 concurrent scrapers for 30 s, no error, threads bounded."""
    with FaultServer(Serve((ROOT / "tests/fixtures/vllm-0.32-cpu-ngram/"
                            "snap_1795971826019.prom").read_bytes())) as good:
        app = _exporter_app(tmp_path, good)
        try:
            host, port = app.web.address
            n, errors = _scrape_storm(host, port, 40, 30.0)
            print(f"\n40 clients x 30 s: {n} scrapes, {len(errors)} errors")
            assert errors == [], errors[:5]
            assert n >= 400
        finally:
            app.stop()


def test_requests_above_the_in_flight_cap_get_503_at_once():
    """With max 2 requests in flight, a third concurrent request is refused with 503
    immediately (not queued); once the slots free up, requests succeed again."""
    release = threading.Event()
    entered = threading.Semaphore(0)

    def slow(_req: Request) -> Response:
        entered.release()
        release.wait(10)
        return Response(200, b"slow\n")

    routes = {"/slow": slow, "/metrics": lambda r: Response(200, b"ok\n")}
    with server(routes, limits=ServerLimits(max_requests_in_flight=2)) as srv, \
            ThreadPoolExecutor(2) as pool:
        futs = [pool.submit(get, srv, "/slow") for _ in range(2)]
        assert entered.acquire(timeout=5) and entered.acquire(timeout=5)
        t0 = time.monotonic()
        status, headers, _ = get(srv)
        assert status == 503 and time.monotonic() - t0 < 2.0
        assert headers.get("retry-after") == "1"
        release.set()
        assert [f.result(10)[0] for f in futs] == [200, 200]
        assert get(srv)[0] == 200
        assert srv.stats().rejected["in_flight_limit"] == 1
        deadline = time.monotonic() + 5  # a slot is freed just after its answer is written
        while srv.stats().in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.stats().in_flight == 0


def test_handler_overrunning_the_request_timeout_gets_503_and_keeps_its_slot():
    """A handler slower than request_timeout: the client gets 503 at the deadline; the
    slot stays taken until the handler returns (so a stuck handler cannot multiply)."""
    done = threading.Event()

    def stuck(_req: Request) -> Response:
        done.wait(10)
        return Response(200, b"late\n")

    with server({"/stuck": stuck}, limits=ServerLimits(request_timeout=0.5)) as srv:
        t0 = time.monotonic()
        status, _, _ = get(srv, "/stuck")
        assert status == 503 and time.monotonic() - t0 < 3.0
        assert srv.stats().in_flight == 1 and srv.stats().rejected["timeout"] == 1
        done.set()
        deadline = time.monotonic() + 5
        while srv.stats().in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        assert srv.stats().in_flight == 0


def test_slowloris_connections_are_cut_at_the_deadline_and_scrapes_still_answer():
    """30 clients trickling request headers (one byte, then nothing) hold no thread past
    request_timeout, and a normal scrape is answered meanwhile."""
    before = threading.active_count()
    with server(limits=ServerLimits(request_timeout=1.0)) as srv:
        socks = []
        for _ in range(30):
            s = socket.create_connection(srv.address)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            socks.append(s)
        t0 = time.monotonic()
        assert get(srv)[0] == 200
        assert time.monotonic() - t0 < 1.0
        for s in socks:  # each is closed by the server at its deadline
            s.settimeout(5)
            assert s.recv(100) == b""
            s.close()
        assert srv.stats().rejected["timeout"] == 30
        deadline = time.monotonic() + 5
        while srv.stats().connections and time.monotonic() < deadline:
            time.sleep(0.02)
        assert srv.stats().connections == 0
    time.sleep(0.1)
    assert threading.active_count() <= before + 2


def test_connections_above_the_cap_are_closed_at_once():
    """max_connections bounds threads: the connection over the cap is closed without
    being served and counted; existing connections still work."""
    with server(limits=ServerLimits(max_connections=3)) as srv:
        held = [socket.create_connection(srv.address) for _ in range(3)]
        time.sleep(0.2)
        extra = socket.create_connection(srv.address)
        extra.settimeout(5)
        with contextlib.suppress(ConnectionResetError):
            assert extra.recv(10) == b""
        extra.close()
        held[0].sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        held[0].settimeout(5)
        assert held[0].recv(100).startswith(b"HTTP/1.1 200")
        for s in held:
            s.close()
        assert wait_rejected(srv, "connection_limit", 1) == 1


def test_bind_address_is_honoured():
    """--listen 127.0.0.2:0 serves on 127.0.0.2 only: 127.0.0.1 on that port is refused."""
    with server(listen="127.0.0.2:0") as srv:
        host, port = srv.address
        assert host == "127.0.0.2" and get(srv)[0] == 200
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2)


# -- TLS ------------------------------------------------------------------------------------


def test_stalled_tls_handshakes_do_not_delay_https_scrapes(pki, tmp_path):
    """20 clients that connect and never send a ClientHello: an HTTPS scrape still answers
    in under a second (prometheus_client's server stalls here), and the stalled sockets are
    closed at the handshake timeout and counted."""
    wc = write_web_config(tmp_path, tls_config(pki))
    with server(web_config=wc, limits=ServerLimits(handshake_timeout=1.5)) as srv:
        stalled = [socket.create_connection(srv.address) for _ in range(20)]
        time.sleep(0.2)
        t0 = time.monotonic()
        status, _, body = get(srv, ctx=client_ctx(pki))
        took = time.monotonic() - t0
        assert status == 200 and body == b"up 1\n"
        assert took < 1.0, f"HTTPS scrape took {took:.2f}s with 20 stalled handshakes"
        for s in stalled:
            s.settimeout(5)
            with contextlib.suppress(ConnectionResetError):
                assert s.recv(10) == b""
            s.close()
        assert wait_rejected(srv, "tls_handshake", 20) == 20


def test_tls_default_minimum_is_1_2_and_min_version_is_enforced(pki, tmp_path):
    """Default min_version is TLS 1.2; with min_version TLS13 a TLS 1.2 client is refused
    and a TLS 1.3 client served."""
    with server(web_config=write_web_config(tmp_path, tls_config(pki))) as srv:
        assert srv.web_config.tls.context.minimum_version == ssl.TLSVersion.TLSv1_2
        assert get(srv, ctx=client_ctx(pki, maximum=ssl.TLSVersion.TLSv1_2))[0] == 200
    wc = write_web_config(tmp_path, tls_config(pki, "  min_version: TLS13\n"), "w13.yml")
    with server(web_config=wc) as srv:
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            get(srv, ctx=client_ctx(pki, maximum=ssl.TLSVersion.TLSv1_2))
        assert get(srv, ctx=client_ctx(pki))[0] == 200


def test_plain_http_to_the_tls_port_is_not_served(pki, tmp_path):
    """With TLS on, a plain-HTTP request gets no HTTP answer (the port speaks TLS only)."""
    with server(web_config=write_web_config(tmp_path, tls_config(pki))) as srv, \
            pytest.raises((http.client.HTTPException, ConnectionResetError, OSError)):
        get(srv)


@pytest.mark.parametrize("client", ["good", "missing", "untrusted_ca"])
def test_require_and_verify_client_cert(pki, tmp_path, client):
    """RequireAndVerifyClientCert: a certificate from the client CA is served; no
    certificate, or one from another CA, is refused before any HTTP exchange."""
    wc = write_web_config(tmp_path, tls_config(
        pki, f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki.ca}\n"))
    cert = {"good": pki.client, "missing": None, "untrusted_ca": pki.other_client}[client]
    with server(web_config=wc) as srv:
        if client == "good":
            assert get(srv, ctx=client_ctx(pki, cert))[0] == 200
        else:
            with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError,
                                http.client.RemoteDisconnected)):
                get(srv, ctx=client_ctx(pki, cert))
            assert wait_rejected(srv, "tls_handshake", 1) == 1


def test_verify_client_cert_if_given(pki, tmp_path):
    """VerifyClientCertIfGiven: no certificate is fine, an untrusted one is refused."""
    wc = write_web_config(tmp_path, tls_config(
        pki, f"  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: {pki.ca}\n"))
    with server(web_config=wc) as srv:
        assert get(srv, ctx=client_ctx(pki))[0] == 200
        assert get(srv, ctx=client_ctx(pki, pki.client))[0] == 200
        with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError,
                            http.client.RemoteDisconnected)):
            get(srv, ctx=client_ctx(pki, pki.other_client))


@pytest.mark.parametrize(("allowed", "served"), [("prometheus.test", True),
                                                 ("other.test", False)])
def test_client_allowed_sans(pki, tmp_path, allowed, served):
    """client_allowed_sans: a verified certificate whose SANs are not listed is refused."""
    wc = write_web_config(tmp_path, tls_config(
        pki, f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki.ca}\n"
             f"  client_allowed_sans: [{allowed}]\n"))
    with server(web_config=wc) as srv:
        if served:
            assert get(srv, ctx=client_ctx(pki, pki.client))[0] == 200
        else:
            with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError,
                                http.client.RemoteDisconnected)):
                get(srv, ctx=client_ctx(pki, pki.client))


# -- basic auth -----------------------------------------------------------------------------


@pytest.mark.parametrize(("who", "status"), [
    ("right", 200), ("wrong_password", 401), ("unknown_user", 401), ("no_header", 401),
    ("not_basic", 401)])
def test_basic_auth(tmp_path, web_hash, who, status):
    """Right credentials pass; a wrong password, an unknown user, a missing or non-Basic
    header get 401 with a WWW-Authenticate challenge and no body from the handler."""
    wc = write_web_config(tmp_path, f"basic_auth_users:\n  {testsecrets.WEB_USER}: "
                                    f"'{web_hash}'\n")
    headers = {
        "right": basic(testsecrets.WEB_USER, testsecrets.WEB_PASSWORD),
        "wrong_password": basic(testsecrets.WEB_USER, testsecrets.WEB_PASSWORD + "x"),
        "unknown_user": basic("mallory", testsecrets.WEB_PASSWORD),
        "no_header": {},
        "not_basic": {"Authorization": f"Bearer {testsecrets.WEB_PASSWORD}"},
    }[who]
    with server(web_config=wc) as srv:
        got, resp_headers, body = get(srv, headers=headers)
        assert got == status
        if status == 401:
            assert resp_headers["www-authenticate"].startswith("Basic realm=")
            assert body != b"up 1\n"


def test_unknown_user_costs_one_bcrypt_of_the_same_cost_as_a_wrong_password(web_hash):
    """No user enumeration: an unknown user runs exactly one bcrypt comparison against a
    dummy hash of the users' cost, like a wrong password does, and takes as long (fastest
    of 7 interleaved uncached attempts each, within a factor 1.5)."""
    auth = BasicAuth({testsecrets.WEB_USER: web_hash.encode()})
    assert auth._dummy[:7] == web_hash.encode()[:7]  # same algorithm and cost: "$2b$10$"

    def timed(user: str, i: int) -> float:
        calls = auth.bcrypt_calls
        t0 = time.perf_counter()
        assert not auth.check(user, f"wrong-{i}".encode())
        took = time.perf_counter() - t0
        assert auth.bcrypt_calls == calls + 1
        return took

    # Interleaved, and the minimum of each: scheduling noise on a shared machine only ever
    # adds time, so the minimum is the intrinsic cost (identical when the paths are).
    wrong, unknown = [], []
    for i in range(7):
        wrong.append(timed(testsecrets.WEB_USER, i))
        unknown.append(timed("mallory", 100 + i))
    assert 1 / 1.5 < min(unknown) / min(wrong) < 1.5, (wrong, unknown)


def test_concurrent_good_and_bad_logins_give_exact_results(tmp_path, web_hash):
    """150 good and 150 bad logins at once (the toolkit's cache test): exactly 150 × 200
    and 150 × 401."""
    cheap = bcrypt.hashpw(testsecrets.WEB_PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    wc = write_web_config(tmp_path, f"basic_auth_users:\n  {testsecrets.WEB_USER}: "
                                    f"'{cheap}'\n")
    good = basic(testsecrets.WEB_USER, testsecrets.WEB_PASSWORD)
    bad = basic(testsecrets.WEB_USER, "nope")
    # Failed logins are limited per address; this test is about exact results
    # under concurrency, so its one address may fail 150 times.
    with server(web_config=wc, limits=ServerLimits(max_requests_in_flight=400,
                                                   failed_logins_per_client=1000)) as srv, \
            ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda h: get(srv, headers=h, timeout=30)[0],
                                [good, bad] * 150))
    assert results.count(200) == 150 and results.count(401) == 150
    assert results == [200, 401] * 150


def test_cache_cannot_be_poisoned_cve_2022_46146(web_hash):
    """A cached success for (user, password) never lets another password or another user
    in (the cache key holds user, hash and password)."""
    other_hash = bcrypt.hashpw(b"other-password", bcrypt.gensalt(4))
    auth = BasicAuth({testsecrets.WEB_USER: web_hash.encode(), "bob": other_hash})
    assert auth.check(testsecrets.WEB_USER, testsecrets.WEB_PASSWORD.encode())
    assert auth.check(testsecrets.WEB_USER, testsecrets.WEB_PASSWORD.encode())  # cached
    assert not auth.check(testsecrets.WEB_USER, b"anything")
    assert not auth.check("bob", testsecrets.WEB_PASSWORD.encode())
    assert not auth.check("ghost", testsecrets.WEB_PASSWORD.encode())
    assert auth.check("bob", b"other-password")
    assert not auth.check(testsecrets.WEB_USER, b"other-password")


def test_passwords_over_72_bytes_are_refused_not_truncated():
    """bcrypt reads 72 bytes; a longer password sharing those 72 bytes must not pass."""
    pw = b"a" * 72
    auth = BasicAuth({"u": bcrypt.hashpw(pw, bcrypt.gensalt(4))})
    assert auth.check("u", pw)
    assert not auth.check("u", pw + b"extra")


def test_rate_limit_answers_429(tmp_path):
    """rate_limit {interval: 10s, burst: 2}: the third request in a row gets 429."""
    wc = write_web_config(tmp_path, "rate_limit: {interval: 10s, burst: 2}\n")
    with server(web_config=wc) as srv:
        assert [get(srv)[0] for _ in range(3)] == [200, 200, 429]
        assert srv.stats().rejected["rate_limited"] == 1


def test_security_headers_from_the_web_config(tmp_path):
    wc = write_web_config(tmp_path, "http_server_config:\n  headers:\n"
                                    "    X-Frame-Options: deny\n"
                                    "    Strict-Transport-Security: max-age=31536000\n")
    with server(web_config=wc) as srv:
        _, headers, _ = get(srv)
        assert headers["x-frame-options"] == "deny"
        assert headers["strict-transport-security"] == "max-age=31536000"


# -- reload ---------------------------------------------------------------------------------


def test_reload_swaps_users_without_dropping_requests_in_flight(tmp_path, web_hash):
    """A reload while a request is in flight: that request completes (200); new requests
    use the new users; a broken new file keeps the previous config and reports it."""
    release = threading.Event()
    entered = threading.Event()

    def slow(_req: Request) -> Response:
        entered.set()
        release.wait(10)
        return Response(200, b"done\n")

    wc = write_web_config(tmp_path, f"basic_auth_users:\n  {testsecrets.WEB_USER}: "
                                    f"'{web_hash}'\n")
    old = basic(testsecrets.WEB_USER, testsecrets.WEB_PASSWORD)
    new_hash = bcrypt.hashpw(b"second-password", bcrypt.gensalt(4)).decode()
    with server({"/slow": slow, "/metrics": lambda r: Response(200, b"up 1\n")},
                web_config=wc) as srv, ThreadPoolExecutor(1) as pool:
        inflight = pool.submit(get, srv, "/slow", old)
        assert entered.wait(5)
        Path(wc).write_text(f"basic_auth_users:\n  alice: '{new_hash}'\n")
        assert srv.reload_web_config()
        release.set()
        assert inflight.result(10)[0] == 200
        assert get(srv, headers=old)[0] == 401
        assert get(srv, headers=basic("alice", "second-password"))[0] == 200
        Path(wc).write_text("basic_auth_users:\n  alice: not-a-hash\n")
        assert not srv.reload_web_config()
        assert get(srv, headers=basic("alice", "second-password"))[0] == 200
        assert srv.stats().web_config_reload_success is False


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")
def test_serve_command_reloads_web_config_on_sighup(tmp_path, web_hash, pki):
    """`specwatch serve --web-config` over HTTPS with basic auth: SIGHUP with a new user
    file switches users; a bad file keeps the old one (error logged, exit code unchanged);
    no secret ever reaches the process's log output."""
    wc = tmp_path / "web.yml"
    wc.write_text(tls_config(pki) + f"basic_auth_users:\n  {testsecrets.WEB_USER}: "
                                    f"'{web_hash}'\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "specwatch", "serve", "--target", "http://127.0.0.1:9/metrics",
         "--listen", f"127.0.0.1:{port}", "--web-config", str(wc), "--poll-interval", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    ctx = client_ctx(pki)

    def status(headers: dict) -> int:
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
        try:
            conn.request("GET", "/metrics", headers=headers)
            return conn.getresponse().status
        finally:
            conn.close()

    def wait_for(want: int, headers: dict) -> None:
        deadline = time.monotonic() + 15
        last: object = None
        while time.monotonic() < deadline:
            try:
                last = status(headers)
                if last == want:
                    return
            except OSError as exc:
                last = exc
            time.sleep(0.1)
        raise AssertionError(f"wanted {want}, last {last!r}")

    try:
        old = basic(testsecrets.WEB_USER, testsecrets.WEB_PASSWORD)
        wait_for(200, old)
        new_hash = bcrypt.hashpw(b"rotated-password", bcrypt.gensalt(4)).decode()
        wc.write_text(tls_config(pki) + f"basic_auth_users:\n  ops: '{new_hash}'\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(200, basic("ops", "rotated-password"))
        assert status(old) == 401
        wc.write_text("tls_server_config: [broken\n")
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.8)
        assert status(basic("ops", "rotated-password")) == 200
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert "web config reload failed, keeping the previous one" in out
    for secret in testsecrets.ALL:
        assert secret not in out


def test_web_config_flag_with_bad_file_exits_2(tmp_path, capsys):
    """A bad --web-config is a start-up error naming the file and key, exit code 2."""
    from specwatch.cli import main

    wc = write_web_config(tmp_path, "tls_server_config:\n  cert_file: /nonexistent.crt\n"
                                    "  key_file: /nonexistent.key\n")
    assert main(["serve", "--target", "http://127.0.0.1:9/metrics", "--listen",
                 "127.0.0.1:0", "--web-config", wc]) == 2
    err = capsys.readouterr().err
    assert f"{wc}: tls_server_config.cert_file: cannot read" in err
    assert "Traceback" not in err


def test_exporter_exposes_http_rejections(tmp_path):
    """specwatch_http_requests_rejected_total{reason} is on /metrics with every reason."""
    cfg = app_settings.build_config(None, ["http://127.0.0.1:9/metrics"], "127.0.0.1:0", 60)
    app = ServeApp(cfg)
    app.start(poll=False)
    try:
        _, _, body = get(app.web)
        series = parse_exposition(body.decode())
        reasons = {dict(k[1])["reason"] for k in series
                   if k[0] == "specwatch_http_requests_rejected_total"}
        assert reasons == {"in_flight_limit", "connection_limit", "timeout", "tls_handshake",
                           "unauthorized", "rate_limited", "bad_request",
                           "auth_rate_limited", "client_connection_limit"}
        assert series[("specwatch_targets_dropped", frozenset())] == 0.0
    finally:
        app.stop()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_exporter_page_with_new_series_passes_promtool(tmp_path):
    """The page with the HTTP and limit series passes `promtool check metrics`."""
    cfg = app_settings.build_config(None, ["http://127.0.0.1:9/metrics"], "127.0.0.1:0", 60)
    app = ServeApp(cfg)
    app.start(poll=False)
    try:
        app.poller.poll_now("127.0.0.1:9")
        _, _, body = get(app.web)
    finally:
        app.stop()
    res = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True,
                         timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr


def test_stop_wakes_the_blocked_accept():
    """The accept thread blocks in accept() (an idle exporter does not wake it five times a
    second); stop() shuts the listening socket down, which wakes it at once
    (Linux: accept has no timeout; elsewhere 2 s, the fallback), and the port is freed."""
    srv = WebServer("127.0.0.1:0", {"/metrics": lambda r: Response(200, b"up 1\n")})
    srv.start()
    host, port = srv.address
    assert get(srv)[0] == 200
    thread = srv._thread
    # No accept timeout to poll the stop flag on Linux (stop() wakes it); elsewhere a
    # long one, the fallback.
    if sys.platform.startswith("linux"):
        assert srv._sock.gettimeout() is None
    else:
        assert srv._sock.gettimeout() >= 1.0
    time.sleep(0.3)  # the accept thread is blocked in accept() again
    t0 = time.monotonic()
    srv.stop()
    assert time.monotonic() - t0 < 1.5  # woken, not timed out
    assert thread is not None and not thread.is_alive()
    with pytest.raises(OSError):
        socket.create_connection((host, port), timeout=2).close()
