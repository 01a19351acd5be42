"""The interpretable speculative-decoding latency model (pure, vectorised numpy).

Every formula here is the one in the project's model reference (docs/model.md), with its
symbols: λ arrival rate, p/g mean prompt/generated tokens, k draft length, E mean acceptance
length (tokens committed per verify cycle, bonus token included), α the per-token acceptance
probability of the i.i.d. model.

Why closed forms: with the linear cost model L = C1 + B·C2 and Little's law B = λ·L, the
fixed point is L = C1 / (1 − λ·C2). Solving it exactly (instead of iterating on a batch
size) is what makes one million what-if points cost milliseconds, and it makes saturation
explicit: λ·C2 is the utilisation, and at 1 the queue grows without bound. Each system (with
SD, without SD) is solved at its own fixed point; the batch observed with SD is never reused
to price the no-SD counterfactual.

Every public function broadcasts over numpy arrays of its numeric arguments and never raises
on bad numbers: it returns NaN there with a `Reason` code, so one bad point in a sweep or one
target with missing inputs cannot poison the others. Latencies are never negative or
infinite: past saturation they are NaN with `Reason.SATURATED`.

Owns the input checks (`Reason`), one system's latency at its fixed point (dispatching to the
linear closed form, the saturation regime's fixed point or the MoE solver), both systems and
their speedup, the break-even entry point (closed forms in `breakeven`, the numeric scan for MoE
here) and the best draft length.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from specwatch.model import saturation as _saturation
from specwatch.model.acceptance import (
    E_TOLERANCE,
    acceptance_length_from_alpha,
    acceptance_length_from_profile,
    alpha_from_acceptance_length,
)
from specwatch.model.breakeven import (
    BreakEven,
    BreakEvenKind,
    breakeven_from_costs,
    breakeven_of,
    saturation_breakeven,
)
from specwatch.model.coefficients import ArrayLike, Coefficients, Model, MoECoefficients
from specwatch.model.costs import cost_terms, moe_cost_terms
from specwatch.model.moe import solve_moe_latency

__all__ = [
    "DEFAULT_K_MAX",
    "DEFAULT_MAX_UTILIZATION",
    "OptimalDraft",
    "Prediction",
    "Reason",
    "SystemLatency",
    # Imported from here by specwatch.model.whatif.common; its home is model.acceptance.
    "alpha_from_acceptance_length",
    "breakeven",
    "breakeven_arrival_rate",
    "latency",
    "optimal_draft_length",
    "predict",
    "reason_text",
    "speedup",
]

DEFAULT_MAX_UTILIZATION = 0.9
DEFAULT_K_MAX = 8
#: Largest draft length anything takes (a parameters file's k_max, a sweep, a flag).
MAX_DRAFT_LENGTH = 64
_E_TOLERANCE = E_TOLERANCE


class Reason(IntEnum):
    """Why a prediction is not valid (OK when it is). Lower values win when several apply."""

    OK = 0
    BAD_INPUT = 1  # negative or non-finite arrival rate, prompt or generation length
    BAD_DRAFT_LENGTH = 2  # k negative or non-finite
    ALPHA_OUT_OF_RANGE = 3  # α outside [0, 1)
    ACCEPTANCE_LENGTH_OUT_OF_RANGE = 4  # E outside [1, k + 1] (E must be 1 when k = 0)
    DEGENERATE = 5  # zero isolated latency (all load-independent costs are zero)
    SATURATED = 6  # λ·C2 ≥ 1: no stable operating point, the queue grows without bound
    NOT_CONVERGED = 7  # MoE solver did not reach its residual tolerance
    ABOVE_CEILING = 8  # below saturation but above the validity ceiling (default 0.9)


_REASON_TEXT = {
    Reason.OK: "ok",
    Reason.BAD_INPUT: "arrival rate, prompt and generation tokens must be finite and >= 0",
    Reason.BAD_DRAFT_LENGTH: "draft length must be a finite number >= 0",
    Reason.ALPHA_OUT_OF_RANGE: "alpha must lie in [0, 1)",
    Reason.ACCEPTANCE_LENGTH_OUT_OF_RANGE: (
        "acceptance length must lie in [1, k + 1] (exactly 1 when k = 0)"
    ),
    Reason.DEGENERATE: "isolated latency is zero: the coefficients price nothing",
    Reason.SATURATED: "arrival rate at or past saturation (utilisation >= 1)",
    Reason.NOT_CONVERGED: "mixture-of-experts fixed point did not converge",
    Reason.ABOVE_CEILING: "utilisation above the validity ceiling",
}


def reason_text(reason: int) -> str:
    """A one-line human explanation of a `Reason` code (for JSON `reason` fields and logs)."""
    return _REASON_TEXT[Reason(int(reason))]


def _dense(coef: Model) -> Coefficients:
    return coef.dense if isinstance(coef, MoECoefficients) else coef


# --------------------------------------------------------------------------- one system


@dataclass(frozen=True)
class SystemLatency:
    """Mean latency of one system (SD at k, or no SD) at its own fixed point (arrays).

    latency is finite wherever the system is below saturation (even above the validity
    ceiling, for calibration's use) and NaN otherwise; `valid` also requires utilisation <=
    the ceiling, and `reason` says why a point is not valid.
    """

    latency: np.ndarray
    utilization: np.ndarray
    valid: np.ndarray
    reason: np.ndarray


def _input_reason(
    lam: np.ndarray, kk: np.ndarray, ee: np.ndarray, pp: np.ndarray, gg: np.ndarray
) -> np.ndarray:
    """Reason codes for bad inputs, computed at each input's own shape (scalars stay cheap)
    and written in descending code order so the lowest applicable code wins."""
    shape = np.broadcast_shapes(lam.shape, kk.shape, ee.shape, pp.shape, gg.shape)
    with np.errstate(invalid="ignore"):
        bad_lam = ~(np.isfinite(lam) & (lam >= 0))
        bad_len = ~(np.isfinite(pp) & (pp >= 0) & np.isfinite(gg) & (gg >= 0))
        bad_k = ~(np.isfinite(kk) & (kk >= 0))
        # NaN/inf fail these comparisons, so non-finite E is out of range too.
        e_ok = (ee >= 1 - _E_TOLERANCE) & (ee <= kk + 1 + _E_TOLERANCE)
        e_ok &= (kk != 0) | (np.abs(ee - 1) <= _E_TOLERANCE)
    reason = np.zeros(shape, dtype=np.int8)
    np.copyto(reason, np.int8(Reason.ACCEPTANCE_LENGTH_OUT_OF_RANGE), where=~e_ok)
    np.copyto(reason, np.int8(Reason.BAD_DRAFT_LENGTH), where=bad_k)
    np.copyto(reason, np.int8(Reason.BAD_INPUT), where=bad_lam | bad_len)
    return reason


def _validate_ceiling(max_utilization: float) -> float:
    m = float(max_utilization)
    if not (0.0 < m <= 1.0):
        raise ValueError(f"max_utilization: expected a number in (0, 1], got {max_utilization}")
    return m


def latency(
    coef: Model,
    arrival_rate: ArrayLike,
    k: ArrayLike,
    e: ArrayLike,
    p: ArrayLike,
    g: ArrayLike,
    max_utilization: float = DEFAULT_MAX_UTILIZATION,
) -> SystemLatency:
    """L = C1 / (1 − λ·C2) for one system (k = 0, E = 1 is no SD); MoE via the φ solver.

    With saturation terms (`Coefficients.saturates`) the fixed point B = λ·L(B) of the
    roofline form is found by bracketed bisection (`specwatch.model.saturation`), and the
    utilisation is λ/λ_max, λ_max the system's throughput ceiling (λ·C2 in the linear case).
    """
    ceiling = _validate_ceiling(max_utilization)
    lam, kk, ee, pp, gg = (np.asarray(x, dtype=float) for x in (arrival_rate, k, e, p, g))
    reason = _input_reason(lam, kk, ee, pp, gg)
    ok = reason == Reason.OK
    all_ok = bool(ok.all())
    if not all_ok:
        # Evaluate on sanitised inputs so bad points cannot raise or warn; masked below.
        lam, pp, gg, kk = (np.where(ok, x, 0.0) for x in (lam, pp, gg, kk))
        ee = np.where(ok, np.clip(ee, 1.0, kk + 1.0), 1.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if isinstance(coef, MoECoefficients):
            c1u, c2u, c1s, c2s = moe_cost_terms(coef, kk, ee, pp, gg)
            sol = solve_moe_latency(coef, lam, kk + 1.0, c1u, c2u, c1s, c2s)
            util = np.broadcast_to(sol.utilization, reason.shape)
            lat = sol.latency
            saturated = sol.saturated
            not_conv = ~sol.converged & ~sol.saturated
            c1 = c1u
        else:
            c1, c2 = cost_terms(coef, kk, ee, pp, gg)
            if coef.saturates:
                lat, util, saturated = _saturation.fixed_point(
                    lam, c1, c2, gg / ee, kk, coef.c_v, coef.knee_v, coef.c_d, coef.knee_d,
                    coef.capacity(pp, gg, kk),
                )
                util = np.broadcast_to(util, reason.shape)
            else:
                util = np.broadcast_to(lam * c2, reason.shape)
                saturated = util >= 1.0
                lat = c1 / (1.0 - util)
            not_conv = None
    free = reason == Reason.OK
    np.copyto(reason, np.int8(Reason.ABOVE_CEILING), where=free & (util > ceiling))
    if not_conv is not None:
        np.copyto(reason, np.int8(Reason.NOT_CONVERGED), where=free & not_conv)
    np.copyto(reason, np.int8(Reason.SATURATED), where=free & saturated)
    np.copyto(reason, np.int8(Reason.DEGENERATE), where=free & (c1 <= 0))
    valid = reason == Reason.OK
    usable = valid | (reason == Reason.ABOVE_CEILING)
    return SystemLatency(
        latency=np.where(usable, lat, np.nan),
        utilization=util.copy() if all_ok else np.where(ok, util, np.nan),
        valid=valid,
        reason=reason,
    )


# --------------------------------------------------------------------------- both systems


def speedup(
    coef: Model, arrival_rate: ArrayLike, k: ArrayLike, e: ArrayLike, p: ArrayLike, g: ArrayLike
) -> np.ndarray:
    """S(λ) = L_D / L_SD, each system at its own fixed point; NaN where either saturates.

    For a dense model this equals (1/C1_R)·(1 + (1 − C2_R)·r/(1 − r)) with r = λ·C2_D.
    """
    sd = latency(coef, arrival_rate, k, e, p, g, max_utilization=1.0)
    nosd = latency(coef, arrival_rate, 0.0, 1.0, p, g, max_utilization=1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return nosd.latency / sd.latency


@dataclass(frozen=True)
class Prediction:
    """Everything `predict` knows about SD at one operating point (arrays).

    `speedup` is NaN unless both systems are below saturation. `valid` requires both systems
    below the validity ceiling; `reason` is the first problem found (SD system first).
    """

    sd: SystemLatency
    nosd: SystemLatency
    speedup: np.ndarray
    valid: np.ndarray
    reason: np.ndarray


def predict(
    coef: Model,
    arrival_rate: ArrayLike,
    k: ArrayLike,
    e: ArrayLike,
    p: ArrayLike,
    g: ArrayLike,
    max_utilization: float = DEFAULT_MAX_UTILIZATION,
) -> Prediction:
    """Latency with and without SD at arrival rate λ, and their ratio."""
    sd = latency(coef, arrival_rate, k, e, p, g, max_utilization)
    nosd = latency(coef, arrival_rate, 0.0, 1.0, p, g, max_utilization)
    sd_reason, nosd_reason = np.broadcast_arrays(sd.reason, nosd.reason)
    reason = np.where(sd_reason != Reason.OK, sd_reason, nosd_reason).astype(np.int8)
    # An input error in the shared inputs belongs to both; an SD-only error stays SD's.
    with np.errstate(invalid="ignore", divide="ignore"):
        s = nosd.latency / sd.latency
    return Prediction(sd=sd, nosd=nosd, speedup=s, valid=reason == Reason.OK, reason=reason)


def breakeven(
    coef: Model, k: ArrayLike, e: ArrayLike, p: ArrayLike, g: ArrayLike,
    scale_sd: float = 1.0, scale_nosd: float = 1.0,
) -> BreakEven:
    """Break-even arrival rate λ* = r*/C2_D, r* = (1 − C1_R)/(C2_R − C1_R), with its kind.

    Computed as λ* = (C1_D − C1_SD)/(C1_D·C2_SD − C1_SD·C2_D), the same value without the
    divisions by C1_D and C2_D (so a load-free system, C2_D = 0, still has a break-even), and
    kept only when it lies below saturation of both systems. The saturation regime has one
    closed form per linear piece of L(B) (`breakeven.saturation_breakeven`); MoE models have
    none: the crossing is found numerically along λ.

    `scale_sd` / `scale_nosd` multiply every cost of one system (its whole L(B)): the
    break-even of a fit whose SD latency is off by that factor and its no-SD latency by the
    other, which is how the interval on λ* is found (`model.uncertainty`). Dense models only.
    """
    scaled = scale_sd != 1.0 or scale_nosd != 1.0
    if isinstance(coef, MoECoefficients):
        if scaled:
            raise TypeError("breakeven: scale_sd/scale_nosd price a dense model")
        return _numeric_breakeven(coef, k, e, p, g)
    ok, s_k, s_e, s_p, s_g = _breakeven_inputs(k, e, p, g)
    if coef.saturates:
        return saturation_breakeven(coef, ok, s_k, s_e, s_p, s_g, scale_sd, scale_nosd)
    c1_sd, c2_sd = cost_terms(coef, s_k, s_e, s_p, s_g)
    c1_d, c2_d = cost_terms(coef, 0.0, 1.0, s_p, s_g)
    if scaled:
        c1_sd, c2_sd = c1_sd * scale_sd, c2_sd * scale_sd
        c1_d, c2_d = c1_d * scale_nosd, c2_d * scale_nosd
    found = breakeven_from_costs(c1_d, c2_d, c1_sd, c2_sd)
    kind = np.where(ok, found.kind, BreakEvenKind.UNDEFINED).astype(np.int8)
    return BreakEven(rate=np.where(ok, found.rate, np.nan), kind=kind)


def _breakeven_inputs(k: ArrayLike, e: ArrayLike, p: ArrayLike, g: ArrayLike
                      ) -> tuple[np.ndarray, ...]:
    """(ok, k, E, p, g) broadcast, with the points that fail the input checks replaced by a
    harmless no-SD point (so no solver divides by a bad input); ok marks the real ones."""
    kk, ee, pp, gg = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (k, e, p, g)))
    ok = _input_reason(np.zeros(kk.shape), kk, ee, pp, gg) == Reason.OK
    s_k = np.where(ok, kk, 0.0)
    s_e = np.where(ok, np.clip(ee, 1.0, s_k + 1.0), 1.0)
    return ok, s_k, s_e, np.where(ok, pp, 0.0), np.where(ok, gg, 0.0)



def breakeven_arrival_rate(
    coef: Model, k: ArrayLike, e: ArrayLike, p: ArrayLike, g: ArrayLike
) -> np.ndarray:
    """λ* alone: +inf when SD pays at every load below saturation, 0 when it never pays,
    NaN when undefined. Use `breakeven` to also learn on which side of λ* SD pays."""
    return breakeven(coef, k, e, p, g).rate


def _saturation_rate_bound(coef: Model, k: np.ndarray, e: np.ndarray, p: np.ndarray,
                           g: np.ndarray) -> np.ndarray:
    """An arrival rate no stable system reaches: 1/C2 of the dense (u) part, or the
    throughput ceiling λ_max of the saturation regime."""
    dense = _dense(coef)
    c1, c2 = cost_terms(dense, k, e, p, g)
    if dense.saturates:
        lam_max, _ = _saturation.ceiling(
            c1, c2, g / e, k, dense.c_v, dense.knee_v, dense.c_d, dense.knee_d,
            dense.capacity(p, g, k),
        )
        return lam_max
    with np.errstate(divide="ignore"):
        return np.where(c2 > 0, 1.0 / c2, np.inf)



def _numeric_breakeven(
    coef: MoECoefficients, k: ArrayLike, e: ArrayLike, p: ArrayLike, g: ArrayLike,
    grid: int = 48, bisections: int = 32,
) -> BreakEven:
    """First crossing of S(λ) = 1 along λ, by grid scan and bisection.

    For models without a closed-form break-even: MoE (φ depends on L) and the saturation
    regime (L(B) piecewise). The scan runs up to the lower of the two systems' ceilings.
    """
    checked = _breakeven_inputs(k, e, p, g)
    shape = checked[0].shape
    ok, s_k, s_e, s_p, s_g = (x.ravel() for x in checked)
    sd_ceiling = _saturation_rate_bound(coef, s_k, s_e, s_p, s_g)
    nosd_ceiling = _saturation_rate_bound(coef, np.zeros_like(s_k), np.ones_like(s_e), s_p, s_g)
    lam_hi = np.minimum(sd_ceiling, nosd_ceiling)
    # Load-free systems never saturate; their speedup is constant, so λ = 0 decides.
    lam_hi = np.where(np.isfinite(lam_hi), lam_hi, 0.0)
    s0 = speedup(coef, 0.0, s_k, s_e, s_p, s_g)
    frac = np.arange(1, grid + 1) / (grid + 1)
    lams = lam_hi[:, None] * frac[None, :]
    s_grid = speedup(coef, lams, s_k[:, None], s_e[:, None], s_p[:, None], s_g[:, None])
    above0 = s0 > 1
    flipped = np.where(above0[:, None], s_grid <= 1, s_grid > 1) & np.isfinite(s_grid)
    found = flipped.any(axis=1)
    first = np.argmax(flipped, axis=1)
    rows = np.arange(s_k.size)
    a = np.where(first > 0, lams[rows, np.maximum(first - 1, 0)], 0.0)
    b = lams[rows, first]
    for _ in range(bisections):
        mid = 0.5 * (a + b)
        s_mid = speedup(coef, mid, s_k, s_e, s_p, s_g)
        same = np.where(above0, s_mid > 1, s_mid <= 1)
        a = np.where(same, mid, a)
        b = np.where(same, b, mid)
    cross = 0.5 * (a + b)
    kind = np.where(
        found,
        np.where(above0, BreakEvenKind.PAYS_BELOW, BreakEvenKind.PAYS_ABOVE),
        np.where(above0, BreakEvenKind.PAYS_EVERYWHERE, BreakEvenKind.NEVER_PAYS),
    )
    # SD faster up to its own ceiling, which lies below no-SD's. The scan stops short of the
    # ceiling, and SD's latency may shoot up in that last stretch: bisect [last grid point,
    # SD ceiling] with a saturated SD counting as "SD loses". A finite S <= 1 at the end is a
    # crossing (PAYS_BELOW); otherwise S stays above 1 up to the ceiling: PAYS_TO_CEILING.
    capped = ~found & above0 & (sd_ceiling < nosd_ceiling)
    crossed = np.zeros_like(capped)
    if capped.any():
        a2 = np.where(capped, lams[:, -1], 0.0)
        b2 = np.where(capped, sd_ceiling, 0.0)
        for _ in range(bisections):
            mid = 0.5 * (a2 + b2)
            s_mid = speedup(coef, mid, s_k, s_e, s_p, s_g)
            pays = np.isfinite(s_mid) & (s_mid > 1)
            a2 = np.where(pays, mid, a2)
            b2 = np.where(pays, b2, mid)
        s_end = speedup(coef, b2, s_k, s_e, s_p, s_g)
        crossed = capped & np.isfinite(s_end) & (s_end <= 1)
        cross = np.where(crossed, 0.5 * (a2 + b2), cross)
    kind = np.where(crossed, BreakEvenKind.PAYS_BELOW,
                    np.where(capped, BreakEvenKind.PAYS_TO_CEILING, kind))
    kind = np.where(ok & np.isfinite(s0) & (s0 != 1), kind, BreakEvenKind.UNDEFINED)
    return breakeven_of(kind.reshape(shape), cross.reshape(shape))


# --------------------------------------------------------------------------- draft length


@dataclass(frozen=True)
class OptimalDraft:
    """Best draft length per point (arrays): k = 0 means SD off, -1 means no valid choice.

    latency/speedup are those of the chosen k (speedup 1 when k = 0); `candidates` holds the
    latency of every k = 0..k_max on the last axis (NaN where not valid) for tables and plots.
    """

    k: np.ndarray
    latency: np.ndarray
    speedup: np.ndarray
    valid: np.ndarray
    reason: np.ndarray
    candidates: np.ndarray
    draft_lengths: np.ndarray  # the k of each `candidates` column (0 first)


def optimal_draft_length(
    coef: Model,
    arrival_rate: ArrayLike,
    alpha: ArrayLike | None = None,
    p: ArrayLike = 0.0,
    g: ArrayLike = 0.0,
    k_max: int = DEFAULT_K_MAX,
    profile: ArrayLike | None = None,
    max_utilization: float = DEFAULT_MAX_UTILIZATION,
    draft_lengths: ArrayLike | None = None,
) -> OptimalDraft:
    """argmin over k in 0..k_max of L_SD(λ, k, E(k)), k = 0 being SD off.

    E(k) comes from the i.i.d. formula for α, or from a per-position acceptance profile
    (then k stops at len(profile): extrapolating it would be a guess). Only candidates
    within the validity ceiling compete; ties go to the smaller k (less work for the same
    latency). If no k is valid, k = -1 and `reason` says why (from the no-SD system). SD off
    is chosen only where no SD k is faster: where the best valid choice is no SD but an SD
    k past the ceiling (not saturated) is priced faster, k = -1 with `above ceiling`.
    `draft_lengths` restricts the candidates (k = 0 is always one), e.g. to the k a sweep
    draws.
    """
    if (alpha is None) == (profile is None):
        raise ValueError("optimal_draft_length: give exactly one of alpha or profile")
    if not (isinstance(k_max, (int, np.integer)) and k_max >= 0):
        raise ValueError(f"k_max: expected an integer >= 0, got {k_max!r}")
    if draft_lengths is None:
        ks = np.arange(int(k_max) + 1, dtype=float)
    else:
        chosen = np.unique(np.asarray(draft_lengths, dtype=int).ravel())
        if chosen.size and chosen.min() < 0:
            raise ValueError(f"draft_lengths: expected integers >= 0, got {chosen.tolist()}")
        ks = np.unique(np.concatenate([[0], chosen])).astype(float)
    if profile is not None:
        prof = np.asarray(profile, dtype=float).ravel()
        ks = ks[ks <= prof.size]
        es = acceptance_length_from_profile(prof, ks)
        lam, pp, gg = np.broadcast_arrays(
            *(np.asarray(x, dtype=float) for x in (arrival_rate, p, g))
        )
        alpha_bad = np.zeros(lam.shape, dtype=bool)
        e_grid = np.broadcast_to(es, (*lam.shape, ks.size))
    else:
        lam, pp, gg, aa = np.broadcast_arrays(
            *(np.asarray(x, dtype=float) for x in (arrival_rate, p, g, alpha))
        )
        alpha_bad = ~(np.isfinite(aa) & (aa >= 0) & (aa < 1))
        e_grid = acceptance_length_from_alpha(np.where(alpha_bad, 0.0, aa)[..., None], ks)
    cand = latency(
        coef, lam[..., None], ks, e_grid, pp[..., None], gg[..., None], max_utilization
    )
    lat = np.where(cand.valid, cand.latency, np.inf)
    best = np.argmin(lat, axis=-1)
    best_lat = np.take_along_axis(lat, best[..., None], axis=-1)[..., 0]
    any_valid = np.isfinite(best_lat)
    nosd_lat = cand.latency[..., 0]
    reason = np.where(any_valid, Reason.OK, cand.reason[..., 0]).astype(np.int8)
    # SD off only where no SD k is faster: an SD k past the validity ceiling (not saturated)
    # that the model prices below no SD makes the choice unvouched, not "off".
    faster_past_ceiling = np.any(
        (cand.reason[..., 1:] == Reason.ABOVE_CEILING)
        & (np.nan_to_num(cand.latency[..., 1:], nan=np.inf) < best_lat[..., None]), axis=-1)
    reason = np.where(any_valid & (best == 0) & faster_past_ceiling,
                      np.int8(Reason.ABOVE_CEILING), reason).astype(np.int8)
    reason = np.where(alpha_bad, np.int8(Reason.ALPHA_OUT_OF_RANGE), reason).astype(np.int8)
    valid = reason == Reason.OK
    with np.errstate(invalid="ignore", divide="ignore"):
        s = nosd_lat / best_lat
    return OptimalDraft(
        k=np.where(valid, ks.astype(int)[best], -1),
        latency=np.where(valid, best_lat, np.nan),
        speedup=np.where(valid & np.isfinite(s), s, np.nan),
        valid=valid,
        reason=reason,
        candidates=np.where(cand.valid, cand.latency, np.nan),
        draft_lengths=ks.astype(int),
    )
