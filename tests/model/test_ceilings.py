"""SD's measured ceiling bounds where a break-even can lie, and is reported as SD's
throughput ceiling, not as a break-even.

A prediction at or past a measured ceiling of its k and workload is `saturated`; the
break-even must not say SD pays there. On the shipped EAGLE-3 file, k = 6 on InstructCoder
stops rising at 9.80 req/s (c = 128 and 256 serve 10.05 and 9.80 req/s), while the fit's
speedup stays above 1 up to its own SD ceiling of 11.6 req/s: there is no break-even below
the measured ceiling, and 9.80 req/s is SD's throughput ceiling.
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
from specwatch.model.ceilings import (
    breakeven,
    breakeven_interval,
    ceiling_rate,
    sd_ceiling_interval,
    sd_throughput_ceiling,
)
from specwatch.model.closed_form import latency, speedup
from specwatch.model.costs import throughput_ceiling
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
    assert out["breakeven_kind"] == "pays_to_ceiling"
    assert out["breakeven_arrival_rate"] is None and out["breakeven_interval"] is None
    assert out["breakeven_measured_ceiling"] == cap
    assert out["sd_ceiling_arrival_rate"] == cap and out["sd_ceiling_source"] == "measured"
    lo, hi = out["sd_ceiling_interval"]
    assert lo == pytest.approx(cap / 1.1) and hi == pytest.approx(cap * 1.1)
    # The text says where the number comes from.
    main(["predict", "--params", str(EAGLE), "--arrival-rate", "8", *map(str, lengths[:-1])])
    text = " ".join(capsys.readouterr().out.split())  # the table wraps long notes
    assert "measured: the calibration runs of this k on these lengths stopped rising" in text
    # Below it the prediction is the fit's and stands.
    rc, out = run(capsys, "predict", "--params", EAGLE, "--arrival-rate", 8.0, *lengths)
    assert "saturated" not in out["validity_reasons"]


def test_sweep_and_advise_report_the_same_ceiling(capsys):
    """Sweep at k = 6, and advise at the draft length it advises (its own curve's ceiling)."""
    cap = _k6_ceiling()
    lengths = ["--prompt-tokens", K6["p"], "--generation-tokens", K6["g"]]
    rc, out = run(capsys, "sweep", "--params", EAGLE, "--arrival-rates", "1:12:12",
                  "--draft-lengths", "1,6", *lengths, "--json")
    assert rc == 0
    k6 = next(c for c in out["curves"] if c["draft_length"] == 6)
    assert k6["breakeven_kind"] == "pays_to_ceiling" and k6["sd_ceiling_arrival_rate"] == cap
    rc, out = run(capsys, "advise", "--params", EAGLE, "--arrival-rate-p50", 2,
                  "--arrival-rate-p95", 3, "--arrival-rate-p99", 4, "--draft-length", 6,
                  "--acceptance-length", K6["e"], *lengths, "--json")
    assert rc == 0 and out["breakeven_kind"] == "pays_to_ceiling"
    ceiling = {c.k: c.arrival_rate
               for c in load_params(EAGLE).calibrated_range.measured_ceilings}
    assert out["sd_ceiling_arrival_rate"] == ceiling[out["draft_length"]]


# ------------------------------------------------------------------ the rule, on constructed files


def _ceiling(k: int, rate: float, p: float = K6["p"], g: float = K6["g"]) -> MeasuredCeiling:
    return MeasuredCeiling(k=k, prompt_tokens=p, generation_tokens=g, arrival_rate=rate)


#: The worked example of tests/model/test_model.py: a linear fit whose speedup at k = 3,
#: α = 0.5 (E = 1.875), p = g = 100 crosses 1 at λ* = 1.84/0.4124 = 4.46 req/s, below SD's
#: ceiling (6.98 req/s).
WORKED = Coefficients(a_p=0.1, b_p=0.01, a_v=0.02, b_v=0.001, a_d=0.002, b_d=0.0005)
W = {"k": 3.0, "e": 1.875, "p": 100.0, "g": 100.0}


def _worked(ceilings: tuple[MeasuredCeiling, ...], unc: Uncertainty | None = None) -> Params:
    cal = CalibratedRange(max_arrival_rate=20.0, max_in_flight=300.0, draft_lengths=(0, 3),
                          measured_ceilings=ceilings)
    return Params(system="worked", coefficients=WORKED, calibrated_range=cal, uncertainty=unc)


def _wc(k: int, rate: float) -> MeasuredCeiling:
    return MeasuredCeiling(k=k, prompt_tokens=W["p"], generation_tokens=W["g"],
                           arrival_rate=rate)


def _w_be(params: Params) -> tuple[float, int]:
    be = breakeven(params, W["k"], W["e"], W["p"], W["g"])
    return float(be.rate), int(be.kind)


def test_the_models_speedup_stays_above_1_up_to_sds_ceiling_on_the_shipped_file():
    """EAGLE-3 k = 6: no crossing below SD's ceiling (11.6 req/s), which lies below no SD's,
    so there is no break-even; the ceiling is its own figure."""
    params = load_params(EAGLE)
    raw = model_breakeven(params.model(), K6["k"], K6["e"], K6["p"], K6["g"])
    assert int(raw.kind) == BreakEvenKind.PAYS_TO_CEILING and float(raw.rate) == math.inf
    model_cap = float(throughput_ceiling(params.coefficients, K6["k"], K6["e"], K6["p"],
                                         K6["g"]))
    assert model_cap > 10.5
    assert float(speedup(params.model(), model_cap * (1 - 1e-9), K6["k"], K6["e"], K6["p"],
                         K6["g"])) > 1.0
    no_range = dataclasses.replace(params, calibrated_range=None)
    rate, measured = sd_throughput_ceiling(no_range, K6["k"], K6["e"], K6["p"], K6["g"])
    assert float(rate) == model_cap and not bool(measured)
    rate, measured = sd_throughput_ceiling(params, K6["k"], K6["e"], K6["p"], K6["g"])
    assert float(rate) == _k6_ceiling() and bool(measured)


def test_without_measured_ceilings_the_break_even_is_the_models():
    rate, kind = _w_be(_worked(()))
    assert kind == BreakEvenKind.PAYS_BELOW and rate == pytest.approx(1.84 / 0.4124)
    assert _w_be(dataclasses.replace(_worked(()), calibrated_range=None)) == (rate, kind)


def test_a_measured_ceiling_below_the_crossing_leaves_no_break_even():
    rate, _ = _w_be(_worked(()))
    assert _w_be(_worked((_wc(3, 4.0),))) == (math.inf, BreakEvenKind.PAYS_TO_CEILING)
    assert _w_be(_worked((_wc(3, rate),))) == (math.inf, BreakEvenKind.PAYS_TO_CEILING)
    assert _w_be(_worked((_wc(3, rate + 0.5),))) == (rate, BreakEvenKind.PAYS_BELOW)
    ceiling, measured = sd_throughput_ceiling(_worked((_wc(3, 4.0),)), W["k"], W["e"],
                                              W["p"], W["g"])
    assert float(ceiling) == 4.0 and bool(measured)


def test_only_the_same_k_and_workload_are_bounded():
    rate, _ = _w_be(_worked(()))
    other = MeasuredCeiling(k=3, prompt_tokens=W["p"] * 1.2, generation_tokens=W["g"],
                            arrival_rate=4.0)
    assert _w_be(_worked((_wc(2, 4.0), other))) == (rate, BreakEvenKind.PAYS_BELOW)
    # Within the 10% length tolerance it is the same curve.
    near = MeasuredCeiling(k=3, prompt_tokens=W["p"] * 1.09, generation_tokens=W["g"] * 0.91,
                           arrival_rate=4.0)
    assert _w_be(_worked((near,)))[1] == BreakEvenKind.PAYS_TO_CEILING


def test_no_bound_where_no_sd_is_at_its_own_ceiling_first():
    """If no SD stopped rising at a lower rate, SD's ceiling does not end SD's paying."""
    rate, _ = _w_be(_worked(()))
    assert _w_be(_worked((_wc(3, 4.0), _wc(0, 3.5)))) == (rate, BreakEvenKind.PAYS_BELOW)


def test_vectorised_over_k_like_the_model():
    params = _worked((_wc(3, 4.0),))
    ks = np.array([1.0, 3.0])
    es = np.array([1.5, W["e"]])
    be = breakeven(params, ks, es, W["p"], W["g"])
    raw = model_breakeven(params.model(), ks, es, W["p"], W["g"])
    assert be.rate[0] == raw.rate[0] and be.kind[0] == raw.kind[0]
    assert be.rate[1] == math.inf and be.kind[1] == BreakEvenKind.PAYS_TO_CEILING


def test_sd_that_pays_everywhere_pays_up_to_its_measured_ceiling():
    """A model in which SD pays at every load below saturation: with a measured SD ceiling
    (no SD still serves there) SD pays up to it, with no break-even, and the ceiling is
    SD's throughput ceiling."""
    coef = Coefficients(a_p=0.1, b_p=0.0, a_v=0.03, b_v=1e-5, a_d=1e-3, b_d=0.0)
    params = Params(system="x", coefficients=coef, calibrated_range=CalibratedRange(
        max_arrival_rate=20.0, max_in_flight=300.0, draft_lengths=(0, 3),
        measured_ceilings=(_ceiling(3, 5.0, p=100.0, g=100.0),)))
    raw = model_breakeven(coef, 3.0, 3.0, 100.0, 100.0)
    assert int(raw.kind) == BreakEvenKind.PAYS_EVERYWHERE
    be = breakeven(params, 3.0, 3.0, 100.0, 100.0)
    assert float(be.rate) == math.inf and int(be.kind) == BreakEvenKind.PAYS_TO_CEILING
    assert float(sd_throughput_ceiling(params, 3.0, 3.0, 100.0, 100.0)[0]) == 5.0


def test_an_interval_end_past_the_measured_ceiling_is_open():
    """Where the optimistic corner's crossing lies at or past SD's measured ceiling, that
    corner has no break-even below the ceiling: the upper end is open (+inf); a ceiling past
    both ends leaves the fit's interval."""
    unc = Uncertainty(bands=(Band(utilization_below=math.inf, sigma=0.03, runs=10),))
    rate, _ = _w_be(_worked(()))
    lo, hi = breakeven_interval(_worked((), unc), W["k"], W["e"], W["p"], W["g"], rate)
    assert lo < rate < hi
    assert breakeven_interval(_worked((_wc(3, hi * 1.01),), unc), W["k"], W["e"], W["p"],
                              W["g"], rate) == (lo, hi)
    assert breakeven_interval(_worked((_wc(3, (rate + hi) / 2),), unc), W["k"], W["e"],
                              W["p"], W["g"], rate) == (lo, math.inf)
    assert breakeven_interval(_worked(()), W["k"], W["e"], W["p"], W["g"],
                              rate) is None  # no uncertainty block


def test_the_ceiling_interval():
    """A measured ceiling is known to the calibrated range's margin; the model's to the
    fit's spread at utilisation 1 (its L(B) scaled by 1 ± zσ)."""
    unc = Uncertainty(bands=(Band(utilization_below=math.inf, sigma=0.03, runs=10),))
    assert sd_ceiling_interval(_worked((), unc), 4.0, True) == pytest.approx((4.0 / 1.1,
                                                                              4.4))
    d = unc.z * 0.03
    assert sd_ceiling_interval(_worked((), unc), 7.0, False) == pytest.approx(
        (7.0 / (1 + d), 7.0 / (1 - d)))
    assert sd_ceiling_interval(_worked(()), 7.0, False) is None


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
    does, a crossing at or past SD's measured ceiling is none (PAYS_TO_CEILING), so a
    reported λ* always lies below every load `assess` calls saturated by that ceiling."""
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
    if (int(raw.kind) == BreakEvenKind.PAYS_BELOW and float(raw.rate) >= sd_cap) \
            or int(raw.kind) == BreakEvenKind.PAYS_EVERYWHERE:
        assert (kind, rate) == (BreakEvenKind.PAYS_TO_CEILING, math.inf)
    elif int(raw.kind) == BreakEvenKind.PAYS_ABOVE and float(raw.rate) >= sd_cap:
        assert (kind, rate) == (BreakEvenKind.NEVER_PAYS, 0.0)
    else:
        assert unchanged
    if kind == BreakEvenKind.PAYS_BELOW:
        judged = assess(params, np.array([rate * 0.999, sd_cap]), k, e, p, g)
        assert "saturated" in judged.names(1)
        assert rate < sd_cap


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
    assert out["breakeven_arrival_rate"] is None and out["sd_ceiling_arrival_rate"] == 5.0
