"""The exporter bounds glibc's per-thread malloc arenas (peak RSS of a fleet).

Protected behaviour: ``specwatch serve`` (``ServeApp``) applies the bound when it starts,
before its poll threads exist; on glibc the ``mallopt`` calls succeed; a setting the
operator made in the environment is left alone.
"""

from __future__ import annotations

import ctypes
import platform

import pytest

from specwatch.app import settings as app_settings
from specwatch.common import memory

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")


@glibc
def test_bound_applies_on_glibc():
    assert memory.bound_malloc_arenas() is True


@glibc
def test_operator_setting_wins(monkeypatch):
    calls: list[tuple[int, int]] = []

    class FakeLibc:
        def __init__(self, *_args):
            self.mallopt = self

        def __call__(self, param, value):
            calls.append((param, value))
            return 1

    monkeypatch.setattr(ctypes, "CDLL", FakeLibc)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert memory.bound_malloc_arenas() is True
    assert calls == [(memory.M_MMAP_THRESHOLD, memory.MMAP_THRESHOLD)]


def test_serve_app_applies_the_bound(monkeypatch):
    from specwatch.app import serve

    called: list[bool] = []
    monkeypatch.setattr(serve.memory, "bound_malloc_arenas", lambda: called.append(True))
    cfg = app_settings.build_config(None, ["a=http://127.0.0.1:9/metrics"], "127.0.0.1:0", 5.0)
    serve.ServeApp(cfg)
    assert called == [True]


def test_serve_paces_the_garbage_collector_while_it_runs_and_restores_it():
    """``ServeApp.start`` raises only the young generation's threshold (what a poll
    publishes lives one interval and is freed by reference counting); ``stop``
    gives the process its former thresholds back."""
    import gc

    from specwatch.app import serve

    # The interpreter's default young threshold, whatever an earlier test in this worker
    # left behind (an app it never stopped): the premise is a process at the default.
    original = gc.get_threshold()
    gc.set_threshold(700, *original[1:])
    before = gc.get_threshold()
    try:
        cfg = app_settings.build_config(None, ["a=http://127.0.0.1:9/metrics"], "127.0.0.1:0",
                                        5.0)
        app = serve.ServeApp(cfg)
        try:
            app.start(poll=False)
            assert gc.get_threshold() == (memory.GC_YOUNG_THRESHOLD, *before[1:])
        finally:
            app.stop()
        assert gc.get_threshold() == before
        assert before[0] < memory.GC_YOUNG_THRESHOLD
    finally:
        gc.set_threshold(*original)
