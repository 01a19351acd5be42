"""The SD controller's wiring: per target and model, keep SD, switch it off, or switch it back on.

vLLM cannot toggle SD at runtime (a switch is a restart with a new ``--speculative-config``),
so the controller acts rarely, visibly and reversibly: states ``enabled`` / ``disabled`` /
``pending``, switch conditions held for ``stabilization_seconds``, a minimum interval between
switches, a hysteresis band between the two speedup thresholds, re-enabling as a probe with a
doubling backoff, and a before/after latency record around every switch. docs/controller.md
specifies them.

The state machine (:class:`~specwatch.plugins.control.machine.ModelController`) is pure,
driven by :class:`~specwatch.plugins.control.assess.Observation` objects carrying the poll
time. This module is the I/O around it: :class:`Controller` is the target hook (its statuses
go in the :data:`STATUSES` and :data:`STATUS` slots), the family builder, the HTTP handlers
(the Alertmanager receiver, ``GET /controller``) and the owner of the actuators
(:mod:`specwatch.plugins.control.actuation`, delivery on a separate thread);
:func:`install` registers them with a :class:`~specwatch.plugins.host.PluginHost`.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from prometheus_client.core import Metric

from specwatch.common.secretfile import read_secret_file
from specwatch.expose import metricdefs
from specwatch.plugins.control import metrics  # noqa: F401  (registers the definitions)
from specwatch.plugins.control.actuation import (
    Actuator,
    CommandDelivery,
    Decision,
    Deliver,
    Outcome,
    WebhookDelivery,
)
from specwatch.plugins.control.assess import (
    SWITCH_FIGURES,
    AcceptanceProfile,
    Assessor,
    LiveReader,
    MeasuredReader,
    Scheduler,
    model_assessor,
    model_scheduler,
    observe,
    params_profile,
)
from specwatch.plugins.control.jsonview import iso_time, json_number
from specwatch.plugins.control.machine import ControllerStatus, ModelController
from specwatch.plugins.control.receiver import parse_alertmanager
from specwatch.plugins.control.settings import (
    ACTIONS,
    ALERTMANAGER_PATH,
    DEFAULT_ALERTS,
    SECTION,
    STATES,
    STATUS_PATH,
    Settings,
    TargetController,
    with_window,
)
from specwatch.plugins.host import PluginHost
from specwatch.poll.snapshot import Slot, Snapshot, TargetSnapshot
from specwatch.web.routing import Request, Response, only_get

if TYPE_CHECKING:  # pragma: no cover
    from specwatch.model.params import Params
    from specwatch.poll.config import ServeConfig

log = logging.getLogger(__name__)
#: Models one target's controller keeps at most (the exporter's default live-model cap).
DEFAULT_MAX_MODELS = 100
#: JSON events (one JSON object per log message): decisions, outcomes, switch records.
events_log = logging.getLogger("specwatch.controller.events")  # public name: keep stable


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
    #: Poll-clock time each model in ``models`` was last on the target's page (same keys).
    last_seen: dict[str, float] = field(default_factory=dict)
    #: Models forgotten, by reason: retention (gone longer than the exporter keeps history),
    #: limit (``max_models`` reached; the least recently seen absent model goes first).
    dropped: dict[str, int] = field(default_factory=lambda: {"retention": 0, "limit": 0})
    limit_logged: bool = False


@dataclass(frozen=True)
class ControllerStatuses:
    """Every followed model's status on one target (those off the page too)."""

    models: Mapping[str, ControllerStatus]


#: The controller's slots: a target's statuses, and each model's on the page.
STATUSES: Slot[ControllerStatuses] = Slot("control.statuses", ControllerStatuses)
STATUS: Slot[ControllerStatus] = Slot("control.status", ControllerStatus)

#: Alerts whose outcome the receiver's answer lists one by one (the counts cover them all).
RECEIVER_ANSWERED_ALERTS = 10


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
                 wait: Callable[[float], bool] | None = None,
                 retention: float = 3600.0, max_models: int = DEFAULT_MAX_MODELS,
                 live_of: LiveReader | None = None,
                 measured_of: MeasuredReader | None = None) -> None:
        self.targets = {t.name: t for t in targets}
        #: Reads the live model's prediction of a model's snapshot (given by the application).
        self.live_of = live_of
        #: Reads the measured A/B speedup of (target, model) (given by the application).
        self.measured_of = measured_of
        #: A model absent from its target's page for longer than this is forgotten (the
        #: exporter's history retention: it forgets the model then too).
        self.retention = float(retention)
        #: Models one target's controller keeps (the exporter's default live-model cap).
        self.max_models = int(max_models)
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

    def _forget(self, tc: _TargetControl, target: TargetSnapshot, now: float) -> None:
        """Drop the models gone from the page for longer than the exporter's retention."""
        stale = [n for n, seen in tc.last_seen.items()
                 if n not in target.models and now - seen > self.retention]
        for name in stale:
            del tc.models[name], tc.last_seen[name]
            tc.dropped["retention"] += 1
        if stale:
            log.info("controller of %s forgot %d model(s) gone for over %gs", tc.name,
                     len(stale), self.retention)

    def forget_model(self, target_name: str, model: str, reason: str) -> None:
        """The exporter forgot ``model`` of ``target_name`` (its forget hook): so does the
        controller, counted under the exporter's reason (``retention``, ``vanished_limit``,
        ``target_removed``). Keeps the controller's state within the exporter's bounds
        instead of a second, looser set of rules."""
        tc = self.targets.get(target_name)
        if tc is None:
            return
        with tc.lock:
            if tc.models.pop(model, None) is None:
                return
            tc.last_seen.pop(model, None)
            tc.dropped[reason] = tc.dropped.get(reason, 0) + 1

    def _make_room(self, tc: _TargetControl, target: TargetSnapshot) -> bool:
        """Room for one more model under ``max_models``: the least recently seen model that
        is not on the page now goes; False (counted) when every kept model is live."""
        if len(tc.models) < self.max_models:
            return True
        absent = [n for n in tc.models if n not in target.models]
        tc.dropped["limit"] += 1
        if not tc.limit_logged:
            tc.limit_logged = True
            log.warning("controller of %s keeps at most %d models; models beyond it are "
                        "dropped (least recently seen first) and counted in "
                        "sd_controller_models_dropped_total", tc.name, self.max_models)
        if not absent:
            return False
        victim = min(absent, key=lambda n: tc.last_seen.get(n, 0.0))
        del tc.models[victim]
        tc.last_seen.pop(victim, None)
        return True

    def hook(self, target: TargetSnapshot) -> TargetSnapshot:
        """Step every controlled model of the target; attach the statuses to the snapshot."""
        tc = self.targets.get(target.name)
        if tc is None:
            return target
        decisions: list[Decision] = []
        now = self.clock()
        with tc.lock:
            self._forget(tc, target, now)
            names = set(tc.models) | set(target.models)
            if tc.settings.models is not None:
                names &= set(tc.settings.models)
            for name in sorted(names):
                if name not in tc.models and not self._make_room(tc, target):
                    continue
                if name in target.models:
                    tc.last_seen[name] = now
                mc = self._machine(tc, name)
                obs = observe(target, name, tc.settings.window, tc.settings.window_seconds,
                              self.live_of, self.measured_of)
                decision = mc.step(obs)
                _log_events(mc)
                if decision is not None and tc.settings.mode != "recommend":
                    decisions.append(decision)
            statuses = {name: mc.status() for name, mc in tc.models.items()}
        for d in decisions:
            if tc.actuator is not None:
                tc.actuator.submit(d)
        out = target.with_slot(STATUSES, ControllerStatuses(statuses))
        for name in out.models:
            if name in statuses:
                out = out.with_model_slot(name, STATUS, statuses[name])
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
        counts: dict[str, int] = {}
        for r in results:
            counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
        # One line per notification, however many alerts it carries.
        log.info("Alertmanager notification: %d alert(s): %s", len(results),
                 ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none")
        # A short answer whatever the notification holds: the count per outcome and the
        # first alerts' outcomes (in the notification's order), never an echo of the
        # request's fields (a large notification would be answered with a larger body).
        shown = [{k: v for k, v in r.items() if k in ("outcome", "target", "models")}
                 for r in results[:RECEIVER_ANSWERED_ALERTS]]
        body = json.dumps({"status": "ok", "received": len(results), "outcomes": counts,
                           "alerts": shown}, sort_keys=True).encode()
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
                    # Only models the controller already follows (seen on the target's page,
                    # bounded by max_models): an alert never creates state.
                    names = ([model] if model in tc.models else []) if model is not None \
                        else list(tc.models)
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
                        "last_transition": iso_time(st.last_transition_timestamp),
                        "actuation_errors": st.actuation_errors,
                        "latency_ratios": {f"{a}/{lat}/p{q}": json_number(v) for (a, lat, q), v
                                           in st.latency_ratios.items()},
                        **st.detail}
            out[tc.name] = {"mode": tc.settings.mode, "window": tc.settings.window,
                            "models": models}
        body = json.dumps({"targets": out}, indent=2, sort_keys=True).encode()
        return Response(200, body + b"\n", "application/json")

    # -- metric families ---------------------------------------------------------------------
    def families(self, snap: Snapshot) -> Iterator[Metric]:
        """Collector family builder for the controller series (from the snapshot only)."""
        state = metricdefs.gauge("sd_controller_state")
        rec_k = metricdefs.gauge("sd_controller_recommended_draft_length")
        trans = metricdefs.counter("sd_controller_transitions")
        last = metricdefs.gauge("sd_controller_last_transition_timestamp_seconds")
        errors = metricdefs.counter("sd_controller_actuation_errors")
        ratio = metricdefs.gauge("sd_switch_latency_ratio")
        switched = metricdefs.gauge("sd_switch_timestamp_seconds")
        figures = {name: metricdefs.gauge(f"sd_switch_window_{name}") for name in SWITCH_FIGURES}
        alerts = metricdefs.counter("specwatch_controller_alerts")
        for tname, target in snap.targets.items():
            statuses = target.slot(STATUSES)
            if statuses is None:
                continue
            for mname, st in statuses.models.items():
                key = [tname, mname]
                if st.state is not None:
                    for s in STATES:
                        state.add_metric([*key, s, st.reason], 1.0 if st.state == s else 0.0)
                if st.recommended_draft_length is not None:
                    rec_k.add_metric(key, float(st.recommended_draft_length))
                for action in ACTIONS:
                    trans.add_metric([*key, action], float(st.transitions.get(action, 0)))
                if st.last_transition_timestamp is not None:
                    last.add_metric(key, st.last_transition_timestamp)
                errors.add_metric(key, float(st.actuation_errors))
                for (action, lat, q), v in sorted(st.latency_ratios.items()):
                    ratio.add_metric([*key, action, lat, q], v)
                rec = st.switch_window
                if rec:
                    switched.add_metric([*key, rec["action"]], rec["switched_at"])
                    for side in ("before", "after"):
                        for name, v in (rec.get(side) or {}).items():
                            if name in figures:
                                figures[name].add_metric([*key, rec["action"], side], v)
        if self.receiver is not None:
            with self._alerts_lock:
                for outcome, n in self.alerts_received.items():
                    alerts.add_metric([outcome], float(n))
        dropped = metricdefs.counter("sd_controller_models_dropped")
        for tname, tc in self.targets.items():
            with tc.lock:
                for reason, n in sorted(tc.dropped.items()):
                    dropped.add_metric([tname, reason], float(n))
        for fam in (state, rec_k, trans, last, errors, ratio, switched, *figures.values(),
                    alerts, dropped):
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


# ------------------------------------------------------------------------------ construction


def from_config(cfg: ServeConfig, params: Mapping[str, Params],
                model_windows: Mapping[str, str], clock: Callable[[], float] = time.time,
                live_of: LiveReader | None = None,
                measured_of: MeasuredReader | None = None,
                deliver_factory: Callable[[_TargetControl], Deliver | None] | None = None,
                wait: Callable[[float], bool] | None = None) -> Controller | None:
    """Build the controller from the serve configuration (None when no target has one).

    ``params`` and ``model_windows`` are the live model's (the same parameters files and
    the same window as the sd_predicted_* series), ``live_of`` reads its prediction from
    a model's snapshot and ``measured_of`` the measured A/B speedup of a pair's SD side.
    Errors are ConfigError naming the key.
    """
    where = cfg.source
    windows: dict[str, float | None] = {label: secs for label, secs in cfg.windows}
    if cfg.count_window > 0:
        windows[f"{cfg.count_window}req"] = None
    targets: list[_TargetControl] = []
    for t in cfg.targets:
        block: TargetController | None = t.section(SECTION)
        if block is None:
            continue
        window = model_windows.get(t.name, "5m")
        s = with_window(block.settings, where, block.path, windows, window)
        p = params.get(t.name)
        targets.append(_TargetControl(
            t.name, t.url, s, model_assessor(p, s.min_acceptance_alpha) if p else None,
            model_scheduler(p, s.max_num_seqs, s.min_acceptance_alpha) if p else None,
            params_profile(p)))
        if p is None:
            log.warning("controller for %s has no parameters file (params): it can switch SD "
                        "off on low acceptance or alerts, but never recommends switching it "
                        "on", t.name)
    receiver = None
    am = cfg.section(SECTION)
    if am is not None:
        token = read_secret_file(am.token_file, f"{where}: controller.alertmanager.token_file")
        receiver = ReceiverSettings(token, am.alerts)
    if not targets and receiver is None:
        return None
    # The exporter's history retention (Pipeline's default): a model gone from the page
    # that long is forgotten by the exporter, so by the controller too.
    longest = max([secs for _, secs in cfg.windows] or [0.0])
    retention = max(longest, 3600.0) + 2 * cfg.poll_interval
    return Controller(targets, receiver, clock=clock, deliver_factory=deliver_factory,
                      wait=wait, retention=retention, live_of=live_of,
                      measured_of=measured_of)


def install(host: PluginHost, ctl: Controller | None) -> Controller | None:
    """Register the controller (built by :func:`from_config`; None when unused): its hooks,
    family builder, routes and actuator threads."""
    if ctl is None:
        return None
    host.add_target_hook(ctl.hook)
    host.add_forget_hook(ctl.forget_model)
    host.add_family_builder(ctl.families)
    host.add_route(STATUS_PATH, only_get(ctl.status_handler))
    if ctl.receiver is not None:
        host.add_route(ALERTMANAGER_PATH, ctl.alertmanager_handler, own_auth=True)
    host.add_lifecycle(ctl.start, ctl.stop)
    return ctl

