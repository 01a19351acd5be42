#!/usr/bin/env python3
"""Render the Jsonnet mixin into the committed files (`make generate`), or check that the
committed files are current (`make check-generated`, also run by the test suite).

    scripts/generate.py                       # write alerts/*.yaml and dashboards/*.json
    scripts/generate.py --check               # exit 1 and list files that are out of date
    scripts/generate.py --out-dir /tmp/m \\
        --overrides '{"alerts": {"SDAcceptanceRateLow": {"for": "1m"}}}'

`--overrides` takes a JSON object (or @FILE holding one) deep-merged into the mixin's
`_config`; see README, "Dashboards, rules and alerts (Jsonnet mixin)".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from specwatch.common.errors import SpecwatchError  # noqa: E402
from specwatch.mixin.render import stale_files, write_files  # noqa: E402


def _overrides(text: str | None) -> dict:
    """Parse --overrides: inline JSON, or @path to a JSON file."""
    if not text:
        return {}
    source = "--overrides"
    if text.startswith("@"):
        source = text[1:]
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as exc:
            raise SpecwatchError(f"--overrides: cannot read {source}: {exc.strerror}") from exc
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecwatchError(
            f"{source}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from exc
    if not isinstance(value, dict):
        raise SpecwatchError(f"{source}: expected a JSON object, got {type(value).__name__}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=REPO,
                        help="where to write (default: the repository root)")
    parser.add_argument("--overrides", metavar="JSON|@FILE",
                        help="JSON object deep-merged into the mixin's _config")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when files under --out-dir are out of date")
    args = parser.parse_args(argv)
    try:
        overrides = _overrides(args.overrides)
        if args.check:
            problems = stale_files(args.out_dir, overrides)
            if problems:
                print("generated files are out of date (run `make generate`):", file=sys.stderr)
                for line in problems:
                    print(f"  {line}", file=sys.stderr)
                return 1
            print("generated files are up to date")
            return 0
        for rel in write_files(args.out_dir, overrides):
            print(f"wrote {args.out_dir / rel}")
        return 0
    except SpecwatchError as exc:
        print(f"generate: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
