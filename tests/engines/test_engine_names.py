"""Only the engine modules name an engine or one of its metrics.

Protected behaviour: the import-linter contract ``engines-alone-name-engines``
(scripts/engine_names_contract.py, run by ``make lint`` and tests/test_layout.py) holds on
the package, and it breaks, naming the file and line, when a module outside
``specwatch.engines`` gets a vLLM metric name or compares with an engine's name. The
injection runs the real ``lint-imports`` on a copy of the package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO

sys.path.insert(0, str(REPO))
from scripts.engine_names_contract import engine_words, findings

PACKAGE = REPO / "src" / "specwatch"
CONFIG = """
[tool.importlinter]
root_package = "specwatch"
contract_types = ["engine_names: scripts.engine_names_contract.EngineNamesContract"]

[[tool.importlinter.contracts]]
id = "engines-alone-name-engines"
name = "only the engine modules name an engine or its metrics"
type = "engine_names"
root_package = "specwatch"
allowed_modules = ["specwatch.engines", "specwatch.sim"]
"""


def test_every_registered_engine_gives_the_rule_its_words() -> None:
    prefixes, names = engine_words()
    assert {"vllm:", "sglang:"} <= set(prefixes)
    assert {"vllm", "vllm-v0", "sglang"} <= names


@pytest.mark.parametrize(("source", "found"), [
    ('X = "vllm:spec_decode_num_drafts_total"\n', "an engine's metric name"),
    ('def f(n):\n    return f"vllm:{n}_total"\n', "an engine's metric name"),
    ('def f(m):\n    return m.engine == "sglang"\n', "compares with the engine 'sglang'"),
    ('def f(m):\n    return m.engine in ("vllm", "vllm-v0")\n', "compares with the engine"),
])
def test_the_rule_finds_an_engine_named_in_code(source: str, found: str) -> None:
    prefixes, names = engine_words()
    got = findings(source, "m", prefixes, names)
    assert got and found in got[0]


def test_docstrings_and_other_words_are_not_names() -> None:
    prefixes, names = engine_words()
    source = ('"""Reads vllm:cache_config_info."""\n'
              'def f(x):\n    """Compare with "vllm"."""\n'
              '    return x == "auto" or "the vllm: page" in x\n')
    assert findings(source, "m", prefixes, names) == []


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    linter = Path(sys.executable).parent / "lint-imports"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(root / "src"), str(REPO)))}
    return subprocess.run([str(linter), "--config", str(root / "pyproject.toml")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_the_contract_breaks_when_a_module_outside_the_engines_names_a_vllm_metric(
        tmp_path: Path) -> None:
    shutil.copytree(PACKAGE, tmp_path / "src" / "specwatch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "pyproject.toml").write_text(CONFIG)
    clean = _lint(tmp_path)
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-2000:]

    derive = tmp_path / "src" / "specwatch" / "poll" / "windows" / "derive.py"
    injected = '\nDRAFTS_METRIC = "vllm:spec_decode_num_drafts_total"\n'
    derive.write_text(derive.read_text() + injected)
    broken = _lint(tmp_path)
    assert broken.returncode != 0
    line = len(derive.read_text().splitlines())
    assert f"specwatch.poll.windows.derive:{line}: an engine's metric name" in broken.stdout
    assert "0 broken" not in broken.stdout
