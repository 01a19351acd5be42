"""Calibration of the KV-cache capacity (model.md, "Fitted capacity").

Protects: a capacity planted in model-made closed-loop data is recovered and reported as
identifiable; data without one get none (the fit stays the roofline form, no coefficient
invented); a capacity that only one load level lies past is not identifiable (one level
cannot show latency linear in B at constant throughput); the TTFT floor λ·(L − TTFT) keeps the
capacity at or above the requests the runs show running. A capacity the servers stated
(KV cache, max_num_seqs) is taken as a fact, not fitted; runs stating different values
state none; runs stating nothing fit as before.
"""

import dataclasses
import math

import numpy as np
import pytest

from specwatch import model
from specwatch.calibrate.inputs import Point
from specwatch.calibrate.saturation import fit_saturation, predicted_latency, stated_capacity
from specwatch.model.observed import ServerCapacity

#: The planted model: a 4B-drafter-like system (seconds; knees in tokens per step).
TRUE = dict(a_p=0.2, b_p=0.02, a_v=0.033, b_v=2e-5, a_d=0.006, b_d=3e-5,
            c_v=5e-5, knee_v=128.0, c_d=2e-4, knee_d=64.0)
WORKLOADS = (("InstructCoder", 144.5, 200.0), ("mt-bench", 76.0, 256.0))
LEVELS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
E = {0: 1.0, 1: 1.8, 2: 2.4, 3: 2.9, 4: 3.3}
SERVICE_TTFT = 0.1  # s: first-token time of a request that does not wait


def _points(coef: model.Coefficients, levels=LEVELS, ttft=True) -> list[Point]:
    """Closed-loop runs priced by the model: B requests in the system, L from the model's
    closed-loop latency, λ = B/L; TTFT = the wait past the capacity plus a service time."""
    out = []
    for dataset, p, g in WORKLOADS:
        for k, e in E.items():
            for c in levels:
                b = c * 0.97
                lat = float(model.batch_latency(coef, b, k, e, p, g))
                cap = float(coef.capacity(p, g, k))
                running = min(b, cap)
                wait = lat - float(model.batch_latency(coef, running, k, e, p, g))
                out.append(Point(
                    source=f"{dataset}-k{k}-c{c}", system="synthetic", arrival_rate=b / lat,
                    latency_s=lat, draft_length=float(k), acceptance_length=e,
                    prompt_tokens=p, generation_tokens=g, concurrency=float(c),
                    dataset=dataset, ttft_s=wait + SERVICE_TTFT if ttft else None))
    return out


def test_planted_sd_capacity_is_recovered_and_identifiable():
    planted = model.Coefficients(**TRUE, kv_cache_tokens_sd=30000.0)
    pts = _points(planted)
    fit = fit_saturation(pts)
    got = fit.coefficients
    cap = fit.capacity_sd
    assert cap is not None and cap.identifiable and cap.tokens is not None
    assert got.kv_cache_tokens_sd == pytest.approx(30000.0, rel=0.05)
    assert got.kv_cache_tokens == 0.0  # no-SD runs never wait in these data
    assert not fit.capacity_nosd.identifiable
    # The runs past the capacity (c = 128, 256: latency linear in B at constant λ) are
    # priced by the fitted model as the planted one prices them.
    measured = np.array([p.latency_s for p in pts])
    assert np.max(np.abs(predicted_latency(got, pts) / measured - 1)) < 0.03
    # The report states the evidence: runs past it, and the fit without it.
    assert cap.runs_past >= 3 and cap.rms_without > cap.rms_with * 1.10
    report = cap.to_report()
    assert report["identifiable"] and report["kv_cache_tokens"] == got.kv_cache_tokens_sd


def test_no_capacity_in_the_data_sets_none():
    """The model without a capacity fits these data; no capacity is invented."""
    pts = _points(model.Coefficients(**TRUE))
    fit = fit_saturation(pts)
    assert fit.coefficients.kv_cache_tokens_sd == 0.0
    assert fit.coefficients.kv_cache_tokens == 0.0
    assert not fit.capacity_sd.identifiable and "not identifiable" in fit.capacity_sd.reason


def test_one_load_level_past_the_capacity_is_not_identifiable():
    """Only c = 256 lies past the planted capacity: one level cannot tell a capacity from
    compute-bound slopes, so the fit says so instead of guessing N."""
    planted = model.Coefficients(**TRUE, kv_cache_tokens_sd=60000.0)
    pts = _points(planted, levels=(1, 2, 4, 8, 16, 32, 64, 128, 256))
    assert all(p.in_flight <= 60000.0 / (p.prompt_tokens + p.generation_tokens)
               for p in pts if p.concurrency <= 128)
    fit = fit_saturation(pts)
    assert fit.coefficients.kv_cache_tokens_sd == 0.0
    assert "2 load levels" in fit.capacity_sd.reason


def test_ttft_floor_bounds_the_capacity_from_below():
    """Requests the runs show running, λ·(L − TTFT), bound the capacity: the fitted value is
    never below the floor the report gives, and the floor lies below the planted value."""
    planted = model.Coefficients(**TRUE, kv_cache_tokens_sd=30000.0)
    fit = fit_saturation(_points(planted))
    floor = fit.capacity_sd.floor_tokens
    assert 0 < floor < 30000.0
    assert fit.coefficients.kv_cache_tokens_sd >= floor


def test_without_ttft_the_capacity_comes_from_latencies_alone():
    planted = model.Coefficients(**TRUE, kv_cache_tokens_sd=30000.0)
    fit = fit_saturation(_points(planted, ttft=False))
    assert fit.capacity_sd.floor_tokens == 0.0
    assert fit.capacity_sd.identifiable
    assert fit.coefficients.kv_cache_tokens_sd == pytest.approx(30000.0, rel=0.05)
    assert math.isfinite(fit.rms)


# -- capacity the servers stated (model.md, "Server capacity") --------------------------------


def _stating(pts: list[Point], sd: float | None = None, nosd: float | None = None,
             seqs: float | None = None) -> list[Point]:
    """The runs with the capacity their servers stated (cache_config_info, --max-num-seqs)."""
    return [dataclasses.replace(p, kv_cache_tokens=sd if p.sd else nosd, max_num_seqs=seqs)
            for p in pts]


def test_a_stated_sd_capacity_is_taken_as_a_fact():
    """The SD servers stated their KV cache: the fit takes that value exactly (no grid, no
    identifiability test) and prices the runs past it as the planted model does."""
    planted = model.Coefficients(**TRUE, kv_cache_tokens_sd=30000.0)
    pts = _stating(_points(planted), sd=30000.0)
    fit = fit_saturation(pts)
    assert fit.coefficients.kv_cache_tokens_sd == 30000.0
    assert fit.capacity_sd.reason.startswith("stated by the server")
    assert fit.capacity_sd.identifiable and fit.capacity_sd.runs_past >= 3
    measured = np.array([p.latency_s for p in pts])
    assert np.max(np.abs(predicted_latency(fit.coefficients, pts) / measured - 1)) < 0.03


def test_a_stated_capacity_wins_over_what_the_latencies_suggest():
    """Facts, not fits: one level past the capacity cannot show it (the fit alone sets
    none, test above), but a server that states it gets it; and a stated value is used as
    stated, not moved to the grid."""
    planted = model.Coefficients(**TRUE, kv_cache_tokens_sd=60000.0)
    pts = _stating(_points(planted), sd=60000.0, nosd=250000.0)
    fit = fit_saturation(pts)
    assert fit.coefficients.kv_cache_tokens_sd == 60000.0
    assert fit.coefficients.kv_cache_tokens == 250000.0
    assert fit.capacity_nosd.reason.startswith("stated by the server")
    measured = np.array([p.latency_s for p in pts])
    assert np.max(np.abs(predicted_latency(fit.coefficients, pts) / measured - 1)) < 0.03


def test_a_stated_max_num_seqs_caps_every_run():
    """--max-num-seqs 48 planted (no KV limit) and stated: the fit keeps it as the capacity
    of both systems and prices the waiting runs past it."""
    planted = model.Coefficients(**TRUE, max_num_seqs=48.0)
    pts = _stating(_points(planted), seqs=48.0)
    fit = fit_saturation(pts)
    assert fit.coefficients.max_num_seqs == 48.0
    measured = np.array([p.latency_s for p in pts])
    assert np.max(np.abs(predicted_latency(fit.coefficients, pts) / measured - 1)) < 0.03


def test_runs_stating_different_capacities_state_none():
    """Two SD capacities among the runs: not one server configuration, so nothing is taken
    as stated (the fit searches as before); runs stating nothing contradict nobody."""
    pts = _points(model.Coefficients(**TRUE))
    mixed = [dataclasses.replace(p, kv_cache_tokens=30000.0 if p.concurrency < 64 else 40000.0)
             if p.sd else p for p in pts]
    assert stated_capacity(mixed) is None
    some = [dataclasses.replace(p, kv_cache_tokens=30000.0) if p.sd and p.concurrency < 8
            else p for p in pts]
    assert stated_capacity(some) == ServerCapacity(kv_cache_tokens_sd=30000.0)
    assert stated_capacity(pts) is None

