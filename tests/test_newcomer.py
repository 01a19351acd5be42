"""A newcomer's path, scripted: build the wheel, install it into a fresh virtualenv (no extras,
no checkout on the path), and from an empty folder run what the README says: render the
mixin with the README's own command, run the bundled rule tests on the result, and start the
demo with its Prometheus, where the acceptance alert must fire within 5 minutes of wall time.

Slow (builds and installs a wheel, runs the demo for minutes): `make test-all`.
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
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from helpers.readme import readme_command
from helpers.wheelvenv import wheel_venv

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                       reason="prometheus/promtool not installed (make setup installs them)"),
]

ROOT = Path(__file__).resolve().parents[1]
# The demo's default: its story in simulated time, 20 times faster than real time.
ALERT_WITHIN_S = 300.0


def _run(cmd: list, cwd: Path, env: dict[str, str], timeout: float = 900
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """(virtualenv bin folder, an empty working folder, environment) after a plain
    `pip install specwatch-*.whl`."""
    return wheel_venv(tmp_path_factory, extras="")


def test_readme_mixin_command_and_its_rule_tests_from_the_wheel(newcomer) -> None:
    bindir, cwd, env = newcomer
    render = readme_command("specwatch mixin render")
    result = _run([bindir / render[0], *render[1:]], cwd=cwd, env=env)
    assert result.returncode == 0, result.stderr
    test = readme_command("specwatch mixin test")
    result = _run([bindir / test[0], *test[1:]], cwd=cwd, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "passed" in result.stdout.splitlines()[-1]


def _documented_demo_command(port: int, duration: float) -> list[str]:
    """The getting-started page's `specwatch demo`, with options of the demo's documented
    reference (docs/cli.md) for the ports and the duration: each is checked to be there."""
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert re.search(r"^\s+specwatch demo\b", page, re.M), "getting-started lost `specwatch demo`"
    options = ["--exporter-listen", "127.0.0.1:0", "--prometheus-port", str(port),
               "--duration", str(duration)]
    reference = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    demo = reference[reference.index("## `specwatch demo`"):]
    demo = demo[:demo.index("\n## ", 1)]
    for flag in options[::2]:
        assert f"| `{flag}` |" in demo, f"{flag} is not in docs/cli.md's demo reference"
    return ["specwatch", "demo", *options]


def test_demo_from_the_wheel_fires_the_acceptance_alert_within_5_minutes(newcomer) -> None:
    """Only documented commands: the demo as docs/getting-started.md gives it, started from
    an empty folder, with Prometheus (Debian's, on the PATH) loading the packaged rules."""
    bindir, cwd, env = newcomer
    port = _free_port()
    started = time.monotonic()
    argv = _documented_demo_command(port, ALERT_WITHIN_S + 60)
    proc = subprocess.Popen(
        [str(bindir / argv[0]), *argv[1:]],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    query = urllib.parse.quote(
        'ALERTS{alertname="SDAcceptanceRateLow", alertstate="firing"}')
    fired_after = None
    try:
        while time.monotonic() - started < ALERT_WITHIN_S:
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/api/v1/query?query={query}",
                        timeout=5) as resp:
                    result = json.loads(resp.read())["data"]["result"]
            except OSError:
                result = []
            if result:
                fired_after = time.monotonic() - started
                break
            time.sleep(2)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert fired_after is not None, (
        f"SDAcceptanceRateLow did not fire within {ALERT_WITHIN_S:g} s:\n{out[-3000:]}")
    print(f"SDAcceptanceRateLow fired {fired_after:.0f} s after `specwatch demo` started")
    assert result[0]["metric"]["target"] == "vllm-sim"
    assert proc.returncode == 0, out[-3000:]
