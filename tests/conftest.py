"""Suite-wide checks.

``no_secret_in_logs``: every log record emitted during every test (any logger, DEBUG and
up, exception tracebacks included) is checked for the suite's known secrets
(:mod:`helpers.testsecrets`) in every printable form (raw, repr-escaped, URL-encoded), and
for every secret specwatch registered for redaction so far (whatever a test configured:
a token file, an environment variable, a header, a URL query); a test that logs one fails.
The check reads the record as code formatted it, before any redacting filter: code must
never format a secret into a message in the first place. Under pytest-xdist (`make test`)
each worker is a process of its own: "registered so far" means so far in that worker, and
the suite's known secrets are checked in every worker.
"""

from __future__ import annotations

import logging
import threading

import pytest
from helpers import testsecrets

from specwatch.common import redact

_KNOWN = tuple(sorted({f for s in testsecrets.ALL for f in redact.forms(s)}))


class _SecretSpotter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.hits: list[str] = []
        self._guard = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(self._guard, "busy", False):
            return
        self._guard.busy = True
        try:
            try:
                text = record.getMessage()
            except Exception:  # a bad format string is not our concern here
                text = str(record.msg)
            if record.exc_info:
                text += logging.Formatter().formatException(record.exc_info)
            if record.exc_text:
                text += record.exc_text
            for secret in _KNOWN + redact.registered():
                if secret in text:
                    self.hits.append(f"{record.name}:{record.levelname}: {text[:300]}")
                    break
        finally:
            self._guard.busy = False


@pytest.fixture(autouse=True)
def no_secret_in_logs():
    """Fail the test when any log record contains a known test secret."""
    spotter = _SecretSpotter()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(spotter)
    root.setLevel(logging.DEBUG)
    try:
        yield spotter
    finally:
        root.removeHandler(spotter)
        root.setLevel(old_level)
    assert not spotter.hits, f"secret in log lines: {spotter.hits}"


@pytest.fixture(params=["direct", "requests"])
def fetch_path(request, monkeypatch):
    """Run the test on each of the poller's transports (the fast path is tested
    against the library): every session the poller makes while the test runs is pinned to
    ``direct`` (http.client) or ``requests``, whatever the environment's proxies say."""
    from specwatch.poll.fetch import client as fetch

    original = fetch.new_session
    made: list[object] = []

    def pinned(url: str, path: str = "auto") -> fetch.FetchSession:
        session = original(url, request.param)
        made.append(session)
        return session

    monkeypatch.setattr(fetch, "new_session", pinned)
    yield request.param
    kind = fetch.DirectSession if request.param == "direct" else fetch.RequestsSession
    assert all(isinstance(s, kind) for s in made), made
