"""The shipped example config runs as written, and a down target's landing-page line says why.

`specwatch serve --config examples/specwatch.yaml` from the repository root is the command
docs/exporter.md gives: it must serve /metrics within 10 s although none of the example's
hosts exists (each target is then down, with its reason on the landing page).
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from specwatch.app import settings as app_settings
from specwatch.app.serve import ServeApp
from specwatch.common.errors import ConfigError
from specwatch.plugins.live import plugin as live_plugin

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "specwatch.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_example_config_serves_metrics_within_10_s_from_the_repository_root() -> None:
    port = _free_port()
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "specwatch", "serve", "--config", "examples/specwatch.yaml",
         "--listen", f"127.0.0.1:{port}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        body = ""
        while time.monotonic() - started < 10:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=2) as resp:
                    body = resp.read().decode()
                break
            except OSError:
                time.sleep(0.2)
        assert body, f"no /metrics within 10 s:\n{proc.stdout}"
        assert re.search(r'specwatch_target_up\{target="vllm-a"\} 0\.0', body), body[:2000]
        assert 'sd_model_configured{target="vllm-a"' in body or "vllm-a" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out


def test_every_example_file_names_the_docs_page_that_explains_it() -> None:
    files = [EXAMPLE, *sorted((ROOT / "examples" / "controller").iterdir()),
             *sorted((ROOT / "examples" / "params").glob("*.yaml"))]
    for path in files:
        head = "\n".join(path.read_text(encoding="utf-8").splitlines()[:8])
        pages = re.findall(r"docs/[a-z-]+\.md", head)
        assert pages, f"{path.relative_to(ROOT)}: no docs/*.md page named in its first lines"
        for page in pages:
            assert (ROOT / page).is_file(), f"{path.relative_to(ROOT)} names missing {page}"


def test_a_missing_params_file_in_a_config_names_the_config_file(tmp_path: Path) -> None:
    cfg_file = tmp_path / "specwatch.yaml"
    cfg_file.write_text("targets:\n  - name: a\n    url: http://127.0.0.1:1/metrics\n"
                        "    params: examples/params/qwen3-32b-h100-eagle3.yaml\n")
    cfg = app_settings.build_config(str(cfg_file), [], "127.0.0.1:0", 5)
    with pytest.raises(ConfigError) as err:
        live_plugin.from_config(cfg)
    message = str(err.value)
    assert message.startswith(f"{cfg_file}: targets[0].params: "), message
    assert "parameters file not found" in message
    # The file's name is a shipped example: the error says which name to give instead.
    assert "params: qwen3-32b-h100-eagle3" in message, message


def test_predict_with_a_clone_path_outside_a_clone_points_to_the_shipped_name(
        tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "specwatch", "predict", "--params",
         "examples/params/qwen3-32b-h100-eagle3.yaml", "--arrival-rate", "1",
         "--prompt-tokens", "500", "--generation-tokens", "200", "--alpha", "0.7",
         "--draft-length", "3"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "parameters file not found" in line
    assert "--params qwen3-32b-h100-eagle3" in line, line


def test_landing_page_says_why_a_target_is_down(tmp_path: Path) -> None:
    port = _free_port()  # nothing listens there: the poll is refused
    cfg_file = tmp_path / "specwatch.yaml"
    cfg_file.write_text("global: {listen: '127.0.0.1:0', timeout: 2}\ntargets:\n"
                        f"  - name: t\n    url: http://127.0.0.1:{port}/metrics\n")
    app = ServeApp(app_settings.build_config(str(cfg_file), [], None, 60))
    app.start(poll=False)
    try:
        app.poller.poll_now("t")
        host, web_port = app.web.address
        landing = urllib.request.urlopen(f"http://{host}:{web_port}/", timeout=5).read().decode()
    finally:
        app.stop()
    (line,) = re.findall(r"<li>t: [^<]*</li>", landing)
    assert "down" in line and "connection" in line and "unknown" not in line, line


def test_a_missing_scenario_file_names_the_packaged_scenarios(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "specwatch", "simulate", "--scenario", "my-scenario.yaml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "scenario file not found" in line and "acceptance-drop" in line, line
