"""Honest validity: every what-if `--json` carries `valid`, `validity_reasons` and
`calibrated_range`, judged by the model (saturation) and the parameters file's calibrated
range (load, batch, tokens per step, draft lengths)."""

import json
from pathlib import Path

import numpy as np
import pytest

from specwatch.cli import main
from specwatch.model.observed import CalibratedRange
from specwatch.model.validity import range_reasons

EAGLE = Path(__file__).resolve().parents[2] / "examples" / "params" / "qwen3-32b-h100-eagle3.yaml"
ISSUE = ["--draft-length", "3", "--acceptance-length", "2.23", "--prompt-tokens", "144",
         "--generation-tokens", "200", "--json"]


def run(capsys, *argv):
    rc = main([*map(str, argv)])
    return rc, json.loads(capsys.readouterr().out)


def test_issue_example_is_saturated_not_a_speedup(capsys):
    """The issue's command: at 14.6 req/s the measured server is at its SD ceiling. The
    whole-range fit says saturated (no speedup number), and SD's throughput ceiling ≈ 14.6
    req/s, with no break-even below it."""
    rc, out = run(capsys, "predict", "--params", EAGLE, "--arrival-rate", "14.6", *ISSUE)
    assert rc == 2 and out["valid"] is False
    # At the ceiling itself (λ/λ_max within 1% of 1): saturated or just below its ceiling.
    assert out["validity_reasons"][0] in ("saturated", "above_utilization_ceiling")
    assert out["speedup"] is None
    assert out["breakeven_arrival_rate"] is None
    assert out["breakeven_kind"] == "pays_to_ceiling"
    assert out["sd_ceiling_arrival_rate"] == pytest.approx(14.58, rel=0.15)
    assert out["calibrated_range"]["max_arrival_rate"] > 14.6


def test_inside_the_calibrated_range_is_valid(capsys):
    rc, out = run(capsys, "predict", "--params", EAGLE, "--arrival-rate", "8", *ISSUE)
    assert rc == 0 and out["valid"] is True and out["validity_reasons"] == []
    assert out["speedup"] > 1


def test_unmeasured_draft_length_is_extrapolated_k(capsys, tmp_path):
    rc, out = run(capsys, "predict", "--params", EAGLE, "--arrival-rate", "2",
                  "--draft-length", "7", "--alpha", "0.6", "--prompt-tokens", "144",
                  "--generation-tokens", "200", "--json")
    assert rc == 2 and out["valid"] is False and "extrapolated_k" in out["validity_reasons"]
    assert "calibrated range" in out["reason"]


def test_file_without_a_range_says_so(capsys, tmp_path):
    """An old parameters file (no calibrated_range, no uncertainty) still predicts the same
    number; `calibrated_range: null` and the reason `no_calibrated_range` tell the caller
    nothing was checked against it, and it has no interval to give."""
    old = tmp_path / "old.yaml"
    old.write_text("system: old\ncoefficients: {a_p: 0.1, b_p: 0.01, a_v: 0.02, b_v: 0.001, "
                   "a_d: 0.002, b_d: 0.0005}\n")
    rc, out = run(capsys, "predict", "--params", old, "--arrival-rate", "1", "--draft-length",
                  "3", "--alpha", "0.5", "--prompt-tokens", "100", "--generation-tokens",
                  "100", "--json")
    assert rc == 0 and out["calibrated_range"] is None
    assert out["validity_reasons"] == ["no_calibrated_range"]
    assert out["latency_interval"] is None and out["speedup_interval"] is None
    from specwatch.model import Coefficients, latency
    coef = Coefficients(a_p=0.1, b_p=0.01, a_v=0.02, b_v=0.001, a_d=0.002, b_d=0.0005)
    e = 1 + 0.5 + 0.25 + 0.125
    assert out["latency_sd_s"] == float(latency(coef, 1.0, 3.0, e, 100.0, 100.0).latency)


def test_sweep_marks_points_beyond_the_calibrated_load(capsys):
    rc, out = run(capsys, "sweep", "--params", EAGLE, "--arrival-rates", "1:20:4",
                  "--draft-lengths", "1,3", "--prompt-tokens", "144", "--generation-tokens",
                  "200", "--json")
    assert rc == 0 and out["calibrated_range"] is not None
    k3 = next(c for c in out["curves"] if c["draft_length"] == 3)
    assert k3["validity_reasons"][0] == [] and k3["valid"][0] is True
    assert "saturated" in k3["validity_reasons"][3] and k3["valid"][3] is False


def test_range_reasons_use_load_batch_and_tokens_per_step():
    cal = CalibratedRange(max_arrival_rate=10.0, max_in_flight=50.0, draft_lengths=(0, 1, 3),
                          margin=0.1, max_tokens_per_step=120.0)
    assert range_reasons(cal, 10.9, 40.0, 1) == []
    assert range_reasons(cal, 11.1, 40.0, 1) == ["beyond_calibrated_load"]
    assert range_reasons(cal, 5.0, 56.0, 0) == ["beyond_calibrated_load"]  # batch
    assert range_reasons(cal, 5.0, 34.0, 3) == ["beyond_calibrated_load"]  # 136 tokens/step
    assert range_reasons(cal, 5.0, 20.0, 2) == ["extrapolated_k"]
    assert range_reasons(None, 1e9, 1e9, 9) == []


def test_range_reasons_bound_by_the_headroom_the_runs_showed():
    """The in-flight bound is the system's own (SD for k > 0, no SD for k = 0); tokens per
    verify step bound both. Old files (no headroom recorded) keep the highest-load bounds."""
    cal = CalibratedRange(max_arrival_rate=10.0, max_in_flight=100.0, draft_lengths=(0, 1, 3),
                          margin=0.1, max_tokens_per_step=400.0, headroom_in_flight_sd=40.0,
                          headroom_in_flight_nosd=80.0, headroom_tokens_per_step=200.0)
    assert range_reasons(cal, 5.0, 44.0, 1) == []
    assert range_reasons(cal, 5.0, 45.0, 1) == ["beyond_calibrated_load"]  # SD in flight
    assert range_reasons(cal, 5.0, 85.0, 0) == []                          # no SD: its own
    assert range_reasons(cal, 5.0, 89.0, 0) == ["beyond_calibrated_load"]
    assert range_reasons(cal, 5.0, 40.0, 5) == ["beyond_calibrated_load", "extrapolated_k"]
    old = CalibratedRange(max_arrival_rate=10.0, max_in_flight=100.0, draft_lengths=(0, 1),
                          margin=0.1, max_tokens_per_step=400.0)
    assert range_reasons(old, 5.0, 89.0, 1) == []


def _run(conc: float, rate: float, lat: float, k: int = 1, dataset: str = "w"):
    from specwatch.calibrate.inputs import Point
    return Point(f"{dataset} c={conc:g} k={k}", "s", rate, lat, k, 2.0 if k else 1.0, 100.0,
                 200.0, concurrency=conc, dataset=dataset)


def test_headroom_is_what_a_run_with_more_throughput_above_it_held():
    """A run has headroom when a run of its curve holding more served >= 10% more: the top
    of a rising curve and the runs on a plateau have none (the runs cannot place a knee just
    past them). SD in flight over any k, no SD its own, tokens per step over both."""
    from specwatch.calibrate.evidence import headroom
    rising = [_run(8, 2.0, 4.0), _run(16, 3.8, 4.2), _run(32, 6.0, 5.0)]   # top: 30 held
    plateau = [_run(8, 2.0, 4.0, k=3), _run(16, 3.9, 4.1, k=3), _run(32, 4.0, 8.0, k=3),
               _run(64, 4.1, 15.6, k=3)]                                   # 16 ≈ 32 ≈ 64
    nosd = [_run(8, 2.5, 3.2, k=0), _run(16, 4.8, 3.3, k=0)]
    h = headroom(rising + plateau + nosd)
    assert h["headroom_in_flight_sd"] == pytest.approx(3.8 * 4.2)        # not the top's 30
    assert h["headroom_in_flight_nosd"] == pytest.approx(2.5 * 3.2)
    assert h["headroom_tokens_per_step"] == pytest.approx(max(3.8 * 4.2 * 2, 8.0 * 4))
    # One load level per curve: nothing to judge (None); all on a plateau: nothing vouched.
    assert headroom([_run(8, 2.0, 4.0)])["headroom_in_flight_sd"] is None
    flat = headroom([_run(8, 4.0, 2.0), _run(16, 4.1, 3.9)])
    assert flat["headroom_in_flight_sd"] == 0.0 and flat["headroom_in_flight_nosd"] is None


def test_below_a_curve_top_the_headroom_bound_does_not_apply():
    """Past the in-flight count the runs with headroom held, a fixed point is
    beyond_calibrated_load: the runs cannot tell whether a knee lies just past a curve's top
    run. Clearly below the top rate a curve of the same k and lengths was served at (by more
    than the margin), it lies between that curve's runs, so that bound does not apply; at
    the top or within the margin of it, and for other lengths or another k, it does."""
    import dataclasses

    from specwatch.calibrate.evidence import curve_tops
    from specwatch.model.params import load_params
    from specwatch.model.validity import assess

    params = load_params(EAGLE)
    cal = params.calibrated_range
    assert cal is not None and cal.curve_tops
    top = min((t for t in cal.curve_tops if t.k == 0), key=lambda t: t.arrival_rate)
    tight = dataclasses.replace(cal, headroom_in_flight_nosd=1.0, headroom_in_flight_sd=1.0,
                                headroom_tokens_per_step=1.0)
    judged = [assess(dataclasses.replace(params, calibrated_range=c),
                     [top.arrival_rate / 1.2, top.arrival_rate / 1.05], [0.0, 0.0], 1.0,
                     [top.prompt_tokens] * 2, [top.generation_tokens] * 2)
              for c in (tight, dataclasses.replace(tight, curve_tops=()))]
    assert judged[0].names_nosd(0) == []
    assert "beyond_calibrated_load" in judged[0].names_nosd(1)
    assert all("beyond_calibrated_load" in judged[1].names_nosd(i) for i in (0, 1))
    other = assess(dataclasses.replace(params, calibrated_range=tight),
                   top.arrival_rate / 1.2, 0.0, 1.0, top.prompt_tokens * 0.5,
                   top.generation_tokens)
    assert "beyond_calibrated_load" in other.names_nosd(0)
    # A curve's top is its highest rate, rounded down; one load level records none.
    assert [t.arrival_rate for t in curve_tops([_run(8, 2.0, 4.0), _run(16, 3.86789, 4.2)])] \
        == [3.8678]
    assert curve_tops([_run(8, 2.0, 4.0)]) == ()


def test_headroom_fields_round_trip_and_are_checked(tmp_path):
    from specwatch.common.errors import ConfigError
    from specwatch.model.params import dump_params, load_params
    params = load_params(EAGLE)
    cal = params.calibrated_range
    assert cal is not None and cal.headroom_in_flight_sd is not None
    out = tmp_path / "p.yaml"
    dump_params(params, out)
    assert load_params(out).calibrated_range == cal and cal.curve_tops
    bad = tmp_path / "bad.yaml"
    bad.write_text(EAGLE.read_text().replace("headroom_in_flight_sd:",
                                             "headroom_in_flight_sd: -1 #"))
    with pytest.raises(ConfigError, match="headroom_in_flight_sd"):
        load_params(bad)


@pytest.mark.parametrize("name", ["eagle3", "qwen3-1.7b", "qwen3-4b"])
def test_the_whole_prediction_is_valid_exactly_when_both_latencies_are(name):
    """`valid` (both systems: the speedup) is `valid_sd` and `valid_nosd` together, and each
    system's reasons are among the whole prediction's, over loads from idle to past every
    ceiling, each k, two workloads."""
    from specwatch.model.params import load_params
    from specwatch.model.validity import assess

    params = load_params(EAGLE.parent / f"qwen3-32b-h100-{name}.yaml")
    lam = np.linspace(0.2, 20.0, 60)[:, None, None]
    k = np.arange(0.0, 7.0)[None, :, None]
    e = np.where(k > 0, 1.0 + 0.3 * k, 1.0)
    p = np.array([147.0, 80.0])[None, None, :]
    g = np.array([200.0, 230.0])[None, None, :]
    judged = assess(params, lam, k, e, p, g)
    np.testing.assert_array_equal(judged.valid, judged.valid_sd & judged.valid_nosd)
    assert judged.valid.sum() > 0
    for i in range(judged.valid.size):
        assert set(judged.names_sd(i)) | set(judged.names_nosd(i)) >= set(judged.names(i)) \
            - {"sensitive"}


def test_a_top_the_curve_still_rose_into_vouches_for_the_load_up_to_it(tmp_path):
    """A curve's top is `rising` when it holds the most requests in flight of its curve and
    the step into it raised throughput by at least RISING_ELASTICITY of the rise in requests
    in flight (d ln λ / d ln B). At or below a rising top's rate the headroom bound does not
    apply; at a top that is not rising, or past a rising one, it still does. The flag round
    trips through the parameters file and is checked there."""
    import dataclasses

    from specwatch.calibrate.evidence import RISING_ELASTICITY, curve_tops
    from specwatch.common.errors import ConfigError
    from specwatch.model.params import dump_params, load_params
    from specwatch.model.validity import assess

    rising = [_run(8, 2.0, 4.0), _run(16, 3.8, 4.2), _run(32, 6.0, 5.0)]    # 0.72
    flat = [_run(8, 2.0, 4.0, k=3), _run(16, 3.9, 4.1, k=3), _run(32, 4.0, 8.0, k=3)]  # 0.04
    slow = [_run(8, 2.0, 4.0, k=2), _run(16, 3.0, 5.0, k=2)]             # 0.52: not rising
    tops = {t.k: t for t in curve_tops(rising + flat + slow)}
    assert RISING_ELASTICITY == 0.7
    assert tops[1].rising and not tops[3].rising and not tops[2].rising
    # A run past the top (more in flight, less throughput): the top did not rise into it.
    assert not curve_tops([*rising, _run(64, 5.9, 11.0)])[0].rising

    params = load_params(EAGLE)
    cal = dataclasses.replace(params.calibrated_range, curve_tops=tuple(tops.values()),
                              headroom_in_flight_sd=1.0, headroom_tokens_per_step=1.0,
                              measured_ceilings=())
    judged = assess(dataclasses.replace(params, calibrated_range=cal),
                    [6.0, 6.0 * 1.02, 4.0], [1.0, 1.0, 3.0], [1.7, 1.7, 2.2], 100.0, 200.0)
    assert "beyond_calibrated_load" not in judged.names_sd(0)
    assert "beyond_calibrated_load" in judged.names_sd(1)
    assert "beyond_calibrated_load" in judged.names_sd(2)

    out = tmp_path / "p.yaml"
    dump_params(dataclasses.replace(params, calibrated_range=cal), out)
    assert load_params(out).calibrated_range.curve_tops == cal.curve_tops
    assert "rising: true" in out.read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(out.read_text().replace("rising: true", "rising: 1"))
    with pytest.raises(ConfigError, match="rising"):
        load_params(bad)
