"""What a vLLM server says about its own capacity, read from its page (vllm:cache_config_info).

Protects: on the recorded vLLM 0.32 pages the KV cache is read as the server states it
(524288 tokens, 4096 blocks of 128), by the fast and full parsers and from a page plan
alike; data-parallel engines are summed; a page of an older vLLM without
kv_cache_size_tokens gives blocks × block size; an engine that states nothing (or two
values) makes the server's value unknown, never a partial sum; SGLang and pages without
the family have none; the info series never becomes a model (it has no model_name).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from specwatch.exporter import sources

FIX = Path(__file__).parent / "fixtures"
REAL = sorted((FIX / "vllm-0.32-cpu-ngram").glob("snap_*.prom"),
              key=lambda p: int(p.stem.split("_")[1]))
PAGE = REAL[-1].read_text()
INFO = re.compile(r"^vllm:cache_config_info\{.*$", re.M)


def _info_line() -> str:
    m = INFO.search(PAGE)
    assert m is not None
    return m.group(0)


def _with_info(*lines: str) -> str:
    """The recorded page with its cache_config_info line replaced by `lines`."""
    return PAGE.replace(_info_line(), "\n".join(lines))


@pytest.mark.parametrize("parser", sources.PARSERS)
def test_recorded_pages_state_their_kv_cache(parser: str) -> None:
    plan = sources.PagePlan()
    for path in REAL:
        page = sources.parse_page(path.read_text(), parser=parser,
                                  plan=plan if parser == "fast" else None)
        assert page.server == sources.ServerCapacity(
            kv_cache_tokens=524288.0, num_gpu_blocks=4096.0, block_size=128.0, engines=1)
        assert "" not in page.models and page.models == {"tiny-llama"}
    if parser == "fast":
        assert plan.hits == len(REAL) - 1  # the steady pages came from the plan


def test_engines_are_summed() -> None:
    one = _info_line()
    two = one.replace('engine="0"', 'engine="1"')
    page = sources.parse_page(_with_info(one, two))
    assert page.server == sources.ServerCapacity(1048576.0, 8192.0, 128.0, 2)


def test_without_kv_cache_size_tokens_blocks_times_block_size() -> None:
    older = re.sub(r'kv_cache_size_tokens="[^"]*",', "", _info_line())
    assert "kv_cache_size_tokens" not in older
    assert sources.parse_page(_with_info(older)).server.kv_cache_tokens == 524288.0


@pytest.mark.parametrize("bad", ['num_gpu_blocks="None"', 'num_gpu_blocks="-3"'])
def test_an_engine_stating_nothing_makes_the_sum_unknown(bad: str) -> None:
    one = re.sub(r'kv_cache_size_tokens="[^"]*",', "", _info_line())
    two = one.replace('engine="0"', 'engine="1"').replace('num_gpu_blocks="4096"', bad)
    for parser in sources.PARSERS:
        server = sources.parse_page(_with_info(one, two), parser=parser).server
        assert server is not None and server.engines == 2
        assert server.kv_cache_tokens is None and server.num_gpu_blocks is None
        assert server.block_size == 128.0


def test_one_engine_stating_two_values_is_unknown() -> None:
    one = _info_line()
    other = one.replace('kv_cache_size_tokens="524288"', 'kv_cache_size_tokens="262144"')
    server = sources.parse_page(_with_info(one, other)).server
    assert server == sources.ServerCapacity(None, None, None, 1)


def test_pages_without_it_have_none() -> None:
    assert sources.parse_page(_with_info()).server is None
    for name in ("sglang-0.5.23-spec.prom", "vllm-0.33-spec-decode.prom"):
        assert sources.parse_page((FIX / "constructed" / name).read_text()).server is None
    # An SGLang-only reading of a vLLM page does not look for vLLM's info series.
    assert sources.parse_page(PAGE, engine="sglang").server is None
