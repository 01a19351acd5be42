"""Regression test of the saturation-aware model on the public Qwen3-32B / H100 sweep (issue 14).

Every figure the issue's acceptance list names is measured here, per drafter, by the same code
`specwatch calibrate` runs (calibrate.load_range), and docs/model.md quotes these numbers.
A target the interpretable form does not reach is an xfail(strict=True) whose reason states
the figure reached and why: it documents the miss and fails loudly the day it starts passing,
so no target is loosened silently.
"""

from pathlib import Path

import numpy as np
import pytest
from specwatch import model
from specwatch.calibrate.fit import FitOptions, r_squared
from specwatch.calibrate.inputs import read_inputs
from specwatch.calibrate.load_range import fit_system_saturation
from specwatch.calibrate.saturation import predicted_latency
from specwatch.model.validity import range_reasons

SWEEP = Path(__file__).parent / "fixtures" / "sd-validation" / (
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
        "Qwen3-4B drafter: leave-c=128-out MAPE 22.7%: at c=128 its KV cache holds ~77 running"
        " requests (TTFT 4.5-6.4 s), a capacity limit the roofline terms do not price; a"
        " fitted capacity (kv_cache_tokens) would")),
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
        "Qwen3-4B: k=1 predicted λ* 10.8 vs measured crossing 8.6 req/s (+25%), mt-bench"
        " k=6 7.5 vs measured ceiling 5.8 (+28.5%); the 4B drafter's curves cross where its"
        " KV-cache capacity limit binds (see the c=128 miss)")),
])
def test_breakeven_every_k_with_a_measured_crossing(fits, system):
    for b in fits[system].saturation["breakeven"]:
        if b["measured"] is not None:
            assert abs(b["relative_error"]) <= 0.15, b


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
