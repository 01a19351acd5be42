"""The sdist and wheel as `make dist` builds them, and a fresh virtualenv with the wheel
installed, outside the repository: what a user gets from `pip install specwatch-*.whl`.

The build (without build isolation, so that it works offline: setuptools and wheel come from
the dev extra; checked by twine) and the virtualenv are made once per test run and shared
by every test and worker that needs them (tests/helpers/shared.py): the build writes into
the checkout (the sdist's egg-info), so two at once would race. Each user of the virtualenv
gets an empty working folder of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.shared import made_once

ROOT = Path(__file__).resolve().parents[2]


def run(cmd: list, cwd: Path, env: dict[str, str], timeout: float = 600
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def user_env() -> dict[str, str]:
    """The environment without this checkout's virtualenv, path or specwatch settings."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("SPECWATCH_")}


def _build(out: Path) -> None:
    built = run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT],
                cwd=out, env=dict(os.environ))
    (out / "build.log").write_text(built.stdout + built.stderr, encoding="utf-8")
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    files = dist_files(out)
    assert sorted(p.suffix for p in files) == [".gz", ".whl"], files
    checked = run([sys.executable, "-m", "twine", "check", "--strict", *files], cwd=out,
                  env=dict(os.environ))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def dist_files(folder: Path) -> list[Path]:
    """The sdist and the wheel in a folder :func:`built_dist` made."""
    return sorted(folder.glob("specwatch-*"))


def built_dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder holding this run's sdist and wheel (sdist first, then the wheel from the
    unpacked sdist, as `python -m build` does) and ``build.log``, the build's output."""
    return made_once(tmp_path_factory, "dist", _build)


def wheel_venv(tmp_path_factory: pytest.TempPathFactory, extras: str = "[analysis]"
               ) -> tuple[Path, Path, dict[str, str]]:
    """(venv bin folder, an empty working folder of the caller's own, environment) of this
    run's virtualenv holding `pip install WHEEL{extras}`."""
    env = user_env()

    def install(base: Path) -> None:
        (wheel,) = [p for p in dist_files(built_dist(tmp_path_factory)) if p.suffix == ".whl"]
        venv = base / "venv"
        made = run([sys.executable, "-m", "venv", venv], cwd=base, env=dict(os.environ))
        assert made.returncode == 0, made.stderr
        pip = run([venv / "bin" / "python", "-m", "pip", "install", "-q", f"{wheel}{extras}"],
                  cwd=base, env=env, timeout=900)
        assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]

    name = f"wheel-venv-{extras.strip('[]') or 'plain'}"
    venv = made_once(tmp_path_factory, name, install) / "venv"
    empty = tmp_path_factory.mktemp("empty")
    where = run([venv / "bin" / "python", "-c", "import specwatch; print(specwatch.__file__)"],
                cwd=empty, env=env)
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr
    return venv / "bin", empty, env
