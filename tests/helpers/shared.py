"""What the suite makes once per run, whatever the number of workers.

`make test` runs the suite on several pytest-xdist workers (separate processes). A session
fixture is then made once per worker; what is costly to make, or must not be made twice at
the same time (the wheel build writes into the checkout, `npm ci` into tests/grafana-schema),
is made here once per run: the workers share the run's temporary root
(``tmp_path_factory``'s base folder's parent under xdist), and the first worker that asks
makes the thing while the others wait on a file lock, then reuse it. Without xdist the same
calls make it once per session.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from filelock import FileLock


def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This run's temporary folder that every worker sees."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def run_lock(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[None]:
    """Held by one worker of this run at a time (a file lock named ``name``)."""
    with FileLock(str(run_root(tmp_path_factory) / f"{name}.lock")):
        yield


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str,
              make: Callable[[Path], None]) -> Path:
    """The folder ``name`` of this run, filled by ``make(folder)`` by the first worker that
    asks; a ``make`` that failed (raised) leaves nothing behind, so the next one tries again
    and reports its own failure."""
    folder = run_root(tmp_path_factory) / name
    done = folder / ".made"
    with run_lock(tmp_path_factory, name):
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            try:
                make(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            done.touch()
    return folder
