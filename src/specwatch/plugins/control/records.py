"""The before/after record around a switch: the decision window's latency quantiles and
operating point right before the switch, against the first complete window entirely after
it (the ``sd_controller_switch_latency_ratio`` and ``sd_switch_window_*`` series, and the
``switch_latency`` event). Pure: fed one observation per usable poll by the state machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specwatch.plugins.control.assess import Observation, window_figures, window_quantiles
from specwatch.plugins.control.jsonview import iso_time, json_number
from specwatch.plugins.control.settings import EPS


@dataclass
class _Record:
    action: str
    switched_at: float
    before: dict[tuple[str, str], float] | None
    before_figures: dict[str, float] | None = None


class SwitchRecords:
    """The last window before the next switch, the switch waiting for its after window, and
    the last complete record (``ratios``, ``switch_window``)."""

    def __init__(self) -> None:
        self.before: dict[tuple[str, str], float] | None = None
        self.before_figures: dict[str, float] | None = None
        self.record: _Record | None = None
        self.ratios: dict[tuple[str, str, str], float] = {}
        self.switch_window: dict[str, Any] | None = None

    def switched(self, action: str, now: float) -> None:
        """The configuration changed (``action`` enable or disable) at ``now``."""
        self.record = _Record(action, now, self.before, self.before_figures)
        self.before = None
        self.before_figures = None

    def update(self, obs: Observation, min_requests: float, window: str
               ) -> dict[str, Any] | None:
        """Fold one usable poll's window; the ``switch_latency`` event's fields when it
        completes a record (the first window entirely after the switch), else None."""
        quantiles, count = window_quantiles(obs.histograms)
        if not quantiles or count < max(1.0, min_requests):
            return None
        rec, event = self.record, None
        if rec is not None and obs.window_start is not None \
                and obs.window_start >= rec.switched_at - EPS:
            ratios = {}
            if rec.before:
                for key, after in quantiles.items():
                    before = rec.before.get(key)
                    if before and before > 0:
                        ratios[(rec.action, *key)] = after / before
            self.ratios = ratios
            self.record = None
            self.switch_window = {"action": rec.action, "switched_at": rec.switched_at,
                                  "before": rec.before_figures or {},
                                  "after": window_figures(obs)}
            event = {"action": rec.action, "switched_at": iso_time(rec.switched_at),
                     "window": window,
                     "before": {f"{lat}_p{q}": json_number(v) for (lat, q), v in
                                (rec.before or {}).items()} or None,
                     "after": {f"{lat}_p{q}": json_number(v) for (lat, q), v in
                               quantiles.items()},
                     "ratio": {f"{lat}_p{q}": json_number(v) for (_a, lat, q), v in
                               ratios.items()}}
        self.before = quantiles
        self.before_figures = window_figures(obs)
        return event
