"""TensorRT-LLM and llama.cpp: every signal their pages allow is derived, the others absent.

Protected behaviour: the constructed page sequences of tests/fixtures/engines-constructed/
(built from each engine's own source) go through the real pipeline (parse, history, derive)
and collector, and from that pipeline's exposition (backfilled) into a real Prometheus, where
the SD dashboard's own queries return data for each engine's target (a running `specwatch
serve` over HTTP: test_new_engines_serve.py). Expected values are computed here from
the pages' own numbers (prometheus_client's parser), never written down: acceptance rate and
length, draft length, α, per-position rates, configured k, and for TensorRT-LLM the arrival
rate, mean latency and KV capacity. What an engine cannot give is absent, not 0: llama.cpp's
arrival rate, batch size, latency and KV capacity (no request counter, no histogram, no size
on the page); both engines' mean prompt and generated lengths (no length histograms).
"""

from __future__ import annotations

import math
import shutil
import time

import pytest
from helpers.enginepages import builder, sequence
from mixin_helpers import (
    dashboard_exprs,
    load_dashboards,
    metric_names,
    substitute_target_vars,
)
from prometheus_client.parser import text_string_to_metric_families
from promsim import backfill, query_range, running_prometheus

from specwatch.app.serve import ServeApp
from specwatch.engines import registry
from specwatch.expose.collector import SpecwatchCollector
from specwatch.poll import config, sources
from specwatch.poll.pipeline import Pipeline, PollResult
from specwatch.poll.windows import derive

ENGINES = ("trtllm", "llamacpp")
MODEL = {"trtllm": "meta-llama/Llama-3.1-8B-Instruct", "llamacpp": "default"}
#: Each engine's sample names: drafts (and the label that selects them), draft tokens,
#: accepted tokens, accepted per position and its position label.
NAMES = {
    "trtllm": ("trtllm_spec_decode_drafted_tokens_total", {"token_position": "0"},
               "trtllm_spec_decode_drafted_tokens_total",
               "trtllm_spec_decode_accepted_tokens_total",
               "trtllm_spec_decode_accepted_tokens_total", "token_position"),
    "llamacpp": ("llamacpp:spec_decode_num_drafts_total", {},
                 "llamacpp:spec_decode_num_draft_tokens_total",
                 "llamacpp:spec_decode_num_accepted_tokens_total",
                 "llamacpp:spec_decode_num_accepted_tokens_per_pos_total", "position"),
}


def _values(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def _delta(before: str, after: str, name: str, **labels: str) -> float:
    """Increase of the sum of ``name`` over the series carrying ``labels`` (0 when absent)."""
    def total(text: str) -> float:
        return sum(v for (n, lab), v in _values(text).items()
                   if n == name and set(labels.items()) <= lab)
    return total(after) - total(before)


def _pipeline(engine: str, setting: str) -> Pipeline:
    return Pipeline([(engine, setting)], derive.DeriveConfig(windows=(("1m", 60.0),)), 60.0)


def _model(pipeline: Pipeline, engine: str):
    target = pipeline.snapshot.targets[engine]
    assert target.up and target.engine == engine
    return target.models[MODEL[engine]]


@pytest.mark.parametrize("engine", ENGINES)
def test_pages_are_recognised_under_the_engine_and_auto_settings(engine):
    for text in sequence(engine)[:2]:
        for setting in (engine, "auto"):
            assert sources.parse_page(text, setting).engine == engine
        # The other engines' settings read none of its samples.
        assert not sources.parse_page(text, "vllm").counters
    assert engine in registry.config_kinds()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("setting", ["own", "auto"])
def test_every_signal_the_engine_allows_is_derived(engine, setting):
    """Between scrapes 1 and 2 (one minute): each derived signal equals the ratio of the
    pages' own increases."""
    first, second = sequence(engine)[:2]
    pipeline = _pipeline(engine, engine if setting == "own" else "auto")
    pipeline.apply(PollResult(engine, 1000.0, 1000.0, 0.01, body=first))
    pipeline.apply(PollResult(engine, 1060.0, 1060.0, 0.01, body=second))
    m = _model(pipeline, engine)
    drafts_name, drafts_labels, tokens_name, accepted_name, pos_name, pos_label = NAMES[engine]
    drafts = _delta(first, second, drafts_name, **drafts_labels)
    tokens = _delta(first, second, tokens_name)
    accepted = _delta(first, second, accepted_name)
    positions = sorted({dict(lab)[pos_label] for (n, lab) in _values(second) if n == pos_name})
    per_position = {p: _delta(first, second, pos_name, **{pos_label: p}) / drafts
                    for p in positions}
    assert drafts > 0 and len(positions) >= 3
    w = m.window("1m")
    assert w is not None
    v = w.values
    assert v[derive.ACCEPTANCE_RATE] == pytest.approx(accepted / tokens)
    assert v[derive.ACCEPTANCE_LENGTH] == pytest.approx(1 + accepted / drafts)
    assert v[derive.DRAFT_LENGTH] == pytest.approx(tokens / drafts)
    assert w.positions[derive.POSITION_ACCEPTANCE_RATE] == pytest.approx(per_position)
    if engine == "trtllm":  # max_draft_len, stated by the speculative config info series
        info = [dict(lab) for (n, lab) in _values(second) if n == "trtllm_speculative_config_info"]
        assert m.configured_k == int(info[0]["spec_num_tokens"]) == len(positions)
    else:  # the positions counted (its draft limit is not on /metrics)
        assert m.configured_k == len(positions)
    assert derive.TOKEN_ACCEPTANCE_PROBABILITY in v
    if engine == "trtllm":
        finished = _delta(first, second, "trtllm_request_success_total")
        latency = _delta(first, second, "trtllm_e2e_request_latency_seconds_sum")
        assert v[derive.ARRIVAL_RATE] == pytest.approx(finished / 60)
        assert v[derive.MEAN_LATENCY_SECONDS] == pytest.approx(latency / finished)
        assert v[derive.EFFECTIVE_BATCH_SIZE] == pytest.approx(latency / 60)
        assert registry.sd_configured(m.engine, m.sd_families_present, m.gauges) is True
        server = pipeline.snapshot.targets[engine].server
        stated = {n: val for (n, _), val in _values(second).items()
                  if n in ("trtllm_kv_cache_max_blocks", "trtllm_kv_cache_tokens_per_block")}
        assert server is not None and server.kv_cache_tokens == (
            stated["trtllm_kv_cache_max_blocks"] * stated["trtllm_kv_cache_tokens_per_block"])
    else:
        for absent in (derive.ARRIVAL_RATE, derive.MEAN_LATENCY_SECONDS,
                       derive.EFFECTIVE_BATCH_SIZE):
            assert absent not in v, absent
        # Its spec-decode counters are written (as 0) with SD off: they say nothing.
        assert registry.sd_configured(m.engine, m.sd_families_present, m.gauges) is None
        assert pipeline.snapshot.targets[engine].server is None
    for absent in (derive.MEAN_PROMPT_TOKENS, derive.MEAN_GENERATION_TOKENS):
        assert absent not in v, absent
    running = {"trtllm": "trtllm_num_requests_running", "llamacpp": "llamacpp:requests_processing"}
    assert m.gauges[sources.RUNNING] == sum(
        val for (n, _), val in _values(second).items() if n == running[engine])
    text = SpecwatchCollector(lambda: pipeline.snapshot).exposition(
        pipeline.snapshot, openmetrics=False).decode()
    alpha = [line for line in text.splitlines() if line.startswith("sd_acceptance_alpha{")
             and f'target="{engine}"' in line and 'window="1m"' in line]
    assert alpha == [
        f'sd_acceptance_alpha{{method="first_position",model_name="{MODEL[engine]}",'
        f'target="{engine}",window="1m"}} {per_position["0"]!r}']


@pytest.mark.parametrize("engine", ENGINES)
def test_a_restart_is_a_reset_and_the_next_minute_is_read_alone(engine):
    """Scrape 3 is a restarted server (counters back to 0 or not yet created); between 3 and
    4 the acceptance is that minute's own, the same as before the restart."""
    pages = sequence(engine)
    pipeline = _pipeline(engine, "auto")
    for i, text in enumerate(pages):
        pipeline.apply(PollResult(engine, 1000.0 + 60 * i, 1000.0 + 60 * i, 0.01, body=text))
    target = pipeline.snapshot.targets[engine]
    assert target.counter_resets_total >= 1
    w = _model(pipeline, engine).window("1m")
    assert w is not None
    _, _, tokens_name, accepted_name, _, _ = NAMES[engine]
    accepted = _delta(pages[2], pages[3], accepted_name)
    assert w.values[derive.ACCEPTANCE_RATE] == pytest.approx(
        accepted / _delta(pages[2], pages[3], tokens_name))


@pytest.mark.parametrize("restart_page", ["as served", "with the request counter at 0"])
def test_the_minute_after_a_trtllm_restart_reads_its_own_arrival_rate(restart_page):
    """TensorRT-LLM creates its request counter on the first finished request, so the
    restarted server's page has none: absent reads as 0, and the minute after the restart
    is that minute's own finished requests over 60 s (120 / 60 = 2.0/s in the pages), the
    same as a page that lists the counter at 0 — not the minute before folded in."""
    pages = sequence("trtllm")
    name = "trtllm_request_success_total"
    assert name not in pages[2]
    if restart_page != "as served":
        model = MODEL["trtllm"]
        pages[2] += (f"# TYPE {name} counter\n" + "".join(
            f'{name}{{engine_type="pytorch",finished_reason="{r}",model_name="{model}"}} 0.0\n'
            for r in ("length", "stop")))
    pipeline = _pipeline("trtllm", "auto")
    for i, text in enumerate(pages):
        pipeline.apply(PollResult("trtllm", 1000.0 + 60 * i, 1000.0 + 60 * i, 0.01, body=text))
    w = _model(pipeline, "trtllm").window("1m")
    assert w is not None
    finished = _delta(pages[2], pages[3], name)
    assert finished > 0
    assert w.values[derive.ARRIVAL_RATE] == pytest.approx(finished / 60)


# ---- the pipeline's exposition, backfilled into a real Prometheus: the dashboard's queries ----

STEP = 15.0  # poll interval of the backfilled run, seconds
RUN = 420.0  # length of the run: past the 5m window
EXPORTER_LABELS = {"job": "specwatch", "instance": "specwatch:10440"}


def _om_value(v: float) -> str:
    return "NaN" if math.isnan(v) else ("+Inf" if v == math.inf else repr(float(v)))


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """specwatch serve's pipeline and collector fed both engines' pages every 15 s for 7
    minutes (traffic as in the fixtures' README), its exposition backfilled into a real
    Prometheus; yields (base URL, start, end, the exporter's last series per target)."""
    assert shutil.which("prometheus"), \
        "prometheus not found: `make setup` installs Debian's prometheus package"
    tmp = tmp_path_factory.mktemp("engines")
    build = builder()
    cfg_file = tmp / "specwatch.yaml"
    cfg_file.write_text(
        "global:\n  poll_interval: 15s\n  windows: [1m, 5m]\n"
        "targets:\n"
        "  - {name: trt, url: 'http://127.0.0.1:9/metrics', engine: trtllm}\n"
        "  - {name: lcpp, url: 'http://127.0.0.1:9/metrics', engine: auto}\n")
    app = ServeApp(config.build_config(str(cfg_file), [], "127.0.0.1:0", None))
    start = time.time() - RUN - 60
    rows: dict[str, list[str]] = {}
    last: dict[str, set[str]] = {}
    t = 0.0
    while t <= RUN:
        ts = start + t
        for target, page in (("trt", build.trtllm_page(40 + t / 60, False, 0)),
                             ("lcpp", build.llamacpp_page(20 + t / 60, False, 0))):
            app.pipeline.apply(PollResult(target, ts, ts, 0.01, body=page))
        last = {}
        for family in app.collector.collect():
            for s in family.samples:
                labels = {**s.labels, **EXPORTER_LABELS}
                text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                rows.setdefault(s.name, []).append(f"{s.name}{{{text}}} {_om_value(s.value)}"
                                                  f" {ts:.3f}")
                if "target" in s.labels:
                    last.setdefault(s.labels["target"], set()).add(s.name)
        t += STEP
    om = [line for name in sorted(rows) for line in (f"# TYPE {name} unknown", *rows[name])]
    tsdb = tmp / "tsdb"
    backfill("\n".join([*om, "# EOF"]) + "\n", tsdb)
    with running_prometheus(tsdb, tmp, ["--query.lookback-delta=30s"]) as base:
        yield base, start, start + RUN, last



SD = "specwatch-sd-overview.json"


@pytest.mark.parametrize(("target", "engine"), [("trt", "trtllm"), ("lcpp", "llamacpp")])
def test_the_sd_dashboard_queries_return_data_for_the_engine(prometheus, target, engine):
    """Every query of the SD dashboard that reads only exporter series this engine's target
    has returns data from Prometheus; every query reading a signal the engine cannot give
    returns none for its target (an empty panel, not a 0)."""
    base, start, end, last = prometheus
    produced = last[target]
    assert {"sd_acceptance_rate", "sd_acceptance_length", "sd_acceptance_alpha",
            "sd_position_acceptance_rate", "sd_draft_length_configured"} <= produced
    cannot = {"sd_mean_prompt_tokens", "sd_mean_generation_tokens"}
    if engine == "llamacpp":
        cannot |= {"sd_arrival_rate", "sd_mean_latency_seconds", "sd_effective_batch_size",
                   "sd_server_kv_cache_tokens"}
    else:
        assert {"sd_arrival_rate", "sd_mean_latency_seconds",
                "sd_server_kv_cache_tokens"} <= produced
    assert not cannot & produced
    checked, empty, silent = 0, [], []
    for where, expr in dashboard_exprs(SD, load_dashboards()[SD]):
        if "panel" not in where:
            continue
        names = metric_names(expr)
        sd_names = {n for n in names if n.startswith("sd_")}
        if not sd_names or names - sd_names:
            continue  # reads engine or Prometheus series, or no exporter series
        result = query_range(base, substitute_target_vars(expr, target, "1m"), start, end, "15s",
                             timeout=30)
        if sd_names <= produced:
            checked += 1
            if not result:
                empty.append(where)
        elif sd_names <= cannot and result:
            silent.append(where)
    assert empty == []
    assert silent == []
    assert checked >= 8
