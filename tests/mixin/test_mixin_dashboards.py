"""The generated Grafana dashboards import cleanly and query what exists: dashboard-linter's
rules re-implemented (one datasource variable used everywhere, job/target/model_name variables,
units and descriptions, $__rate_interval, counters only through rate), layout sanity, and every
PromQL expression of the mixin parsed by Prometheus and reading only metrics that vLLM, the
exporter or the recording rules produce."""

from __future__ import annotations

import re

import promql_parser
import pytest
from mixin_helpers import (
    NOT_YET_EXPORTED,
    OLDER_VLLM_METRICS,
    PROMETHEUS_METRICS,
    all_mixin_exprs,
    counters_outside_rate,
    dashboard_exprs,
    engine_metrics,
    exporter_metrics,
    load_dashboards,
    metric_names,
    panels,
    promtool_check_exprs,
    recorded_metrics,
    vllm_metrics,
)

from specwatch.mixin import render as mixin

DASHBOARDS = load_dashboards()
DS_REF = {"type": "prometheus", "uid": "${datasource}"}
# Grafana unit ids the dashboards may use (from Grafana's unit categories); a typo such as
# "seconds" or "percent_unit" is not one and renders as a raw number.
GRAFANA_UNITS = frozenset(
    {"none", "short", "percent", "percentunit", "s", "ms", "us", "ns", "reqps", "rps", "ops",
     "cps", "bytes", "decbytes", "dtdurations", "dateTimeAsIso", "hertz", "bool"}
)


def _data_panels(d: dict) -> list[dict]:
    return [p for p in panels(d) if p["type"] != "row"]


def test_the_two_dashboards_exist():
    assert set(DASHBOARDS) == {"specwatch-sd-overview.json", "specwatch-exporter.json"}


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_identity_is_stable(name):
    """schemaVersion >= 39, the uid from config (stable links), id null, no __inputs (which
    breaks file provisioning), __requires naming the minimum Grafana, not editable
    (dashboards as code), tagged for the link menu."""
    d = DASHBOARDS[name]
    config = mixin.default_config()
    assert d["schemaVersion"] >= 39
    assert d["uid"] == config["dashboardUIDs"][name] and 8 <= len(d["uid"]) <= 40
    assert d["id"] is None
    assert "__inputs" not in d
    # The minimum Grafana version is declared (the XY chart needs 11.2+).
    (grafana,) = [r for r in d["__requires"] if r["type"] == "grafana"]
    assert grafana["version"] == config["grafana"]["minVersion"]
    assert tuple(map(int, grafana["version"].split("."))) >= (11, 2, 0)
    panel_types = {p["type"] for p in _data_panels(d)}
    assert {r["id"] for r in d["__requires"] if r["type"] == "panel"} == panel_types
    assert d["editable"] is False
    assert "specwatch" in d["tags"]
    assert d["title"].startswith(config["grafana"]["dashboardNamePrefix"])
    assert [link["type"] for link in d["links"]] == ["dashboards", "link", "link"]
    # The runbook (where the alerts' runbook_url points) and the bundle's alert rules.
    runbook, rules = d["links"][1:]
    assert config["runbookURLPattern"].startswith(runbook["url"] + "#"), runbook
    assert rules["url"].startswith("/alerting/list?search=label:component%3Dspecwatch"), rules
    assert len({x["uid"] for x in DASHBOARDS.values()}) == len(DASHBOARDS)
    assert len({x["title"] for x in DASHBOARDS.values()}) == len(DASHBOARDS)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_one_datasource_variable_used_by_every_panel_query_and_variable(name):
    d = DASHBOARDS[name]
    variables = d["templating"]["list"]
    ds_vars = [v for v in variables if v["type"] == "datasource"]
    assert len(ds_vars) == 1
    assert ds_vars[0]["name"] == "datasource" and ds_vars[0]["query"] == "prometheus"
    for p in _data_panels(d):
        assert p["datasource"] == DS_REF, p["title"]
        assert p["targets"], f"{p['title']}: no queries"
        for t in p["targets"]:
            assert t["datasource"] == DS_REF, p["title"]
    for v in variables:
        if v["type"] == "query":
            assert v["datasource"] == DS_REF, v["name"]
    for a in d["annotations"]["list"]:
        if not a.get("builtIn"):
            assert a["datasource"] == DS_REF, a["name"]
    # No other data source reference anywhere in the file (a hard-coded uid breaks imports).
    uids = set(re.findall(r'"uid": "([^"]*)"', mixin.dump_dashboard(d)))
    assert uids <= {"${datasource}", "-- Grafana --", d["uid"]}


@pytest.mark.parametrize(
    ("name", "required"),
    [
        (
            "specwatch-sd-overview.json",
            ["datasource", "job", "vllm_job", "target", "model_name", "vllm_instance", "engine",
             "window", "statistic", "quantile_bounds"],
        ),
        ("specwatch-exporter.json", ["datasource", "job", "target"]),
    ],
)
def test_variables(name, required):
    """job/target/model_name variables refresh on time range change and filter every query."""
    variables = {v["name"]: v for v in DASHBOARDS[name]["templating"]["list"]}
    assert list(variables) == required
    for v in variables.values():
        if v["type"] == "query":
            assert v["refresh"] == 2, v["name"]
            assert v.get("description"), v["name"]
    for where, expr in dashboard_exprs(name, DASHBOARDS[name]):
        if "panel" not in where:
            continue
        names = metric_names(expr)
        scrape = {"up", "scrape_duration_seconds"}
        if names & (exporter_metrics() | NOT_YET_EXPORTED | scrape):
            assert 'job=~"$job"' in expr, where
            per_instance = names <= scrape | {"specwatch_build_info"}
            assert per_instance or 'target=~"$target"' in expr, where
        if any(n.startswith("vllm:") for n in names):
            assert 'job=~"$vllm_job"' in expr and 'model_name=~"$model_name"' in expr, where


def _selectors(expr: str) -> list:
    from mixin_helpers import _walk, parse

    return [n for n in _walk(parse(expr)) if isinstance(n, promql_parser.VectorSelector)]


def _equal_matchers(selector: str) -> set[tuple[str, str]]:
    """{'job="vllm"'} -> {("job", "vllm")}: the configured selectors are equality matchers."""
    return set(re.findall(r'(\w+)="([^"]*)"', selector))


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panels_select_only_the_configured_jobs_whatever_all_expands_to(name):
    """With `$job` at All (`.+`), "Exporter instances up" counted every job
    Prometheus scrapes (6 where there were 3 exporters) and the scrape duration panel drew
    the vLLM jobs. Every selector of an exporter series (and of `up`,
    `scrape_duration_seconds`) carries the exporterSelector's matchers, every vLLM series
    the vllmSelector's, whatever the variable holds; and `$job`'s All is not `.+`. The
    recorded series are the whole fleet's (every engine records into them), so they do not
    carry the vllmSelector's."""
    config = mixin.default_config()
    exporter_sel = _equal_matchers(config["exporterSelector"])
    vllm_sel = _equal_matchers(config["vllmSelector"])
    assert exporter_sel and vllm_sel
    exporter_names = exporter_metrics() | NOT_YET_EXPORTED | {"up", "scrape_duration_seconds"}
    d = DASHBOARDS[name]
    for where, expr in dashboard_exprs(name, d):
        if "annotation" in where:
            continue
        for sel in _selectors(expr):
            eq = {(m.name, m.value) for m in sel.matchers.matchers if str(m.op) == "MatchOp.Equal"}
            if sel.name in exporter_names:
                assert exporter_sel <= eq, f"{where}: {sel.name} not scoped to the exporter job"
            elif sel.name.startswith("vllm:"):
                assert vllm_sel <= eq, f"{where}: {sel.name} not scoped to the vLLM job"
            elif sel.name in recorded_metrics():
                # Fleet-wide: every engine's recording rules record into these names.
                assert not eq & vllm_sel, f"{where}: {sel.name} scoped to the vLLM job"
    for v in d["templating"]["list"]:
        if v["name"] in ("job", "vllm_job"):
            assert v["includeAll"] and v.get("allValue") in (None, ""), v["name"]


def test_multi_cluster_adds_a_cluster_variable_and_filter():
    out = mixin.render({"showMultiCluster": True, "clusterLabel": "k8s_cluster"})
    d = out["dashboards"]["specwatch-sd-overview.json"]
    names = [v["name"] for v in d["templating"]["list"]]
    assert names[:2] == ["datasource", "cluster"]
    exprs = [t["expr"] for p in panels(d) for t in p.get("targets", [])]
    assert exprs and all('k8s_cluster=~"$cluster"' in e for e in exprs)
    default = DASHBOARDS["specwatch-sd-overview.json"]
    assert "cluster" not in [v["name"] for v in default["templating"]["list"]]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_panel_has_title_description_and_a_valid_unit(name):
    for p in _data_panels(DASHBOARDS[name]):
        assert p["title"], p
        assert len(p.get("description", "")) >= 40, f"{p['title']}: describe what the panel shows"
        unit = p["fieldConfig"]["defaults"].get("unit")
        assert unit in GRAFANA_UNITS, f"{p['title']}: unit {unit!r}"
        for o in p["fieldConfig"].get("overrides", []):
            for prop in o["properties"]:
                if prop["id"] == "unit":
                    assert prop["value"] in GRAFANA_UNITS, p["title"]
        if p["type"] == "heatmap":
            assert p["options"]["yAxis"]["unit"] in GRAFANA_UNITS


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_rates_use_rate_interval_and_counters_go_through_rate(name):
    """dashboard-linter's target-rate-interval-rule and target-counter-agg-rule. A range
    other than $__rate_interval is a lookback of an *_over_time function (a configured
    age, such as the measured bins' grafana.measuredBinMaxAge), never a rate's window."""
    for where, expr in dashboard_exprs(name, DASHBOARDS[name]):
        for func, window in re.findall(r"(\w+)\(\s*[^\[()]*\[([^\]]+)\]", expr):
            assert window == "$__rate_interval" or func.endswith("_over_time"), (
                f"{where}: {func}(...[{window}])")
        assert "[" not in re.sub(r"\w+\(\s*[^\[()]*\[[^\]]+\]", "", expr), where
        assert counters_outside_rate(expr) == set(), where


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_layout_ids_and_refids(name):
    """Panels fit the 24-column grid without overlapping; ids and refIds are unique."""
    d = DASHBOARDS[name]
    cells: dict[tuple[int, int], str] = {}
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids))
    for p in panels(d):
        g = p["gridPos"]
        assert 1 <= g["w"] <= 24 and g["h"] >= 1, p["title"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
        refs = [t["refId"] for t in p.get("targets", [])]
        assert len(refs) == len(set(refs)), p["title"]
        assert p["type"] == "row" or p.get("pluginVersion"), p["title"]


def _xychart() -> dict:
    d = DASHBOARDS["specwatch-sd-overview.json"]
    (xy,) = [p for p in panels(d) if p["type"] == "xychart"]
    return xy


def _display_names(xy: dict, labels: dict[str, str]) -> dict[str, str]:
    """refId -> the display name the panel's overrides give that query's field for a frame
    with these partition labels (Grafana's ${__field.labels.X} interpolation)."""
    out = {}
    for t in xy["targets"]:
        raw = f"Value #{t['refId']}"
        name = raw
        for o in xy["fieldConfig"]["overrides"]:
            m = o["matcher"]
            hit = (m["id"] == "byName" and m["options"] == raw) or (
                m["id"] == "byRegexp" and re.search(m["options"], raw))
            for prop in o["properties"] if hit else []:
                if prop["id"] == "displayName":
                    name = re.sub(r"\$\{__field\.labels\.(\w+)\}",
                                  lambda g: labels[g.group(1)], prop["value"])
        out[t["refId"]] = name
    return out


def _matched(matcher: dict, names: set[str]) -> set[str]:
    if matcher["id"] == "byName":
        return {n for n in names if n == matcher["options"]}
    assert matcher["id"] == "byRegexp", matcher
    return {n for n in names if re.search(matcher["options"], n)}


def test_speedup_xychart_names_every_target_and_shows_the_present():
    """Every target's points were named "predicted speedup" (a rename
    overrode the partition labels), x followed $window while y was the model's window, and
    the break-even markers were a cloud of past values. Now: instant table queries (the
    current point), no fixed rename, display names built from the target and model labels
    (distinct for two targets), x and y of the operating point from the same (model)
    window, and each series' matchers pick exactly one field of one query, whether Grafana
    matches the raw field name or the display name."""
    xy = _xychart()
    assert xy["pluginVersion"]
    assert all(t["format"] == "table" and t["instant"] is True for t in xy["targets"])
    assert [t["id"] for t in xy["transformations"]] == ["merge", "partitionByValues"]
    part = xy["transformations"][1]["options"]
    assert part["fields"] == ["target", "model_name"] and part["naming"]["asLabels"] is True
    exprs = {t["refId"]: t["expr"] for t in xy["targets"]}
    assert not any("$window" in e for e in exprs.values()), "x and y must share the model window"
    assert "on (job, instance, target, model_name, window) sd_model_valid" in exprs["A"]
    assert "sd_predicted_speedup" in exprs["B"] and "sd_breakeven_arrival_rate" in exprs["C"]
    a = _display_names(xy, {"target": "vllm-a", "model_name": "llama"})
    b = _display_names(xy, {"target": "vllm-b", "model_name": "llama"})
    assert set(a.values()).isdisjoint(b.values()), "two targets must not share a series name"
    for names in (a, b):
        raw = {f"Value #{r}" for r in names}
        for s in xy["options"]["series"]:
            for axis in ("x", "y"):
                m = s[axis]["matcher"]
                hits_raw = _matched(m, raw)
                hits_display = _matched(m, set(names.values()))
                assert len(hits_raw) == 1 and len(hits_display) == 1, (axis, m)
                (ref,) = [r for r in names if f"Value #{r}" in hits_raw]
                assert hits_display == {names[ref]}, (axis, m)
        assert "name" not in xy["options"]["series"][0], "a fixed name hides the target"
    # Lines: the break-even line (speedup 1), the model's curve and its 90% band (M, N).
    line = [o["matcher"]["options"] for o in xy["fieldConfig"]["overrides"]
            if {"id": "custom.show", "value": "lines"} in o["properties"]]
    assert sorted(line) == ["^Value #F( .*)?$", "^Value #L( .*)?$", "^Value #M( .*)?$",
                            "^Value #N( .*)?$"]


def test_speedup_xychart_series_name_their_frame():
    """Grafana's xychart (v2, 11.x on) skips a manual-mode series without a frame matcher,
    and its only frame matcher is byIndex (one frame per series config): without them the
    chart drew nothing. Every series role (x/y pair) is repeated once per frame index
    0..xyChartMaxFrames-1 (the partition makes one frame per target and model)."""
    xy = _xychart()
    assert xy["options"]["mapping"] == "manual"
    series = xy["options"]["series"]
    roles = {(s["x"]["matcher"]["options"], s["y"]["matcher"]["options"]) for s in series}
    frames = {s["frame"]["matcher"]["options"] for s in series}
    assert all(s["frame"]["matcher"]["id"] == "byIndex" for s in series)
    assert frames == set(range(8)) and len(roles) == 8
    assert len(series) == len(roles) * len(frames)
    assert {(s["x"]["matcher"]["options"], s["y"]["matcher"]["options"],
             s["frame"]["matcher"]["options"]) for s in series} == {
        (x, y, i) for x, y in roles for i in frames}


def test_speedup_xychart_draws_the_model_curve():
    """The chart had no model curve. Now one line per target and model
    through the exporter's curve points: x the grid's arrival rates, y the predicted speedup
    there, joined on the `point` label (the merge pairs the two queries' rows), the x query
    sorted by rate so that the line is drawn left to right, and no `$window` (the curve
    comes from the model's window, like the operating point)."""
    xy = _xychart()
    exprs = {t["refId"]: t["expr"] for t in xy["targets"]}
    pairs = sorted({(s["x"]["matcher"]["options"], s["y"]["matcher"]["options"])
                    for s in xy["options"]["series"]})
    ((x, y),) = [(a, b) for a, b in pairs if "model curve" in b]
    x_ref = re.search(r"Value #(\w)", x).group(1)
    y_ref = re.search(r"Value #(\w)", y).group(1)
    assert re.fullmatch(r"sort\(max by \(target, model_name, point\) "
                        r"\(sd_model_curve_arrival_rate\{[^}]*\}\)\)", exprs[x_ref])
    assert re.fullmatch(r"max by \(target, model_name, point\) "
                        r"\(sd_model_speedup_curve\{[^}]*\}\)", exprs[y_ref])
    assert x_ref < y_ref, "the sorted x query's rows come first in the merge"
    assert "$window" not in exprs[x_ref] + exprs[y_ref]
    units = {o["matcher"]["options"]: o["properties"] for o in xy["fieldConfig"]["overrides"]}
    assert {"id": "unit", "value": "reqps"} in units[f"^Value #{x_ref}( .*)?$"]


def test_speedup_xychart_and_panel_draw_the_90_percent_band():
    """The model curve's 90% interval: the lower and upper curve gauges on the same x (the
    grid's arrival rates, joined on `point`), drawn as thin dashed lines; the predicted
    speedup panel draws sd_predicted_speedup_lower/_upper beside the point series."""
    xy = _xychart()
    exprs = {t["refId"]: t["expr"] for t in xy["targets"]}
    pairs = {(s["x"]["matcher"]["options"], s["y"]["matcher"]["options"])
             for s in xy["options"]["series"]}
    curve_x = next(x for x, y in pairs if y.endswith("\\(model curve\\))$"))
    for ref, bound in (("M", "lower"), ("N", "upper")):
        assert re.fullmatch(r"max by \(target, model_name, point\) "
                            rf"\(sd_model_speedup_curve_{bound}\{{[^}}]*\}}\)", exprs[ref])
        assert any(x == curve_x and f"Value #{ref}" in y for x, y in pairs)
    d = DASHBOARDS["specwatch-sd-overview.json"]
    (panel,) = [p for p in panels(d) if p.get("title") == "Predicted speedup"]
    got = [t["expr"] for t in panel["targets"]]
    assert any(e.startswith("sd_predicted_speedup_lower{") for e in got)
    assert any(e.startswith("sd_predicted_speedup_upper{") for e in got)
    dashed = [o for o in panel["fieldConfig"]["overrides"]
              if re.search(o["matcher"]["options"], "a · m (90% upper)")]
    assert dashed and not re.search(dashed[0]["matcher"]["options"], "a · m")


def test_heatmap_reads_histogram_buckets():
    d = DASHBOARDS["specwatch-sd-overview.json"]
    (hm,) = [p for p in panels(d) if p["type"] == "heatmap"]
    (t,) = hm["targets"]
    assert t["format"] == "heatmap" and t["legendFormat"] == "{{le}}"
    assert "sd_acceptance_rate_samples_bucket" in t["expr"] and "sum by (le)" in t["expr"]
    assert hm["options"]["calculate"] is False


def _enclosing_rows(d: dict) -> dict[int, dict]:
    """panel id -> the row it sits under (top-level layout: a row owns the panels after it)."""
    out, row = {}, None
    for p in d["panels"]:
        if p["type"] == "row":
            row = p
            for inner in p.get("panels", []):
                out[inner["id"]] = p
        elif row is not None:
            out[p["id"]] = row
    return out


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_no_panel_sums_distributions_of_several_targets_or_models(name):
    """The acceptance heatmap summed every selected target (`sum by (le)`),
    so several unimodal targets drew a multi-band picture that reads as bimodal. A panel
    that aggregates away target or model_name (a heatmap, a stat of one number) must get
    one value of each from a repeat: the panel's own or its row's."""
    d = DASHBOARDS[name]
    rows = _enclosing_rows(d)
    for p in _data_panels(d):
        if p["type"] != "heatmap":
            continue
        repeats = {p.get("repeat"), rows.get(p["id"], {}).get("repeat")}
        for label in ("target", "model_name"):
            for t in p["targets"]:
                grouped = re.search(r"by \(([^)]*)\)", t["expr"])
                kept = grouped and label in grouped.group(1)
                assert kept or label in repeats, f"{p['title']}: sums over several {label}s"
        assert "$model_name" in p["title"] or p.get("repeat") is None


def test_acceptance_panel_draws_the_alert_threshold():
    """The 0.4 line on the acceptance panel is the alert's threshold from the same config,
    drawn beside the α the alert reads and vLLM's rate."""
    d = DASHBOARDS["specwatch-sd-overview.json"]
    (p,) = [p for p in panels(d) if p["title"] == "Acceptance α and rate"]
    assert {"sd_acceptance_alpha", "sd_acceptance_rate"} <= _reads(p)
    steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
    threshold = mixin.default_config()["alerts"]["SDAcceptanceRateLow"]["threshold"]
    assert steps[1]["value"] == threshold == 0.4
    assert p["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] != "off"


def test_every_promql_expression_parses_in_prometheus(tmp_path):
    """Dashboards (Grafana variables substituted), variable selectors, annotations, recording
    rules and alerts: each loaded by `promtool check rules`, i.e. Prometheus' own parser."""
    exprs = all_mixin_exprs()
    assert len(exprs) > 50
    proc = promtool_check_exprs(exprs, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in proc.stdout


def test_the_parse_check_rejects_a_broken_expression(tmp_path):
    """The check above can fail: an unbalanced expression is reported by promtool."""
    broken = "sum(rate(vllm:generation_tokens_total[$__rate_interval])"
    proc = promtool_check_exprs([("broken", broken)], tmp_path)
    assert proc.returncode != 0
    assert "unclosed left parenthesis" in proc.stdout + proc.stderr


def test_every_metric_read_is_produced_by_vllm_the_exporter_or_the_rules():
    """A renamed or misspelt metric would leave a panel or an alert silently empty. vLLM names
    come from real vLLM /metrics pages (tests/fixtures), the other engines' from their fixture
    pages, the exporter's from its metrics reference, recorded names from the generated rules,
    plus the series Prometheus writes and the model/controller series the exporter does not
    produce yet (NOT_YET_EXPORTED)."""
    vllm = vllm_metrics()
    assert "vllm:spec_decode_num_drafts_total" in vllm
    assert "vllm:e2e_request_latency_seconds_bucket" in vllm
    exporter = exporter_metrics()
    assert {"sd_acceptance_rate", "specwatch_target_up", "sd_acceptance_rate_samples_bucket"} <= (
        exporter
    )
    assert {"trtllm_spec_decode_drafted_tokens_total",
            "llamacpp:spec_decode_num_drafts_total"} <= engine_metrics()
    known = (vllm | engine_metrics() | exporter | NOT_YET_EXPORTED | recorded_metrics()
             | PROMETHEUS_METRICS | OLDER_VLLM_METRICS)
    unknown = {}
    for where, expr in all_mixin_exprs():
        missing = metric_names(expr) - known
        if missing:
            unknown[where] = sorted(missing)
    assert unknown == {}


def test_older_vllm_names_are_only_fallbacks_of_current_ones():
    """A pre-0.11 vLLM name is read only beside its current name (`current or older`), never
    alone, and is really gone from the current pages."""
    assert OLDER_VLLM_METRICS.isdisjoint(vllm_metrics())
    for where, expr in all_mixin_exprs():
        names = metric_names(expr)
        if names & OLDER_VLLM_METRICS:
            assert names & vllm_metrics(), where
            assert " or " in expr, where


def test_not_yet_exported_list_only_holds_series_the_exporter_lacks():
    """Once the exporter documents a series, it must come off the pending list (so a later
    rename in the exporter is caught by the test above)."""
    assert NOT_YET_EXPORTED & exporter_metrics() == set()


# --- what an operator needs on one screen ---------------------------------------------------


def _titles_by_row(d: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    current = ""
    for p in d["panels"]:
        if p["type"] == "row":
            current = p["title"]
            out[current] = list(p.get("panels", []))
        else:
            out.setdefault(current, []).append(p)
    return out


def _reads(p: dict) -> set[str]:
    return set().union(*(metric_names(t["expr"]) for t in p["targets"]))


def test_acceptance_now_colours_only_the_alerts_measure():
    """"Acceptance now" shows the α beside vLLM's rate; the threshold colours the α only
    (the rate falls with k by construction, so 0.4 means nothing for it)."""
    d = DASHBOARDS["specwatch-sd-overview.json"]
    (p,) = [p for p in panels(d) if p["title"] == "Acceptance now"]
    legends = {t["legendFormat"]: t["expr"] for t in p["targets"]}
    assert any(e.startswith("sd_acceptance_alpha{") and f.endswith(" α")
               for f, e in legends.items())
    assert any(e.startswith("sd_acceptance_rate{") and f.endswith(" rate")
               for f, e in legends.items())
    (override,) = p["fieldConfig"]["overrides"]
    assert override["matcher"] == {"id": "byRegexp", "options": ".* rate$"}
    assert override["properties"] == [
        {"id": "color", "value": {"mode": "fixed", "fixedColor": "blue"}}]
    for desc in (p["description"], next(q["description"] for q in panels(d)
                                        if q["title"] == "Acceptance α and rate")):
        assert "falls with the draft length k" in desc


def test_top_row_answers_is_sd_paying_off_now():
    """The first row: measured acceptance, predicted speedup with its validity, headroom to
    break-even (lambda*/lambda over the same window), and the specwatch alerts firing for
    the selected targets."""
    d = DASHBOARDS["specwatch-sd-overview.json"]
    first_row = d["panels"][0]
    assert first_row["type"] == "row"
    top = _titles_by_row(d)[first_row["title"]]
    reads = [_reads(p) for p in top]
    assert {"sd_acceptance_alpha", "sd_acceptance_rate"} in reads
    assert {"sd_predicted_speedup", "sd_model_valid"} in reads
    # Headroom to the break-even and, named apart, to SD's throughput ceiling.
    both = {"sd_breakeven_arrival_rate", "sd_throughput_ceiling_arrival_rate", "sd_arrival_rate"}
    assert both in reads
    assert {"ALERTS"} in reads
    (headroom,) = [p for p in top if _reads(p) == both]
    exprs = [tg["expr"] for tg in headroom["targets"]]
    assert len(exprs) == 2 and "sd_breakeven_arrival_rate" in exprs[0]
    assert "sd_throughput_ceiling_arrival_rate" in exprs[1]
    assert all("on (job, instance, target, model_name, window)" in e for e in exprs)
    (speedup,) = [p for p in top if "sd_model_valid" in _reads(p)]
    mapped = [prop["value"] for o in speedup["fieldConfig"]["overrides"]
              for prop in o["properties"] if prop["id"] == "mappings"]
    assert mapped and mapped[0][0]["options"]["0"]["text"] == "invalid"


def test_serving_context_row_reads_vllm_throughput_latency_and_cache():
    d = DASHBOARDS["specwatch-sd-overview.json"]
    rows = _titles_by_row(d)
    (name,) = [r for r in rows if r.startswith("Serving context")]
    reads = set().union(*(_reads(p) for p in rows[name]))
    recorded = recorded_metrics()
    for needed in ("vllm:generation_tokens_total", "vllm:request_queue_time_seconds_bucket",
                   "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
                   "vllm:request_time_per_output_token_seconds_bucket"):
        assert needed in reads, needed
    assert {r for r in reads if r in recorded} >= {
        "model_name:vllm_spec_decode_num_accepted_tokens:rate5m",
        "model_name:vllm_spec_decode_num_draft_tokens:rate5m",
    }


def test_panels_use_the_recording_rules_instead_of_recomputing_them():
    """The recording rules were used by no panel: a panel that needs what a rule records
    reads the rule, and most rules are on a panel. The per-engine panels are the exception:
    the rules sum over instances and engines, and those panels filter or split by them."""
    counters = {
        "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_drafts_total", "vllm:request_success_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    }
    used = set()
    for name, d in DASHBOARDS.items():
        for where, expr in dashboard_exprs(name, d):
            if 'engine=~"$engine"' in expr:
                continue
            assert not metric_names(expr) & counters, f"{where} recomputes a recording rule"
            used |= metric_names(expr) & recorded_metrics()
    unused = recorded_metrics() - used
    # The rate of verification steps only feeds the ratios.
    assert unused <= {"model_name:vllm_spec_decode_num_drafts:rate5m"}, unused


def test_alert_annotations_are_scoped_to_the_selected_target_and_model():
    d = DASHBOARDS["specwatch-sd-overview.json"]
    anns = {a["name"]: a for a in d["annotations"]["list"] if not a.get("builtIn")}
    assert set(anns) == {"specwatch alerts", "model invalid"}
    # ALERTS of exporter-level alerts have no target/model label: the empty alternative
    # keeps them on every selection.
    alerts = anns["specwatch alerts"]["expr"]
    assert 'target=~"${target:regex}|"' in alerts
    assert 'model_name=~"${model_name:regex}|"' in alerts
    invalid = anns["model invalid"]["expr"]
    assert 'target=~"$target"' in invalid and 'model_name=~"$model_name"' in invalid
