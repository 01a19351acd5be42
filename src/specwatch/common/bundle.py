"""Where the bundle's non-Python files are: the Jsonnet mixin sources, the generated rules and
dashboards, the example parameter files and the calibration data behind them.

Why one resolver: those files live at the top of the repository (``config.libsonnet``,
``alerts/``, ``dashboards/``, ``examples/params/``), where ``make generate`` writes them and
reviewers read them. A wheel cannot reach the repository, so the build copies them into the
package (``specwatch/bundle/``, see setup.py, the one list of what ships). Code that needs
them asks :func:`bundle_dir` and gets the packaged copy in an installed wheel, or the checkout's
top level when running from the repository (tests, ``pip install -e``), with the same relative
paths in both. ``SPECWATCH_BUNDLE_DIR`` points elsewhere (a forked mixin, say).

``python -m specwatch.common.bundle`` prints the directory, so that a user of the wheel can
find the example files: ``ls "$(python -m specwatch.common.bundle)/examples/params"``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from specwatch.common.errors import ConfigError

ENV = "SPECWATCH_BUNDLE_DIR"
# The file that marks a bundle directory: the mixin's entry point is always shipped.
MARKER = "mixin.libsonnet"
# Relative paths inside the bundle (the same in the repository).
ALERTS_DIR = "alerts"
DASHBOARDS_DIR = "dashboards"
PARAMS_DIR = "examples/params"
CALIBRATION_DIR = "examples/calibration"

_PACKAGED = Path(__file__).resolve().parents[1] / "bundle"
_CHECKOUT = Path(__file__).resolve().parents[3]


def candidates() -> list[Path]:
    """Directories searched, in order: $SPECWATCH_BUNDLE_DIR, the packaged copy, the checkout."""
    env = os.environ.get(ENV)
    if env:
        return [Path(env)]
    return [_PACKAGED, _CHECKOUT]


def bundle_dir() -> Path:
    """The first candidate holding ``mixin.libsonnet``; a ConfigError naming them otherwise."""
    tried = candidates()
    for root in tried:
        if (root / MARKER).is_file():
            return root
    names = ", ".join(str(p) for p in tried)
    raise ConfigError(
        f"specwatch bundle not found: no {MARKER} in {names}. Install the specwatch wheel "
        f"(it carries the bundle), run from a specwatch checkout, or set {ENV} to one"
    )


def example_params() -> dict[str, Path]:
    """Shipped example parameter files by name (file name without ``.yaml``)."""
    try:
        folder = bundle_dir() / PARAMS_DIR
    except ConfigError:
        return {}
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def resolve_params(value: str) -> Path:
    """A parameters file argument: an existing path, else the name of a shipped example."""
    path = Path(value)
    if path.exists() or os.sep in value or value.endswith((".yaml", ".yml")):
        return path
    examples = example_params()
    if value in examples:
        return examples[value]
    return path  # the loader reports "cannot read" with the name the user gave


def missing_params_hint(value: str, spelling: str) -> str:
    """What to append to "parameters file not found" for ``value``: the shipped example of
    the same file name, or the shipped names, each as ``spelling`` + name (``--params `` on
    the command line, ``params: `` in a config), since a clone's path such as
    ``examples/params/NAME.yaml`` does not exist outside the clone but the name does."""
    examples = example_params()
    if not examples:
        return ""
    name = Path(value).name
    for suffix in (".yaml", ".yml"):
        name = name.removesuffix(suffix)
    if name in examples:
        return f"; the shipped example of that name works from any folder: {spelling}{name}"
    return ("; a shipped example can be named instead of a path: "
            + ", ".join(f"{spelling}{n}" for n in examples))


if __name__ == "__main__":  # pragma: no cover - exercised by the wheel test
    try:
        print(bundle_dir())
    except ConfigError as exc:
        print(f"specwatch: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
