"""The simulator's /metrics page has vLLM 0.33's shape: what a real server with SD exposes.

Compared family by family with the constructed vLLM 0.33 page
(tests/fixtures/constructed/vllm-0.33-spec-decode.prom) and the real vLLM 0.32 pages: the
same family names, types, label names and histogram bucket bounds, counters with ``_created``
samples as a single API server has them, and the text and OpenMetrics encodings
prometheus_client negotiates for Prometheus.
"""

from __future__ import annotations

import pytest
from helpers.paths import FIXTURES
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as om_families,
)
from prometheus_client.parser import text_string_to_metric_families

from specwatch.model.closed_form import Coefficients
from specwatch.sim.distributions import AcceptanceDist, LengthDist
from specwatch.sim.scenario import (
    ModelSpec,
    Phase,
    RateProfile,
    Scenario,
    load_scenario,
)
from specwatch.sim.server import render_page
from specwatch.sim.simulation import Simulation

FIXTURES = FIXTURES
CONSTRUCTED = FIXTURES / "constructed" / "vllm-0.33-spec-decode.prom"
REAL_032 = sorted((FIXTURES / "vllm-0.32-cpu-ngram").glob("snap_*.prom"))

COEF = Coefficients(a_p=0.025, b_p=0.002, a_v=0.012, b_v=0.00015, a_d=0.0006, b_d=0.00025)

# Families a vLLM 0.32 page has that the simulator leaves out, and why: the MFU estimates
# exist only with --enable-mfu-metrics style flags on 0.32 and are absent from the 0.33
# page; the other http_* families come from prometheus-fastapi-instrumentator and describe
# the API server's HTTP traffic, not the engine (the simulator keeps http_requests_total).
NOT_SIMULATED = {
    name + suffix
    for name in ("vllm:estimated_flops_per_gpu", "vllm:estimated_read_bytes_per_gpu",
                 "vllm:estimated_write_bytes_per_gpu", "http_request_size_bytes",
                 "http_response_size_bytes", "http_request_duration_highr_seconds",
                 "http_request_duration_seconds")
    for suffix in ("", "_created")
}


def shape(text: str) -> dict[str, tuple[str, frozenset[str], tuple[str, ...]]]:
    """family name -> (type, label names without le, bucket bounds) of a text page."""
    out = {}
    for fam in text_string_to_metric_families(text):
        labels: set[str] = set()
        bounds: list[str] = []
        for s in fam.samples:
            labels |= set(s.labels) - {"le"}
            if s.name.endswith("_bucket") and s.labels["le"] not in bounds:
                bounds.append(s.labels["le"])
        out[fam.name] = (fam.type, frozenset(labels), tuple(bounds))
    return out


def one_model_scenario(k: int = 3, engines: int = 1, max_model_len: int = 8192) -> Scenario:
    phase = Phase("steady", 60.0, RateProfile(4.0, 4.0), AcceptanceDist("fixed", value=0.7),
                  LengthDist("fixed", value=300), LengthDist("fixed", value=100))
    model = ModelSpec("meta-llama/Llama-3.1-8B-Instruct", (phase,), num_speculative_tokens=k,
                      engines=engines, max_model_len=max_model_len, coefficients=COEF)
    return Scenario((model,), seed=3)


def render(sim: Simulation, accept: str = "text/plain") -> str:
    return render_page(sim, accept)[0].decode()


@pytest.fixture(scope="module")
def page() -> str:
    sim = Simulation(one_model_scenario())
    sim.advance_to(60.0)
    return render(sim)


def test_same_families_types_labels_buckets_as_vllm_033(page: str) -> None:
    """Every family of the vLLM 0.33 page exists on the simulator's page with the same type,
    label names and bucket bounds (max_model_len 8192 → request-token buckets 1..5000)."""
    want = shape(CONSTRUCTED.read_text())
    got = shape(page)
    missing = sorted(set(want) - set(got))
    assert not missing, f"families missing from the simulator page: {missing}"
    for name, (ftype, labels, bounds) in want.items():
        assert got[name][0] == ftype, f"{name}: type {got[name][0]} != {ftype}"
        assert got[name][1] == labels, f"{name}: labels {sorted(got[name][1])} != {sorted(labels)}"
        assert got[name][2] == bounds, f"{name}: buckets {got[name][2]} != {bounds}"


def test_no_family_that_vllm_does_not_have(page: str) -> None:
    """Nothing on the simulator page is foreign to vLLM: every family is on the 0.33 page or
    on a real 0.32 page (cache_config_info, process and python collectors), with the 0.32
    page's labels where the 0.33 fixture does not have the family."""
    known = shape(CONSTRUCTED.read_text())
    real = shape(REAL_032[10].read_text())
    for name, (ftype, labels, _) in shape(page).items():
        ref = known.get(name) or real.get(name)
        assert ref is not None, f"{name} is on no vLLM page"
        assert ref[0] == ftype and ref[1] == labels, f"{name}: {ftype} {sorted(labels)}"
    assert set(real) - set(shape(page)) == NOT_SIMULATED


def test_help_texts_match_vllm(page: str) -> None:
    """HELP strings are vLLM's, so a human diffing the pages sees no difference either."""
    constructed = text_string_to_metric_families(CONSTRUCTED.read_text())
    want = {f.name: f.documentation for f in constructed}
    for fam in text_string_to_metric_families(page):
        if fam.name in want:
            assert fam.documentation == want[fam.name], fam.name


def test_created_samples_like_a_single_api_server(page: str) -> None:
    """Counters and histograms carry *_created gauges (single-process vLLM does), gauges none."""
    families = {f.name: f for f in text_string_to_metric_families(page)}
    for base in ("vllm:spec_decode_num_drafts", "vllm:request_success",
                 "vllm:e2e_request_latency_seconds", "vllm:iteration_tokens_total"):
        created = families[base + "_created"]
        assert created.type == "gauge"
        assert all(s.value > 1.7e9 for s in created.samples)
    assert "vllm:num_requests_running_created" not in families


def test_position_series_equal_k_and_sd_families_absent_without_sd() -> None:
    """k position series exist from the start (vLLM creates them at startup); with SD off
    (k = 0) the four spec_decode families are absent, as without --speculative-config."""
    for k in (1, 5):
        sim = Simulation(one_model_scenario(k=k))
        text = render(sim)  # before any request
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        positions = {s.labels["position"] for s in
                     fams["vllm:spec_decode_num_accepted_tokens_per_pos"].samples
                     if s.name.endswith("_total")}
        assert positions == {str(i) for i in range(k)}
    sim = Simulation(one_model_scenario(k=0))
    sim.advance_to(20.0)
    names = {f.name for f in text_string_to_metric_families(render(sim))}
    assert not [n for n in names if n.startswith("vllm:spec_decode")]
    assert "vllm:e2e_request_latency_seconds" in names


def test_request_token_buckets_follow_max_model_len() -> None:
    """vLLM's 1-2-5 request-token buckets stop at max_model_len (131072 → ..., 100000)."""
    sim = Simulation(one_model_scenario(max_model_len=131072))
    got = shape(render(sim))["vllm:request_prompt_tokens"][2]
    assert got[-3:] == ("50000.0", "100000.0", "+Inf")


def test_engines_are_labelled_and_openmetrics_is_negotiated() -> None:
    """Two data-parallel engines give engine="0"/"1" series; /metrics negotiates OpenMetrics
    like vLLM's prometheus_client app. With Prometheus 3's Accept header (UTF-8 names
    allowed) the strict OpenMetrics parser reads the colon names back. (Prometheus 2.x asks
    without an escaping scheme, and prometheus_client >= 0.22 then writes the sample names
    with underscores: client_python#1177. Real vLLM pages do the same; specwatch's scrape
    configs rename vllm_* back to vllm:*.)"""
    sim = Simulation(one_model_scenario(engines=2))
    sim.advance_to(30.0)
    fams = {f.name: f for f in text_string_to_metric_families(render(sim))}
    engines = {s.labels["engine"] for s in fams["vllm:request_success"].samples}
    assert engines == {"0", "1"}
    body, content_type = render_page(
        sim, "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8")
    assert content_type.startswith("application/openmetrics-text")
    parsed = {f.name for f in om_families(body.decode())}
    assert {"vllm:spec_decode_num_drafts", "vllm:e2e_request_latency_seconds"} <= parsed


def test_packaged_demo_scenario_page_shape() -> None:
    """The demo scenario (packaged files, params loaded through specwatch.model.params) renders
    the same family set as the hand-built one."""
    demo = Simulation(load_scenario("demo"))
    demo.advance_to(30.0)
    built = Simulation(one_model_scenario())
    built.advance_to(30.0)
    assert set(shape(render(demo))) == set(shape(render(built)))
