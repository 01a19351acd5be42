"""The commands the README tells a newcomer to type, read from README.md itself, so that the
tests run exactly what the page says (a test that kept its own copy would pass while the page
went stale)."""

from __future__ import annotations

import shlex
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_command(prefix: str) -> list[str]:
    """The one README line starting (after indentation) with ``prefix``, as argv: shell
    quoting undone and a trailing ``# comment`` dropped."""
    found = [line.strip() for line in README.read_text(encoding="utf-8").splitlines()
             if line.strip().startswith(prefix)]
    assert len(found) == 1, f"README.md: expected one line starting {prefix!r}, got {found}"
    return shlex.split(found[0], comments=True)


def with_out(argv: list[str], out: Path) -> list[str]:
    """``argv`` with its ``--out`` value replaced by ``out``."""
    i = argv.index("--out")
    return [*argv[: i + 1], str(out), *argv[i + 2 :]]
