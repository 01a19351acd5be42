"""Measured A/B pairs in the exporter (specwatch.exporter.pairs) and their configuration.

Driven with hand-made target snapshots (a window's arrival rate, request count, mean latency
and histogram increases), so every exposed value is known: ratios are baseline / SD of
exact means and PromQL-interpolated quantiles; a bin where a side lacks requests, or a side
without data, has no series at all (never 0); segments never overlap; old ones expire.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from specwatch.common.errors import ConfigError
from specwatch.exporter import config, derive
from specwatch.exporter.pairs import (
    PairConfig,
    PairSettings,
    PairTracker,
    bin_index,
    bin_labels,
)
from specwatch.exporter.snapshot import ModelSnapshot, TargetSnapshot, WindowSignals

MODEL = "llama"
BINS = (0.0, 2.0, 4.0, 8.0)


def hist(latency: float, n: float) -> tuple[tuple[float, float], ...]:
    """All n requests in the bucket ending at `latency` (buckets 0.5, 1, 2, 4, 8, +Inf)."""
    out, bounds = [], (0.5, 1.0, 2.0, 4.0, 8.0, float("inf"))
    for b in bounds:
        out.append((b, n if b >= latency else 0.0))
    return tuple(out)


def target(name: str, t: float, rate: float, latency: float, span: float = 60.0,
           up: bool = True, k: int = 0) -> TargetSnapshot:
    n = rate * span
    values = {derive.ARRIVAL_RATE: rate, derive.MEAN_LATENCY_SECONDS: latency,
              derive.MEAN_PROMPT_TOKENS: 500.0, derive.MEAN_GENERATION_TOKENS: 100.0}
    if k:
        values.update({derive.DRAFT_LENGTH: float(k), derive.ACCEPTANCE_LENGTH: 1.0 + k / 2})
    w = WindowSignals("1m", values, span_seconds=span, requests=n, drafts=40.0 * n if k else 0.0,
                      histograms={"e2e_latency_seconds": hist(latency, n),
                                  "ttft_seconds": hist(latency / 4, n)})
    model = ModelSnapshot(MODEL, "vllm", 3, (w,))
    return TargetSnapshot(name, up, timestamp=t, last_success_timestamp=t if up else None,
                          models={MODEL: model} if up else {})


def tracker(min_requests: float = 50, retention: float = 3600.0) -> PairTracker:
    return PairTracker([PairConfig("ab", "sd", "base")],
                       PairSettings(window="1m", min_requests=min_requests,
                                    retention_seconds=retention, bins=BINS), 60.0)


def series(tr: PairTracker) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in tr.families():
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(tr: PairTracker, name: str, **labels: str) -> float | None:
    want = {"pair": "ab", "model_name": MODEL, **labels}
    hits = [v for (n, lbl), v in series(tr).items()
            if n == name and all(dict(lbl).get(k) == x for k, x in want.items())]
    assert len(hits) <= 1
    return hits[0] if hits else None


def test_bins_and_labels():
    assert bin_labels(BINS) == ["0-2", "2-4", "4-8", "8-+Inf"]
    assert bin_index(BINS, 0.0) == 0 and bin_index(BINS, 2.0) == 1
    assert bin_index(BINS, 100.0) == 3
    assert bin_index((1.0, 2.0), 0.5) is None  # below the first edge: no bin


def test_speedup_is_baseline_over_sd_in_each_bin():
    tr = tracker()
    for i in range(1, 4):  # three 1-minute segments at 3 req/s: SD 1.5 s, baseline 3 s
        tr.observe(target("sd", 60.0 * i, 3.0, 1.5))
        tr.observe(target("base", 60.0 * i, 3.0, 3.0))
    assert value(tr, "sd_measured_speedup", arrival_rate_bin="2-4", statistic="mean") == \
        pytest.approx(2.0)
    # Quantiles interpolate inside one bucket per side: p50 of 180 requests in (1, 2] vs
    # (2, 4]: 1.5 and 3.0, ratio 2.
    assert value(tr, "sd_measured_speedup", arrival_rate_bin="2-4", statistic="p50") == \
        pytest.approx(3.0 / 1.5)
    assert value(tr, "sd_measured_ttft_ratio", arrival_rate_bin="2-4", statistic="p99") \
        is not None
    assert value(tr, "sd_measured_arrival_rate", arrival_rate_bin="2-4") == pytest.approx(3.0)
    assert value(tr, "sd_measured_requests", arrival_rate_bin="2-4", side="sd") == 540.0
    assert value(tr, "sd_measured_latency_seconds", arrival_rate_bin="2-4", side="base") \
        is None  # the side label is "baseline"
    assert value(tr, "sd_measured_latency_seconds", arrival_rate_bin="2-4",
                 side="baseline") == pytest.approx(3.0)
    assert value(tr, "sd_pair_current_arrival_rate_bin", arrival_rate_bin="2-4") == 1.0
    # No other bin has a series: no data is no series, never 0.
    bins = {dict(lbl).get("arrival_rate_bin") for (n, lbl) in series(tr)
            if n == "sd_measured_speedup"}
    assert bins == {"2-4"}


def test_absent_when_a_side_has_no_data_or_too_few_requests():
    tr = tracker(min_requests=100)
    tr.observe(target("sd", 60.0, 3.0, 1.5))
    assert value(tr, "sd_measured_speedup", arrival_rate_bin="2-4", statistic="mean") is None
    tr.observe(target("base", 60.0, 1.0, 3.0))  # 60 requests < 100, in bin 0-2... but binned
    # by the larger of the two sides' rates (3 req/s): bin 2-4, still too few requests
    assert value(tr, "sd_measured_speedup", arrival_rate_bin="2-4", statistic="mean") is None
    assert value(tr, "sd_measured_requests", arrival_rate_bin="2-4", side="baseline") == 60.0
    down = PairTracker([PairConfig("ab", "sd", "base")], PairSettings(bins=BINS), 60.0)
    down.observe(target("sd", 60.0, 3.0, 1.5))
    down.observe(target("base", 60.0, 3.0, 3.0, up=False))
    # The baseline never answered: the pair's models are unknown, nothing is exposed.
    assert list(down.families()) == []
    # With the model named in the pair, the SD side's own figures are (no comparison).
    named = PairTracker([PairConfig("ab", "sd", "base", MODEL)], PairSettings(bins=BINS), 60.0)
    named.observe(target("sd", 60.0, 3.0, 1.5))
    names = {f.name for f in named.families()}
    assert "sd_pair_current_arrival_rate_bin" in names
    assert not names & {"sd_measured_speedup", "sd_measured_ttft_ratio",
                        "sd_measured_inter_token_latency_ratio", "sd_measured_arrival_rate"}


def test_segments_do_not_overlap_and_young_windows_wait():
    tr = tracker()
    tr.observe(target("sd", 30.0, 3.0, 1.5, span=30.0))  # young: not a segment
    tr.observe(target("sd", 60.0, 3.0, 1.5))
    tr.observe(target("sd", 65.0, 3.0, 1.5))  # overlaps the last segment: skipped
    tr.observe(target("sd", 120.0, 3.0, 1.5))
    tr.observe(target("base", 60.0, 3.0, 3.0))
    assert value(tr, "sd_measured_requests", arrival_rate_bin="2-4", side="sd") == 360.0


def test_old_segments_expire():
    tr = tracker(retention=120.0)
    tr.observe(target("sd", 60.0, 3.0, 1.5))
    tr.observe(target("base", 60.0, 3.0, 3.0))
    assert value(tr, "sd_measured_speedup", arrival_rate_bin="2-4", statistic="mean")
    for t in (120.0, 180.0, 240.0):  # the load moved to 6 req/s; the 2-4 bin ages out
        tr.observe(target("sd", t, 6.0, 1.5))
        tr.observe(target("base", t, 6.0, 1.0))
    assert value(tr, "sd_measured_speedup", arrival_rate_bin="2-4", statistic="mean") is None
    slow = value(tr, "sd_measured_speedup", arrival_rate_bin="4-8", statistic="mean")
    assert slow == pytest.approx(1.0 / 1.5)
    assert value(tr, "sd_pair_current_arrival_rate_bin", arrival_rate_bin="4-8") == 1.0


def test_a_draft_length_change_starts_the_side_over():
    """A bin never mixes two configurations of one side: after the SD side comes back with
    another k, its older segments (another system) are dropped, the baseline's stay."""
    tr = tracker()
    for t in (60.0, 120.0):
        tr.observe(target("sd", t, 3.0, 1.5, k=2))
        tr.observe(target("base", t, 3.0, 3.0))
    assert value(tr, "sd_measured_draft_length", arrival_rate_bin="2-4", side="sd") == 2.0
    tr.observe(target("sd", 180.0, 3.0, 1.2, k=4))
    tr.observe(target("base", 180.0, 3.0, 3.0))
    assert value(tr, "sd_measured_draft_length", arrival_rate_bin="2-4", side="sd") == 4.0
    assert value(tr, "sd_measured_requests", arrival_rate_bin="2-4", side="sd") == 180.0
    assert value(tr, "sd_measured_requests", arrival_rate_bin="2-4", side="baseline") == 540.0
    assert value(tr, "sd_measured_latency_seconds", arrival_rate_bin="2-4",
                 side="sd") == pytest.approx(1.2)


def test_a_window_straddling_a_load_change_is_not_binned():
    """A segment whose rate is more than 30% off the side's previous one mixes two loads
    (requests that started under one and finished under the other): not a measurement."""
    tr = tracker(min_requests=1)
    for t, rate in ((60.0, 1.0), (120.0, 1.0), (180.0, 3.0), (240.0, 3.0), (300.0, 3.3)):
        tr.observe(target("sd", t, rate, 1.5))
        tr.observe(target("base", t, rate, 3.0))
    assert value(tr, "sd_measured_requests", arrival_rate_bin="0-2", side="sd") == 120.0
    # 180 s straddles 1 -> 3 req/s; 240 s and 300 s (3.3: within 30%) count.
    assert value(tr, "sd_measured_requests", arrival_rate_bin="2-4", side="sd") == 378.0


def write(tmp_path: Path, doc: dict) -> str:
    path = tmp_path / "specwatch.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


TARGETS = [{"name": "a", "url": "http://a:8000/metrics"},
           {"name": "b", "url": "http://b:8000/metrics"}]


def test_config_reads_pairs_and_per_model_bins(tmp_path):
    cfg = config.build_config(write(tmp_path, {
        "targets": TARGETS,
        "pairs": [{"name": "canary", "sd": "a", "baseline": "b", "model": "llama"}],
        "pair_options": {"window": "5m", "min_requests": 20, "retention": "2h",
                         "arrival_rate_bins": [0, 1, 5],
                         "models": {"qwen": {"arrival_rate_bins": [0, 10, 20]}}},
    }), [], None, None)
    assert cfg.pairs == (PairConfig("canary", "a", "b", "llama"),)
    s = cfg.pair_settings
    assert (s.window, s.min_requests, s.retention_seconds) == ("5m", 20, 7200.0)
    assert s.bins_for("llama") == (0.0, 1.0, 5.0)
    assert s.bins_for("qwen") == (0.0, 10.0, 20.0)


@pytest.mark.parametrize(("pairs", "options", "message"), [
    ([{"name": "p", "sd": "a", "baseline": "zz"}], {}, "pairs[0].baseline: no target named"),
    ([{"name": "p", "sd": "a", "baseline": "a"}], {}, "the same target as sd"),
    ([{"name": "p", "sd": "a", "baseline": "b"}, {"name": "p", "sd": "b", "baseline": "a"}],
     {}, "pairs[1].name: duplicate pair name"),
    ([{"name": "p", "sd": "a", "baseline": "b"}], {"window": "2m"},
     "pair_options.window: '2m' is not one of the exporter's windows"),
    ([{"name": "p", "sd": "a", "baseline": "b"}], {"arrival_rate_bins": [0, 2, 1]},
     "increasing bin edges"),
    ([{"name": "p", "sd": "a"}], {}, "baseline"),
])
def test_config_errors_name_the_key(tmp_path, pairs, options, message):
    doc = {"targets": TARGETS, "pairs": pairs}
    if options:
        doc["pair_options"] = options
    with pytest.raises(ConfigError) as err:
        config.build_config(write(tmp_path, doc), [], None, None)
    assert message in str(err.value)
