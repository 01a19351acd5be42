"""The best draft length a command may show, and on what basis (pure numpy).

The model's optimum k* (`closed_form.optimal_draft_length`, the fastest candidate within the
utilisation ceiling) is a prediction like any other: it is shown only where that prediction
is vouched for (`validity.vouched`). Where it is not, the best vouched candidate may stand in
for it, when the numbers cannot tell the two apart:

- k* vouched for: k* (``model_optimum``);
- else the vouched candidate k with the highest predicted speedup (the lowest latency; ties
  to the smaller k), provided k*'s predicted gain over k lies inside the uncertainty of that
  gain: k*'s speedup over k, L(k)/L(k*), has an interval holding 1 when taken as `predict`
  takes a speedup's interval (the two latencies' 90% intervals at opposite ends: the
  `latency_interval` `predict` prints at each k, `validity.assess`'s `intervals.latency_sd`,
  widened for an interpolated k). That is, the two intervals overlap, L_lo(k) <= L_hi(k*):
  some latency lies inside both, so choosing k costs nothing the numbers can resolve
  (``best_vouched``). In gain units: L(k)/L(k*) − 1 is at most the `allowance`
  (L(k)/L_lo(k))·(L_hi(k*)/L(k*)) − 1;
- else no best k: no candidate is vouched for, the gain is larger than that, the file has no
  `uncertainty` block (no interval to judge it by), or the model has no optimum at all
  (k* = −1: every candidate is past the ceiling, or the fastest one is).

`predict`, `sweep`, `advise`, the live `sd_optimal_draft_length` series and the controller
take their best k from :func:`best_draft_length` alone (docs/model.md, "Best k").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specwatch.model import validity
from specwatch.model.acceptance import (
    acceptance_length_from_alpha,
    acceptance_length_from_profile,
)
from specwatch.model.closed_form import OptimalDraft, optimal_draft_length
from specwatch.model.coefficients import ArrayLike
from specwatch.model.params import Params

__all__ = ["BEST_VOUCHED", "MODEL_OPTIMUM", "BestDraft", "best_draft_length"]

#: The model's optimum, its own prediction vouched for.
MODEL_OPTIMUM = "model_optimum"
#: The best vouched k, the unvouched optimum's gain over it inside the two 90% intervals.
BEST_VOUCHED = "best_vouched"


@dataclass(frozen=True)
class BestDraft:
    """The best k at each λ (arrays of one shape) and the evidence behind it.

    `k` is the k to show (−1: none), `speedup` its predicted speedup (NaN: none), `basis`
    MODEL_OPTIMUM, BEST_VOUCHED or '' (none). `optimum` is the model's own, unguarded
    (`optimal_draft_length`); `optimum_reasons` why its prediction is not vouched for
    (empty where it is, or where it has none). Where k* is not vouched for and some
    candidate is, `vouched_k` is the best such candidate, `gain` k*'s predicted speedup over
    it minus 1 and `allowance` the largest gain the two 90% latency intervals admit (where
    they just touch; NaN without intervals, +inf where k*'s has no upper end); elsewhere −1
    and NaN.
    """

    k: np.ndarray
    speedup: np.ndarray
    basis: np.ndarray
    optimum: OptimalDraft
    optimum_reasons: np.ndarray
    vouched_k: np.ndarray
    gain: np.ndarray
    allowance: np.ndarray

    @property
    def shown(self) -> np.ndarray:
        """Where a best k is shown."""
        return self.k >= 0

    def note(self, index: int | tuple[int, ...] = ()) -> str | None:
        """Why the best k at one point is what it is, in words (None: the model's optimum,
        vouched for; or no optimum at all, which the caller says in its own words)."""
        k_opt = int(self.optimum.k[index])
        if k_opt < 0 or self.basis[index] == MODEL_OPTIMUM:
            return None
        why = ", ".join(self.optimum_reasons[index]) or "not vouched for"
        kv = int(self.vouched_k[index])
        if kv < 0:
            return (f"no best k: the model's optimum k = {k_opt} is not vouched for ({why}) "
                    "and no other draft length is")
        gain, allow = float(self.gain[index]), float(self.allowance[index])
        if self.basis[index] == BEST_VOUCHED:
            return (f"best vouched k: the model's optimum k = {k_opt} ({why}) is predicted "
                    f"{gain:.2%} faster, within the two 90% latency intervals (they overlap "
                    f"up to a gain of {allow:.2%})")
        if not np.isfinite(allow):
            return (f"no best k: the model's optimum k = {k_opt} is not vouched for ({why}); "
                    f"the best vouched k = {kv} is {gain:.2%} slower and the parameters file "
                    "has no interval to judge that by")
        return (f"no best k: the model's optimum k = {k_opt} is not vouched for ({why}) and "
                f"is predicted {gain:.2%} faster than the best vouched k = {kv}, more than "
                f"the two 90% latency intervals admit ({allow:.2%})")


def _lengths(ks: np.ndarray, alpha: np.ndarray | None,
             profile: np.ndarray | None) -> np.ndarray:
    """E(k) of each candidate (last axis) at each point (alpha's shape)."""
    if profile is not None:
        return acceptance_length_from_profile(profile, ks)
    assert alpha is not None
    return acceptance_length_from_alpha(alpha[..., None], ks)


@dataclass(frozen=True)
class _Points:
    """One call's points, flattened: λ, p, g per point, E per point and candidate k."""

    params: Params
    lam: np.ndarray
    p: np.ndarray
    g: np.ndarray
    ks: np.ndarray
    e: np.ndarray
    ceiling: float
    limit: float | None

    def assess(self, rows: np.ndarray, k: np.ndarray, e: np.ndarray) -> validity.Assessment:
        return validity.assess(self.params, self.lam[rows], k, e, self.p[rows], self.g[rows],
                               max_utilization=self.ceiling, max_halfwidth=self.limit)

    def vouched(self, rows: np.ndarray | slice, k: np.ndarray, e: np.ndarray) -> np.ndarray:
        return validity.vouched(self.params, self.lam[rows], k, e, self.p[rows],
                                self.g[rows], max_utilization=self.ceiling,
                                max_halfwidth=self.limit)


@dataclass(frozen=True)
class _StandIns:
    """At the points `rows` whose optimum is not vouched for: why, and at the subset `r`
    with a vouched candidate, that candidate, its latency, the gain and the allowance."""

    reasons: list[list[str]]
    r: np.ndarray
    k: np.ndarray
    latency: np.ndarray
    gain: np.ndarray
    allowance: np.ndarray


def _stand_ins(pts: _Points, opt: OptimalDraft, rows: np.ndarray, k_opt: np.ndarray,
               e_opt: np.ndarray) -> _StandIns:
    """The best vouched candidate at each of `rows` and how much faster the optimum is."""
    judged_opt = pts.assess(rows, k_opt, e_opt)
    cand = opt.candidates.reshape(pts.lam.size, pts.ks.size)[rows]
    fit = np.isfinite(cand) & pts.vouched(rows[:, None], pts.ks[None, :], pts.e[rows])
    j = np.argmin(np.where(fit, cand, np.inf), axis=1)  # ties: the smaller k
    some = fit.any(axis=1)
    r, j = rows[some], j[some]
    kv = pts.ks[j]
    judged = pts.assess(r, kv, pts.e[r, j])
    lat_v = judged.prediction.sd.latency
    lat_o = judged_opt.prediction.sd.latency[some]
    nan = np.full(r.shape, np.nan)
    lo = judged.intervals.latency_sd[0] if judged.intervals is not None else nan
    hi = judged_opt.intervals.latency_sd[1][some] if judged_opt.intervals is not None else nan
    with np.errstate(invalid="ignore", divide="ignore"):
        gain = lat_v / lat_o - 1.0
        # The gain at which k's interval (its lower end) and k*'s (its upper end) touch.
        allowance = np.where((lo == 0) | np.isposinf(hi), np.inf,
                             (lat_v / lo) * (hi / lat_o) - 1.0)
    return _StandIns(judged_opt.reasons, r, kv.astype(int), lat_v, gain, allowance)


def best_draft_length(
    params: Params,
    arrival_rate: ArrayLike,
    p: ArrayLike,
    g: ArrayLike,
    *,
    alpha: ArrayLike | None = None,
    profile: ArrayLike | None = None,
    k_max: int | None = None,
    draft_lengths: ArrayLike | None = None,
    max_utilization: float | None = None,
    max_halfwidth: float | None = None,
) -> BestDraft:
    """The best k at each arrival rate by the module's rule (vectorised over λ).

    The candidates are `optimal_draft_length`'s (k = 0 … k_max, or 0 and `draft_lengths`;
    a profile stops at its length); `max_utilization` and `max_halfwidth` default to the
    file's, as in `validity.assess`.
    """
    ceiling = params.max_utilization if max_utilization is None else float(max_utilization)
    opt = optimal_draft_length(params.model(), arrival_rate, alpha=alpha, p=p, g=g,
                               k_max=params.k_max if k_max is None else k_max,
                               profile=profile, max_utilization=ceiling,
                               draft_lengths=draft_lengths)
    shape = opt.k.shape
    lam, pp, gg = (np.broadcast_to(np.asarray(x, dtype=float), shape).ravel()
                   for x in (arrival_rate, p, g))
    ks = opt.draft_lengths.astype(float)
    aa = None
    if alpha is not None:
        aa = np.broadcast_to(np.asarray(alpha, dtype=float), shape).ravel()
        aa = np.where(np.isfinite(aa) & (aa >= 0) & (aa < 1), aa, 0.0)
    prof = None if profile is None else np.asarray(profile, dtype=float).ravel()
    pts = _Points(params, lam, pp, gg, ks,
                  np.broadcast_to(_lengths(ks, aa, prof), (lam.size, ks.size)), ceiling,
                  max_halfwidth)
    k_opt = opt.k.ravel()
    e_opt = pts.e[np.arange(lam.size), np.searchsorted(ks, np.maximum(k_opt, 0))]
    ok = opt.valid.ravel() & pts.vouched(slice(None), k_opt, e_opt)
    k = np.where(ok, k_opt, -1)
    s = np.where(ok, opt.speedup.ravel(), np.nan)
    basis = np.where(ok, MODEL_OPTIMUM, "").astype(object)
    reasons = np.empty(lam.size, dtype=object)
    for i in range(lam.size):
        reasons[i] = ()
    vouched_k = np.full(lam.size, -1)
    gain = np.full(lam.size, np.nan)
    allowance = np.full(lam.size, np.nan)
    rows = np.flatnonzero(opt.valid.ravel() & ~ok)
    if rows.size:
        st = _stand_ins(pts, opt, rows, k_opt[rows], e_opt[rows])
        for i, names in zip(rows, st.reasons, strict=True):
            reasons[i] = tuple(names)
        vouched_k[st.r], gain[st.r], allowance[st.r] = st.k, st.gain, st.allowance
        within = st.gain <= st.allowance  # NaN (no interval) is False
        take = st.r[within]
        k[take] = st.k[within]
        with np.errstate(invalid="ignore", divide="ignore"):
            s[take] = opt.candidates.reshape(lam.size, ks.size)[take, 0] / st.latency[within]
        basis[take] = BEST_VOUCHED
    return BestDraft(k=k.reshape(shape), speedup=s.reshape(shape), basis=basis.reshape(shape),
                     optimum=opt, optimum_reasons=reasons.reshape(shape),
                     vouched_k=vouched_k.reshape(shape), gain=gain.reshape(shape),
                     allowance=allowance.reshape(shape))
