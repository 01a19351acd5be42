"""Regression test of the saturation-aware model on the public Qwen3-32B / H100 sweep.

Every figure the issue's acceptance list names is measured here, per drafter, by the same code
`specwatch calibrate` runs (calibrate.load_range), and docs/model.md quotes these numbers.
A target the interpretable form does not reach is an xfail(strict=True) whose reason states
the figure reached and why: it documents the miss and fails loudly the day it starts passing,
so no target is loosened silently.
"""


import numpy as np
import pytest
from helpers.paths import FIXTURES

from specwatch import model
from specwatch.calibrate.fit import FitOptions
from specwatch.calibrate.inputs import read_inputs
from specwatch.calibrate.leastsq import r_squared
from specwatch.calibrate.load_range import fit_system_saturation
from specwatch.calibrate.saturation import predicted_latency
from specwatch.model.validity import range_reasons

SWEEP = FIXTURES / "sd-validation" / (
    "tomasruizt_qwen3-32b_1xH100_vllm-bench.csv"
)
EAGLE = "Qwen3-32B+Qwen3-32B-speculator.eagle3"
SMALL = "Qwen3-32B+Qwen3-1.7B"
LARGE = "Qwen3-32B+Qwen3-4B"


@pytest.fixture(scope="module")
def points():
    return read_inputs([SWEEP])


@pytest.fixture(scope="module")
def fits(points):
    return {
        s: fit_system_saturation(s, [p for p in points if p.system == s])
        for s in (EAGLE, SMALL, LARGE)
    }


def _miss(reason):
    return pytest.mark.xfail(strict=True, reason=reason)


@pytest.mark.parametrize("system", [EAGLE, SMALL, LARGE])
def test_fit_error_over_all_points_and_at_high_concurrency(fits, system):
    """MAPE <= 5% over every run (concurrency 1..256), <= 10% over the runs at >= 80."""
    fit = fits[system]
    assert fit.mode == "saturation" and fit.n_excluded == 0
    assert fit.mape <= 0.05
    assert fit.saturation["mape_concurrency_ge_80"] <= 0.10


@pytest.mark.parametrize("system", [
    EAGLE,
    SMALL,
    pytest.param(LARGE, marks=_miss(
        "Qwen3-4B drafter: leave-c=128-out MAPE 22.7%. The whole-sweep fit has its KV-cache"
        " capacity (kv_cache_tokens_sd 29.5k tokens, ~86 requests), but a capacity is only"
        " identifiable from runs at two load levels past it (latency linear in B at constant"
        " λ); without c=128 only c=256 lies past it, so the fit falls back to the roofline"
        " terms. Setting it from c=256 alone gives 4.0%, but the same one-level rule sets one"
        " for Qwen3-1.7B too and moves its k=6 break-even from +14.7% to +16.8%")),
])
def test_leave_concurrency_128_out(fits, system):
    """Fit without concurrency 128, predict it: MAPE <= 10%."""
    loco = {x["concurrency"]: x["mape"] for x in fits[system].saturation[
        "leave_one_concurrency_out"]}
    assert loco[128.0] <= 0.10


@pytest.mark.parametrize("system", [EAGLE, SMALL, LARGE])
def test_breakeven_at_k3_within_15_percent_of_measured(fits, system):
    """Predicted λ* within 15% of the measured crossing (or SD ceiling) for k = 3."""
    rows = [b for b in fits[system].saturation["breakeven"]
            if b["k"] == 3 and b["measured"] is not None]
    assert rows, "the sweep has a measured break-even for k = 3"
    for b in rows:
        assert abs(b["relative_error"]) <= 0.15, b


def test_eagle3_k3_breakeven_is_the_measured_ceiling(fits):
    """The issue's headline: EAGLE-3 k=3 stops paying at about 14.6 req/s, not 25-27."""
    (b,) = [b for b in fits[EAGLE].saturation["breakeven"]
            if b["k"] == 3 and b["measured"] is not None]
    assert b["measured"] == pytest.approx(14.58, rel=0.01)
    assert 14.58 * 0.85 <= b["predicted"] <= 14.58 * 1.15


@pytest.mark.parametrize("system", [
    EAGLE,
    SMALL,
    pytest.param(LARGE, marks=_miss(
        "Qwen3-4B mt-bench k=6: predicted λ* 7.6 vs 5.8 req/s (+30.8%): that 'ceiling' is an"
        " 80-prompt burst at c=80 whose throughput n/duration is set by its slowest request"
        " (14.4 s against 11.0 s for k=5 at mean latencies 8.3 and 7.6 s; B = 46 against 56),"
        " not a capacity, and no mt-bench curve records a measured ceiling to bound it."
        " k=1 (the fit alone +17.0%: the roofline L(B) under-prices k=1 near the capacity)"
        " is -0.9% bounded by its measured ceiling")),
])
def test_breakeven_every_k_with_a_measured_crossing(fits, system):
    for b in fits[system].saturation["breakeven"]:
        if b["measured"] is not None:
            assert abs(b["relative_error"]) <= 0.15, b


def test_kv_cache_capacity_is_fitted_where_the_sweep_shows_it(fits):
    """The 4B drafter's runs at c=128 and c=256 wait for KV cache (TTFT 4.5-21 s at ~80
    running, throughput flat): its SD capacity is identifiable, at or above what the runs
    show running, and pricing it halves the error at c >= 80 (7.29% without). EAGLE-3 and
    the 1.7B drafter show no capacity at two load levels, and no system's no-SD runs do:
    those stay unset (no limit), the roofline fit unchanged."""
    large = fits[LARGE]
    cap = large.saturation["capacity_sd"]
    assert cap["identifiable"] and cap["runs_past"] == 12
    assert cap["floor_tokens_from_ttft"] <= cap["kv_cache_tokens"] <= 1.15 * cap[
        "floor_tokens_from_ttft"]
    assert large.coefficients.kv_cache_tokens_sd == cap["kv_cache_tokens"]
    assert 70 <= cap["requests_at_mean_length"] <= 100
    assert large.saturation["mape_concurrency_ge_80"] < 0.05
    for system in (EAGLE, SMALL, LARGE):
        sat = fits[system].saturation
        assert not sat["capacity_nosd"]["identifiable"]
        assert fits[system].coefficients.kv_cache_tokens == 0.0
    for system in (EAGLE, SMALL):
        assert not fits[system].saturation["capacity_sd"]["identifiable"]
        assert fits[system].coefficients.kv_cache_tokens_sd == 0.0


@pytest.mark.parametrize("system", [
    pytest.param(EAGLE, marks=_miss(
        "EAGLE-3 mt-bench c=8: measured best k=6 (4.40 s) vs predicted 4; k=4..6 measured"
        " within 2.3% of each other (4.50, 4.48, 4.40 s), inside run-to-run noise")),
    SMALL,
    LARGE,
])
def test_best_k_per_concurrency_within_one(fits, system):
    for row in fits[system].saturation["best_k"]:
        assert abs(row["measured"] - row["predicted"]) <= 1, row


def test_concurrency_64_subset_no_worse_than_the_linear_model(points):
    """On concurrency <= 64 (what the linear model was judged on): EAGLE-3 R² >= 0.98 and
    leave-one-k-out MAPE <= 3%."""
    pts = [p for p in points if p.system == EAGLE]
    fit = fit_system_saturation(EAGLE, pts, FitOptions(max_concurrency=64))
    assert fit.r2 >= 0.98
    assert fit.leave_one_k_out_mape <= 0.03


@pytest.mark.parametrize("system", [EAGLE, SMALL, LARGE])
def test_fit_on_concurrency_32_never_vouches_for_a_bad_64_plus_prediction(points, system):
    """A fit on concurrency <= 32 predicting a 64+ run: whenever it misses by more than 15%,
    the prediction is not `valid` (saturated, above the ceiling, or beyond the calibrated
    load), judged by the model and the params file's calibrated range as `predict` does."""
    pts = [p for p in points if p.system == system]
    fit = fit_system_saturation(system, pts, FitOptions(max_concurrency=32))
    coef = fit.coefficients
    far = [p for p in pts if p.concurrency >= 64]
    checked = 0
    for p in far:
        e = p.acceptance_length if p.sd else 1.0
        sysl = model.latency(coef, p.arrival_rate, p.draft_length, e, p.prompt_tokens,
                             p.generation_tokens)
        lat = float(sysl.latency)
        valid = bool(sysl.valid) and not range_reasons(
            fit.calibrated_range, p.arrival_rate,
            p.arrival_rate * lat if np.isfinite(lat) else None, p.draft_length)
        # What the fit predicts for this run where it has no open-loop point: L(B) at its B.
        miss = abs((lat if np.isfinite(lat) else float(predicted_latency(coef, [p])[0]))
                   / p.latency_s - 1.0)
        if miss > 0.15:
            checked += 1
            assert not valid, (p.source, miss)
    assert far


def test_whole_range_fit_is_better_than_extrapolating_the_linear_fit(points):
    """Why the saturation terms exist: at c >= 80 the whole-range fit's error is a fraction
    of what the linear fit on <= 64 gets when it extrapolates there (L(B) at measured B)."""
    pts = [p for p in points if p.system == EAGLE]
    full = fit_system_saturation(EAGLE, pts)
    hi = [p for p in pts if p.concurrency >= 80]
    measured = np.array([p.latency_s for p in hi])
    lin = model.Coefficients(**{n: getattr(full.coefficients, n) for n in (
        "a_p", "b_p", "a_v", "b_v", "a_d", "b_d")})
    from specwatch.calibrate.fit import fit_system

    old = fit_system(EAGLE, pts, FitOptions(max_concurrency=64)).coefficients
    assert old is not None and lin is not None
    old_err = np.mean(np.abs(predicted_latency(old, hi) / measured - 1))
    new_err = np.mean(np.abs(predicted_latency(full.coefficients, hi) / measured - 1))
    assert new_err < 0.5 * old_err
    assert r_squared(measured, predicted_latency(full.coefficients, hi)) > 0.9
