"""sources: the name mapping on real-shaped pages of each engine (v1, SGLang)."""

from __future__ import annotations

import re

import pytest
from helpers.paths import FIXTURES

from specwatch.poll import sources
from specwatch.poll.windows import derive, history

FIX = FIXTURES


def zeroed(text: str) -> str:
    """The same page as a server that has just started: every counter/histogram at 0."""
    out = []
    for line in text.splitlines():
        if not line.startswith("#") and re.match(r"^\S+(_total|_sum|_count|_bucket)[{ ]", line):
            line = re.sub(r" \S+$", " 0.0", line)
        out.append(line)
    return "\n".join(out) + "\n"


def windows_of(text: str, engine: str = "auto", span: float = 3600.0):
    """Derive one window between a zeroed copy of the page and the page itself."""
    h = history.TargetHistory(7200, 100, 50)
    h.update(sources.parse_page(zeroed(text), engine), 0.0)
    h.update(sources.parse_page(text, engine), span)
    snaps = {m: derive.derive_model(mh, derive.DeriveConfig(windows=(("1h", span),)), "x")
             for m, mh in h.models.items()}
    return {m: s.window("1h") for m, s in snaps.items()}, snaps


def test_vllm_033_page_gives_the_documented_values():
    """The constructed vLLM 0.33 page: acceptance 0.510, draft length 3, acceptance length
    2.530, per-position 0.780/0.484/0.266, k = 3, α ≈ 0.699 (fixture README)."""
    text = (FIX / "constructed" / "vllm-0.33-spec-decode.prom").read_text()
    page = sources.parse_page(text)
    assert page.engine == "vllm"
    model = "meta-llama/Llama-3.1-8B-Instruct"
    assert page.configured_k == {model: 3}
    assert not any(sig.endswith("_created") for _, sig, _ in page.counters)
    w, snaps = windows_of(text)
    v = w[model].values
    assert v[derive.ACCEPTANCE_RATE] == pytest.approx(986359 / 1933518)
    assert round(v[derive.ACCEPTANCE_RATE], 3) == 0.510
    assert v[derive.DRAFT_LENGTH] == pytest.approx(3.0, abs=1e-3)
    assert round(v[derive.ACCEPTANCE_LENGTH], 3) == 2.530
    pos = w[model].positions[derive.POSITION_ACCEPTANCE_RATE]
    assert [round(pos[p], 3) for p in ("0", "1", "2")] == [0.780, 0.484, 0.266]
    assert v[derive.TOKEN_ACCEPTANCE_PROBABILITY] == pytest.approx(0.699, abs=1e-3)
    assert v[derive.ARRIVAL_RATE] == pytest.approx(7200 / 3600)
    assert v[derive.MEAN_PROMPT_TOKENS] == pytest.approx(4107772 / 7200)
    assert v[derive.MEAN_LATENCY_SECONDS] == pytest.approx(8676.776573547713 / 7200)
    assert snaps[model].configured_k == 3


def test_sglang_page_acceptance_length_from_verify_calls():
    """SGLang: E = (generation − requests) / verify calls, rate = (E − 1) / (draft tokens − 1),
    k from spec_num_steps; no per-position signals."""
    text = (FIX / "constructed" / "sglang-0.5.23-spec.prom").read_text()
    page = sources.parse_page(text)
    assert page.engine == "sglang"
    model = "meta-llama/Llama-3.1-8B-Instruct"
    assert page.configured_k == {model: 3}
    w, _ = windows_of(text)
    v = w[model].values
    e = (539491 + 139273 - 3000) / 234798
    assert v[derive.ACCEPTANCE_LENGTH] == pytest.approx(e)
    assert v[derive.ACCEPTANCE_RATE] == pytest.approx((e - 1) / 3)
    assert abs(v[derive.ACCEPTANCE_RATE] - 0.6467) < 0.05  # close to SGLang's own gauge
    assert v[derive.ARRIVAL_RATE] == pytest.approx(3000 / 3600)
    assert v[derive.MEAN_LATENCY_SECONDS] == pytest.approx(
        (2212.77602146051 + 571.5162501332729) / 3000)
    assert v[derive.MEAN_GENERATION_TOKENS] == pytest.approx((539491 + 139273) / 3000)
    assert derive.POSITION_ACCEPTANCE_RATE not in w[model].positions


def test_engine_restriction_and_garbage():
    text = (FIX / "constructed" / "sglang-0.5.23-spec.prom").read_text()
    assert sources.parse_page(text, "vllm").counters == {}
    with pytest.raises(sources.PageParseError):
        sources.parse_page("<html><body>login</body></html>\n")
    with pytest.raises(ValueError):
        sources.parse_page("", "tgi")


def test_iteration_tokens_histogram_is_not_a_counter():
    """vllm:iteration_tokens_total is a histogram: none of its samples becomes a signal."""
    text = (FIX / "constructed" / "vllm-0.33-spec-decode.prom").read_text()
    assert "vllm:iteration_tokens_total_count" in text
    page = sources.parse_page(text)
    assert all("iteration" not in sig for _, sig, _ in page.counters)
