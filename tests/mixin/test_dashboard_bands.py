"""Predictions carry their interval, and two figures that differ in meaning are two lines.

Which series have an interval comes from the exporter's metrics reference (docs/metrics.md):
a gauge X with X_lower and X_upper (X_lower_seconds for a name ending in _seconds). Every
time-series panel that plots X plots both ends beside it. Break-even (where the predicted
speedup crosses 1) and SD's throughput ceiling (where SD stops keeping up) are separate
lines, told apart by colour and style.
"""

from __future__ import annotations

import pytest
from mixin_helpers import exporter_metrics, load_dashboards, panels, selectors


def _bound(name: str, end: str) -> str:
    if name.endswith("_seconds"):
        return f"{name.removesuffix('_seconds')}_{end}_seconds"
    return f"{name}_{end}"


_EXPORTED = exporter_metrics()
BANDED = sorted(n for n in _EXPORTED
                if _bound(n, "lower") in _EXPORTED and _bound(n, "upper") in _EXPORTED)


def test_the_reference_lists_the_predictions_with_an_interval() -> None:
    assert {"sd_predicted_speedup", "sd_predicted_latency_seconds",
            "sd_measured_speedup"} <= set(BANDED), BANDED


def _timeseries_reading(metric: str) -> list[tuple[str, dict]]:
    return [(name, p) for name, d in sorted(load_dashboards().items()) for p in panels(d)
            if p["type"] == "timeseries"
            and any(metric in {s.name for s in selectors(t["expr"])} for t in p["targets"])]


@pytest.mark.parametrize("metric", BANDED)
def test_every_time_series_of_a_prediction_draws_its_interval(metric: str) -> None:
    found = _timeseries_reading(metric)
    for name, p in found:
        read = {s.name for t in p["targets"] for s in selectors(t["expr"])}
        for end in ("lower", "upper"):
            assert _bound(metric, end) in read, f"{name}: {p['title']} has no {end} end"
    print(f"{metric}: {[p['title'] for _, p in found]}")


def test_break_even_and_the_throughput_ceiling_are_distinct_lines() -> None:
    [(_, p)] = [(n, p) for n, p in _timeseries_reading("sd_breakeven_arrival_rate")]
    legends = {}
    for t in p["targets"]:
        names = {s.name for s in selectors(t["expr"])}
        for metric in ("sd_breakeven_arrival_rate", "sd_throughput_ceiling_arrival_rate"):
            if metric in names:
                assert len(names) == 1, t["expr"]
                legends[metric] = t["legendFormat"]
    assert len(legends) == 2 and len(set(legends.values())) == 2, legends
    styles = []
    for metric, legend in legends.items():
        suffix = legend.rsplit("}}", 1)[-1]
        [o] = [o for o in p["fieldConfig"]["overrides"]
               if o["matcher"]["id"] == "byRegexp" and o["matcher"]["options"].endswith(
                   suffix.strip() + "$")]
        props = {x["id"]: x["value"] for x in o["properties"]}
        styles.append((props["color"]["fixedColor"], str(props.get("custom.lineStyle"))))
        assert "break-even" in p["description"] and "ceiling" in p["description"], metric
    assert styles[0] != styles[1] and styles[0][0] != styles[1][0], styles
