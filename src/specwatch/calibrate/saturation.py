"""Calibrating the saturation regime over the whole load range (model.md, "Saturation regime").

Each run is (B, λ, L) with B = λ·L from Little's law, so the fit sees the latency as a function
of the batch in flight, L(B), which is what a closed-loop benchmark measures on both sides of
the throughput peak. For fixed knees (T_v tokens per verify step, T_d tokens per draft step)
L(B) is linear in eight coefficients:

    L = a_p + cyc·a_v + cyc·k·a_d + B·b_p + cyc·B·b_v + cyc·k·B·b_d
        + cyc·max(0, B(k+1) − T_v)·c_v + cyc·k·max(0, B − T_d)·c_d,     cyc = g/E

so non-negative least squares on relative residuals (each row divided by its measured L, the
error the acceptance targets are stated in) fits them, and the knees are found by a grid
search over that profile (the residual at each knee pair is reported: a flat profile means
the knee is not identifiable from the data given).

Capacity (KV-cache tokens, one value with the drafter loaded and one without): past N running
requests the rest wait, and a closed-loop run at B > N measures L = (B/N)·L(N), latency linear
in B at constant throughput (`model.saturation.closed_loop_latency`). For a fixed N the row of
such a point is (B/N) times the row at N, so the problem stays linear in the eight
coefficients and N joins the knees in the grid search, in tokens (N = tokens / (p + g)). A
capacity is set only when the data show it: at least `MIN_RUNS_PAST_CAPACITY` runs lie past it
and the best fit without it has a relative RMS more than `KNEE_TOLERANCE` worse; otherwise it
is reported as not identifiable and left unset (no limit), so the form is the roofline one.

What the servers stated about their capacity (`Point.kv_cache_tokens`, from vLLM's
`vllm:cache_config_info` or the calibrate flags, and `Point.max_num_seqs`) is a fact, not a
fit: a stated KV cache is the capacity of its system (SD or no SD) without a search or an
identifiability test, and a stated max_num_seqs caps every run's running requests
(`stated_capacity`; model.md, "Server capacity").

Points are excluded only when truly unusable (no generation length, no acceptance length for
an SD run, a non-positive latency or throughput); high-concurrency points with exploding TTFT
are what this fit exists to use.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import nnls

from specwatch import model
from specwatch.calibrate import kneegrid
from specwatch.calibrate.inputs import Point
from specwatch.model.observed import ServerCapacity

__all__ = [
    "CAPACITY_GRID",
    "KNEES_D",
    "KNEES_V",
    "SATURATION_COEFFICIENTS",
    "SaturationFit",
    "design_matrix",
    "fit_saturation",
    "measured_breakeven",
    "predicted_latency",
    "stated_capacity",
]

#: Column order of the design matrix (and the names the report uses).
SATURATION_COEFFICIENTS = ("a_p", "a_v", "a_d", "b_p", "b_v", "b_d", "c_v", "c_d")

#: Knee grids (tokens per step). inf = no knee: the compute-bound column is dropped.
KNEES_V = (0.0, 32.0, 64.0, 96.0, 128.0, 160.0, 192.0, 256.0, 320.0, 384.0, 512.0, 768.0,
           1024.0, math.inf)
KNEES_D = (0.0, 16.0, 32.0, 64.0, 96.0, 128.0, 192.0, 256.0, math.inf)

#: A knee pair whose relative RMS error is within this factor of the best one is "as good":
#: the reported knee range is the span of those pairs. The same factor decides whether a
#: capacity is shown by the data (the fit without it must be worse by more than this).
KNEE_TOLERANCE = 1.10

#: KV-cache capacity grid in tokens (1k to 1M, steps of √2), refined by 2^(1/16) around the
#: best; only values with runs past them are tried (any other value is "no limit" to the fit).
CAPACITY_GRID = tuple(1024.0 * 2.0 ** (i / 2) for i in range(21))
_CAPACITY_REFINE = tuple(2.0 ** (j / 16) for j in range(-8, 9))

#: A capacity candidate needs at least this many runs past it (B > N): fewer would let one
#: run's latency set N on its own.
MIN_RUNS_PAST_CAPACITY = 3

#: ... at this many load levels (concurrencies): what shows a capacity is latency growing
#: linearly in B at constant throughput past it, and one level past it cannot show that
#: (its latency is matched as well by the compute-bound slopes, so N would be a guess).
MIN_LEVELS_PAST_CAPACITY = 2


@dataclass(frozen=True)
class CapacityFit:
    """What the data say about one KV-cache capacity (SD with its drafter, or no SD).

    `tokens` is the fitted value (None: not set, the reason says why); `range` the span of
    grid values whose fit is within KNEE_TOLERANCE of the best (inf at the top: "no limit" is
    as good, so the capacity is not identifiable); `rms_without` the best relative RMS with
    no capacity; `runs_past` how many runs lie past the fitted value (or could lie past any).
    """

    tokens: float | None
    identifiable: bool
    reason: str
    range: tuple[float, float] | None
    rms_with: float | None
    rms_without: float
    runs_past: int
    mean_tokens_per_request: float | None
    floor_tokens: float = 0.0  # the smallest capacity the runs' TTFT allow (0: no TTFT)

    def to_report(self) -> dict[str, Any]:
        n = (self.tokens / self.mean_tokens_per_request
             if self.tokens and self.mean_tokens_per_request else None)
        return {
            "kv_cache_tokens": self.tokens, "identifiable": self.identifiable,
            "reason": self.reason,
            "as_good_range_tokens": list(self.range) if self.range else None,
            "requests_at_mean_length": n, "relative_rms_with": self.rms_with,
            "relative_rms_without": self.rms_without, "runs_past": self.runs_past,
            "floor_tokens_from_ttft": self.floor_tokens or None,
        }


@dataclass
class SaturationFit:
    """The fitted coefficients, the chosen knees and capacities, and the knee profile."""

    coefficients: model.Coefficients
    rms: float  # relative RMS error at the chosen knees
    knee_range_v: tuple[float, float]
    knee_range_d: tuple[float, float]
    profile: dict[tuple[float, float], float] = field(default_factory=dict)
    capacity_sd: CapacityFit | None = None
    capacity_nosd: CapacityFit | None = None


def point_arrays(points: Sequence[Point], load: str = "in_flight") -> tuple[np.ndarray, ...]:
    """(load, k, e, p, g) per point; ``load`` names the point's load field (requests in
    flight, or ``arrival_rate``); e is 1 without SD, p 0 where not recorded."""
    rows = np.array([(getattr(p, load), p.draft_length,
                      p.acceptance_length if p.draft_length > 0 else 1.0,
                      p.prompt_tokens or 0.0, p.generation_tokens) for p in points],
                    dtype=float).reshape(-1, 5)
    b, k, e, p_, g = (np.ascontiguousarray(col) for col in rows.T)
    return b, k, e, p_, g


def design_matrix(points: Sequence[Point], knee_v: float, knee_d: float,
                  capacity: np.ndarray | None = None) -> np.ndarray:
    """Rows of the linear problem at fixed knees, columns in SATURATION_COEFFICIENTS order;
    `capacity` (requests, per point, inf for none) scales the rows of runs past it."""
    b, k, e, _, g = point_arrays(points)
    return _design(b, k, g / e, knee_v, knee_d, capacity)


def _design(b: np.ndarray, k: np.ndarray, cyc: np.ndarray, knee_v: float, knee_d: float,
            capacity: np.ndarray | None = None) -> np.ndarray:
    scale = None
    if capacity is not None:
        past = b > capacity
        if past.any():
            scale = np.where(past, b / capacity, 1.0)
            b = np.where(past, capacity, b)
    hv = np.zeros_like(b) if math.isinf(knee_v) else np.maximum(0.0, b * (k + 1) - knee_v)
    hd = np.zeros_like(b) if math.isinf(knee_d) else np.maximum(0.0, b - knee_d)
    x = np.column_stack(
        [np.ones_like(b), cyc, cyc * k, b, cyc * b, cyc * k * b, cyc * hv, cyc * k * hd]
    )
    # Past the capacity N: N run and B − N wait, L = (B/N)·L(N) (module docstring).
    return x if scale is None else x * scale[:, None]


def _solve(arrays: tuple[np.ndarray, ...], knee_v: float, knee_d: float,
           capacity: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    b, k, cyc, lat = arrays
    x = _design(b, k, cyc, knee_v, knee_d, capacity)
    w = 1.0 / lat
    if len(b) >= kneegrid.GRAM_MIN_POINTS:
        return kneegrid.solve_weighted(x * w[:, None])
    sol, _ = nnls(x * w[:, None], lat * w, maxiter=50 * x.shape[1])
    rel = x @ sol / lat - 1.0
    return sol, float(np.sqrt(np.mean(rel**2)))


def _coefficients(sol: np.ndarray, knee_v: float, knee_d: float,
                  kv_sd: float | None = None, kv_nosd: float | None = None,
                  seqs: float | None = None) -> model.Coefficients:
    v = dict(zip(SATURATION_COEFFICIENTS, (float(x) for x in sol), strict=True))
    return model.Coefficients(
        a_p=v["a_p"], b_p=v["b_p"], a_v=v["a_v"], b_v=v["b_v"], a_d=v["a_d"], b_d=v["b_d"],
        c_v=v["c_v"] if math.isfinite(knee_v) else 0.0,
        knee_v=knee_v if math.isfinite(knee_v) and v["c_v"] > 0 else 0.0,
        c_d=v["c_d"] if math.isfinite(knee_d) else 0.0,
        knee_d=knee_d if math.isfinite(knee_d) and v["c_d"] > 0 else 0.0,
        kv_cache_tokens=kv_nosd or 0.0,
        kv_cache_tokens_sd=kv_sd or 0.0,
        max_num_seqs=seqs or 0.0,
    )


def running_lower_bound(points: Sequence[Point]) -> np.ndarray:
    """Requests measured running (past their first token) in each run, by Little's law on
    the decode phase: λ·(L − TTFT); NaN where the run has no TTFT.

    A lower bound on what the server runs at once (requests in prefill run too, and TTFT
    includes the wait), so a capacity below it contradicts the run's own TTFT."""
    return np.array([p.arrival_rate * (p.latency_s - p.ttft_s)
                     if p.ttft_s is not None and p.ttft_s < p.latency_s else math.nan
                     for p in points], dtype=float)


def _load_levels(points: Sequence[Point]) -> np.ndarray:
    """A load level per run: its concurrency, else its B on a 25% log grid (Prometheus)."""
    return np.array([p.concurrency if p.concurrency is not None
                     else -round(math.log(max(p.in_flight, 1e-9)) / math.log(1.25))
                     for p in points], dtype=float)


def _admissible(tokens: float, b: np.ndarray, hold: np.ndarray, levels: np.ndarray,
                n_all: int, floor: float) -> bool:
    """A capacity the data can show: at or above the TTFT floor, with MIN_RUNS_PAST_CAPACITY
    runs past it at MIN_LEVELS_PAST_CAPACITY load levels, and enough runs left below it to
    fit the eight coefficients."""
    past = b > tokens / hold
    n_past = int(np.sum(past))
    return (tokens >= floor and n_past >= MIN_RUNS_PAST_CAPACITY
            and len(set(levels[past].tolist())) >= MIN_LEVELS_PAST_CAPACITY
            and n_all - n_past >= len(SATURATION_COEFFICIENTS))


def _capacity_candidates(b: np.ndarray, hold: np.ndarray, levels: np.ndarray, n_all: int,
                         floor: float, grid: Sequence[float] = CAPACITY_GRID) -> list[float]:
    """The admissible capacities (tokens) of the grid, and the floor itself: the grid is
    coarse (√2) and a capacity just above the measured running requests is what runs
    waiting at the cap show."""
    return [float(t) for t in sorted({*grid, *([floor] if floor > 0 else [])})
            if _admissible(t, b, hold, levels, n_all, floor)]


def _floor(running: np.ndarray, hold: np.ndarray) -> float:
    """The smallest capacity (tokens) the runs' measured running requests allow."""
    held = running * hold
    held = held[np.isfinite(held)]
    return float(held.max()) if held.size else 0.0


def _per_point(mask: np.ndarray, hold: np.ndarray, tokens: float,
               seqs: float = math.inf) -> np.ndarray:
    """Capacity in requests of each run of `mask` (inf elsewhere and for no limit), at most
    `seqs` everywhere (a stated max_num_seqs)."""
    with np.errstate(divide="ignore"):
        return np.minimum(np.where(mask, tokens / hold, math.inf), seqs)


def stated_capacity(points: Sequence[Point]) -> ServerCapacity | None:
    """What the runs' servers stated about their capacity (None: nothing stated).

    The SD runs' KV cache is `kv_cache_tokens_sd`, the no-SD runs' `kv_cache_tokens`.
    Runs that state different values were not served by one configuration, so that value
    is left unstated (and fitted as before) rather than one of them picked; runs that state
    nothing do not contradict the ones that do.
    """
    def one(values: Sequence[float | None]) -> float | None:
        got = {float(v) for v in values if v}
        return got.pop() if len(got) == 1 else None

    found = ServerCapacity(
        kv_cache_tokens=one([p.kv_cache_tokens for p in points if not p.sd]),
        kv_cache_tokens_sd=one([p.kv_cache_tokens for p in points if p.sd]),
        max_num_seqs=one([p.max_num_seqs for p in points]))
    return found if found else None


def _stated_fit(tokens: float, rms: float, rms_without: float, b: np.ndarray,
                hold: np.ndarray, seqs: float) -> CapacityFit:
    past = int(np.sum(b > np.minimum(tokens / hold, seqs)))
    why = (f"stated by the server: {past} runs past it; without"
           f" it the relative RMS is {rms_without:.2%} against {rms:.2%}")
    return CapacityFit(tokens, True, why, None, rms, rms_without, past,
                       float(np.mean(hold)) if hold.size else None)


def fit_saturation(points: Sequence[Point]) -> SaturationFit:
    """Grid search over the knees and the SD capacity, NNLS at each; the lowest relative RMS
    wins (ties to the larger knee: the longer memory-bound stretch, closest to the linear
    model). The capacity is kept only when the data show it (module docstring); then the
    no-SD capacity is searched the same way at the chosen knees, and each is refined."""
    if len(points) < len(SATURATION_COEFFICIENTS):
        raise ValueError(
            f"{len(points)} point(s); the saturation form needs at least "
            f"{len(SATURATION_COEFFICIENTS)}"
        )
    has_sd = any(p.sd for p in points)
    knees_d = KNEES_D if has_sd else (math.inf,)
    b, k, e, p_, g = point_arrays(points)
    hold = np.maximum(p_ + g, 1.0)
    sd = k > 0
    arrays = (b, k, g / e, np.array([p.latency_s for p in points], dtype=float))
    running = running_lower_bound(points)
    floor_sd, floor_nosd = _floor(running[sd], hold[sd]), _floor(running[~sd], hold[~sd])
    levels = _load_levels(points)
    stated = stated_capacity(points) or ServerCapacity()
    seqs = stated.max_num_seqs or math.inf
    known_sd = stated.kv_cache_tokens_sd if has_sd else None
    caps_sd = (_capacity_candidates(b[sd], hold[sd], levels[sd], len(points), floor_sd)
               if has_sd and known_sd is None else [])
    caps = (math.inf, *caps_sd, *([known_sd] if known_sd else []))
    grid = _knee_grid(arrays, knees_d, caps, sd, hold, seqs)
    cap_sd_fit, (kv, kd, cap_sd), by_cap = _choose_knees(grid, known_sd, caps_sd, b[sd],
                                                         hold[sd], seqs)
    sol, rms = grid[(kv, kd, cap_sd)]
    # Knee ranges at the chosen capacity: the knee pairs within the tolerance of the best.
    per_knee = {(kv_, kd_): r for (kv_, kd_, c), (_, r) in grid.items() if c == cap_sd}
    if math.isfinite(cap_sd) and not known_sd:
        cap_sd, sol, rms, fine = _refine(arrays, kv, kd, sd, b, hold, levels, cap_sd,
                                         math.inf, True, floor_sd, seqs)
        cap_sd_fit = _with_value(cap_sd_fit, cap_sd, rms, b[sd], hold[sd], by_cap, fine,
                                 floor_sd)
    cap_nosd, cap_nosd_fit, sol, rms = _nosd_capacity(
        arrays, (kv, kd, cap_sd), sd, b, hold, levels, stated.kv_cache_tokens, floor_nosd,
        seqs, (sol, rms))
    best_knee_rms = min(per_knee.values())
    good = [key for key, r in per_knee.items() if r <= best_knee_rms * KNEE_TOLERANCE]
    cap_sd_fit = dataclasses.replace(cap_sd_fit, floor_tokens=floor_sd)
    cap_nosd_fit = dataclasses.replace(cap_nosd_fit, floor_tokens=floor_nosd)
    return SaturationFit(
        coefficients=_coefficients(sol, kv, kd, cap_sd if math.isfinite(cap_sd) else None,
                                   cap_nosd if math.isfinite(cap_nosd) else None,
                                   seqs if math.isfinite(seqs) else None),
        rms=rms,
        knee_range_v=(min(x[0] for x in good), max(x[0] for x in good)),
        knee_range_d=(min(x[1] for x in good), max(x[1] for x in good)),
        profile=per_knee,
        capacity_sd=cap_sd_fit if has_sd else None,
        capacity_nosd=cap_nosd_fit,
    )


_Key = tuple[float, float, float]  # (knee_v, knee_d, SD capacity); math.inf = no capacity
_Grid = dict[_Key, tuple[np.ndarray, float]]  # key -> (solution, relative RMS)


def _knee_grid(arrays: tuple[np.ndarray, ...], knees_d: Sequence[float], caps: Sequence[float],
               sd: np.ndarray, hold: np.ndarray, seqs: float) -> _Grid:
    """NNLS at every (knee_v, knee_d, SD capacity) of the grid (from the normal equations
    on many runs: `calibrate.kneegrid`)."""
    grid: _Grid = {}
    if len(arrays[0]) >= kneegrid.GRAM_MIN_POINTS:
        by_cap = {cap: kneegrid.grid_at_capacity(arrays, KNEES_V, knees_d,
                                                 _per_point(sd, hold, cap, seqs))
                  for cap in caps}
        for kv in KNEES_V:
            for kd in knees_d:
                for cap in caps:
                    grid[(kv, kd, cap)] = by_cap[cap][(kv, kd)]
        return grid
    for kv in KNEES_V:
        for kd in knees_d:
            for cap in caps:
                grid[(kv, kd, cap)] = _solve(arrays, kv, kd, _per_point(sd, hold, cap, seqs))
    return grid


def _best_of(grid: _Grid, keys: Sequence[_Key]) -> tuple[float, _Key]:
    """(RMS, key) of the best of `keys`, in grid order: a later key must be strictly better
    (ties: the first)."""
    found: tuple[float, _Key] | None = None
    for key in keys:
        rms = grid[key][1]
        if found is None or rms < found[0] * (1 - 1e-9):
            found = (rms, key)
    assert found is not None
    return found


def _choose_knees(grid: _Grid, known_sd: float | None, caps_sd: Sequence[float],
                  b_sd: np.ndarray, hold_sd: np.ndarray, seqs: float
                  ) -> tuple[CapacityFit, _Key, dict[float, float]]:
    """The knees and the SD capacity: at a stated capacity (a fact) the best knees there,
    no decision; otherwise the capacity only when the data show it (`_decide_capacity`).
    Also the best RMS over the knees at each SD capacity."""
    rms_all, key_all = _best_of(grid, list(grid))
    rms_none, key_none = _best_of(grid, [key for key in grid if math.isinf(key[2])])
    by_cap: dict[float, float] = {}
    for key, (_, r) in grid.items():
        by_cap[key[2]] = min(r, by_cap.get(key[2], math.inf))
    if known_sd:
        rms_known, chosen = _best_of(grid, [key for key in grid if key[2] == known_sd])
        cap_sd_fit = _stated_fit(known_sd, rms_known, rms_none, b_sd, hold_sd, seqs)
    else:
        cap_sd_fit, chosen = _decide_capacity(
            rms_all, key_all, rms_none, key_none, by_cap, caps_sd, hold_sd, b_sd)
    return cap_sd_fit, chosen, by_cap


def _nosd_capacity(arrays: tuple[np.ndarray, ...], chosen: _Key, sd: np.ndarray, b: np.ndarray,
                   hold: np.ndarray, levels: np.ndarray, known_nosd: float | None,
                   floor_nosd: float, seqs: float, current: tuple[np.ndarray, float]
                   ) -> tuple[float, CapacityFit, np.ndarray, float]:
    """The no-SD capacity at the chosen knees and SD capacity: stated, or decided from the
    RMS profile over the candidates and refined. Returns (capacity, its fit, solution, RMS)."""
    kv, kd, cap_sd = chosen
    sol, rms = current
    nosd = ~sd
    caps_nosd = ([] if known_nosd else
                 _capacity_candidates(b[nosd], hold[nosd], levels[nosd], len(b), floor_nosd))
    prof_nosd = {math.inf: rms}
    for cap in (*caps_nosd, *([known_nosd] if known_nosd else [])):
        sol_c, prof_nosd[cap] = _solve(
            arrays, kv, kd, np.minimum(_per_point(sd, hold, cap_sd, seqs),
                                       _per_point(nosd, hold, cap, seqs)))
    if known_nosd:
        cap_nosd, rms_without = known_nosd, rms
        sol, rms = sol_c, prof_nosd[known_nosd]
        cap_nosd_fit = _stated_fit(known_nosd, rms, rms_without, b[nosd], hold[nosd], seqs)
    else:
        best_nosd = min(prof_nosd, key=lambda c: (prof_nosd[c], -c))
        cap_nosd_fit, cap_nosd = _decide_nosd(prof_nosd, best_nosd, caps_nosd, b[nosd],
                                              hold[nosd])
    if math.isfinite(cap_nosd) and not known_nosd:
        cap_nosd, sol, rms, fine = _refine(arrays, kv, kd, sd, b, hold, levels, cap_sd,
                                           cap_nosd, False, floor_nosd, seqs)
        cap_nosd_fit = _with_value(cap_nosd_fit, cap_nosd, rms, b[nosd], hold[nosd],
                                   prof_nosd, fine, floor_nosd)
    return cap_nosd, cap_nosd_fit, sol, rms


def _top(b: np.ndarray) -> float:
    return float(np.max(b)) if b.size else 0.0


def _as_good(profile: dict[float, float], best: float) -> tuple[float, float]:
    caps = [c for c, r in profile.items() if r <= best * KNEE_TOLERANCE]
    return (min(caps), max(caps))


def _decide_capacity(
    rms_all: float, key_all: tuple[float, float, float], rms_none: float,
    key_none: tuple[float, float, float], profile: dict[float, float], caps: Sequence[float],
    hold: np.ndarray, b: np.ndarray,
) -> tuple[CapacityFit, tuple[float, float, float]]:
    """Keep the SD capacity only when the best fit without it is worse by more than the
    tolerance; `profile` is the best RMS over the knees at each capacity (inf = none)."""
    mean_hold = float(np.mean(hold)) if hold.size else None
    if not caps:
        why = (f"not identifiable: no capacity (at or above the TTFT floor) has"
               f" {MIN_RUNS_PAST_CAPACITY} SD runs at {MIN_LEVELS_PAST_CAPACITY} load levels past"
               f" it ({b.size} runs, highest B = {_top(b):.0f})")
        return CapacityFit(None, False, why, None, None, rms_none, 0, mean_hold), key_none
    if math.isinf(key_all[2]) or rms_none <= rms_all * KNEE_TOLERANCE:
        why = (f"not identifiable: the best fit without a capacity ({rms_none:.2%} relative"
               f" RMS) is within {KNEE_TOLERANCE - 1:.0%} of the best with one ({rms_all:.2%})")
        return CapacityFit(None, False, why, _as_good(profile, rms_all), rms_all, rms_none,
                           0, mean_hold), key_none
    past = int(np.sum(b > key_all[2] / hold))
    why = (f"identifiable: {past} runs past it; without it the relative RMS is"
           f" {rms_none:.2%} against {rms_all:.2%}")
    return CapacityFit(key_all[2], True, why, _as_good(profile, rms_all), rms_all, rms_none,
                       past, mean_hold), key_all


def _decide_nosd(profile: dict[float, float], best: float, caps: Sequence[float],
                 b: np.ndarray, hold: np.ndarray) -> tuple[CapacityFit, float]:
    mean_hold = float(np.mean(hold)) if hold.size else None
    rms_none = profile[math.inf]
    if not caps:
        why = (f"not identifiable: no capacity (at or above the TTFT floor) has"
               f" {MIN_RUNS_PAST_CAPACITY} runs without SD at {MIN_LEVELS_PAST_CAPACITY} load"
               f" levels past it ({b.size} runs, highest B = {_top(b):.0f})")
        return CapacityFit(None, False, why, None, None, rms_none, 0, mean_hold), math.inf
    rms = profile[best]
    if math.isinf(best) or rms_none <= rms * KNEE_TOLERANCE:
        why = (f"not identifiable: the fit without a capacity ({rms_none:.2%} relative RMS)"
               f" is within {KNEE_TOLERANCE - 1:.0%} of the best with one ({rms:.2%})")
        return CapacityFit(None, False, why, _as_good(profile, rms), rms, rms_none, 0,
                           mean_hold), math.inf
    past = int(np.sum(b > best / hold))
    why = (f"identifiable: {past} runs past it; without it the relative RMS is"
           f" {rms_none:.2%} against {rms:.2%}")
    return CapacityFit(best, True, why, _as_good(profile, rms), rms, rms_none, past,
                       mean_hold), best


def _refine(arrays: tuple[np.ndarray, ...], kv: float, kd: float, sd: np.ndarray,
            b: np.ndarray, hold: np.ndarray, levels: np.ndarray, cap_sd: float,
            cap_nosd: float, refine_sd: bool, floor: float, seqs: float = math.inf
            ) -> tuple[float, np.ndarray, float, dict[float, float]]:
    """The capacity on a 2^(1/16) grid around the chosen grid value, knees fixed."""
    mask = sd if refine_sd else ~sd
    centre = cap_sd if refine_sd else cap_nosd
    best: tuple[float, float, np.ndarray] | None = None
    profile: dict[float, float] = {}
    for factor in _CAPACITY_REFINE:
        cap = centre * factor
        if not _admissible(cap, b[mask], hold[mask], levels[mask], len(b), floor):
            continue
        s_cap, n_cap = (cap, cap_nosd) if refine_sd else (cap_sd, cap)
        sol, rms = _solve(arrays, kv, kd, np.minimum(_per_point(sd, hold, s_cap, seqs),
                                                     _per_point(~sd, hold, n_cap, seqs)))
        profile[cap] = rms
        if best is None or rms < best[1] * (1 - 1e-9):
            best = (cap, rms, sol)
    assert best is not None  # the centre itself qualifies
    return best[0], best[2], best[1], profile


def _with_value(fit: CapacityFit, tokens: float, rms: float, b: np.ndarray,
                hold: np.ndarray, coarse: dict[float, float], fine: dict[float, float],
                floor: float) -> CapacityFit:
    """The decided capacity at its refined value; the as-good range over both grids."""
    past = int(np.sum(b > tokens / hold))
    why = (f"identifiable: {past} runs past it; without it the relative RMS is"
           f" {fit.rms_without:.2%} against {rms:.2%}")
    return CapacityFit(tokens, True, why, _as_good({**coarse, **fine}, rms), rms,
                       fit.rms_without, past, fit.mean_tokens_per_request, floor)


def predicted_latency(coef: model.Coefficients, points: Sequence[Point]) -> np.ndarray:
    """L(B) at each point's measured batch in flight (the closed-loop prediction)."""
    b, k, e, p_, g = point_arrays(points)
    return model.batch_latency(coef, b, k, e, p_, g)


# --------------------------------------------------------------------------- break-even


def _up_to_peak(points: Sequence[Point]) -> list[tuple[float, float]]:
    """(λ, L) of one curve sorted by load, up to and including its throughput peak."""
    pts = _by_load(points)
    if not pts:
        return []
    peak = max(range(len(pts)), key=lambda i: pts[i].arrival_rate)
    curve = [(p.arrival_rate, p.latency_s) for p in pts[: peak + 1]]
    # Keep λ strictly increasing (a closed-loop curve can wobble at light load).
    out: list[tuple[float, float]] = []
    for lam, lat in curve:
        if not out or lam > out[-1][0]:
            out.append((lam, lat))
    return out


def _by_load(points: Sequence[Point]) -> list[Point]:
    return sorted(points, key=lambda p: (p.concurrency or p.in_flight, p.arrival_rate))


def _peak_seen(points: Sequence[Point]) -> bool:
    """True when the curve has a run past its throughput peak: the ceiling was measured,
    not just the last load tried."""
    pts = _by_load(points)
    peak = max(range(len(pts)), key=lambda i: pts[i].arrival_rate)
    return peak < len(pts) - 1


def measured_breakeven(sd: Sequence[Point], nosd: Sequence[Point]) -> tuple[float, str] | None:
    """Measured λ* of one draft length on one workload, and how it was found.

    The arrival rate where the SD and no-SD latency curves cross at equal λ (linear
    interpolation, each curve up to its own throughput peak), or SD's throughput ceiling
    when SD is still faster there, no-SD serves more, and SD's curve has a run past its peak
    (otherwise the "peak" is only the last load tried). None when neither applies within the
    measured range.
    """
    a, b = _up_to_peak(sd), _up_to_peak(nosd)
    if len(a) < 2 or len(b) < 2:
        return None
    la, ya = np.array([x for x, _ in a]), np.array([y for _, y in a])
    lb, yb = np.array([x for x, _ in b]), np.array([y for _, y in b])
    lo, hi = max(la[0], lb[0]), min(la[-1], lb[-1])
    if hi <= lo:
        return None
    grid = np.linspace(lo, hi, 2001)
    diff = np.interp(grid, la, ya) - np.interp(grid, lb, yb)
    if diff[0] >= 0:
        return None  # SD not faster at the lightest common load: no pays-below crossing
    cross = np.flatnonzero(diff >= 0)
    if cross.size:
        i = cross[0]
        x0, x1, d0, d1 = grid[i - 1], grid[i], diff[i - 1], diff[i]
        return float(x0 + (x1 - x0) * (-d0) / (d1 - d0)), "crossing"
    if la[-1] < lb[-1] and _peak_seen(sd):
        return float(la[-1]), "sd_ceiling"
    return None


def group_by_workload(points: Sequence[Point], labels: Sequence[str]
                      ) -> dict[str, dict[float, list[Point]]]:
    """workload -> draft length -> points (k = 0 is no SD)."""
    out: dict[str, dict[float, list[Point]]] = defaultdict(lambda: defaultdict(list))
    for p, w in zip(points, labels, strict=True):
        out[w][float(round(p.draft_length, 6))].append(p)
    return out
