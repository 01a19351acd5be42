"""Every `specwatch ...` command and serve config file in README.md and docs/*.md runs as the
page says, from the installed wheel (a fresh virtualenv, tests/helpers/wheelvenv.py).

Each page's commands run in page order, in one folder per page that holds what a clone
holds for them (examples/, tests/fixtures/sd-validation and vllm-bench), through bash (so
globs, quoting and trailing comments are the shell's). A command ends with exit status 0
unless the page marks another; what the page marks as not runnable here (and a synopsis) is
listed with its reason and not run (tests/helpers/doccommands.py says how pages mark it).

Commands that do not end by themselves run shortened, as stated here:

- `specwatch serve` gets `--listen 127.0.0.1:<free port>` appended (flags win over the
  config), and every `http(s)://HOST:8000` URL in it, or in the config it names, is the
  replayed real vLLM 0.32 page (tests/fixtures/vllm-0.32-cpu-ngram) instead; it must serve
  /metrics within 10 s with that target up, then stop on SIGTERM with exit 0;
- `specwatch simulate` gets `--listen 127.0.0.1:<free port>`: it must serve /metrics within
  10 s, then stop on SIGTERM with exit 0;
- `specwatch demo` gets `--duration 20` and free ports for its parts, and must exit 0;
- a config file is `specwatch serve --config FILE` with the rules for serve above; a config
  that names a file the page does not give is written with that file empty;
- a `# prometheus.yml` or `# alertmanager.yml` block is checked by `promtool check config` or
  `amtool check-config`, in the page's folder after the page's commands before it.

The test prints what it ran: where, the command, exit status and seconds. A second test
follows docs/quickstart.md to its end: the SD alert in a real Prometheus and Alertmanager.
Slow (builds and installs the wheel): `make test-docs`, `make test-all`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from helpers.doccommands import ROOT, DocItem, all_items
from helpers.pageserver import Page, PageSequenceServer, fixture_pages
from helpers.wheelvenv import wheel_venv

pytestmark = pytest.mark.slow

PAGES = ROOT / "tests" / "fixtures" / "vllm-0.32-cpu-ngram"
TARGET_URL = re.compile(r"https?://[A-Za-z0-9.-]+:8000")
SERVE_WAIT_S = 10.0
DEMO_DURATION_S = 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=3) as resp:
        return resp.read().decode()


def _clone_files(folder: Path) -> None:
    """What a clone holds for the documented commands: the examples and the public data."""
    shutil.copytree(ROOT / "examples", folder / "examples")
    for name in ("sd-validation", "vllm-bench"):
        shutil.copytree(ROOT / "tests" / "fixtures" / name, folder / "tests" / "fixtures" / name)


def _without_comment(command: str) -> str:
    """One line, without continuations and without the trailing comment (flags appended
    after a `#` would be part of it)."""
    return " ".join(part.split(" #", 1)[0].rstrip().removesuffix("\\").strip()
                    for part in command.split("\n"))


def _long_running(command: str) -> str | None:
    m = re.match(r"specwatch (serve|simulate|demo)\b", command)
    return m.group(1) if m else None


def _serve_until_up(cmd: str, cwd: Path, env: dict[str, str], port: int, needs_up: bool
                    ) -> tuple[int, str]:
    proc = subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    body = ""
    try:
        deadline = time.monotonic() + SERVE_WAIT_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                body = _get(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                time.sleep(0.2)
                continue
            if not needs_up or re.search(r"specwatch_target_up\{[^}]*\} 1\.0", body):
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert body, f"no /metrics on port {port} within {SERVE_WAIT_S:g} s:\n{out[-3000:]}"
    if needs_up:
        assert re.search(r"specwatch_target_up\{[^}]*\} 1\.0", body), \
            f"the replayed vLLM target is not up:\n{out[-3000:]}"
    return proc.returncode, out


def _config_with_page(text: str, url: str, folder: Path) -> str:
    """The config with its vLLM URLs on the replayed page; files it names that the page does
    not give are created empty (a token file, a params name is a shipped example)."""
    text = TARGET_URL.sub(url, text)
    for key, value in re.findall(r"(token_file|password_file|ca_file|cert_file|key_file):"
                                 r"\s*(\S+)", text):
        del key
        path = Path(value) if os.path.isabs(value) else folder / value
        if not path.exists():
            text = text.replace(value, str(folder / Path(value).name))
            (folder / Path(value).name).write_text("placeholder-secret\n")
    return text


def _run_item(item: DocItem, cwd: Path, env: dict[str, str], url: str) -> tuple[int, str]:
    if item.kind in ("prometheus", "alertmanager"):
        path = cwd / f"{item.kind}-{item.line}.yml"
        path.write_text(item.text)
        check = (["promtool", "check", "config", path] if item.kind == "prometheus"
                 else ["amtool", "check-config", path])
        done = subprocess.run([str(c) for c in check], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=120)
        return done.returncode, done.stdout[-2000:] + done.stderr[-2000:]
    if item.kind == "config":
        path = cwd / f"config-{item.line}.yaml"
        path.write_text(_config_with_page(item.text, url, cwd))
        port = _free_port()
        return _serve_until_up(f"specwatch serve --config {path} --listen 127.0.0.1:{port}",
                               cwd, env, port, needs_up=TARGET_URL.search(item.text) is not None)
    command = item.text
    kind = _long_running(command)
    if kind == "serve":
        cfg = re.search(r"--config\s+(\S+)", command)
        needs_up = bool(TARGET_URL.search(command))
        if cfg and (cwd / cfg.group(1)).is_file():
            text = (cwd / cfg.group(1)).read_text()
            needs_up = needs_up or bool(re.search(r"^\s+url:\s*https?://[\w.-]+:8000", text,
                                                  re.M))
            copy = cwd / cfg.group(1)
            copy.write_text(_config_with_page(text, url, copy.parent))
        port = _free_port()
        cmd = TARGET_URL.sub(url, _without_comment(command))
        return _serve_until_up(f"{cmd} --listen 127.0.0.1:{port}", cwd, env, port, needs_up)
    if kind == "simulate":
        port = _free_port()
        return _serve_until_up(f"{_without_comment(command)} --listen 127.0.0.1:{port}", cwd,
                               env, port, False)
    if kind == "demo":
        command = (f"{_without_comment(command)} --duration {DEMO_DURATION_S} "
                   f"--simulator-listen 127.0.0.1:0 --exporter-listen 127.0.0.1:0 "
                   f"--prometheus-port {_free_port()}")
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    return done.returncode, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    bindir, _, env = wheel_venv(tmp_path_factory)
    env = {**env, "PATH": f"{bindir}{os.pathsep}{env.get('PATH', '')}", "VLLM_B_PASSWORD": "x"}
    return bindir, env


def test_every_documented_command_runs_as_the_page_says(wheel, tmp_path: Path) -> None:
    _, env = wheel
    items = all_items()
    assert len([i for i in items if i.skip is None]) >= 15, "the extractor found too little"
    report: list[str] = []
    failures: list[str] = []
    pages = [Page(text) for _, text in fixture_pages(PAGES)]
    folders: dict[Path, Path] = {}
    with PageSequenceServer(pages, advance="per_request") as server:
        for item in items:
            shown = item.text.replace("\\\n", " ").replace("\n", " ⏎ ")[:110]
            if item.skip is not None:
                report.append(f"{item.where:28} not run: {item.skip}\n    {shown}")
                continue
            cwd = folders.get(item.page)
            if cwd is None:
                cwd = folders[item.page] = tmp_path / item.page.stem
                cwd.mkdir()
                _clone_files(cwd)
            started = time.monotonic()
            try:
                rc, out = _run_item(item, cwd, env, server.url)
            except AssertionError as exc:
                rc, out = -1, str(exc)
            took = time.monotonic() - started
            report.append(f"{item.where:28} exit {rc:3d} {took:6.1f} s  {shown}")
            if rc != item.exit_code:
                failures.append(f"{item.where}: exit {rc}, the page expects "
                                f"{item.exit_code}: {shown}\n{out[-1500:]}")
    print("\n" + "\n".join(report))
    assert not failures, "\n\n".join(failures)


@pytest.mark.skipif(shutil.which("prometheus") is None
                    or shutil.which("prometheus-alertmanager") is None,
                    reason="prometheus/alertmanager not installed (make setup installs them)")
def test_the_quickstart_ends_with_an_sd_alert_in_prometheus_and_alertmanager(
        wheel, tmp_path: Path) -> None:
    """docs/quickstart.md followed from the installed wheel: its simulated vLLM, its exporter
    command, its rules render and its prometheus.yml and alertmanager.yml, on free ports
    instead of the page's, with a real Prometheus and Alertmanager. Shortened as stated: the
    simulator runs at `--speed 5` (the acceptance drops after 60 s instead of 5 minutes and
    stays low for 3 minutes instead of 15; the alert reads the exporter's 1m α over wall-clock
    polls, which needs about a minute of the drop to fall below 0.4 and one more for `for`)."""
    _, env = wheel
    page = {it.kind + str(i): it for i, it in enumerate(
        it for it in all_items() if it.page.name == "quickstart.md" and it.skip is None)}
    commands = [it.text for it in page.values() if it.kind == "command"]
    simulate = next(c for c in commands if c.startswith("specwatch simulate"))
    serve = next(c for c in commands if c.startswith("specwatch serve"))
    render = [c for c in commands if c.startswith("specwatch mixin render")][-1]
    prom_cfg = next(it.text for it in page.values() if it.kind == "prometheus")
    am_cfg = next(it.text for it in page.values() if it.kind == "alertmanager")
    sim_port, exp_port, am_port, prom_port = (_free_port() for _ in range(4))
    ports = {"127.0.0.1:8000": f"127.0.0.1:{sim_port}",
             "127.0.0.1:10440": f"127.0.0.1:{exp_port}", "127.0.0.1:9093": f"127.0.0.1:{am_port}"}

    def ported(text: str) -> str:
        for old, new in ports.items():
            text = text.replace(old, new)
        return text

    assert subprocess.run(["bash", "-c", render], cwd=tmp_path, env=env,
                          capture_output=True, timeout=300).returncode == 0
    (tmp_path / "prometheus.yml").write_text(ported(prom_cfg))
    (tmp_path / "alertmanager.yml").write_text(ported(am_cfg))
    procs = [subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                              start_new_session=True) for cmd in (
        f"{ported(_without_comment(simulate))} --speed 5",
        f"{ported(_without_comment(serve))} --listen 127.0.0.1:{exp_port}",
        f"prometheus-alertmanager --config.file=alertmanager.yml --cluster.listen-address= "
        f"--web.listen-address=127.0.0.1:{am_port} --storage.path=am",
        f"prometheus --config.file=prometheus.yml --web.listen-address=127.0.0.1:{prom_port} "
        f"--storage.tsdb.path=data")]
    started = time.monotonic()
    seen: list[str] = []
    try:
        while time.monotonic() - started < 420:
            try:
                alerts = json.loads(_get(f"http://127.0.0.1:{am_port}/api/v2/alerts"))
            except OSError:
                alerts = []
            seen = [a["labels"].get("alertname", "") for a in alerts]
            if "SDAcceptanceRateLow" in seen:
                break
            time.sleep(5)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=30)
    took = time.monotonic() - started
    print(f"quickstart: Alertmanager holds {sorted(set(seen))} after {took:.0f} s")
    assert "SDAcceptanceRateLow" in seen, f"no SD alert in Alertmanager after {took:.0f} s"
