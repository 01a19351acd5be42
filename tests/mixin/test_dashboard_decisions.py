"""One window per decision: a panel that shows the signal an alert acts on shows it as the
alert reads it.

The mapping comes from the rendered rules, not from a list: each alert's signal is the
series its expression compares with a number (`<` or `>`; a condition joined with `and` or
`unless` only gates it), with the window the rule selects. Every stat or time-series panel
that plots a signal must read it over the rule's window, draw the rule's threshold (each
side of a two-sided one) and name the rule in its description, so that the panel crosses
the line when the alert goes pending, not minutes apart from it.
"""

from __future__ import annotations

import pytest
from mixin_helpers import Signal, alert_signals, load_dashboards, panels, selectors, window_of


def test_the_rules_yield_the_signals_of_the_alerts_that_compare_a_number() -> None:
    """The derivation sees the alerts it must (a parser change would empty the list)."""
    by_alert = {s.alert for s in alert_signals()}
    assert {"SDAcceptanceRateLow", "SDPredictedSpeedupLow", "SDAcceptanceBimodal",
            "SDModelDrift", "SDMeasuredSlowdown"} <= by_alert, by_alert
    drift = [s.threshold for s in alert_signals() if s.alert == "SDModelDrift"]
    assert sorted(drift) == [-0.2, 0.2], drift


def alert_backed_panels() -> list[tuple[str, str, Signal]]:
    """(dashboard, panel title, signal) for every stat or time-series panel that reads a
    signal's series."""
    signals = alert_signals()
    out = []
    for name, d in sorted(load_dashboards().items()):
        for p in panels(d):
            if p["type"] not in ("stat", "timeseries"):
                continue
            read = {n.name for t in p.get("targets", []) for n in selectors(t["expr"])}
            out.extend((name, p["title"], s) for s in signals if s.metric in read)
    return out


def test_alert_backed_panels_are_found() -> None:
    titles = {title for _, title, _ in alert_backed_panels()}
    assert {"Acceptance now", "Bimodality coefficient", "Predicted speedup",
            "Model error: predicted / measured mean latency - 1"} <= titles, titles


@pytest.mark.parametrize(("dashboard", "title", "signal"), alert_backed_panels(),
                         ids=lambda x: x.alert if isinstance(x, Signal) else str(x)[:40])
def test_an_alert_backed_panel_reads_the_rules_window_draws_its_threshold_and_names_it(
        dashboard: str, title: str, signal: Signal) -> None:
    [p] = [p for p in panels(load_dashboards()[dashboard]) if p.get("title") == title]
    assert signal.alert in p["description"], (title, signal.alert)
    if signal.window is not None:
        for t in p["targets"]:
            for n in selectors(t["expr"]):
                if n.name == signal.metric:
                    assert window_of(n) == signal.window, (
                        f"{title} ref {t['refId']}: {signal.metric} over window "
                        f"{window_of(n)!r}, {signal.alert} reads {signal.window!r}")
    defaults = p["fieldConfig"]["defaults"]
    steps = [s["value"] for s in defaults.get("thresholds", {}).get("steps", [])]
    assert any(v is not None and abs(v - signal.threshold) < 1e-9 for v in steps), (
        f"{title}: {signal.alert}'s threshold {signal.threshold} is not drawn: {steps}")
    if p["type"] == "timeseries":
        assert defaults["custom"]["thresholdsStyle"]["mode"] != "off", title
