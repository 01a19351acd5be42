"""The best k a command shows (`model.bestk`): the model's optimum where its own prediction is
vouched for; else the best vouched k, where the optimum's predicted gain over it lies inside
the two 90% latency intervals; else none. On a constructed parameters file whose calibration
measured k = 0..3 only, so the model's optimum k = 4 (α = 0.7, p = g = 100, λ = 1 req/s) is
`extrapolated_k` while k = 3, predicted 0.4% slower, is vouched for."""

import json

import numpy as np
import pytest

from specwatch.cli import main
from specwatch.model import Coefficients, latency
from specwatch.model.bestk import BEST_VOUCHED, MODEL_OPTIMUM, best_draft_length
from specwatch.model.params import load_params
from specwatch.model.uncertainty import scaled_latency

COEF = Coefficients(a_p=0.1, b_p=0.01, a_v=0.02, b_v=0.001, a_d=0.002, b_d=0.0005)
ALPHA, P, G = 0.7, 100.0, 100.0


def _params(tmp_path, sigma: float, draft_lengths: str = "[0, 1, 2, 3]"):
    path = tmp_path / f"bestk-{sigma}.yaml"
    path.write_text(
        "system: worked-example\n"
        "coefficients: {a_p: 0.1, b_p: 0.01, a_v: 0.02, b_v: 0.001, a_d: 0.002, b_d: 0.0005}\n"
        f"calibrated_range: {{max_arrival_rate: 5.0, max_in_flight: 100.0, "
        f"draft_lengths: {draft_lengths}}}\n"
        "uncertainty:\n"
        "  level: 0.9\n"
        "  max_relative_halfwidth: 0.15\n"
        f"  bands: [{{utilization_below: .inf, sigma: {sigma}, runs: 20}}]\n")
    return path


def _e(k: float) -> float:
    return float(sum(ALPHA ** i for i in range(int(k) + 1)))


def _lat(k: float, lam: float = 1.0) -> float:
    return float(latency(COEF, lam, k, _e(k), P, G).latency)


def test_a_vouched_optimum_is_the_answer(tmp_path):
    """At 2 req/s the optimum is k = 3, measured: it is shown, on the model's own basis."""
    best = best_draft_length(load_params(_params(tmp_path, 0.01)), 2.0, P, G, alpha=ALPHA)
    assert int(best.optimum.k) == 3 and int(best.k) == 3
    assert best.basis[()] == MODEL_OPTIMUM and best.note() is None
    assert float(best.speedup) == pytest.approx(_lat(0, 2.0) / _lat(3, 2.0), rel=1e-12)


def test_the_best_vouched_k_stands_in_when_the_gain_is_inside_the_intervals(tmp_path):
    """σ = 1%: k = 4 (not measured) is 0.5% faster than k = 3, less than the two 90%
    intervals (k = 3's lower end, k = 4's upper end: the fit scaled by 1 ∓ 1.645·σ through
    the fixed point) admit, so k = 3 is shown and the note says why."""
    params = load_params(_params(tmp_path, 0.01))
    best = best_draft_length(params, 1.0, P, G, alpha=ALPHA)
    assert int(best.optimum.k) == 4 and best.optimum_reasons[()] == ("extrapolated_k",)
    assert int(best.k) == 3 and best.basis[()] == BEST_VOUCHED
    d = 1.6448536269514722 * 0.01
    lo3 = float(scaled_latency(COEF, 1.0 - d, 1.0, 3, _e(3), P, G))
    hi4 = float(scaled_latency(COEF, 1.0 + d, 1.0, 4, _e(4), P, G))
    assert float(best.gain) == pytest.approx(_lat(3) / _lat(4) - 1.0, rel=1e-9)
    assert float(best.allowance) == pytest.approx(
        _lat(3) / lo3 * hi4 / _lat(4) - 1.0, rel=1e-9)
    assert 0 < float(best.gain) < float(best.allowance)
    assert float(best.speedup) == pytest.approx(_lat(0) / _lat(3), rel=1e-12)
    assert "optimum k = 4 (extrapolated_k)" in best.note()


def test_no_best_k_when_the_gain_is_outside_the_intervals(tmp_path):
    """σ = 0.1%: the same 0.5% gain is more than the intervals admit: no best k, and the note
    names the optimum, the best vouched k and both figures."""
    best = best_draft_length(load_params(_params(tmp_path, 0.001)), 1.0, P, G, alpha=ALPHA)
    assert int(best.k) == -1 and best.basis[()] == "" and np.isnan(best.speedup)
    assert int(best.vouched_k) == 3 and float(best.gain) > float(best.allowance) > 0
    assert best.note().startswith("no best k: the model's optimum k = 4 is not vouched for "
                                  "(extrapolated_k) and is predicted 0.43% faster than the "
                                  "best vouched k = 3")


def test_vectorised_over_the_arrival_rate_as_one_point_at_a_time(tmp_path):
    params = load_params(_params(tmp_path, 0.01))
    lams = np.array([0.5, 1.0, 2.0, 3.0])
    best = best_draft_length(params, lams, P, G, alpha=ALPHA)
    for i, lam in enumerate(lams):
        one = best_draft_length(params, lam, P, G, alpha=ALPHA)
        assert int(best.k[i]) == int(one.k) and best.basis[i] == one.basis[()]
        assert best.note(i) == one.note()


def test_predict_says_which_happened(capsys, tmp_path):
    """`predict --json` keeps `optimal_draft_length` / `optimal_speedup` and adds the basis,
    the model's own optimum, the gain and what the intervals admit; the text names them."""
    argv = ["predict", "--params", str(_params(tmp_path, 0.01)), "--arrival-rate", "1",
            "--draft-length", "3", "--alpha", str(ALPHA), "--prompt-tokens", "100",
            "--generation-tokens", "100"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["optimal_draft_length"] == 3 and out["optimal_basis"] == "best_vouched"
    assert out["model_optimal_draft_length"] == 4
    assert 0 < out["optimal_gain"] < out["optimal_gain_allowance"]
    assert out["optimal_speedup"] == pytest.approx(_lat(0) / _lat(3), rel=1e-9)
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "optimal draft length at this load: 3" in text
    assert "best vouched k: the model's optimum k = 4 (extrapolated_k)" in text
    measured_all = _params(tmp_path, 0.01, "[0, 1, 2, 3, 4, 5, 6, 7, 8]")
    assert main([*argv[:2], str(measured_all), *argv[3:], "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["optimal_draft_length"] == 4 and out["optimal_basis"] == "model_optimum"
    assert out["optimal_note"] is None and out["optimal_gain"] is None


def test_sweep_marks_the_stand_in(capsys, tmp_path):
    argv = ["sweep", "--params", str(_params(tmp_path, 0.01)), "--alpha", str(ALPHA),
            "--prompt-tokens", "100", "--generation-tokens", "100", "--draft-lengths", "1-6",
            "--arrival-rates", "1:2:2"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["best_draft_length"] == [3, 3]
    assert out["best_basis"] == ["best_vouched", "model_optimum"]
    assert out["best_notes"][0].startswith("best vouched k") and out["best_notes"][1] is None
    assert main(argv) == 0
    assert "* at 1 req/s (the first so marked): best vouched k" in capsys.readouterr().out
