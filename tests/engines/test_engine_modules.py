"""Each engine module is what its pages and the mixin say.

Protected behaviour: the engine modules (vLLM v1, vLLM v0, SGLang) declare the names their
real or source-built pages carry, recognise those pages as their own whatever the target's
``engine:`` setting that reads them, state the bucket layouts the pages have, and declare
every engine metric the mixin's rules and dashboards query (the Jsonnet keeps its selectors
and names; this test holds them equal to the modules). The registry is the same whatever
module was imported first.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import FIXTURES
from mixin_helpers import all_mixin_exprs, metric_names

from specwatch.engines import base, registry
from specwatch.engines.base import Capabilities, Engine
from specwatch.poll import sources

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ")
V1_PAGES = [FIXTURES / "constructed" / "vllm-0.33-spec-decode.prom",
            sorted((FIXTURES / "vllm-0.32-cpu-ngram").glob("snap_*.prom"))[-1]]
#: kind -> its pages (the constructed v0 and SGLang pages show a subset of the families).
PAGES: dict[str, list[Path]] = {
    "vllm": V1_PAGES,
    "vllm-v0": [FIXTURES / "constructed" / "vllm-0.9-v0-spec-decode.prom"],
    "sglang": [FIXTURES / "constructed" / "sglang-0.5.23-spec.prom"],
    "trtllm": sorted((FIXTURES / "engines-constructed" / "trtllm").glob("snap_*.txt"))[:2],
    "llamacpp": sorted((FIXTURES / "engines-constructed" / "llamacpp").glob("snap_*.txt"))[:2],
}


def samples(path: Path) -> list[tuple[str, str]]:
    out = []
    for line in path.read_text().splitlines():
        m = _SAMPLE.match(line)
        if m:
            out.append((m.group(1), m.group(2) or ""))
    return out


def test_the_built_in_engines_are_registered_in_order() -> None:
    assert [e.kind for e in registry.engines()][:3] == ["vllm-v0", "vllm", "sglang"]
    assert registry.config_kinds()[:2] == ("vllm", "sglang")
    assert registry.config_kinds()[-1] == "auto"


@pytest.mark.parametrize("kind", sorted(PAGES))
def test_each_engine_recognises_its_pages(kind: str) -> None:
    engine = registry.get(kind)
    for path in PAGES[kind]:
        text = path.read_text()
        for setting in (engine.family, "auto"):
            assert sources.parse_page(text, setting).engine == kind, (path.name, setting)
        # Every engine sample on the page that the module reads is read under its setting.
        on_page = {name for name, _ in samples(path)}
        assert on_page & set(engine.counters) <= sources.source_metric_names(engine.family)


@pytest.mark.parametrize("kind", sorted(PAGES))
def test_the_stated_capabilities_are_what_the_pages_give(kind: str) -> None:
    """The acceptance reading's counters, per-position counters and configured k are on the
    engine's pages exactly when the module says so; a page stating a KV capacity is from an
    engine that declares it (the constructed pages leave the info series out)."""
    caps = registry.get(kind).capabilities
    for path in PAGES[kind]:
        page = sources.parse_page(path.read_text(), "auto")
        signals = {sig for _, sig, _ in page.counters}
        assert caps.acceptance is not None
        assert base.ACCEPTANCE_READS[caps.acceptance] <= signals
        assert (base.ACCEPTED_PER_POSITION in signals) == caps.per_position
        assert bool(page.configured_k) == (caps.configured_k is not None)
        assert page.server is None or caps.kv_capacity, path.name


def test_vllm_v1_reads_names_its_pages_carry() -> None:
    on_pages = {name for path in V1_PAGES for name, _ in samples(path)}
    engine = registry.get("vllm")
    assert {*engine.counters, *engine.gauges, *engine.infos} <= on_pages


@pytest.mark.parametrize("kind", sorted(PAGES))
def test_stated_bucket_layouts_are_the_pages(kind: str) -> None:
    engine = registry.get(kind)
    stated = [h for h in engine.capabilities.histograms if h.buckets]
    # vLLM v0's layouts changed across its versions; llama.cpp writes no histogram.
    assert stated or kind == "vllm-v0" or not engine.capabilities.histograms
    for h in stated:
        bounds: set[float] = set()
        for path in PAGES[kind]:
            for name, labels in samples(path):
                if name == f"{h.family}_bucket":
                    le = re.search(r'le="([^"]+)"', labels)
                    assert le is not None
                    bounds.add(float(le.group(1)))
        assert sorted(bounds) == [*h.buckets, float("inf")], h.family


def test_every_engine_metric_the_mixin_queries_is_declared_by_its_engine() -> None:
    prefixes = registry.prefixes()
    queried = {n for _, expr in all_mixin_exprs() for n in metric_names(expr)
               if n.startswith(prefixes)}
    declared = frozenset().union(*(e.names() for e in registry.engines()))
    assert queried, "the mixin queries no engine metric"
    assert queried <= declared, sorted(queried - declared)
    shown = frozenset().union(*(e.shown for e in registry.engines()))
    assert shown <= queried, sorted(shown - queried)  # shown means: the mixin reads it


def test_the_registry_is_the_same_whatever_was_imported_first() -> None:
    code = ("import importlib, sys; importlib.import_module(sys.argv[1]); "
            "from specwatch.engines import registry; "
            "print([(e.kind, sorted(e.names())) for e in registry.engines()])")
    runs = {first: subprocess.run([sys.executable, "-c", code, first], capture_output=True,
                                  text=True, check=True, timeout=60).stdout
            for first in ("specwatch.engines.sglang", "specwatch.engines.vllm_v0",
                          "specwatch.poll.sources", "specwatch.engines.registry")}
    assert len(set(runs.values())) == 1, runs


def test_a_kind_registers_once() -> None:
    twin = Engine(kind="vllm", family="vllm", versions="", prefix="vllm:", order=1,
                  counters={}, capabilities=Capabilities(False, None, False, False))
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(twin)
    assert registry.register(registry.get("vllm")) is registry.get("vllm")
    with pytest.raises(ValueError, match="not an engine kind"):
        registry.register(Engine(kind="auto", family="x", versions="", prefix="x:", order=1,
                                 counters={}))


def test_metric_names_a_signal_or_says_the_engine_has_none() -> None:
    v1 = registry.get("vllm")
    assert v1.metric(base.DRAFTS) == "vllm:spec_decode_num_drafts_total"
    with pytest.raises(KeyError, match="writes no"):
        registry.get("sglang").metric(base.DRAFTS)


def _signals(engine: Engine) -> tuple[set[str], set[str]]:
    """The counter and gauge signals an engine's names give."""
    counters = set(engine.counters.values())
    gauges = set(engine.gauges.values())
    for readings in engine.readings.values():
        for r in readings:
            (gauges if r.gauge else counters).add(r.signal)
    return counters, gauges


@pytest.mark.parametrize("engine", registry.engines(), ids=lambda e: e.kind)
def test_each_module_is_consistent_with_itself(engine: Engine) -> None:
    """What a module states (capabilities, SD counters, max gauges, histograms) is what its
    names give: every registered engine, the ones added later included."""
    counters, gauges = _signals(engine)
    caps = engine.capabilities
    assert engine.kind not in (registry.AUTO, registry.UNKNOWN)
    assert engine.prefix and all(n.startswith(engine.prefix) for n in engine.names())
    assert engine.sd_counters <= counters
    assert engine.max_gauges <= gauges
    assert caps.per_position == (base.ACCEPTED_PER_POSITION in counters)
    assert caps.acceptance is None or base.ACCEPTANCE_READS[caps.acceptance] <= counters
    assert caps.acceptance_length <= (base.DRAFTS in counters
                                      or caps.acceptance == base.BY_VERIFY_CALLS)
    assert (caps.configured_k == "positions") <= caps.per_position
    assert (caps.configured_k == "gauge") <= (base.SPEC_STEPS in gauges)
    assert caps.kv_capacity == bool(
        engine.infos or {base.KV_CACHE_BLOCKS, base.KV_CACHE_BLOCK_SIZE} <= gauges)
    for h in caps.histograms:
        assert engine.counters.get(f"{h.family}_bucket") == h.signal, h.family
        assert list(h.buckets) == sorted(set(h.buckets)), h.family
