"""Delivering the controller's decisions: a webhook POST or a command, off the poll path.

Why a thread per target: a decision is delivered by network I/O or a child process that can
take seconds (a deployer that patches a Kubernetes Deployment), and the poll thread that
made the decision must never wait for it (pipeline hooks must not block). One worker per
target keeps one target's slow receiver from delaying another target's switch, and keeps
the decisions of one target in order.

Delivery rules:

* every decision carries an idempotency key (``decision_id``; the ``Idempotency-Key`` header
  of the webhook, ``SPECWATCH_DECISION_ID`` for a command). A decision is submitted once and
  retried only while it has not succeeded, so a receiver sees the same action at most once
  per decision, and a receiver that dedupes on the key sees it exactly once even when a
  reply got lost;
* transient failures (connection errors, timeouts, HTTP 5xx, 408, 425, 429, a non-zero
  exit) are retried with exponential backoff (``retry_backoff_seconds`` doubling up to
  ``max_retry_backoff_seconds``) up to ``max_attempts``; a permanent failure (other HTTP 4xx,
  a command that does not exist) stops at once;
* the outcome goes back to the controller (``on_done``), which counts a decision that never
  got through in ``sd_controller_actuation_errors_total`` and leaves its pending state.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specwatch import __version__
from specwatch.common import redact
from specwatch.poll.fetch.proxied import RequestsSession, send
from specwatch.poll.fetch.rules import PollError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decision:
    """One controller decision for one model of one target (immutable, delivered once)."""

    id: str
    target: str
    model: str
    action: str  # "disable" | "enable"
    reason_code: str
    reason: str
    decided_at: float
    payload: Mapping[str, Any]


@dataclass(frozen=True)
class Outcome:
    """How the delivery of one decision ended."""

    ok: bool
    attempts: int
    detail: str  # "HTTP 200", "exit 0", or the last error


class DeliveryError(Exception):
    """A failed attempt; ``permanent`` failures are not retried; ``quiet`` ones were already
    logged once (the same impossible delivery, decided again) and are logged at DEBUG."""

    def __init__(self, message: str, permanent: bool = False, quiet: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.quiet = quiet


#: Longest single argument or environment string Linux accepts (MAX_ARG_STRLEN, 32 pages).
MAX_ARG_BYTES = 131072


Deliver = Callable[[Decision], str]


def _clip(name: str, limit: int = 200) -> str:
    """A model name fit for a log line (a 200 kB name is shown by its start)."""
    return name if len(name) <= limit else f"{name[:limit]}... ({len(name)} characters)"


def _short(text: str, limit: int = 200) -> str:
    # Foreign text (an exception quoting a header value or the URL, a receiver's answer)
    # is redacted before it is cut, so a secret is never half-printed.
    text = " ".join(redact.redact(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


#: Largest receiver reply read (only its start is ever shown, in a failed attempt's detail).
MAX_REPLY_BYTES = 1024 * 1024


class WebhookDelivery:
    """POST the decision payload as JSON through the one outbound client
    (:func:`specwatch.poll.fetch.proxied.send`): ``timeout`` is the attempt's total deadline
    (connect to the reply's last byte) and the reply is capped. Header values are never
    logged (they may be secrets)."""

    def __init__(self, url: str, headers: Mapping[str, str], timeout: float) -> None:
        self.url = url
        self._headers = dict(headers)
        self.timeout = timeout
        self._session = RequestsSession(url)

    def __repr__(self) -> str:
        return f"WebhookDelivery({redact.display_url(self.url)!r})"

    def __call__(self, decision: Decision) -> str:
        headers = {"Content-Type": "application/json",
                   "User-Agent": f"specwatch/{__version__}",
                   "Idempotency-Key": decision.id, **self._headers}
        try:
            reply = send(self._session, "POST", self.url,
                         data=json.dumps(decision.payload).encode(), headers=headers,
                         timeout=self.timeout, max_body_bytes=MAX_REPLY_BYTES)
        except PollError as exc:
            raise DeliveryError(_short(str(exc))) from exc
        if 200 <= reply.status < 300:
            return f"HTTP {reply.status}"
        permanent = 400 <= reply.status < 500 and reply.status not in (408, 425, 429)
        raise DeliveryError(f"HTTP {reply.status}: {_short(reply.text)}", permanent)

    def close(self) -> None:
        self._session.close()


class CommandDelivery:
    """Run a program (argv, no shell) with the payload on stdin; exit 0 means delivered.

    The environment adds SPECWATCH_DECISION_ID, SPECWATCH_ACTION, SPECWATCH_TARGET,
    SPECWATCH_MODEL and SPECWATCH_DRAFT_LENGTH (empty when unknown), so simple scripts need
    no JSON parser.
    """

    def __init__(self, argv: Sequence[str], timeout: float) -> None:
        self.argv = list(argv)
        self.timeout = timeout
        self._refused: set[str] = set()  # models already reported as impossible to pass

    def __repr__(self) -> str:
        return f"CommandDelivery({self.argv!r})"

    def __call__(self, decision: Decision) -> str:
        k = decision.payload.get("recommended_draft_length")
        env = {**os.environ,
               "SPECWATCH_DECISION_ID": decision.id,
               "SPECWATCH_ACTION": decision.action,
               "SPECWATCH_TARGET": decision.target,
               "SPECWATCH_MODEL": decision.model,
               "SPECWATCH_DRAFT_LENGTH": "" if k is None else str(k)}
        problem = _unpassable(env)
        if problem is not None:
            # The OS would refuse this exec (ValueError, E2BIG) on every attempt and for
            # every later decision about the same model: fail at once, say why once.
            quiet = decision.model in self._refused
            if len(self._refused) < 1000:
                self._refused.add(decision.model)
            raise DeliveryError(f"cannot run {self.argv[0]!r}: {problem}", permanent=True,
                                quiet=quiet)
        try:
            proc = subprocess.run(self.argv, input=json.dumps(decision.payload).encode(),
                                  capture_output=True, timeout=self.timeout, env=env,
                                  check=False)
        except (ValueError, OSError) as exc:  # not found, no permission, E2BIG, NUL...
            raise DeliveryError(f"cannot run {self.argv[0]!r}: "
                                f"{getattr(exc, 'strerror', None) or _short(str(exc))}",
                                permanent=True) from exc
        except subprocess.TimeoutExpired as exc:
            raise DeliveryError(f"{self.argv[0]} did not finish within {self.timeout:g}s") \
                from exc
        if proc.returncode == 0:
            return "exit 0"
        err = proc.stderr.decode(errors="replace") or proc.stdout.decode(errors="replace")
        raise DeliveryError(f"exit {proc.returncode}: {_short(err)}")


def _unpassable(env: Mapping[str, str]) -> str | None:
    """Why the OS would refuse this environment for a program (None: it would not)."""
    for key, value in env.items():
        if key.startswith("SPECWATCH_"):
            if "\0" in value:
                return f"{key} contains a NUL character (the model name cannot be passed)"
            if len(key.encode()) + len(value.encode("utf-8", "surrogateescape")) + 2 \
                    > MAX_ARG_BYTES:
                return f"{key} is longer than the {MAX_ARG_BYTES} bytes the OS accepts"
    return None


class Actuator:
    """Delivers the decisions of one target in order on its own thread.

    ``wait(seconds)`` sleeps between retries and returns True when the actuator is stopping
    (tests inject a recorder instead of sleeping).
    """

    def __init__(self, name: str, deliver: Deliver, on_done: Callable[[Decision, Outcome], None],
                 max_attempts: int = 5, backoff_seconds: float = 2.0,
                 max_backoff_seconds: float = 60.0,
                 wait: Callable[[float], bool] | None = None) -> None:
        self.name = name
        self.deliver = deliver
        self.on_done = on_done
        self.max_attempts = max(1, int(max_attempts))
        self.backoff_seconds = float(backoff_seconds)
        self.max_backoff_seconds = float(max_backoff_seconds)
        self._stop = threading.Event()
        self._wait = wait or self._stop.wait
        self._queue: queue.Queue[Decision] = queue.Queue()
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def delay(self, attempt: int) -> float:
        """Wait after failed attempt number ``attempt`` (1-based): doubling, capped."""
        return min(self.backoff_seconds * 2 ** (attempt - 1), self.max_backoff_seconds)

    def submit(self, decision: Decision) -> bool:
        """Queue a decision; a decision id seen before is refused (never delivered twice)."""
        with self._lock:
            if decision.id in self._seen:
                log.warning("decision %s for %s/%s already submitted; not sending it again",
                            decision.id, decision.target, decision.model)
                return False
            self._seen.add(decision.id)
        self._queue.put(decision)
        return True

    def run_one(self, decision: Decision) -> Outcome:
        """Deliver one decision with retries (the worker's body; tests call it directly)."""
        detail = ""
        attempt = 0
        for attempt in range(1, self.max_attempts + 1):
            try:
                detail = self.deliver(decision)
            except DeliveryError as exc:
                detail = str(exc)
                last = exc.permanent or attempt == self.max_attempts
                log.log(logging.DEBUG if exc.quiet else logging.WARNING,
                        "delivering %s %s/%s (decision %s) failed, attempt %d of %d%s: %s",
                        decision.action, decision.target, _clip(decision.model), decision.id,
                        attempt, self.max_attempts,
                        " (permanent)" if exc.permanent else "", detail)
                if last:
                    break
                if self._wait(self.delay(attempt)):
                    detail = f"stopped while retrying: {detail}"
                    break
                continue
            except Exception as exc:  # a bug in a delivery must not kill the worker
                log.exception("delivering decision %s failed unexpectedly", decision.id)
                detail = f"{type(exc).__name__}: {_short(str(exc))}"
                break
            outcome = Outcome(True, attempt, detail)
            self._finish(decision, outcome)
            return outcome
        outcome = Outcome(False, attempt, detail)
        self._finish(decision, outcome)
        return outcome

    def _finish(self, decision: Decision, outcome: Outcome) -> None:
        try:
            self.on_done(decision, outcome)
        except Exception:
            log.exception("recording the outcome of decision %s failed", decision.id)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"specwatch-actuator-{self.name}",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                decision = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            self.run_one(decision)

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        close = getattr(self.deliver, "close", None)
        if close is not None:
            close()
