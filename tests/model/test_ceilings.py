"""The break-even every command reports is bounded by SD's measured ceiling.

A prediction at or past a measured ceiling of its k and workload is `saturated`; the
break-even must not say SD pays there. On the shipped EAGLE-3 file, k = 6 on InstructCoder
stops rising at 9.80 req/s (c = 128 and 256 serve 10.05 and 9.80 req/s), while the fit's own
λ* for it is 11.3 req/s: before this rule `specwatch predict` called 10 req/s saturated and,
in the same output, said SD pays below 11.3 req/s.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specwatch.cli import main
from specwatch.model import BreakEvenKind, Coefficients
from specwatch.model import breakeven as model_breakeven
from specwatch.model.ceilings import breakeven, breakeven_interval, ceiling_rate
from specwatch.model.closed_form import latency
from specwatch.model.observed import CalibratedRange, MeasuredCeiling
from specwatch.model.params import Params, dump_params, load_params
from specwatch.model.uncertainty import Band, Uncertainty
from specwatch.model.validity import assess

EAGLE = Path(__file__).resolve().parents[2] / "examples" / "params" / "qwen3-32b-h100-eagle3.yaml"
#: The k = 6 InstructCoder runs of the sweep: acceptance length and mean lengths.
K6 = {"k": 6.0, "e": 2.31, "p": 147.7, "g": 200.0}


def run(capsys, *argv):
    rc = main([*map(str, argv)])
    return rc, json.loads(capsys.readouterr().out)


def _k6_ceiling() -> float:
    (c,) = [c for c in load_params(EAGLE).calibrated_range.measured_ceilings if c.k == 6]
    return c.arrival_rate


def test_predict_never_says_sd_pays_where_it_calls_sd_saturated(capsys):
    cap = _k6_ceiling()
    assert cap == pytest.approx(9.80, abs=0.01)
    lengths = ["--draft-length", "6", "--acceptance-length", K6["e"], "--prompt-tokens",
               K6["p"], "--generation-tokens", K6["g"], "--json"]
    rc, out = run(capsys, "predict", "--params", EAGLE, "--arrival-rate", cap, *lengths)
    assert rc == 2 and out["validity_reasons"][0] == "saturated"
    assert out["breakeven_kind"] == "pays_below"
    assert out["breakeven_arrival_rate"] <= cap
    lo, hi = out["breakeven_interval"]
    assert lo < out["breakeven_arrival_rate"] <= hi <= cap * 1.1
    assert out["breakeven_measured_ceiling"] == cap
    # The text says where the number comes from.
    main(["predict", "--params", str(EAGLE), "--arrival-rate", "8", *map(str, lengths[:-1])])
    text = " ".join(capsys.readouterr().out.split())  # the table wraps long notes
    assert "throughput ceiling the calibration runs measured for k = 6" in text
    # Below it the prediction is the fit's and stands.
    rc, out = run(capsys, "predict", "--params", EAGLE, "--arrival-rate", 8.0, *lengths)
    assert "saturated" not in out["validity_reasons"]


def test_sweep_and_advise_report_the_same_bounded_break_even(capsys):
    """Sweep at k = 6, and advise at the draft length it advises (its own curve's ceiling)."""
    cap = _k6_ceiling()
    lengths = ["--prompt-tokens", K6["p"], "--generation-tokens", K6["g"]]
    rc, out = run(capsys, "sweep", "--params", EAGLE, "--arrival-rates", "1:12:12",
                  "--draft-lengths", "1,6", *lengths, "--json")
    assert rc == 0
    k6 = next(c for c in out["curves"] if c["draft_length"] == 6)
    assert k6["breakeven_kind"] == "pays_below" and k6["breakeven_arrival_rate"] <= cap
    assert k6["breakeven_interval"][1] <= cap * 1.1
    rc, out = run(capsys, "advise", "--params", EAGLE, "--arrival-rate-p50", 2,
                  "--arrival-rate-p95", 3, "--arrival-rate-p99", 4, "--draft-length", 6,
                  "--acceptance-length", K6["e"], *lengths, "--json")
    assert rc == 0 and out["breakeven_kind"] == "pays_below"
    ceiling = {c.k: c.arrival_rate
               for c in load_params(EAGLE).calibrated_range.measured_ceilings}
    assert out["breakeven_arrival_rate"] <= ceiling[out["draft_length"]]
    assert out["breakeven_interval"][1] <= ceiling[out["draft_length"]] * 1.1


# ------------------------------------------------------------------ the rule, on constructed files


def _params(ceilings: tuple[MeasuredCeiling, ...], unc: Uncertainty | None = None) -> Params:
    base = load_params(EAGLE)
    cal = CalibratedRange(max_arrival_rate=20.0, max_in_flight=300.0,
                          draft_lengths=(0, 1, 2, 3, 4, 5, 6), measured_ceilings=ceilings)
    return dataclasses.replace(base, calibrated_range=cal, uncertainty=unc)


def _ceiling(k: int, rate: float, p: float = K6["p"], g: float = K6["g"]) -> MeasuredCeiling:
    return MeasuredCeiling(k=k, prompt_tokens=p, generation_tokens=g, arrival_rate=rate)


def _raw() -> tuple[float, int]:
    be = model_breakeven(load_params(EAGLE).model(), K6["k"], K6["e"], K6["p"], K6["g"])
    return float(be.rate), int(be.kind)


def test_without_measured_ceilings_the_break_even_is_the_models():
    rate, kind = _raw()
    assert kind == BreakEvenKind.PAYS_BELOW and rate > 10.5
    for params in (_params(()), dataclasses.replace(_params(()), calibrated_range=None)):
        be = breakeven(params, K6["k"], K6["e"], K6["p"], K6["g"])
        assert float(be.rate) == rate and int(be.kind) == kind


def test_a_lower_sd_ceiling_bounds_it_a_higher_one_does_not():
    rate, _ = _raw()
    low = breakeven(_params((_ceiling(6, 9.0),)), K6["k"], K6["e"], K6["p"], K6["g"])
    assert float(low.rate) == 9.0 and int(low.kind) == BreakEvenKind.PAYS_BELOW
    high = breakeven(_params((_ceiling(6, rate + 1.0),)), K6["k"], K6["e"], K6["p"], K6["g"])
    assert float(high.rate) == rate


def test_only_the_same_k_and_workload_are_bounded():
    rate, _ = _raw()
    params = _params((_ceiling(5, 9.0), _ceiling(6, 9.0, p=K6["p"] * 1.2)))
    assert float(breakeven(params, K6["k"], K6["e"], K6["p"], K6["g"]).rate) == rate
    # Within the 10% length tolerance it is the same curve.
    params = _params((_ceiling(6, 9.0, p=K6["p"] * 1.09, g=K6["g"] * 0.91),))
    assert float(breakeven(params, K6["k"], K6["e"], K6["p"], K6["g"]).rate) == 9.0


def test_no_bound_where_no_sd_is_at_its_own_ceiling_first():
    """If no SD stopped rising at a lower rate, SD's ceiling is not where SD stops paying."""
    rate, _ = _raw()
    params = _params((_ceiling(6, 9.0), _ceiling(0, 8.0)))
    assert float(breakeven(params, K6["k"], K6["e"], K6["p"], K6["g"]).rate) == rate


def test_vectorised_over_k_like_the_model():
    params = _params((_ceiling(6, 9.0),))
    ks = np.array([1.0, 6.0])
    es = np.array([1.7, K6["e"]])
    be = breakeven(params, ks, es, K6["p"], K6["g"])
    raw = model_breakeven(params.model(), ks, es, K6["p"], K6["g"])
    assert be.rate[0] == raw.rate[0] and be.rate[1] == 9.0


def test_sd_that_pays_everywhere_stops_paying_at_its_measured_ceiling():
    """A model in which SD pays at every load below saturation: the measured ceiling is
    where it stops (no SD still serves there)."""
    coef = Coefficients(a_p=0.1, b_p=0.0, a_v=0.03, b_v=1e-5, a_d=1e-3, b_d=0.0)
    params = Params(system="x", coefficients=coef, calibrated_range=CalibratedRange(
        max_arrival_rate=20.0, max_in_flight=300.0, draft_lengths=(0, 3),
        measured_ceilings=(_ceiling(3, 5.0, p=100.0, g=100.0),)))
    raw = model_breakeven(coef, 3.0, 3.0, 100.0, 100.0)
    assert int(raw.kind) == BreakEvenKind.PAYS_EVERYWHERE
    be = breakeven(params, 3.0, 3.0, 100.0, 100.0)
    assert float(be.rate) == 5.0 and int(be.kind) == BreakEvenKind.PAYS_BELOW


def test_the_interval_knows_the_ceiling_to_the_spread_of_repeated_runs():
    """With a measured ceiling the upper end is at most the ceiling plus the calibrated
    range's margin (10%); where the ceiling sets λ* the lower end is at most the ceiling less
    it; elsewhere the fit's ends stand."""
    unc = Uncertainty(bands=(Band(utilization_below=math.inf, sigma=0.03, runs=10),))
    rate, _ = _raw()
    lo, hi = breakeven_interval(_params((), unc), K6["k"], K6["e"], K6["p"], K6["g"], rate)
    assert lo < rate < hi
    above = hi / 1.05  # below the fit's upper end, plus 10% above it
    assert breakeven_interval(_params((_ceiling(6, above),), unc), K6["k"], K6["e"],
                              K6["p"], K6["g"], rate) == (lo, hi)
    below = rate * 0.8  # sets λ* itself, well under the fit's lower end
    b_lo, b_hi = breakeven_interval(_params((_ceiling(6, below),), unc), K6["k"], K6["e"],
                                    K6["p"], K6["g"], below)
    assert b_lo == pytest.approx(below / 1.1) and b_hi == pytest.approx(below * 1.1)
    assert breakeven_interval(_params((_ceiling(6, 9.0),)), K6["k"], K6["e"], K6["p"],
                              K6["g"], 9.0) is None  # no uncertainty block


def test_ceiling_rate_is_the_lowest_of_the_curve():
    cal = CalibratedRange(max_arrival_rate=20.0, max_in_flight=300.0, draft_lengths=(0, 6),
                          measured_ceilings=(_ceiling(6, 9.5), _ceiling(6, 9.0)))
    assert ceiling_rate(cal, 6, K6["p"], K6["g"]) == 9.0
    assert ceiling_rate(cal, 5, K6["p"], K6["g"]) == math.inf
    assert ceiling_rate(None, 6, K6["p"], K6["g"]) == math.inf


# ------------------------------------------------------------------ the rule as a property

EXAMPLES = int(os.environ.get("SPECWATCH_HYPOTHESIS_EXAMPLES", "50"))


def _num(lo: float, hi: float):
    return st.floats(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False,
                     allow_subnormal=False)


@settings(max_examples=EXAMPLES, deadline=None)
@given(a_v=_num(5e-3, 0.05), b_v=_num(0.0, 2e-4), c_v=_num(0.0, 2e-4), knee_v=_num(0.0, 600.0),
       a_d=_num(0.0, 5e-3), k=st.integers(1, 8), frac=_num(0.0, 1.0), p=_num(1.0, 2000.0),
       g=_num(1.0, 600.0), sd_factor=_num(0.2, 1.5),
       nosd_factor=st.one_of(st.none(), _num(0.2, 1.5)))
def test_the_bounded_break_even_never_says_sd_pays_at_a_load_it_calls_saturated(
        a_v, b_v, c_v, knee_v, a_d, k, frac, p, g, sd_factor, nosd_factor):
    """On random coefficients, workloads and measured ceilings (SD's, and maybe no SD's, at
    a fraction of the model's own λ*): λ* is the model's where no bound applies; where one
    does, SD paying below λ* stops at SD's measured ceiling, so every load `assess` calls
    saturated by that ceiling lies at or past λ*."""
    coef = Coefficients(a_p=0.1, b_p=0.002, a_v=a_v, b_v=b_v, a_d=a_d, b_d=0.0, c_v=c_v,
                        knee_v=knee_v)
    e = 1.0 + frac * k
    raw = model_breakeven(coef, k, e, p, g)
    top = float(raw.rate) if 0 < float(raw.rate) < math.inf else 10.0
    sd_cap = top * sd_factor
    ceilings = [_ceiling(k, sd_cap, p=p, g=g)]
    if nosd_factor is not None:
        ceilings.append(_ceiling(0, top * nosd_factor, p=p, g=g))
    params = Params(system="x", coefficients=coef, calibrated_range=CalibratedRange(
        max_arrival_rate=1e6, max_in_flight=1e9, draft_lengths=(0, k),
        measured_ceilings=tuple(ceilings)))
    be = breakeven(params, k, e, p, g)
    nosd_cap = top * nosd_factor if nosd_factor is not None else math.inf
    nosd_serves = bool(latency(coef, sd_cap, 0, 1.0, p, g, max_utilization=1.0).valid)
    bounds = sd_cap < nosd_cap and nosd_serves
    kind, rate = int(be.kind), float(be.rate)
    unchanged = kind == int(raw.kind) and (rate == float(raw.rate)
                                           or (math.isnan(rate) and math.isnan(float(raw.rate))))
    if not bounds:
        assert unchanged
        return
    if int(raw.kind) in (BreakEvenKind.PAYS_BELOW, BreakEvenKind.PAYS_EVERYWHERE):
        assert kind == BreakEvenKind.PAYS_BELOW and rate == min(float(raw.rate), sd_cap)
    elif int(raw.kind) == BreakEvenKind.PAYS_ABOVE and float(raw.rate) >= sd_cap:
        assert (kind, rate) == (BreakEvenKind.NEVER_PAYS, 0.0)
    else:
        assert unchanged
    if kind == BreakEvenKind.PAYS_BELOW:
        judged = assess(params, np.array([rate * 0.999, sd_cap]), k, e, p, g)
        assert "saturated" in judged.names(1)
        assert rate <= sd_cap


def test_advise_turns_sd_off_where_every_k_is_at_its_measured_ceiling(capsys, tmp_path):
    """With every k's runs stopping at 5 req/s on these lengths (and no SD still rising),
    SD is off from 5 req/s on, whatever the fit's best k says past it."""
    base = load_params(EAGLE)
    cal = dataclasses.replace(base.calibrated_range, measured_ceilings=tuple(
        _ceiling(k, 5.0, p=144.0, g=200.0) for k in range(1, 7)))
    path = tmp_path / "capped.yaml"
    dump_params(dataclasses.replace(base, calibrated_range=cal), path)
    argv = ["--arrival-rate-p50", 1, "--arrival-rate-p95", 2, "--arrival-rate-p99", 3,
            "--prompt-tokens", 144, "--generation-tokens", 200, "--json"]
    rc, shipped = run(capsys, "advise", "--params", EAGLE, *argv)
    # The shipped file: from 14.4 req/s every SD k is past the validity ceiling but k = 1 is
    # still priced faster (and below its measured ceiling, 15.09) up to where no SD reaches
    # its own ceiling, so no scanned load has SD off as the best choice.
    assert rc == 0 and shipped["sd_off_above_arrival_rate"] is None
    rc, out = run(capsys, "advise", "--params", path, *argv)
    # The first point of advise's λ scan (step about 0.006 req/s here) at or past 5.
    assert rc == 0 and 5.0 <= out["sd_off_above_arrival_rate"] < 5.05
    assert out["breakeven_arrival_rate"] <= 5.0
