"""Prometheus' HTTP API as calibration and advice read it: one query, its answer checked.

Why here: ``calibrate --prometheus`` (history windows, measured pairs) and ``advise
--prometheus`` (the deployment's load) ask the same API with the same rules. Every request
goes through the one outbound client (:func:`specwatch.poll.fetch.proxied.send`): a total
deadline per query from connect to the last byte (``--timeout``), a cap on the answer
(:data:`MAX_ANSWER_BYTES`), no redirect followed. The answer is checked against the shape
the API documents before anything reads it (an object with ``status`` and ``data``; ``data``
an object whose ``resultType`` is the one asked for and whose ``result`` is a list of
series, each a ``metric`` object of strings and ``[time, "value"]`` samples). Whatever a
server sends, the caller gets rows of numbers or one :class:`PrometheusError` line (exit 2).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping

import requests

from specwatch.common.errors import SpecwatchError
from specwatch.poll.fetch.proxied import RequestsSession, send
from specwatch.poll.fetch.rules import PollError

#: Largest answer read: a query_range chunk holds at most 10,000 points per series (about
#: 40 bytes each as JSON), so this is over 150 series per query; more is not a calibration
#: input but a selector that matches too much.
MAX_ANSWER_BYTES = 64 * 1024 * 1024

#: (labels, [(time, value), ...]) of one series; a vector's series has one sample.
Row = tuple[dict[str, str], list[tuple[float, float]]]


class PrometheusError(SpecwatchError):
    """Prometheus could not be reached or refused a query (exit 2, like every input error)."""


def new_session(url: str) -> RequestsSession:
    """The session of the queries to ``url`` (proxies from the environment, read once)."""
    return RequestsSession(url)


def query(session: requests.Session, url: str, path: str, params: Mapping[str, str],
          timeout: float, kind: str, expr: str) -> list[Row]:
    """The checked ``result`` of ``GET url + path`` (``kind``: "matrix" or "vector")."""
    try:
        reply = send(session, "GET", f"{url}{path}", params=params, timeout=timeout,
                     max_body_bytes=MAX_ANSWER_BYTES)
    except PollError as exc:
        raise _failed(url, exc, expr) from None
    where = f"{url}{path} answered HTTP {reply.status}"
    try:
        body = json.loads(reply.text)
    except RecursionError:
        raise PrometheusError(f"{where} with JSON nested too deeply to be a Prometheus "
                              "answer; is this the Prometheus base URL?") from None
    except ValueError:
        raise PrometheusError(f"{where} without JSON; is this the Prometheus base URL?"
                              ) from None
    if not isinstance(body, dict):
        raise PrometheusError(f"{where} with a JSON {type(body).__name__}, expected a JSON "
                              "object with status and data; is this the Prometheus base URL?")
    if reply.status != 200 or body.get("status") != "success":
        raise PrometheusError(f"Prometheus refused {expr!r}: HTTP {reply.status} "
                              f"{_text(body.get('errorType'))}: {_text(body.get('error'))}"
                              .rstrip())
    data = body.get("data")
    if not isinstance(data, dict):
        raise PrometheusError(f"{where} without a data object for {expr!r}; expected "
                              "data.resultType and data.result")
    got = data.get("resultType")
    if got != kind:
        raise PrometheusError(f"Prometheus answered {_text(got)!r} for {expr!r}, expected a "
                              f"{kind}")
    result = data.get("result")
    if not isinstance(result, list):
        raise PrometheusError(f"{where} with a data.result that is not a list for {expr!r}")
    return [_row(series, kind, expr) for series in result]


def _row(series: object, kind: str, expr: str) -> Row:
    metric = series.get("metric") if isinstance(series, dict) else None
    if not isinstance(metric, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metric.items()):
        raise PrometheusError(f"Prometheus answered a series whose metric is not an object of "
                              f"label strings for {expr!r}: {_text(series)}")
    points = series.get("values") if kind == "matrix" else [series.get("value")]
    if not isinstance(points, list):
        raise PrometheusError(f"Prometheus answered a series without a list of samples for "
                              f"{expr!r}: {_text(series)}")
    return metric, [_sample(p, expr) for p in points]


def _sample(point: object, expr: str) -> tuple[float, float]:
    """``[time, "value"]`` as numbers (the value may be "NaN" or "+Inf": callers skip those)."""
    if (isinstance(point, list) and len(point) == 2 and isinstance(point[1], str)
            and isinstance(point[0], int | float) and not isinstance(point[0], bool)):
        try:
            return float(point[0]), float(point[1])
        except ValueError:
            pass
    raise PrometheusError(f"Prometheus answered a sample that is not [time, \"number\"] for "
                          f"{expr!r}: {_text(point)}")


def _text(value: object, limit: int = 120) -> str:
    """A value of the answer in a message: one line, cut to ``limit`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _failed(url: str, exc: PollError, expr: str) -> PrometheusError:
    """One line for a query that got no whole answer."""
    if exc.reason == "timeout":
        return PrometheusError(f"Prometheus at {url} gave no complete answer to {expr!r}: "
                               f"{exc}; raise --timeout or narrow the query")
    if exc.reason == "too_large":
        return PrometheusError(f"Prometheus at {url} answered {expr!r} with a {exc}; narrow "
                               "--selector or the time range")
    if exc.reason == "tls":
        why = ("TLS handshake failed (https URL of a plain-HTTP server, or an untrusted "
               "certificate)")
    else:
        why = _root_cause(exc.__cause__ or exc)
    return PrometheusError(f"cannot reach Prometheus at {url}: {why}; check --prometheus "
                           "(the server's base URL, e.g. http://prometheus:9090)")


def _root_cause(exc: BaseException) -> str:
    """The innermost socket error of an exception chain, in words."""
    seen: set[int] = set()
    found: OSError | None = None
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.strerror:
            found = e
        for nxt in (getattr(e, "reason", None), e.__cause__, e.__context__, *e.args):
            if isinstance(nxt, BaseException):
                todo.append(nxt)
    if found is None:
        return type(exc).__name__
    if isinstance(found, socket.gaierror):
        return f"host name not resolved ({found.strerror})"
    return str(found.strerror).lower()


__all__ = ["MAX_ANSWER_BYTES", "PrometheusError", "Row", "new_session", "query"]
