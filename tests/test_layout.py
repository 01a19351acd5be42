"""The package layout draws the architecture: subpackages in layers, imports only
going down, the model pure, no import cycle of any kind, no module reaching into another's
private names, and no function or module docstring too long to read whole (a long module
is a warning of `make lint`: scripts/module_size.py).

The import-linter contracts in pyproject.toml are the rules; `make lint` runs them and this
test runs them too, so a layering break fails the default suite, not only the linter.
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "specwatch"
SUBPACKAGES = ("common", "model", "web", "poll", "expose", "sim", "calibrate", "mixin", "plugins",
               "plugins/live", "plugins/pairs", "plugins/control", "app")


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
def test_every_subpackage_says_what_it_is(name: str) -> None:
    """What a subpackage may import is the import-linter contracts' to say; its docstring says
    what it is."""
    doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text()))
    assert doc, f"specwatch.{name} has no docstring"


def test_long_modules_are_a_lint_warning_not_a_failure(tmp_path: Path) -> None:
    """scripts/module_size.py (run by `make lint`) names each module over 600 lines and its
    length, and exits 0; a tree that is not there is one line and exit 2."""
    (tmp_path / "short.py").write_text("x = 1\n" * 600)
    (tmp_path / "long.py").write_text("x = 1\n" * 601)
    script = ROOT / "scripts" / "module_size.py"
    result = subprocess.run([sys.executable, str(script), str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"warning: {tmp_path / 'long.py'} has 601 lines (over 600): consider splitting it into "
        "modules that each do one thing"]
    missing = subprocess.run([sys.executable, str(script), str(tmp_path / "absent")],
                             capture_output=True, text=True, timeout=60)
    assert (missing.returncode, missing.stdout) == (2, "")
    assert missing.stderr == f"module_size: {tmp_path / 'absent'}: not a directory\n"
    assert "module_size.py" in (ROOT / "Makefile").read_text().split("\nlint:")[1].split("\n\n")[0]


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(imported module, imported name or "", line) for every specwatch import in a module:
    top level, in functions and under ``if TYPE_CHECKING:`` alike."""
    out = []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base.split(".")[0] != "specwatch":
                continue
            for alias in node.names:
                member = f"{base}.{alias.name}"
                out.append((member if member in modules else base, alias.name
                            if member not in modules else "", node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names
                    if a.name.split(".")[0] == "specwatch"]
    return out


def test_no_module_imports_another_modules_private_names() -> None:
    """A name with a leading underscore is its module's own: a module that needs it from
    elsewhere means it is public API in the wrong place. Covers ``from m import _x`` and
    ``m._x`` on an imported specwatch module."""
    modules = _modules()
    offenders = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom | ast.Import):
                for a in node.names:
                    target = (f"{node.module}.{a.name}" if isinstance(node, ast.ImportFrom)
                              else a.name)
                    if target in modules and target != name:
                        aliases[a.asname or a.name.split(".")[0]] = target
        for imported, member, line in _imports(name, path, modules):
            if member.startswith("_") and not member.startswith("__") and imported != name:
                offenders.append(f"{name}:{line} imports {imported}.{member}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                offenders.append(f"{name}:{node.lineno} uses {aliases[node.value.id]}"
                                 f".{node.attr}")
    assert offenders == [], offenders


def test_no_import_cycles_of_any_kind() -> None:
    """No cycle between modules, counting lazy imports and annotation-only imports too (the
    import-linter contracts ignore the latter): each module can be read knowing only the
    modules below it."""
    modules = _modules()
    graph = {name: {m for m, _, _ in _imports(name, path, modules) if m in modules and m != name}
             for name, path in modules.items()}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as cycle:
        pytest.fail(f"import cycle: {' -> '.join(cycle.args[1])}")


MAX_FUNCTION_LINES = 80
MAX_DOCSTRING_LINES = 40


def test_no_function_is_too_long_to_read_whole() -> None:
    """A function over ~80 lines is several steps that want names of their own."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert long == [], long


def test_module_docstrings_fit_on_a_screen() -> None:
    """A module docstring says what the module owns and its invariants; specifications and
    derivations live in docs/."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
        if doc and doc.count("\n") + 1 > MAX_DOCSTRING_LINES:
            long.append(f"{path.relative_to(ROOT)} ({doc.count(chr(10)) + 1} lines)")
    assert long == [], long
