"""History (per-series resets) and derive (windows, absence, ranges) without sockets."""

from __future__ import annotations

import random

import pytest
from helpers.ring import EntryRing, HistoryEntry
from helpers.ring import entry as ring_entry
from helpers.windows import derive_window, time_window_base

from specwatch.common.acceptance import (
    expected_acceptance_length,
    solve_token_acceptance_probability,
)
from specwatch.poll import sources
from specwatch.poll.windows import bimodality, derive, history
from specwatch.poll.windows.derive import DeriveConfig

M = "m"


def page(series: dict[tuple[str, tuple], float], created: dict | None = None,
         process_start: float | None = None, k: int | None = None) -> sources.ParsedPage:
    """A parsed page from {(signal, identity): value} for model M."""
    counters = {(M, sig, ident): v for (sig, ident), v in series.items()}
    return sources.ParsedPage(
        engine="vllm", counters=counters,
        created={(M, s, i): v for (s, i), v in (created or {}).items()},
        configured_k={M: k} if k else {}, process_start_time=process_start)


def eng(e: str) -> tuple:
    return (("engine", e),)


def new_history() -> history.TargetHistory:
    return history.TargetHistory(retention_seconds=3600, max_entries=1000,
                                 min_drafts_per_sample=1)


def total(h: history.TargetHistory, sig: str) -> float:
    return ring_entry(h.models[M].entries, -1).counters[(sig, None)]


def test_one_engine_restart_among_several_is_detected_per_series():
    """Engine 1 restarts while engine 0 keeps counting: the summed value rises (so a
    sum-then-diff exporter sees nothing), but per-series detection counts engine 1's new
    value and one reset."""
    h = new_history()
    h.update(page({(sources.DRAFTS, eng("0")): 1000, (sources.DRAFTS, eng("1")): 100}), 0)
    assert not h.update(page({(sources.DRAFTS, eng("0")): 1500,
                              (sources.DRAFTS, eng("1")): 300}), 10)
    assert total(h, sources.DRAFTS) == 700
    assert h.update(page({(sources.DRAFTS, eng("0")): 2100,
                          (sources.DRAFTS, eng("1")): 50}), 20)
    assert total(h, sources.DRAFTS) == 700 + 600 + 50
    assert h.resets_total == 1


def test_restart_that_climbed_past_old_value_is_caught_by_created():
    """A restarted counter already above its old value: _created changed, so the whole
    value is new work, not the difference."""
    h = new_history()
    key = (sources.DRAFTS, eng("0"))
    h.update(page({key: 100}, created={key: 1000.0}), 0)
    h.update(page({key: 150}, created={key: 5000.0}), 10)
    assert total(h, sources.DRAFTS) == 150 and h.resets_total == 1


def test_process_start_change_resets_every_series():
    h = new_history()
    key = (sources.DRAFTS, eng("0"))
    h.update(page({key: 100}, process_start=1.0), 0)
    h.update(page({key: 120}, process_start=2.0), 10)
    assert total(h, sources.DRAFTS) == 120 and h.resets_total == 1


def test_series_that_vanish_and_return():
    """A LoRA adapter's series vanish for a poll: while gone no derived series for it; when
    they return higher the increase counts, when lower it is a reset (never negative)."""
    h = new_history()
    lora = (sources.REQUESTS_FINISHED, (("engine", "0"), ("lora", "x")))
    base = (sources.REQUESTS_FINISHED, eng("0"))
    h.update(page({base: 10, lora: 5}), 0)
    h.update(sources.ParsedPage(engine="vllm", counters={("other", sources.DRAFTS, ()): 1}), 5)
    assert M not in h.present_models
    h.update(page({base: 12, lora: 9}), 10)
    assert total(h, sources.REQUESTS_FINISHED) == 2 + 4
    h.update(page({base: 13, lora: 2}), 20)
    assert total(h, sources.REQUESTS_FINISHED) == 2 + 4 + 1 + 2
    assert h.resets_total == 1


def test_random_resets_never_give_negative_deltas():
    """Property: random increases and random restarts of each of 4 engines never make a
    cumulative total decrease, and every reset poll is counted."""
    rng = random.Random(7)
    h = new_history()
    values = {e: 0.0 for e in "0123"}
    last = 0.0
    resets = 0
    for t in range(200):
        reset_now = False
        for e in values:
            if t > 0 and rng.random() < 0.05:
                values[e] = rng.random() * min(10.0, values[e])  # strictly lower
                reset_now = True
            else:
                values[e] += rng.random() * 100
        counted = h.update(page({(sources.DRAFTS, eng(e)): v for e, v in values.items()}), t)
        resets += counted
        now = total(h, sources.DRAFTS)
        assert now >= last
        last = now
        assert counted or not reset_now or t == 0
    assert h.resets_total == resets > 0


def entry(t, **c) -> HistoryEntry:
    return HistoryEntry(t, {(k, None): v for k, v in c.items()})


def test_empty_window_is_absent_not_zero():
    """No drafts and no finished requests in the window: acceptance, lengths, latency are
    absent; arrival rate is a true 0 (requests per second over elapsed time)."""
    a = entry(0, drafts=10, draft_tokens=30, accepted_tokens=20, requests_finished=5,
              e2e_latency_seconds_sum=10, e2e_latency_seconds_count=5)
    b = entry(60, drafts=10, draft_tokens=30, accepted_tokens=20, requests_finished=5,
              e2e_latency_seconds_sum=10, e2e_latency_seconds_count=5)
    w = derive_window("1m", a, b, 3, {})
    assert w is not None
    for name in (derive.ACCEPTANCE_RATE, derive.ACCEPTANCE_LENGTH, derive.DRAFT_LENGTH,
                 derive.TOKEN_ACCEPTANCE_PROBABILITY, derive.MEAN_LATENCY_SECONDS,
                 derive.EFFECTIVE_BATCH_SIZE):
        assert name not in w.values
    assert w.values[derive.ARRIVAL_RATE] == 0.0
    assert derive_window("1m", a, a, 3, {}) is None


def test_ratios_stay_in_range_on_inconsistent_counters():
    """Counters read mid-update (accepted ahead of drafted): ratios clamp into [0, 1] and the
    acceptance length stays within 1 .. draft length + 1."""
    a = entry(0, drafts=0, draft_tokens=0, accepted_tokens=0)
    b = entry(10, drafts=10, draft_tokens=30, accepted_tokens=45)
    w = derive_window("1m", a, b, 3, {})
    assert w.values[derive.ACCEPTANCE_RATE] == 1.0
    assert w.values[derive.ACCEPTANCE_LENGTH] == 4.0
    assert w.values[derive.TOKEN_ACCEPTANCE_PROBABILITY] == 1.0


def test_count_window_uses_last_n_requests():
    hist = history.ModelHistory(M, entries=EntryRing(
        [entry(t, requests_finished=r, drafts=r, draft_tokens=3 * r, accepted_tokens=r)
         for t, r in ((0, 0), (10, 400), (20, 900), (30, 1300))]))
    cfg = DeriveConfig(windows=(("1m", 60.0),), count_window=1000)
    snap = derive.derive_model(hist, cfg, "vllm")
    w = snap.window("1000req")
    assert w is not None and w.span_seconds == 30 and w.requests == 1300
    small = derive.derive_model(hist, DeriveConfig(count_window=500), "vllm").window("500req")
    assert small.span_seconds == 20 and small.requests == 900
    none = derive.derive_model(hist, DeriveConfig(count_window=2000), "vllm")
    assert none.window("2000req") is None


def test_time_window_base_selection():
    es = [entry(t) for t in (0, 30, 60, 90, 120)]
    assert time_window_base(es, 60).t == 60
    assert time_window_base(es, 1000).t == 0  # partial window at start-up
    assert time_window_base(es[:1], 60) is None


@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.5, 0.77, 0.99])
@pytest.mark.parametrize("k", [1, 3, 4.5, 8])
def test_alpha_inverts_expected_length(alpha, k):
    e = expected_acceptance_length(alpha, k)
    assert solve_token_acceptance_probability(e, k) == pytest.approx(alpha, abs=1e-9)


def test_bimodality_coefficient_separates_one_mode_from_two():
    rng = random.Random(1)
    one = [rng.gauss(0.6, 0.05) for _ in range(200)]
    two = [rng.gauss(0.1, 0.03) for _ in range(100)] + [rng.gauss(0.7, 0.03) for _ in range(100)]
    assert bimodality.sarle_coefficient(one) < bimodality.BIMODALITY_THRESHOLD
    assert bimodality.sarle_coefficient(two) > bimodality.BIMODALITY_THRESHOLD
    assert bimodality.sarle_coefficient([0.5] * 20) is None
    assert bimodality.sarle_coefficient([0.1, 0.2, 0.3]) is None


def test_heterogeneity_is_zero_for_iid_and_one_for_all_or_nothing():
    """i.i.d. acceptance (p1 = p0²) gives 0; a 50/50 mix of always/never accepted drafts
    (p1 = p0) gives 1."""
    base = entry(0, drafts=0, draft_tokens=0, accepted_tokens=0)

    def with_pos(p0, p1):
        c = {("drafts", None): 1000.0, ("draft_tokens", None): 2000.0,
             ("accepted_tokens", None): 1000 * (p0 + p1),
             (sources.ACCEPTED_PER_POSITION, "0"): 1000 * p0,
             (sources.ACCEPTED_PER_POSITION, "1"): 1000 * p1}
        return derive_window("1m", base, HistoryEntry(10, c), 2, {})

    assert with_pos(0.6, 0.36).values[derive.ACCEPTANCE_HETEROGENEITY] == pytest.approx(0)
    assert with_pos(0.5, 0.5).values[derive.ACCEPTANCE_HETEROGENEITY] == pytest.approx(1)
    w = with_pos(0.6, 0.3)  # decaying acceptance: clamps at 0
    assert w.values[derive.ACCEPTANCE_HETEROGENEITY] == 0.0
    assert w.positions[derive.POSITION_CONDITIONAL_ACCEPTANCE_RATE]["1"] == pytest.approx(0.5)
