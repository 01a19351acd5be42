"""Measured A/B pairs in the exporter (specwatch.plugins.pairs.plugin) and their configuration.

Driven with hand-made target snapshots (a window's arrival rate, request count, mean latency
and histogram increases), so every exposed value is known: ratios are baseline / SD of
exact means and PromQL-interpolated quantiles; a bin where a side lacks requests, or a side
without data, has no series at all (never 0); segments never overlap; old ones expire.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from scipy import optimize

from specwatch.app import settings as app_settings
from specwatch.common.errors import ConfigError
from specwatch.plugins.pairs.plugin import PairTracker, bin_index, bin_labels
from specwatch.plugins.pairs.settings import SECTION as PAIRS
from specwatch.plugins.pairs.settings import PairConfig, PairSettings, shard_keys
from specwatch.plugins.pairs.stats import max_variance, quantile_ratio
from specwatch.poll.formulas import histogram_quantile
from specwatch.poll.snapshot import ModelSnapshot, TargetSnapshot, WindowSignals
from specwatch.poll.windows import derive

MODEL = "llama"
BINS = (0.0, 2.0, 4.0, 8.0)


def hist(latency: float, n: float) -> tuple[tuple[float, float], ...]:
    """All n requests in the bucket ending at `latency` (buckets 0.5, 1, 2, 4, 8, +Inf)."""
    out, bounds = [], (0.5, 1.0, 2.0, 4.0, 8.0, float("inf"))
    for b in bounds:
        out.append((b, n if b >= latency else 0.0))
    return tuple(out)


def target(name: str, t: float, rate: float, latency: float, span: float = 60.0,
           up: bool = True, k: float = 0, acc: float = 0.8, configured: int | None = None,
           engine: str = "vllm") -> TargetSnapshot:
    """One poll of a side: ``k`` the effective draft length of the window (0: SD off),
    ``configured`` the configured k (default: k rounded), ``acc`` its acceptance rate."""
    n = rate * span
    values = {derive.ARRIVAL_RATE: rate, derive.MEAN_LATENCY_SECONDS: latency,
              derive.MEAN_PROMPT_TOKENS: 500.0, derive.MEAN_GENERATION_TOKENS: 100.0,
              derive.ACCEPTANCE_RATE: acc}
    if k:
        values.update({derive.DRAFT_LENGTH: float(k), derive.ACCEPTANCE_LENGTH: 1.0 + k / 2})
    w = WindowSignals("1m", values, span_seconds=span, requests=n, drafts=40.0 * n if k else 0.0,
                      histograms={"e2e_latency_seconds": hist(latency, n),
                                  "ttft_seconds": hist(latency / 4, n)})
    conf = (configured if configured is not None else round(k)) if k else None
    model = ModelSnapshot(MODEL, engine, conf, (w,), sd_families_present=bool(k))
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
    # Four 1-minute segments at 3 req/s: SD 1.5 s, baseline 3 s. A segment is filed when
    # the next one of its side is in: three are.
    for i in range(1, 5):
        tr.observe(target("sd", 60.0 * i, 3.0, 1.5))
        tr.observe(target("base", 60.0 * i, 3.0, 3.0))
    assert value(tr, "sd_measured_speedup", arrival_rate_bin="2-4", statistic="mean") == \
        pytest.approx(2.0)
    # The two sides' medians are in different buckets ((1, 2] and (2, 4]): resolved, and
    # interpolated: 1.5 and 3.0, ratio 2.
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
    assert value(tr, "sd_pair_current_arrival_rate_bin", arrival_rate_bin="2-4",
                 acceptance_band="0.75-1") == 1.0
    # No other bin has a series: no data is no series, never 0.
    bins = {(dict(lbl).get("arrival_rate_bin"), dict(lbl).get("acceptance_band"))
            for (n, lbl) in series(tr) if n == "sd_measured_speedup"}
    assert bins == {("2-4", "0.75-1")}
    # The interval holds the point; every request sits in one bucket per side, so it is
    # as wide as those buckets leave it (Bhatia-Davis), not zero.
    lo = value(tr, "sd_measured_speedup_lower", arrival_rate_bin="2-4", statistic="mean")
    hi = value(tr, "sd_measured_speedup_upper", arrival_rate_bin="2-4", statistic="mean")
    assert lo < 2.0 < hi
    sd_rel = math.sqrt((2.0 - 1.5) * (1.5 - 1.0) / 540) / 1.5
    base_rel = math.sqrt((4.0 - 3.0) * (3.0 - 2.0) / 540) / 3.0
    half = 1.6448536 * math.sqrt(sd_rel ** 2 + base_rel ** 2)
    assert (lo, hi) == pytest.approx((2.0 * math.exp(-half), 2.0 * math.exp(half)), rel=1e-6)


def test_absent_when_a_side_has_no_data_or_too_few_requests():
    tr = tracker(min_requests=100)
    tr.observe(target("sd", 60.0, 3.0, 1.5))
    tr.observe(target("sd", 120.0, 3.0, 1.5))
    assert value(tr, "sd_measured_speedup", arrival_rate_bin="2-4", statistic="mean") is None
    tr.observe(target("base", 60.0, 1.0, 3.0))  # 60 requests < 100, in bin 0-2... but binned
    tr.observe(target("base", 120.0, 1.0, 3.0))
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
    tr.observe(target("sd", 180.0, 3.0, 1.5))  # files the one before it
    tr.observe(target("base", 60.0, 3.0, 3.0))
    assert value(tr, "sd_measured_requests", arrival_rate_bin="2-4", side="sd") == 360.0


def test_old_segments_expire():
    tr = tracker(retention=120.0)
    for t in (60.0, 120.0, 180.0):
        tr.observe(target("sd", t, 3.0, 1.5))
        tr.observe(target("base", t, 3.0, 3.0))
    assert value(tr, "sd_measured_speedup", arrival_rate_bin="2-4", statistic="mean")
    for t in (240.0, 300.0, 360.0, 420.0):  # the load moved to 6 req/s; the 2-4 bin ages out
        tr.observe(target("sd", t, 6.0, 1.5))
        tr.observe(target("base", t, 6.0, 1.0))
    assert value(tr, "sd_measured_speedup", arrival_rate_bin="2-4", statistic="mean") is None
    slow = value(tr, "sd_measured_speedup", arrival_rate_bin="4-8", statistic="mean")
    assert slow == pytest.approx(1.0 / 1.5)
    assert value(tr, "sd_pair_current_arrival_rate_bin", arrival_rate_bin="4-8") == 1.0


def test_a_configuration_change_starts_the_side_over():
    """A bin never mixes two configurations of one side: after the SD side comes back with
    another configured k, its older segments (another system) are dropped, the baseline's
    stay."""
    tr = tracker()
    for t in (60.0, 120.0, 180.0):
        tr.observe(target("sd", t, 3.0, 1.5, k=2))
        tr.observe(target("base", t, 3.0, 3.0))
    assert value(tr, "sd_measured_draft_length", arrival_rate_bin="2-4", side="sd") == 2.0
    for t in (240.0, 300.0):
        tr.observe(target("sd", t, 3.0, 1.2, k=4))
        tr.observe(target("base", t, 3.0, 3.0))
    assert value(tr, "sd_measured_draft_length", arrival_rate_bin="2-4", side="sd") == 4.0
    assert value(tr, "sd_measured_requests", arrival_rate_bin="2-4", side="sd") == 180.0
    assert value(tr, "sd_measured_requests", arrival_rate_bin="2-4", side="baseline") == 720.0
    assert value(tr, "sd_measured_latency_seconds", arrival_rate_bin="2-4",
                 side="sd") == pytest.approx(1.2)
    # Another engine behind the same name is another system too.
    tr.observe(target("sd", 360.0, 3.0, 1.2, k=4, engine="sglang"))
    assert value(tr, "sd_measured_requests", arrival_rate_bin="2-4", side="sd") is None


def test_a_moving_effective_draft_length_keeps_the_bins():
    """n-gram SD at k = 4 drafts what the prompt lookup finds: 3.4-3.7 tokens a draft,
    crossing 3.5 back and forth. The configured k does not move, so neither do the bins
    (rounding the effective length once read every crossing as a restart)."""
    tr = tracker()
    lengths = (3.4, 3.6, 3.45, 3.7, 3.4, 3.55)
    for i, k in enumerate(lengths, start=1):
        tr.observe(target("sd", 60.0 * i, 3.0, 1.5, k=k, configured=4))
        tr.observe(target("base", 60.0 * i, 3.0, 3.0))
    n = (len(lengths) - 1) * 180.0
    assert value(tr, "sd_measured_requests", arrival_rate_bin="2-4", side="sd") == n
    assert value(tr, "sd_measured_speedup", arrival_rate_bin="2-4", statistic="mean") == \
        pytest.approx(2.0)


def test_a_window_straddling_a_load_change_is_not_binned():
    """A segment whose rate is more than 30% off both its neighbours' mixes two loads
    (requests that started under one and finished under the other): not a measurement. One
    like the segment after it (the first at a new load) is."""
    tr = tracker(min_requests=1)
    for t, rate in ((60.0, 1.0), (120.0, 1.0), (180.0, 2.0), (240.0, 3.0), (300.0, 3.3),
                    (360.0, 3.3)):
        tr.observe(target("sd", t, rate, 1.5))
        tr.observe(target("base", t, rate, 3.0))
    assert value(tr, "sd_measured_requests", arrival_rate_bin="0-2", side="sd") == 120.0
    # 180 s straddles 1 -> 3 req/s (2.0: 50% and 33% off); 240 s and 300 s count.
    assert value(tr, "sd_measured_requests", arrival_rate_bin="2-4", side="sd") == 378.0


def test_bins_belong_to_one_acceptance_regime():
    """Acceptance falls from 0.8 to 0.1 at the same load (a temperature change): the
    segments after it go to another band, the one straddling it (0.45) to none, and the
    pair's current bin points at the new band, so the old regime's point is not drawn
    beside the current curve; the old band keeps its own figure."""
    tr = tracker()
    plan = [(0.8, 1.5)] * 4 + [(0.45, 2.5)] + [(0.1, 3.6)] * 4
    for i, (acc, lat) in enumerate(plan, start=1):
        tr.observe(target("sd", 60.0 * i, 3.0, lat, acc=acc))
        tr.observe(target("base", 60.0 * i, 3.0, 3.0))
    high = value(tr, "sd_measured_speedup", arrival_rate_bin="2-4", acceptance_band="0.75-1",
                 statistic="mean")
    low = value(tr, "sd_measured_speedup", arrival_rate_bin="2-4", acceptance_band="0-0.25",
                statistic="mean")
    assert high == pytest.approx(2.0)  # no segment of the low regime in it
    assert low == pytest.approx(3.0 / 3.6)  # and none of the high one here
    assert value(tr, "sd_measured_requests", arrival_rate_bin="2-4",
                 acceptance_band="0.25-0.5", side="sd") is None
    assert value(tr, "sd_measured_requests", arrival_rate_bin="2-4",
                 acceptance_band="0-0.25", side="baseline") == 3 * 180.0
    current = {dict(lbl)["acceptance_band"] for (n, lbl) in series(tr)
               if n == "sd_pair_current_arrival_rate_bin"}
    assert current == {"0-0.25"}


@pytest.mark.parametrize(("sd", "base", "exposed"), [
    # Both medians in vLLM's first e2e bucket (0, 0.3]: interpolation reads 1 whatever the
    # truth; absent.
    ([(0.3, 100), (0.5, 100), (float("inf"), 100)],
     [(0.3, 100), (0.5, 100), (float("inf"), 100)], False),
    # Different buckets: resolved.
    ([(0.3, 100), (0.5, 100), (float("inf"), 100)],
     [(0.3, 0), (0.5, 100), (float("inf"), 100)], True),
    # One bucket (1.0, 1.05]: narrow (5%), resolved.
    ([(1.0, 0), (1.05, 100), (float("inf"), 100)],
     [(1.0, 0), (1.05, 100), (float("inf"), 100)], True),
    # One bucket (1, 1.5]: 50% wide, absent.
    ([(1.0, 0), (1.5, 100), (float("inf"), 100)],
     [(1.0, 0), (1.5, 100), (float("inf"), 100)], False),
    # A quantile in the +Inf bucket has no upper end: absent.
    ([(1.0, 0), (float("inf"), 100)], [(1.0, 100), (float("inf"), 100)], False),
])
def test_quantile_ratios_only_where_the_buckets_resolve_them(sd, base, exposed):
    r = quantile_ratio(0.5, tuple(sd), tuple(base))
    assert (r is not None) == exposed
    if exposed:
        assert r == pytest.approx(histogram_quantile(0.5, base)
                                  / histogram_quantile(0.5, sd))


@pytest.mark.parametrize("mean", [0.29, 0.3, 0.45, 0.6, 0.72])
def test_max_variance_is_the_linear_programs_optimum(mean):
    """The bucket-bound variance equals an independent linear program's optimum (scipy):
    bucket means m_b in [lo, hi], sum n_b m_b = n mean, maximise sum n_b (m_b (lo + hi) - lo
    hi)."""
    buckets = ((0.3, 40.0), (0.5, 70.0), (1.0, 90.0), (2.5, 100.0), (float("inf"), 100.0))
    rows = [(40.0, 0.0, 0.3), (30.0, 0.3, 0.5), (20.0, 0.5, 1.0), (10.0, 1.0, 2.5)]
    n = 100.0
    # The exact mean lies between every request at its bucket's low and high end.
    assert sum(c * lo for c, lo, _ in rows) / n <= mean <= sum(c * hi for c, _, hi in rows) / n
    res = optimize.linprog(
        c=[-c * (lo + hi) for c, lo, hi in rows],
        A_eq=[[c for c, _, _ in rows]], b_eq=[n * mean],
        bounds=[(lo, hi) for _, lo, hi in rows])
    assert res.success
    best = (-res.fun - sum(c * lo * hi for c, lo, hi in rows)) / n - mean * mean
    assert max_variance(buckets, mean) == pytest.approx(best, rel=1e-9, abs=1e-12)
    assert max_variance(((1.0, 0.0), (float("inf"), 5.0)), 3.0) is None


def test_shard_keys_put_both_sides_of_a_pair_together():
    keys = shard_keys([PairConfig("ab", "a", "b"), PairConfig("cd", "c", "d"),
                       PairConfig("ce", "c", "e"), PairConfig("zz", "z", "b")])
    # a shared baseline (b) or SD side (c) joins its pairs into one group: its first name.
    assert keys == {"a": "ab", "b": "ab", "z": "ab", "c": "cd", "d": "cd", "e": "cd"}


def write(tmp_path: Path, doc: dict) -> str:
    path = tmp_path / "specwatch.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


TARGETS = [{"name": "a", "url": "http://a:8000/metrics"},
           {"name": "b", "url": "http://b:8000/metrics"}]


def test_config_reads_pairs_and_per_model_bins(tmp_path):
    cfg = app_settings.build_config(write(tmp_path, {
        "targets": TARGETS,
        "pairs": [{"name": "canary", "sd": "a", "baseline": "b", "model": "llama"}],
        "pair_options": {"window": "5m", "min_requests": 20, "retention": "2h",
                         "arrival_rate_bins": [0, 1, 5],
                         "models": {"qwen": {"arrival_rate_bins": [0, 10, 20]}}},
    }), [], None, None)
    assert cfg.section(PAIRS).pairs == (PairConfig("canary", "a", "b", "llama"),)
    s = cfg.section(PAIRS).settings
    assert (s.window, s.min_requests, s.retention_seconds) == ("5m", 20, 7200.0)
    assert s.bins_for("llama") == (0.0, 1.0, 5.0)
    assert s.bins_for("qwen") == (0.0, 10.0, 20.0)
    assert s.acceptance_bands == (0.0, 0.25, 0.5, 0.75)


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
    ([{"name": "p\n", "sd": "a", "baseline": "b"}], {}, "pairs[0].name: expected a target name"),
    ([{"name": "p", "sd": "a", "baseline": "b"}], {"acceptance_bands": [0.2, 0.5]},
     "pair_options.acceptance_bands: expected increasing acceptance-rate band edges from 0"),
    ([{"name": "p", "sd": "a", "baseline": "b"}], {"acceptance_bands": [0, 0.5, 1]},
     "pair_options.acceptance_bands"),
])
def test_config_errors_name_the_key(tmp_path, pairs, options, message):
    doc = {"targets": TARGETS, "pairs": pairs}
    if options:
        doc["pair_options"] = options
    with pytest.raises(ConfigError) as err:
        app_settings.build_config(write(tmp_path, doc), [], None, None)
    assert message in str(err.value)


def test_current_speedup_is_the_series_of_the_bin_the_pair_is_at():
    """What the controller reads (current_speedup): the mean speedup and its interval of the
    bin and band the pair is at now, the same numbers as the exposed series; None for a
    target that is no pair's SD side, before a bin is compared, and once the load moved to
    a bin without enough requests."""
    tr = tracker()
    assert tr.current_speedup("sd", MODEL) is None
    for i in range(1, 5):
        tr.observe(target("sd", 60.0 * i, 3.0, 1.5, k=3))
        tr.observe(target("base", 60.0 * i, 3.0, 3.0))
    m = tr.current_speedup("sd", MODEL)
    assert m is not None and m.pair == "ab"
    cell = {"arrival_rate_bin": "2-4", "acceptance_band": "0.75-1", "statistic": "mean"}
    assert (m.speedup, m.lower, m.upper) == pytest.approx((
        value(tr, "sd_measured_speedup", **cell), value(tr, "sd_measured_speedup_lower", **cell),
        value(tr, "sd_measured_speedup_upper", **cell)))
    assert tr.current_speedup("base", MODEL) is None
    tr.observe(target("sd", 300.0, 6.0, 1.5, k=3))  # the load moved to the 4-8 bin
    assert tr.current_speedup("sd", MODEL) is None
