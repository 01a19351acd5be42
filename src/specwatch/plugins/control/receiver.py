"""The Alertmanager webhook payload (version 4): parsed strictly into the alerts the controller
acts on; anything malformed is one clear 400, never a traceback.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any


def _parse_time(value: Any, what: str) -> float:
    if not isinstance(value, str):
        raise ValueError(f"{what}: expected an RFC 3339 time string, got {value!r}")
    try:
        dt = datetime.fromisoformat(value)
    except ValueError as exc:
        raise ValueError(f"{what}: not an RFC 3339 time: {value!r}") from exc
    if dt.tzinfo is None:
        raise ValueError(f"{what}: time without a zone: {value!r}")
    return dt.timestamp()


def parse_alertmanager(body: bytes) -> list[dict[str, Any]]:
    """Validate an Alertmanager webhook body (version 4) and return its alerts.

    Each alert: {"status": firing|resolved, "labels": {str: str}, "starts_at": seconds,
    "fingerprint": str}. Raises ValueError naming the field that is wrong.
    """
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    except RecursionError:  # [[[[... a megabyte deep: one 400, never a traceback
        raise ValueError("JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise ValueError("expected a JSON object")
    if doc.get("version") != "4":
        raise ValueError(f"version: expected \"4\" (Alertmanager webhook format), got "
                         f"{doc.get('version')!r}")
    alerts = doc.get("alerts")
    if not isinstance(alerts, list):
        raise ValueError("alerts: expected a list")
    out = []
    for i, a in enumerate(alerts):
        where = f"alerts[{i}]"
        if not isinstance(a, dict):
            raise ValueError(f"{where}: expected an object")
        status = a.get("status")
        if status not in ("firing", "resolved"):
            raise ValueError(f"{where}.status: expected firing or resolved, got {status!r}")
        labels = a.get("labels")
        if not isinstance(labels, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise ValueError(f"{where}.labels: expected an object of strings")
        if not labels.get("alertname"):
            raise ValueError(f"{where}.labels.alertname: missing")
        starts = _parse_time(a.get("startsAt"), f"{where}.startsAt")
        fingerprint = a.get("fingerprint")
        if fingerprint is None:
            fingerprint = json.dumps(sorted(labels.items()))
        elif not isinstance(fingerprint, str):
            raise ValueError(f"{where}.fingerprint: expected a string")
        out.append({"status": status, "labels": labels, "starts_at": starts,
                    "fingerprint": fingerprint})
    return out


