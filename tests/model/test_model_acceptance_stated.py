"""The public Qwen3-32B / H100 sweep with the KV caches its servers stated (model.md,
"Server capacity").

The sweep's servers logged their KV cache ("GPU KV cache size: N tokens",
fixtures/sd-validation/README.md): no SD 69232 tokens, Qwen3-1.7B 32528, Qwen3-4B 18560,
EAGLE-3 47264. `make calibrate-examples` passes them, so the shipped parameter files take
them as facts. Protects, on the user's path (every run predicted by `specwatch predict` from
its measured λ, E, k, p, g, as docs/model.md quotes):

- the shipped files carry the stated values as their capacity;
- with them the MAPE over the valid predictions meets the 4% target, the file vouches for
  at least as many runs as a fit of the same runs without them, and on the runs both vouch
  for its MAPE is lower and fewer of them miss by more than 15% (the same runs: each file
  declines different ones, so their MAPEs over their own valid runs are not comparable);
- the 4B leave-concurrency-128-out error (22.7% with the fitted capacity, which one load
  level cannot show) is within 10%: the capacity no longer depends on which runs lie past it.

A target still missed is an xfail(strict=True) whose reason gives the figure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

from specwatch.calibrate import saturation as sat
from specwatch.calibrate.inputs import read_inputs
from specwatch.calibrate.load_range import fit_system_saturation
from specwatch.cli import main
from specwatch.model.params import load_params

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "tests" / "fixtures" / "sd-validation" / "tomasruizt_qwen3-32b_1xH100_vllm-bench.csv"
EXAMPLES = ROOT / "examples" / "params"
NOSD_KV = 69232.0
#: file name part -> (system, the SD server's stated KV cache in tokens)
DRAFTERS = {
    "eagle3": ("Qwen3-32B+Qwen3-32B-speculator.eagle3", 47264.0),
    "qwen3-1.7b": ("Qwen3-32B+Qwen3-1.7B", 32528.0),
    "qwen3-4b": ("Qwen3-32B+Qwen3-4B", 18560.0),
}


def _miss(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, reason=reason)


@pytest.fixture(scope="module")
def points():
    return read_inputs([SWEEP])


def _predict_all(params: Path, runs) -> np.ndarray:
    """Per run, the relative error of the prediction `specwatch predict --json` gives, NaN
    where it declines the run."""
    errors = []
    for p in runs:
        argv = ["predict", "--params", str(params), "--arrival-rate", repr(p.arrival_rate),
                "--draft-length", str(int(p.draft_length)), "--prompt-tokens",
                repr(p.prompt_tokens), "--generation-tokens", repr(p.generation_tokens),
                "--json"]
        if p.sd:
            argv += ["--acceptance-length", repr(p.acceptance_length)]
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            main(argv)
        doc = json.loads(out.getvalue())
        lat = doc["latency_sd_s"] if p.sd else doc["latency_nosd_s"]
        ok = doc["valid"] and lat is not None
        errors.append(abs(lat / p.latency_s - 1.0) if ok else np.nan)
    return np.array(errors)


@pytest.fixture(scope="module")
def user_path(points, tmp_path_factory):
    """drafter -> {"stated": errors, "fitted": errors} through `specwatch predict`: the
    shipped file, and a file calibrated from the same runs without the stated caches."""
    out = {}
    work = tmp_path_factory.mktemp("fitted")
    for name, (system, _) in DRAFTERS.items():
        runs = [p for p in points if p.system == system]
        fitted = work / f"{name}.yaml"
        with contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            assert main(["calibrate", str(SWEEP), "--system", system, "--out",
                         str(fitted)]) == 0
        out[name] = {"stated": _predict_all(EXAMPLES / f"qwen3-32b-h100-{name}.yaml", runs),
                     "fitted": _predict_all(fitted, runs),
                     "steady": np.array([not p.transient for p in runs])}
    return out


@pytest.mark.parametrize("name", DRAFTERS)
def test_shipped_files_take_the_stated_caches(name):
    coef = load_params(EXAMPLES / f"qwen3-32b-h100-{name}.yaml").coefficients
    assert (coef.kv_cache_tokens, coef.kv_cache_tokens_sd) == (NOSD_KV, DRAFTERS[name][1])


@pytest.mark.slow
@pytest.mark.parametrize("name", DRAFTERS)
def test_stated_caches_predict_better_on_the_users_path(user_path, name):
    """EAGLE-3: over its own valid runs the stated file's MAPE is 1.48% (100 runs) against
    1.33% (95) fitted, but the 5 more it vouches for are the hard ones (c = 64 k = 2-4 and
    mt-bench c = 80 k = 3, 4, which the fitted file declines as sensitive); on the 95 both
    vouch for it is 1.24% against 1.33%."""
    stated, fitted = user_path[name]["stated"], user_path[name]["fitted"]
    assert np.nanmean(stated) <= 0.04
    assert np.sum(~np.isnan(stated)) >= np.sum(~np.isnan(fitted))
    both = ~np.isnan(stated) & ~np.isnan(fitted)
    assert stated[both].mean() < fitted[both].mean()
    steady = both & user_path[name]["steady"]
    assert np.sum(stated[steady] > 0.15) < max(np.sum(fitted[steady] > 0.15), 1)


@pytest.mark.slow
@pytest.mark.parametrize("name", DRAFTERS)
def test_no_steady_run_is_valid_and_off_by_more_than_15_percent(user_path, name):
    """Over the steady runs (prompts >= 2x concurrency). A valid prediction off by more than
    15% is a transient run's: an 80-prompt burst at c = 64 or 80, whose req_tp is set by its
    slowest request, not by an arrival rate (EAGLE-3 mt-bench c = 80 k = 4, -18.7%; 4B
    mt-bench c = 80 k = 6, -21.2%)."""
    stated, steady = user_path[name]["stated"], user_path[name]["steady"]
    assert np.nanmax(stated[steady]) <= 0.15


def _stated_fit(points, name):
    system, sd_kv = DRAFTERS[name]
    runs = [dataclasses.replace(p, kv_cache_tokens=sd_kv if p.sd else NOSD_KV)
            for p in points if p.system == system]
    return fit_system_saturation(system, runs)


def test_leave_concurrency_128_out_with_the_stated_cache(points):
    """4B: within 10% (22.7% when the capacity is fitted: without c=128 only one load level
    lies past it, so the fit cannot see it; stated, it does not need to)."""
    loco = {x["concurrency"]: x["mape"] for x in _stated_fit(points, "qwen3-4b").saturation[
        "leave_one_concurrency_out"]}
    assert loco[128.0] <= 0.10


@pytest.mark.parametrize("name", [
    "eagle3",
    "qwen3-1.7b",
    pytest.param("qwen3-4b", marks=_miss(
        "Qwen3-4B mt-bench k=6: +24.2% (+30.8% with the fitted capacity): an 80-prompt burst"
        " whose throughput is set by its slowest request; no mt-bench curve records a"
        " measured ceiling (each ends at that burst), so nothing bounds it")),
])
def test_breakeven_every_k_with_the_stated_cache(points, name):
    """The break-even the shipped file gives (`predict`, `calibrate`'s `predicted`): the
    fit's λ*, bounded by the SD ceilings the runs measured."""
    for b in _stated_fit(points, name).saturation["breakeven"]:
        if b["measured"] is not None:
            assert abs(b["relative_error"]) <= 0.15, b


def test_the_measured_ceiling_bounds_what_the_fit_alone_overstates(points):
    """EAGLE-3 k = 6 on InstructCoder: the fit alone puts λ* at 11.3 req/s (+18.8% against
    the measured crossing, 9.49), above the 9.80 req/s where its runs stopped rising; the
    file gives 9.80 (+3.3%). The report keeps both."""
    (b,) = [b for b in _stated_fit(points, "eagle3").saturation["breakeven"]
            if b["workload"] == "InstructCoder" and b["k"] == 6]
    assert b["relative_error_fit"] > 0.15
    assert b["predicted"] == pytest.approx(9.80, abs=0.01)
    assert b["predicted"] < b["predicted_fit"]
    assert abs(b["relative_error"]) <= 0.05


def _breakeven_cells(points, system):
    """(workload, k, mean E, p, g, measured λ*) for every curve with a measured break-even."""
    runs = [p for p in points if p.system == system]
    cells = []
    for workload in sorted({p.dataset for p in runs}):
        nosd = [p for p in runs if p.dataset == workload and not p.sd]
        for k in sorted({p.draft_length for p in runs if p.sd}):
            sd = [p for p in runs if p.dataset == workload and p.draft_length == k]
            measured = sat.measured_breakeven(sd, nosd)
            if measured is not None:
                cells.append((workload, k, *(float(np.mean(x)) for x in zip(
                    *[(p.acceptance_length, p.prompt_tokens, p.generation_tokens)
                      for p in sd], strict=True)), measured[0]))
    return cells


@pytest.mark.parametrize("name", DRAFTERS)
def test_the_breakeven_interval_holds_the_measured_breakeven(points, name):
    """`specwatch predict --json` with the shipped file, at each curve's mean E, p, g: the
    90% interval of the rate where SD stops paying (the break-even, else SD's throughput
    ceiling) holds the measured one for >= 85% of the curves that have one
    (EAGLE-3 6 of 6, Qwen3-1.7B 6 of 6, Qwen3-4B 6 of 7: its mt-bench k = 6 burst, 5.83 req/s
    against [6.62, 7.98], is out). The fit's intervals alone held 4, 5 and 6: a measured
    ceiling is known to the spread of repeated runs, the fit near it is not."""
    system, _ = DRAFTERS[name]
    cells = _breakeven_cells(points, system)
    inside = []
    for _, k, e, p, g, measured in cells:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(["predict", "--params", str(EXAMPLES / f"qwen3-32b-h100-{name}.yaml"),
                  "--arrival-rate", "1", "--draft-length", str(int(k)), "--acceptance-length",
                  repr(e), "--prompt-tokens", repr(p), "--generation-tokens", repr(g), "--json"])
        doc = json.loads(out.getvalue())
        # Where SD stops paying: the break-even where the file has one below SD's ceiling,
        # else that ceiling (`calibrate`'s comparison, load_range._breakevens).
        iv = doc["breakeven_interval"] or doc["sd_ceiling_interval"]
        inside.append(iv is not None and iv[0] <= measured <= (iv[1] or math.inf))
    assert len(cells) >= 6
    assert sum(inside) / len(inside) >= 0.85, inside
