"""What vLLM's own speculative-decoding dashboard shows, the SD overview shows too, under the
same filters; and its variables offer only choices that mean something.

vLLM's dashboard (examples/observability/dashboards/grafana/vllm_speculative_decoding.json
in vllm-project/vllm, commit b29712c6b2ed0daa860e65e2bbb8cd73365efbf8) filters by instance
and engine and draws the share of output from drafts, acceptance per engine, and proposed
tokens and drafts per second; tests/app/test_demo_story.py checks that the values agree
within 1% on the demo's data.
"""

from __future__ import annotations

from mixin_helpers import load_dashboards, metric_names, panels

from specwatch.mixin import render as mixin_render

SD = "specwatch-sd-overview.json"


def _panel(title: str) -> dict:
    [p] = [p for p in panels(load_dashboards()[SD]) if p.get("title") == title]
    return p


def test_parity_panels_read_vllms_counters_under_the_instance_and_engine_filters() -> None:
    wanted = {
        "Output tokens from drafts": {"vllm:spec_decode_num_accepted_tokens_total",
                                      "vllm:generation_tokens_total"},
        "Acceptance per engine": {"vllm:spec_decode_num_accepted_tokens_per_pos_total",
                                  "vllm:spec_decode_num_drafts_total",
                                  "vllm:spec_decode_num_accepted_tokens_total",
                                  "vllm:spec_decode_num_draft_tokens_total"},
        "Drafts and proposed draft tokens per second": {
            "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_drafts_total"},
    }
    for title, names in wanted.items():
        p = _panel(title)
        assert set().union(*(metric_names(t["expr"]) for t in p["targets"])) == names, title
        for t in p["targets"]:
            assert 'instance=~"$vllm_instance", engine=~"$engine"' in t["expr"], (title, t)
    legends = [t["legendFormat"] for t in _panel("Acceptance per engine")["targets"]]
    assert all("{{instance}}" in x and "{{engine}}" in x for x in legends), legends
    # α leads, vLLM's rate beside it.
    assert legends[0].endswith(" α") and legends[1].endswith(" rate"), legends


def test_no_panel_draws_the_same_line_twice() -> None:
    """Within a panel every query has its own legend, so no two lines share a name."""
    for name, d in load_dashboards().items():
        for p in panels(d):
            legends = [t.get("legendFormat", "") for t in p.get("targets", [])]
            named = [x for x in legends if x]
            assert len(named) == len(set(named)), (name, p.get("title"), legends)


def _variables(dashboard: dict) -> dict[str, dict]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def test_variables_list_only_values_under_the_configured_selectors() -> None:
    """Every query variable's series selector starts from the configured selector; a job
    variable whose selector pins the job (job="...") is hidden, since it can list nothing
    else; with a selector that does not pin it, it is shown."""
    for name, d in load_dashboards().items():
        for v in _variables(d).values():
            if v["type"] == "query":
                assert 'job="specwatch"' in v["query"] or 'job="vllm"' in v["query"], (name, v)
        assert _variables(d)["job"]["hide"] == 2, name
    assert _variables(load_dashboards()[SD])["vllm_job"]["hide"] == 2
    rendered = mixin_render.render({"exporterSelector": 'namespace="llm"',
                                    "vllmSelector": 'namespace="llm", container="vllm"'})
    shown = _variables(rendered["dashboards"][SD])
    assert shown["job"]["hide"] == 0 and shown["vllm_job"]["hide"] == 0
    assert 'namespace="llm"' in shown["engine"]["query"]
