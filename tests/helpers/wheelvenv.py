"""A fresh virtualenv with the specwatch wheel installed, outside the repository: what a user
gets from `pip install specwatch-*.whl`. Shared by the slow tests that run the installed
commands (tests/test_wheel_install.py, tests/test_docs_commands.py).

The wheel is built as `make dist` builds it (without build isolation, so that it works
offline: setuptools and wheel come from the dev extra) and checked by twine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(cmd: list, cwd: Path, env: dict[str, str], timeout: float = 600
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def user_env() -> dict[str, str]:
    """The environment without this checkout's virtualenv, path or specwatch settings."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("SPECWATCH_")}


def wheel_venv(base: Path, extras: str = "[analysis]") -> tuple[Path, Path, dict[str, str]]:
    """(venv bin folder, an empty working folder, environment) after building the sdist and
    wheel into ``base``/dist and `pip install WHEEL{extras}` into ``base``/venv."""
    dist = base / "dist"
    built = run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, ROOT],
                cwd=base, env=dict(os.environ))
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    files = sorted(dist.iterdir())
    assert sorted(p.suffix for p in files) == [".gz", ".whl"], files
    checked = run([sys.executable, "-m", "twine", "check", "--strict", *files], cwd=base,
                  env=dict(os.environ))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    venv = base / "venv"
    made = run([sys.executable, "-m", "venv", venv], cwd=base, env=dict(os.environ))
    assert made.returncode == 0, made.stderr
    env = user_env()
    wheel = next(p for p in files if p.suffix == ".whl")
    pip = run([venv / "bin" / "python", "-m", "pip", "install", "-q", f"{wheel}{extras}"],
              cwd=base, env=env, timeout=900)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    empty = base / "empty"
    empty.mkdir()
    where = run([venv / "bin" / "python", "-c", "import specwatch; print(specwatch.__file__)"],
                cwd=empty, env=env)
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr
    return venv / "bin", empty, env
