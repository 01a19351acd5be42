"""The calibration fit: acceptance on the public Qwen3-32B sweep, exact recovery on model-made
data, exclusions, identifiability and the per-configuration fallback.
"""

from functools import cache

import numpy as np
import pytest
from helpers.paths import FIXTURES

from specwatch import model
from specwatch.calibrate.fit import FitOptions, fit_system
from specwatch.calibrate.inputs import Point, read_inputs
from specwatch.calibrate.leastsq import design_matrix, variance_inflation

SWEEP = (
    FIXTURES
    / "sd-validation"
    / "tomasruizt_qwen3-32b_1xH100_vllm-bench.csv"
)
EAGLE = "Qwen3-32B+Qwen3-32B-speculator.eagle3"
DRAFTERS = ["Qwen3-32B+Qwen3-1.7B", "Qwen3-32B+Qwen3-4B", EAGLE]


@cache
def _sweep_points() -> tuple[Point, ...]:
    return tuple(read_inputs([SWEEP]))


@cache
def _sweep_fit(system: str, ttft_rule: bool):
    points = [p for p in _sweep_points() if p.system == system]
    options = FitOptions(max_concurrency=64, max_ttft_ratio=5.0 if ttft_rule else None)
    return fit_system(system, points, options)


# ----------------------------------------------------------------------- acceptance


@pytest.mark.parametrize("system", DRAFTERS)
@pytest.mark.parametrize(
    "ttft_rule", [False, True], ids=["all-conc-le-64", "default-queueing-rule"]
)
def test_pooled_fit_per_drafter_meets_acceptance(system, ttft_rule):
    """Per drafter (no-SD runs + that drafter's runs), both datasets, every k, concurrency
    <= 64: R² >= 0.98 and leave-one-k-out MAPE <= 5%, with all six coefficients identifiable.
    Without the queueing rule that is every run at concurrency <= 64 (98); with it (default),
    the no-SD InstructCoder run at 64, whose TTFT is 6× its concurrency-1 value, is left out."""
    fit = _sweep_fit(system, ttft_rule)
    assert fit.mode == "six-coefficient" and not fit.not_identifiable
    assert fit.n_points == (97 if ttft_rule else 98)
    assert fit.r2 >= 0.98
    assert fit.leave_one_k_out_mape <= 0.05
    assert fit.mape <= 0.03
    assert sorted(fit.leave_one_k_out_by_k) == [0, 1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("ttft_rule", [False, True])
def test_eagle3_k3_zero_load_speedup_matches_measured(ttft_rule):
    """ "Measured 1.95" is the no-SD over SD latency at concurrency 1 on InstructCoder:
    6.811 s / 3.4865 s = 1.9535 (verified from the CSV here, not typed in). The fit's
    zero-load speedup at that run's k = 3, E, p and g is within 5% of it."""
    points = [p for p in _sweep_points() if p.system == EAGLE and p.dataset == "InstructCoder"]
    base = next(p for p in points if p.draft_length == 0 and p.concurrency == 1)
    sd = next(p for p in points if p.draft_length == 3 and p.concurrency == 1)
    measured = base.latency_s / sd.latency_s
    assert measured == pytest.approx(1.95, abs=0.005)
    fit = _sweep_fit(EAGLE, ttft_rule)
    predicted = float(
        model.speedup(
            fit.coefficients, 0.0, 3, sd.acceptance_length, sd.prompt_tokens, sd.generation_tokens
        )
    )
    assert abs(predicted / measured - 1) <= 0.05
    reported = next(m for m in fit.measured_speedups if m.k == 3 and m.workload == "InstructCoder")
    assert reported.measured == pytest.approx(measured)
    assert reported.predicted == pytest.approx(predicted)


def test_saturated_runs_are_excluded_with_reasons_by_default():
    """Without a concurrency cap the default rules still drop the runs past the throughput
    ceiling: every concurrency-256 run and the queueing no-SD/1.7B/4B runs at 128, each with a
    reason that names the TTFT growth."""
    points = [p for p in _sweep_points() if p.system == EAGLE]
    fit = fit_system(EAGLE, points, FitOptions())
    excluded = {e.point.source: e.reason for e in fit.excluded}
    c256 = [p for p in points if p.concurrency == 256]
    assert c256 and all(p.source in excluded for p in c256)
    assert all(excluded[p.source].startswith("queueing: mean TTFT") for p in c256)
    assert all(p.concurrency <= 128 for p in fit.points)


# --------------------------------------------------------------------------- synthetic truth

TRUE = model.Coefficients(a_p=0.08, b_p=0.003, a_v=0.025, b_v=0.00012, a_d=0.002, b_d=0.00006)


def _synthetic(ks=(0, 1, 2, 3, 4), gs=(150.0, 300.0), rates=(0.5, 2.0, 4.0, 6.0), coef=TRUE):
    points = []
    for k in ks:
        e = float(model.acceptance_length_from_alpha(0.7, k)) if k else 1.0
        for g in gs:
            for lam in rates:
                lat = float(model.latency(coef, lam, k, e, 100.0, g, 1.0).latency)
                points.append(
                    Point(f"synthetic k={k} g={g} λ={lam}", "sim", lam, lat, k, e, 100.0, g)
                )
    return points


def test_exact_model_data_recovers_the_coefficients():
    """Latencies made by the model itself give back its six coefficients (R² = 1)."""
    fit = fit_system("sim", _synthetic(), FitOptions(max_ttft_ratio=None))
    assert fit.mode == "six-coefficient"
    for name in ("a_p", "b_p", "a_v", "b_v", "a_d", "b_d"):
        assert getattr(fit.coefficients, name) == pytest.approx(getattr(TRUE, name), rel=1e-6)
    assert fit.r2 == pytest.approx(1.0) and fit.leave_one_k_out_mape < 1e-6
    s0 = next(d for d in fit.draft_lengths if d.k == 3)
    e3 = float(model.acceptance_length_from_alpha(0.7, 3))
    assert s0.zero_load_speedup == pytest.approx(float(model.speedup(TRUE, 0, 3, e3, 100, 225)))
    assert s0.breakeven_arrival_rate == pytest.approx(
        float(model.breakeven_arrival_rate(TRUE, 3, e3, 100, 225)), rel=1e-6
    )


def test_points_above_the_utilisation_ceiling_are_excluded():
    """A run at λ where λ·C2 > 0.9 is left out with its utilisation in the reason; the fit on
    the rest is unchanged."""
    points = _synthetic(rates=(0.5, 2.0, 4.0))
    c2 = model.cost_terms(TRUE, 0, 1.0, 100.0, 300.0)[1]
    lam = 0.95 / float(c2)
    lat = float(model.latency(TRUE, lam, 0, 1.0, 100.0, 300.0, 1.0).latency)
    hot = Point("hot run", "sim", lam, lat, 0, 1.0, 100.0, 300.0)
    fit = fit_system("sim", [*points, hot], FitOptions(max_ttft_ratio=None))
    assert [e.point.source for e in fit.excluded] == ["hot run"]
    assert "utilisation λ·C2 = 0.95 above the ceiling 0.9" in fit.excluded[0].reason
    assert fit.coefficients.a_v == pytest.approx(TRUE.a_v, rel=1e-6)
    relaxed = fit_system(
        "sim", [*points, hot], FitOptions(max_utilization=1.0, max_ttft_ratio=None)
    )
    assert relaxed.n_excluded == 0


def test_single_workload_and_single_k_fall_back_to_per_configuration():
    """One workload, no SD and k = 3 only: a_p/a_v/a_d (and the b's) cannot be separated.
    The fit says which, fits (C1, C2) per configuration, and still reports the speedup and
    break-even, which equal the true ones (cost terms are identifiable)."""
    points = _synthetic(ks=(0, 3), gs=(200.0,), rates=(0.5, 2.0, 4.0, 6.0))
    fit = fit_system("sim", points, FitOptions(max_ttft_ratio=None))
    assert fit.mode == "per-configuration" and fit.coefficients is None
    assert set(fit.not_identifiable) >= {"a_p", "a_v", "a_d"}
    assert "a single workload" in fit.fallback_reason
    assert fit.leave_one_k_out_mape is None
    e3 = float(model.acceptance_length_from_alpha(0.7, 3))
    (k3,) = fit.draft_lengths
    assert k3.zero_load_speedup == pytest.approx(float(model.speedup(TRUE, 0, 3, e3, 100, 200)))
    assert k3.breakeven_arrival_rate == pytest.approx(
        float(model.breakeven_arrival_rate(TRUE, 3, e3, 100, 200)), rel=1e-6
    )
    assert fit.r2 == pytest.approx(1.0)


def test_missing_acceptance_length_falls_back_with_reason():
    """CSV rows with SD but no acceptance length cannot enter the six-coefficient form."""
    points = [
        Point(
            p.source,
            p.system,
            p.arrival_rate,
            p.latency_s,
            p.draft_length,
            None if p.sd else 1.0,
            p.prompt_tokens,
            p.generation_tokens,
        )
        for p in _synthetic()
    ]
    fit = fit_system("sim", points, FitOptions(max_ttft_ratio=None))
    assert fit.mode == "per-configuration"
    assert "lack the acceptance length" in fit.fallback_reason


def test_variance_inflation_flags_collinear_columns():
    """A column that is a multiple of another has infinite VIF; independent ones ~1."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 3))
    assert np.all(variance_inflation(x) < 2)
    x[:, 2] = 3 * x[:, 0]
    vif = variance_inflation(x)
    assert np.isinf(vif[0]) and np.isinf(vif[2]) and vif[1] < 2


def test_design_matrix_columns_follow_model_md():
    """[1, g/E, g·k/E, B, B·g/E, B·g·k/E] with B = λ·L (model.md, Fitting)."""
    pt = Point("x", "s", 2.0, 3.0, 4, 2.5, 100.0, 200.0)
    np.testing.assert_allclose(design_matrix([pt])[0], [1, 80, 320, 6, 480, 1920])


def test_too_few_points_fall_back_with_reason():
    """Four runs (no SD and k = 3, two loads each) cannot carry six coefficients; the
    per-configuration fit still gives the speedup."""
    points = _synthetic(ks=(0, 3), gs=(200.0,), rates=(1.0, 4.0))
    fit = fit_system("sim", points, FitOptions(max_ttft_ratio=None))
    assert fit.mode == "per-configuration"
    assert "six coefficients need at least six" in fit.fallback_reason
    assert fit.draft_lengths[0].zero_load_speedup > 1


def test_sd_only_data_says_the_baseline_is_extrapolated():
    """Without no-SD runs the fit works but says its no-SD latency is an extrapolation."""
    fit = fit_system("sim", _synthetic(ks=(1, 2, 3, 4)), FitOptions(max_ttft_ratio=None))
    assert fit.mode == "six-coefficient"
    assert any("no runs without SD" in n for n in fit.notes)



@pytest.mark.parametrize("system", DRAFTERS)
def test_the_run_that_measured_a_ceiling_is_at_it(system):
    """A measured ceiling is the lower rate of the pair of runs where its curve stopped
    rising; rounded to the file's 4 decimals it must not end above that run's rate, or the
    run that measured the ceiling is predicted as below it (not `saturated`)."""
    from specwatch.calibrate import evidence
    from specwatch.model.ceilings import ceiling_rate
    from specwatch.model.observed import CalibratedRange

    points = [p for p in _sweep_points() if p.system == system]
    ceilings = evidence.measured_ceilings(points)
    assert ceilings
    cal = CalibratedRange(max_arrival_rate=1.0, max_in_flight=1.0, draft_lengths=(),
                          measured_ceilings=ceilings)
    for c in ceilings:
        curve = [p for p in points if p.draft_length == c.k and p.dataset == "InstructCoder"]
        lowest = min((p for p in curve if p.arrival_rate >= c.arrival_rate),
                     key=lambda p: p.arrival_rate)
        assert lowest.arrival_rate - c.arrival_rate < 1e-4
        assert ceiling_rate(cal, lowest.draft_length, lowest.prompt_tokens,
                            lowest.generation_tokens) <= lowest.arrival_rate


def test_a_run_at_a_measured_ceiling_counts_in_the_top_band_of_the_spread():
    """The residual spread is kept per band of utilisation, the fit's own λ/λ_max. A run at
    or past its curve's measured ceiling was at utilisation 1 whatever the fit says: a fit
    whose ceiling is too high would put that run's misfit (a closed loop queueing at the
    ceiling) among the runs far below any ceiling and widen every interval there. Here the
    fit places every run under utilisation 0.5; the five plateau runs, 30% off, go to the
    top band, and the rising runs keep their own spread."""
    from specwatch.calibrate import evidence

    rising = [Point(f"c={c}", "sim", lam, 1.0, 0, 1.0, 100.0, 200.0, concurrency=c)
              for c, lam in ((1, 1.0), (2, 2.0), (4, 4.0), (6, 6.0), (9, 9.0), (16, 15.0))]
    plateau = [Point(f"c={c}", "sim", lam, c / lam, 0, 1.0, 100.0, 200.0, concurrency=c)
               for c, lam in ((32, 15.5), (64, 15.2), (128, 15.1), (256, 15.0))]
    points = [*rising, *plateau]
    cal = evidence.calibrated_range(TRUE, points)
    assert [c.arrival_rate for c in cal.measured_ceilings] == [15.0]
    assert np.all(evidence.run_utilization(TRUE, points) < 0.5)
    small = np.array([0.01, -0.02, 0.015, -0.01, 0.02])
    rel = np.array([*small, 0.3, 0.3, 0.3, 0.3, 0.3])
    batch = np.array([q.latency_s for q in points]) * (1.0 + rel)
    bands = evidence.residual_spread(TRUE, points, batch, cal).bands
    assert [b.runs for b in bands] == [5, 5]
    assert bands[0].sigma == pytest.approx(float(np.sqrt(np.mean(small ** 2))), abs=1e-5)
    assert bands[-1].sigma == pytest.approx(0.3)
