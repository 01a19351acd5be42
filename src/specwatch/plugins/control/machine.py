"""The per-model state machine (enabled / disabled / pending) with stabilization, minimum switch
interval, re-enable backoff and before/after latency records. Pure: driven by
:class:`~specwatch.plugins.control.assess.Observation` objects that carry the poll time, so tests
script whole timelines on a fake clock; actions leave through an injected delivery callable.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from specwatch.model import validity
from specwatch.plugins.control.actuation import (
    Decision,
    Outcome,
)
from specwatch.plugins.control.assess import (
    AcceptanceProfile,
    Assessment,
    Assessor,
    Observation,
    Scheduler,
    sd_pays,
)
from specwatch.plugins.control.jsonview import iso_time, json_number
from specwatch.plugins.control.records import SwitchRecords
from specwatch.plugins.control.settings import (
    ACTIONS,
    EPS,
    Settings,
)
from specwatch.poll import formulas

log = logging.getLogger(__name__)


#: How each draft-length-independent α is made, in words (formulas' method labels).
_ALPHA_TEXT = {formulas.ALPHA_FIRST_POSITION: "first-position acceptance",
               formulas.ALPHA_PER_TOKEN: "per-token α from acceptance length and k"}

#: Firing alerts remembered per model (distinct fingerprints); the oldest goes first.
MAX_ALERTS_PER_MODEL = 64

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
    #: The last complete switch record as calibration points: ``action``, ``switched_at``
    #: and the ``before`` / ``after`` window figures (see `window_figures`); None before one.
    switch_window: Mapping[str, Any] | None = None
    #: Why the state is what it is next to the model (a key of settings.REASONS).
    reason: str = "no_data"


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
        self.hold: str | None = None  # REASONS code of `waiting`
        self.disagreement: str | None = None  # why SD stays on against a switch-off
        self.blocked: str | None = "no poll yet"
        self.remembered: AcceptanceProfile | None = None
        self.profile: AcceptanceProfile | None = None
        self.assessment: Assessment | None = None
        self.alerts: dict[str, _Alert] = {}
        self.records = SwitchRecords()
        self.last_decision: dict[str, Any] | None = None
        self.events: list[dict[str, Any]] = []
        self._obs: Observation | None = None

    # -- events ------------------------------------------------------------------------------
    def _emit(self, event: str, t: float, **fields: Any) -> None:
        self.events.append({"event": event, "time": iso_time(t), "target": self.target,
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
        ind = live.independent_alpha() if live is not None else None
        if problem is None and live is not None and ind is not None \
                and ind[0] >= self.s.min_acceptance_alpha:
            self.remembered = dataclasses.replace(live, source="remembered")
        self.profile = live or self.remembered or self.fallback_profile
        self.assessment = None
        if soft is None and self.profile is not None and self.assessor is not None:
            self.assessment = self.assessor(obs, self.profile)
        self.blocked = problem
        self.waiting = None
        self.hold = None
        disagreed, self.disagreement = self.disagreement, None
        decision = self._consider(obs, problem)
        if problem is not None:
            self.disagreement = disagreed  # a poll without data neither starts nor ends one
        elif self.disagreement is not None and disagreed is None:
            self._emit("switch_off_held", now, reason=self.disagreement)
        return decision

    def _consider(self, obs: Observation, problem: str | None) -> Decision | None:
        now = obs.t
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
        if fingerprint not in self.alerts and len(self.alerts) >= MAX_ALERTS_PER_MODEL:
            # Bounded whatever Alertmanager sends: the oldest notification goes first.
            self.alerts.pop(next(iter(self.alerts)))
        self.alerts[fingerprint] = _Alert(alertname, min(starts_at, now), now)
        self._emit("alert_firing", now, alertname=alertname, starts_at=iso_time(starts_at))

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
        self.alerts = {f: a for f, a in self.alerts.items() if a.starts_at >= now - EPS}
        if not changed_sd:
            self.last_switch_at = now
            self._emit("draft_length_changed", now, configured_k=k, previous=old_k)
            return
        action = "enable" if sd else "disable"
        self.records.switched(action, now)
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
                             or obs.window_start < self.config_since - EPS):
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

    def _uncertain(self, speedup: float, side: str, threshold: float,
                   iv: tuple[float, float]) -> None:
        self.waiting = (f"{validity.UNCERTAIN}: predicted speedup {speedup:.3f} is {side} "
                        f"{threshold:g} but its 90% interval [{iv[0]:.3f}, {iv[1]:.3f}] is not")
        self.hold = validity.UNCERTAIN

    def _reset_condition(self) -> None:
        self.cond, self.cond_since, self.cond_reasons = None, None, []

    def _active_alert(self) -> tuple[float | None, str | None]:
        live = [a for a in self.alerts.values() if a.starts_at >= self.config_since - EPS]
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
        ind = obs.independent_alpha if self.observed_sd else None
        if ind is not None and ind[0] < s.min_acceptance_alpha:
            rate = "" if obs.acceptance_rate is None else \
                f"; vLLM's acceptance rate {obs.acceptance_rate:.3f} at k={self.observed_k}"
            reasons.append(("low_acceptance",
                            f"acceptance α {ind[0]:.3f} ({_ALPHA_TEXT[ind[1]]}) below "
                            f"min_acceptance_alpha {s.min_acceptance_alpha:g}{rate}"))
        iv = a.best_speedup_interval if a is not None else None
        if a is not None and a.valid and a.best_speedup is not None \
                and a.best_speedup < s.disable_below_speedup and iv is not None \
                and iv[1] >= s.disable_below_speedup:
            self._uncertain(a.best_speedup, "below disable_below_speedup",
                            s.disable_below_speedup, iv)
        elif a is not None and a.valid and a.best_speedup is not None \
                and a.best_speedup < s.disable_below_speedup:
            reasons.append(("low_predicted_speedup",
                            f"best predicted speedup {a.best_speedup:.3f} (k="
                            f"{a.best_draft_length}) below disable_below_speedup "
                            f"{s.disable_below_speedup:g} at {obs.arrival_rate:.3g} req/s"))
        alert_since, alert_name = self._active_alert()
        if alert_name is not None:
            reasons.append(("alert", f"Alertmanager alert {alert_name} firing"))
        pays = sd_pays(a, obs.measured, s.enable_above_speedup) if reasons else []
        if pays:
            # Never a switch-off while SD pays beyond the hysteresis band: the signals
            # disagree, and the state says which (the drafter, or the alert, needs a look).
            self._reset_condition()
            self.disagreement = (
                "keeping SD on, the signals disagree: " + "; ".join(r for _, r in reasons)
                + "; but SD pays: " + " and ".join(pays) + f", at or above "
                f"enable_above_speedup {s.enable_above_speedup:g}")
            self.waiting, self.hold = self.disagreement, "sd_pays"
            return None
        return self._hold("disable", reasons, now, alert_since)

    def _consider_enable(self, now: float) -> Decision | None:
        s, obs, a, prof = self.s, self._obs, self.assessment, self.profile
        assert obs is not None
        reasons: list[tuple[str, str]] = []
        if prof is None:
            self.waiting = "no acceptance profile known (no healthy window with SD on, no " \
                           "acceptance_profile in the parameters file)"
            self.hold = "no_prediction"
        elif a is None:
            self.waiting = "no latency model for this target (params)"
            self.hold = "no_prediction"
        elif not a.valid:
            self.waiting = f"no valid prediction: {a.reason}"
            self.hold = "no_prediction"
        elif a.best_draft_length and (ind := prof.independent_alpha()) is not None \
                and ind[0] < s.min_acceptance_alpha:
            self.waiting = (f"acceptance α {ind[0]:.3f} ({_ALPHA_TEXT[ind[1]]}, "
                            f"{prof.source} profile) below min_acceptance_alpha "
                            f"{s.min_acceptance_alpha:g}")
            self.hold = "acceptance_guard"
        elif self._active_alert()[1] is not None:
            self.waiting = "a switch-off alert is firing"
            self.hold = "alert"
        elif a.best_draft_length and a.best_speedup is not None \
                and a.best_speedup >= s.enable_above_speedup \
                and a.best_speedup_interval is not None \
                and a.best_speedup_interval[0] < s.enable_above_speedup:
            self._uncertain(a.best_speedup, "above enable_above_speedup",
                            s.enable_above_speedup, a.best_speedup_interval)
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
            self.hold = "stabilization"
            return None
        if self.last_switch_at is not None:
            since = now - self.last_switch_at
            need = self.reenable_delay() if action == "enable" else s.min_switch_interval_seconds
            if since < need - 1e-9:
                self.waiting = f"{action}: {since:.0f}s since the last switch, need {need:g}s"
                self.hold = "min_interval"
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
                              "reason": text, "at": iso_time(now)}
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
        k = self.recommended_k()
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
            "decided_at": iso_time(d.decided_at),
            "mode": self.s.mode,
            "predicted_speedup": {
                "current": json_number(a.current_speedup) if a else None,
                "best": json_number(a.best_speedup) if a and a.valid else None,
                "thresholds": {"disable_below": self.s.disable_below_speedup,
                               "enable_above": self.s.enable_above_speedup}},
            "acceptance": prof.as_json() if prof else None,
            "arrival_rate": json_number(obs.arrival_rate),
            "configured_draft_length": self.observed_k,
            "recommended_draft_length": k,
            "schedule": schedule,
            "speculative_config_update": update,
            "dynamic_speculative_config_update": dynamic,
        }

    # -- before/after record -----------------------------------------------------------------
    def _update_latency_record(self, obs: Observation) -> None:
        event = self.records.update(obs, self.s.min_requests_per_window, self.s.window)
        if event is not None:
            self._emit("switch_latency", obs.t, **event)

    # -- status ------------------------------------------------------------------------------
    def recommended_k(self) -> int | None:
        """The model's best k, or 0 where the acceptance guard holds SD off (not while SD
        pays against a switch-off condition); None without a valid assessment."""
        a = self.assessment
        if a is None or not a.valid:
            return None
        return a.best_draft_length if self.hold == "sd_pays" else a.guarded_draft_length

    def reason(self) -> str:
        """Why the state (and the recommended k) is what it is next to the model's own view,
        the running window's ``sd_optimal_draft_length`` (see settings.REASONS)."""
        if self.state == "pending":
            return "pending"
        if self.state is None or self.blocked is not None:
            return "no_data"
        obs, a, s = self._obs, self.assessment, self.s
        assert obs is not None
        model_k = obs.live_optimal_k
        if model_k is None and a is not None and a.valid:
            model_k = a.best_draft_length
        if self.hold == "sd_pays":
            return "sd_pays"
        if model_k is None:
            return "no_prediction"
        if self.state == "enabled":
            # The recommendation is the model's best k unless the acceptance α is below
            # min_acceptance_alpha (assess.admissible_k_max): then 0.
            if a is not None and a.valid and a.k_limit is not None and a.k_limit < model_k:
                return "acceptance_guard"
            if self.cond == "disable" and self.hold is not None:
                return self.hold
            if self.hold == validity.UNCERTAIN:
                return validity.UNCERTAIN
            return "agrees" if model_k > 0 else "stabilization"
        # disabled
        if model_k <= 0:
            return "agrees"
        ind = obs.independent_alpha
        if self.observed_sd and ind is not None and ind[0] < s.min_acceptance_alpha:
            return "acceptance_guard"
        if self.hold is not None:
            return self.hold
        if self._active_alert()[1] is not None:
            return "alert"
        return "hysteresis"

    def status(self) -> ControllerStatus:
        a = self.assessment
        detail = {
            "blocked": self.blocked,
            "waiting": self.waiting,
            "condition": self.cond,
            "condition_since": iso_time(self.cond_since),
            "condition_reasons": [r for _, r in self.cond_reasons],
            "pending": None if self.pending is None else {
                "decision_id": self.pending.decision.id,
                "action": self.pending.decision.action, "since": iso_time(self.pending.since),
                "delivered": self.pending.delivered},
            "last_decision": self.last_decision,
            "acceptance_profile": self.profile.as_json() if self.profile else None,
            "assessment": None if a is None else {
                "valid": a.valid, "reason": a.reason, "best_draft_length": a.best_draft_length,
                "best_speedup": json_number(a.best_speedup),
                "current_speedup": json_number(a.current_speedup)},
            "reenable_delay_seconds": self.reenable_delay(),
            "reason": self.reason(),
            "configured_k": self.observed_k,
        }
        return ControllerStatus(
            mode=self.s.mode, state=self.state, observed_sd=self.observed_sd,
            recommended_draft_length=self.recommended_k(),
            transitions=dict(self.transitions), last_transition_timestamp=self.last_transition_at,
            actuation_errors=self.errors, latency_ratios=dict(self.records.ratios),
            detail=detail, switch_window=self.records.switch_window, reason=self.reason())


