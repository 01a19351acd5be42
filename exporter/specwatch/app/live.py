"""Live latency-model predictions on the exporter (the sd_predicted_* series).

For every target whose configuration names a parameters file (`params:`), a target hook
feeds the model with what the exporter measured over one window (default 5m): arrival rate,
acceptance length, effective draft length, mean prompt and generation length, and the
per-position acceptance. It attaches a :class:`LivePrediction` to each model's snapshot,
and a family builder renders it:

    sd_predicted_speedup, sd_predicted_latency_seconds{mode="sd"|"nosd"},
    sd_breakeven_arrival_rate, sd_optimal_draft_length, sd_model_utilization,
    sd_model_valid, specwatch_model_configured{target}

Rules (no nonsense values): `sd_model_valid` is 1 only when every input is present and both
systems are within the validity ceiling; otherwise it is 0 and the speedup and latencies
are absent. The utilisation is exposed whenever the inputs are present, even past 1 (that
is how saturation shows). The break-even needs no arrival rate and the best k is chosen
among the configurations that are valid at the live load (0 = SD off), so both stay
meaningful when the running configuration is saturated. Break-even +Inf means "pays at
every load below saturation", 0 "never pays"; an undefined break-even is absent.

The parameters files are loaded once at start-up: a bad file stops `specwatch serve` with
exit 2 and the file, line and field, instead of a silently unconfigured target.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from prometheus_client.core import Metric

from specwatch.common.errors import ConfigError
from specwatch.exporter import derive, metricdefs
from specwatch.exporter.snapshot import ModelSnapshot, Snapshot, TargetSnapshot
from specwatch.model import (
    BreakEvenKind,
    Reason,
    alpha_from_acceptance_length,
    breakeven,
    extend_profile,
    optimal_draft_length,
    predict,
    reason_text,
)
from specwatch.model.params import Params, load_params

if TYPE_CHECKING:  # pragma: no cover
    from specwatch.exporter.config import ServeConfig

log = logging.getLogger(__name__)

DEFAULT_MODEL_WINDOW = "5m"

PREDICTED_SPEEDUP = "sd_predicted_speedup"
PREDICTED_LATENCY = "sd_predicted_latency_seconds"
BREAKEVEN_ARRIVAL_RATE = "sd_breakeven_arrival_rate"
OPTIMAL_DRAFT_LENGTH = "sd_optimal_draft_length"
MODEL_UTILIZATION = "sd_model_utilization"
MODEL_VALID = "sd_model_valid"
MODEL_CONFIGURED = "specwatch_model_configured"


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
    optimal_draft_length: int | None = None


@dataclass(frozen=True)
class TargetModelState:
    """Per-target model configuration (`TargetSnapshot.model`)."""

    configured: bool
    system: str | None = None
    window: str | None = None


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


def predict_live(params: Params, model: ModelSnapshot, window_label: str) -> LivePrediction:
    """The model applied to one window's measured signals (pure; no I/O)."""
    w = model.window(window_label)
    if w is None:
        return LivePrediction(window_label, False, f"window {window_label} has no data yet")
    v = w.values
    lam = v.get(derive.ARRIVAL_RATE)
    e = v.get(derive.ACCEPTANCE_LENGTH)
    k = v.get(derive.DRAFT_LENGTH)
    if k is None and e is not None and model.configured_k:
        k = float(model.configured_k)  # SGLang: no drafts counter, the configured steps
    p = v.get(derive.MEAN_PROMPT_TOKENS)
    g = v.get(derive.MEAN_GENERATION_TOKENS)
    missing = [name for name, x in (("arrival rate", lam), ("acceptance length", e),
                                    ("draft length", k), ("prompt length", p),
                                    ("generation length", g)) if x is None]
    if missing:
        return LivePrediction(window_label, False, "missing " + ", ".join(missing))
    coef = params.model()
    ceiling = params.max_utilization
    pred = predict(coef, lam, k, e, p, g, max_utilization=ceiling)
    code = int(pred.reason)
    if code in (Reason.BAD_INPUT, Reason.BAD_DRAFT_LENGTH,
                Reason.ACCEPTANCE_LENGTH_OUT_OF_RANGE, Reason.DEGENERATE):
        return LivePrediction(window_label, False, reason_text(code))
    util = float(pred.sd.utilization)

    be = breakeven(coef, k, e, p, g)
    be_rate = float(be.rate) if int(be.kind) != BreakEvenKind.UNDEFINED else None

    profile = _live_profile(model, window_label)
    if profile:
        opt = optimal_draft_length(coef, lam, p=p, g=g, k_max=params.k_max,
                                   profile=extend_profile(profile, params.k_max),
                                   max_utilization=ceiling)
    else:
        alpha = float(alpha_from_acceptance_length(e, k)) if k > 0 else math.nan
        opt = None
        if math.isfinite(alpha) and alpha < 1.0:
            opt = optimal_draft_length(coef, lam, alpha=alpha, p=p, g=g, k_max=params.k_max,
                                       max_utilization=ceiling)
    best = int(opt.k) if opt is not None and bool(opt.valid) else None

    valid = bool(pred.valid)
    return LivePrediction(
        window=window_label,
        valid=valid,
        reason="ok" if valid else reason_text(code),
        speedup=_finite(float(pred.speedup)) if valid else None,
        latency_sd=_finite(float(pred.sd.latency)) if valid else None,
        latency_nosd=_finite(float(pred.nosd.latency)) if valid else None,
        utilization=_finite(util),
        breakeven_rate=be_rate if be_rate is None or not math.isnan(be_rate) else None,
        optimal_draft_length=best,
    )


class LiveModel:
    """The hook and the family builder, holding each target's loaded parameters."""

    def __init__(self, params: Mapping[str, Params], windows: Mapping[str, str]) -> None:
        self.params = dict(params)
        self.windows = dict(windows)

    def hook(self, target: TargetSnapshot) -> TargetSnapshot:
        """Pipeline target hook: attach predictions to every model of a configured target."""
        params = self.params.get(target.name)
        if params is None:
            return replace(target, model=TargetModelState(configured=False))
        label = self.windows[target.name]
        state = TargetModelState(configured=True, system=params.system, window=label)
        models = {}
        for name, m in target.models.items():
            try:
                live = predict_live(params, m, label)
            except Exception:  # one model's numbers must not take the target's down
                log.exception("latency model failed for %s/%s", target.name, name)
                live = LivePrediction(label, False, "internal error (see log)")
            if not live.valid:
                log.debug("model prediction for %s/%s not valid: %s", target.name, name,
                          live.reason)
            models[name] = replace(m, predictions=live)
        return replace(target, model=state, models=models)

    def families(self, snap: Snapshot) -> Iterator[Metric]:
        """Collector family builder for the model series."""
        speedup = metricdefs.gauge(PREDICTED_SPEEDUP)
        lat = metricdefs.gauge(PREDICTED_LATENCY)
        be = metricdefs.gauge(BREAKEVEN_ARRIVAL_RATE)
        best = metricdefs.gauge(OPTIMAL_DRAFT_LENGTH)
        util = metricdefs.gauge(MODEL_UTILIZATION)
        valid = metricdefs.gauge(MODEL_VALID)
        configured = metricdefs.gauge(MODEL_CONFIGURED)
        for tname, target in snap.targets.items():
            # From the configuration, not the snapshot: known before the first poll.
            configured.add_metric([tname], 1.0 if tname in self.params else 0.0)
            if not target.up:
                continue
            for mname, m in target.models.items():
                live = m.predictions
                if not isinstance(live, LivePrediction):
                    continue
                key = [tname, mname, live.window]
                valid.add_metric(key, 1.0 if live.valid else 0.0)
                if live.valid and live.speedup is not None:
                    speedup.add_metric(key, live.speedup)
                if live.valid and live.latency_sd is not None and live.latency_nosd is not None:
                    lat.add_metric([*key, "sd"], live.latency_sd)
                    lat.add_metric([*key, "nosd"], live.latency_nosd)
                if live.breakeven_rate is not None:
                    be.add_metric(key, live.breakeven_rate)
                if live.optimal_draft_length is not None:
                    best.add_metric(key, float(live.optimal_draft_length))
                if live.utilization is not None:
                    util.add_metric(key, live.utilization)
        yield configured
        for fam in (speedup, lat, be, best, util, valid):
            if fam.samples:
                yield fam


def from_config(cfg: ServeConfig) -> LiveModel:
    """Load every target's parameters file and check its model window (ConfigError: exit 2)."""
    labels = [w for w, _ in cfg.windows]
    if cfg.count_window > 0:
        labels.append(f"{cfg.count_window}req")
    default = cfg.raw.get("global", {}).get("model_window", DEFAULT_MODEL_WINDOW)
    params: dict[str, Params] = {}
    windows: dict[str, str] = {}
    for i, t in enumerate(cfg.targets):
        path = t.raw.get("params")
        label = t.raw.get("model_window", default)
        windows[t.name] = label
        if path is None:
            continue
        if label not in labels:
            where = (f"targets[{i}].model_window" if "model_window" in t.raw
                     else "global.model_window")
            raise ConfigError(
                f"{where}: window {label!r} is not computed; expected one of "
                f"{', '.join(labels)} (add it to global.windows)"
            )
        try:
            params[t.name] = load_params(path)
        except ConfigError as exc:
            raise ConfigError(f"targets[{i}].params: {exc}") from None
    return LiveModel(params, windows)


def install(app: object) -> LiveModel:
    """Wire the live model into a ServeApp: a pipeline hook and a collector family builder."""
    live = from_config(app.cfg)  # type: ignore[attr-defined]
    app.pipeline.add_target_hook(live.hook)  # type: ignore[attr-defined]
    app.collector.add_family_builder(live.families)  # type: ignore[attr-defined]
    return live
