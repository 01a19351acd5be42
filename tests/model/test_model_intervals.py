"""90% intervals: the fit's residual spread of L(B), per utilisation band, carried
through the fixed point, on every path a number is shown (predict, sweep, advise; the live
series are in tests/plugins/live/test_model_live.py, the acceptance figures in
test_model_user_path.py)."""

import dataclasses
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from specwatch.cli import main
from specwatch.common.errors import ConfigError
from specwatch.model import BreakEvenKind, breakeven, latency
from specwatch.model.costs import throughput_ceiling
from specwatch.model.params import dump_params, load_params
from specwatch.model.uncertainty import Band, Uncertainty, scaled_latency
from specwatch.model.whatif.advice_text import advice_lines

ROOT = Path(__file__).resolve().parents[2]
EAGLE = ROOT / "examples" / "params" / "qwen3-32b-h100-eagle3.yaml"
LARGE = ROOT / "examples" / "params" / "qwen3-32b-h100-qwen3-4b.yaml"
POINT = ["--draft-length", "3", "--acceptance-length", "2.23", "--prompt-tokens", "114",
         "--generation-tokens", "226", "--json"]
_COSTS = ("a_p", "b_p", "a_v", "b_v", "a_d", "b_d", "b_v_context", "c_v", "c_d")


def run(capsys, *argv):
    rc = main([*map(str, argv)])
    return rc, json.loads(capsys.readouterr().out)


def _scaled(coef, s):
    return dataclasses.replace(coef, **{n: getattr(coef, n) * s for n in _COSTS})


@pytest.mark.parametrize("path", [EAGLE, LARGE])
@pytest.mark.parametrize("s", [0.9, 0.97, 1.03, 1.1])
def test_scaling_every_cost_is_the_fixed_point_at_a_scaled_rate(path, s):
    """s·L(s·λ) is the latency of a fit whose every cost is s times the model's (knees,
    capacity and all): the identity the intervals are built on."""
    coef = load_params(path).coefficients
    lam = np.linspace(0.2, 12.0, 40)
    for k, e in ((0, 1.0), (1, 1.66), (3, 2.23), (6, 2.39)):
        want = latency(_scaled(coef, s), lam, k, e, 114.0, 226.0, max_utilization=1.0).latency
        got = scaled_latency(coef, s, lam, k, e, 114.0, 226.0)
        np.testing.assert_allclose(got, want, rtol=1e-9, equal_nan=True)


@pytest.mark.parametrize("path", [EAGLE, LARGE])
def test_breakeven_of_scaled_systems(path):
    """Both systems scaled by s: λ* scales by 1/s exactly; only SD's costs up: λ* falls.
    Where SD pays up to its ceiling (no λ*), that ceiling scales by 1/s (what its interval
    uses)."""
    coef = load_params(path).coefficients
    for k, e in ((1, 1.66), (3, 2.23), (5, 2.37)):
        base = breakeven(coef, k, e, 114.0, 226.0)
        both = breakeven(coef, k, e, 114.0, 226.0, scale_sd=1.05, scale_nosd=1.05)
        assert int(both.kind) == int(base.kind)
        ref = breakeven(_scaled(coef, 1.05), k, e, 114.0, 226.0)
        assert int(ref.kind) == int(base.kind)
        if int(base.kind) == BreakEvenKind.PAYS_TO_CEILING:
            assert float(throughput_ceiling(_scaled(coef, 1.05), k, e, 114.0, 226.0)) == \
                pytest.approx(float(throughput_ceiling(coef, k, e, 114.0, 226.0)) / 1.05,
                              rel=1e-9)
            continue
        assert float(both.rate) == pytest.approx(float(base.rate) / 1.05, rel=1e-9)
        worse = breakeven(coef, k, e, 114.0, 226.0, scale_sd=1.05, scale_nosd=0.95)
        assert float(worse.rate) < float(base.rate)
        # The same through the scaled coefficients themselves (the pieces' algebra).
        assert float(both.rate) == pytest.approx(float(ref.rate), rel=1e-9)


def test_predict_gives_every_interval_around_its_point(capsys):
    rc, out = run(capsys, "predict", "--params", EAGLE, "--arrival-rate", "8", *POINT)
    assert rc == 0 and out["valid"] is True
    lo, hi = out["latency_interval"]
    assert lo < out["latency_sd_s"] < hi
    assert out["interval_halfwidth"] == pytest.approx(
        max(hi / out["latency_sd_s"] - 1, 1 - lo / out["latency_sd_s"]))
    s_lo, s_hi = out["speedup_interval"]
    assert s_lo < out["speedup"] < s_hi
    # No break-even below SD's ceiling on this file: the ceiling carries the interval.
    assert out["breakeven_kind"] == "pays_to_ceiling" and out["breakeven_interval"] is None
    c_lo, c_hi = out["sd_ceiling_interval"]
    assert c_lo < out["sd_ceiling_arrival_rate"] < c_hi
    assert out["interval_level"] == 0.9 and out["max_interval_halfwidth"] == 0.15


def test_a_wider_interval_than_the_limit_is_sensitive(capsys):
    """--max-interval below the interval's half-width: valid false, reason sensitive, exit 2,
    an actionable reason; the latency and its interval are still shown."""
    rc, out = run(capsys, "predict", "--params", EAGLE, "--arrival-rate", "8",
                  "--max-interval", "0.01", *POINT)
    assert rc == 2 and out["valid"] is False and out["validity_reasons"] == ["sensitive"]
    assert out["speedup"] is None and out["latency_interval"] is not None
    assert "sensitive" in out["reason"] and "±1%" in out["reason"]


def test_bad_max_interval_is_one_clear_error(capsys):
    rc = main(["predict", "--params", str(EAGLE), "--arrival-rate", "8",
               "--max-interval", "-1", *POINT])
    assert rc == 2
    assert "--max-interval" in capsys.readouterr().err


def test_sweep_carries_the_band(capsys):
    rc, out = run(capsys, "sweep", "--params", EAGLE, "--arrival-rates", "0.5:14:10",
                  "--draft-lengths", "1,3", "--prompt-tokens", "114", "--generation-tokens",
                  "226", "--json")
    assert rc == 0
    for c in out["curves"]:
        valid = np.array(c["valid"])
        assert valid.any()
        for ok, s, lo, hi in zip(valid, c["speedup"], c["speedup_lower"], c["speedup_upper"],
                                 strict=True):
            if ok:
                assert lo < s < hi
            else:
                assert s is None and lo is None and hi is None
        c_lo, c_hi = c["sd_ceiling_interval"]
        assert c_lo < c["sd_ceiling_arrival_rate"] < c_hi


def test_advise_says_when_the_speedup_interval_straddles_1(capsys):
    rc, out = run(capsys, "advise", "--params", EAGLE, "--arrival-rate-p50", "4",
                  "--arrival-rate-p95", "8", "--arrival-rate-p99", "10", "--prompt-tokens",
                  "114", "--generation-tokens", "226", "--json")
    assert rc == 0 and out["enable"]
    for q in ("p50", "p95", "p99"):
        lo, hi = out["percentiles"][q]["speedup_interval"]
        assert lo < out["percentiles"][q]["speedup"] < hi
    assert not any("straddles" in line for line in out["advice"])
    out["percentiles"]["p99"]["speedup_interval"] = [0.93, 1.2]
    lines = advice_lines(out)
    assert any("p99" in a and "straddles 1" in b
               for a, b in itertools.pairwise(lines))
    # A break-even interval open above (no crossing in the optimistic corner) is given in
    # words, as in predict and sweep (JSON null), not '∞' and not a traceback.
    out["breakeven_kind"], out["breakeven_arrival_rate"] = "pays_below", 9.0
    out["breakeven_interval"] = [8.1, None]
    assert any("falls to 1 at 9 req/s" in line and "interval above 8.1 req/s" in line
               for line in advice_lines(out))


def test_uncertainty_block_round_trips_and_is_checked(tmp_path):
    params = load_params(EAGLE)
    assert params.uncertainty is not None and params.uncertainty.bands[-1].utilization_below \
        == math.inf
    path = tmp_path / "p.yaml"
    dump_params(params, path)
    assert load_params(path) == params
    text = EAGLE.read_text().replace("utilization_below: 0.7", "utilization_below: 0.4")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError, match=r"uncertainty\.bands\[1\]\.utilization_below"):
        load_params(bad)


def test_sigma_is_the_band_of_the_utilisation():
    unc = Uncertainty(bands=(Band(0.5, 0.01), Band(0.8, 0.03), Band(math.inf, 0.06)))
    np.testing.assert_array_equal(unc.sigma([0.0, 0.49, 0.5, 0.79, 0.8, 3.0]),
                                  [0.01, 0.01, 0.03, 0.03, 0.06, 0.06])
    assert math.isnan(float(unc.sigma(math.nan)))
    assert unc.z == pytest.approx(1.6448536, rel=1e-6)


def test_a_file_without_range_or_spread_says_so_on_every_path(capsys, tmp_path):
    """An old file (no calibrated_range, no uncertainty) predicts as before on every
    command; each says `no_calibrated_range` and gives no interval."""
    old = tmp_path / "old.yaml"
    old.write_text("system: old\ncoefficients: {a_p: 0.1, b_p: 0.01, a_v: 0.02, b_v: 0.001, "
                   "a_d: 0.002, b_d: 0.0005}\n")
    lengths = ["--prompt-tokens", "100", "--generation-tokens", "100", "--json"]
    rc, out = run(capsys, "sweep", "--params", old, "--arrival-rates", "0.5:2:4",
                  "--draft-lengths", "1,3", "--alpha", "0.5", *lengths)
    assert rc == 0
    for c in out["curves"]:
        assert all(r == ["no_calibrated_range"] for r in c["validity_reasons"])
        assert all(x is None for x in c["speedup_lower"]) and c["breakeven_interval"] is None
        assert all(c["valid"])
    rc, out = run(capsys, "advise", "--params", old, "--arrival-rate-p50", "0.5",
                  "--arrival-rate-p95", "1", "--arrival-rate-p99", "1.5", "--alpha", "0.5",
                  *lengths)
    assert rc == 0 and out["validity_reasons"] == ["no_calibrated_range"]
    assert out["breakeven_interval"] is None


def test_a_measured_ceiling_is_saturated_whatever_the_fit_says(capsys, tmp_path):
    """The 4B drafter's k = 1 curve on InstructCoder stops rising at c = 64 (8.57 req/s; c =
    128 holds twice the requests for 3.5% more throughput): calibrate records that ceiling,
    and a prediction at or past it for the same k and workload is `saturated`, while the same
    load on a workload of other lengths, or another k, is judged by the fit alone."""
    # The shipped file's stated KV cache saturates the model itself below that rate; with no
    # capacity term the fit alone would answer, so the measured ceiling must.
    shipped = load_params(LARGE)
    large = tmp_path / "no-capacity.yaml"
    dump_params(dataclasses.replace(
        shipped, server_capacity=None, coefficients=dataclasses.replace(
            shipped.coefficients, kv_cache_tokens=0.0, kv_cache_tokens_sd=0.0)), large)
    cal = shipped.calibrated_range
    (ceiling,) = [c for c in cal.measured_ceilings if c.k == 1]
    assert ceiling.arrival_rate == pytest.approx(8.57, abs=0.01)
    lengths = ["--prompt-tokens", f"{ceiling.prompt_tokens}", "--generation-tokens",
               f"{ceiling.generation_tokens}", "--json"]
    rc, out = run(capsys, "predict", "--params", large, "--arrival-rate", "8.7",
                  "--draft-length", "1", "--acceptance-length", "1.6", *lengths)
    assert rc == 2 and out["validity_reasons"][0] == "saturated"
    assert "measured" in out["reason"]
    rc, out = run(capsys, "predict", "--params", large, "--arrival-rate", "8.0",
                  "--draft-length", "1", "--acceptance-length", "1.6", *lengths)
    assert "saturated" not in out["validity_reasons"]


def test_sweep_best_k_is_never_a_declined_column(capsys):
    """The best k is shown only where its own column is valid: with a ±6% limit, at 8.75-10.25
    req/s the model's fastest k = 3 is `sensitive`, so it is never the best k there; k = 2,
    the best valid column, stands in for it (`best_basis` best_vouched: k = 3's predicted
    gain lies within the two 90% latency intervals, `model.bestk`). (At the default ±15% the
    fastest column stays valid up to where every column is declined.)"""
    rc, out = run(capsys, "sweep", "--params", EAGLE, "--arrival-rates", "4:12:33",
                  "--draft-lengths", "1,2,3,4,5,6", "--prompt-tokens", "144",
                  "--generation-tokens", "200", "--max-interval", "0.06", "--json")
    assert rc == 0
    ks = out["draft_lengths"]
    stand_ins = 0
    for i, b in enumerate(out["best_draft_length"]):
        cols = [c["valid"][i] for c in out["curves"]]
        if b > 0:
            assert cols[ks.index(b)], (out["arrival_rates"][i], b)
            assert out["best_speedup"][i] == out["curves"][ks.index(b)]["speedup"][i]
        elif b < 0:
            assert out["best_speedup"][i] is None
        if out["best_basis"][i] == "best_vouched":
            stand_ins += 1
            assert b == 2 and not cols[ks.index(3)], out["arrival_rates"][i]
            assert "optimum k = 3 (sensitive)" in out["best_notes"][i]
    assert stand_ins > 0


def test_advise_static_k_is_valid_at_every_percentile(capsys):
    """With a ±6% limit, at p99 = 10 req/s the k = 3, 4 and 5 predictions are `sensitive`:
    the static k comes from the k vouched for at every percentile (the model alone would
    pick k = 3), and the advice names the ones left out."""
    rc, out = run(capsys, "advise", "--params", EAGLE, "--arrival-rate-p50", "4",
                  "--arrival-rate-p95", "8", "--arrival-rate-p99", "10", "--prompt-tokens",
                  "144", "--generation-tokens", "200", "--max-interval", "0.06", "--json")
    assert rc == 0 and out["enable"]
    for q in ("p50", "p95", "p99"):
        item = out["percentiles"][q]
        assert item["valid"] and item["validity_reasons"] == [], q
        best = item["optimal_draft_length"]
        if best is not None and best > 0:
            rc, one = run(capsys, "predict", "--params", EAGLE, "--arrival-rate",
                          item["arrival_rate"], "--draft-length", best, "--prompt-tokens",
                          "144", "--generation-tokens", "200", "--max-interval", "0.06",
                          "--json")
            assert one["valid"], (q, best)
    for k in ("3", "4"):
        assert "sensitive" in out["declined_draft_lengths"][k]
    assert out["draft_length"] > 0
    assert str(out["draft_length"]) not in out["declined_draft_lengths"]


@pytest.mark.parametrize(("rates", "generation", "limit", "reason", "declined"), [
    # Past the in-flight count the runs with headroom held (the shipped ±15% limit), on
    # lengths no measured curve has (230 tokens: more than 10% from 200 and from 256).
    (("11", "11.5", "12"), "230", "0.15", "beyond_calibrated_load", {"1", "2"}),
    # Intervals wider than a ±6% limit.
    (("10.5", "11", "11.5"), "200", "0.06", "sensitive", {"1", "2", "3"}),
], ids=["beyond_calibrated_load", "sensitive"])
def test_advise_without_a_vouched_k_says_why(capsys, rates, generation, limit, reason,
                                             declined):
    """By the model alone SD beats no SD at every percentile, but no k is vouched for at
    every percentile: SD stays off, and the advice says which k were left out and why, not
    that SD does not pay."""
    p50, p95, p99 = rates
    rc, out = run(capsys, "advise", "--params", EAGLE, "--arrival-rate-p50", p50,
                  "--arrival-rate-p95", p95, "--arrival-rate-p99", p99, "--prompt-tokens",
                  "144", "--generation-tokens", generation, "--max-interval", limit, "--json")
    assert rc == 0 and not out["enable"]
    assert set(out["declined_draft_lengths"]) >= declined
    assert "not vouched" not in out["advice"][0] and "vouched for" in out["advice"][0]
    assert f"k = 2: {reason}" in out["advice"][0]


def test_advise_past_the_ceiling_names_why_and_does_not_call_it_sd_off(capsys):
    """At 14, 14.5 and 14.8 req/s on the InstructCoder lengths every SD k is past the 0.9
    utilisation ceiling while the model still prices k = 1 faster than no SD (its measured
    break-even is 15.1 req/s): SD stays off because no k is vouched for, and the advice says
    that (above_utilization_ceiling), not that SD would slow p99 down or that "SD off is the
    best choice" from 14.4 req/s. Each percentile's `valid` agrees with its reasons."""
    rc, out = run(capsys, "advise", "--params", EAGLE, "--arrival-rate-p50", "14",
                  "--arrival-rate-p95", "14.5", "--arrival-rate-p99", "14.8",
                  "--prompt-tokens", "144", "--generation-tokens", "200", "--json")
    assert rc == 0 and not out["enable"]
    assert "above_utilization_ceiling" in out["declined_draft_lengths"]["1"]
    assert "above_utilization_ceiling" in out["advice"][0]
    assert "slowing down p99" not in out["advice"][0]
    assert out["sd_off_above_arrival_rate"] is None or out["sd_off_above_arrival_rate"] >= 15.09
    assert not any("best choice is SD off" in line for line in out["advice"])
    for item in out["percentiles"].values():
        assert item["valid"] == (item["validity_reasons"] == [])


def test_advice_past_the_ceiling_alone_says_measure_rather_than_recalibrate():
    """Where every declined k is declined only for the utilisation ceiling, more
    calibration runs would not vouch for it: the advice says to measure SD there."""
    from specwatch.model.whatif.advice_text import _keep_off_lines

    out = {"percentiles": {"p50": {"optimal_draft_length": None}}, "below_min_gain": None,
           "declined_draft_lengths": {"1": ["above_utilization_ceiling"]}}
    line = _keep_off_lines(out)[0]
    assert "past the model's validity ceiling" in line and "re-calibrate" not in line
    out["declined_draft_lengths"]["2"] = ["beyond_calibrated_load"]
    assert "re-calibrate with runs at these loads" in _keep_off_lines(out)[0]


def test_advise_vouches_for_a_load_between_the_runs_of_a_measured_curve(capsys):
    """At 12, 12.5 and 13 req/s on the InstructCoder lengths k = 2 holds more requests in
    flight than any run with throughput headroom did, but its own curve was served at up to
    16.1 req/s: the load lies between that curve's runs (below its top by more than the
    margin), so the headroom bound does not apply and k = 2 is advised."""
    rc, out = run(capsys, "advise", "--params", EAGLE, "--arrival-rate-p50", "12",
                  "--arrival-rate-p95", "12.5", "--arrival-rate-p99", "13", "--prompt-tokens",
                  "144", "--generation-tokens", "200", "--json")
    assert rc == 0 and out["enable"] and out["draft_length"] == 2
    assert "2" not in out["declined_draft_lengths"]
