"""Calibration from a reference parameters file and a few points of a deployment's own
traffic (`specwatch calibrate DATA --reference PARAMS`; docs/model.md, "Calibrating from a
reference").

The reference gives the form's shapes: batch dependence, knees, the saturation slopes, the
k-dependence of the drafter's cost. The points give time scales: each fitted factor
multiplies one group of the reference's costs (`GROUPS`). The reduced form starts from what
the points can identify at all (no-SD points: the verifier; SD points: the drafter; SD
points alone: one common factor) and splits a component into its load-independent and
per-request parts only where the points show it (an F-test of the split at
`SPLIT_SIGNIFICANCE`, with at least two points to spare).

The intervals add, per utilisation band, the reference's own spread, the points' residual
spread (with the Student-t quantile of their few degrees of freedom) and, where the file
speaks for draft lengths the points did not run, the reference's leave-one-k-out error.
The file is valid where both vouch: the load the points measured (their arrival rates,
curve tops, headroom) within the reference's range of requests in flight, tokens per step
and utilisation. May import `specwatch.model`, `specwatch.common` and the calibrate modules
below the workflow (scipy lazily, from the ``analysis`` extra).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specwatch import __version__, model
from specwatch.calibrate import evidence
from specwatch.calibrate.inputs import Point
from specwatch.calibrate.saturation import point_arrays, stated_capacity
from specwatch.calibrate.summaries import acceptance_profile
from specwatch.common.errors import ConfigError
from specwatch.model.coefficients import Coefficients
from specwatch.model.observed import CalibratedRange
from specwatch.model.params import Params, params_from_mapping
from specwatch.model.uncertainty import Band, Uncertainty

__all__ = ["DRIFT_LARGE", "GROUPS", "MIN_POINTS", "ReferenceFit", "fit_from_reference"]

#: The reference's costs each factor multiplies.
GROUPS: dict[str, tuple[str, ...]] = {
    "common": ("a_p", "b_p", "a_v", "b_v", "b_v_context", "c_v", "a_d", "b_d", "c_d"),
    "verifier": ("a_p", "b_p", "a_v", "b_v", "b_v_context", "c_v"),
    "verifier_fixed": ("a_p", "a_v"),
    "verifier_load": ("b_p", "b_v", "b_v_context", "c_v"),
    "drafter": ("a_d", "b_d", "c_d"),
    "drafter_fixed": ("a_d",),
    "drafter_load": ("b_d", "c_d"),
}
MEANINGS = {
    "common": "every cost of the reference (verifier and drafter alike)",
    "verifier": "the verifier's costs: prefill, verify step, its batch dependence and knee slope",
    "verifier_fixed": "the verifier's load-independent costs (a_p, a_v)",
    "verifier_load": "the verifier's costs per request in flight (b_p, b_v, b_v_context, c_v)",
    "drafter": "the drafter's costs per draft token (a_d, b_d, c_d)",
    "drafter_fixed": "the drafter's load-independent cost per draft token (a_d)",
    "drafter_load": "the drafter's cost per draft token and request in flight (b_d, c_d)",
}
_SPLITS = {"verifier": ("verifier_fixed", "verifier_load"),
           "drafter": ("drafter_fixed", "drafter_load")}

#: Fewest points a reduced fit takes: two factors and two to spare for their spread.
MIN_POINTS = 4
#: A component is split into its fixed and per-request parts when the split lowers the
#: residual sum of squares by more than chance would at this level (F-test, one parameter).
SPLIT_SIGNIFICANCE = 0.05
#: A reference whose predictions are off by more than this (median over the points, at each
#: point's measured batch in flight) is reported as a large drift.
DRIFT_LARGE = 0.15
#: RMS / mean absolute error of a normal error: turns the reference's recorded
#: leave-one-k-out MAPE into the σ of the error at a draft length it did not see.
_MAPE_TO_RMS = math.sqrt(math.pi / 2.0)


@dataclass
class ReferenceFit:
    """One reduced fit: the factors, the drift before fitting, and the parameters file."""

    system: str
    reference: Params
    reference_file: str
    points: list[Point]
    excluded: list[tuple[Point, str]]
    factors: dict[str, tuple[float, float | None]]  # name -> (value, standard error)
    residual_rms: float
    drift: dict[str, Any]
    sigma_points: float
    sigma_transfer: float
    params: Params
    notes: list[str] = field(default_factory=list)
    user_path: dict[str, Any] = field(default_factory=dict)

    @property
    def form(self) -> str:
        """The reduced form's name: the reference scaled by these factors."""
        return "scaled_reference(" + ", ".join(self.factors) + ")"

    def to_json(self) -> dict[str, Any]:
        return {
            "reference": {"file": self.reference_file, "system": self.reference.system},
            "form": self.form,
            "factors": {n: {"value": v, "standard_error": se, "meaning": MEANINGS[n]}
                        for n, (v, se) in self.factors.items()},
            "n_points": len(self.points),
            "excluded": [{"source": p.source, "reason": why} for p, why in self.excluded],
            "residual_rms": self.residual_rms,
            "drift": self.drift,
            "interval_sigma": {"points": self.sigma_points, "transfer": self.sigma_transfer},
            "calibrated_range": (self.params.calibrated_range.to_mapping()
                                 if self.params.calibrated_range else None),
            "user_path": self.user_path,
            "notes": self.notes,
        }


# --------------------------------------------------------------------------- checks


def check_reference(ref: Params, source: str) -> None:
    """A reference must carry what a reduced fit takes from it: a dense form, its
    calibrated range and its residual spread (what `specwatch calibrate` writes)."""
    if ref.moe is not None:
        raise ConfigError(f"--reference {source}: an MoE parameters file cannot be a reference"
                          " (the reduced fit scales a dense form); calibrate from a full sweep")
    for name, value in (("calibrated_range", ref.calibrated_range),
                        ("uncertainty", ref.uncertainty)):
        if value is None:
            raise ConfigError(f"--reference {source}: no `{name}` block; a reference must be a"
                              " parameters file `specwatch calibrate` wrote from measured runs")


def _usable(points: Sequence[Point], ref: Params, source: str
            ) -> tuple[list[Point], list[tuple[Point, str]]]:
    """The points the reference covers; bad points and mismatched k are one-line errors."""
    cal = ref.calibrated_range
    assert cal is not None
    ks = [k for k in cal.draft_lengths if k > 0]
    kept: list[Point] = []
    out: list[tuple[Point, str]] = []
    f = 1.0 + cal.margin
    for p in points:
        if p.generation_tokens is None or (p.sd and p.acceptance_length is None):
            raise ConfigError(f"{p.source}: no mean generation tokens or acceptance length;"
                              " a fit from a reference needs both for every SD point")
        if p.sd and not (ks and min(ks) <= p.draft_length <= max(ks)):
            raise ConfigError(
                f"{p.source}: draft length k={p.draft_length:g}, but the reference {source}"
                f" was calibrated at k = {', '.join(str(k) for k in cal.draft_lengths)}; use a"
                " reference that covers this k, or run a full calibration")
        if p.in_flight > cal.max_in_flight * f or (
                cal.max_tokens_per_step is not None
                and p.in_flight * (p.draft_length + 1.0) > cal.max_tokens_per_step * f):
            out.append((p, f"{p.in_flight:.1f} requests in flight, past the reference's range"
                           f" ({cal.max_in_flight:g} in flight,"
                           f" {cal.max_tokens_per_step} tokens per step)"))
        else:
            kept.append(p)
    if len(kept) < MIN_POINTS:
        why = f" ({len(out)} outside the reference's load range)" if out else ""
        raise ConfigError(
            f"--reference {source}: {len(kept)} usable point(s){why}; a fit from a reference"
            f" needs at least {MIN_POINTS} (for example k = 0 and your k at two loads each)")
    return kept, out


# --------------------------------------------------------------------------- the fit


def _only(coef: Coefficients, group: str) -> Coefficients:
    """The reference's coefficients with every cost outside `group` set to 0."""
    keep = set(GROUPS[group])
    return dataclasses.replace(coef, **{n: (getattr(coef, n) if n in keep else 0.0)
                                        for n in GROUPS["common"]})


def _scaled(coef: Coefficients, factors: dict[str, float]) -> Coefficients:
    changes: dict[str, float] = {}
    for name, s in factors.items():
        for n in GROUPS[name]:
            changes[n] = getattr(coef, n) * s
    return dataclasses.replace(coef, **changes)


def _batch(coef: Coefficients, points: Sequence[Point]) -> np.ndarray:
    b, k, e, p, g = point_arrays(points)
    return np.asarray(model.batch_latency(coef, b, k, e, p, g), dtype=float)


@dataclass(frozen=True)
class _Solution:
    names: tuple[str, ...]
    values: np.ndarray
    ssr: float
    cov: np.ndarray | None


def _solve(columns: dict[str, np.ndarray], names: tuple[str, ...]) -> _Solution:
    """Non-negative least squares of the relative residuals L_i(factors)/L_i − 1."""
    from scipy.optimize import nnls

    x = np.column_stack([columns[n] for n in names])
    values, _ = nnls(x, np.ones(x.shape[0]))
    res = x @ values - 1.0
    ssr = float(res @ res)
    dof = x.shape[0] - len(names)
    cov = None
    if dof > 0 and np.linalg.matrix_rank(x) == len(names):
        cov = ssr / dof * np.linalg.inv(x.T @ x)
    return _Solution(names, values, ssr, cov)


def _reduced_form(columns: dict[str, np.ndarray], base: tuple[str, ...], n: int) -> _Solution:
    """The base factors, each component split into fixed and per-request parts where the
    points show it (F-test; two points to spare; every factor positive)."""
    from scipy import stats

    best = _solve(columns, base)
    while True:
        trials = []
        for name in best.names:
            if name not in _SPLITS:
                continue
            names = tuple(x for m in best.names for x in (_SPLITS[m] if m == name else (m,)))
            dof = n - len(names)
            if dof < 2:
                continue
            trial = _solve(columns, names)
            if not np.all(trial.values > 0) or trial.ssr >= best.ssr:
                continue
            f_stat = (best.ssr - trial.ssr) / max(trial.ssr / dof, 1e-300)
            trials.append((float(stats.f.sf(f_stat, 1, dof)), trial))
        chosen = min(trials, key=lambda t: t[0], default=None)
        if chosen is None or chosen[0] >= SPLIT_SIGNIFICANCE:
            return best
        best = chosen[1]


def _drift(ref: Params, points: Sequence[Point]) -> dict[str, Any]:
    """How far the reference, unfitted, is from the points: at each point's measured batch
    in flight (over all points, and for the points without and with SD apart: the verifier's
    and the drafter's share), and through `predict` at its arrival rate where the reference
    has a number there."""
    from specwatch.model import validity

    measured = np.array([p.latency_s for p in points], dtype=float)
    batch = _batch(ref.coefficients, points) / measured - 1.0
    lam, k, e, p, g = point_arrays(points, "arrival_rate")
    user = validity.assess(ref, lam, k, e, p, g).prediction.sd.latency / measured - 1.0
    has = np.isfinite(user)

    def median_abs(mask: np.ndarray) -> float | None:
        x = np.abs(batch[mask & np.isfinite(batch)])
        return float(np.median(x)) if x.size else None

    everywhere = np.ones(len(points), dtype=bool)
    finite = np.abs(batch[np.isfinite(batch)])
    sides = {"median_abs_error_nosd": median_abs(k == 0), "median_abs_error_sd": median_abs(k > 0)}
    return {
        "median_abs_error": median_abs(everywhere),
        "max_abs_error": float(finite.max()) if finite.size else None,
        **sides,
        "user_path_median_abs_error": float(np.median(np.abs(user[has]))) if has.any() else None,
        "user_path_points": int(has.sum()),
        "large": not finite.size or any(v is not None and v > DRIFT_LARGE
                                        for v in sides.values()),
    }


def fit_from_reference(system: str, points: Sequence[Point], ref: Params, ref_file: str,
                       data: Sequence[str] = (), now: _dt.datetime | None = None
                       ) -> ReferenceFit:
    """The reduced fit of one system's points from a reference (module docstring)."""
    from scipy import stats

    check_reference(ref, ref_file)
    used, excluded = _usable(points, ref, ref_file)
    stated = stated_capacity(used)
    coef = ref.coefficients
    notes: list[str] = []
    if stated:
        coef = dataclasses.replace(coef, **{n: v for n, v in stated.to_mapping().items()})
    elif any(getattr(coef, n) for n in ("kv_cache_tokens", "kv_cache_tokens_sd",
                                        "max_num_seqs")):
        notes.append("the capacity (KV cache, max_num_seqs) is the reference's: state your"
                     " servers' with --kv-cache-tokens, --kv-cache-tokens-sd, --max-num-seqs")
    measured = np.array([p.latency_s for p in used], dtype=float)
    columns = {n: _batch(_only(coef, n), used) / measured for n in GROUPS}
    has_sd = any(p.sd for p in used)
    has_nosd = any(not p.sd for p in used)
    base = ("verifier", "drafter") if has_sd and has_nosd else \
        ("common",) if has_sd else ("verifier",)
    sol = _reduced_form(columns, base, len(used))
    n, n_factors = len(used), len(sol.names)
    factors = {name: (float(v), float(math.sqrt(sol.cov[i, i])) if sol.cov is not None
                      else None) for i, (name, v) in enumerate(zip(sol.names, sol.values,
                                                                    strict=True))}
    if any(v <= 0 for v, _ in factors.values()):
        zero = [name for name, (v, _) in factors.items() if v <= 0]
        raise ConfigError(f"--reference {ref_file}: the points give {', '.join(zero)} no cost"
                          " at all (factor 0): the reference's form does not describe them;"
                          " run a full calibration")
    new = _scaled(coef, {k: v for k, (v, _) in factors.items()})
    unc = ref.uncertainty
    assert unc is not None
    dof = n - n_factors
    z = float(stats.norm.ppf(0.5 + unc.level / 2.0))
    t = float(stats.t.ppf(0.5 + unc.level / 2.0, dof))
    residual_rms = math.sqrt(sol.ssr / n)
    sigma_points = math.sqrt(sol.ssr / dof * (1.0 + n_factors / n)) * t / z
    loko = ref.provenance.get("leave_one_k_out_mape")
    point_ks = sorted({round(p.draft_length) for p in used})
    extend = isinstance(loko, (int, float)) and math.isfinite(loko) and has_sd
    sigma_transfer = float(loko) * _MAPE_TO_RMS if extend else 0.0
    if not extend and has_sd:
        notes.append("the reference records no leave-one-k-out error, so the file vouches"
                     " only for the draft lengths the points ran: "
                     + ", ".join(str(k) for k in point_ks))
    bands = tuple(Band(b.utilization_below,
                       round(math.sqrt(b.sigma ** 2 + sigma_points ** 2 + sigma_transfer ** 2), 5),
                       b.runs) for b in unc.bands)
    cal = _valid_domain(ref, new, used, extend)
    profile = acceptance_profile(used)
    if profile is not None and len(profile) < ref.k_max:
        notes.append(f"the acceptance profile is the points' own ({len(profile)} positions):"
                     f" sweep and advise choose among k <= {len(profile)}; predict takes any k"
                     " of the file with its --acceptance-length")
    if profile is None and has_sd:
        notes.append("the points carry no per-position acceptance: the acceptance profile"
                     " (what sweep and advise use for other k) is the reference's")
    drift = _drift(dataclasses.replace(ref, coefficients=coef), used)
    rf = ReferenceFit(system=system, reference=ref, reference_file=ref_file, points=used,
                      excluded=excluded, factors=factors, residual_rms=residual_rms,
                      drift=drift, sigma_points=sigma_points, sigma_transfer=sigma_transfer,
                      params=ref, notes=notes)
    rf.params = _params(rf, new, cal, dataclasses.replace(unc, bands=bands), profile, stated,
                        data, now)
    rf.user_path = evidence.user_path(rf.params, used, _batch(new, used))["summary"]
    return rf


def _valid_domain(ref: Params, coef: Coefficients, points: Sequence[Point],
                  extend: bool) -> CalibratedRange:
    """Where both vouch: the load the points measured (rates, tops, ceilings, headroom; a
    curve's top still rising shows headroom up to the requests it held) within the
    reference's requests in flight, tokens per step and utilisation; the draft lengths the
    points ran, or the reference's where its leave-one-k-out error widens the intervals."""
    rc = ref.calibrated_range
    assert rc is not None
    own = evidence.calibrated_range(coef, points)
    head = dict(sd=own.headroom_in_flight_sd, nosd=own.headroom_in_flight_nosd,
                tokens=own.headroom_tokens_per_step)
    for top in evidence.rising_top_runs(points):
        key = "sd" if top.sd else "nosd"
        head[key] = max(head[key] or 0.0, round(top.in_flight, 3))
        head["tokens"] = max(head["tokens"] or 0.0,
                             round(top.in_flight * (top.draft_length + 1.0), 1))

    def low(a: float | None, b: float | None) -> float | None:
        return b if a is None else a if b is None else min(a, b)

    ks = tuple(sorted(set(own.draft_lengths) | (set(rc.draft_lengths) if extend else set())))
    return dataclasses.replace(
        own, draft_lengths=ks, max_in_flight=min(own.max_in_flight, rc.max_in_flight),
        max_tokens_per_step=low(own.max_tokens_per_step, rc.max_tokens_per_step),
        max_utilization_seen=low(own.max_utilization_seen, rc.max_utilization_seen),
        headroom_in_flight_sd=low(head["sd"], rc.headroom_in_flight_sd),
        headroom_in_flight_nosd=low(head["nosd"], rc.headroom_in_flight_nosd),
        headroom_tokens_per_step=low(head["tokens"], rc.headroom_tokens_per_step))


def _params(rf: ReferenceFit, coef: Coefficients, cal: CalibratedRange, unc: Uncertainty,
            profile: tuple[float, ...] | None, stated: Any, data: Sequence[str],
            now: _dt.datetime | None) -> Params:
    ref = rf.reference
    now = now or _dt.datetime.now(_dt.UTC)
    doc = dataclasses.replace(ref, system=rf.system, coefficients=coef).to_mapping()
    for key in ("calibrated_range", "uncertainty", "server_capacity", "provenance"):
        doc.pop(key, None)
    if profile is not None:
        doc["acceptance_profile"] = list(profile)
        doc["k_max"] = len(profile)
    doc["calibrated_range"] = cal.to_mapping()
    doc["uncertainty"] = unc.to_mapping()
    if stated:
        doc["server_capacity"] = stated.to_mapping()
    doc["provenance"] = {
        "method": f"specwatch calibrate {__version__}: the reference's form with its costs"
                  f" scaled by {len(rf.factors)} factor(s) fitted to {len(rf.points)} points"
                  " (model.md, Calibrating from a reference)",
        "fitted_at": now.replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        "mape": round(float(np.mean(np.abs(_batch(coef, rf.points)
                                           / [p.latency_s for p in rf.points] - 1.0))), 6),
        "n_points": len(rf.points),
        "n_excluded": len(rf.excluded),
        "data": list(data),
        "reference": {"file": rf.reference_file, "system": ref.system,
                      **({"fitted_at": ref.provenance["fitted_at"]}
                         if "fitted_at" in ref.provenance else {})},
        "reduced_form": {
            "name": rf.form,
            "factors": {n: {"value": round(v, 6),
                            "standard_error": round(se, 6) if se is not None else None,
                            "meaning": MEANINGS[n]} for n, (v, se) in rf.factors.items()},
            "interval_sigma": {"points": round(rf.sigma_points, 5),
                               "transfer": round(rf.sigma_transfer, 5)},
        },
        "drift": {k: (round(v, 6) if isinstance(v, float) else v)
                  for k, v in rf.drift.items()},
    }
    return params_from_mapping(doc, source="<calibrate --reference>")


# --------------------------------------------------------------------------- the report


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def report_lines(rf: ReferenceFit, written: str | None) -> list[str]:
    """What the terminal report says: the form, each factor, the drift, the domain."""
    d = rf.drift
    lines = [f"{rf.system}: fitted from the reference {rf.reference_file}"
             f" ({rf.reference.system}) and {len(rf.points)} points"
             + (f" ({len(rf.excluded)} excluded)" if rf.excluded else ""),
             f"  reduced form: {rf.form}"]
    for name, (v, se) in rf.factors.items():
        err = f" ± {se:.3g}" if se is not None else ""
        lines.append(f"  {name} = {v:.4g}{err}: x {MEANINGS[name]}")
    lines.append(f"  residual RMS on the points {rf.residual_rms:.2%}; interval σ adds"
                 f" {rf.sigma_points:.2%} (the points) and {rf.sigma_transfer:.2%} (the"
                 " reference's leave-one-k-out error) to the reference's bands")
    lines.append(f"  drift: before fitting the reference was off by a median"
                 f" {_pct(d['median_abs_error'])} (max {_pct(d['max_abs_error'])}; without SD"
                 f" {_pct(d['median_abs_error_nosd'])}, with SD {_pct(d['median_abs_error_sd'])})"
                 f" at the points' batch in flight; through predict at their arrival rates"
                 f" {_pct(d['user_path_median_abs_error'])} ({d['user_path_points']} of"
                 f" {len(rf.points)} points have a number)")
    if d["large"]:
        lines.append(f"  LARGE DRIFT (a median above {DRIFT_LARGE:.0%}): the reference does not"
                     " describe this deployment as it stands; the factors absorb the time"
                     " scales, the shapes stay the reference's")
    if (d["median_abs_error_nosd"] or 0.0) > DRIFT_LARGE:
        lines.append("  without SD the reference is far off: check it is the same verifier"
                     " model and hardware class (its batch dependence and knees are kept)")
    if (d["median_abs_error_sd"] or 0.0) > DRIFT_LARGE:
        lines.append("  with SD the reference is far off: another drafter (or its serving)"
                     " than the reference's; its cost is refitted, its k-dependence kept")
    cal = rf.params.calibrated_range
    assert cal is not None
    lines.append(f"  valid where both vouch: up to {cal.max_arrival_rate:g} req/s,"
                 f" {cal.max_in_flight:g} requests in flight, k ="
                 f" {', '.join(str(k) for k in cal.draft_lengths)}")
    sm = rf.user_path
    if sm:
        lines.append(f"  the points through predict: {sm['valid']}/{sm['runs']} valid, MAPE"
                     f" {_pct(sm['mape_valid'])}, interval holds {_pct(sm['interval_coverage'])}")
    lines += [f"  note: {n}" for n in rf.notes]
    lines += [f"  excluded: {p.source}: {why}" for p, why in rf.excluded]
    if written:
        lines.append(f"  wrote {written}")
    return lines
