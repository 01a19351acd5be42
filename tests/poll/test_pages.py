"""Constructed pages: V0 engine, several engines, several models, SGLang; and the exporter's
output over all of them passes `promtool check metrics` in both exposition formats."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
from helpers.paths import FIXTURES
from helpers.ring import entry
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from specwatch.expose.collector import SpecwatchCollector
from specwatch.poll import sources
from specwatch.poll.pipeline import Pipeline, PollResult
from specwatch.poll.windows import derive, history

CONSTRUCTED = FIXTURES / "constructed"
A = "meta-llama/Llama-3.1-8B-Instruct"
B = "qwen/Qwen3-8B"


def raw_sum(text: str, name: str, **labels: str) -> float:
    """Sum of a sample over every series carrying ``labels`` (plain regex, no specwatch)."""
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", text, re.M):
        if all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


def zeroed(text: str) -> str:
    return re.sub(r"^(\S+(?:_total|_sum|_count|_bucket)(?:\{[^}]*\})?) \S+$", r"\1 0.0", text,
                  flags=re.M)


def one_hour(text: str) -> dict[str, object]:
    """Derived 1h window between a just-started copy of the page and the page."""
    h = history.TargetHistory(7200, 100, 50)
    h.update(sources.parse_page(zeroed(text)), 0.0)
    h.update(sources.parse_page(text), 3600.0)
    cfg = derive.DeriveConfig(windows=(("1h", 3600.0),))
    return {m: derive.derive_model(mh, cfg, "x") for m, mh in h.models.items()}


def test_generated_pages_are_current():
    """The committed derived pages are exactly what build_pages.py makes from definitions."""
    sys.path.insert(0, str(CONSTRUCTED))
    try:
        import build_pages
    finally:
        sys.path.remove(str(CONSTRUCTED))
    for fname, build in build_pages.PAGES.items():
        assert (CONSTRUCTED / fname).read_text() == build(), f"regenerate {fname}"


def test_multi_engine_page_sums_over_engines():
    text = (CONSTRUCTED / "vllm-0.33-multi-engine.prom").read_text()
    page = sources.parse_page(text)
    assert page.configured_k == {A: 3}, "k counts positions, not position x engine"
    w = one_hour(text)[A].window("1h")
    acc = raw_sum(text, "vllm:spec_decode_num_accepted_tokens_total")
    tok = raw_sum(text, "vllm:spec_decode_num_draft_tokens_total")
    drafts = raw_sum(text, "vllm:spec_decode_num_drafts_total")
    assert raw_sum(text, "vllm:spec_decode_num_drafts_total", engine="1") > 0
    assert w.values[derive.ACCEPTANCE_RATE] == pytest.approx(acc / tok)
    assert w.values[derive.ACCEPTANCE_LENGTH] == pytest.approx(1 + acc / drafts)
    assert w.values[derive.ARRIVAL_RATE] == pytest.approx(
        raw_sum(text, "vllm:request_success_total") / 3600)
    p1 = raw_sum(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position="1")
    assert w.positions[derive.POSITION_ACCEPTANCE_RATE]["1"] == pytest.approx(p1 / drafts)


def test_one_engine_restart_on_real_page_is_counted_per_series():
    """Engine 1 restarts and climbs to 10% of its old values while engine 0 does 1% more
    work: delta = engine 0's increase + engine 1's whole new value; one reset."""
    text = (CONSTRUCTED / "vllm-0.33-multi-engine.prom").read_text()

    def bump(line: str) -> str:
        m = re.match(r"^(vllm:[^{ ]+(?:_total|_count|_sum|_bucket))(\{[^}]*\}) (\S+)$", line)
        if not m:
            return line
        v = float(m.group(3))
        v = v * 0.1 if 'engine="1"' in m.group(2) else v * 1.01
        return f"{m.group(1)}{m.group(2)} {v!r}"

    later = "\n".join(bump(x) for x in text.splitlines()) + "\n"
    h = history.TargetHistory(7200, 100, 50)
    h.update(sources.parse_page(text), 0.0)
    assert h.update(sources.parse_page(later), 60.0)
    assert h.resets_total == 1
    got = entry(h.models[A].entries, -1).counters[(sources.DRAFTS, None)]
    e0 = raw_sum(text, "vllm:spec_decode_num_drafts_total", engine="0")
    e1_new = raw_sum(later, "vllm:spec_decode_num_drafts_total", engine="1")
    assert got == pytest.approx(e0 * 0.01 + e1_new)


def test_multi_model_page_keeps_models_apart():
    text = (CONSTRUCTED / "vllm-0.33-multi-model.prom").read_text()
    snaps = one_hour(text)
    assert set(snaps) == {A, B}
    for model in (A, B):
        w = snaps[model].window("1h")
        acc = raw_sum(text, "vllm:spec_decode_num_accepted_tokens_total", model_name=model)
        tok = raw_sum(text, "vllm:spec_decode_num_draft_tokens_total", model_name=model)
        assert w.values[derive.ACCEPTANCE_RATE] == pytest.approx(acc / tok)
        assert snaps[model].configured_k == 3
    ra = snaps[A].window("1h").values[derive.ACCEPTANCE_RATE]
    rb = snaps[B].window("1h").values[derive.ACCEPTANCE_RATE]
    assert rb == pytest.approx(ra / 2, rel=1e-3)


def test_v0_engine_page_gives_acceptance_rate_only():
    """V0: accepted/draft tokens is available; no drafts counter, so acceptance length,
    draft length, α and per-position are absent (not 0); load signals work."""
    text = (CONSTRUCTED / "vllm-0.9-v0-spec-decode.prom").read_text()
    page = sources.parse_page(text)
    assert page.engine == "vllm-v0"
    model = "facebook/opt-6.7b"
    snap = one_hour(text)[model]
    v = snap.window("1h").values
    assert v[derive.ACCEPTANCE_RATE] == pytest.approx(22000 / 40000)
    for absent in (derive.ACCEPTANCE_LENGTH, derive.DRAFT_LENGTH,
                   derive.TOKEN_ACCEPTANCE_PROBABILITY, derive.ACCEPTANCE_HETEROGENEITY):
        assert absent not in v
    assert not snap.window("1h").positions
    assert snap.configured_k is None
    assert v[derive.ARRIVAL_RATE] == pytest.approx(1000 / 3600)
    assert v[derive.MEAN_LATENCY_SECONDS] == pytest.approx(1.5)
    assert v[derive.MEAN_GENERATION_TOKENS] == pytest.approx(33.0)


ALL_PAGES = ["vllm-0.33-spec-decode.prom", "vllm-0.33-multi-engine.prom",
             "vllm-0.33-multi-model.prom", "vllm-0.9-v0-spec-decode.prom",
             "sglang-0.5.23-spec.prom"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
@pytest.mark.parametrize("fmt", ["text", "openmetrics"])
def test_exporter_output_over_every_page_passes_promtool(fmt):
    """Five targets (one per constructed page, plus one down): the rendered output has
    every derived family, no duplicate series, and passes `promtool check metrics`."""
    targets = [(f"t{i}", "auto") for i in range(len(ALL_PAGES))] + [("down", "auto")]
    p = Pipeline(targets, derive.DeriveConfig(count_window=100), 5.0)
    for i, name in enumerate(ALL_PAGES):
        text = (CONSTRUCTED / name).read_text()
        p.apply(PollResult(f"t{i}", 0.0, 0.0, 0.01, zeroed(text)))
        p.apply(PollResult(f"t{i}", 3600.0, 3600.0, 0.02, text))
    p.apply(PollResult("down", 1.0, 1.0, 3.0, error_reason="timeout", error_message="x"))
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SpecwatchCollector(lambda: p.snapshot))
    out = (generate_latest(reg) if fmt == "text" else generate_openmetrics(reg)).decode()
    for family in ("sd_acceptance_rate", "sd_acceptance_length", "sd_draft_length",
                   "sd_draft_length_configured", "sd_token_acceptance_probability",
                   "sd_position_acceptance_rate", "sd_arrival_rate", "sd_effective_batch_size",
                   "sd_mean_prompt_tokens", "sd_mean_generation_tokens",
                   "sd_mean_latency_seconds", "sd_acceptance_rate_samples",
                   "sd_acceptance_heterogeneity", "specwatch_target_up",
                   "specwatch_build_info", "specwatch_target_poll_errors"):
        assert re.search(rf"^# TYPE {family}(_total)? ", out, re.M), family
    assert 'target="down"' in out and 'sd_acceptance_rate{model_name="' in out
    assert not re.search(r'^sd_\w+\{[^}]*target="down"', out, re.M)
    if fmt == "text":
        check = subprocess.run(["promtool", "check", "metrics"], input=out,
                               capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stdout + check.stderr
    else:
        assert out.endswith("# EOF\n")
        from prometheus_client.openmetrics.parser import text_string_to_metric_families

        assert list(text_string_to_metric_families(out))  # strict OpenMetrics parser
