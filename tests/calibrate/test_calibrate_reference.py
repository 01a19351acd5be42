"""`specwatch calibrate DATA --reference PARAMS`: the reduced form the points identify, the
drift before fitting, the file's domain, and one line with exit 2 for every bad input.

Real data: runs of the public Qwen3-32B / H100 sweep (tests/fixtures/sd-validation) and the
shipped parameters files as references. The transfer figures themselves (predictions for
a drafter's other runs through `specwatch predict`) are tests/model/test_model_transfer.py.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from specwatch.cli import main
from specwatch.model.params import load_params

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "tests" / "fixtures" / "sd-validation" / "tomasruizt_qwen3-32b_1xH100_vllm-bench.csv"
EAGLE3 = ROOT / "examples" / "params" / "qwen3-32b-h100-eagle3.yaml"


def _points(tmp: Path, ks: tuple[str, ...] = ("0", "3"), conc: tuple[str, ...] = ("1", "8", "32"),
            edit: dict[str, str] | None = None) -> Path:
    """Runs of the 1.7B drafter (and no SD) on InstructCoder, as a CSV of the sweep's layout."""
    with SWEEP.open(encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["dataset"] == "InstructCoder"
                and r["conc"] in conc and r["k"] in ks
                and (r["k"] == "0" or r["draft"] == "Qwen3-1.7B")]
    for r in rows:
        r.update(edit or {})
    path = tmp / "points.csv"
    with path.open("w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def _run(capsys, *args: object) -> tuple[int, str, str]:
    code = main(["calibrate", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def _json(capsys, *args: object) -> dict:
    code, out, err = _run(capsys, *args, "--json")
    assert code == 0, err
    (system,) = json.loads(out)["systems"].values()
    return system


def test_six_points_split_the_drafter_and_keep_one_verifier_factor(tmp_path, capsys):
    """No SD at three loads fits the reference's verifier to 0.8%: one factor. The 1.7B
    drafter's cost grows less with load than the EAGLE-3 head's: its fixed and per-request
    parts get a factor each (the F-test of the split), each with its standard error."""
    doc = _json(capsys, _points(tmp_path), "--reference", EAGLE3)
    assert doc["form"] == "scaled_reference(verifier, drafter_fixed, drafter_load)"
    f = doc["factors"]
    assert f["verifier"]["value"] == pytest.approx(1.0, abs=0.03)
    assert f["drafter_fixed"]["value"] > 1.3 * f["drafter_load"]["value"]
    for factor in f.values():
        assert 0 < factor["standard_error"] < 0.1 * factor["value"]
    assert doc["residual_rms"] < 0.01


def test_four_points_fit_one_factor_per_component(tmp_path, capsys):
    """Two loads each: too few points to spare for a split, so one factor for the verifier
    and one for the drafter."""
    doc = _json(capsys, _points(tmp_path, conc=("1", "32")), "--reference", EAGLE3)
    assert doc["form"] == "scaled_reference(verifier, drafter)"


def test_points_without_sd_fit_the_verifier_and_vouch_for_no_sd_only(tmp_path, capsys):
    out = tmp_path / "p.yaml"
    doc = _json(capsys, _points(tmp_path, ks=("0",), conc=("1", "4", "8", "32")),
                "--reference", EAGLE3, "--out", out)
    assert doc["form"] == "scaled_reference(verifier)"
    assert load_params(out).calibrated_range.draft_lengths == (0,)


def test_sd_points_alone_fit_one_common_factor(tmp_path, capsys):
    doc = _json(capsys, _points(tmp_path, ks=("3",), conc=("1", "4", "8", "32")),
                "--reference", EAGLE3)
    assert doc["form"] == "scaled_reference(common)"


def test_a_wrong_reference_shows_as_a_large_drift(tmp_path, capsys):
    """A reference whose every cost is doubled: before fitting it is about 100% off, the
    report says so plainly, and the fitted factors halve it back."""
    doc = yaml.safe_load(EAGLE3.read_text())
    for n in doc["coefficients"]:
        doc["coefficients"][n] *= 2
    ref = tmp_path / "double.yaml"
    ref.write_text(yaml.safe_dump(doc))
    points = _points(tmp_path)
    fit = _json(capsys, points, "--reference", ref)
    assert fit["drift"]["large"] is True
    assert fit["drift"]["median_abs_error_nosd"] > 0.9
    assert fit["factors"]["verifier"]["value"] == pytest.approx(0.5, rel=0.03)
    code, out, _ = _run(capsys, points, "--reference", ref)
    assert code == 0 and "LARGE DRIFT" in out and "same verifier" in out
    # The shipped file is the right verifier: no drift without SD.
    fit = _json(capsys, points, "--reference", EAGLE3)
    assert fit["drift"]["median_abs_error_nosd"] < 0.02


def test_the_file_is_valid_where_both_vouch(tmp_path, capsys):
    """The points' load (their top rate; a top that still rose vouches up to the requests it
    held) within the reference's in-flight range; the reference's draft lengths, its
    leave-one-k-out error in every interval."""
    out = tmp_path / "p.yaml"
    _json(capsys, _points(tmp_path), "--reference", EAGLE3, "--kv-cache-tokens", "69232",
          "--kv-cache-tokens-sd", "32528", "--out", out)
    p = load_params(out)
    ref = load_params(EAGLE3)
    cal = p.calibrated_range
    assert cal.max_arrival_rate < ref.calibrated_range.max_arrival_rate
    assert cal.max_in_flight <= ref.calibrated_range.max_in_flight
    assert cal.headroom_in_flight_sd <= ref.calibrated_range.headroom_in_flight_sd
    assert cal.draft_lengths == ref.calibrated_range.draft_lengths
    assert all(b.sigma > r.sigma for b, r in zip(p.uncertainty.bands, ref.uncertainty.bands,
                                                 strict=True))
    # The acceptance profile is the points' own (k = 3: three positions), and says so.
    assert p.acceptance_profile is not None and len(p.acceptance_profile) == p.k_max == 3
    # The capacity is what the user's servers stated, not the reference's.
    assert p.coefficients.kv_cache_tokens_sd == 32528
    assert p.provenance["reference"]["file"] == str(EAGLE3)


# ------------------------------------------------------------------ bad input: one line, exit 2


def _one_line_error(capsys, *args: object) -> str:
    code, out, err = _run(capsys, *args)
    assert code == 2, (out, err)
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_missing_reference_is_one_line(tmp_path, capsys):
    line = _one_line_error(capsys, _points(tmp_path), "--reference", tmp_path / "none.yaml")
    assert "none.yaml" in line


def test_a_reference_that_is_no_parameters_file_is_one_line(tmp_path, capsys):
    line = _one_line_error(capsys, _points(tmp_path), "--reference", SWEEP)
    assert SWEEP.name in line


def test_a_hand_written_reference_without_a_range_is_one_line(tmp_path, capsys):
    doc = yaml.safe_load(EAGLE3.read_text())
    del doc["calibrated_range"]
    ref = tmp_path / "hand.yaml"
    ref.write_text(yaml.safe_dump(doc))
    line = _one_line_error(capsys, _points(tmp_path), "--reference", ref)
    assert "calibrated_range" in line and "hand.yaml" in line


def test_too_few_points_is_one_line(tmp_path, capsys):
    line = _one_line_error(capsys, _points(tmp_path, conc=("1",), ks=("0", "3")),
                           "--reference", EAGLE3)
    assert "at least 4" in line


def test_a_k_the_reference_never_ran_is_one_line(tmp_path, capsys):
    points = _points(tmp_path, ks=("3",), edit={"k": "8", "acc_len": "2.6", "per_pos": ""})
    line = _one_line_error(capsys, points, "--reference", EAGLE3)
    assert "k=8" in line and "0, 1, 2, 3, 4, 5, 6" in line


def test_points_outside_the_reference_are_one_line(tmp_path, capsys):
    """A reference measured up to 5 requests in flight: the c = 8 and 32 runs lie beyond
    anything it covers, which leaves too few."""
    doc = yaml.safe_load(EAGLE3.read_text())
    doc["calibrated_range"]["max_in_flight"] = 5.0
    ref = tmp_path / "small.yaml"
    ref.write_text(yaml.safe_dump(doc))
    line = _one_line_error(capsys, _points(tmp_path), "--reference", ref)
    assert "outside the reference's load range" in line


def test_reference_with_compare_is_one_line(tmp_path, capsys):
    line = _one_line_error(capsys, _points(tmp_path), "--reference", EAGLE3,
                           "--compare", EAGLE3)
    assert "--reference" in line and "--compare" in line


def test_reference_with_a_report_directory_is_one_line(tmp_path, capsys):
    line = _one_line_error(capsys, _points(tmp_path), "--reference", EAGLE3,
                           "--report", tmp_path / "report")
    assert "--report" in line and "--json" in line


@pytest.mark.parametrize("option", [("--max-concurrency", "16"), ("--model", "linear"),
                                    ("--max-utilization", "0.8"), ("--vif-limit", "50"),
                                    ("--max-ttft-ratio", "3")])
def test_a_full_fit_filter_with_reference_is_one_line_not_ignored(tmp_path, capsys, option):
    """The reference fit keeps the reference's load range and form: a filter only the full
    fit reads is refused, never silently dropped."""
    line = _one_line_error(capsys, _points(tmp_path), "--reference", EAGLE3, *option)
    assert option[0] in line and "--reference" in line
