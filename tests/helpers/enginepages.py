"""The constructed TensorRT-LLM and llama.cpp pages (tests/fixtures/engines-constructed):
their page builder and the committed page sequences."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from helpers.paths import FIXTURES

PAGES = FIXTURES / "engines-constructed"


def builder() -> ModuleType:
    """The fixtures' page builder (loaded under its own name: the constructed/ folder has a
    build_pages module too)."""
    spec = importlib.util.spec_from_file_location(
        "build_engine_pages", PAGES / "build_engine_pages.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sequence(engine: str) -> list[str]:
    """One engine's committed pages, in scrape order."""
    return [p.read_text() for p in sorted((PAGES / engine).glob("snap_*.txt"))]
