"""`specwatch calibrate` end to end: params file, JSON report, report directory, drift."""

import json
from pathlib import Path

import pytest
import yaml
from helpers.paths import FIXTURES

from specwatch.cli import main
from specwatch.model.params import load_params

FIX = FIXTURES
SWEEP = FIX / "sd-validation" / "tomasruizt_qwen3-32b_1xH100_vllm-bench.csv"
BENCH = FIX / "vllm-bench"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "params"
#: KV caches the sweep's servers stated in their logs (fixtures/sd-validation/README.md).
NOSD_KV_TOKENS = 69232.0
SD_KV_TOKENS = {"eagle3": 47264.0, "qwen3-1.7b": 32528.0, "qwen3-4b": 18560.0}


def _run(capsys, *argv):
    code = main(["calibrate", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_sweep_to_params_file_and_json_report(tmp_path, capsys):
    """The documented command writes a params file that load_params accepts, with provenance
    from the fit, and --json prints the per-system fields the issue lists."""
    out = tmp_path / "eagle.yaml"
    code, stdout, err = _run(
        capsys, SWEEP, "--system", "eagle3", "--max-concurrency", "64", "--out", out, "--json"
    )
    assert code == 0, err
    doc = json.loads(stdout)
    (name,) = doc["systems"]
    s = doc["systems"][name]
    for key in (
        "r2",
        "mape",
        "leave_one_k_out_mape",
        "n_points",
        "n_excluded",
        "coefficients",
        "breakeven_arrival_rate",
    ):
        assert key in s
    assert sorted(s["breakeven_arrival_rate"]) == ["1", "2", "3", "4", "5", "6"]
    assert s["r2"] >= 0.98 and s["leave_one_k_out_mape"] <= 0.05
    assert doc["written"] == {name: str(out)}
    params = load_params(out)
    assert params.system == name
    assert params.provenance["r2"] == pytest.approx(s["r2"], abs=1e-6)
    assert params.provenance["n_points"] == s["n_points"]
    assert params.coefficients.a_v == pytest.approx(s["coefficients"]["a_v"])
    assert len(params.acceptance_profile) == params.k_max == 6


def test_several_systems_need_system_or_placeholder(tmp_path, capsys):
    """Three drafters in one file and one --out path: refuse and say how to choose; with
    '{system}' in --out one file per drafter is written."""
    code, _, err = _run(capsys, SWEEP, "--max-concurrency", "64", "--out", tmp_path / "p.yaml")
    assert code == 2 and "hold 3 systems" in err and "{system}" in err
    code, _, err = _run(
        capsys, SWEEP, "--max-concurrency", "64", "--out", tmp_path / "p-{system}.yaml", "--json"
    )
    assert code == 0, err
    assert len(list(tmp_path.glob("p-*.yaml"))) == 3


def test_report_directory_has_plots_and_summary(tmp_path, capsys):
    """--report writes a fit plot and a residual plot per system (real PNGs), summary.md with
    the figures, and report.json."""
    rep = tmp_path / "rep"
    code, _, err = _run(
        capsys, SWEEP, "--system", "eagle3", "--max-concurrency", "64", "--report", rep
    )
    assert code == 0, err
    pngs = sorted(p.name for p in rep.glob("*.png"))
    assert len(pngs) == 3 and any("residuals" in p for p in pngs)
    assert any("load-range" in p for p in pngs)  # measured vs predicted, whole range
    for p in rep.glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
    md = (rep / "summary.md").read_text()
    assert "leave-one-k-out MAPE" in md and "![fit]" in md and "| 3 |" in md
    assert "verifier knee:" in md and "tokens per verify step" in md
    assert "leave-this-concurrency-out MAPE" in md and "measured λ*" in md
    assert json.loads((rep / "report.json").read_text())["systems"]


def test_bench_json_inputs_fit_with_per_file_options(tmp_path, capsys):
    """A sweep saved by `vllm bench serve --save-result --append-result` (one workload, no SD
    and EAGLE-3 k = 1..6) fits the six coefficients with --model linear; --no-sd marks the
    baseline file."""
    files = sorted(BENCH.glob("*.jsonl"))
    nosd = BENCH / "qwen3-32b-nosd.jsonl"
    code, stdout, err = _run(
        capsys,
        *[f for f in files if f != nosd],
        "--no-sd",
        nosd,
        "--system",
        "h100-eagle3",
        "--model",
        "linear",
        "--json",
        "--out",
        tmp_path / "b.yaml",
    )
    assert code == 0, err
    s = json.loads(stdout)["systems"]["h100-eagle3"]
    assert s["mode"] == "six-coefficient" and s["n_points"] + s["n_excluded"] == 49
    assert s["r2"] >= 0.98
    assert "treated as a run without SD" not in err
    assert load_params(tmp_path / "b.yaml").system == "h100-eagle3"


def test_bench_json_system_is_named_from_model_id_unless_system_is_given(tmp_path, capsys):
    """vllm bench serve records the served model (`model_id`): without --system the fitted
    system is named after it, not "default"; --system still names it."""
    files = sorted(BENCH.glob("*.jsonl"))
    nosd = BENCH / "qwen3-32b-nosd.jsonl"
    args = [*[f for f in files if f != nosd], "--no-sd", nosd, "--model", "linear", "--json"]
    code, stdout, err = _run(capsys, *args, "--out", tmp_path / "a.yaml")
    assert code == 0, err
    assert list(json.loads(stdout)["systems"]) == ["Qwen/Qwen3-32B"]
    assert load_params(tmp_path / "a.yaml").system == "Qwen/Qwen3-32B"
    code, stdout, err = _run(capsys, *args, "--system", "mine", "--out", tmp_path / "b.yaml")
    assert code == 0, err
    assert list(json.loads(stdout)["systems"]) == ["mine"]


def test_compare_verdicts_and_exit_status(tmp_path, capsys):
    """--compare: a re-fit on the same data is within tolerance (exit 0); a file whose verify
    cost is 30% higher has drifted (exit 1) and the report names the change."""
    old = tmp_path / "old.yaml"
    assert (
        _run(capsys, SWEEP, "--system", "eagle3", "--max-concurrency", "64", "--out", old)[0] == 0
    )
    code, stdout, _ = _run(
        capsys, SWEEP, "--system", "eagle3", "--max-concurrency", "64", "--compare", old, "--json"
    )
    assert code == 0 and json.loads(stdout)["compare"]["verdict"] == "within_tolerance"
    doc = yaml.safe_load(old.read_text())
    doc["coefficients"]["a_v"] *= 1.3
    slower = tmp_path / "slower.yaml"
    slower.write_text(yaml.safe_dump(doc))
    code, stdout, _ = _run(capsys, "--compare", old, slower, "--json")
    drift = json.loads(stdout)["compare"]
    assert code == 1 and drift["verdict"] == "drifted"
    assert drift["coefficients"]["a_v"]["relative_change"] == pytest.approx(0.3)
    assert drift["latency_drift"] > 0.1
    code, stdout, _ = _run(capsys, "--compare", old, slower)
    assert code == 1 and "DRIFTED" in stdout


def test_compare_with_missing_old_file_exits_2(tmp_path, capsys):
    code, _, err = _run(capsys, SWEEP, "--compare", tmp_path / "none.yaml")
    assert code == 2 and "not found" in err


def test_not_identifiable_data_reports_but_does_not_write(tmp_path, capsys):
    """One workload with no SD and a single k: the report shows the per-configuration
    speedup, and --out is refused with the reason (exit 2) instead of writing coefficients
    the data cannot support."""
    rows = ["arrival_rate,latency_s,draft_length,acceptance_length,generation_tokens"]
    for lam, l0, l3 in ((0.2, 6.8, 3.5), (1.0, 6.9, 3.55), (2.0, 7.0, 3.6), (4.0, 7.2, 3.8)):
        rows += [f"{lam},{l0},0,,200", f"{lam},{l3},3,2.2,200"]
    path = tmp_path / "one.csv"
    path.write_text("\n".join(rows) + "\n")
    out = tmp_path / "x.yaml"
    code, stdout, err = _run(capsys, path, "--out", out, "--json")
    assert code == 2 and not out.exists()
    assert "not writing" in err and "cannot separate" in err
    s = json.loads(stdout)["systems"]["default"]
    assert s["mode"] == "per-configuration" and s["coefficients"] is None
    assert s["zero_load_speedup"]["3"] > 1.5


@pytest.mark.parametrize("drafter", ["eagle3", "qwen3-1.7b", "qwen3-4b"])
def test_committed_example_params_are_real_fits_of_the_public_sweep(drafter, tmp_path, capsys):
    """examples/params/qwen3-32b-h100-<drafter>.yaml is what the documented command
    (`make calibrate-examples`) produces: same coefficients, profile and figures."""
    committed = load_params(EXAMPLES / f"qwen3-32b-h100-{drafter}.yaml")
    fresh = tmp_path / "fresh.yaml"
    code, _, err = _run(capsys, SWEEP, "--system", committed.system, "--out", fresh,
                        "--kv-cache-tokens", NOSD_KV_TOKENS,
                        "--kv-cache-tokens-sd", SD_KV_TOKENS[drafter])
    assert code == 0, err
    again = load_params(fresh)
    assert committed.coefficients.saturates and committed.calibrated_range is not None
    assert again.calibrated_range == committed.calibrated_range
    assert again.uncertainty == committed.uncertainty
    # The KV caches are the servers' own (stated in their logs), not fitted.
    assert committed.server_capacity.to_mapping() == {
        "kv_cache_tokens": NOSD_KV_TOKENS, "kv_cache_tokens_sd": SD_KV_TOKENS[drafter]}
    for name in ("a_p", "b_p", "a_v", "b_v", "a_d", "b_d", "c_v", "knee_v", "c_d", "knee_d",
                 "kv_cache_tokens", "kv_cache_tokens_sd"):
        assert getattr(again.coefficients, name) == pytest.approx(
            getattr(committed.coefficients, name), rel=1e-9, abs=1e-15
        )
    assert again.acceptance_profile == committed.acceptance_profile
    for key in ("r2", "mape", "leave_one_k_out_mape", "n_points", "n_excluded"):
        assert again.provenance[key] == pytest.approx(committed.provenance[key], rel=1e-6)


def test_terminal_report_groups_exclusions(capsys):
    """The human report shows the fit figures and one line per exclusion reason with its
    count, not one line per excluded run."""
    code, stdout, _ = _run(capsys, SWEEP, "--system", "eagle3", "--max-concurrency", "64")
    assert code == 0
    assert "leave-one-k-out MAPE" in stdout and "zero-load speedup" in stdout
    line = next(x for x in stdout.splitlines() if "concurrency > --max-concurrency 64" in x)
    assert "│ 21 │" in line


def test_capacity_flags_are_recorded_and_used(tmp_path, capsys):
    """The CSV path has no server pages: --kv-cache-tokens(-sd) and --max-num-seqs state the
    servers' capacity; the file records it (server_capacity) and its capacity terms are
    those values, not fitted ones (model.md, "Server capacity")."""
    out = tmp_path / "eagle.yaml"
    code, stdout, err = _run(capsys, SWEEP, "--system", "eagle3", "--kv-cache-tokens",
                             "120000", "--kv-cache-tokens-sd", "90000", "--max-num-seqs", "256",
                             "--out", out, "--json")
    assert code == 0, err
    (s,) = json.loads(stdout)["systems"].values()
    assert s["server_capacity"] == {"kv_cache_tokens": 120000.0,
                                    "kv_cache_tokens_sd": 90000.0, "max_num_seqs": 256.0}
    assert s["saturation"]["capacity_sd"]["reason"].startswith("stated by the server")
    doc = yaml.safe_load(out.read_text())
    assert doc["server_capacity"] == {"kv_cache_tokens": 120000.0,
                                      "kv_cache_tokens_sd": 90000.0, "max_num_seqs": 256.0}
    assert doc["capacity"] == doc["server_capacity"]
    assert "servers stated" in doc["provenance"]["method"]
    coef = load_params(out).coefficients
    assert (coef.kv_cache_tokens, coef.kv_cache_tokens_sd, coef.max_num_seqs) == (
        120000.0, 90000.0, 256.0)


def test_capacity_flag_must_be_positive(capsys):
    assert main(["calibrate", str(SWEEP), "--kv-cache-tokens", "-5"]) == 2
    assert "--kv-cache-tokens" in capsys.readouterr().err
