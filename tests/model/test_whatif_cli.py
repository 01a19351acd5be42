"""The what-if CLI (predict, sweep, advise): JSON keys and values, exit 2 naming the bad
option (with `valid: false` under --json), CSV and PNG outputs, plain-text fallback.

The parameters file is the worked-example system of tests/model/test_model.py (a_p=0.1, b_p=0.01,
a_v=0.02, b_v=0.001, a_d=0.002, b_d=0.0005), so the numbers below are the hand-computed ones
there: at λ = 2, k = 3, α = 0.5, p = g = 100: L_SD = 2.084112 s, L_D = 2.692308 s,
S = 1.291825, ρ_SD = 0.286667, λ* = 1.84/0.4124 = 4.461687 req/s.
"""

import csv
import itertools
import json
import sys

import pytest

from specwatch.cli import main

PARAMS = """\
system: worked-example
coefficients: {a_p: 0.1, b_p: 0.01, a_v: 0.02, b_v: 0.001, a_d: 0.002, b_d: 0.0005}
"""
LENGTHS = ["--prompt-tokens", "100", "--generation-tokens", "100"]


@pytest.fixture
def params(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(PARAMS)
    return str(path)


def run_json(capsys, argv):
    rc = main(argv)
    captured = capsys.readouterr()
    return rc, json.loads(captured.out), captured.err


def test_predict_json_keys_and_worked_values(params, capsys):
    rc, out, _ = run_json(capsys, ["predict", "--params", params, "--arrival-rate", "2",
                                   "--draft-length", "3", "--alpha", "0.5", *LENGTHS, "--json"])
    assert rc == 0
    for key in ("latency_sd_s", "latency_nosd_s", "speedup", "utilization", "valid",
                "breakeven_arrival_rate", "optimal_draft_length"):
        assert key in out
    assert out["valid"] is True and "reason" not in out
    assert out["latency_sd_s"] == pytest.approx(2.084112, rel=1e-6)
    assert out["latency_nosd_s"] == pytest.approx(2.692308, rel=1e-6)
    assert out["speedup"] == pytest.approx(4.494 / 3.4788, rel=1e-9)
    assert out["utilization"] == pytest.approx(0.86 / 3, rel=1e-9)
    assert out["breakeven_arrival_rate"] == pytest.approx(1.84 / 0.4124, rel=1e-9)
    assert out["breakeven_kind"] == "pays_below"
    # At λ = 2 the best k by hand: k=2 (see test_model worked example: 2 at λ=0, 1 at λ=4).
    assert out["optimal_draft_length"] in (1, 2)


@pytest.mark.parametrize("system", ["nosd", "sd"])
def test_predict_valid_is_the_latency_asked_for_and_the_speedup_has_its_own(
        tmp_path, capsys, system):
    """`valid` and the exit status judge the latency asked for (SD at k); the speedup needs
    the no-SD latency at the same rate too, so it has its own verdict (`speedup_valid`) and
    no number without it. A calibrated range whose runs with throughput headroom held one
    request puts one system's fixed point (B = 5.4 without SD, 4.2 with) beyond it."""
    path = tmp_path / "params.yaml"
    path.write_text(PARAMS + "calibrated_range: {max_arrival_rate: 10, max_in_flight: 100,"
                    f" draft_lengths: [0, 3], headroom_in_flight_{system}: 1.0}}\n")
    argv = ["predict", "--params", str(path), "--arrival-rate", "2", "--draft-length", "3",
            "--alpha", "0.5", *LENGTHS]
    rc, out, _ = run_json(capsys, [*argv, "--json"])
    assert out["speedup_valid"] is False and out["speedup"] is None
    assert out["speedup_reasons"] == ["beyond_calibrated_load"]
    assert out["latency_sd_s"] == pytest.approx(2.084112, rel=1e-6)
    assert out["latency_nosd_s"] == pytest.approx(2.692308, rel=1e-6)
    if system == "nosd":
        assert rc == 0 and out["valid"] is True and out["validity_reasons"] == []
        assert "reason" not in out
        assert out["latency_nosd_reasons"] == ["beyond_calibrated_load"]
        assert "without SD" in out["speedup_reason"]
    else:
        assert rc == 2 and out["valid"] is False
        assert out["validity_reasons"] == ["beyond_calibrated_load"]
        assert "calibrated range" in out["reason"] and "speedup_reason" not in out
        assert out["latency_nosd_valid"] is True
    rc_text = main(argv)
    text = " ".join(capsys.readouterr().out.split())
    if system == "nosd":
        assert rc_text == 0 and "valid: yes" in text
        assert "speedup: not vouched for: the latency without SD" in text
    else:
        assert rc_text == 2 and "speedup:" not in text


def test_predict_acceptance_length_matches_alpha(params, capsys):
    """E = 1.875 at k = 3 is α = 0.5: same prediction either way."""
    _, by_e, _ = run_json(capsys, ["predict", "--params", params, "--arrival-rate", "2",
                                   "--draft-length", "3", "--acceptance-length", "1.875",
                                   *LENGTHS, "--json"])
    assert by_e["alpha"] == pytest.approx(0.5, abs=1e-12)
    assert by_e["latency_sd_s"] == pytest.approx(2.084112, rel=1e-6)


def test_predict_table_is_readable(params, capsys):
    assert main(["predict", "--params", params, "--arrival-rate", "2", "--draft-length", "3",
                 "--alpha", "0.5", *LENGTHS]) == 0
    text = capsys.readouterr().out
    assert "with SD" in text and "without SD" in text
    assert "speedup: 1.292x" in text
    assert "4.46 req/s (SD pays below it)" in text


def test_predict_plain_text_without_rich(params, capsys, monkeypatch):
    """The analysis extra is optional: without rich the table is aligned plain text."""
    monkeypatch.setitem(sys.modules, "rich", None)
    monkeypatch.setitem(sys.modules, "rich.console", None)
    monkeypatch.setitem(sys.modules, "rich.table", None)
    assert main(["predict", "--params", params, "--arrival-rate", "2", "--draft-length", "3",
                 "--alpha", "0.5", *LENGTHS]) == 0
    text = capsys.readouterr().out
    assert "┃" not in text and "mean latency (s)" in text and "2.084" in text


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--arrival-rate", "-1", "--draft-length", "3", "--alpha", "0.5"], "--arrival-rate"),
        (["--arrival-rate", "nan", "--draft-length", "3", "--alpha", "0.5"], "--arrival-rate"),
        (["--arrival-rate", "2", "--draft-length", "-3", "--alpha", "0.5"], "--draft-length"),
        (["--arrival-rate", "2", "--draft-length", "3", "--alpha", "1.0"], "--alpha"),
        (["--arrival-rate", "2", "--draft-length", "3", "--alpha", "-0.1"], "--alpha"),
        (["--arrival-rate", "2", "--draft-length", "3", "--acceptance-length", "4.5"],
         "--acceptance-length"),
        (["--arrival-rate", "2", "--draft-length", "3", "--acceptance-length", "0.9"],
         "--acceptance-length"),
        (["--arrival-rate", "2", "--draft-length", "3"], "--alpha"),  # no acceptance at all
        # λ·C2_SD = 7·0.143333 = 1.003: past saturation.
        (["--arrival-rate", "7", "--draft-length", "3", "--alpha", "0.5"], "--arrival-rate"),
        # λ·C2_SD = 6.5·0.143333 = 0.932: above the 0.9 ceiling.
        (["--arrival-rate", "6.5", "--draft-length", "3", "--alpha", "0.5"], "--arrival-rate"),
    ],
)
def test_predict_bad_input_exits_2_naming_the_option(params, capsys, args, option):
    assert main(["predict", "--params", params, *args, *LENGTHS]) == 2
    assert option in capsys.readouterr().err
    rc, out, _ = run_json(capsys, ["predict", "--params", params, *args, *LENGTHS, "--json"])
    assert rc == 2
    assert out["valid"] is False and option in out["reason"]


def test_predict_saturation_reason_reports_utilisation(params, capsys):
    rc, out, _ = run_json(capsys, ["predict", "--params", params, "--arrival-rate", "7",
                                   "--draft-length", "3", "--alpha", "0.5", *LENGTHS, "--json"])
    assert rc == 2
    assert "saturation" in out["reason"] and "1" in out["reason"]
    assert out["latency_sd_s"] is None and out["speedup"] is None
    assert out["utilization"] == pytest.approx(7 * 0.43 / 3)
    # At 7 req/s k = 1 (E = 1.5) has C2 = 0.01 + (100/1.5)·0.0015 = 0.11 = C2_D, ρ = 0.77:
    # L = 1.566667/0.23 = 6.81 s beats no SD's 2.1/0.23 = 9.13 s, so the advice is k = 1.
    assert out["optimal_draft_length"] == 1


def test_bad_params_file_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(PARAMS.replace("a_v: 0.02", "a_v: -1"))
    assert main(["predict", "--params", str(bad), "--arrival-rate", "1", "--draft-length", "3",
                 "--alpha", "0.5", *LENGTHS]) == 2
    assert "coefficients.a_v" in capsys.readouterr().err


def test_sweep_json_csv_and_plot(params, tmp_path, capsys):
    csv_path, png_path = tmp_path / "sweep.csv", tmp_path / "sweep.png"
    rc, out, _ = run_json(capsys, [
        "sweep", "--params", params, "--alpha", "0.5", *LENGTHS, "--draft-lengths", "1-4",
        "--arrival-rates", "0:8:5", "--csv", str(csv_path), "--plot", str(png_path), "--json",
    ])
    assert rc == 0
    assert out["arrival_rates"] == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert [c["draft_length"] for c in out["curves"]] == [1, 2, 3, 4]
    # Hand-computed (tests/model/test_model.py): best k is 2 at λ = 0 and 1 at λ = 4.
    assert out["best_draft_length"][0] == 2 and out["best_draft_length"][2] == 1
    k3 = out["curves"][2]
    assert k3["speedup"][1] == pytest.approx(4.494 / 3.4788, rel=1e-9)
    assert k3["breakeven_arrival_rate"] == pytest.approx(1.84 / 0.4124, rel=1e-9)
    with csv_path.open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 5 * 4
    assert {"arrival_rate", "draft_length", "speedup", "valid", "best_draft_length"} <= set(rows[0])
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png_path.stat().st_size > 20_000


def test_sweep_table_lists_breakevens(params, capsys):
    assert main(["sweep", "--params", params, "--alpha", "0.5", *LENGTHS,
                 "--draft-lengths", "3", "--arrival-rates", "0:4:3"]) == 0
    text = capsys.readouterr().out
    assert "break-even 4.46 req/s (SD pays below it)" in text


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--draft-lengths", "0-3", "--arrival-rates", "0:4:3"], "--draft-lengths"),
        (["--draft-lengths", "4-1", "--arrival-rates", "0:4:3"], "--draft-lengths"),
        (["--draft-lengths", "x", "--arrival-rates", "0:4:3"], "--draft-lengths"),
        (["--draft-lengths", "1-3", "--arrival-rates", "4:0:3"], "--arrival-rates"),
        (["--draft-lengths", "1-3", "--arrival-rates", "0:4"], "--arrival-rates"),
        (["--draft-lengths", "1-3", "--arrival-rates", "0:4:1"], "--arrival-rates"),
        (["--draft-lengths", "1-3", "--arrival-rates=-1:4:3"], "--arrival-rates"),
    ],
)
def test_sweep_bad_input_exits_2(params, capsys, args, option):
    assert main(["sweep", "--params", params, "--alpha", "0.5", *LENGTHS, *args]) == 2
    assert option in capsys.readouterr().err


def test_advise_recommends_k_gain_and_schedule(params, capsys):
    rc, out, _ = run_json(capsys, [
        "advise", "--params", params, "--arrival-rate-p50", "1", "--arrival-rate-p95", "2",
        "--arrival-rate-p99", "3", "--alpha", "0.5", *LENGTHS, "--max-num-seqs", "64", "--json",
    ])
    assert rc == 0
    assert out["enable"] is True and out["draft_length"] >= 1
    for q in ("p50", "p95", "p99"):
        assert out["percentiles"][q]["speedup"] > 1
    # With k = 3 the gain at p95 (λ = 2) is the worked example's 1.291825.
    if out["draft_length"] == 3:
        assert out["percentiles"]["p95"]["speedup"] == pytest.approx(1.291825, rel=1e-6)
    sched = out["schedule"]
    assert sched[0][0] == 1 and sched[-1][1] == 64
    for (a0, b0, k0), (a1, _, k1) in itertools.pairwise(sched):
        assert a1 == b0 + 1 and a0 <= b0 and k1 < k0  # contiguous, K shrinks with batch
    assert sched[0][2] == 2  # best k at an empty system (hand-computed: 2 at λ = 0)
    assert out["num_speculative_tokens"] == max(r[2] for r in sched)
    assert any("Enable speculative decoding" in line for line in out["advice"])


def test_advise_keeps_sd_off_when_it_does_not_pay(params, capsys):
    """α = 0 (E = 1): drafts are pure overhead at every load."""
    rc, out, _ = run_json(capsys, [
        "advise", "--params", params, "--arrival-rate-p50", "1", "--arrival-rate-p95", "2",
        "--arrival-rate-p99", "3", "--alpha", "0", *LENGTHS, "--json",
    ])
    assert rc == 0
    assert out["enable"] is False and out["draft_length"] == 0
    assert out["advice"][0].startswith("Keep speculative decoding off")


def test_advise_text_names_the_off_threshold(params, capsys):
    assert main(["advise", "--params", params, "--arrival-rate-p50", "1",
                 "--arrival-rate-p95", "2", "--arrival-rate-p99", "3", "--alpha", "0.5",
                 *LENGTHS]) == 0
    text = capsys.readouterr().out
    assert "the predicted speedup falls to 1 at " in text and "(break-even" in text
    assert "num_speculative_tokens_per_batch_size" in text


@pytest.mark.parametrize(
    ("rates", "option"),
    [
        (["3", "2", "4"], "--arrival-rate-p95"),  # decreasing percentiles
        (["-1", "2", "4"], "--arrival-rate-p50"),
        (["1", "2", "20"], "--arrival-rate-p99"),  # ρ_D = 20·0.11 = 2.2: no valid system
    ],
)
def test_advise_bad_input_exits_2(params, capsys, rates, option):
    argv = ["advise", "--params", params, "--arrival-rate-p50", rates[0],
            "--arrival-rate-p95", rates[1], "--arrival-rate-p99", rates[2], "--alpha", "0.5",
            *LENGTHS]
    assert main(argv) == 2
    assert option in capsys.readouterr().err
    rc, out, _ = run_json(capsys, [*argv, "--json"])
    assert rc == 2 and out["valid"] is False and option in out["reason"]
