"""The package layout draws the architecture (issue 13): subpackages in layers, imports only
going down, the model pure, no module too long to read whole.

The import-linter contracts in pyproject.toml are the rules; `make lint` runs them and this
test runs them too, so a layering break fails the default suite, not only the linter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "specwatch"
SUBPACKAGES = ("common", "model", "web", "poll", "expose", "sim", "calibrate", "mixin", "plugins",
               "plugins/live", "plugins/pairs", "plugins/control", "app")
MAX_LINES = 600


def test_import_linter_contracts_hold() -> None:
    linter = Path(sys.executable).parent / "lint-imports"
    if not linter.exists():
        pytest.fail(f"lint-imports is not installed next to {sys.executable}: run `make setup`")
    result = subprocess.run([str(linter), "--config", str(ROOT / "pyproject.toml")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("package, forbidden", [
    ("specwatch.model", ("specwatch.poll", "specwatch.expose", "specwatch.plugins",
                         "specwatch.web", "specwatch.sim", "specwatch.calibrate", "specwatch.app",
                         "prometheus_client", "scipy", "matplotlib")),
    ("specwatch.poll", ("specwatch.expose", "specwatch.plugins", "specwatch.model",
                        "specwatch.sim", "specwatch.calibrate", "specwatch.app")),
    ("specwatch.expose", ("specwatch.plugins", "specwatch.model", "specwatch.sim",
                          "specwatch.calibrate", "specwatch.app")),
])
def test_importing_a_layer_loads_nothing_above_it(package: str, forbidden: tuple[str, ...]) -> None:
    """Checked at run time in a fresh interpreter, where lazy and re-exported imports show."""
    code = (f"import sys, {package}; "
            "print('\\n'.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    loaded = [m for m in out if any(m == f or m.startswith(f + ".") for f in forbidden)]
    assert loaded == [], f"import {package} loaded {loaded}"


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_every_subpackage_says_what_it_owns_and_may_import(name: str) -> None:
    doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text()))
    assert doc, f"specwatch.{name} has no docstring"
    assert "May import" in doc, f"specwatch.{name}: the docstring does not say what it may import"


def test_no_module_is_too_long_without_a_reason() -> None:
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().count("\n")
        if lines <= MAX_LINES:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if "Size:" not in doc:
            long.append(f"{path.relative_to(ROOT)} ({lines} lines)")
    assert long == [], ("modules over ~600 lines need a 'Size:' paragraph in their docstring "
                        f"saying why they are one module: {long}")
