"""`specwatch demo` starts the simulator, the exporter and (when installed) Prometheus,
serves, and stops all of them on Ctrl-C, leaving no process and no temporary files."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        return resp.read().decode()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def assert_prometheus_links_work(banner: str, prom: str) -> None:
    """Every Prometheus page the banner points to answers 200 on the installed Prometheus
    (Debian's 2.42 serves only its classic UI: /alerts is a 404 there), and a graph link
    still carries its expression after any redirect (2.42's /graph drops it)."""
    links = re.findall(re.escape(prom) + r"/\S*", banner)
    assert any("alerts" in link for link in links), banner
    for link in links:
        with urllib.request.urlopen(link, timeout=5) as resp:
            assert resp.status == 200, link
            if "g0.expr=" in link:
                assert "g0.expr=" in resp.geturl(), (link, resp.geturl())


@pytest.mark.parametrize("prometheus", ["auto", "off"])
def test_demo_starts_serves_and_stops_cleanly_on_ctrl_c(prometheus: str) -> None:
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) stops the demo
    with exit 0; no process of the group survives and the working folder is gone."""
    if prometheus == "auto" and shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed (make setup installs it)")
    proc = subprocess.Popen(
        [sys.executable, "-m", "specwatch", "demo", "--speed", "20", "--poll-interval", "1",
         "--exporter-listen", "127.0.0.1:0", "--prometheus", prometheus],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    banner = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            banner.append(line)
            if line.startswith("Working files"):
                break
        text = "".join(banner)
        assert "Ctrl-C stops everything" in text, text
        sim = re.search(r"simulated vLLM\s+(\S+)", text).group(1)
        exporter = re.search(r"exporter\s+(\S+)", text).group(1)
        workdir = Path(text.rsplit("Working files (removed on exit): ", 1)[1].strip())
        assert workdir.is_dir()
        assert "vllm:spec_decode_num_drafts_total" in get(sim)
        deadline = time.monotonic() + 20
        while "sd_acceptance_rate{" not in get(exporter):
            assert time.monotonic() < deadline, "exporter never derived an acceptance rate"
            time.sleep(0.5)
        if prometheus == "auto":
            prom = re.search(r"Prometheus\s+(\S+)", text).group(1)
            assert get(prom + "-/ready")
            assert_prometheus_links_work(text, prom.rstrip("/"))
        else:
            assert "Prometheus: off" in text
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert "stopped" in out
        deadline = time.monotonic() + 5
        while group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not group_alive(proc.pid), "a demo process outlived Ctrl-C"
        assert not workdir.exists()
    finally:
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_demo_reports_a_busy_exporter_port_without_traceback() -> None:
    """Another process on the exporter port: one clear message, exit 2, nothing left."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = subprocess.run(
            [sys.executable, "-m", "specwatch", "demo", "--prometheus", "off",
             "--exporter-listen", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "cannot bind" in res.stderr and "Traceback" not in res.stderr
