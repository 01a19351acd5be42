"""Content negotiation by RFC 9110 quality values (``Accept``, ``Accept-Encoding``).

A list element is ``value *( OWS ";" OWS param )``; its weight is the ``q`` parameter (0 to
1, default 1), and ``q=0`` means "not acceptable" (RFC 9110 §12.4.2). So
``Accept-Encoding: gzip;q=0`` refuses gzip, and an element with a weight that is not a
qvalue (``q=2``, ``q=x``) is left out (the client's preference cannot be known).
"""

from __future__ import annotations

import re

_QVALUE = re.compile(r"(?:0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?)")


def _elements(header: str | None) -> list[tuple[str, list[str], float]]:
    """(value lower-cased, other parameters as written, weight) of each element, in order;
    elements with a malformed weight are left out."""
    out: list[tuple[str, list[str], float]] = []
    for element in (header or "").split(","):
        parts = [p.strip() for p in element.split(";")]
        value = parts[0].lower()
        if not value:
            continue
        q, params = 1.0, []
        for p in parts[1:]:
            name, _, arg = p.partition("=")
            if name.strip().lower() == "q":
                arg = arg.strip()
                if _QVALUE.fullmatch(arg) is None:
                    break
                q = float(arg)
            else:
                params.append(p)
        else:
            out.append((value, params, q))
    return out


def accepts_gzip(header: str | None) -> bool:
    """Does this ``Accept-Encoding`` take a gzip body (and prefer it to none)?

    gzip (or its alias x-gzip) with a weight above 0, or, when gzip is not named, ``*``
    with a weight above 0; and not below the weight the client gives ``identity`` (no
    encoding) explicitly. No header: no gzip (an answer every client reads)."""
    weights: dict[str, float] = {}
    for value, _, q in _elements(header):
        if value == "x-gzip":
            value = "gzip"
        weights[value] = max(q, weights.get(value, 0.0))
    gzip = weights.get("gzip", weights.get("*", 0.0))
    return gzip > 0 and gzip >= weights.get("identity", 0.0)


#: Media ranges a Prometheus page can be served as: OpenMetrics, or the text format.
_OPENMETRICS = "application/openmetrics-text"
_TEXT_RANGES = frozenset({"text/plain", "text/*", "*/*"})


def by_preference(header: str | None) -> str:
    """The ``Accept`` header for a chooser that takes the first range it knows
    (prometheus_client's ``choose_encoder``, whose default is the text format): the ranges
    a page can be served as, in the client's order of preference (highest weight first,
    stable), the unacceptable ones (``q=0``) left out, and none after the first range that
    means the text format (the chooser would skip a ``text/plain;version=0.0.4`` the client
    prefers and take a less wanted OpenMetrics after it)."""
    ranked = sorted((e for e in _elements(header) if e[2] > 0), key=lambda e: -e[2])
    out: list[str] = []
    for value, params, _ in ranked:
        if value == _OPENMETRICS or value in _TEXT_RANGES:
            out.append(";".join([value, *params]))
            if value != _OPENMETRICS:
                break
    return ",".join(out)
