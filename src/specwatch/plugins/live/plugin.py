"""Live latency-model predictions on the exporter (the sd_predicted_* series).

For every target whose configuration names a parameters file (``params:``), a target hook
feeds the model with what the exporter measured over one window (default 5m) and fills each
model's :data:`PREDICTION` slot with a :class:`LivePrediction`; :meth:`LiveModel.families`
renders it (definitions in :mod:`specwatch.plugins.live.metrics`). Invariants: a value the
model does not vouch for is absent, never a placeholder (``sd_model_valid`` 0 with a
``reason`` instead); a live server stating another capacity than the calibrated one gets no
prediction (``capacity_mismatch``); parameters files load once, at start-up (a bad one is
exit 2). The rules, the speedup curve and the capacity check are specified in
docs/exporter.md, "Live model predictions".
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

import numpy as np
from prometheus_client.core import Metric

from specwatch.common.bundle import missing_params_hint
from specwatch.common.errors import ConfigError
from specwatch.expose import metricdefs
from specwatch.model import (
    BreakEvenKind,
    MoECoefficients,
    Reason,
    alpha_from_acceptance_length,
    bestk,
    ceilings,
    extend_profile,
    reason_text,
    throughput_ceiling,
    validity,
)
from specwatch.model.params import Params, load_params
from specwatch.plugins.host import PluginHost
from specwatch.plugins.live.metrics import (
    BREAKEVEN_ARRIVAL_RATE,
    MODEL_CONFIGURED,
    MODEL_CURVE_ARRIVAL_RATE,
    MODEL_LATENCY_ERROR,
    MODEL_PROVENANCE_MISMATCH,
    MODEL_SPEEDUP_CURVE,
    MODEL_SPEEDUP_CURVE_LOWER,
    MODEL_SPEEDUP_CURVE_UPPER,
    MODEL_UTILIZATION,
    MODEL_VALID,
    OPTIMAL_DRAFT_LENGTH,
    PREDICTED_LATENCY,
    PREDICTED_LATENCY_LOWER,
    PREDICTED_LATENCY_UPPER,
    PREDICTED_SPEEDUP,
    PREDICTED_SPEEDUP_LOWER,
    PREDICTED_SPEEDUP_UPPER,
    SD_CEILING_ARRIVAL_RATE,
)
from specwatch.plugins.live.settings import SECTION, LiveTarget
from specwatch.poll import sources
from specwatch.poll.config import ServeConfig
from specwatch.poll.snapshot import ModelSnapshot, Slot, Snapshot, TargetSnapshot
from specwatch.poll.windows import derive

log = logging.getLogger(__name__)

#: Relative difference between the KV cache a live server states and the calibrated one past
#: which they are two configurations: vLLM sizes its cache from a memory profile at start-up,
#: which moves it by a percent or two between restarts of one configuration; a different GPU,
#: memory share, parallelism or drafter moves it by far more.
CAPACITY_TOLERANCE = 0.05

#: Arrival rates per model on the speedup curve: a fixed count bounds the series (two per
#: point) whatever the traffic, and 24 draw a smooth line on a dashboard panel.
CURVE_POINTS = 24


@dataclass(frozen=True)
class LivePrediction:
    """What the model says about one model of one target, from one window.

    Absent values are None. `reason` explains `valid = False` (for logs and the landing
    page; it is not a label, so it cannot multiply series).
    """

    window: str
    valid: bool
    reason: str
    speedup: float | None = None
    latency_sd: float | None = None
    latency_nosd: float | None = None
    utilization: float | None = None
    breakeven_rate: float | None = None
    #: SD's throughput ceiling at the running k (req/s), a separate figure from breakeven_rate.
    ceiling_rate: float | None = None
    optimal_draft_length: int | None = None
    #: Stable reason name (model.validity) when not valid: the `reason` label.
    reason_name: str = ""
    #: predicted / measured − 1 of the mean latency at the observed load.
    latency_error: float | None = None
    #: Provenance fields of the parameters file that contradict the target (e.g. "model").
    provenance_mismatch: tuple[str, ...] = ()
    #: The speedup curve: (grid index, arrival rate req/s, predicted speedup, its 90% lower
    #: and upper bound or NaN) of the valid points only, in increasing rate; empty when the
    #: model could not run.
    curve: tuple[tuple[int, float, float, float, float], ...] = ()
    #: 90% intervals (lower, upper) of the speedup and of each latency; None without an
    #: `uncertainty` block in the parameters file, or while not valid. An unbounded upper
    #: end is never a valid prediction (`sensitive`), so both ends are finite here.
    speedup_interval: tuple[float, float] | None = None
    latency_sd_interval: tuple[float, float] | None = None
    latency_nosd_interval: tuple[float, float] | None = None


@dataclass(frozen=True)
class TargetModelState:
    """Per-target model configuration (the target's :data:`MODEL_STATE` slot)."""

    configured: bool
    system: str | None = None
    window: str | None = None


#: Each model's prediction, and each target's model configuration.
PREDICTION: Slot[LivePrediction] = Slot("live.prediction", LivePrediction)
MODEL_STATE: Slot[TargetModelState] = Slot("live.model_state", TargetModelState)


#: The state of every target without a parameters file (immutable: one for all).
_UNCONFIGURED = TargetModelState(configured=False)


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _live_profile(model: ModelSnapshot, window_label: str) -> list[float] | None:
    w = model.window(window_label)
    if w is None:
        return None
    rates = w.positions.get(derive.POSITION_ACCEPTANCE_RATE)
    if not rates:
        return None
    ordered = sorted(rates.items(), key=lambda kv: (_pos_key(kv[0]), kv[0]))
    return [v for _, v in ordered]


def _pos_key(p: str) -> int:
    try:
        return int(p)
    except ValueError:
        return 1 << 30


def speedup_curve(params: Params, k: float, e: float, p: float, g: float,
                  points: int = CURVE_POINTS
                  ) -> tuple[tuple[int, float, float, float, float], ...]:
    """The predicted speedup along a grid of arrival rates for fixed k, E, p, g (pure).

    Why the grid stops below `max_utilization` x the lower throughput ceiling: past it no
    point can be valid (the binding system is above the validity ceiling), so every point
    is spent where the model vouches for its numbers, and the curve crosses 1 at the
    break-even whenever that lies in the valid range. An MoE model has no closed-form
    ceiling: its dense part's ceiling bounds the grid (the experts only lower the true one,
    whose points are then absent as saturated). A load-free fit (no ceiling) has no range
    to span: no curve. Returns (index, λ, S) of the points valid by the model, the
    calibrated range and the draft length; absent points are left out, never zeroed.
    """
    coef = params.model()
    dense = coef.dense if isinstance(coef, MoECoefficients) else coef
    # Both systems' ceilings in one call: SD at (k, E), no SD at (0, 1).
    lam_max = float(np.min(throughput_ceiling(dense, [k, 0.0], [e, 1.0], p, g)))
    if not (math.isfinite(lam_max) and lam_max > 0):
        return ()
    ceiling = params.max_utilization
    rates = ceiling * lam_max * np.arange(points) / points
    judged = validity.assess(params, rates, k, e, p, g)
    s_lo = s_hi = np.full(rates.shape, np.nan)
    if judged.intervals is not None:
        s_lo, s_hi = judged.intervals.speedup
    out = []
    for i in np.flatnonzero(judged.valid & np.isfinite(judged.prediction.speedup)):
        out.append((int(i), float(rates[i]), float(judged.prediction.speedup[i]),
                    float(s_lo[i]), float(s_hi[i])))
    return tuple(out)


def predict_live(params: Params, model: ModelSnapshot, window_label: str) -> LivePrediction:
    """The model applied to one window's measured signals (pure; no I/O)."""
    w = model.window(window_label)
    if w is None:
        return LivePrediction(window_label, False, f"window {window_label} has no data yet",
                              reason_name="missing_input")
    v = w.values
    inputs = _inputs(v, model.configured_k)
    if isinstance(inputs, str):
        return LivePrediction(window_label, False, inputs, reason_name="missing_input")
    lam, k, e, p, g = inputs
    judged = validity.assess(params, lam, k, e, p, g)
    pred = judged.prediction
    code = int(pred.reason)
    if code in (Reason.BAD_INPUT, Reason.BAD_DRAFT_LENGTH,
                Reason.ACCEPTANCE_LENGTH_OUT_OF_RANGE, Reason.DEGENERATE):
        return LivePrediction(window_label, False, reason_text(code),
                              reason_name="invalid_input")
    util = float(pred.sd.utilization)

    be = ceilings.breakeven(params, k, e, p, g)
    be_rate = float(be.rate) if int(be.kind) != BreakEvenKind.UNDEFINED else None
    cap = float(ceilings.sd_throughput_ceiling(params, k, e, p, g)[0])
    best = _best_draft_length(params, model, window_label, lam, k, e, p, g)

    lat_sd = float(pred.sd.latency)
    # The file's own claim is not a reason to withhold the number live (model.validity).
    names = [n for n in judged.names() if n != validity.NO_CALIBRATED_RANGE]
    waiting = model.gauges.get(sources.WAITING)
    if waiting is not None and waiting > 0:
        names.append(validity.QUEUEING)
    valid = bool(pred.valid) and not names
    measured = v.get(derive.MEAN_LATENCY_SECONDS)
    error = (lat_sd / measured - 1.0
             if measured is not None and measured > 0 and math.isfinite(lat_sd) else None)
    text = "ok" if valid else (reason_text(code) if code != Reason.OK else ", ".join(names))
    return LivePrediction(
        window=window_label,
        valid=valid,
        reason=text,
        reason_name="" if valid else names[0],
        latency_error=_finite(error) if error is not None else None,
        provenance_mismatch=provenance_mismatch(params, model),
        speedup=_finite(float(pred.speedup)) if valid else None,
        latency_sd=_finite(float(pred.sd.latency)) if valid else None,
        latency_nosd=_finite(float(pred.nosd.latency)) if valid else None,
        utilization=_finite(util),
        breakeven_rate=be_rate if be_rate is None or not math.isnan(be_rate) else None,
        ceiling_rate=cap if math.isfinite(cap) and cap > 0 else None,
        optimal_draft_length=best,
        curve=speedup_curve(params, k, e, p, g),
        **(_intervals(judged) if valid else {}),
    )


def _inputs(v: Mapping[str, float], configured_k: int | None
            ) -> tuple[float, float, float, float, float] | str:
    """The model's inputs from a window's values, (λ, k, E, p, g), or what is missing."""
    lam = v.get(derive.ARRIVAL_RATE)
    e = v.get(derive.ACCEPTANCE_LENGTH)
    k = v.get(derive.DRAFT_LENGTH)
    if k is None and e is not None and configured_k:
        k = float(configured_k)  # SGLang: no drafts counter, the configured steps
    p = v.get(derive.MEAN_PROMPT_TOKENS)
    g = v.get(derive.MEAN_GENERATION_TOKENS)
    if lam is None or e is None or k is None or p is None or g is None:
        missing = [name for name, x in (("arrival rate", lam), ("acceptance length", e),
                                        ("draft length", k), ("prompt length", p),
                                        ("generation length", g)) if x is None]
        return "missing " + ", ".join(missing)
    return lam, k, e, p, g


def _best_draft_length(params: Params, model: ModelSnapshot, window_label: str, lam: float,
                       k: float, e: float, p: float, g: float) -> int | None:
    """The best k at the live load from the measured acceptance profile (else the i.i.d.
    α), by the rule every command shows (model.bestk: the model's optimum where its own
    prediction is vouched for, else the best vouched k it cannot be told from)."""
    profile = _live_profile(model, window_label)
    extended = extend_profile(profile, params.k_max) if profile else None
    if extended is not None:
        acceptance = {"profile": extended}
    else:
        alpha = float(alpha_from_acceptance_length(e, k)) if k > 0 else math.nan
        if not (math.isfinite(alpha) and alpha < 1.0):
            return None
        acceptance = {"alpha": alpha}
    best = bestk.best_draft_length(params, lam, p, g, **acceptance)
    return int(best.k) if bool(best.shown) else None


def _intervals(judged: validity.Assessment) -> dict[str, tuple[float, float] | None]:
    """The LivePrediction interval fields of a valid scalar assessment."""
    iv = judged.intervals
    if iv is None:
        return {}

    def pair(lo: np.ndarray, hi: np.ndarray) -> tuple[float, float] | None:
        a, b = float(lo), float(hi)
        return (a, b) if math.isfinite(a) and math.isfinite(b) else None

    return {"speedup_interval": pair(*iv.speedup),
            "latency_sd_interval": pair(*iv.latency_sd),
            "latency_nosd_interval": pair(*iv.latency_nosd)}


def capacity_mismatch(params: Params, server: sources.ServerCapacity | None, sd: bool,
                      max_num_seqs: int | None = None) -> tuple[str, ...]:
    """The `server_capacity` fields of the parameters file the live server contradicts.

    The KV cache is compared with the calibrated value of the same kind (`kv_cache_tokens_sd`
    for a server running SD, else `kv_cache_tokens`) within CAPACITY_TOLERANCE; max_num_seqs
    (from the target's configuration: no page states it) exactly. A value not stated on
    either side is not compared: nothing is reported for it.
    """
    stated = params.server_capacity
    if not stated:
        return ()
    out = []
    name = "kv_cache_tokens_sd" if sd else "kv_cache_tokens"
    want = getattr(stated, name)
    have = server.kv_cache_tokens if server is not None else None
    if want and have and abs(have / want - 1.0) > CAPACITY_TOLERANCE:
        out.append(name)
    if stated.max_num_seqs and max_num_seqs is not None \
            and float(max_num_seqs) != stated.max_num_seqs:
        out.append("max_num_seqs")
    return tuple(out)


def with_capacity_mismatch(live: LivePrediction, fields: tuple[str, ...]) -> LivePrediction:
    """`live` for a server of another capacity: not valid (reason capacity_mismatch), and
    nothing that rests on the capacity terms is shown; the fields join the mismatches."""
    return replace(
        live, valid=False, reason_name=validity.CAPACITY_MISMATCH,
        reason="the server states another capacity than the calibrated one ("
               + ", ".join(fields) + "): re-calibrate",
        speedup=None, latency_sd=None, latency_nosd=None, breakeven_rate=None, ceiling_rate=None,
        optimal_draft_length=None, curve=(),
        provenance_mismatch=(*live.provenance_mismatch, *fields))


def provenance_mismatch(params: Params, model: ModelSnapshot) -> tuple[str, ...]:
    """Provenance fields of the parameters file the target contradicts.

    `provenance.model` (the served model the file was calibrated on) is compared with the
    vLLM `model_name` label, case-insensitively, either containing the other (a path or an
    org prefix is not a mismatch). A file without it cannot be checked: nothing reported.
    """
    out = []
    want = params.provenance.get("model") if params.provenance else None
    if isinstance(want, str) and want.strip():
        a, b = want.strip().lower(), model.model_name.strip().lower()
        if a not in b and b not in a:
            out.append("model")
    return tuple(out)


class LiveModel:
    """The hook and the family builder, holding each target's loaded parameters."""

    def __init__(self, params: Mapping[str, Params], windows: Mapping[str, str],
                 max_num_seqs: Mapping[str, int] | None = None) -> None:
        self.params = dict(params)
        self.windows = dict(windows)
        #: targets[].max_num_seqs (the scheduler limit no page states), by target.
        self.max_num_seqs = dict(max_num_seqs or {})
        # (target, model, field) already logged: one warning per mismatch, bounded by the
        # configured targets and the models they serve.
        self._warned: set[tuple[str, str, str]] = set()

    def hook(self, target: TargetSnapshot) -> TargetSnapshot:
        """Pipeline target hook: attach predictions to every model of a configured target."""
        params = self.params.get(target.name)
        if params is None:
            return target.with_slot(MODEL_STATE, _UNCONFIGURED)
        label = self.windows[target.name]
        state = TargetModelState(configured=True, system=params.system, window=label)
        models = {}
        for name, m in target.models.items():
            try:
                live = predict_live(params, m, label)
            except Exception:  # one model's numbers must not take the target's down
                log.exception("latency model failed for %s/%s", target.name, name)
                live = LivePrediction(label, False, "internal error (see log)")
            cap = capacity_mismatch(params, target.server,
                                    m.sd_families_present or bool(m.configured_k),
                                    self.max_num_seqs.get(target.name))
            if cap:
                live = with_capacity_mismatch(live, cap)
            for fld in live.provenance_mismatch:
                if (target.name, name, fld) not in self._warned:
                    self._warned.add((target.name, name, fld))
                    self._warn(params, target, name, fld)
            if not live.valid:
                log.debug("model prediction for %s/%s not valid: %s", target.name, name,
                          live.reason)
            models[name] = m.with_slot(PREDICTION, live)
        return target.replaced(models=models,
                               extensions={**target.extensions, MODEL_STATE.name: state})

    def _warn(self, params: Params, target: TargetSnapshot, model: str, fld: str) -> None:
        if fld == "model":
            log.warning(
                "parameters file %s: provenance %s %r does not match target %s model "
                "%r: its predictions describe another system (re-calibrate)",
                params.source, fld, params.provenance.get(fld), target.name, model)
            return
        server = target.server
        have = (self.max_num_seqs.get(target.name) if fld == "max_num_seqs"
                else server.kv_cache_tokens if server is not None else None)
        log.warning(
            "parameters file %s: server_capacity %s %s does not match target %s (model %r), "
            "which states %s: its predictions describe another configuration (re-calibrate)",
            params.source, fld, getattr(params.server_capacity, fld, None), target.name,
            model, have)

    def families(self, snap: Snapshot) -> Iterator[Metric]:
        """Collector family builder for the model series."""
        speedup = metricdefs.gauge(PREDICTED_SPEEDUP)
        lat = metricdefs.gauge(PREDICTED_LATENCY)
        be = metricdefs.gauge(BREAKEVEN_ARRIVAL_RATE)
        sd_cap = metricdefs.gauge(SD_CEILING_ARRIVAL_RATE)
        best = metricdefs.gauge(OPTIMAL_DRAFT_LENGTH)
        util = metricdefs.gauge(MODEL_UTILIZATION)
        valid = metricdefs.gauge(MODEL_VALID)
        error = metricdefs.gauge(MODEL_LATENCY_ERROR)
        mismatch = metricdefs.gauge(MODEL_PROVENANCE_MISMATCH)
        configured = metricdefs.gauge(MODEL_CONFIGURED)
        curve = metricdefs.gauge(MODEL_SPEEDUP_CURVE)
        curve_rate = metricdefs.gauge(MODEL_CURVE_ARRIVAL_RATE)
        curve_lo = metricdefs.gauge(MODEL_SPEEDUP_CURVE_LOWER)
        curve_hi = metricdefs.gauge(MODEL_SPEEDUP_CURVE_UPPER)
        s_lo = metricdefs.gauge(PREDICTED_SPEEDUP_LOWER)
        s_hi = metricdefs.gauge(PREDICTED_SPEEDUP_UPPER)
        l_lo = metricdefs.gauge(PREDICTED_LATENCY_LOWER)
        l_hi = metricdefs.gauge(PREDICTED_LATENCY_UPPER)
        for tname, target in snap.targets.items():
            # From the configuration, not the snapshot: known before the first poll.
            configured.add_metric([tname], 1.0 if tname in self.params else 0.0)
            if not target.up:
                continue
            for mname, m in target.models.items():
                live = m.slot(PREDICTION)
                if live is None:
                    continue
                key = [tname, mname, live.window]
                valid.add_metric([*key, "" if live.valid else live.reason_name],
                                 1.0 if live.valid else 0.0)
                if live.latency_error is not None:
                    error.add_metric(key, live.latency_error)
                for fld in live.provenance_mismatch:
                    mismatch.add_metric([*key, fld], 1.0)
                if live.valid and live.speedup is not None:
                    speedup.add_metric(key, live.speedup)
                    if live.speedup_interval is not None:
                        s_lo.add_metric(key, live.speedup_interval[0])
                        s_hi.add_metric(key, live.speedup_interval[1])
                if live.valid and live.latency_sd is not None and live.latency_nosd is not None:
                    lat.add_metric([*key, "sd"], live.latency_sd)
                    lat.add_metric([*key, "nosd"], live.latency_nosd)
                    for mode, pair in (("sd", live.latency_sd_interval),
                                       ("nosd", live.latency_nosd_interval)):
                        if pair is not None:
                            l_lo.add_metric([*key, mode], pair[0])
                            l_hi.add_metric([*key, mode], pair[1])
                if live.breakeven_rate is not None:
                    be.add_metric(key, live.breakeven_rate)
                if live.ceiling_rate is not None:
                    sd_cap.add_metric(key, live.ceiling_rate)
                if live.optimal_draft_length is not None:
                    best.add_metric(key, float(live.optimal_draft_length))
                if live.utilization is not None:
                    util.add_metric(key, live.utilization)
                for i, lam, sp, lo, hi in live.curve:
                    point = f"{i:02d}"
                    curve_rate.add_metric([*key, point], lam)
                    curve.add_metric([*key, point], sp)
                    if math.isfinite(lo) and math.isfinite(hi):
                        curve_lo.add_metric([*key, point], lo)
                        curve_hi.add_metric([*key, point], hi)
        yield configured
        for fam in (speedup, s_lo, s_hi, lat, l_lo, l_hi, be, sd_cap, best, util, valid, error,
                    mismatch, curve, curve_lo, curve_hi, curve_rate):
            if fam.samples:
                yield fam


def from_config(cfg: ServeConfig) -> LiveModel:
    """Load every target's parameters file and check its model window (ConfigError: exit 2)."""
    labels = [w for w, _ in cfg.windows]
    if cfg.count_window > 0:
        labels.append(f"{cfg.count_window}req")
    default = cfg.section(SECTION).model_window
    params: dict[str, Params] = {}
    windows: dict[str, str] = {}
    seqs: dict[str, int] = {}
    for i, t in enumerate(cfg.targets):
        own: LiveTarget = t.section(SECTION)
        path = own.params
        label = own.model_window or default
        windows[t.name] = label
        if t.max_num_seqs is not None:
            seqs[t.name] = t.max_num_seqs
        if path is None:
            continue
        if label not in labels:
            where = (f"targets[{i}].model_window" if own.model_window is not None
                     else "global.model_window")
            raise ConfigError(
                f"{cfg.source}: {where}: window {label!r} is not computed; expected one of "
                f"{', '.join(labels)} (add it to global.windows)"
            )
        try:
            params[t.name] = load_params(path)
        except ConfigError as exc:
            hint = "" if os.path.exists(path) else missing_params_hint(path, "params: ")
            raise ConfigError(f"{cfg.source}: targets[{i}].params: {exc}{hint}") from None
    return LiveModel(params, windows, seqs)


def install(host: PluginHost, live: LiveModel) -> LiveModel:
    """Register the live model (built by :func:`from_config`): its target hook and its
    family builder."""
    host.add_target_hook(live.hook)
    host.add_family_builder(live.families)
    return live
