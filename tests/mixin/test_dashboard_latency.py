"""Latency panels lead with what is known: the exact mean first and drawn thick; a quantile
that vLLM's buckets do not resolve is left out unless the user asks for its bucket bound
(the `quantile_bounds` variable, off by default); the description says which bucket layout
would resolve the quantiles at the configured resolution.
"""

from __future__ import annotations

import re

import pytest
from mixin_helpers import load_dashboards, panels

from specwatch.mixin import render as mixin_render

SD = "specwatch-sd-overview.json"
LATENCY = [p for p in panels(load_dashboards()[SD]) if p.get("title", "").endswith("P50 / P99")]


def test_the_latency_panels_are_found() -> None:
    assert len(LATENCY) == 5, [p["title"] for p in LATENCY]


@pytest.mark.parametrize("p", LATENCY, ids=[p["title"] for p in LATENCY])
def test_the_mean_leads_and_unresolved_bounds_are_off_by_default(p: dict) -> None:
    first = p["targets"][0]
    assert " mean" in first["legendFormat"] and "histogram_quantile" not in first["expr"]
    thick = [o for o in p["fieldConfig"]["overrides"]
             if re.fullmatch(o["matcher"]["options"], first["legendFormat"].replace(
                 "{{model_name}}", "llama"))
             and {"id": "custom.lineWidth", "value": 3} in o["properties"]]
    assert thick, p["title"]
    for t in p["targets"]:
        if "≤ bucket bound" in t["expr"]:
            assert "and on () (vector($quantile_bounds) == 1)" in t["expr"], t["refId"]
    [var] = [v for v in load_dashboards()[SD]["templating"]["list"]
             if v["name"] == "quantile_bounds"]
    assert var["current"]["value"] == "0"
    assert {o["value"] for o in var["options"]} == {"0", "1"}


def test_the_description_names_the_bucket_layout_for_the_resolution() -> None:
    """A bucket (b / q, b] is at most r x a value inside it wide when q <= 1 + r: the
    description asks for that ratio, and follows grafana.quantileResolution."""
    for resolution, ratio in ((0.5, "1.5 x the one before"), (0.25, "1.25 x the one before")):
        rendered = mixin_render.render({"grafana": {"quantileResolution": resolution}})
        for p in panels(rendered["dashboards"][SD]):
            if p.get("title", "").endswith("P50 / P99"):
                assert ratio in p["description"], (resolution, p["title"])
