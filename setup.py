"""Build step that makes the wheel the whole bundle; the metadata is in pyproject.toml.

The mixin's Jsonnet sources, its generated rules and dashboards, the example parameter files
and the calibration data behind them live at the top of the repository, where `make generate`
writes them and reviewers read them. A wheel only carries what is inside the package, so
`build_py` copies them into ``specwatch/bundle/`` (same relative paths; the runtime finds them
with `specwatch.common.bundle`). The files are copied, never moved or regenerated: the
committed outputs of `make generate` stay the single source, and the sdist carries the same
files (MANIFEST.in) so that a wheel built from it is the same.

A pattern that matches nothing stops the build: a wheel silently missing its rules is the bug
this step exists to prevent. Editable installs copy nothing (the runtime reads the checkout).

The long description is README.md with its relative links made absolute (`long_description`):
the package index shows the README away from the repository, where ``docs/model.md`` or the
picture ``docs/img/...png`` would lead nowhere.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
REPOSITORY = "https://github.com/specwatch/specwatch"
# Pages and folders are shown by the repository's web view, pictures served raw.
PAGE_BASE = f"{REPOSITORY}/blob/main/"
FOLDER_BASE = f"{REPOSITORY}/tree/main/"
RAW_BASE = "https://raw.githubusercontent.com/specwatch/specwatch/main/"
# A Markdown link or image target: `](target)` or `](target "title")`.
_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)((?:\s+\"[^\"]*\")?)\)")


def long_description(text: str) -> str:
    """README text with every relative link and image made absolute."""

    def absolute(m: re.Match[str]) -> str:
        bang, label, target, title = m.groups()
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return m.group(0)
        path = target.removeprefix("./")
        base = RAW_BASE if bang else FOLDER_BASE if path.endswith("/") else PAGE_BASE
        return f"{bang}[{label}]({base}{path}{title})"

    return _LINK.sub(absolute, text)

# (glob relative to the repository root, folder inside specwatch/bundle/)
BUNDLE: tuple[tuple[str, str], ...] = (
    ("mixin.libsonnet", "."),
    ("config.libsonnet", "."),
    ("jsonnetfile.json", "."),
    ("runbook.md", "."),
    ("alerts/*.libsonnet", "alerts"),
    ("alerts/*.yaml", "alerts"),
    # promtool unit tests of the rules (`specwatch mixin test` runs them).
    ("alerts/tests/*.yaml", "alerts/tests"),
    ("dashboards/*.libsonnet", "dashboards"),
    ("dashboards/lib/*.libsonnet", "dashboards/lib"),
    ("dashboards/*.json", "dashboards"),
    ("examples/specwatch.yaml", "examples"),
    ("examples/params/*.yaml", "examples/params"),
    # The public benchmark sweep the example parameter files were fitted from.
    ("tests/fixtures/sd-validation/*.csv", "examples/calibration"),
    ("tests/fixtures/sd-validation/README.md", "examples/calibration"),
)


def bundle_files(root: Path = ROOT) -> dict[str, Path]:
    """Path inside the bundle -> source file. Raises when a pattern matches nothing."""
    files: dict[str, Path] = {}
    for pattern, folder in BUNDLE:
        matches = sorted(p for p in root.glob(pattern) if p.is_file())
        if not matches:
            raise SystemExit(f"setup.py: bundle file(s) {pattern!r} not found under {root}")
        for src in matches:
            files[(Path(folder) / src.name).as_posix()] = src
    return files


class BuildPyWithBundle(build_py):
    """build_py, then copy the bundle into the built package."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "specwatch" / "bundle"
        for rel, src in bundle_files().items():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)


if __name__ == "__main__":
    setup(
        cmdclass={"build_py": BuildPyWithBundle},
        long_description=long_description((ROOT / "README.md").read_text(encoding="utf-8")),
        long_description_content_type="text/markdown",
    )
