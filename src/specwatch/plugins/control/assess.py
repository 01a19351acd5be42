"""What the controller sees and how the model judges it: :class:`Observation` (one poll of one
model, built from the exporter's snapshot by :func:`observe`), the remembered acceptance
profile, and the assessors that ask the latency model for the best predicted speedup and k at
the live load (and the batch-size schedule of :mod:`specwatch.model.schedule`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from specwatch.engines import registry
from specwatch.model import bestk, extend_profile, reason_text
from specwatch.model.schedule import Workload, batch_schedule
from specwatch.plugins.control.jsonview import iso_time, json_number
from specwatch.plugins.control.settings import EPS, LATENCIES, QUANTILES
from specwatch.poll import formulas
from specwatch.poll.snapshot import ModelSnapshot, TargetSnapshot
from specwatch.poll.windows import derive

if TYPE_CHECKING:  # pragma: no cover
    from specwatch.model.params import Params


@dataclass(frozen=True)
class Observation:
    """What one poll says about one model, from the controller's decision window."""

    t: float
    up: bool = False
    present: bool = False
    sd_on: bool | None = None  # None: the page does not show the SD configuration
    configured_k: int | None = None
    window_found: bool = False
    window_complete: bool = False
    window_start: float | None = None
    drafts: float = 0.0
    requests: float = 0.0
    acceptance_rate: float | None = None
    acceptance_length: float | None = None
    draft_length: float | None = None
    alpha: float | None = None
    positions: tuple[float, ...] = ()
    arrival_rate: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    mean_latency: float | None = None  # mean e2e latency of the window (switch records)
    histograms: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    live_speedup: float | None = None  # sd_predicted_speedup of the running configuration
    live_optimal_k: int | None = None  # sd_optimal_draft_length (the model, no guard)
    measured: MeasuredFigures | None = None  # the A/B pair's measured speedup, if any

    @property
    def independent_alpha(self) -> tuple[float, str] | None:
        """The draft-length-independent α of the window and how it was made (first-position
        acceptance, else the per-token α): what ``min_acceptance_alpha`` is compared with."""
        return formulas.draft_length_independent_alpha(
            self.positions[0] if self.positions else None, self.alpha)


class LiveFigures(Protocol):
    """What the controller reads of the live model's prediction for the running
    configuration (the live plug-in's prediction has these fields; the application hands
    the controller a reader, so neither plug-in imports the other)."""

    valid: bool
    speedup: float | None
    optimal_draft_length: int | None


#: Reads the live model's prediction of one model's snapshot (None when there is none).
LiveReader = Callable[[ModelSnapshot], "LiveFigures | None"]


class MeasuredFigures(Protocol):
    """What the controller reads of a measured A/B pair whose SD side is the controlled
    target: the mean e2e speedup (baseline / SD) of the bin the pair is at now (arrival
    rate and acceptance band) and its 90% interval (the pairs plug-in's
    ``sd_measured_speedup{statistic="mean"}`` and its bounds)."""

    pair: str
    speedup: float
    lower: float
    upper: float


#: Reads the measured A/B speedup of (target, model) now (None without a compared bin).
MeasuredReader = Callable[[str, str], "MeasuredFigures | None"]


@dataclass(frozen=True)
class AcceptanceProfile:
    """What the model needs to know about acceptance, and where it came from.

    ``positions`` is P(first i+1 drafts accepted) per position (empty: use ``alpha``);
    ``source`` is "live" (this window), "remembered" (the last healthy window with SD on) or
    "params" (the parameters file).
    """

    source: str
    positions: tuple[float, ...] = ()
    alpha: float | None = None
    acceptance_rate: float | None = None
    draft_length: float | None = None
    measured_at: float | None = None

    def independent_alpha(self) -> tuple[float, str] | None:
        """The profile's draft-length-independent α (first position, else the per-token α)
        and its method: the same at every k, so the guard means the same whatever k runs."""
        return formulas.draft_length_independent_alpha(
            self.positions[0] if self.positions else None, self.alpha)

    def as_json(self) -> dict[str, Any]:
        ind = self.independent_alpha()
        return {"source": self.source, "rate": json_number(self.acceptance_rate),
                "independent_alpha": json_number(ind[0]) if ind else None,
                "independent_alpha_method": ind[1] if ind else None,
                "per_position": [round(p, 6) for p in self.positions] or None,
                "alpha": json_number(self.alpha), "draft_length": json_number(self.draft_length),
                "measured_at": iso_time(self.measured_at)}


@dataclass(frozen=True)
class Assessment:
    """The model's view at one poll: best k at the live load and what it buys."""

    valid: bool
    reason: str
    best_draft_length: int | None = None
    best_speedup: float | None = None
    current_speedup: float | None = None
    #: 90% interval (lower, upper) of best_speedup (None: the parameters file has no
    #: residual spread, or SD off is best): the controller does not switch while it
    #: straddles its hysteresis threshold (reason `uncertain`).
    best_speedup_interval: tuple[float, float] | None = None
    #: The largest k the acceptance guard admits (:func:`admissible_k_max`): 0 when the
    #: profile's α is below min_acceptance_alpha; None: no limit. The best k and speedup
    #: above are the model's own (unguarded): what SD would buy, whatever the guard says.
    k_limit: int | None = None

    @property
    def guarded_draft_length(self) -> int | None:
        """The best k the guard admits (0: SD off); None without a valid assessment."""
        if not self.valid or self.best_draft_length is None:
            return None
        return min(self.best_draft_length, self.k_limit) if self.k_limit is not None \
            else self.best_draft_length


Assessor = Callable[[Observation, AcceptanceProfile], Assessment]
Scheduler = Callable[[Observation, AcceptanceProfile], list[list[int]] | None]


def admissible_k_max(profile: AcceptanceProfile, k_max: int, min_acceptance_alpha: float) -> int:
    """The largest k the acceptance guard admits: all (``k_max``) when the profile's
    draft-length-independent α is at or above ``min_acceptance_alpha`` (or unknown), none (0)
    below it.

    vLLM's acceptance rate falls with k by construction, so a guard on it cut k at a level
    that depended on k. The α used here is the same at every k, so the guard no longer
    chooses k: the model does (the profile's later positions price a longer draft), and the
    guard only says whether the drafter is accepted often enough for SD at all.
    """
    ind = profile.independent_alpha()
    if ind is None or ind[0] >= min_acceptance_alpha - 1e-12:
        return k_max
    return 0


def sd_pays(a: Assessment | None, measured: MeasuredFigures | None, threshold: float
            ) -> list[str]:
    """The evidence that SD pays beyond the hysteresis band (the level that would switch SD
    on, ``threshold`` = enable_above_speedup), in words: a valid predicted speedup whose
    90% interval (or the value, without one) is at or above it, and a measured A/B
    speedup whose 90% interval is at or above it. Empty when neither shows it."""
    out = []
    if a is not None and a.valid and a.best_draft_length and a.best_speedup is not None:
        iv = a.best_speedup_interval
        low = iv[0] if iv is not None else a.best_speedup
        if low >= threshold and a.best_speedup >= threshold:
            band = f" (90% interval {iv[0]:.2f}-{iv[1]:.2f})" if iv is not None else ""
            out.append(f"the model predicts {a.best_speedup:.2f}x at k={a.best_draft_length}"
                       f"{band}")
    if measured is not None and measured.lower >= threshold:
        out.append(f"the A/B pair {measured.pair} measures {measured.speedup:.2f}x (90% "
                   f"interval {measured.lower:.2f}-{measured.upper:.2f})")
    return out


def _profile_kwargs(profile: AcceptanceProfile, k_max: int) -> dict[str, Any] | None:
    if profile.positions:
        return {"profile": tuple(float(x) for x in extend_profile(profile.positions, k_max))}
    if profile.alpha is not None and 0.0 <= profile.alpha < 1.0:
        return {"alpha": float(profile.alpha)}
    return None


def model_assessor(params: Params, min_acceptance_alpha: float = 0.0) -> Assessor:
    """The latency model at the live load (λ, p, g of the window) with a given profile.

    The profile is extended to k_max as the live model series do (model.extend_profile), so
    the best k here (model.bestk: the model's optimum where its own prediction is vouched
    for, else the best vouched k it cannot be told from, else none and no decision) is the
    one ``sd_optimal_draft_length`` shows when SD is on. The guard
    (:func:`admissible_k_max`) does not change it; it sets ``k_limit`` to 0 when the
    profile's α is below ``min_acceptance_alpha``.
    """
    def assess(obs: Observation, profile: AcceptanceProfile) -> Assessment:
        lam, p, g = obs.arrival_rate, obs.prompt_tokens, obs.generation_tokens
        missing = [n for n, x in (("arrival rate", lam), ("prompt length", p),
                                  ("generation length", g)) if x is None]
        if missing:
            return Assessment(False, "missing " + ", ".join(missing))
        k_max = params.k_max
        limit = admissible_k_max(profile, k_max, min_acceptance_alpha)
        kwargs = _profile_kwargs(profile, k_max)
        if kwargs is None:
            return Assessment(False, "no usable acceptance profile")
        # The best k by the rule every command shows (model.bestk): never a switch to a k
        # whose own prediction is not vouched for.
        best = bestk.best_draft_length(params, lam, p, g, k_max=k_max, **kwargs)
        opt = best.optimum
        if not bool(best.shown):
            if not bool(opt.valid):
                return Assessment(False, reason_text(int(opt.reason)))
            kv = int(best.vouched_k)
            return Assessment(False, f"best k = {int(opt.k)} not vouched for: "
                              + ", ".join(best.optimum_reasons[()])
                              + (f"; it is predicted {float(best.gain):.2%} faster than the "
                                 f"best vouched k = {kv}, more than the two 90% latency "
                                 "intervals admit" if kv >= 0 else ""))
        k = int(best.k)
        speedup = float(best.speedup) if k > 0 else 1.0
        current = obs.live_speedup if profile.source == "live" else None
        judged = _judged(params, lam, k, p, g, kwargs)
        return Assessment(True, "ok", k, speedup, current, _speedup_interval(judged),
                          k_limit=limit if limit < k_max else None)

    return assess


def _judged(params: Params, lam: float, k: int, p: float, g: float,
            kwargs: Mapping[str, Any]) -> Any:
    """model.validity.assess of the prediction at k, for its speedup interval (None for
    k = 0: SD off is speedup 1)."""
    if k <= 0:
        return None
    from specwatch.model import acceptance_length_from_alpha, acceptance_length_from_profile
    from specwatch.model.validity import assess

    e = (acceptance_length_from_profile(kwargs["profile"], k) if "profile" in kwargs
         else acceptance_length_from_alpha(kwargs["alpha"], k))
    return assess(params, lam, float(k), float(e), p, g)


def _speedup_interval(judged: Any) -> tuple[float, float] | None:
    """The 90% interval of the predicted speedup at the best k (None without one)."""
    if judged is None or judged.intervals is None:
        return None
    lo, hi = (float(x) for x in judged.intervals.speedup)
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else None


def model_scheduler(params: Params, max_num_seqs: int,
                    min_acceptance_alpha: float = 0.0) -> Scheduler:
    """The batch-size schedule (:mod:`specwatch.model.schedule`, as `advise` gives it) for a
    profile and load (k limited as in :func:`model_assessor`)."""
    coef = params.model()

    def schedule(obs: Observation, profile: AcceptanceProfile) -> list[list[int]] | None:
        if obs.prompt_tokens is None or obs.generation_tokens is None:
            return None
        k_max = admissible_k_max(profile, params.k_max, min_acceptance_alpha)
        kwargs = _profile_kwargs(profile, max(k_max, 1))
        if kwargs is None or k_max < 1:
            return None
        workload = Workload(obs.prompt_tokens, obs.generation_tokens, k_max,
                            params.max_utilization, alpha=kwargs.get("alpha"),
                            profile=kwargs.get("profile"))
        return batch_schedule(coef, workload, max_num_seqs).ranges

    return schedule


def params_profile(params: Params | None) -> AcceptanceProfile | None:
    """The parameters file's acceptance profile, the fallback before any healthy window."""
    if params is None or not params.acceptance_profile:
        return None
    prof = tuple(float(x) for x in params.acceptance_profile)
    return AcceptanceProfile("params", positions=prof, acceptance_rate=sum(prof) / len(prof),
                             draft_length=float(len(prof)))


def window_quantiles(histograms: Mapping[str, Sequence[tuple[float, float]]]
                     ) -> tuple[dict[tuple[str, str], float], float]:
    """{(latency, quantile): seconds} of a window and its number of finished requests."""
    out: dict[tuple[str, str], float] = {}
    count = 0.0
    for label, name in LATENCIES:
        buckets = histograms.get(name)
        if not buckets:
            continue
        if label == "e2e":
            count = buckets[-1][1]
        for qlabel, q in QUANTILES:
            v = formulas.histogram_quantile(q, buckets)
            if v is not None:
                out[(label, qlabel)] = v
    return out, count


def observe(target: TargetSnapshot, model_name: str, window: str,
            window_seconds: float | None, live_of: LiveReader | None = None,
            measured_of: MeasuredReader | None = None) -> Observation:
    """Build one model's observation from a target snapshot (pure); ``live_of`` reads the
    live model's prediction for it, ``measured_of`` the measured A/B speedup."""
    t = target.timestamp if target.timestamp is not None else 0.0
    if not target.up:
        return Observation(t=t)
    m: ModelSnapshot | None = target.models.get(model_name)
    if m is None:
        return Observation(t=t, up=True)
    w = m.window(window)
    drafts = w.drafts if w is not None else 0.0
    sd_on: bool | None
    # The engine says: SD-only counters on the page, a configuration gauge, or nothing.
    sd_on = registry.sd_configured(m.engine, m.sd_families_present, m.gauges)
    if w is None:
        return Observation(t=t, up=True, present=True, sd_on=sd_on,
                           configured_k=m.configured_k)
    v = w.values
    rates = w.positions.get(derive.POSITION_ACCEPTANCE_RATE, {})
    positions = tuple(r for _, r in sorted(rates.items(), key=lambda kv: _pos_key(kv[0])))
    complete = True if window_seconds is None else w.span_seconds >= window_seconds - EPS
    live = live_of(m) if live_of is not None else None
    vouched = live is not None and live.valid
    live_speedup = live.speedup if vouched else None
    live_k = live.optimal_draft_length if vouched else None
    return Observation(
        t=t, up=True, present=True, sd_on=sd_on, configured_k=m.configured_k,
        window_found=True, window_complete=complete, window_start=t - w.span_seconds,
        drafts=drafts, requests=w.requests,
        acceptance_rate=v.get(derive.ACCEPTANCE_RATE),
        acceptance_length=v.get(derive.ACCEPTANCE_LENGTH),
        draft_length=v.get(derive.DRAFT_LENGTH),
        alpha=v.get(derive.TOKEN_ACCEPTANCE_PROBABILITY),
        positions=positions if sd_on else (),
        arrival_rate=v.get(derive.ARRIVAL_RATE),
        prompt_tokens=v.get(derive.MEAN_PROMPT_TOKENS),
        generation_tokens=v.get(derive.MEAN_GENERATION_TOKENS),
        mean_latency=v.get(derive.MEAN_LATENCY_SECONDS),
        histograms=dict(w.histograms), live_speedup=live_speedup,
        live_optimal_k=None if live_k is None else int(live_k),
        measured=measured_of(target.name, model_name) if measured_of is not None and sd_on
        else None)


def _pos_key(p: str) -> int:
    try:
        return int(p)
    except ValueError:
        return 1 << 30


#: Figures of a switch record's windows (``sd_switch_window_<name>``, calibration points).
SWITCH_FIGURES = ("latency_seconds", "arrival_rate", "prompt_tokens", "generation_tokens",
                  "draft_length", "acceptance_length")


def window_figures(obs: Observation) -> dict[str, float]:
    """What a decision window says about the system's operating point (a calibration point:
    λ, mean e2e latency, mean lengths and, with SD on, draft and acceptance length); only
    the figures the window has, finite."""
    out = {"latency_seconds": obs.mean_latency, "arrival_rate": obs.arrival_rate,
           "prompt_tokens": obs.prompt_tokens, "generation_tokens": obs.generation_tokens}
    if obs.sd_on:
        out["draft_length"] = obs.draft_length
        out["acceptance_length"] = obs.acceptance_length
    return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(v)}
