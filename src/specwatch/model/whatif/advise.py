"""The advice behind `specwatch advise`: the model turned into the decision an operator makes.

Input: the arrival rate at the p50, p95 and p99 of the operator's load (req/s), acceptance,
lengths. Output, in plain language: enable SD or not, with which static k, the expected gain
at each percentile, the arrival rate above which SD should be off, and a batch-size schedule
for vLLM's `num_speculative_tokens_per_batch_size` ([[start_bs, end_bs, K], ...], K = 0
meaning no drafts at that batch size) that follows the best k as load rises, with the same
schedule in the forms SGLang and TensorRT-LLM read (:func:`engine_forms`).

The static k minimises the load-weighted relative latency L_SD/L_D, weighting each
percentile by the share of time the load spends up to it (p50: 0.50, p95: 0.45, p99: 0.05),
among the k that stay valid at every percentile and do not make p99 slower than no SD (a
tail regression is the failure operators notice). The schedule maps the model's mean number
of requests in flight B = λ·L (Little's law) to the best k at that load; vLLM caps its batch
at max_num_seqs, so where the model would switch SD off beyond that cap the schedule cannot
express it and the advice says so (the schedule itself: :mod:`specwatch.model.schedule`).

Pure: the load comes as typed inputs or a measured :class:`Traffic`. The words of the advice
are :mod:`specwatch.model.whatif.advice_text`'s; the options are declared in
:mod:`specwatch.cli.advise`, which also reads Traffic from Prometheus.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from specwatch.model import bestk, ceilings, uncertainty, validity
from specwatch.model.closed_form import Reason, latency, optimal_draft_length, reason_text
from specwatch.model.params import Params
from specwatch.model.schedule import (
    SCHEDULE_GRID,
    Schedule,
    Workload,
    batch_schedule,
    best_path,
    schedule_k,
    sglang_adaptive_config,
    trtllm_draft_len_schedule,
)
from specwatch.model.whatif import common
from specwatch.model.whatif.advice_text import advice_lines
from specwatch.model.whatif.predict import breakeven_fields, ceiling_fields

PERCENTILES = ("p50", "p95", "p99")
# Share of time the load spends up to each percentile (the top 1% goes with p99).
WEIGHTS = np.array([0.50, 0.45, 0.05])
EMPTY: dict[str, Any] = {"enable": None, "draft_length": None, "schedule": None}
DEFAULT_MIN_GAIN = 1.1
DEFAULT_PREFILL_RATIO = 4.0


@dataclass(frozen=True)
class Traffic:
    """Load and workload measured elsewhere (``advise --prometheus``), in place of the typed
    inputs: the core stays pure (no I/O); the reader lives in the calibrate layer."""

    arrival_rates: dict[str, float]  # p50, p95, p99 (req/s)
    prompt_tokens: float
    generation_tokens: float
    prompt_tokens_p95: float | None = None
    generation_tokens_p95: float | None = None
    #: Per-position acceptance (P(first i+1 drafts accepted)); None: use the flags/file.
    acceptance_profile: tuple[float, ...] | None = None
    #: Largest requests-in-flight batch seen (peak vllm:num_requests_running).
    peak_batch: float | None = None
    source: str = ""


@dataclass(frozen=True)
class AdviseInputs:
    """The advice's inputs as the command line gives them (validated by :func:`compute`);
    None: not given (then a :class:`Traffic` must fill it)."""

    model: common.ModelOptions
    acceptance: common.AcceptanceOptions
    arrival_rates: Mapping[str, float | None]  # p50, p95, p99 (req/s)
    draft_length: float | None = None  # the k acceptance_length was measured at
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    min_gain: float = DEFAULT_MIN_GAIN
    max_num_seqs: int = 256
    prefill_ratio: float = DEFAULT_PREFILL_RATIO


@dataclass(frozen=True)
class Setup:
    """The validated inputs and what the parameters file makes of them."""

    params: Params
    rates: dict[str, float]
    p: float
    g: float
    min_gain: float
    max_num_seqs: int
    prefill_ratio: float
    acc: common.Acceptance
    ceiling: float
    k_max: int
    limit: float  # widest relative half-width of a vouched-for latency interval

    @property
    def workload(self) -> Workload:
        """The best-k path's inputs (the acceptance model as alpha or profile)."""
        return Workload(self.p, self.g, self.k_max, self.ceiling,
                        alpha=self.acc.alpha if self.acc.profile is None else None,
                        profile=self.acc.profile)


@dataclass(frozen=True)
class Grid:
    """Every k at every percentile, judged as predict judges it, and the best k there."""

    lam: np.ndarray  # the percentiles' arrival rates
    ks: np.ndarray  # 1..k_max
    es: np.ndarray  # E(k)
    judged: validity.Assessment
    best: bestk.BestDraft  # the best k at each percentile (model.bestk), -1 where none

    @property
    def valid(self) -> np.ndarray:
        return self.judged.valid

    @property
    def speedup(self) -> np.ndarray:
        """Speedup where the prediction is vouched for, NaN elsewhere."""
        return np.where(self.judged.valid, self.judged.prediction.speedup, np.nan)


@dataclass(frozen=True)
class Choice:
    """The static k and why: k = 0 keeps SD off."""

    k: int
    relative: np.ndarray  # load-weighted L_SD/L_D per k (inf where not eligible)
    declined: dict[int, list[str]]  # k the model alone would allow, and the reasons
    below_min_gain: tuple[int, float] | None  # (k, gain) of a best k under --min-gain
    peak: dict[str, Any] | None = None
    sized_by_peak: bool = False


def compute(inputs: AdviseInputs, traffic: Traffic | None = None) -> dict[str, Any]:
    """The advice; ``traffic`` (measured load) replaces the rate and length inputs."""
    st = setup(inputs, traffic)
    grid = judge_grid(st)
    choice = choose_static_k(st, grid)
    sched = batch_schedule(st.params.model(), st.workload, st.max_num_seqs)
    if traffic is not None and traffic.peak_batch is not None:
        choice = size_by_peak(st, grid, choice, traffic.peak_batch)
    per_q = percentile_rows(st, grid, choice.k, sched.ranges)
    out = _summary(st, grid, choice, sched, per_q, traffic)
    out["advice"] = advice_lines(out)
    return out


def setup(inputs: AdviseInputs, traffic: Traffic | None) -> Setup:
    """Validate the inputs in the order the options are reported (InputError names one)."""
    params = common.load(inputs.model)
    if traffic is not None:
        rates = dict(traffic.arrival_rates)
        p_in, g_in = traffic.prompt_tokens, traffic.generation_tokens
    else:
        given = {"prompt_tokens": inputs.prompt_tokens,
                 "generation_tokens": inputs.generation_tokens,
                 **{f"arrival_rate_{q}": inputs.arrival_rates.get(q) for q in PERCENTILES}}
        for flag, value in given.items():
            if value is None:
                raise common.InputError(f"--{flag.replace('_', '-')}: required (or read the "
                                        "load from --prometheus URL)")
        rates = {q: common.finite_nonnegative(f"--arrival-rate-{q}", inputs.arrival_rates[q])
                 for q in PERCENTILES}
        p_in, g_in = inputs.prompt_tokens, inputs.generation_tokens
    min_gain = inputs.min_gain
    if not (np.isfinite(min_gain) and min_gain > 0):
        raise common.InputError(f"--min-gain: expected a positive number, got {min_gain}")
    if not rates["p50"] <= rates["p95"] <= rates["p99"]:
        raise common.InputError(
            "--arrival-rate-p95: percentiles must not decrease: expected p50 <= p95 <= p99, "
            f"got {rates['p50']:g}, {rates['p95']:g}, {rates['p99']:g}"
        )
    p = common.finite_nonnegative("--prompt-tokens", p_in)
    g = common.finite_nonnegative("--generation-tokens", g_in)
    if inputs.max_num_seqs < 1:
        raise common.InputError(
            f"--max-num-seqs: expected an integer >= 1, got {inputs.max_num_seqs}"
        )
    k_meas = None
    if inputs.draft_length is not None:
        k_meas = common.finite_nonnegative("--draft-length", inputs.draft_length)
    if traffic is not None and traffic.acceptance_profile:
        acc = common.Acceptance("measured profile", None, traffic.acceptance_profile)
    else:
        acc = common.acceptance_from(inputs.acceptance, params, k_meas)
    ceiling = common.ceiling_of(inputs.model, params)
    k_max = common.k_max_of(inputs.model, params)
    if acc.profile is not None:
        k_max = min(k_max, len(acc.profile))
    limit = common.halfwidth_of(inputs.model, params)
    return Setup(params, rates, p, g, min_gain, inputs.max_num_seqs, inputs.prefill_ratio,
                 acc, ceiling, k_max, limit)


def judge_grid(st: Setup) -> Grid:
    """Every k at every percentile judged as predict judges it: a k whose prediction is
    declined (sensitive, beyond the calibrated load, at a measured ceiling) is not advised.
    A percentile with no valid operating point at all, with or without SD, is a capacity
    problem (InputError); one whose fastest choice lies past the validity ceiling has no best
    k (`best.shown` false) but still has the valid ones."""
    params, p, g, ceiling = st.params, st.p, st.g, st.ceiling
    lam = np.array([st.rates[q] for q in PERCENTILES])
    ks = np.arange(1, st.k_max + 1, dtype=float)
    es = st.acc.length(ks)
    judged = validity.assess(params, lam[:, None], ks[None, :], es[None, :], p, g,
                             max_utilization=ceiling, max_halfwidth=st.limit)
    best = bestk.best_draft_length(params, lam, p, g, k_max=st.k_max, max_utilization=ceiling,
                                   max_halfwidth=st.limit, **st.acc.optimal_kwargs())
    nosd = judged.prediction.nosd
    for i, q in enumerate(PERCENTILES):
        if not bool(best.optimum.valid[i]) and not bool(nosd.valid[i, 0]) \
                and not bool(np.any(judged.prediction.sd.valid[i])):
            util = float(nosd.utilization[i, 0])
            raise common.InputError(
                f"--arrival-rate-{q}: {st.rates[q]:g} req/s leaves no valid operating point "
                f"with or without SD (no-SD utilisation λ·C2 = {util:.3g}, ceiling "
                f"{ceiling:g}): this is a capacity problem SD cannot fix; add replicas"
            )
    return Grid(lam, ks, es, judged, best)


def choose_static_k(st: Setup, grid: Grid) -> Choice:
    """The lowest load-weighted relative latency among the k valid at every percentile that
    do not make p99 slower than no SD; SD off (relative latency 1) unless some k beats it,
    and off when the best gain is under ``min_gain``."""
    s = grid.speedup
    eligible = np.all(grid.valid, axis=0) & (s[2] >= 1.0)
    # The k the model prices no slower than no SD at p99 (past the validity ceiling too, not
    # saturated), left out because a prediction of theirs is declined: the advice names them
    # and why, rather than saying they slow p99 down.
    pred = grid.judged.prediction
    priced = np.isfinite(pred.sd.latency) & np.isfinite(pred.nosd.latency)
    with np.errstate(invalid="ignore", divide="ignore"):
        model_s = np.where(priced, pred.nosd.latency / pred.sd.latency, np.nan)
    declined = {
        int(grid.ks[j]): sorted({r for i in range(grid.lam.size) if not grid.valid[i, j]
                                 for r in grid.judged.names((i, j))})
        for j in np.flatnonzero(np.all(priced, axis=0) & (model_s[2] >= 1.0) & ~eligible)
    }
    with np.errstate(invalid="ignore", divide="ignore"):
        relative = WEIGHTS @ np.where(eligible[None, :], 1.0 / s, np.inf)
    static_k = 0
    if eligible.any() and float(np.min(relative)) < 1.0:
        static_k = int(grid.ks[int(np.argmin(relative))])
    below_min_gain = None
    if static_k and 1.0 / float(relative[static_k - 1]) < st.min_gain:
        below_min_gain = (static_k, 1.0 / float(relative[static_k - 1]))
        static_k = 0
    return Choice(static_k, relative, declined, below_min_gain)


def size_by_peak(st: Setup, grid: Grid, choice: Choice, peak_batch: float) -> Choice:
    """The decision at the peak batch; prefill-heavy traffic (the batch swings with long
    prompts) is sized by it rather than by the mean load."""
    peak = _peak(st, peak_batch)
    static_k, sized = choice.k, False
    if st.g > 0 and st.p / st.g >= st.prefill_ratio and peak["valid"]:
        sized = True
        k_peak = int(peak["optimal_draft_length"])
        static_k = k_peak if k_peak and peak["optimal_speedup"] >= st.min_gain else 0
        if static_k and not bool(np.all(grid.valid[:, static_k - 1])):
            static_k = 0
    return replace(choice, k=static_k, peak=peak, sized_by_peak=sized)


def percentile_rows(st: Setup, grid: Grid, static_k: int,
                    schedule: list[list[int]]) -> dict[str, Any]:
    """At each percentile: the advised configuration's latency, speedup and utilisation, the
    best k there, the requests in flight (Little's law) and the schedule's k for them."""
    pred, s, valid, best, best_ok = (grid.judged.prediction, grid.speedup, grid.valid,
                                     grid.best, grid.best.shown)
    nosd = pred.nosd
    per_q: dict[str, Any] = {}
    j = static_k - 1
    for i, q in enumerate(PERCENTILES):
        per_q[q] = {
            "arrival_rate": st.rates[q],
            "latency_nosd_s": float(nosd.latency[i, 0]) if bool(nosd.valid[i, 0]) else None,
            "latency_sd_s": float(pred.sd.latency[i, j]) if static_k and bool(valid[i, j])
            else None,
            "speedup": float(s[i, j]) if static_k else 1.0,
            "optimal_draft_length": int(best.k[i]) if bool(best_ok[i]) else None,
            "optimal_speedup": float(best.speedup[i]) if bool(best_ok[i]) else None,
            "optimal_basis": str(best.basis[i]) if bool(best_ok[i]) else None,
            "optimal_note": best.note(i),
            "utilization": float(pred.sd.utilization[i, j]) if static_k
            else float(nosd.utilization[i, 0]),
            "valid": bool(valid[i, j]) if static_k else bool(nosd.valid[i, 0]),
        }
        lat = per_q[q]["latency_sd_s"] if static_k else per_q[q]["latency_nosd_s"]
        per_q[q]["batch_size"] = st.rates[q] * lat if lat is not None else None
        per_q[q]["schedule_draft_length"] = (
            schedule_k(schedule, per_q[q]["batch_size"]) if lat is not None else None)
    _add_intervals(st, grid, static_k, per_q)
    return per_q


def _add_intervals(st: Setup, grid: Grid, static_k: int, per_q: dict[str, Any]) -> None:
    """The 90% intervals of the advised configuration at each percentile (the fit's residual
    spread through the fixed point): the advice says when a speedup's interval straddles 1."""
    e_adv = float(grid.es[static_k - 1]) if static_k else 1.0
    judged = validity.assess(st.params, grid.lam, float(static_k), e_adv, st.p, st.g,
                             max_utilization=st.ceiling, max_halfwidth=st.limit)
    iv = judged.intervals
    for i, q in enumerate(PERCENTILES):
        item = per_q[q]
        item["validity_reasons"] = [r for r in judged.names(i)
                                    if r != validity.NO_CALIBRATED_RANGE]
        item["valid"] = item["valid"] and not item["validity_reasons"]
        item["latency_interval"] = item["speedup_interval"] = None
        if iv is not None and static_k and item["valid"]:
            item["latency_interval"] = uncertainty.as_pair(iv.latency_sd[0][i],
                                                           iv.latency_sd[1][i])
            item["speedup_interval"] = uncertainty.as_pair(iv.speedup[0][i], iv.speedup[1][i])


def breakeven_of(st: Setup, grid: Grid, static_k: int) -> dict[str, Any]:
    """The advised k's break-even (speedup = 1) and SD's throughput ceiling, as predict gives
    them (`predict.breakeven_fields`, `predict.ceiling_fields`); empty figures with SD off."""
    if not static_k:
        return {"breakeven_arrival_rate": None, "breakeven_interval": None,
                "breakeven_kind": None, "breakeven_reasons": [],
                "sd_ceiling_arrival_rate": None, "sd_ceiling_source": None,
                "sd_ceiling_interval": None, "sd_ceiling_reasons": []}
    e = float(grid.es[static_k - 1])
    figures = {**breakeven_fields(st.params, float(static_k), e, st.p, st.g),
               **ceiling_fields(st.params, float(static_k), e, st.p, st.g)}
    figures.pop("breakeven_measured_ceiling")
    return figures


def sd_off_above_rate(st: Setup) -> float | None:
    """The arrival rate from which the best choice is SD off (any k), if below the no-SD
    validity ceiling: the first load past the last one where SD is the best choice at which
    no SD is (a k at or past the throughput ceiling its runs measured counts as SD off there:
    it does not serve). A load whose faster SD choice lies past the validity ceiling is
    neither (no best k). None when no such load is scanned; 0 when SD is never the best."""
    model = st.params.model()
    nosd_c2 = float(latency(model, 1.0, 0, 1.0, st.p, st.g, max_utilization=1.0).utilization)
    lam_top = st.ceiling / nosd_c2 if nosd_c2 > 0 else 1000.0
    scan = np.linspace(0.0, lam_top, SCHEDULE_GRID)
    scan_best = optimal_draft_length(model, scan, p=st.p, g=st.g, k_max=st.k_max,
                                     max_utilization=st.ceiling, **st.acc.optimal_kwargs())
    served = scan < ceilings.bracket(st.params.calibrated_range, scan_best.k, st.p,
                                     st.g).ceiling
    return common.sd_off_above(scan, np.where(served, scan_best.k, 0), scan_best.valid)


def _load_weighted_speedup(grid: Grid, choice: Choice) -> float | None:
    k = choice.k
    if not k:
        return 1.0
    if not bool(np.all(grid.valid[:, k - 1])):
        return None
    return float(WEIGHTS @ (1.0 / np.where(grid.valid[:, k - 1], grid.speedup[:, k - 1],
                                           np.inf))) ** -1


def engine_forms(sched: Schedule) -> dict[str, Any] | None:
    """The batch-size schedule as each engine's config reads it (None: SD off throughout):
    vLLM's speculative config keys, SGLang's adaptive config with the ``--speculative-num-steps``
    it starts from (one of its candidates), TensorRT-LLM's speculative_config keys (None when
    its draft_len_schedule cannot express the schedule)."""
    k_max = max(r[2] for r in sched.ranges)
    if k_max == 0:
        return None
    trt = trtllm_draft_len_schedule(sched.ranges)
    return {
        "vllm": {"num_speculative_tokens": k_max,
                 "num_speculative_tokens_per_batch_size": sched.ranges},
        "sglang": {"speculative_num_steps": k_max,
                   "speculative_adaptive_config": sglang_adaptive_config(sched.ranges)},
        "tensorrt_llm": None if trt is None else {"max_draft_len": trt[min(trt)],
                                                  "draft_len_schedule": trt},
    }


def _summary(st: Setup, grid: Grid, choice: Choice, sched: Schedule, per_q: dict[str, Any],
             traffic: Traffic | None) -> dict[str, Any]:
    """The JSON-ready advice (without its lines of text)."""
    params, static_k = st.params, choice.k
    figures = breakeven_of(st, grid, static_k)
    below = choice.below_min_gain
    return {
        "system": params.system,
        "acceptance_source": st.acc.source,
        "alpha": st.acc.alpha,
        "prompt_tokens": st.p,
        "generation_tokens": st.g,
        "max_utilization": st.ceiling,
        "enable": static_k > 0,
        "draft_length": static_k,
        "load_weighted_speedup": _load_weighted_speedup(grid, choice),
        "num_speculative_tokens": max(r[2] for r in sched.ranges),
        "schedule": sched.ranges,
        "engine_forms": engine_forms(sched),
        "sd_off_above_batch_size": sched.sd_off_above_batch_size,
        "max_num_seqs": st.max_num_seqs,
        "percentiles": per_q,
        **figures,
        "sd_off_above_arrival_rate": (off := sd_off_above_rate(st)),
        "sd_off_above_reasons": (validity.range_reasons(params.calibrated_range, off, None, 0)
                                 if off else []),
        "min_gain": st.min_gain,
        "declined_draft_lengths": {str(k): r for k, r in choice.declined.items()},
        "below_min_gain": None if below is None else {
            "draft_length": below[0], "load_weighted_speedup": below[1]},
        "peak": choice.peak,
        "sized_by_peak_batch": choice.sized_by_peak,
        "prefill_ratio": st.prefill_ratio,
        "traffic": None if traffic is None else {
            "source": traffic.source, "prompt_tokens_p95": traffic.prompt_tokens_p95,
            "generation_tokens_p95": traffic.generation_tokens_p95,
            "peak_batch": traffic.peak_batch,
            "acceptance_profile": traffic.acceptance_profile},
        "valid": True,
        "calibrated_range": (params.calibrated_range.to_mapping()
                             if params.calibrated_range is not None else None),
        # The loads advised on, judged against the calibrated range (empty: all inside).
        "validity_reasons": sorted({
            r for lam in st.rates.values()
            for r in validity.range_reasons(params.calibrated_range, lam, None, static_k,
                                            st.p, st.g)
        }) or ([validity.NO_CALIBRATED_RANGE] if params.calibrated_range is None else []),
    }


def _peak(st: Setup, peak_batch: float) -> dict[str, Any]:
    """The decision at the peak batch: the arrival rate whose best-path requests in flight
    λ·L equal it (Little's law), and the best k and speedup there."""
    path = best_path(st.params.model(), st.workload)
    batch = path.batch
    out: dict[str, Any] = {"batch": peak_batch, "arrival_rate": None, "valid": False,
                           "optimal_draft_length": None, "optimal_speedup": None,
                           "optimal_basis": None, "optimal_note": None}
    if not batch.size or peak_batch > float(batch.max()):
        out["reason"] = (f"a batch of {peak_batch:g} requests in flight is past the model's "
                         f"validity ceiling {st.ceiling:g} (largest valid batch "
                         f"{float(batch.max()) if batch.size else 0:.3g})")
        return out
    lam = float(np.interp(peak_batch, batch, path.arrival_rates))
    best = bestk.best_draft_length(st.params, np.array([lam]), st.p, st.g, k_max=st.k_max,
                                   max_utilization=st.ceiling, max_halfwidth=st.limit,
                                   **st.acc.optimal_kwargs())
    shown = bool(best.shown[0])
    out.update(arrival_rate=lam, valid=shown,
               optimal_draft_length=int(best.k[0]) if shown else None,
               optimal_speedup=float(best.speedup[0]) if shown else None,
               optimal_basis=str(best.basis[0]) if shown else None,
               optimal_note=best.note(0))
    if not shown:
        out["reason"] = best.note(0) or reason_text(int(best.optimum.reason[0]))
    return out


__all__ = ["AdviseInputs", "Reason", "Traffic", "compute"]
