"""The wheel, installed into a fresh virtualenv outside the repository, is the whole bundle:
`serve` against a recorded vLLM page, `demo` with Prometheus loading the
packaged rules (and the low-acceptance alert going pending on the simulated drop),
`mixin render` with the user's selector (promtool accepts the rules), `calibrate` on the
shipped benchmark data.

Slow (builds an sdist and a wheel, installs the dependencies into a new virtualenv): run by
`make test-all`. The default suite's tests/common/test_bundle.py checks the same wheel's contents
from an unpacked copy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from helpers.pageserver import Page, PageSequenceServer, fixture_pages
from helpers.wheelvenv import wheel_venv
from mixin_helpers import promtool

from specwatch.engines import registry

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "tests" / "fixtures" / "vllm-0.32-cpu-ngram"


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """(venv bin folder, an empty working folder, environment) after `pip install wheel`."""
    return wheel_venv(tmp_path_factory)


def test_serve_from_the_wheel_derives_sd_series_from_a_recorded_page(installed) -> None:
    bindir, cwd, env = installed
    pages = [Page(text) for _, text in fixture_pages(PAGES)]
    port = _free_port()
    with PageSequenceServer(pages, advance="per_request") as server:
        proc = subprocess.Popen(
            [bindir / "specwatch", "serve", "--target", f"cpu={server.url}/metrics",
             "--listen", f"127.0.0.1:{port}", "--poll-interval", "0.5", "--log-level", "error"],
            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 60
            text = ""
            while 'sd_acceptance_rate{' not in text:
                assert proc.poll() is None, proc.communicate()[0]
                assert time.monotonic() < deadline, text[-2000:]
                time.sleep(0.5)
                try:
                    text = _get(f"http://127.0.0.1:{port}/metrics")
                except OSError:
                    continue
            assert re.search(r'specwatch_target_up\{target="cpu"\} 1\.0', text)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="prometheus not installed (make setup installs it)")
def test_demo_from_the_wheel_loads_the_packaged_rules_and_the_alert_works(installed) -> None:
    """`specwatch demo --duration` in an empty folder: Prometheus lists the alerting and
    recording rules rendered from the packaged mixin, and SDAcceptanceRateLow goes pending
    in the simulated drop."""
    bindir, cwd, env = installed
    port = _free_port()
    proc = subprocess.Popen(
        [bindir / "specwatch", "demo", "--duration", "120", "--scenario", "acceptance-drop",
         "--speed", "30", "--poll-interval", "1", "--exporter-listen", "127.0.0.1:0",
         "--prometheus-port", str(port)],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    prom = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        rules: dict = {}
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, f"no rules at {prom}"
            try:
                rules = json.loads(_get(f"{prom}/api/v1/rules"))
                break
            except OSError:
                time.sleep(0.5)
        listed = {r["name"]: r for g in rules["data"]["groups"] for r in g["rules"]}
        files = {g["file"] for g in rules["data"]["groups"]}
        assert "SDAcceptanceRateLow" in listed
        assert any(r["type"] == "recording" for r in listed.values())
        assert "model_name:vllm_spec_decode_acceptance_rate:ratio_rate5m" in listed
        # At --speed 30 the demo renders the packaged mixin with every alert's `for` divided
        # by 30 into its working folder (Prometheus waits on the wall clock).
        assert files and all(f.endswith("/rules.yaml") and "specwatch-demo-" in f
                             for f in files), files
        query = urllib.parse.quote('ALERTS{alertname="SDAcceptanceRateLow"}')
        deadline = time.monotonic() + 100
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            result = json.loads(_get(f"{prom}/api/v1/query?query={query}"))["data"]["result"]
            if result:
                break
            assert time.monotonic() < deadline, "SDAcceptanceRateLow never went pending"
            time.sleep(1)
        assert result[0]["metric"]["alertstate"] in ("pending", "firing")
        health = json.loads(_get(f"{prom}/api/v1/rules"))["data"]["groups"]
        assert all(r["health"] == "ok" for g in health for r in g["rules"]), health
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out


def test_mixin_render_from_the_wheel_uses_the_users_selector(installed) -> None:
    bindir, cwd, env = installed
    # Each engine family's selector (vLLM's and the others' recording rules) and the
    # exporter's.
    others = [a for f in registry.families() if f != "vllm"
              for a in ("--set", f'{f}Selector=job="llm-{f}"')]
    result = _run([bindir / "specwatch", "mixin", "render", "--out", "out",
                   "--set", 'vllmSelector=job="llm"',
                   "--set", 'exporterSelector=job="llm-specwatch"', *others], cwd=cwd, env=env)
    assert result.returncode == 0, result.stderr
    rules = sorted((cwd / "out" / "alerts").glob("*.yaml"))
    assert len(rules) == 2
    check = _run([promtool(), "check", "rules", *rules], cwd=cwd, env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    for path in rules:
        doc = yaml.safe_load(path.read_text())
        exprs = [r["expr"] for g in doc["groups"] for r in g["rules"] if "{" in r["expr"]]
        assert exprs and all(re.search(r'job="llm(-[a-z]+)?"', e) for e in exprs), path
    # The rule tests rendered for the same values pass against them.
    tested = _run([bindir / "specwatch", "mixin", "test", "out"], cwd=cwd, env=env)
    assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr
    # The Operator path: PrometheusRules and dashboard ConfigMaps, schema-checked with the
    # schemas the wheel carries.
    k8s = _run([bindir / "specwatch", "mixin", "render", "--format", "kubernetes", "--out", "k8s",
                "--set", 'vllmSelector=job="llm"',
                "--set", "grafanaURL=https://grafana.example.com"], cwd=cwd, env=env)
    assert k8s.returncode == 0, k8s.stderr
    text = (cwd / "k8s" / "prometheusrule-specwatch-alerts.yaml").read_text()
    assert "kind: PrometheusRule" in text and "https://grafana.example.com/d/" in text
    assert (cwd / "k8s" / "kustomization.yaml").is_file()


def test_calibrate_from_the_wheel_refits_the_shipped_example(installed) -> None:
    """The shipped benchmark sweep refits to the shipped parameters file (same coefficients)."""
    bindir, cwd, env = installed
    where = _run([bindir / "python", "-m", "specwatch.common.bundle"], cwd=cwd, env=env)
    bundle = Path(where.stdout.strip())
    (data,) = (bundle / "examples" / "calibration").glob("*.csv")
    shipped_doc = yaml.safe_load(
        (bundle / "examples" / "params" / "qwen3-32b-h100-qwen3-4b.yaml").read_text())
    # The same command as `make calibrate-examples` (the whole load range, the KV caches the
    # servers stated, which the shipped file records).
    kv = shipped_doc["capacity"]
    result = _run([bindir / "specwatch", "calibrate", data, "--system", "Qwen3-32B+Qwen3-4B",
                   "--kv-cache-tokens", f"{kv['kv_cache_tokens']:g}",
                   "--kv-cache-tokens-sd", f"{kv['kv_cache_tokens_sd']:g}",
                   "--out", "fitted.yaml"], cwd=cwd, env=env)
    assert result.returncode == 0, result.stderr
    fitted_doc = yaml.safe_load((cwd / "fitted.yaml").read_text())
    for section in ("coefficients", "capacity"):
        fitted, shipped = fitted_doc.get(section) or {}, shipped_doc.get(section) or {}
        assert fitted.keys() == shipped.keys(), section
        for name, value in shipped.items():
            assert fitted[name] == pytest.approx(value, rel=1e-9), (section, name)
