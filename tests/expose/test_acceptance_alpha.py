"""The exported draft-length-independent α, ``sd_acceptance_alpha{method}``, on engine pages.

Protects what the acceptance alert reads: where the engine counts positions (vLLM v1) the
series is the first position's acceptance (labelled ``first_position``), computed here from
the raw page; where it does not (SGLang) it is the per-token α (``per_token``); with neither
(vLLM's V0 engine: no drafts counter) there is no series, never a 0. Both exposition paths
(the cached bytes and prometheus_client's encoding of ``collect()``) agree.
"""

from __future__ import annotations

import re

import pytest
from helpers.paths import FIXTURES
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from specwatch.expose.collector import SpecwatchCollector
from specwatch.poll.pipeline import Pipeline, PollResult
from specwatch.poll.snapshot import WindowSignals
from specwatch.poll.windows import derive

CONSTRUCTED = FIXTURES / "constructed"


def _zeroed(text: str) -> str:
    return re.sub(r"^(\S+(?:_total|_sum|_count|_bucket)(?:\{[^}]*\})?) \S+$", r"\1 0.0", text,
                  flags=re.M)


def _raw_sum(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", text, re.M):
        if all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


def _exposition(page: str) -> tuple[str, str]:
    """The exporter's page (cached bytes, then prometheus_client's) after a 1h window that
    starts from a zeroed copy of ``page``."""
    p = Pipeline([("t", "auto")], derive.DeriveConfig(windows=(("1h", 3600.0),)), 5.0)
    p.apply(PollResult("t", 0.0, 0.0, 0.01, _zeroed(page)))
    p.apply(PollResult("t", 3600.0, 3600.0, 0.01, page))
    collector = SpecwatchCollector(lambda: p.snapshot)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return collector.exposition(p.snapshot, False).decode(), generate_latest(reg).decode()


def _series(text: str, name: str) -> dict[str, float]:
    """{label block: value} of the samples of ``name`` in the 1h window."""
    return {m.group(1): float(m.group(2))
            for m in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M)
            if 'window="1h"' in m.group(1)}


def test_vllm_alpha_is_the_first_position_acceptance():
    page = (CONSTRUCTED / "vllm-0.33-spec-decode.prom").read_text()
    cached, library = _exposition(page)
    assert cached.count("# HELP sd_acceptance_alpha ") == 1
    alpha = _series(cached, "sd_acceptance_alpha")
    assert alpha == _series(library, "sd_acceptance_alpha")
    ((labels, value),) = alpha.items()
    assert 'method="first_position"' in labels
    want = (_raw_sum(page, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position="0")
            / _raw_sum(page, "vllm:spec_decode_num_drafts_total"))
    assert value == pytest.approx(want, rel=1e-12)
    # k = 3 here: vLLM's rate (accepted / proposed) sits below the first position's share.
    (rate,) = _series(cached, "sd_acceptance_rate").values()
    assert rate < value


def test_sglang_alpha_is_the_per_token_alpha():
    page = (CONSTRUCTED / "sglang-0.5.23-spec.prom").read_text()
    cached, library = _exposition(page)
    alpha = _series(cached, "sd_acceptance_alpha")
    assert alpha == _series(library, "sd_acceptance_alpha")
    ((labels, value),) = alpha.items()
    assert 'method="per_token"' in labels
    (token_alpha,) = _series(cached, "sd_token_acceptance_probability").values()
    assert value == token_alpha


def test_no_alpha_without_drafts_or_positions():
    """vLLM's V0 engine has the rate but neither drafts nor positions: no α series at all."""
    page = (CONSTRUCTED / "vllm-0.9-v0-spec-decode.prom").read_text()
    cached, library = _exposition(page)
    assert _series(cached, "sd_acceptance_rate")
    for text in (cached, library):
        assert "sd_acceptance_alpha" not in text


def test_a_window_without_position_0_falls_back_to_the_per_token_alpha():
    """A window whose position-0 rate is missing (its counter unknown at a window's end:
    left out, not 0) is not labelled first_position with another position's rate."""
    values = {derive.TOKEN_ACCEPTANCE_PROBABILITY: 0.55}
    rates = {"0": 0.63, "1": 0.4}
    w = WindowSignals("5m", values, {derive.POSITION_ACCEPTANCE_RATE: rates})
    assert derive.acceptance_alpha(w) == (0.63, "first_position")
    w = WindowSignals("5m", values, {derive.POSITION_ACCEPTANCE_RATE: {"1": 0.4}})
    assert derive.acceptance_alpha(w) == (0.55, "per_token")
    assert derive.acceptance_alpha(WindowSignals("5m", {})) is None
