"""What a fit's own runs vouch for: the calibrated range and the residual spread (every mode).

Both are written into every parameters file calibration produces, whatever the model form,
because every prediction is judged by them (`model.validity.assess`):

- the calibrated range: the highest arrival rate per draft length (0 = no SD) and over all,
  requests in flight B = λ·L, tokens per verify step B·(k+1), and the highest utilisation
  λ/λ_max of a run under the fitted model. A prediction past them is
  `beyond_calibrated_load`: a fit that never saw its knee or its capacity cannot vouch for a
  load near them; the bound is every system's runs (another k, or no SD, at those tokens per
  step and in-flight counts is evidence for the same step cost), not the k's own alone;
- the measured ceilings: where a measured curve stopped rising (more requests in flight,
  no more throughput), the arrival rate from which λ no longer determines the latency;
- the headroom: the most requests in flight (and tokens per verify step) of a run that a
  run at higher load on its curve outserved by 10%; past it the runs cannot tell whether a
  knee or the capacity lies just beyond, so nothing there is vouched for (`headroom`);
- the residual spread: the relative RMS residual of L(B) at the runs, per band of
  utilisation (`model.uncertainty`), merged upward until a band has `MIN_BAND_RUNS` runs and
  made non-decreasing in the utilisation (a band above cannot claim a tighter fit than the
  ones below with fewer runs behind it).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from specwatch import model
from specwatch.calibrate.inputs import STEADY_REQUESTS_PER_SLOT, Point
from specwatch.calibrate.saturation import point_arrays
from specwatch.model import validity
from specwatch.model.ceilings import bracket, ceiling_rate
from specwatch.model.observed import CalibratedRange, CurveTop, MeasuredCeiling
from specwatch.model.params import Params
from specwatch.model.uncertainty import Band, Uncertainty

__all__ = ["BAND_EDGES", "MIN_BAND_RUNS", "WRONG", "calibrated_range", "curve_tops", "headroom",
           "residual_spread", "run_utilization", "summarise", "transient_note", "user_path"]

#: Upper edges of the utilisation bands of the residual spread; the last band is open.
#: The residuals grow towards the ceiling (0.9 and past it are the closed-loop queues).
BAND_EDGES = (0.5, 0.7, 0.8, 0.9)

#: A band needs this many runs for its own σ (fewer: merged with the band above it).
MIN_BAND_RUNS = 5


def run_utilization(coef: model.Coefficients, points: Sequence[Point]) -> np.ndarray:
    """λ/λ_max of each run under the fitted model (above 1 for a run past the model's
    ceiling: a closed-loop run measured past its throughput peak)."""
    lam, k, e, p, g = point_arrays(points, "arrival_rate")
    with np.errstate(divide="ignore", invalid="ignore"):
        return lam / model.throughput_ceiling(coef, k, e, p, g)


#: A curve is at its measured ceiling where the next load level holds this many times the
#: requests in flight ...
PLATEAU_IN_FLIGHT = 1.5
#: ... for less than this much more throughput (the calibrated range's margin).
PLATEAU_THROUGHPUT = 1.10
#: A curve's top run is on its rising branch where the step into it raised throughput by at
#: least this power of the rise in requests in flight (d ln λ / d ln B; 1 is a server far
#: below any knee, 0 one at its ceiling, where latency grows as fast as the requests held).
#: On the public Qwen3-32B sweep every step into c = 32 has 0.76-0.95, and every step into
#: a c = 64 run whose next load level gained less than 11% throughput has 0.44-0.64.
RISING_ELASTICITY = 0.70


def _curves(points: Sequence[Point]) -> dict[tuple[str, int], list[Point]]:
    """The measured curves: one k (0 = no SD) on one workload (the run's dataset, else its
    mean lengths to 10 tokens)."""
    curves: dict[tuple[str, int], list[Point]] = {}
    for q in points:
        w = q.dataset or f"{round(q.prompt_tokens or 0.0, -1)}:" \
            f"{round(q.generation_tokens or 0.0, -1)}"
        curves.setdefault((w, round(q.draft_length)), []).append(q)
    return curves


def measured_ceilings(points: Sequence[Point]) -> tuple[MeasuredCeiling, ...]:
    """Where each measured curve (one k on one workload, runs ordered by concurrency) stops
    rising: the first run whose next load level holds PLATEAU_IN_FLIGHT times the requests in
    flight for less than PLATEAU_THROUGHPUT times its throughput. Past that arrival rate the
    server is at its ceiling and latency is not a function of λ (a closed loop fills its
    queue), so a prediction there is `saturated`, whatever the fitted ceiling says. The rate
    is rounded down (4 decimals), so the run that measured it is at it."""
    out = []
    for (_, k), all_runs in sorted(_curves(points).items()):
        runs = sorted((q for q in all_runs if q.concurrency is not None),
                      key=lambda q: q.concurrency or 0.0)
        for a, b in itertools.pairwise(runs):
            if b.in_flight >= PLATEAU_IN_FLIGHT * a.in_flight \
                    and b.arrival_rate < PLATEAU_THROUGHPUT * a.arrival_rate:
                out.append(_on_curve(MeasuredCeiling, k, runs,
                                     min(a.arrival_rate, b.arrival_rate)))
                break
    return tuple(out)


def curve_tops(points: Sequence[Point]) -> tuple[CurveTop, ...]:
    """The highest arrival rate of each curve measured at two load levels or more, rounded
    down (4 decimals): a fixed point clearly below it lies between that curve's runs. The
    top is `rising` where it is a steady run holding the most requests in flight and the
    step into it from the run holding the next fewer had a throughput elasticity
    d ln λ / d ln B of at least RISING_ELASTICITY."""
    out = []
    for (_, k), runs in sorted(_curves(points).items()):
        if len(runs) < 2:
            continue
        top = max(runs, key=lambda q: q.arrival_rate)
        out.append(dataclasses.replace(
            _on_curve(CurveTop, k, runs, top.arrival_rate), rising=_rising(runs, top)))
    return tuple(out)


def _rising(runs: Sequence[Point], top: Point) -> bool:
    """Whether the top run of a curve was still on its rising branch (`curve_tops`)."""
    if top.transient or any(q.in_flight > top.in_flight for q in runs):
        return False
    below = [q for q in runs if q.in_flight < top.in_flight and q.arrival_rate > 0]
    if not below or not top.arrival_rate > 0:
        return False
    prev = max(below, key=lambda q: q.in_flight)
    elasticity = math.log(top.arrival_rate / prev.arrival_rate) \
        / math.log(top.in_flight / prev.in_flight)
    return elasticity >= RISING_ELASTICITY


def rising_top_runs(points: Sequence[Point]) -> list[Point]:
    """The top run of each curve that was still on its rising branch (`curve_tops`): the
    server was not at a ceiling up to the requests in flight it held."""
    out = []
    for runs in _curves(points).values():
        if len(runs) >= 2:
            top = max(runs, key=lambda q: q.arrival_rate)
            if _rising(runs, top):
                out.append(top)
    return out


_Rate = TypeVar("_Rate", MeasuredCeiling, CurveTop)


def _on_curve(cls: type[_Rate], k: int, runs: Sequence[Point], rate: float) -> _Rate:
    """A rate recorded for one curve: its k, the mean lengths of its runs (2 decimals) and
    the rate rounded down (4 decimals), so the run that measured it is at it."""
    return cls(k=k,
               prompt_tokens=round(float(np.mean([q.prompt_tokens or 0.0 for q in runs])), 2),
               generation_tokens=round(float(np.mean([q.generation_tokens or 0.0
                                                      for q in runs])), 2),
               arrival_rate=round(math.floor(rate * 1e4) / 1e4, 4))


def _with_headroom(runs: Sequence[Point]) -> np.ndarray:
    """Per run of one curve: does a run holding more requests in flight serve at least
    PLATEAU_THROUGHPUT times its throughput? (The best throughput among the runs holding
    more, from a running maximum in order of requests in flight: n log n, not n².)"""
    held = np.array([r.in_flight for r in runs], dtype=float)
    rate = np.array([r.arrival_rate for r in runs], dtype=float)
    order = np.argsort(-held, kind="stable")
    best = np.maximum.accumulate(rate[order])
    # the first position of each run's in-flight value: the runs before it hold more
    first = np.searchsorted(-held[order], -held[order], side="left")
    above = np.where(first > 0, best[np.maximum(first - 1, 0)], -np.inf)
    out = np.empty(len(runs), dtype=bool)
    out[order] = above >= PLATEAU_THROUGHPUT * rate[order]
    return out


def headroom(points: Sequence[Point]) -> dict[str, float | None]:
    """How far the runs show the server below any knee or capacity (the calibrated range's
    `headroom_*` fields).

    A run has headroom when a run of its curve holding more requests in flight served at
    least PLATEAU_THROUGHPUT times its throughput: the server was not at a ceiling there.
    The top run of a curve and the runs on its plateau have none: no run says whether a knee
    or the KV-cache capacity lies just past them, and a roofline's knee is sharp, so the
    runs below it cannot show where it is. Returns the most requests in flight of a run with
    headroom with SD (any k: the same drafter and memory) and without SD (its own memory),
    and the most tokens per verify step B·(k+1) of one (either system: the same verifier).
    A system none of whose curves was measured at two load levels gets None (nothing to
    judge: the highest measured load bounds it alone); one measured at several levels but
    with headroom nowhere gets 0 (every load is at or past a ceiling the data cannot
    place)."""
    held: dict[bool, float | None] = {True: None, False: None}
    tokens: float | None = None
    for (_, k), runs in _curves(points).items():
        sd = k > 0
        if len(runs) < 2:
            continue
        held[sd] = held[sd] or 0.0
        tokens = tokens or 0.0
        for a, has in zip(runs, _with_headroom(runs), strict=True):
            if has:
                held[sd] = max(held[sd] or 0.0, a.in_flight)
                tokens = max(tokens, a.in_flight * (a.draft_length + 1.0))
    return {
        "headroom_in_flight_sd": round(held[True], 3) if held[True] is not None else None,
        "headroom_in_flight_nosd": round(held[False], 3) if held[False] is not None else None,
        "headroom_tokens_per_step": round(tokens, 1) if tokens is not None else None,
    }


def calibrated_range(coef: model.Coefficients, points: Sequence[Point]) -> CalibratedRange:
    """The load the runs cover (module docstring)."""
    lam, k, _, _, _ = point_arrays(points, "arrival_rate")
    by_k: dict[int, float] = {}
    for rate, kk in zip(lam, k, strict=True):
        key = round(float(kk))
        by_k[key] = max(by_k.get(key, 0.0), round(float(rate), 4))
    util = run_utilization(coef, points)
    util = util[np.isfinite(util)]
    return CalibratedRange(
        max_arrival_rate=round(float(lam.max()), 4),
        max_in_flight=round(float(max(q.in_flight for q in points)), 3),
        draft_lengths=tuple(sorted(by_k)),
        max_tokens_per_step=round(float(max(q.in_flight * (q.draft_length + 1)
                                            for q in points)), 1),
        max_arrival_rate_by_k=by_k,
        max_utilization_seen=round(float(util.max()), 4) if util.size else None,
        measured_ceilings=measured_ceilings(points),
        curve_tops=curve_tops(points),
        **headroom(points),
    )


def residual_spread(coef: model.Coefficients, points: Sequence[Point],
                    batch_predicted: np.ndarray, calibrated: CalibratedRange) -> Uncertainty:
    """Relative RMS residual of L(B) per utilisation band (module docstring).

    `batch_predicted` is L(B) at each run's measured batch in flight (what the fit fits; a
    NaN there, a run the model cannot price, counts as a 100% residual). A run at or past
    its curve's measured ceiling (`calibrated`) is at utilisation 1 at least, whatever the
    fit's own ceiling says: the runs measured it there, and a fit that puts its ceiling too
    high would otherwise count that run's misfit among the runs far below any ceiling.
    Transient runs (`Point.transient`) are left out while any steady run remains."""
    measured = np.array([q.latency_s for q in points], dtype=float)
    rel = batch_predicted / measured - 1.0
    rel = np.where(np.isfinite(rel), rel, 1.0)
    util = run_utilization(coef, points)
    util = np.where(np.isfinite(util), util, math.inf)
    if points:
        lam, k, _, p, g = point_arrays(points, "arrival_rate")
        util = np.where(lam >= ceiling_rate(calibrated, k, p, g), np.maximum(util, 1.0), util)
        # A transient run (a burst: fewer prompts than STEADY_REQUESTS_PER_SLOT per slot)
        # has no steady state for the fixed point to describe; its misfit is not the fit's
        # spread at any utilisation, so it does not set the intervals' width.
        steady = np.array([not q.transient for q in points], dtype=bool)
        if steady.any():
            rel, util = rel[steady], util[steady]
    edges = (*BAND_EDGES, math.inf)
    bands: list[tuple[float, list[float]]] = []
    pending: list[float] = []
    lo = -math.inf
    for top in edges:
        pending.extend(rel[(util >= lo) & (util < top)].tolist())
        lo = top
        if len(pending) >= MIN_BAND_RUNS or (math.isinf(top) and pending):
            bands.append((top, pending))
            pending = []
    if len(bands) > 1 and len(bands[-1][1]) < MIN_BAND_RUNS:
        top, last = bands.pop()
        bands[-1] = (top, bands[-1][1] + last)
    if not bands:
        bands = [(math.inf, [0.0])]
    else:
        bands[-1] = (math.inf, bands[-1][1])
    out: list[Band] = []
    floor = 0.0
    for top, res in bands:
        sigma = max(floor, float(np.sqrt(np.mean(np.square(res)))))
        floor = sigma
        out.append(Band(utilization_below=top, sigma=round(sigma, 5), runs=len(res)))
    return Uncertainty(bands=tuple(out))


# --------------------------------------------------------------------------- the user's path

#: A valid prediction off by more than this is a confident wrong answer (the acceptance
#: targets' threshold); the summary lists every one.
WRONG = 0.15


def user_path(params: Params, points: Sequence[Point], batch_predicted: np.ndarray
              ) -> dict[str, Any]:
    """Every run predicted as `specwatch predict` predicts it, judged by the same rules.

    From the run's measured arrival rate, k, E, p and g through the fixed point B = λ·L(B)
    and `model.validity.assess` (the parameters `params` as calibration writes them), against
    the run's measured latency; beside it the batch-path error L(B)/L − 1 at the measured
    batch in flight (what the fit minimises). The number judged is the run's latency, so
    `valid` and `reasons` are that latency's own (`valid` of `predict --json`: SD at the
    run's k, no SD for a k = 0 run); `speedup_valid` and `speedup_reasons` are the speedup's
    (both systems at that rate, as `predict` judges it). A declined run counts as declined,
    never as an error. Returns {"summary": ..., "runs": [...]}."""
    lam, k, e, p, g = point_arrays(points, "arrival_rate")
    measured = np.array([q.latency_s for q in points], dtype=float)
    judged = validity.assess(params, lam, k, e, p, g)
    lat = judged.prediction.sd.latency
    with np.errstate(invalid="ignore", divide="ignore"):
        err = lat / measured - 1.0
        batch_err = batch_predicted / measured - 1.0
    iv = judged.intervals
    below = lam < bracket(params.calibrated_range, k, p, g).ceiling
    runs: list[dict[str, Any]] = []
    for i, q in enumerate(points):
        lo = hi = None
        if iv is not None and np.isfinite(lat[i]):
            lo = float(iv.latency_sd[0][i])
            hi = float(iv.latency_sd[1][i])
        runs.append({
            "source": q.source, "dataset": q.dataset, "concurrency": q.concurrency,
            "k": float(q.draft_length), "arrival_rate": float(lam[i]),
            "measured_s": float(measured[i]),
            "predicted_s": float(lat[i]) if np.isfinite(lat[i]) else None,
            "error": float(err[i]) if np.isfinite(err[i]) else None,
            "batch_path_error": float(batch_err[i]) if np.isfinite(batch_err[i]) else None,
            "valid": bool(judged.valid_sd.ravel()[i]),
            "reasons": judged.names_sd(i),
            "speedup_valid": bool(judged.valid.ravel()[i]),
            "speedup_reasons": judged.names(i),
            "interval": [lo, hi if hi is None or math.isfinite(hi) else None]
            if lo is not None else None,
            "interval_halfwidth": (float(iv.halfwidth[i]) if iv is not None
                                   and np.isfinite(iv.halfwidth[i]) else None),
            "transient": q.transient,
            "below_measured_ceiling": bool(below[i]),
        })
    return {"summary": summarise(runs), "runs": runs}


def transient_note(points: Sequence[Point]) -> str | None:
    """The note a fit carries when some of its runs are transient (`Point.transient`): what
    their latency is and what to run instead (None when none is)."""
    runs = [q for q in points if q.transient]
    if not runs:
        return None
    shown = "; ".join(f"{q.source} ({q.requests:g} requests at concurrency {q.slots:g})"
                      for q in runs[:5])
    more = f"; and {len(runs) - 5} more" if len(runs) > 5 else ""
    return (f"{len(runs)} of {len(points)} runs are transient, fewer than"
            f" {STEADY_REQUESTS_PER_SLOT:g} requests per concurrency slot: {shown}{more}. A run"
            " that sends its requests in one burst has no steady state; its arrival rate"
            " n / duration is set by its slowest requests, so `predict` at that rate answers for"
            " a steady load the run never had (the user-path check marks them `transient`). Run"
            " several times as many prompts as the concurrency (vllm bench serve --num-prompts)")


def summarise(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The headline figures of a user-path check (`user_path`), over the runs given."""
    valid = [r for r in runs if r["valid"]]
    errs = np.array([abs(r["error"]) for r in valid], dtype=float)
    batch = np.array([abs(r["batch_path_error"]) for r in runs
                      if r["batch_path_error"] is not None], dtype=float)
    declined: dict[str, int] = {}
    for r in runs:
        if not r["valid"]:
            first = r["reasons"][0] if r["reasons"] else "unknown"
            declined[first] = declined.get(first, 0) + 1
    covered = [r["interval"] is not None and r["interval"][0] <= r["measured_s"]
               and (r["interval"][1] is None or r["measured_s"] <= r["interval"][1])
               for r in valid]
    halves = [r["interval_halfwidth"] for r in valid if r["interval_halfwidth"] is not None]
    wrong = [r for r in valid if abs(r["error"]) > WRONG]
    low = [r for r in runs if r["concurrency"] is not None and r["concurrency"] <= 32]
    steady = [r for r in valid if not r.get("transient")]
    steady_errs = np.array([abs(r["error"]) for r in steady], dtype=float)
    below = [r for r in runs if r.get("below_measured_ceiling", True)]
    return {
        "runs": len(runs),
        "valid": len(valid),
        "valid_share": len(valid) / len(runs) if runs else None,
        "speedup_valid": sum(bool(r.get("speedup_valid", r["valid"])) for r in runs),
        "declined": dict(sorted(declined.items())),
        "mape_valid": float(errs.mean()) if errs.size else None,
        "max_error_valid": float(errs.max()) if errs.size else None,
        "valid_off_by_more_than_15pct": [
            {"source": r["source"], "concurrency": r["concurrency"], "k": r["k"],
             "error": r["error"], "transient": bool(r.get("transient"))} for r in wrong],
        "transient_runs": sum(bool(r.get("transient")) for r in runs),
        # The steady runs (not transient) apart: the figures a steady load is promised.
        "steady_runs": sum(not r.get("transient") for r in runs),
        "valid_steady": len(steady),
        "mape_valid_steady": float(steady_errs.mean()) if steady_errs.size else None,
        "steady_valid_off_by_more_than_15pct": [
            {"source": r["source"], "concurrency": r["concurrency"], "k": r["k"],
             "error": r["error"]} for r in wrong if not r.get("transient")],
        # The share of valid over the runs below their curve's measured ceiling, where
        # latency is a function of the arrival rate (at or past it, `saturated` is the
        # answer).
        "runs_below_measured_ceiling": len(below),
        "valid_below_measured_ceiling": sum(r["valid"] for r in below),
        "valid_share_below_measured_ceiling": (sum(r["valid"] for r in below) / len(below)
                                               if below else None),
        "valid_at_concurrency_le_32": sum(r["valid"] for r in low),
        "runs_at_concurrency_le_32": len(low),
        "interval_coverage": float(np.mean(covered)) if covered else None,
        "median_interval_halfwidth": float(np.median(halves)) if halves else None,
        "batch_path_mape": float(batch.mean()) if batch.size else None,
    }


def params_of(fit: Any, max_utilization: float) -> Params:
    """The parameters a fit's file holds, for the numbers its predictions give (the what-if
    commands read the same fields: coefficients, validity ceiling, range, spread)."""
    assert fit.coefficients is not None
    return Params(system=fit.system, coefficients=fit.coefficients,
                  max_utilization=max_utilization, calibrated_range=fit.calibrated_range,
                  uncertainty=fit.uncertainty)
