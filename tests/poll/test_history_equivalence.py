"""The numpy history and derive give the results of the dict implementation they replaced.

Protected behaviour: ``specwatch.poll.windows.history`` + ``derive`` (rows of numpy
arrays, windows as differences of two rows) publish the same ``ModelSnapshot`` as the
reference implementation kept in ``tests/helpers/reference_history.py`` and
``reference_derive.py`` (the former dict-and-columns code), to 1e-9 relative, on:

* the real recording (49 pages of vLLM 0.32), polled in order, with restarts spliced in;
* every constructed fixture page and every fuzz-corpus page, as page sequences;
* seeded random page sequences of the fuzzer (resets, vanishing models, NaN, duplicates);
* hypothesis-generated counter histories with resets, vanishing series, ``_created``
  changes, process restarts and a clock that stalls.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random

import pytest
from helpers import reference_derive, reference_history
from helpers.paths import FIXTURES
from hypothesis import given, settings
from hypothesis import strategies as st

from specwatch.app import settings as app_settings
from specwatch.poll import limits, sources
from specwatch.poll.snapshot import ModelSnapshot
from specwatch.poll.windows import derive, history

FIXTURES = FIXTURES
EXAMPLES = int(os.environ.get("SPECWATCH_HYPOTHESIS_EXAMPLES", "60"))
WINDOWS = (("1m", 60.0), ("5m", 300.0), ("15m", 900.0))


def close(a: float, b: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def assert_same_model(got: ModelSnapshot, want: ModelSnapshot) -> None:
    assert got.model_name == want.model_name and got.engine == want.engine
    assert got.configured_k == want.configured_k
    assert dict(got.gauges) == dict(want.gauges)
    assert got.sd_families_present == want.sd_families_present
    assert got.samples == want.samples  # counts, bucket bounds; sums of the same additions
    assert [w.window for w in got.windows] == [w.window for w in want.windows]
    for g, w in zip(got.windows, want.windows, strict=True):
        assert g.values.keys() == w.values.keys(), g.window
        for k in w.values:
            assert close(g.values[k], w.values[k]), (g.window, k, g.values[k], w.values[k])
        assert {k: dict(v) for k, v in g.positions.items()}.keys() == w.positions.keys()
        for name, per in w.positions.items():
            assert g.positions[name].keys() == per.keys()
            for p, x in per.items():
                assert close(g.positions[name][p], x), (g.window, name, p)
        assert close(g.span_seconds, w.span_seconds)
        assert close(g.requests, w.requests) and close(g.drafts, w.drafts)
        assert g.histograms.keys() == w.histograms.keys()
        for name, hb in w.histograms.items():
            gb = g.histograms[name]
            assert [b for b, _ in gb] == [b for b, _ in hb]
            assert all(close(x, y) for (_, x), (_, y) in zip(gb, hb, strict=True))


class Pair:
    """The new and the reference history of one target, fed the same pages."""

    def __init__(self, retention: float = 3600.0, max_entries: int = 2000,
                 min_drafts: float = 50.0, count_window: int = 1000,
                 windows: tuple[tuple[str, float], ...] = WINDOWS,
                 min_bimodality_samples: int = 10) -> None:
        self.new = history.TargetHistory(retention, max_entries, min_drafts)
        #: Without a controller the exporter's histories keep no latency bucket columns.
        self.lean = history.TargetHistory(retention, max_entries, min_drafts)
        self.lean.keep_buckets = False
        self.ref = reference_history.TargetHistory(retention, max_entries, min_drafts)
        kw = dict(windows=windows, count_window=count_window, min_drafts_per_sample=min_drafts,
                  min_bimodality_samples=min_bimodality_samples)
        self.cfg = derive.DeriveConfig(**kw)
        self.cfg_plain = derive.DeriveConfig(**kw, histograms=False)
        self.ref_cfg = reference_derive.DeriveConfig(**kw)
        self.compared = 0

    def poll(self, page: sources.ParsedPage, t: float) -> None:
        lean_reset = self.lean.update(page, t)
        assert self.new.update(page, t) == self.ref.update(page, t) == lean_reset
        assert self.lean.resets_total == self.ref.resets_total
        assert self.new.resets_total == self.ref.resets_total
        assert self.new.present_models == self.ref.present_models
        assert self.new.models.keys() == self.ref.models.keys() == self.lean.models.keys()
        for name in sorted(self.new.present_models):
            mh, rh = self.new.models[name], self.ref.models[name]
            assert len(mh.entries) == len(rh.entries)
            assert mh.cumulative.keys() == rh.cumulative.keys()
            assert all(close(mh.cumulative[k], v) for k, v in rh.cumulative.items())
            want = reference_derive.derive_model(rh, self.ref_cfg, page.engine)
            assert_same_model(derive.derive_model(mh, self.cfg, page.engine), want)
            # Without window histograms (no controller): everything else the same.
            plain = dataclasses.replace(want, windows=tuple(
                dataclasses.replace(w, histograms={}) for w in want.windows))
            assert_same_model(derive.derive_model(mh, self.cfg_plain, page.engine), plain)
            # A history without bucket columns: the same snapshot, no bucket counter kept.
            lh = self.lean.models[name]
            assert len(lh.entries) == len(rh.entries)
            assert lh.cumulative.keys() == {k for k in rh.cumulative
                                            if k[0] not in sources.BUCKET_SIGNALS}
            assert all(close(lh.cumulative[k], rh.cumulative[k]) for k in lh.cumulative)
            assert_same_model(derive.derive_model(lh, self.cfg_plain, page.engine), plain)
            self.compared += 1


def real_pages() -> list[str]:
    files = sorted((FIXTURES / "vllm-0.32-cpu-ngram").glob("snap_*.prom"),
                   key=lambda p: int(p.stem.split("_")[1]))
    return [p.read_text() for p in files]


def test_real_recording_polled_in_order_with_restarts():
    """Three passes over the 49 real pages (each pass after the first is a server restart:
    the counters fall back), 5 s apart, then an idle stretch of the same page."""
    pages = [sources.parse_page(p) for p in real_pages()]
    pair = Pair()
    t = 1000.0
    for page in pages * 3 + [pages[-1]] * 30:
        pair.poll(page, t)
        t += 5.0
    assert pair.new.resets_total >= 2 and pair.compared == len(pages) * 3 + 30


@pytest.mark.parametrize("path", sorted((FIXTURES / "constructed").glob("*.prom"))
                         + sorted(FIXTURES.glob("vllm-bench/*.prom"))[:5],
                         ids=lambda p: p.name)
def test_constructed_pages_as_a_growing_sequence(path):
    """A page whose counters grow poll after poll (scaled copies of the fixture), with one
    restart: the same windows and samples."""
    text = path.read_text()
    base = sources.parse_page(text)
    pair = Pair(min_drafts=1, count_window=10, min_bimodality_samples=4)
    for i in range(40):
        scale = (i % 25) + 1  # falls back at i == 25: a restart of every series
        page = sources.ParsedPage(
            base.engine, {k: v * scale + i for k, v in base.counters.items()},
            dict(base.created), dict(base.gauges), dict(base.configured_k),
            base.process_start_time)
        pair.poll(page, 100.0 + 7.0 * i)
    assert pair.compared > 0


def test_fuzz_corpus_as_one_sequence():
    """Every fuzz-corpus page that parses, one poll each, through both implementations."""
    pair = Pair(min_drafts=1, count_window=10, windows=(("1m", 60.0), ("5m", 300.0)),
                min_bimodality_samples=4)
    t = 0.0
    for path in sorted((FIXTURES / "fuzz-corpus").iterdir()):
        if path.suffix not in (".txt", ".prom"):
            continue
        try:
            page = sources.parse_page(path.read_text(errors="replace"))
        except sources.PageParseError:
            continue
        page, _ = limits.cap_series(page, 50, keep_first=pair.new.present_models)
        t += 5.0
        pair.poll(page, t)


@pytest.mark.parametrize("seed", range(12))
def test_fuzzer_sequences(seed):
    """The fuzzer's seeded page sequences (resets, models that vanish, NaN, duplicates)."""
    from test_fuzz import random_pages

    pages, engine = random_pages(seed)
    pair = Pair(retention=600.0, max_entries=64, min_drafts=1, count_window=10,
                windows=(("1m", 60.0), ("5m", 300.0)), min_bimodality_samples=4)
    for i, text in enumerate(pages):
        try:
            page = sources.parse_page(text, engine)
        except sources.PageParseError:
            continue
        page, _ = limits.cap_series(page, 50, keep_first=pair.new.present_models)
        pair.poll(page, 1000.0 + 5.0 * i)


SIGNALS = [sources.DRAFTS, sources.DRAFT_TOKENS, sources.ACCEPTED_TOKENS,
           sources.REQUESTS_FINISHED, sources.E2E_LATENCY_SUM, sources.E2E_LATENCY_COUNT,
           sources.VERIFY_CALLS, sources.GENERATION_TOKENS]
step = st.fixed_dictionaries({
    "dt": st.sampled_from([0.0, 1.0, 5.0, 5.0, 30.0, 400.0]),
    "grow": st.lists(st.integers(0, 300), min_size=len(SIGNALS), max_size=len(SIGNALS)),
    "reset": st.sampled_from([None, None, None, "one", "created", "process"]),
    "vanish": st.sampled_from([None, None, "b", "engine1"]),
})


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(step, min_size=2, max_size=80), st.sampled_from([0, 50, 500]))
def test_random_histories_with_resets_and_vanishing_series(steps, count_window):
    pair = Pair(retention=600.0, max_entries=100, min_drafts=5, count_window=count_window,
                windows=(("1m", 60.0), ("5m", 300.0)), min_bimodality_samples=4)
    raw: dict[tuple, float] = {}
    created: dict[tuple, float] = {}
    process_start = 1.0
    t = 50.0
    rng = random.Random(len(steps))
    for s in steps:
        t += s["dt"]
        if s["reset"] == "process":
            process_start += 1.0
            raw = {}
        counters = {}
        for model in ("a", "b"):
            for engine in ("0", "1"):
                if s["vanish"] == model or (s["vanish"] == "engine1" and engine == "1"):
                    continue
                for sig, g in zip(SIGNALS, s["grow"], strict=True):
                    key = (model, sig, (("engine", engine),))
                    if s["reset"] == "one" and rng.random() < 0.1:
                        raw[key] = 0.0
                    if s["reset"] == "created" and rng.random() < 0.1:
                        created[key] = created.get(key, 0.0) + 1.0
                    raw[key] = raw.get(key, 0.0) + g * (1.5 if sig.endswith("sum") else 1)
                    counters[key] = raw[key]
        page = sources.ParsedPage("vllm", counters, {k: created.get(k, 0.0) for k in counters},
                                  {("a", sources.RUNNING): 3.0}, {"a": 3},
                                  process_start)
        pair.poll(page, t)


def test_serve_without_controller_keeps_no_bucket_columns(tmp_path):
    """`specwatch serve` without a controller or A/B pairs builds no window histograms, so
    its histories keep no latency bucket columns (most of a vLLM model's ring,
    RSS per target); a pipeline whose derive config asks for histograms keeps them."""
    from specwatch.app.serve import ServeApp
    from specwatch.poll.pipeline import Pipeline, PollResult

    cfg = app_settings.build_config(None, ["a=http://127.0.0.1:9/metrics"], "127.0.0.1:0", 5.0)
    app = ServeApp(cfg, clock=lambda: 0.0)
    with_buckets = Pipeline([("a", "vllm")], derive.DeriveConfig(), 5.0)
    assert not app.pipeline.derive_config.histograms
    for i, text in enumerate(real_pages()[:3]):
        result = PollResult("a", 10.0 + 5 * i, 10.0 + 5 * i, 0.01, body=text)
        app.pipeline.apply(result)
        with_buckets.apply(result)
    lean = app.pipeline.target_history("a").models["tiny-llama"]
    full = with_buckets.target_history("a").models["tiny-llama"]
    bucket_keys = {k for k in full.cumulative if k[0] in sources.BUCKET_SIGNALS}
    assert len(bucket_keys) > 40  # the real page's three latency histograms
    assert lean.cumulative.keys() == full.cumulative.keys() - bucket_keys
    assert len(lean.entries.keys) < len(full.entries.keys) // 3


def test_serve_without_histograms_does_not_parse_bucket_lines():
    """Without window histograms the pipeline does not even parse the bucket lines (65 of the
    104 sample lines it reads on the real page, CPU per poll): the derived signals
    are those of a pipeline that reads them, and a broken bucket line, which only a reader of
    the buckets would need, no longer takes the target down."""
    from specwatch.poll.pipeline import Pipeline, PollResult

    lean = Pipeline([("a", "vllm")], derive.DeriveConfig(histograms=False), 5.0)
    full = Pipeline([("a", "vllm")], derive.DeriveConfig(), 5.0)
    pages = real_pages()
    for i, text in enumerate(pages[:6]):
        result = PollResult("a", 10.0 + 5 * i, 10.0 + 5 * i, 0.01, body=text)
        got, want = lean.apply(result), full.apply(result)
        assert got.up and want.up
        assert {m: [(w.window, w.values) for w in ms.windows] for m, ms in got.models.items()} \
            == {m: [(w.window, w.values) for w in ms.windows] for m, ms in want.models.items()}
    broken = pages[6].replace('vllm:inter_token_latency_seconds_bucket{',
                              'vllm:inter_token_latency_seconds_bucket{le=1,', 1)
    assert broken != pages[6]
    result = PollResult("a", 60.0, 60.0, 0.01, body=broken)
    assert lean.apply(result).up
    assert not full.apply(result).up
