"""An import-linter contract type: no module outside the engine modules names an engine.

``lint-imports`` (``make lint``, tests/test_layout.py) runs it from ``[tool.importlinter]``
in pyproject.toml. A module of the root package that is not in ``allowed_modules`` may not
hold, outside its docstrings:

* a string starting with an engine's metric prefix (every registered engine's, e.g.
  ``vllm:``, and those of ``extra_prefixes``), f-string parts included;
* a comparison with an engine's kind or family as a string literal (``engine == "sglang"``,
  ``kind in ("vllm", "vllm-v0")``).

Such a module asks :mod:`specwatch.engines.registry` instead. The rules are read from the
source files (import-linter's graph has imports only), with Python's own parser.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def engine_words() -> tuple[tuple[str, ...], frozenset[str]]:
    """Every registered engine's metric prefix, and its kinds and families."""
    registry = importlib.import_module("specwatch.engines.registry")
    engines = registry.engines()
    return (tuple(registry.prefixes()),
            frozenset(e.kind for e in engines) | frozenset(e.family for e in engines))


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module and its classes and functions."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.add(id(body[0].value))
    return out


def _literals(node: ast.expr) -> Iterator[str]:
    """The string literals a comparison operand is (a string, or a tuple/list/set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for elt in node.elts:
            yield from _literals(elt)


def findings(source: str, filename: str, prefixes: Iterable[str], names: frozenset[str]
             ) -> list[str]:
    """``filename:line: what`` for each place ``source`` names an engine."""
    tree = ast.parse(source, filename)
    skip = _docstrings(tree)
    prefixes = tuple(prefixes)
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in skip and node.value.startswith(prefixes):
            out.append(f"{filename}:{node.lineno}: an engine's metric name {node.value!r}")
        elif isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                for word in _literals(operand):
                    if word in names:
                        out.append(f"{filename}:{node.lineno}: compares with the engine "
                                   f"{word!r}")
    return out


class EngineNamesContract(Contract):
    """Only ``allowed_modules`` (and their submodules) name engines or engine metrics.

    Options: ``root_package``, ``allowed_modules`` (the engines package; the simulated
    vLLM, which writes vLLM's page), ``extra_prefixes`` (prefixes of engines not registered,
    checked all the same).
    """

    root_package = fields.StringField()
    allowed_modules = fields.ListField(subfield=fields.StringField())
    extra_prefixes = fields.ListField(subfield=fields.StringField(), required=False,
                                      default=[])

    def check(self, graph: object, verbose: bool) -> ContractCheck:
        prefixes, names = engine_words()
        prefixes = (*prefixes, *self.extra_prefixes)
        package = importlib.import_module(str(self.root_package))
        root = Path(package.__file__).parent  # type: ignore[arg-type]
        allowed = [str(m) for m in self.allowed_modules]
        problems: list[str] = []
        for path in sorted(root.rglob("*.py")):
            module = ".".join((str(self.root_package),
                               *path.relative_to(root).with_suffix("").parts))
            module = module.removesuffix(".__init__")
            if any(module == a or module.startswith(a + ".") for a in allowed):
                continue
            problems += findings(path.read_text(encoding="utf-8"), module, prefixes, names)
        return ContractCheck(kept=not problems, warnings=None,
                             metadata={"problems": problems})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for line in check.metadata["problems"]:
            output.print_error(line)
        output.new_line()


if __name__ == "__main__":  # a quick look without lint-imports
    p, n = engine_words()
    for arg in sys.argv[1:]:
        for line in findings(Path(arg).read_text(encoding="utf-8"), arg, p, n):
            print(line)
