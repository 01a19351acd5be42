"""The model judged on the user's path: every run of the public Qwen3-32B / H100
sweep predicted by `specwatch predict --json` from its measured arrival rate (req_tp), k,
acceptance length and mean prompt/output tokens, with the parameters `make calibrate-examples`
writes, against its measured mean latency (e2e_latency_s_est).

The figures are computed here, never written in: each acceptance target is one assertion on
them. A target the model does not reach is an xfail(strict=True) whose reason states the
figure reached and why, so it fails loudly the day it starts passing; docs/model.md quotes
these numbers ("On the user's path").
"""

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from specwatch import model
from specwatch.calibrate import evidence
from specwatch.calibrate.fit import FitOptions, fit_system
from specwatch.calibrate.inputs import read_inputs
from specwatch.calibrate.load_range import fit_system_saturation
from specwatch.calibrate.report import build_params
from specwatch.cli import main
from specwatch.model.params import load_params

ROOT = Path(__file__).parent.parent
SWEEP = ROOT / "tests" / "fixtures" / "sd-validation" / "tomasruizt_qwen3-32b_1xH100_vllm-bench.csv"
DRAFTERS = {
    "eagle3": ("Qwen3-32B-speculator.eagle3", "Qwen3-32B+Qwen3-32B-speculator.eagle3"),
    "qwen3-1.7b": ("Qwen3-1.7B", "Qwen3-32B+Qwen3-1.7B"),
    "qwen3-4b": ("Qwen3-4B", "Qwen3-32B+Qwen3-4B"),
}


def _params(name: str) -> Path:
    return ROOT / "examples" / "params" / f"qwen3-32b-h100-{name}.yaml"


def _rows(draft: str) -> list[dict[str, str]]:
    """The drafter's SD runs and the no-SD runs (they belong to every drafter's system)."""
    with SWEEP.open(encoding="utf-8") as fh:
        return [r for r in csv.DictReader(fh)
                if r["draft"].strip() == draft or float(r["k"]) == 0]


def _predict(capsys, params: Path, row: dict[str, str]) -> dict:
    k = float(row["k"])
    argv = ["predict", "--params", str(params), "--arrival-rate", row["req_tp"],
            "--draft-length", row["k"], "--prompt-tokens", row["mean_prompt_tok"],
            "--generation-tokens", row["mean_out_tok"], "--json"]
    if k > 0:
        argv += ["--acceptance-length", row["acc_len"]]
    rc = main(argv)
    out = json.loads(capsys.readouterr().out)
    assert rc == (0 if out["valid"] else 2)
    return out


def _judge(capsys, name: str) -> dict:
    draft, _ = DRAFTERS[name]
    runs = []
    for row in _rows(draft):
        out = _predict(capsys, _params(name), row)
        measured = float(row["e2e_latency_s_est"])
        lat = out["latency_sd_s"]
        iv = out["latency_interval"]
        runs.append({
            "source": f"row {row['dataset']} c={row['conc']} k={row['k']}",
            "concurrency": float(row["conc"]), "k": float(row["k"]),
            "measured_s": measured,
            "error": lat / measured - 1.0 if lat is not None else None,
            "batch_path_error": None, "valid": out["valid"],
            "reasons": out["validity_reasons"],
            "interval": iv, "interval_halfwidth": out["interval_halfwidth"],
        })
    return evidence.summarise(runs)


#: name -> summary: 119 `predict` calls per drafter, made once for every test of this module.
_CACHE: dict[str, dict] = {}


def _summary(capsys, name: str) -> dict:
    if name not in _CACHE:
        _CACHE[name] = _judge(capsys, name)
    return _CACHE[name]


def _miss(reason: str):
    return pytest.mark.xfail(strict=True, reason=reason)


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_no_valid_prediction_is_off_by_more_than_15_percent(capsys, name):
    sm = _summary(capsys, name)
    assert sm["runs"] == 119
    assert sm["valid_off_by_more_than_15pct"] == []


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_mape_over_the_valid_predictions_at_most_4_percent(capsys, name):
    assert _summary(capsys, name)["mape_valid"] <= 0.04


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_every_run_at_concurrency_32_or_less_is_valid(capsys, name):
    sm = _summary(capsys, name)
    assert sm["runs_at_concurrency_le_32"] == 84
    assert sm["valid_at_concurrency_le_32"] == sm["runs_at_concurrency_le_32"]


_SHARE = ("the runs left are at concurrency 64-256, where the fitted L(B) is off by 3-12%"
          " (batch-path residual RMS 4-8% at utilisation above 0.7) and the fixed point"
          " amplifies that 5-30 times: their 90% interval is wider than ±15% (sensitive) or"
          " the model's own utilisation is above the 0.9 ceiling; reaching 85% needs a form"
          " whose L(B) is within ~1.5% near the ceiling")


@pytest.mark.parametrize("name", [
    pytest.param("eagle3", marks=_miss("EAGLE-3: 81% of the runs valid; " + _SHARE)),
    pytest.param("qwen3-1.7b", marks=_miss("Qwen3-1.7B: 81% valid; " + _SHARE)),
    pytest.param("qwen3-4b", marks=_miss("Qwen3-4B: 75% valid; " + _SHARE)),
])
def test_at_least_85_percent_of_the_runs_are_valid(capsys, name):
    assert _summary(capsys, name)["valid_share"] >= 0.85


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_the_90_percent_interval_holds_the_measured_latency(capsys, name):
    """For >= 85% of the valid runs, and narrower than ±10% for the median one."""
    sm = _summary(capsys, name)
    assert sm["interval_coverage"] >= 0.85
    assert sm["median_interval_halfwidth"] < 0.10


def test_declined_runs_are_counted_by_reason_not_as_errors(capsys):
    sm = _summary(capsys, "qwen3-4b")
    assert sum(sm["declined"].values()) == sm["runs"] - sm["valid"] > 0
    assert set(sm["declined"]) <= {"saturated", "above_utilization_ceiling", "sensitive",
                                   "beyond_calibrated_load"}


# ------------------------------------------------------------- what calibrate writes and says


@pytest.fixture(scope="module")
def points():
    return read_inputs([SWEEP])


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_the_examples_are_what_calibrate_writes(points, name):
    """The shipped files are `make calibrate-examples`' output (same coefficients, range and
    spread), so the figures above are those of the parameters a user gets."""
    _, system = DRAFTERS[name]
    fit = fit_system_saturation(system, [p for p in points if p.system == system])
    fresh = build_params(fit, system_name=system, data=[], options={"max_utilization": 0.9})
    shipped = load_params(_params(name))
    assert shipped.coefficients == fresh.coefficients
    assert shipped.calibrated_range == fresh.calibrated_range
    assert shipped.uncertainty == fresh.uncertainty


def test_calibrate_reports_the_user_path_per_run(capsys):
    """`specwatch calibrate --json` carries the same judgement per run (error, valid,
    reasons, interval, beside the batch-path error) and per drafter."""
    rc = main(["calibrate", str(SWEEP), "--system", "Qwen3-1.7B", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    up = next(iter(doc["systems"].values()))["user_path"]
    sm = up["summary"]
    assert sm["runs"] == len(up["runs"]) == 119
    assert sm["valid"] == sum(r["valid"] for r in up["runs"])
    for r in up["runs"]:
        assert r["batch_path_error"] is not None
        assert r["valid"] == (r["reasons"] == [])
        if r["valid"]:
            assert abs(r["error"]) <= 0.15 and r["interval"][0] <= r["interval"][1]


# ------------------------------------------------------------- fits on a part of the load range


def _far_path(system: str, pts: list, cap: float, fitter) -> dict:
    fit = fitter(system, pts, FitOptions(max_concurrency=cap))
    assert fit.coefficients is not None and fit.calibrated_range is not None
    assert fit.uncertainty is not None
    far = [p for p in pts if p.concurrency > cap]
    batch = np.array([float(model.batch_latency(fit.coefficients, p.in_flight, p.draft_length,
                                                p.acceptance_length, p.prompt_tokens,
                                                p.generation_tokens)) for p in far])
    return evidence.user_path(evidence.params_of(fit, 0.9), far, batch)["summary"]


@pytest.mark.parametrize("fitter", [fit_system_saturation, fit_system],
                         ids=["saturation", "linear"])
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_fit_on_concurrency_32_never_vouches_for_a_bad_higher_prediction(points, name,
                                                                          fitter):
    """Either mode writes a calibrated range, so the runs past it are declined
    (beyond_calibrated_load) instead of confidently wrong."""
    _, system = DRAFTERS[name]
    sm = _far_path(system, [p for p in points if p.system == system], 32, fitter)
    assert sm["runs"] == 35
    assert sm["valid_off_by_more_than_15pct"] == []


_PAST_PEAK = ("runs at concurrency 128 and 256 are closed-loop queues past the throughput"
              " peak, at an arrival rate inside what the c <= 64 runs measured (e.g. 4B k=2:"
              " 9.45 req/s at c=128 against 9.50 at c=64): from λ alone they cannot be told"
              " from the rising-branch run the fit saw, and no c <= 64 run shows the KV-cache"
              " capacity that makes them queue")


@pytest.mark.parametrize("name", [
    pytest.param("eagle3", marks=_miss(
        "EAGLE-3 fit on c <= 64: mt-bench c=80 k=4 valid at -16%, the 80-prompt burst whose"
        " n/duration is set by its slowest request (not a steady state)")),
    "qwen3-1.7b",
    pytest.param("qwen3-4b", marks=_miss(
        "Qwen3-4B fit on c <= 64: 14 of 21 higher runs valid and off by > 15% (-50% at"
        " c=128, -74% at 256, mt-bench c=80 k=4/6 -18%/-24%); " + _PAST_PEAK)),
])
def test_fit_on_concurrency_64_never_vouches_for_a_bad_higher_prediction(points, name):
    _, system = DRAFTERS[name]
    sm = _far_path(system, [p for p in points if p.system == system], 64,
                   fit_system_saturation)
    assert sm["valid_off_by_more_than_15pct"] == []
