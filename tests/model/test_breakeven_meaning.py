"""Break-even is where the predicted speedup crosses 1; SD's throughput ceiling is another
figure, named apart, and neither is quoted beyond the calibrated range without its reason.

On every shipped parameters file the fitted SD speedup stays above 1 (1.4-1.7x) up to SD's
throughput ceiling, which lies below no-SD's: SD stops keeping up there while no-SD still
serves. `predict`, `sweep` and `advise` used to print that ceiling as the break-even ("13.6
req/s (SD pays below it)" for EAGLE-3 at k = 3, where the model predicts 1.7x). A c <= 64 fit
of the public sweep (calibrated up to 11.6 req/s) printed its λ* of 20-25 req/s with no
caveat while `sweep` declined every load from 8 req/s on.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from specwatch.cli import main
from specwatch.model.closed_form import speedup
from specwatch.model.params import load_params

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "examples" / "params").glob("*.yaml"))
SWEEP = ROOT / "tests" / "fixtures" / "sd-validation" / "tomasruizt_qwen3-32b_1xH100_vllm-bench.csv"
#: The InstructCoder workload of the sweep (mean prompt and generated tokens).
P, G = 147.14, 199.98


def _json(capsys, *argv) -> tuple[int, dict]:
    rc = main([*map(str, argv)])
    return rc, json.loads(capsys.readouterr().out)


def _text(capsys, *argv) -> str:
    main([*map(str, argv)])
    return " ".join(capsys.readouterr().out.split())  # the tables wrap long notes


def _predict(capsys, params: Path, k: int, rate: float = 1.0) -> dict:
    return _json(capsys, "predict", "--params", params, "--arrival-rate", rate,
                 "--draft-length", k, "--prompt-tokens", P, "--generation-tokens", G,
                 "--json")[1]


def _speedup(params: Path, rate: float, k: int, e: float) -> float:
    return float(speedup(load_params(params).model(), rate, k, e, P, G))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_predict_break_even_is_where_the_speedup_crosses_one(capsys, path):
    """At every k the shipped files cover: the printed break-even is a rate where the model's
    speedup is 1; where the speedup stays above 1 up to SD's throughput ceiling there is no
    break-even (`pays_to_ceiling`), and the ceiling is its own figure."""
    for k in range(1, 7):
        out = _predict(capsys, path, k)
        e = out["acceptance_length"]
        rate = out["breakeven_arrival_rate"]
        ceiling = out["sd_ceiling_arrival_rate"]
        assert ceiling is not None and ceiling > 0
        if rate is not None:
            assert out["breakeven_kind"] in ("pays_below", "pays_above")
            assert _speedup(path, rate, k, e) == pytest.approx(1.0, abs=1e-6)
            assert rate < ceiling
        else:
            assert out["breakeven_kind"] == "pays_to_ceiling"
            assert _speedup(path, ceiling * (1 - 1e-6), k, e) > 1.0
        if out["sd_ceiling_source"] == "measured":
            measured = {c.k: c.arrival_rate
                        for c in load_params(path).calibrated_range.measured_ceilings}
            assert ceiling == measured[k]


def test_the_figure_once_called_break_even_is_named_the_ceiling(capsys):
    """EAGLE-3 at k = 3: its curve stopped rising at 13.58 req/s, where the model predicts
    about 1.7x. That rate is SD's throughput ceiling, not a break-even, in JSON and text."""
    eagle = ROOT / "examples" / "params" / "qwen3-32b-h100-eagle3.yaml"
    (cap,) = [c.arrival_rate for c in load_params(eagle).calibrated_range.measured_ceilings
              if c.k == 3]
    out = _predict(capsys, eagle, 3, rate=5)
    assert _speedup(eagle, cap, 3, out["acceptance_length"]) > 1.5
    assert out["breakeven_arrival_rate"] is None and out["breakeven_interval"] is None
    assert out["breakeven_kind"] == "pays_to_ceiling"
    assert out["sd_ceiling_arrival_rate"] == cap and out["sd_ceiling_source"] == "measured"
    text = _text(capsys, "predict", "--params", eagle, "--arrival-rate", 5, "--draft-length", 3,
                 "--prompt-tokens", P, "--generation-tokens", G)
    assert "break-even arrival rate (speedup = 1): none below SD's throughput ceiling" in text
    assert f"SD throughput ceiling: {cap:.3g} req/s" in text
    assert "SD pays below" not in text
    # sweep and advise say the same.
    rc, sw = _json(capsys, "sweep", "--params", eagle, "--arrival-rates", "1:12:12",
                   "--draft-lengths", "3", "--prompt-tokens", P, "--generation-tokens", G,
                   "--json")
    (curve,) = sw["curves"]
    assert rc == 0 and curve["breakeven_kind"] == "pays_to_ceiling"
    assert curve["breakeven_arrival_rate"] is None and curve["sd_ceiling_arrival_rate"] == cap
    text = _text(capsys, "sweep", "--params", eagle, "--arrival-rates", "1:12:12",
                 "--draft-lengths", "3", "--prompt-tokens", P, "--generation-tokens", G)
    assert f"break-even none below SD's throughput ceiling; SD ceiling {cap:.4g} req/s " \
           "(measured, 90% interval" in text
    rc, adv = _json(capsys, "advise", "--params", eagle, "--arrival-rate-p50", 2,
                    "--arrival-rate-p95", 3, "--arrival-rate-p99", 4,
                    "--prompt-tokens", P, "--generation-tokens", G, "--json")
    measured = {c.k: c.arrival_rate
                for c in load_params(eagle).calibrated_range.measured_ceilings}
    assert rc == 0 and adv["breakeven_kind"] == "pays_to_ceiling"
    assert adv["breakeven_arrival_rate"] is None
    assert adv["sd_ceiling_arrival_rate"] == measured[adv["draft_length"]]
    advice = " ".join(" ".join(adv["advice"]).split())
    assert "no break-even below it" in advice
    assert f"SD's throughput ceiling at k = {adv['draft_length']}" in advice


@pytest.fixture(scope="module")
def c64_eagle(tmp_path_factory) -> Path:
    """EAGLE-3 fitted on the public sweep's runs up to 64 requests in flight, as a user
    would (`calibrate --max-concurrency 64`): calibrated up to 11.6 req/s."""
    out = tmp_path_factory.mktemp("c64") / "eagle3-c64.yaml"
    assert main(["calibrate", str(SWEEP), "--system", "eagle3", "--max-concurrency", "64",
                 "--out", str(out)]) == 0
    return out


def test_figures_past_the_calibrated_range_carry_the_reason(capsys, c64_eagle):
    cal = load_params(c64_eagle).calibrated_range
    assert cal.max_arrival_rate == pytest.approx(11.6, abs=0.05)
    for k in (1, 3):
        out = _predict(capsys, c64_eagle, k)
        for key in ("breakeven", "sd_ceiling"):
            rate = out[f"{key}_arrival_rate"]
            if rate is not None and rate > cal.max_arrival_rate * (1 + cal.margin):
                assert "beyond_calibrated_load" in out[f"{key}_reasons"], (k, key, rate)
        # predict itself declines a latency at that rate for the same reason.
        if out["breakeven_arrival_rate"] is not None:
            at = _predict(capsys, c64_eagle, k, rate=out["breakeven_arrival_rate"])
            assert "beyond_calibrated_load" in at["validity_reasons"]
    text = _text(capsys, "sweep", "--params", c64_eagle, "--arrival-rates", "2:14:4",
                 "--draft-lengths", "1", "--prompt-tokens", P, "--generation-tokens", G)
    note = text[text.index("k = 1 (E"):]
    assert "outside the calibrated range, up to 11.6 req/s: beyond_calibrated_load" in note
    text = _text(capsys, "predict", "--params", c64_eagle, "--arrival-rate", 4,
                 "--draft-length", 1, "--prompt-tokens", P, "--generation-tokens", G)
    be = text[text.index("break-even arrival rate"):text.index("SD throughput ceiling")]
    assert "beyond_calibrated_load" in be and "∞" not in be


def test_a_break_even_interval_open_above_is_given_in_words(capsys, c64_eagle):
    """An interval whose optimistic corner has no crossing reads 'above x req/s', never
    '[x, ∞]'."""
    from specwatch.model.whatif.predict import breakeven_interval_text

    assert breakeven_interval_text([11.2, None]) == "above 11.2 req/s"
    assert breakeven_interval_text([11.2, 12.5]) == "11.2–12.5 req/s"
    for k in range(1, 7):
        out = _predict(capsys, c64_eagle, k)
        iv = out["breakeven_interval"]
        if iv is not None:
            assert iv[0] is not None and (iv[1] is None or math.isfinite(iv[1]))


def test_calibrates_report_names_both_figures_and_their_reasons(capsys):
    """`calibrate --json` on the c <= 64 runs: per draft length, the break-even where the
    speedup crosses 1 and SD's throughput ceiling apart, each past the calibrated range with
    the reason; the terminal table marks them."""
    rc, doc = _json(capsys, "calibrate", SWEEP, "--system", "eagle3", "--max-concurrency", 64,
                    "--json")
    assert rc == 0
    (system,) = doc["systems"].values()
    top = system["calibrated_range"]["max_arrival_rate"]
    rows = system["draft_lengths"]
    assert [r["k"] for r in rows] == [1, 2, 3, 4, 5, 6]
    for r in rows:
        assert r["sd_ceiling_arrival_rate"] is not None and r["sd_ceiling_source"] == "model"
        if r["breakeven_arrival_rate"] is not None:
            assert r["breakeven_arrival_rate"] < r["sd_ceiling_arrival_rate"]
        for key in ("breakeven", "sd_ceiling"):
            rate = r[f"{key}_arrival_rate"]
            if rate is not None and rate > top * 1.1:
                assert "beyond_calibrated_load" in r[f"{key}_reasons"], (r["k"], key)
    main(["calibrate", str(SWEEP), "--system", "eagle3", "--max-concurrency", "64"])
    text = capsys.readouterr().out
    assert "SD ceiling" in text and "outside the calibrated range (beyond_calibrated_load)" in text


def test_advises_sd_off_rate_past_the_range_carries_the_reason(capsys, c64_eagle):
    """The rate from which SD is off (any k) is a figure of the same kind: past the
    calibrated range it says so, in JSON and text."""
    argv = ["advise", "--params", c64_eagle, "--arrival-rate-p50", 3, "--arrival-rate-p95", 6,
            "--arrival-rate-p99", 8, "--prompt-tokens", P, "--generation-tokens", G]
    rc, out = _json(capsys, *argv, "--json")
    assert rc == 0
    top = load_params(c64_eagle).calibrated_range.max_arrival_rate
    assert out["sd_off_above_arrival_rate"] > top * 1.1
    assert out["sd_off_above_reasons"] == ["beyond_calibrated_load"]
    text = _text(capsys, *argv)
    assert "the best choice is SD off (outside the calibrated range" in text
