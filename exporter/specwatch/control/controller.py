"""The SD controller: per target and model, keep SD, switch it off, or switch it back on.

vLLM cannot toggle SD at runtime (a switch is a restart with a new ``--speculative-config``),
so a switch is expensive and the controller is built to act rarely, visibly and reversibly
(the Kubernetes HPA ``behavior`` model, anchors-reliability §5):

* **States** per target and model: ``enabled``, ``disabled``, ``pending`` (a switch was
  requested and the server has not yet come back with the new configuration). The
  configuration is read from the page: SD families present or absent, configured k = number
  of ``position`` series; a restart shows as a counter reset.
* **Conditions.** Switch off when the acceptance rate is below ``min_acceptance_rate``, when
  the best predicted speedup at the live load (over every k, so a smaller k that still pays
  is a recommendation, not a switch) is below ``disable_below_speedup``, or when a configured
  Alertmanager alert fires. Switch on when the predicted speedup of the best k at the live
  load, with the last known good acceptance profile, is at least ``enable_above_speedup``.
  The gap between the two thresholds is the hysteresis band.
* **Guards.** A condition must hold at every poll for ``stabilization_seconds``; two switches
  are at least ``min_switch_interval_seconds`` apart; nothing happens on stale data (target
  down, model absent), on a window that is not complete or still spans the last switch, or
  on low traffic (``min_drafts_per_window`` with SD on, ``min_requests_per_window`` with SD
  off); while ``pending`` nothing new is decided until the server reports the requested
  configuration or ``pending_timeout_seconds`` passes.
* **Re-enabling is a probe.** With SD off, acceptance cannot be measured. The decision uses
  the model at the live load with the acceptance profile remembered from the last window
  that was healthy while SD was on (or the parameters file's profile). After a switch-off
  for low acceptance (or an alert), each consecutive one doubles the wait before the next
  re-enable (``min_switch_interval_seconds`` × 2^(n−1), capped by
  ``max_reenable_delay_seconds``; the count resets once SD stays on that long), so traffic
  that stays hard to draft for causes a few probes, not a restart loop.
* **Draft length.** The best k at the live load is exposed
  (``sd_controller_recommended_draft_length``) and sent with every decision together with a
  batch-size schedule for vLLM's ``num_speculative_tokens_per_batch_size`` (computed by the
  what-if ``advise`` code, not duplicated here).
* **Before/after.** Around every switch, P50 and P99 of end-to-end latency and TTFT over
  the decision window before and after are compared (``sd_switch_latency_ratio``) and logged
  as a JSON event.

The state machine (:class:`ModelController`) is pure: it is driven by :class:`Observation`
objects carrying the poll time, so tests script whole timelines with a fake clock. I/O lives
elsewhere: :class:`Controller` wires it into the pipeline (a target hook), the collector (a
family builder), the HTTP server (the Alertmanager receiver, ``GET /controller``), and
:mod:`specwatch.actuation` (delivery on a separate thread).
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from specwatch import derive, sources
from specwatch.actuation import (
    Actuator,
    CommandDelivery,
    Decision,
    Deliver,
    Outcome,
    WebhookDelivery,
)
from specwatch.errors import ConfigError
from specwatch.model import extend_profile, optimal_draft_length, reason_text
from specwatch.snapshot import ModelSnapshot, Snapshot, TargetSnapshot
from specwatch.web import Request, Response, only_get

if TYPE_CHECKING:  # pragma: no cover
    from specwatch.config import ServeConfig
    from specwatch.params import Params

log = logging.getLogger(__name__)
#: JSON events (one JSON object per log message): decisions, outcomes, switch records.
events_log = logging.getLogger("specwatch.controller.events")

MODES = ("recommend", "webhook", "command")
STATES = ("enabled", "disabled", "pending")
ACTIONS = ("disable", "enable")
#: (label value of `latency`, window histogram name) and the quantiles recorded per switch.
LATENCIES = (("e2e", "e2e_latency_seconds"), ("ttft", "ttft_seconds"))
#: (label value of `percentile`, quantile). The label is not `quantile`: promtool's lint
#: reserves that name for summaries, and a ratio of two quantiles is a gauge.
QUANTILES = (("50", 0.5), ("99", 0.99))
DEFAULT_ALERTS = ("SDAcceptanceRateLow",)
ALERTMANAGER_PATH = "/controller/alertmanager"
STATUS_PATH = "/controller"
_EPS = 1e-6


# ------------------------------------------------------------------------------ settings


@dataclass(frozen=True)
class Settings:
    """One target's validated ``controller:`` block (defaults: README, "Controller")."""

    mode: str = "recommend"
    models: tuple[str, ...] | None = None
    window: str = "5m"
    window_seconds: float | None = 300.0  # None: the count window (complete when present)
    disable_below_speedup: float = 1.05
    enable_above_speedup: float = 1.2
    min_acceptance_rate: float = 0.4
    stabilization_seconds: float = 300.0
    min_switch_interval_seconds: float = 600.0
    min_drafts_per_window: float = 500.0
    min_requests_per_window: float = 10.0
    pending_timeout_seconds: float = 900.0
    max_reenable_delay_seconds: float = 21600.0
    max_num_seqs: int = 256
    max_attempts: int = 5
    retry_backoff_seconds: float = 2.0
    max_retry_backoff_seconds: float = 60.0
    webhook_url: str | None = None
    webhook_timeout: float = 10.0
    webhook_headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    command: tuple[str, ...] | None = None
    command_timeout: float = 120.0


_SETTING_KEYS = ("disable_below_speedup", "enable_above_speedup", "min_acceptance_rate",
                 "stabilization_seconds", "min_switch_interval_seconds",
                 "min_drafts_per_window", "min_requests_per_window", "pending_timeout_seconds",
                 "max_reenable_delay_seconds", "max_num_seqs", "max_attempts",
                 "retry_backoff_seconds", "max_retry_backoff_seconds")


def _read_file_secret(path: str, where: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            value = fh.read().strip()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path!r}: {exc.strerror}") from exc
    if not value:
        raise ConfigError(f"{where}: the file {path!r} is empty")
    return value


def settings_from_raw(raw: Mapping[str, Any], where: str, path: str,
                      windows: Mapping[str, float | None], window: str) -> Settings:
    """Cross-key checks of one validated ``controller:`` block; reads header secrets.

    ``windows`` maps every computed window label to its length (None for the count window);
    ``window`` is the target's model window, which the controller decides on.
    """
    def fail(key: str, msg: str) -> ConfigError:
        return ConfigError(f"{where}: {path}.{key}: {msg}" if key else f"{where}: {path}: {msg}")

    values: dict[str, Any] = {k: raw[k] for k in _SETTING_KEYS if k in raw}
    mode = raw.get("mode", "recommend")
    s = Settings(mode=mode, **values)
    if s.enable_above_speedup <= s.disable_below_speedup:
        raise fail("enable_above_speedup",
                   f"must be above disable_below_speedup ({s.disable_below_speedup:g}): the "
                   f"gap between them is the hysteresis band, got {s.enable_above_speedup:g}")
    if s.max_retry_backoff_seconds < s.retry_backoff_seconds:
        raise fail("max_retry_backoff_seconds", "must be >= retry_backoff_seconds")
    if window not in windows:
        raise ConfigError(f"{where}: {path}: the controller decides on the model window "
                          f"{window!r}, which is not computed; expected one of "
                          f"{', '.join(windows)} (add it to global.windows)")
    webhook = raw.get("webhook")
    command = raw.get("command")
    if mode == "webhook" and webhook is None:
        raise fail("webhook", "mode webhook needs a webhook block with a url")
    if mode == "command" and (command is None or not command.get("argv")):
        raise fail("command.argv", "mode command needs a non-empty argv list")
    headers: dict[str, str] = {}
    if webhook is not None:
        headers.update(webhook.get("headers", {}))
        for name, fpath in webhook.get("headers_from_file", {}).items():
            headers[name] = _read_file_secret(fpath, f"{where}: {path}.webhook."
                                                     f"headers_from_file.{name}")
        for name, var in webhook.get("headers_from_env", {}).items():
            value = os.environ.get(var, "")
            if not value:
                raise fail(f"webhook.headers_from_env.{name}",
                           f"environment variable {var!r} is not set or empty")
            headers[name] = value
    return dataclasses.replace(
        s, models=tuple(raw["models"]) if "models" in raw else None, window=window,
        window_seconds=windows[window],
        webhook_url=webhook["url"] if webhook else None,
        webhook_timeout=webhook.get("timeout", 10.0) if webhook else 10.0,
        webhook_headers=headers,
        command=tuple(command["argv"]) if command else None,
        command_timeout=command.get("timeout", 120.0) if command else 120.0)


# ------------------------------------------------------------------------------ inputs


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
    histograms: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    live_speedup: float | None = None  # sd_predicted_speedup of the running configuration


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

    def rate_at(self, k: int) -> float | None:
        """vLLM's acceptance rate (accepted / proposed) this profile implies at draft length k.

        The rate depends on k (later positions accept less), so the switch-on guard compares
        min_acceptance_rate with the rate at the k that would run, not at the k measured.
        """
        if k <= 0:
            return None
        if self.positions:
            prof = extend_profile(self.positions, k)
            return float(sum(prof[:k])) / k
        if self.alpha is not None and 0.0 <= self.alpha < 1.0:
            a = self.alpha
            return (a - a ** (k + 1)) / (k * (1.0 - a)) if a > 0 else 0.0
        return self.acceptance_rate

    def as_json(self) -> dict[str, Any]:
        return {"source": self.source, "rate": _num(self.acceptance_rate),
                "per_position": [round(p, 6) for p in self.positions] or None,
                "alpha": _num(self.alpha), "draft_length": _num(self.draft_length),
                "measured_at": _iso(self.measured_at)}


@dataclass(frozen=True)
class Assessment:
    """The model's view at one poll: best k at the live load and what it buys."""

    valid: bool
    reason: str
    best_draft_length: int | None = None
    best_speedup: float | None = None
    current_speedup: float | None = None


Assessor = Callable[[Observation, AcceptanceProfile], Assessment]
Scheduler = Callable[[Observation, AcceptanceProfile], list[list[int]] | None]


def _num(x: float | None, digits: int = 6) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), digits)


def _iso(t: float | None) -> str | None:
    if t is None or not math.isfinite(t):
        return None
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def admissible_k_max(profile: AcceptanceProfile, k_max: int, min_acceptance_rate: float) -> int:
    """The largest k whose expected acceptance rate stays >= min_acceptance_rate.

    A recommendation that would trip the low-acceptance guard as soon as it runs would make
    the controller flap, so the model only chooses among these k (the rate is
    non-increasing in k, so they are 1..this value; 0 when none qualifies).
    """
    best = 0
    for k in range(1, k_max + 1):
        rate = profile.rate_at(k)
        if rate is None or rate >= min_acceptance_rate - 1e-12:
            best = k
        else:
            break
    return best


def _profile_kwargs(profile: AcceptanceProfile, k_max: int) -> dict[str, Any] | None:
    if profile.positions:
        return {"profile": tuple(float(x) for x in extend_profile(profile.positions, k_max))}
    if profile.alpha is not None and 0.0 <= profile.alpha < 1.0:
        return {"alpha": float(profile.alpha)}
    return None


def model_assessor(params: Params, min_acceptance_rate: float = 0.0) -> Assessor:
    """The latency model at the live load (λ, p, g of the window) with a given profile.

    The profile is extended to k_max as the live model series do (model.extend_profile), so
    the best k here is the one ``sd_optimal_draft_length`` shows when SD is on, except that
    k is limited to those whose expected acceptance rate stays at or above
    ``min_acceptance_rate`` (:func:`admissible_k_max`).
    """
    coef = params.model()

    def assess(obs: Observation, profile: AcceptanceProfile) -> Assessment:
        lam, p, g = obs.arrival_rate, obs.prompt_tokens, obs.generation_tokens
        missing = [n for n, x in (("arrival rate", lam), ("prompt length", p),
                                  ("generation length", g)) if x is None]
        if missing:
            return Assessment(False, "missing " + ", ".join(missing))
        k_max = admissible_k_max(profile, params.k_max, min_acceptance_rate)
        kwargs = _profile_kwargs(profile, max(k_max, 1))
        if kwargs is None:
            return Assessment(False, "no usable acceptance profile")
        opt = optimal_draft_length(coef, lam, p=p, g=g, k_max=k_max,
                                   max_utilization=params.max_utilization, **kwargs)
        if not bool(opt.valid):
            return Assessment(False, reason_text(int(opt.reason)))
        k = int(opt.k)
        speedup = float(opt.speedup) if k > 0 else 1.0
        current = obs.live_speedup if profile.source == "live" else None
        return Assessment(True, "ok", k, speedup, current)

    return assess


def model_scheduler(params: Params, max_num_seqs: int,
                    min_acceptance_rate: float = 0.0) -> Scheduler:
    """The batch-size schedule of the what-if `advise` command for a profile and load
    (k limited as in :func:`model_assessor`)."""
    from specwatch.whatif.advise import _schedule
    from specwatch.whatif.common import Acceptance

    coef = params.model()

    def schedule(obs: Observation, profile: AcceptanceProfile) -> list[list[int]] | None:
        if obs.prompt_tokens is None or obs.generation_tokens is None:
            return None
        k_max = admissible_k_max(profile, params.k_max, min_acceptance_rate)
        kwargs = _profile_kwargs(profile, max(k_max, 1))
        if kwargs is None or k_max < 1:
            return None
        acc = Acceptance(source="profile" if "profile" in kwargs else "alpha",
                         alpha=kwargs.get("alpha"), profile=kwargs.get("profile"))
        ranges, _ = _schedule(coef, acc, obs.prompt_tokens, obs.generation_tokens,
                              k_max, params.max_utilization, max_num_seqs)
        return ranges

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
            v = derive.histogram_quantile(q, buckets)
            if v is not None:
                out[(label, qlabel)] = v
    return out, count


# ------------------------------------------------------------------------------ state machine


@dataclass(frozen=True)
class ControllerStatus:
    """The controller's state of one model, attached to the snapshot (immutable)."""

    mode: str
    state: str | None
    observed_sd: bool | None
    recommended_draft_length: int | None
    transitions: Mapping[str, int]
    last_transition_timestamp: float | None
    actuation_errors: int
    latency_ratios: Mapping[tuple[str, str, str], float]
    detail: Mapping[str, Any]


@dataclass
class _Pending:
    decision: Decision
    since: float
    expects_sd: bool
    delivered: bool = False


@dataclass
class _Alert:
    alertname: str
    starts_at: float
    received_at: float


@dataclass
class _Record:
    action: str
    switched_at: float
    before: dict[tuple[str, str], float] | None


class ModelController:
    """The state machine of one model of one target (pure: no clock, no I/O).

    Drive it with :meth:`step` once per poll (``obs.t`` is the clock), :meth:`alert` for
    Alertmanager notifications and :meth:`finished` for delivery outcomes. Events (dicts)
    accumulate in ``events`` for the caller to log.
    """

    def __init__(self, target: str, model: str, settings: Settings,
                 assessor: Assessor | None = None, scheduler: Scheduler | None = None,
                 fallback_profile: AcceptanceProfile | None = None,
                 new_id: Callable[[], str] | None = None) -> None:
        self.target = target
        self.model = model
        self.s = settings
        self.assessor = assessor
        self.scheduler = scheduler
        self.fallback_profile = fallback_profile
        self._new_id = new_id or (lambda: uuid.uuid4().hex)
        self.state: str | None = None
        self.observed_sd: bool | None = None
        self.observed_k: int | None = None
        self.config_since = -math.inf
        self.pending: _Pending | None = None
        self.last_switch_at: float | None = None  # any switch, decided or observed
        self.last_transition_at: float | None = None  # decided by this controller
        self.transitions = dict.fromkeys(ACTIONS, 0)
        self.errors = 0
        self.strikes = 0  # consecutive switch-offs for low acceptance or an alert
        self.cond: str | None = None
        self.cond_since: float | None = None
        self.cond_reasons: list[tuple[str, str]] = []
        self.waiting: str | None = None
        self.blocked: str | None = "no poll yet"
        self.remembered: AcceptanceProfile | None = None
        self.profile: AcceptanceProfile | None = None
        self.assessment: Assessment | None = None
        self.alerts: dict[str, _Alert] = {}
        self.before: dict[tuple[str, str], float] | None = None
        self.record: _Record | None = None
        self.ratios: dict[tuple[str, str, str], float] = {}
        self.last_decision: dict[str, Any] | None = None
        self.events: list[dict[str, Any]] = []
        self._obs: Observation | None = None

    # -- events ------------------------------------------------------------------------------
    def _emit(self, event: str, t: float, **fields: Any) -> None:
        self.events.append({"event": event, "time": _iso(t), "target": self.target,
                            "model": self.model, **fields})

    def take_events(self) -> list[dict[str, Any]]:
        out, self.events = self.events, []
        return out

    # -- inputs ------------------------------------------------------------------------------
    def step(self, obs: Observation) -> Decision | None:
        """One poll: update the observed configuration, then maybe decide (at most one)."""
        now = obs.t
        self._obs = obs
        self._expire_pending(now)
        usable = obs.up and obs.present
        if usable and obs.sd_on is not None:
            self._track_configuration(obs)
        problem = self._data_problem(obs)
        # A recommendation may use a window that is not complete yet (as the live model
        # series do); decisions, remembered profiles and latency records may not.
        soft = problem if problem is None else self._data_problem(obs, for_decision=False)
        if problem is None:
            self._update_latency_record(obs)
        live = self._live_profile(obs) if soft is None and self.observed_sd else None
        if problem is None and live is not None and live.acceptance_rate is not None \
                and live.acceptance_rate >= self.s.min_acceptance_rate:
            self.remembered = dataclasses.replace(live, source="remembered")
        self.profile = live or self.remembered or self.fallback_profile
        self.assessment = None
        if soft is None and self.profile is not None and self.assessor is not None:
            self.assessment = self.assessor(obs, self.profile)
        self.blocked = problem
        self.waiting = None
        if self.state is None:
            return None
        if self.state == "pending":
            self._reset_condition()
            self.blocked = "pending: waiting for the server to report the requested configuration"
            return None
        if problem is not None:
            self._reset_condition()
            return None
        if self.state == "enabled":
            return self._consider_disable(now)
        return self._consider_enable(now)

    def alert(self, fingerprint: str, alertname: str, firing: bool, starts_at: float,
              now: float) -> None:
        """An Alertmanager notification for this model (firing or resolved)."""
        if not firing:
            if self.alerts.pop(fingerprint, None) is not None:
                self._emit("alert_resolved", now, alertname=alertname)
            return
        self.alerts[fingerprint] = _Alert(alertname, min(starts_at, now), now)
        self._emit("alert_firing", now, alertname=alertname, starts_at=_iso(starts_at))

    def finished(self, decision: Decision, outcome: Outcome, now: float) -> None:
        """The actuator's outcome: a failure leaves pending at once and is counted."""
        if outcome.ok:
            if self.pending is not None and self.pending.decision.id == decision.id:
                self.pending.delivered = True
            self._emit("actuation_delivered", now, decision_id=decision.id,
                       action=decision.action, attempts=outcome.attempts, detail=outcome.detail)
            return
        self.errors += 1
        self._emit("actuation_failed", now, decision_id=decision.id, action=decision.action,
                   attempts=outcome.attempts, error=outcome.detail)
        if self.pending is not None and self.pending.decision.id == decision.id:
            self.pending = None
            self.state = self._observed_state()

    # -- configuration -----------------------------------------------------------------------
    def _observed_state(self) -> str | None:
        if self.observed_sd is None:
            return self.state if self.state != "pending" else None
        return "enabled" if self.observed_sd else "disabled"

    def _expire_pending(self, now: float) -> None:
        p = self.pending
        if p is None or now - p.since < self.s.pending_timeout_seconds:
            return
        self.errors += 1
        self.pending = None
        self.state = self._observed_state()
        self._emit("switch_timeout", now, decision_id=p.decision.id, action=p.decision.action,
                   waited_seconds=round(now - p.since, 3), delivered=p.delivered,
                   state=self.state)

    def _track_configuration(self, obs: Observation) -> None:
        now, sd, k = obs.t, bool(obs.sd_on), obs.configured_k
        if self.observed_sd is None:
            self.observed_sd, self.observed_k = sd, k
            if self.state is None:
                self.state = "enabled" if sd else "disabled"
                self._emit("initial_state", now, state=self.state, configured_k=k,
                           mode=self.s.mode)
            return
        if sd == self.observed_sd and (not sd or k == self.observed_k):
            return
        changed_sd = sd != self.observed_sd
        old_k = self.observed_k
        self.observed_sd, self.observed_k = sd, k
        self.config_since = now
        self._reset_condition()
        self.alerts = {f: a for f, a in self.alerts.items() if a.starts_at >= now - _EPS}
        if not changed_sd:
            self.last_switch_at = now
            self._emit("draft_length_changed", now, configured_k=k, previous=old_k)
            return
        action = "enable" if sd else "disable"
        self.record = _Record(action, now, self.before)
        self.before = None
        p = self.pending
        if self.state == "pending" and p is not None and p.expects_sd == sd:
            self.pending = None
            self.state = "enabled" if sd else "disabled"
            self._emit("switch_confirmed", now, decision_id=p.decision.id, action=action,
                       after_seconds=round(now - p.since, 3), configured_k=k)
            return
        # Not a switch this controller asked for: a restart happened all the same, so the
        # minimum interval counts from here.
        self.last_switch_at = now
        if self.s.mode != "recommend":
            if p is not None:
                self._emit("pending_cancelled", now, decision_id=p.decision.id)
                self.pending = None
            self.state = "enabled" if sd else "disabled"
            self._emit("external_change", now, action=action, configured_k=k)
        else:
            self._emit("observed_change", now, action=action, configured_k=k,
                       recommendation=self.state)

    # -- guards ------------------------------------------------------------------------------
    def _data_problem(self, obs: Observation, for_decision: bool = True) -> str | None:
        """Why this poll cannot be used (None: it can). ``for_decision=False`` relaxes the
        window rules (complete, after the last switch) for recommendations."""
        s = self.s
        if not obs.up:
            return "target down: no fresh data"
        if not obs.present:
            return "model not on the page"
        if obs.sd_on is None:
            return ("the page does not show the SD configuration (SGLang needs the "
                    "sglang:spec_num_steps gauge)")
        if not obs.window_found:
            return f"window {s.window} has no data yet"
        if for_decision and not obs.window_complete:
            return f"window {s.window} is not complete yet"
        if for_decision and (obs.window_start is None
                             or obs.window_start < self.config_since - _EPS):
            return f"window {s.window} still spans the last configuration change"
        if self.observed_sd:
            if obs.drafts < s.min_drafts_per_window:
                return (f"low traffic: {obs.drafts:.0f} drafts in the window, "
                        f"min_drafts_per_window is {s.min_drafts_per_window:g}")
        elif obs.requests < s.min_requests_per_window:
            return (f"low traffic: {obs.requests:.0f} finished requests in the window, "
                    f"min_requests_per_window is {s.min_requests_per_window:g}")
        if obs.arrival_rate is None:
            return "no arrival rate in the window"
        return None

    def _live_profile(self, obs: Observation) -> AcceptanceProfile | None:
        if obs.acceptance_rate is None and obs.alpha is None and not obs.positions:
            return None
        return AcceptanceProfile("live", positions=obs.positions, alpha=obs.alpha,
                                 acceptance_rate=obs.acceptance_rate,
                                 draft_length=obs.draft_length, measured_at=obs.t)

    def _reset_condition(self) -> None:
        self.cond, self.cond_since, self.cond_reasons = None, None, []

    def _active_alert(self) -> tuple[float | None, str | None]:
        live = [a for a in self.alerts.values() if a.starts_at >= self.config_since - _EPS]
        if not live:
            return None, None
        first = min(live, key=lambda a: a.starts_at)
        return first.starts_at, first.alertname

    def reenable_delay(self) -> float:
        """Wait after a switch-off before a re-enable (the probe backoff)."""
        if self.strikes <= 0:
            return self.s.min_switch_interval_seconds
        return min(self.s.min_switch_interval_seconds * 2 ** (self.strikes - 1),
                   max(self.s.max_reenable_delay_seconds, self.s.min_switch_interval_seconds))

    # -- decisions ---------------------------------------------------------------------------
    def _consider_disable(self, now: float) -> Decision | None:
        s, obs, a = self.s, self._obs, self.assessment
        assert obs is not None
        if self.strikes and self.last_switch_at is not None \
                and now - self.last_switch_at >= s.max_reenable_delay_seconds:
            self.strikes = 0
        reasons: list[tuple[str, str]] = []
        if self.observed_sd and obs.acceptance_rate is not None \
                and obs.acceptance_rate < s.min_acceptance_rate:
            reasons.append(("low_acceptance",
                            f"acceptance rate {obs.acceptance_rate:.3f} below "
                            f"min_acceptance_rate {s.min_acceptance_rate:g}"))
        if a is not None and a.valid and a.best_speedup is not None \
                and a.best_speedup < s.disable_below_speedup:
            reasons.append(("low_predicted_speedup",
                            f"best predicted speedup {a.best_speedup:.3f} (k="
                            f"{a.best_draft_length}) below disable_below_speedup "
                            f"{s.disable_below_speedup:g} at {obs.arrival_rate:.3g} req/s"))
        alert_since, alert_name = self._active_alert()
        if alert_name is not None:
            reasons.append(("alert", f"Alertmanager alert {alert_name} firing"))
        return self._hold("disable", reasons, now, alert_since)

    def _consider_enable(self, now: float) -> Decision | None:
        s, obs, a, prof = self.s, self._obs, self.assessment, self.profile
        assert obs is not None
        reasons: list[tuple[str, str]] = []
        if prof is None:
            self.waiting = "no acceptance profile known (no healthy window with SD on, no " \
                           "acceptance_profile in the parameters file)"
        elif a is None:
            self.waiting = "no latency model for this target (params)"
        elif not a.valid:
            self.waiting = f"no valid prediction: {a.reason}"
        elif a.best_draft_length and (rate := prof.rate_at(a.best_draft_length)) is not None \
                and rate < s.min_acceptance_rate:
            self.waiting = (f"acceptance rate {rate:.3f} expected at k={a.best_draft_length} "
                            f"({prof.source} profile) below min_acceptance_rate "
                            f"{s.min_acceptance_rate:g}")
        elif self._active_alert()[1] is not None:
            self.waiting = "a switch-off alert is firing"
        elif a.best_draft_length and a.best_speedup is not None \
                and a.best_speedup >= s.enable_above_speedup:
            reasons.append(("predicted_speedup",
                            f"predicted speedup {a.best_speedup:.3f} at k="
                            f"{a.best_draft_length} ({prof.source} acceptance profile) at or "
                            f"above enable_above_speedup {s.enable_above_speedup:g} at "
                            f"{obs.arrival_rate:.3g} req/s"))
        return self._hold("enable", reasons, now, None)

    def _hold(self, action: str, reasons: list[tuple[str, str]], now: float,
              alert_since: float | None) -> Decision | None:
        """Apply the stabilization window and the minimum interval, then decide."""
        s = self.s
        if not reasons:
            self._reset_condition()
            return None
        if self.cond != action or self.cond_since is None:
            self.cond, self.cond_since = action, now
        if alert_since is not None:
            # The alert's own history counts (it fired after its `for`), but never from
            # before the running configuration.
            self.cond_since = min(self.cond_since, max(min(alert_since, now), self.config_since))
        self.cond_reasons = reasons
        held = now - self.cond_since
        if held < s.stabilization_seconds - 1e-9:
            self.waiting = f"{action}: condition held {held:.0f}s of {s.stabilization_seconds:g}s"
            return None
        if self.last_switch_at is not None:
            since = now - self.last_switch_at
            need = self.reenable_delay() if action == "enable" else s.min_switch_interval_seconds
            if since < need - 1e-9:
                self.waiting = f"{action}: {since:.0f}s since the last switch, need {need:g}s"
                return None
        return self._decide(action, reasons, now)

    def _decide(self, action: str, reasons: list[tuple[str, str]], now: float) -> Decision:
        code = reasons[0][0]
        text = "; ".join(r for _, r in reasons)
        decision = Decision(id=self._new_id(), target=self.target, model=self.model,
                            action=action, reason_code=code, reason=text, decided_at=now,
                            payload={})
        decision = dataclasses.replace(decision, payload=self._payload(decision))
        self.transitions[action] += 1
        self.last_transition_at = now
        self.last_switch_at = now
        if action == "disable" and any(c in ("low_acceptance", "alert") for c, _ in reasons):
            self.strikes += 1
        self._reset_condition()
        self.last_decision = {"decision_id": decision.id, "action": action, "reason_code": code,
                              "reason": text, "at": _iso(now)}
        if self.s.mode == "recommend":
            self.state = "disabled" if action == "disable" else "enabled"
            self._emit("recommendation", now, **decision.payload)
        else:
            self.pending = _Pending(decision, now, expects_sd=action == "enable")
            self.state = "pending"
            self._emit("decision", now, **decision.payload)
        return decision

    def _payload(self, d: Decision) -> dict[str, Any]:
        obs, a, prof = self._obs, self.assessment, self.profile
        assert obs is not None
        schedule = None
        if self.scheduler is not None and prof is not None:
            try:
                schedule = self.scheduler(obs, prof)
            except Exception:  # the schedule is advice; never lose the decision over it
                log.exception("computing the batch-size schedule failed")
        k = a.best_draft_length if a is not None and a.valid else None
        update = None
        dynamic = None
        if d.action == "enable" and k:
            update = {"num_speculative_tokens": int(k)}
            top = max((r[2] for r in schedule), default=0) if schedule else 0
            if top > 0:
                dynamic = {"num_speculative_tokens": int(top),
                           "num_speculative_tokens_per_batch_size": schedule}
        return {
            "version": 1,
            "decision_id": d.id,
            "target": d.target,
            "model": d.model,
            "action": d.action,
            "reason_code": d.reason_code,
            "reason": d.reason,
            "decided_at": _iso(d.decided_at),
            "mode": self.s.mode,
            "predicted_speedup": {
                "current": _num(a.current_speedup) if a else None,
                "best": _num(a.best_speedup) if a and a.valid else None,
                "thresholds": {"disable_below": self.s.disable_below_speedup,
                               "enable_above": self.s.enable_above_speedup}},
            "acceptance": prof.as_json() if prof else None,
            "arrival_rate": _num(obs.arrival_rate),
            "configured_draft_length": self.observed_k,
            "recommended_draft_length": k,
            "schedule": schedule,
            "speculative_config_update": update,
            "dynamic_speculative_config_update": dynamic,
        }

    # -- before/after record -----------------------------------------------------------------
    def _update_latency_record(self, obs: Observation) -> None:
        quantiles, count = window_quantiles(obs.histograms)
        if not quantiles or count < max(1.0, self.s.min_requests_per_window):
            return
        rec = self.record
        if rec is not None and obs.window_start is not None \
                and obs.window_start >= rec.switched_at - _EPS:
            ratios = {}
            if rec.before:
                for key, after in quantiles.items():
                    before = rec.before.get(key)
                    if before and before > 0:
                        ratios[(rec.action, *key)] = after / before
            self.ratios = ratios
            self.record = None
            self._emit("switch_latency", obs.t, action=rec.action,
                       switched_at=_iso(rec.switched_at), window=self.s.window,
                       before={f"{lat}_p{q}": _num(v) for (lat, q), v in
                               (rec.before or {}).items()} or None,
                       after={f"{lat}_p{q}": _num(v) for (lat, q), v in quantiles.items()},
                       ratio={f"{lat}_p{q}": _num(v) for (_a, lat, q), v in ratios.items()})
        self.before = quantiles

    # -- status ------------------------------------------------------------------------------
    def status(self) -> ControllerStatus:
        a = self.assessment
        detail = {
            "blocked": self.blocked,
            "waiting": self.waiting,
            "condition": self.cond,
            "condition_since": _iso(self.cond_since),
            "condition_reasons": [r for _, r in self.cond_reasons],
            "pending": None if self.pending is None else {
                "decision_id": self.pending.decision.id,
                "action": self.pending.decision.action, "since": _iso(self.pending.since),
                "delivered": self.pending.delivered},
            "last_decision": self.last_decision,
            "acceptance_profile": self.profile.as_json() if self.profile else None,
            "assessment": None if a is None else {
                "valid": a.valid, "reason": a.reason, "best_draft_length": a.best_draft_length,
                "best_speedup": _num(a.best_speedup),
                "current_speedup": _num(a.current_speedup)},
            "reenable_delay_seconds": self.reenable_delay(),
            "configured_k": self.observed_k,
        }
        return ControllerStatus(
            mode=self.s.mode, state=self.state, observed_sd=self.observed_sd,
            recommended_draft_length=a.best_draft_length if a is not None and a.valid else None,
            transitions=dict(self.transitions), last_transition_timestamp=self.last_transition_at,
            actuation_errors=self.errors, latency_ratios=dict(self.ratios), detail=detail)


# ------------------------------------------------------------------------------ observations


def observe(target: TargetSnapshot, model_name: str, window: str,
            window_seconds: float | None) -> Observation:
    """Build one model's observation from a target snapshot (pure)."""
    t = target.timestamp if target.timestamp is not None else 0.0
    if not target.up:
        return Observation(t=t)
    m: ModelSnapshot | None = target.models.get(model_name)
    if m is None:
        return Observation(t=t, up=True)
    w = m.window(window)
    drafts = w.drafts if w is not None else 0.0
    sd_on: bool | None
    if m.engine in ("vllm", "vllm-v0"):
        sd_on = m.sd_families_present  # SD counters exist only with --speculative-config
    elif m.engine == "sglang" and sources.SGLANG_SPEC_STEPS in m.gauges:
        sd_on = m.gauges[sources.SGLANG_SPEC_STEPS] >= 1
    else:
        sd_on = None  # SGLang without the spec_num_steps gauge: configuration not visible
    if w is None:
        return Observation(t=t, up=True, present=True, sd_on=sd_on,
                           configured_k=m.configured_k)
    v = w.values
    rates = w.positions.get(derive.POSITION_ACCEPTANCE_RATE, {})
    positions = tuple(r for _, r in sorted(rates.items(), key=lambda kv: _pos_key(kv[0])))
    complete = True if window_seconds is None else w.span_seconds >= window_seconds - _EPS
    live = m.predictions
    live_speedup = getattr(live, "speedup", None) if getattr(live, "valid", False) else None
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
        histograms=dict(w.histograms), live_speedup=live_speedup)


def _pos_key(p: str) -> int:
    try:
        return int(p)
    except ValueError:
        return 1 << 30


# ------------------------------------------------------------------------------ wiring


@dataclass
class _TargetControl:
    name: str
    url: str
    settings: Settings
    assessor: Assessor | None
    scheduler: Scheduler | None
    fallback: AcceptanceProfile | None
    models: dict[str, ModelController] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    actuator: Actuator | None = None


@dataclass(frozen=True)
class ReceiverSettings:
    """The Alertmanager receiver: bearer token (from a file) and the alerts that mean "off"."""

    token: str = field(repr=False)
    alerts: tuple[str, ...] = DEFAULT_ALERTS


class Controller:
    """All controlled targets: pipeline hook, family builder, HTTP handlers, actuators.

    ``clock`` stamps Alertmanager notifications and delivery outcomes (the poll clock of
    ServeApp, so tests drive everything with one fake clock). ``deliver_factory`` and
    ``wait`` replace the webhook/command delivery and the retry sleep in tests.
    """

    def __init__(self, targets: Sequence[_TargetControl], receiver: ReceiverSettings | None,
                 clock: Callable[[], float] = time.time,
                 deliver_factory: Callable[[_TargetControl], Deliver | None] | None = None,
                 wait: Callable[[float], bool] | None = None) -> None:
        self.targets = {t.name: t for t in targets}
        self.receiver = receiver
        self.clock = clock
        self.alerts_received = dict.fromkeys(
            ("accepted", "resolved", "ignored_alertname", "ignored_target", "ignored_model"), 0)
        self._alerts_lock = threading.Lock()
        for tc in self.targets.values():
            deliver = (deliver_factory or default_delivery)(tc)
            if deliver is None:
                continue
            s = tc.settings
            tc.actuator = Actuator(
                tc.name, deliver, lambda d, o, tc=tc: self._finished(tc, d, o),
                max_attempts=s.max_attempts, backoff_seconds=s.retry_backoff_seconds,
                max_backoff_seconds=s.max_retry_backoff_seconds, wait=wait)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        for tc in self.targets.values():
            if tc.actuator is not None:
                tc.actuator.start()

    def stop(self, timeout: float = 5.0) -> None:
        for tc in self.targets.values():
            if tc.actuator is not None:
                tc.actuator.stop(timeout)

    # -- pipeline hook -----------------------------------------------------------------------
    def _machine(self, tc: _TargetControl, model: str) -> ModelController:
        mc = tc.models.get(model)
        if mc is None:
            mc = ModelController(tc.name, model, tc.settings, tc.assessor, tc.scheduler,
                                 tc.fallback)
            tc.models[model] = mc
        return mc

    def hook(self, target: TargetSnapshot) -> TargetSnapshot:
        """Step every controlled model of the target; attach the statuses to the snapshot."""
        tc = self.targets.get(target.name)
        if tc is None:
            return target
        decisions: list[Decision] = []
        with tc.lock:
            names = set(tc.models) | set(target.models)
            if tc.settings.models is not None:
                names &= set(tc.settings.models)
            for name in sorted(names):
                mc = self._machine(tc, name)
                obs = observe(target, name, tc.settings.window, tc.settings.window_seconds)
                decision = mc.step(obs)
                _log_events(mc)
                if decision is not None and tc.settings.mode != "recommend":
                    decisions.append(decision)
            statuses = {name: mc.status() for name, mc in tc.models.items()}
        for d in decisions:
            if tc.actuator is not None:
                tc.actuator.submit(d)
        out = dataclasses.replace(target, extensions={**target.extensions,
                                                      "controller": statuses})
        for name in out.models:
            if name in statuses:
                out = out.with_model(name, controller=statuses[name])
        return out

    def _finished(self, tc: _TargetControl, decision: Decision, outcome: Outcome) -> None:
        with tc.lock:
            mc = tc.models.get(decision.model)
            if mc is not None:
                mc.finished(decision, outcome, self.clock())
                _log_events(mc)

    # -- Alertmanager receiver ---------------------------------------------------------------
    def alertmanager_handler(self, req: Request) -> Response:
        """POST /controller/alertmanager: Alertmanager webhook (version 4), bearer token."""
        if self.receiver is None:
            return Response(404, b"not found\n")
        if req.method != "POST":
            return Response(405, b"method not allowed\n", headers={"Allow": "POST"})
        auth = req.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.strip().encode(), self.receiver.token.encode()):
            return Response(401, b"unauthorized\n",
                            headers={"WWW-Authenticate": 'Bearer realm="specwatch controller"'})
        try:
            alerts = parse_alertmanager(req.body)
        except ValueError as exc:
            return Response(400, f"bad Alertmanager webhook payload: {exc}\n".encode())
        results = [self._apply_alert(a) for a in alerts]
        body = json.dumps({"status": "ok", "alerts": results}, sort_keys=True).encode()
        return Response(200, body + b"\n", "application/json")

    def _resolve_target(self, labels: Mapping[str, str]) -> _TargetControl | None:
        name = labels.get("target")
        if name is not None:
            return self.targets.get(name)
        instance = labels.get("instance")
        if instance:
            for tc in self.targets.values():
                if urlsplit(tc.url).netloc.rsplit("@", 1)[-1] == instance:
                    return tc
        return None

    def _apply_alert(self, alert: Mapping[str, Any]) -> dict[str, Any]:
        assert self.receiver is not None
        labels = alert["labels"]
        name = labels.get("alertname", "")
        out: dict[str, Any] = {"alertname": name, "fingerprint": alert["fingerprint"]}
        outcome: str
        if name not in self.receiver.alerts:
            outcome = "ignored_alertname"
        else:
            tc = self._resolve_target(labels)
            if tc is None:
                outcome = "ignored_target"
            else:
                out["target"] = tc.name
                now = self.clock()
                model = labels.get("model_name")
                firing = alert["status"] == "firing"
                with tc.lock:
                    if model is not None:
                        names = [model] if tc.settings.models is None \
                            or model in tc.settings.models else []
                    else:
                        names = list(tc.models)
                    for m in names:
                        mc = self._machine(tc, m)
                        mc.alert(alert["fingerprint"], name, firing, alert["starts_at"], now)
                        _log_events(mc)
                if not names:
                    outcome = "ignored_model"
                else:
                    out["models"] = names
                    outcome = "accepted" if firing else "resolved"
        with self._alerts_lock:
            self.alerts_received[outcome] += 1
        if outcome.startswith("ignored"):
            log.info("Alertmanager alert %s (%s) ignored: %s", name,
                     labels.get("target", labels.get("instance", "?")), outcome)
        out["outcome"] = outcome
        return out

    # -- status ------------------------------------------------------------------------------
    def status_handler(self, _req: Request) -> Response:
        """GET /controller: every controlled model's state, conditions and last decision."""
        out: dict[str, Any] = {}
        for tc in self.targets.values():
            with tc.lock:
                models = {}
                for name, mc in tc.models.items():
                    st = mc.status()
                    models[name] = {
                        "state": st.state, "observed_sd": st.observed_sd,
                        "recommended_draft_length": st.recommended_draft_length,
                        "transitions": st.transitions,
                        "last_transition": _iso(st.last_transition_timestamp),
                        "actuation_errors": st.actuation_errors,
                        "latency_ratios": {f"{a}/{lat}/p{q}": _num(v) for (a, lat, q), v
                                           in st.latency_ratios.items()},
                        **st.detail}
            out[tc.name] = {"mode": tc.settings.mode, "window": tc.settings.window,
                            "models": models}
        body = json.dumps({"targets": out}, indent=2, sort_keys=True).encode()
        return Response(200, body + b"\n", "application/json")

    # -- metric families ---------------------------------------------------------------------
    def families(self, snap: Snapshot) -> Iterator[Metric]:
        """Collector family builder for the controller series (from the snapshot only)."""
        lbl = ["target", "model_name"]
        state = GaugeMetricFamily(
            "sd_controller_state", "Controller state of the target and model: 1 for the "
            "current state (enabled: SD on, disabled: SD off, pending: a switch was requested "
            "and the server has not come back with it yet), 0 for the others.",
            labels=[*lbl, "state"])
        rec_k = GaugeMetricFamily(
            "sd_controller_recommended_draft_length", "Draft length with the lowest predicted "
            "latency at the live load (0 = SD off), from the live or the last known good "
            "acceptance profile; absent without a valid prediction.", labels=lbl)
        trans = CounterMetricFamily(
            "sd_controller_transitions", "Switches decided by the controller, by action (in "
            "recommend mode: recommendations).", labels=[*lbl, "action"])
        last = GaugeMetricFamily(
            "sd_controller_last_transition_timestamp_seconds", "Unix time of the last switch "
            "the controller decided.", labels=lbl)
        errors = CounterMetricFamily(
            "sd_controller_actuation_errors", "Decisions that did not take effect: delivery "
            "failed after its retries, or the server did not report the requested "
            "configuration within pending_timeout_seconds.", labels=lbl)
        ratio = GaugeMetricFamily(
            "sd_switch_latency_ratio", "Latency quantile over the decision window after the "
            "last switch divided by the same quantile before it (below 1: the switch helped), "
            "for end-to-end latency and TTFT at the 50th and 99th percentile.",
            labels=[*lbl, "action", "latency", "percentile"])
        alerts = CounterMetricFamily(
            "specwatch_controller_alerts", "Alertmanager alerts received by the controller "
            "receiver, by outcome (accepted, resolved, ignored_alertname, ignored_target, "
            "ignored_model).", labels=["outcome"])
        for tname, target in snap.targets.items():
            statuses = target.extensions.get("controller")
            if not isinstance(statuses, Mapping):
                continue
            for mname, st in statuses.items():
                if not isinstance(st, ControllerStatus):
                    continue
                key = [tname, mname]
                if st.state is not None:
                    for s in STATES:
                        state.add_metric([*key, s], 1.0 if st.state == s else 0.0)
                if st.recommended_draft_length is not None:
                    rec_k.add_metric(key, float(st.recommended_draft_length))
                for action in ACTIONS:
                    trans.add_metric([*key, action], float(st.transitions.get(action, 0)))
                if st.last_transition_timestamp is not None:
                    last.add_metric(key, st.last_transition_timestamp)
                errors.add_metric(key, float(st.actuation_errors))
                for (action, lat, q), v in sorted(st.latency_ratios.items()):
                    ratio.add_metric([*key, action, lat, q], v)
        if self.receiver is not None:
            with self._alerts_lock:
                for outcome, n in self.alerts_received.items():
                    alerts.add_metric([outcome], float(n))
        for fam in (state, rec_k, trans, last, errors, ratio, alerts):
            if fam.samples:
                yield fam


def _log_events(mc: ModelController) -> None:
    for event in mc.take_events():
        events_log.info("%s", json.dumps(event, sort_keys=True, default=str))


def default_delivery(tc: _TargetControl) -> Deliver | None:
    s = tc.settings
    if s.mode == "webhook" and s.webhook_url:
        return WebhookDelivery(s.webhook_url, s.webhook_headers, s.webhook_timeout)
    if s.mode == "command" and s.command:
        return CommandDelivery(s.command, s.command_timeout)
    return None


# ------------------------------------------------------------------------------ Alertmanager


def _parse_time(value: Any, what: str) -> float:
    if not isinstance(value, str):
        raise ValueError(f"{what}: expected an RFC 3339 time string, got {value!r}")
    try:
        dt = datetime.fromisoformat(value)
    except ValueError as exc:
        raise ValueError(f"{what}: not an RFC 3339 time: {value!r}") from exc
    if dt.tzinfo is None:
        raise ValueError(f"{what}: time without a zone: {value!r}")
    return dt.timestamp()


def parse_alertmanager(body: bytes) -> list[dict[str, Any]]:
    """Validate an Alertmanager webhook body (version 4) and return its alerts.

    Each alert: {"status": firing|resolved, "labels": {str: str}, "starts_at": seconds,
    "fingerprint": str}. Raises ValueError naming the field that is wrong.
    """
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError("expected a JSON object")
    if doc.get("version") != "4":
        raise ValueError(f"version: expected \"4\" (Alertmanager webhook format), got "
                         f"{doc.get('version')!r}")
    alerts = doc.get("alerts")
    if not isinstance(alerts, list):
        raise ValueError("alerts: expected a list")
    out = []
    for i, a in enumerate(alerts):
        where = f"alerts[{i}]"
        if not isinstance(a, dict):
            raise ValueError(f"{where}: expected an object")
        status = a.get("status")
        if status not in ("firing", "resolved"):
            raise ValueError(f"{where}.status: expected firing or resolved, got {status!r}")
        labels = a.get("labels")
        if not isinstance(labels, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise ValueError(f"{where}.labels: expected an object of strings")
        if not labels.get("alertname"):
            raise ValueError(f"{where}.labels.alertname: missing")
        starts = _parse_time(a.get("startsAt"), f"{where}.startsAt")
        fingerprint = a.get("fingerprint")
        if fingerprint is None:
            fingerprint = json.dumps(sorted(labels.items()))
        elif not isinstance(fingerprint, str):
            raise ValueError(f"{where}.fingerprint: expected a string")
        out.append({"status": status, "labels": labels, "starts_at": starts,
                    "fingerprint": fingerprint})
    return out


# ------------------------------------------------------------------------------ construction


def from_config(cfg: ServeConfig, params: Mapping[str, Params],
                model_windows: Mapping[str, str], clock: Callable[[], float] = time.time,
                deliver_factory: Callable[[_TargetControl], Deliver | None] | None = None,
                wait: Callable[[float], bool] | None = None) -> Controller | None:
    """Build the controller from the serve configuration (None when no target has one).

    ``params`` and ``model_windows`` are the live model's (the same parameters files and
    the same window as the sd_predicted_* series). Errors are ConfigError naming the key.
    """
    where = cfg.source
    windows: dict[str, float | None] = {label: secs for label, secs in cfg.windows}
    if cfg.count_window > 0:
        windows[f"{cfg.count_window}req"] = None
    targets: list[_TargetControl] = []
    n_file = len(cfg.raw.get("targets", []))
    for i, t in enumerate(cfg.targets):
        raw = t.raw.get("controller")
        if raw is None:
            continue
        path = f"targets[{i}].controller" if i < n_file else "--target controller"
        window = model_windows.get(t.name, "5m")
        s = settings_from_raw(raw, where, path, windows, window)
        p = params.get(t.name)
        targets.append(_TargetControl(
            t.name, t.url, s, model_assessor(p, s.min_acceptance_rate) if p else None,
            model_scheduler(p, s.max_num_seqs, s.min_acceptance_rate) if p else None,
            params_profile(p)))
        if p is None:
            log.warning("controller for %s has no parameters file (params): it can switch SD "
                        "off on low acceptance or alerts, but never recommends switching it "
                        "on", t.name)
    receiver = None
    am = cfg.raw.get("controller", {}).get("alertmanager")
    if am is not None:
        token = _read_file_secret(am["token_file"], f"{where}: controller.alertmanager.token_file")
        receiver = ReceiverSettings(token, tuple(am.get("alerts", DEFAULT_ALERTS)))
    if not targets and receiver is None:
        return None
    return Controller(targets, receiver, clock=clock, deliver_factory=deliver_factory,
                      wait=wait)


def install(app: Any) -> Controller | None:
    """Wire the controller into a ServeApp (hook, families, routes); None when unused."""
    live = app.model
    ctl = from_config(app.cfg, live.params, live.windows, clock=app.clock)
    if ctl is None:
        return None
    app.pipeline.add_target_hook(ctl.hook)
    app.collector.add_family_builder(ctl.families)
    app.web.routes[STATUS_PATH] = only_get(ctl.status_handler)
    if ctl.receiver is not None:
        app.web.routes[ALERTMANAGER_PATH] = ctl.alertmanager_handler
        app.web.own_auth_paths.add(ALERTMANAGER_PATH)
    return ctl
