"""The batch-size → k schedule: which draft length to run at each number of requests in flight.

vLLM's ``num_speculative_tokens_per_batch_size`` takes ranges ``[[start_bs, end_bs, K], ...]``
(K = 0: no drafts at that batch size); :func:`sglang_adaptive_config` and
:func:`trtllm_draft_len_schedule` write the same schedule in the forms SGLang and TensorRT-LLM
read (docs/whatif.md, "Configs the engines read"). The schedule follows the model's best k as
load rises: the mean number of requests in flight is B = λ·L along the best-k path (Little's
law), and L is continuous where the best k switches (the two candidates tie there), so B grows
continuously with λ and each batch size maps to one best k. Used by ``specwatch advise`` and
the controller.

Pure numpy over :mod:`specwatch.model.closed_form`; imports nothing above the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specwatch.model.closed_form import latency, optimal_draft_length
from specwatch.model.coefficients import Model

#: Arrival rates scanned from 0 to the no-SD saturation rate.
SCHEDULE_GRID = 4000


@dataclass(frozen=True)
class Workload:
    """What the best-k path depends on besides the coefficients.

    Exactly one of ``alpha`` (i.i.d. acceptance) and ``profile`` (per-position acceptance,
    P(first i+1 drafts accepted)) is given.
    """

    prompt_tokens: float
    generation_tokens: float
    k_max: int
    max_utilization: float
    alpha: float | None = None
    profile: tuple[float, ...] | None = None


@dataclass(frozen=True)
class BestPath:
    """The best k along a grid of arrival rates, valid points only."""

    arrival_rates: np.ndarray
    draft_lengths: np.ndarray
    batch: np.ndarray  # requests in flight B = λ·L at each point


@dataclass(frozen=True)
class Schedule:
    ranges: list[list[int]]  # [[start_bs, end_bs, K], ...] covering 1..max_num_seqs
    sd_off_above_batch_size: float | None  # None: SD stays the best choice at every load


def no_sd_saturation_rate(model: Model, w: Workload) -> float:
    """1 / C2 of the no-SD system: the arrival rate at which plain decoding saturates."""
    c2 = float(latency(model, 1.0, 0, 1.0, w.prompt_tokens, w.generation_tokens,
                       max_utilization=1.0).utilization)
    return 1.0 / c2 if c2 > 0 else 1000.0


def best_path(model: Model, w: Workload) -> BestPath:
    """The best k and the requests in flight at each valid rate from 0 to saturation."""
    lams = np.linspace(0.0, no_sd_saturation_rate(model, w), SCHEDULE_GRID)
    opt = optimal_draft_length(model, lams, alpha=w.alpha, p=w.prompt_tokens,
                               g=w.generation_tokens, k_max=w.k_max, profile=w.profile,
                               max_utilization=w.max_utilization)
    ok = opt.valid
    return BestPath(lams[ok], opt.k[ok], lams[ok] * opt.latency[ok])


def batch_schedule(model: Model, w: Workload, max_num_seqs: int) -> Schedule:
    """The ranges for batch sizes 1..max_num_seqs; past the last valid load the last K is
    kept, as vLLM does for batch sizes past the last range."""
    path = best_path(model, w)
    ks, batch = path.draft_lengths, path.batch
    on = np.flatnonzero(ks > 0)
    b_off = None
    if on.size and on[-1] + 1 < ks.size:
        b_off = float(batch[on[-1] + 1])
    elif not on.size:
        b_off = 0.0
    ranges: list[list[int]] = []
    last_k = int(ks[-1]) if ks.size else 0
    for bs in range(1, max_num_seqs + 1):
        idx = np.searchsorted(batch, bs)
        k = int(ks[idx]) if idx < ks.size else last_k
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = bs
        else:
            ranges.append([bs, bs, k])
    return Schedule(ranges, b_off)


def schedule_k(ranges: list[list[int]], batch: float) -> int:
    """The schedule's k at a batch size (the last range's beyond it)."""
    b = max(1, round(batch))
    for start, end, k in ranges:
        if start <= b <= end:
            return k
    return ranges[-1][2]


def sglang_adaptive_config(ranges: list[list[int]]) -> dict[str, dict[str, list[int]]]:
    """The schedule as SGLang's ``--speculative-adaptive-config`` JSON: each key a batch size
    (a string of digits) that is the lower bound of its slot, each slot's ``candidate_steps``
    the one k of that range (one candidate: the slot keeps it; 0: no drafts). SGLang routes a
    batch to the largest key at or below its size, so the ranges' starts are the keys."""
    return {str(start): {"candidate_steps": [k]} for start, _end, k in ranges}


def trtllm_draft_len_schedule(ranges: list[list[int]]) -> dict[int, int] | None:
    """The schedule as TensorRT-LLM's ``draft_len_schedule``: each key a batch size that is
    the upper bound of its range, its value the draft length up to it; past the last key
    speculation is off, so trailing K = 0 ranges are left out. TensorRT-LLM requires the
    smallest key's length to be ``max_draft_len`` and none above it: None when the
    schedule's first k is not its largest (or SD is off throughout), which that form cannot
    express."""
    kept = list(ranges)
    while kept and kept[-1][2] == 0:
        kept.pop()
    if not kept or any(k > kept[0][2] for _start, _end, k in kept):
        return None
    return {end: k for _start, end, k in kept}
