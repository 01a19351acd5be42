"""bcrypt costs: the web config accepts the hash format exporter-toolkit accepts (costs 4 to
31) but refuses costs above BCRYPT_MAX_COST with one line naming the user (exit 2 at start,
the old config kept on SIGHUP); loading never runs bcrypt; and the serve command answers
SIGTERM at once during any reload, a reload of a cost-31 file or one that never finishes."""

from __future__ import annotations

import base64
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import bcrypt
import pytest

from specwatch.web import webconfig

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "a" * 53  # a well-formed salt and digest: the format check needs nothing more


def _hash(cost: int) -> str:
    """A well-formed hash of ``cost`` (no bcrypt run: a cost-31 hash would take hours)."""
    return f"$2b${cost:02d}${DIGEST}"


def _basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@pytest.mark.parametrize("cost", [webconfig.BCRYPT_MAX_COST + 1, 20, 31])
def test_cost_above_the_cap_exits_2_with_one_line(tmp_path, cost):
    wc = tmp_path / "web.yml"
    wc.write_text(f"basic_auth_users:\n  ops: '{_hash(cost)}'\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "specwatch", "serve", "--target", "http://127.0.0.1:9/metrics",
         "--listen", "127.0.0.1:0", "--web-config", str(wc)],
        capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if "basic_auth_users.ops" in line]
    assert len(lines) == 1, proc.stderr
    assert str(wc) in lines[0]
    assert f"bcrypt cost {cost} is above {webconfig.BCRYPT_MAX_COST}" in lines[0]
    assert DIGEST not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("cost", [4, 10, webconfig.BCRYPT_MAX_COST])
def test_load_never_runs_bcrypt(tmp_path, monkeypatch, cost):
    """Costs up to the cap load, and loading computes no hash (the dummy hash that keeps an
    unknown user as slow as a wrong password is built without bcrypt)."""
    def refuse(*_a: object) -> None:
        raise AssertionError("bcrypt ran during a load")

    monkeypatch.setattr(bcrypt, "hashpw", refuse)
    monkeypatch.setattr(bcrypt, "checkpw", refuse)
    monkeypatch.setattr(bcrypt, "kdf", refuse)
    wc = tmp_path / "web.yml"
    wc.write_text(f"basic_auth_users:\n  ops: '{_hash(cost)}'\n  dev: '{_hash(4)}'\n")
    cfg = webconfig.load(str(wc))
    assert cfg.auth is not None and cfg.auth.users == {"ops", "dev"}
    assert cfg.auth.bcrypt_calls == 0


def test_dummy_hash_has_the_highest_cost_and_matches_nothing():
    real = bcrypt.hashpw(b"pw", bcrypt.gensalt(5))
    auth = webconfig.BasicAuth({"a": real, "b": _hash(4).encode()})
    dummy = auth._dummy
    assert dummy.startswith(b"$2b$05$") and len(dummy) == 60
    assert webconfig._BCRYPT_RE.match(dummy)
    # bcrypt accepts it (an unknown user costs a full check at cost 5), and nothing matches.
    assert bcrypt.checkpw(b"pw", dummy) is False
    assert auth.check("nobody", b"pw") is False and auth.bcrypt_calls == 1
    assert auth.check("a", b"pw") is True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(port: int, headers: dict[str, str]) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")
@pytest.mark.parametrize("reload", ["cost_31", "never_finishes"])
def test_sigterm_answered_during_a_reload(tmp_path, reload):
    """SIGHUP to a cost-31 web config (refused at once, the old users kept), or to a web
    config that cannot be read to its end (a FIFO no one writes: the reload hangs), then
    SIGTERM: the exporter exits 0 within a second or so."""
    good = bcrypt.hashpw(b"pw-one", bcrypt.gensalt(4)).decode()
    wc = tmp_path / "web.yml"
    wc.write_text(f"basic_auth_users:\n  ops: '{good}'\n")
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "specwatch", "serve", "--target", "http://127.0.0.1:9/metrics",
         "--listen", f"127.0.0.1:{port}", "--web-config", str(wc), "--poll-interval", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if _status(port, _basic("ops", "pw-one")) == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the exporter did not start"
            time.sleep(0.1)
        if reload == "cost_31":
            wc.write_text(f"basic_auth_users:\n  ops: '{_hash(31)}'\n")
        else:
            wc.unlink()
            os.mkfifo(wc)
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)  # the reload is under way (or done, for the refused file)
        if reload == "cost_31":
            assert _status(port, _basic("ops", "pw-one")) == 200  # the old users are kept
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    print(f"SIGTERM answered {took:.3f} s after it was sent, during a {reload} reload")
    assert proc.returncode == 0, out
    assert took < 5.0, out  # a second at most on an idle machine (docs/security.md)
    if reload == "cost_31":
        assert "web config reload failed, keeping the previous one" in out
        assert "bcrypt cost 31 is above" in out
