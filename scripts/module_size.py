#!/usr/bin/env python3
"""Warn about Python modules over ~600 lines (`make lint` runs it; it never fails the build).

    scripts/module_size.py                 # the package, src/specwatch
    scripts/module_size.py DIR [DIR ...]   # other trees

A long module is a hint that it holds several things that want names of their own, not a
defect: the warning names each one and its length, and the exit status stays 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 600


def long_modules(roots: list[Path]) -> list[tuple[Path, int]]:
    """(module, line count) of every ``*.py`` under the roots longer than MAX_LINES."""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            lines = path.read_text(encoding="utf-8").count("\n")
            if lines > MAX_LINES:
                found.append((path, lines))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="*", type=Path, default=[REPO / "src" / "specwatch"])
    args = parser.parse_args(argv)
    for root in args.roots:
        if not root.is_dir():
            print(f"module_size: {root}: not a directory", file=sys.stderr)
            return 2
    for path, lines in long_modules(args.roots):
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        print(f"warning: {shown} has {lines} lines (over {MAX_LINES}): "
              "consider splitting it into modules that each do one thing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
