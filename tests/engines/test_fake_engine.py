"""Adding an engine is one module: a fake engine, written as one new module that registers
itself, is read by the exporter with no other file touched.

Protected behaviour: the poll path holds no engine knowledge of its own. The fake engine
(``fakeserve``: its own prefix and names, per-position counters, a KV-cache info series
with labels of its own) lives in one module written to a temporary folder and imported
there; only :func:`specwatch.engines.registry.register` connects it. Its pages go through
the real pipeline (parse, history, derive) and collector, with the ``engine: auto`` setting,
and through ``specwatch serve`` (its config, poller and HTTP endpoint),
and every signal it allows is derived: acceptance rate and length, draft length, per-position
rates, configured k, arrival rate, mean latency, the server's KV capacity, the SD-configured
answer the controller reads. The values are computed here from the page's own numbers.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.pageserver import Page, PageSequenceServer
from helpers.scrape import scrape

from specwatch.app.serve import ServeApp
from specwatch.engines import registry
from specwatch.expose.collector import SpecwatchCollector
from specwatch.poll import config, sources
from specwatch.poll.pipeline import Pipeline, PollResult
from specwatch.poll.windows import derive

MODULE = '''
"""A fake serving engine: one module, registered on import."""
from collections.abc import Mapping

from specwatch.engines import base
from specwatch.engines.base import CacheInfo, Capabilities, Engine
from specwatch.engines.registry import register


def kv_cache(labels: Mapping[str, str]) -> base.KvCache:
    return base.label_number(labels, "kv_tokens"), None, None


ENGINE = register(Engine(
    kind="fakeserve", family="fakeserve", versions="1.x", prefix="fakeserve:", order=90,
    counters={
        "fakeserve:spec_drafts_total": base.DRAFTS,
        "fakeserve:spec_draft_tokens_total": base.DRAFT_TOKENS,
        "fakeserve:spec_accepted_tokens_total": base.ACCEPTED_TOKENS,
        "fakeserve:spec_accepted_by_position_total": base.ACCEPTED_PER_POSITION,
        "fakeserve:requests_done_total": base.REQUESTS_FINISHED,
        "fakeserve:latency_seconds_sum": base.E2E_LATENCY_SUM,
        "fakeserve:latency_seconds_count": base.E2E_LATENCY_COUNT,
    },
    gauges={"fakeserve:running": base.RUNNING},
    infos={"fakeserve:kv_info": CacheInfo(labels=("engine", "kv_tokens"), state=kv_cache,
                                          signal="fakeserve_kv")},
    sd_counters=frozenset({base.DRAFTS, base.DRAFT_TOKENS}),
    capabilities=Capabilities(per_position=True, configured_k="positions",
                              acceptance_length=True, kv_capacity=True),
))
'''

MODEL = "fake/model"


def page(drafts: float, tokens: float, accepted: float, per_position: list[float],
         requests: float, latency_sum: float) -> str:
    lines = [
        f'fakeserve:spec_drafts_total{{model_name="{MODEL}"}} {drafts}',
        f'fakeserve:spec_draft_tokens_total{{model_name="{MODEL}"}} {tokens}',
        f'fakeserve:spec_accepted_tokens_total{{model_name="{MODEL}"}} {accepted}',
        *(f'fakeserve:spec_accepted_by_position_total{{model_name="{MODEL}",position="{i}"}} {v}'
          for i, v in enumerate(per_position)),
        f'fakeserve:requests_done_total{{model_name="{MODEL}"}} {requests}',
        f'fakeserve:latency_seconds_sum{{model_name="{MODEL}"}} {latency_sum}',
        f'fakeserve:latency_seconds_count{{model_name="{MODEL}"}} {requests}',
        f'fakeserve:running{{model_name="{MODEL}"}} 7',
        'fakeserve:kv_info{engine="0",kv_tokens="65536"} 1',
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def fake_engine(tmp_path: Path):
    """The fake engine's one module, written and imported; unregistered afterwards."""
    path = tmp_path / "fakeserve_engine.py"
    path.write_text(textwrap.dedent(MODULE))
    spec = importlib.util.spec_from_file_location("fakeserve_engine", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fakeserve_engine"] = module
    try:
        spec.loader.exec_module(module)
        yield module.ENGINE
    finally:
        registry.unregister("fakeserve")
        sys.modules.pop("fakeserve_engine", None)


def test_the_exporter_derives_a_fake_engines_signals(fake_engine) -> None:
    first = page(100, 300, 180, [80, 60, 40], 10, 5.0)
    # 60 s later: 1000 more drafts of 3 tokens, 1800 accepted (800, 600, 400 per position),
    # 120 more requests taking 60 s in all.
    second = page(1100, 3300, 1980, [880, 660, 440], 130, 65.0)
    pipeline = Pipeline([("f", "auto")], derive.DeriveConfig(windows=(("1m", 60.0),)), 60.0)
    pipeline.apply(PollResult("f", 1000.0, 1000.0, 0.01, body=first))
    pipeline.apply(PollResult("f", 1060.0, 1060.0, 0.01, body=second))

    target = pipeline.snapshot.targets["f"]
    assert target.up and target.engine == "fakeserve"
    assert target.server is not None and target.server.kv_cache_tokens == 65536.0
    m = target.models[MODEL]
    assert m.configured_k == 3
    assert m.gauges[sources.RUNNING] == 7.0
    assert registry.sd_configured(m.engine, m.sd_families_present, m.gauges) is True
    w = m.window("1m")
    assert w is not None
    v = w.values
    assert v[derive.ACCEPTANCE_RATE] == pytest.approx(1800 / 3000)
    assert v[derive.ACCEPTANCE_LENGTH] == pytest.approx(1 + 1800 / 1000)
    assert v[derive.DRAFT_LENGTH] == pytest.approx(3.0)
    assert v[derive.ARRIVAL_RATE] == pytest.approx(120 / 60)
    assert v[derive.MEAN_LATENCY_SECONDS] == pytest.approx(60 / 120)
    rates = w.positions[derive.POSITION_ACCEPTANCE_RATE]
    assert rates == pytest.approx({"0": 0.8, "1": 0.6, "2": 0.4})

    text = SpecwatchCollector(lambda: pipeline.snapshot).exposition(
        pipeline.snapshot, openmetrics=False).decode()
    assert f'sd_acceptance_rate{{model_name="{MODEL}",target="f",window="1m"}} 0.6' in text
    assert f'sd_draft_length{{model_name="{MODEL}",target="f",window="1m"}} 3.0' in text


def test_a_fake_engine_is_a_setting_and_leaves_with_its_module(fake_engine) -> None:
    assert "fakeserve" in registry.config_kinds()
    assert "fakeserve:spec_drafts_total" in sources.source_metric_names("fakeserve")
    assert sources.source_metric_names("fakeserve").isdisjoint(
        sources.source_metric_names("vllm"))
    registry.unregister("fakeserve")
    assert "fakeserve" not in registry.config_kinds()
    assert sources.parse_page(page(1, 3, 2, [1, 1, 0], 1, 1.0)).engine == "unknown"


def test_specwatch_serve_exposes_a_fake_engines_signals(fake_engine) -> None:
    first = page(100, 300, 180, [80, 60, 40], 10, 5.0)
    second = page(1100, 3300, 1980, [880, 660, 440], 130, 65.0)
    clock = [1000.0]
    with PageSequenceServer([Page(first), Page(second)]) as server:
        cfg = config.build_config(None, [f"fake={server.url}"], "127.0.0.1:0", 60.0)
        app = ServeApp(cfg, clock=lambda: clock[0])
        app.start(poll=False)
        try:
            host, port = app.web.address
            for i, t in enumerate((1000.0, 1060.0)):
                server.set_step(i)
                clock[0] = t
                assert app.poller.poll_now("fake").error_reason is None
            series = scrape(f"http://{host}:{port}/metrics")
        finally:
            app.stop()
    labels = frozenset({("model_name", MODEL), ("target", "fake"), ("window", "1m")})
    assert series[("sd_acceptance_rate", labels)] == pytest.approx(0.6)
    assert series[("sd_acceptance_length", labels)] == pytest.approx(2.8)
    assert series[("sd_arrival_rate", labels)] == pytest.approx(2.0)
    position = frozenset({*labels, ("position", "2")})
    assert series[("sd_position_acceptance_rate", position)] == pytest.approx(0.4)
