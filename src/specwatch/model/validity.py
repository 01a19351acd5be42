"""Why a prediction cannot be trusted: named validity reasons (pure numpy).

The model's own `Reason` codes say what the formula cannot price (bad input, saturation, the
utilisation ceiling). A prediction can also be outside what the calibration supports: a load
above the highest measured one, or a draft length never measured. Those are not errors of
the formula but of its evidence, so they are judged here against the parameters file's
`calibrated_range` and reported with stable names, the same names the what-if `--json`
outputs (`validity_reasons`) and the exporter's `sd_model_valid{reason}` series use:

- ``saturated``: no fixed point below the throughput ceiling (or the capacity limit);
- ``above_utilization_ceiling``: below saturation but past the validity ceiling;
- ``beyond_calibrated_load``: λ, the batch in flight, or the tokens per verify step B·(k+1)
  (the knee's unit) more than the margin above the highest calibrated point (the parameters
  file records that range), or the batch in flight (either system) or its tokens per step
  more than the margin above the most a run with throughput headroom held: past a curve's
  top run the runs cannot tell whether a knee or the capacity lies just beyond (not where λ
  is below the top rate of a measured curve of the same k and lengths by more than the
  margin: the latency then lies between that curve's runs);
- ``extrapolated_k``: a draft length (other than 0) calibration never measured;
- ``sensitive``: the 90% latency interval (the fit's residual spread carried through the
  fixed point, `model.uncertainty`) is wider than the limit (default ±15%): near the ceiling
  the fixed point amplifies the fit's misfit past what the number can carry;
- ``no_calibrated_range``: the file records no calibrated range (written by hand or before
  calibration recorded one), so no load could be checked; it does not by itself make a
  prediction invalid (the file is the operator's own claim) but every output says so;
- ``uncertain``: the controller's: a switch whose predicted speedup interval straddles the
  hysteresis band is not taken;
- ``queueing``: live only: the server queues requests (waiting requests, KV cache full,
  preemptions), so the open-loop model does not describe what is measured;
- ``capacity_mismatch``: live only: the server states another capacity (KV cache,
  max_num_seqs) than the one the parameters file was calibrated with (`server_capacity`),
  so it is another configuration than the one the coefficients describe;
- ``invalid_input`` and ``not_converged`` for the rest of the model's codes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specwatch.model.ceilings import RATE_TOLERANCE, bracket
from specwatch.model.closed_form import Prediction, Reason, predict
from specwatch.model.coefficients import ArrayLike, MoECoefficients
from specwatch.model.observed import CalibratedRange
from specwatch.model.params import Params
from specwatch.model.uncertainty import Intervals, intervals

__all__ = [
    "ABOVE_CEILING",
    "BEYOND_CALIBRATED_LOAD",
    "CAPACITY_MISMATCH",
    "EXTRAPOLATED_K",
    "NO_CALIBRATED_RANGE",
    "QUEUEING",
    "SATURATED",
    "SENSITIVE",
    "UNCERTAIN",
    "Assessment",
    "assess",
    "figure_reasons",
    "model_reason_name",
    "range_reasons",
    "vouched",
]

SATURATED = "saturated"
ABOVE_CEILING = "above_utilization_ceiling"
BEYOND_CALIBRATED_LOAD = "beyond_calibrated_load"
EXTRAPOLATED_K = "extrapolated_k"
QUEUEING = "queueing"
SENSITIVE = "sensitive"
NO_CALIBRATED_RANGE = "no_calibrated_range"
UNCERTAIN = "uncertain"
CAPACITY_MISMATCH = "capacity_mismatch"

_MODEL_NAMES = {
    Reason.OK: "",
    Reason.BAD_INPUT: "invalid_input",
    Reason.BAD_DRAFT_LENGTH: "invalid_input",
    Reason.ALPHA_OUT_OF_RANGE: "invalid_input",
    Reason.ACCEPTANCE_LENGTH_OUT_OF_RANGE: "invalid_input",
    Reason.DEGENERATE: "invalid_input",
    Reason.SATURATED: SATURATED,
    Reason.NOT_CONVERGED: "not_converged",
    Reason.ABOVE_CEILING: ABOVE_CEILING,
}


def model_reason_name(code: int) -> str:
    """The stable name of a model `Reason` code ('' for OK)."""
    return _MODEL_NAMES[Reason(int(code))]


def range_reasons(
    calibrated: CalibratedRange | None,
    arrival_rate: float,
    in_flight: float | None,
    draft_length: float,
    prompt_tokens: float | None = None,
    generation_tokens: float | None = None,
) -> list[str]:
    """Reasons a point lies outside the calibrated range (empty when inside or unknown).

    `in_flight` is the batch B = λ·L the model predicts (None when it has no fixed point: the
    saturation reason covers that). A file without `calibrated_range` (written before it
    existed, or by hand) cannot be judged: no reason, and `--json` says `calibrated_range:
    null` so the caller sees that nothing was checked. With the mean lengths, a k between
    two k measured on that workload is not `extrapolated_k` (`ceilings.bracket`).
    """
    if calibrated is None:
        return []
    out: list[str] = []
    factor = 1.0 + calibrated.margin
    over_rate = arrival_rate > calibrated.max_arrival_rate * factor
    over_batch = (
        in_flight is not None
        and np.isfinite(in_flight)
        and in_flight > calibrated.max_in_flight * factor
    )
    over_tokens = (
        in_flight is not None
        and calibrated.max_tokens_per_step is not None
        and np.isfinite(in_flight)
        and in_flight * (float(draft_length) + 1.0) > calibrated.max_tokens_per_step * factor
    )
    held = calibrated.headroom_in_flight(float(draft_length))
    tokens = calibrated.headroom_tokens_per_step
    over_headroom = in_flight is not None and np.isfinite(in_flight) and (
        (held is not None and in_flight > held * factor)
        or (tokens is not None
            and in_flight * (float(draft_length) + 1.0) > tokens * factor))
    if over_rate or over_batch or over_tokens or over_headroom:
        out.append(BEYOND_CALIBRATED_LOAD)
    k = float(draft_length)
    between = prompt_tokens is not None and generation_tokens is not None and bool(
        bracket(calibrated, k, prompt_tokens, generation_tokens).interpolated)
    if k != 0 and not between and not any(abs(k - m) < 1e-9 for m in calibrated.draft_lengths):
        out.append(EXTRAPOLATED_K)
    return out


# --------------------------------------------------------------------------- one assessment


@dataclass(frozen=True)
class Assessment:
    """A prediction at arrival rates λ with everything that judges it (arrays, one shape).

    `prediction` is the model's (`closed_form.predict`); `intervals` the 90% intervals (None
    when the parameters file has no `uncertainty` block); `reasons` one list of names per
    point, in the order the rules apply (empty = valid); `valid` the points with none: the
    whole prediction (both systems, so the speedup and the choice) is vouched for.

    `reasons_sd` / `reasons_nosd` are the same rules applied to one system's latency alone
    (SD at its k, which is no SD at k = 0; no SD at the same λ): a latency is vouched for by
    its own system's evidence, so SD's latency at a load the no-SD runs never reached is
    valid while the speedup, which needs both, is not. `reasons` holds every name of either.
    """

    prediction: Prediction
    intervals: Intervals | None
    in_flight: np.ndarray
    reasons: list[list[str]]
    valid: np.ndarray
    reasons_sd: list[list[str]]
    reasons_nosd: list[list[str]]
    valid_sd: np.ndarray
    valid_nosd: np.ndarray

    def _flat(self, index: int | tuple[int, ...]) -> int:
        return index if isinstance(index, int) else int(np.ravel_multi_index(
            index, self.valid.shape))

    def names(self, index: int | tuple[int, ...] = 0) -> list[str]:
        """The reasons of one point (flat index), for the scalar callers."""
        return self.reasons[self._flat(index)]

    def names_sd(self, index: int | tuple[int, ...] = 0) -> list[str]:
        """The reasons of one point's SD latency alone (no SD's at k = 0)."""
        return self.reasons_sd[self._flat(index)]

    def names_nosd(self, index: int | tuple[int, ...] = 0) -> list[str]:
        """The reasons of one point's no-SD latency alone."""
        return self.reasons_nosd[self._flat(index)]


def _past_headroom(cal: CalibratedRange, in_flight: np.ndarray, in_flight_nosd: np.ndarray,
                   k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fixed points holding more requests in flight or more tokens per verify step than a
    run with throughput headroom did, by more than the margin: (SD at its k, no SD at the
    same λ). NaN batches, no fixed point, are the saturation rule's."""
    f = 1.0 + cal.margin
    sd = np.zeros(in_flight.shape, dtype=bool)
    nosd = np.zeros(in_flight.shape, dtype=bool)
    with np.errstate(invalid="ignore"):
        if cal.headroom_in_flight_sd is not None:
            sd |= (k != 0) & (in_flight > cal.headroom_in_flight_sd * f)
        if cal.headroom_in_flight_nosd is not None:
            held = cal.headroom_in_flight_nosd * f
            nosd |= in_flight_nosd > held
            sd |= (k == 0) & (in_flight > held)
        if cal.headroom_tokens_per_step is not None:
            tokens = cal.headroom_tokens_per_step * f
            sd |= in_flight * (k + 1.0) > tokens
            nosd |= in_flight_nosd > tokens
    return sd, nosd


def assess(
    params: Params,
    arrival_rate: ArrayLike,
    k: ArrayLike,
    e: ArrayLike,
    p: ArrayLike,
    g: ArrayLike,
    max_utilization: float | None = None,
    max_halfwidth: float | None = None,
) -> Assessment:
    """Predict both systems at λ and judge the prediction by every rule: the model's own
    codes (saturated, above the utilisation ceiling, ...), the calibrated range
    (`beyond_calibrated_load`, `extrapolated_k`; `saturated` at or past a measured ceiling
    of the same k and workload; `no_calibrated_range` when the file has
    none: nothing could be checked, the prediction keeps the model's verdict) and the
    interval (`sensitive` when the latency interval of either system is wider than
    ±`max_halfwidth`, default the file's `max_relative_halfwidth`).

    The one place predict, sweep, advise, the live series and calibration's user-path check
    judge a prediction, so they cannot disagree.
    """
    ceiling = params.max_utilization if max_utilization is None else float(max_utilization)
    coef = params.model()
    lam, kk, ee, pp, gg = np.broadcast_arrays(
        *(np.asarray(x, dtype=float) for x in (arrival_rate, k, e, p, g)))
    pred = predict(coef, lam, kk, ee, pp, gg, max_utilization=ceiling)
    sd_ok = pred.sd.valid
    with np.errstate(invalid="ignore"):
        in_flight = np.where(sd_ok, lam * pred.sd.latency, np.nan)
        in_flight_nosd = np.where(pred.nosd.valid, lam * pred.nosd.latency, np.nan)
    unc = params.uncertainty
    ivals = None
    wide_sd = np.zeros(lam.shape, dtype=bool)
    wide_nosd = np.zeros(lam.shape, dtype=bool)
    if unc is not None and not isinstance(coef, MoECoefficients):
        ivals = intervals(coef, unc, lam, kk, ee, pp, gg, pred.sd.latency, pred.nosd.latency,
                          pred.sd.utilization, pred.nosd.utilization)
        if params.calibrated_range is not None:
            between = bracket(params.calibrated_range, kk, pp, gg).interpolated
            if np.any(between):
                ivals = _widened(ivals, pred, between)
        limit = unc.max_relative_halfwidth if max_halfwidth is None else float(max_halfwidth)
        with np.errstate(invalid="ignore"):
            wide_sd = ivals.halfwidth > limit
            wide_nosd = ivals.halfwidth_nosd > limit
    cal = params.calibrated_range
    no = np.zeros(lam.shape, dtype=bool)
    beyond_sd, beyond_nosd, new_k, at_ceiling = no, no, no, no
    if cal is not None:
        beyond_sd, beyond_nosd, new_k, at_ceiling = _range_flags(
            cal, pred, lam, kk, pp, gg, in_flight, in_flight_nosd)
    reasons = _reason_names((pred.sd.reason, pred.nosd.reason), beyond_sd | beyond_nosd,
                            new_k, pred.valid & (wide_sd | wide_nosd), at_ceiling)
    reasons_sd = _reason_names((pred.sd.reason,), beyond_sd, new_k, pred.sd.valid & wide_sd,
                               at_ceiling)
    reasons_nosd = _reason_names((pred.nosd.reason,), beyond_nosd, no,
                                 pred.nosd.valid & wide_nosd, no)
    valid, valid_sd, valid_nosd = (np.array([not r for r in x], dtype=bool).reshape(lam.shape)
                                   for x in (reasons, reasons_sd, reasons_nosd))
    if cal is None:
        for r in (*reasons, *reasons_sd, *reasons_nosd):
            r.append(NO_CALIBRATED_RANGE)
    return Assessment(pred, ivals, in_flight, reasons, valid, reasons_sd, reasons_nosd,
                      valid_sd, valid_nosd)


#: An unmeasured k between two measured ones is judged by no run of its own: its error is
#: that of the fit at either neighbour's curve and the difference the model draws between
#: them, two independent misfits of the same spread, so its interval is √2 times as wide.
INTERPOLATION_WIDENING = float(np.sqrt(2.0))


def _widened(iv: Intervals, pred: Prediction, where: np.ndarray) -> Intervals:
    """The SD latency's and the speedup's intervals widened by INTERPOLATION_WIDENING
    around their point values where `where` (an interpolated k)."""
    w = np.where(where, INTERPOLATION_WIDENING, 1.0)
    point = pred.sd.latency
    with np.errstate(invalid="ignore", divide="ignore"):
        s = pred.nosd.latency / point
        lo, hi = iv.latency_sd
        s_lo, s_hi = iv.speedup
        return Intervals(
            latency_sd=(np.maximum(point - w * (point - lo), 0.0), point + w * (hi - point)),
            latency_nosd=iv.latency_nosd,
            speedup=(np.maximum(s - w * (s - s_lo), 0.0), s + w * (s_hi - s)),
            halfwidth=iv.halfwidth * w, halfwidth_nosd=iv.halfwidth_nosd)


def _range_flags(cal: CalibratedRange, pred: Prediction, lam: np.ndarray, kk: np.ndarray,
                 pp: np.ndarray, gg: np.ndarray, in_flight: np.ndarray,
                 in_flight_nosd: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(beyond the calibrated load: SD at its k, no SD at the same λ; a k never measured;
    at or past a measured ceiling)."""
    sd_ok = pred.sd.valid
    f = 1.0 + cal.margin
    with np.errstate(invalid="ignore"):
        over_rate = lam > cal.max_arrival_rate * f
        beyond_sd = over_rate | (sd_ok & (in_flight > cal.max_in_flight * f))
        beyond_nosd = over_rate.copy()
        if cal.max_tokens_per_step is not None:
            beyond_sd |= sd_ok & (in_flight * (kk + 1.0) > cal.max_tokens_per_step * f)
        if cal.max_utilization_seen is not None:
            top = cal.max_utilization_seen * f
            beyond_sd |= pred.sd.utilization > top
            beyond_nosd |= pred.nosd.utilization > top
        past_sd, past_nosd = _past_headroom(cal, in_flight, in_flight_nosd, kk)
        # Clearly below the top rate a curve of the same k and lengths was served at (or the
        # lower top of the two measured k an unmeasured k lies between), the latency lies
        # between that curve's runs: no knee or capacity can be just beyond. At or below a
        # top run that was still on its rising branch, that run itself shows the headroom.
        sd, nosd = bracket(cal, kk, pp, gg), bracket(cal, 0.0, pp, gg)
        at_or_below = 1.0 + RATE_TOLERANCE
        past_sd &= (lam * f > sd.top) & (lam > sd.rising_top * at_or_below)
        past_nosd &= (lam * f > nosd.top) & (lam > nosd.rising_top * at_or_below)
    measured = np.array(cal.draft_lengths, dtype=float)
    new_k = (kk != 0) & ~np.any(np.abs(kk[..., None] - measured) < 1e-9, axis=-1) \
        & ~sd.interpolated
    at_ceiling = lam >= sd.ceiling
    return beyond_sd | past_sd, beyond_nosd | past_nosd, new_k, at_ceiling


def _reason_names(codes: tuple[np.ndarray, ...], beyond: np.ndarray, new_k: np.ndarray,
                  sensitive: np.ndarray, at_ceiling: np.ndarray) -> list[list[str]]:
    """Each point's reasons, in order: the model's codes (SD system first), `saturated` at
    a measured ceiling, the calibrated range's, and `sensitive` only when nothing else."""
    flat = [x.ravel() for x in (beyond, new_k, sensitive, at_ceiling)]
    flat_codes = [np.broadcast_to(c, beyond.shape).ravel() for c in codes]
    reasons: list[list[str]] = []
    for i, (b, n, s, c) in enumerate(zip(*flat, strict=True)):
        names: list[str] = []
        for code in (x[i] for x in flat_codes):
            name = model_reason_name(int(code))
            if name and name not in names:
                names.append(name)
        if c and SATURATED not in names:
            names.insert(0, SATURATED)
        if b:
            names.append(BEYOND_CALIBRATED_LOAD)
        if n:
            names.append(EXTRAPOLATED_K)
        if s and not names:
            names.append(SENSITIVE)
        reasons.append(names)
    return reasons


def vouched(params: Params, arrival_rate: ArrayLike, k: ArrayLike, e: ArrayLike, p: ArrayLike,
            g: ArrayLike, max_utilization: float | None = None,
            max_halfwidth: float | None = None) -> np.ndarray:
    """Whether a chosen draft length (k = 0: SD off; -1: no choice) is vouched for at each λ:
    its prediction passes every rule of `assess`. The best k and the static k a what-if
    command recommends are shown only where this holds, so a recommendation never points at
    a prediction the same command declines (a `sensitive` column, say).

    An SD k whose own latency is vouched for, at a load past every no-SD run (no SD's
    latency there only `beyond_calibrated_load`), is vouched for as the choice when SD is
    faster than no SD was at the top of its own measured curve: latency grows with load, so
    no SD at λ is slower still (`_faster_than_nosd_at_its_top`)."""
    kk = np.asarray(k, dtype=float)
    chosen = kk >= 0
    judged = assess(params, arrival_rate, np.where(chosen, kk, 0.0),
                    np.where(kk > 0, e, 1.0), p, g, max_utilization=max_utilization,
                    max_halfwidth=max_halfwidth)
    ok = judged.valid & chosen
    only_nosd_beyond = np.array([r == [BEYOND_CALIBRATED_LOAD] for r in judged.reasons_nosd],
                                dtype=bool).reshape(ok.shape)
    open_ = ~ok & (kk > 0) & judged.valid_sd & only_nosd_beyond
    if np.any(open_):
        ok = ok | (open_ & _faster_than_nosd_at_its_top(
            params, judged, arrival_rate, p, g, max_utilization, max_halfwidth))
    return ok


def _faster_than_nosd_at_its_top(params: Params, judged: Assessment, arrival_rate: ArrayLike,
                                 p: ArrayLike, g: ArrayLike, max_utilization: float | None,
                                 max_halfwidth: float | None) -> np.ndarray:
    """Where SD's latency (the upper end of its interval) lies below no SD's (the lower end)
    at the top rate of no SD's measured curve of the same workload, that top is below λ, and
    no SD's latency there is vouched for."""
    cal = params.calibrated_range
    shape = judged.valid.shape
    if cal is None:
        return np.zeros(shape, dtype=bool)
    lam, pp, gg = (np.broadcast_to(np.asarray(x, dtype=float), shape) for x in
                   (arrival_rate, p, g))
    top = bracket(cal, 0.0, pp, gg).top
    at_top = assess(params, np.where(top > 0, top, 0.0), 0.0, 1.0, pp, gg,
                    max_utilization=max_utilization, max_halfwidth=max_halfwidth)
    sd_hi = judged.prediction.sd.latency
    nosd_lo = at_top.prediction.sd.latency
    if judged.intervals is not None and at_top.intervals is not None:
        sd_hi = judged.intervals.latency_sd[1]
        nosd_lo = at_top.intervals.latency_sd[0]
    with np.errstate(invalid="ignore"):
        return (top > 0) & (top < lam) & at_top.valid_sd & (sd_hi < nosd_lo)


def figure_reasons(params: Params, rate: float | None, k: float, e: float, p: float, g: float,
                   at_ceiling: bool = False) -> list[str]:
    """Why a break-even or ceiling rate (req/s) lies outside the calibrated range: the range
    reasons (`beyond_calibrated_load`, `extrapolated_k`) `predict` gives at that rate, for
    both systems at a break-even (`assess`). At a ceiling no fixed point exists, so only the
    rate and the draft length are judged. Empty for no rate or a file without a range."""
    cal = params.calibrated_range
    if rate is None or not np.isfinite(rate) or cal is None:
        return []
    if at_ceiling:
        return range_reasons(cal, rate, None, k, p, g)
    names = assess(params, rate, k, e, p, g, max_utilization=1.0).names()
    return [n for n in names if n in (BEYOND_CALIBRATED_LOAD, EXTRAPOLATED_K)]
