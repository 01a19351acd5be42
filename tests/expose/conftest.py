"""Fixtures of the exposition tests."""

from __future__ import annotations

import pytest

from specwatch.expose import collector as collector_mod


@pytest.fixture
def rendered_targets(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the targets the collector renders during the test, in order (the
    collector's ``render_target`` wrapped, its output unchanged)."""
    names: list[str] = []
    real = collector_mod.render_target

    def counting(t):
        names.append(t.name)
        return real(t)

    monkeypatch.setattr(collector_mod, "render_target", counting)
    return names
