"""How the controller writes numbers and times into its status and events: JSON-ready
(non-finite values become null), numbers rounded, times as RFC 3339 UTC with a ``Z``.

Imports only the standard library.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime


def json_number(x: float | None, digits: int = 6) -> float | None:
    """``x`` rounded to ``digits``, or None when absent or not finite."""
    return None if x is None or not math.isfinite(x) else round(float(x), digits)


def iso_time(t: float | None) -> str | None:
    """Unix seconds as ``2026-01-02T03:04:05Z`` (None when absent or not finite)."""
    if t is None or not math.isfinite(t):
        return None
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")
