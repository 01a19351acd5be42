"""The controller's config section: the ``controller:`` keys (:data:`CONTROLLER_SCHEMA`, and
the top-level receiver block) as :data:`SECTION`, which the application composes into the
serve config's schema. Each target's block is parsed once into :class:`Settings`, checked
across keys (thresholds, hysteresis band, actuation secrets: :func:`parse_block`); the
decision window is checked when the controller is built and knows the live model's window
(:func:`with_window`). The receiver block is parsed into :class:`AlertmanagerSettings`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specwatch.common import redact
from specwatch.common.errors import ConfigError
from specwatch.common.schema import (
    DURATION,
    Key,
    check_url_any_path,
    duration_or_zero,
    non_negative,
    one_of,
    parse_duration,
    positive,
    positive_int,
    unit_interval,
)
from specwatch.common.secretfile import read_secret_file
from specwatch.poll.config import ConfigSection, Resolve, SectionContext

log = logging.getLogger(__name__)

MODES = ("recommend", "webhook", "command")
STATES = ("enabled", "disabled", "pending")
#: Why the controller's state (and recommended k) is what it is next to the latency model's
#: own view (``sd_optimal_draft_length``): the ``reason`` label of ``sd_controller_state``.
#: One value at a time; new values may be added (docs/controller.md lists them).
REASONS = {
    "agrees": "the state and the recommended k follow the model",
    "acceptance_guard": "the draft-length-independent acceptance α (measured, or of the "
                        "remembered profile) is below min_acceptance_alpha and SD does not "
                        "pay beyond the hysteresis band: SD off (recommended k 0), although "
                        "the model predicts some speedup",
    "sd_pays": "a switch-off condition holds (low acceptance α, an alert), but a valid "
               "predicted speedup or the measured A/B speedup shows SD paying at or above "
               "enable_above_speedup: SD stays on and the state names the signals that "
               "disagree",
    "alert": "an Alertmanager alert holds SD off",
    "hysteresis": "SD is off and the predicted speedup is between disable_below_speedup and "
                  "enable_above_speedup",
    "stabilization": "a switch condition holds, not yet for stabilization_seconds",
    "uncertain": "the predicted speedup crosses a hysteresis threshold but its 90% interval "
                 "straddles it: no switch on that prediction",
    "min_interval": "a switch is due, but the last one is more recent than "
                    "min_switch_interval_seconds (or the re-enable backoff)",
    "no_prediction": "the model has no valid prediction to follow",
    "no_data": "this poll cannot be used (target down, window incomplete, low traffic)",
    "pending": "a requested switch has not been confirmed by the server yet",
}
ACTIONS = ("disable", "enable")
#: (label value of `latency`, window histogram name) and the quantiles recorded per switch.
LATENCIES = (("e2e", "e2e_latency_seconds"), ("ttft", "ttft_seconds"))
#: (label value of `percentile`, quantile). The label is not `quantile`: promtool's lint
#: reserves that name for summaries, and a ratio of two quantiles is a gauge.
QUANTILES = (("50", 0.5), ("99", 0.99))
DEFAULT_ALERTS = ("SDAcceptanceRateLow",)
ALERTMANAGER_PATH = "/controller/alertmanager"
STATUS_PATH = "/controller"
#: Tolerance (seconds) of time comparisons against window starts and switch times.
EPS = 1e-6


#: Per-target `controller:` block (semantics in specwatch.plugins.control.controller and the
#: README, "Controller"). Cross-key rules (enable above disable, the webhook block in
#: webhook mode...) are checked by :func:`settings_from_raw`.
CONTROLLER_SCHEMA: dict[str, Key] = {
    "mode": Key(str, check=one_of("recommend", "webhook", "command"),
                doc="recommend (default) | webhook | command"),
    "models": Key(list, items=Key(str), doc="model names to control (default: all)"),
    "disable_below_speedup": Key((int, float), check=positive,
                                 doc="switch SD off below this best predicted speedup"),
    "enable_above_speedup": Key((int, float), check=positive,
                                doc="switch SD on at or above this predicted speedup"),
    "min_acceptance_alpha": Key((int, float), check=unit_interval,
                                doc="switch SD off below this draft-length-independent "
                                    "acceptance α (first-position acceptance, else the "
                                    "per-token α), unless SD pays"),
    "min_acceptance_rate": Key((int, float), check=unit_interval,
                               doc="deprecated name of min_acceptance_alpha"),
    "stabilization_seconds": Key(DURATION, check=duration_or_zero,
                                 doc="a condition must hold this long"),
    "min_switch_interval_seconds": Key(DURATION, check=duration_or_zero,
                                       doc="no two switches closer than this"),
    "min_drafts_per_window": Key((int, float), check=non_negative,
                                 doc="drafts the window needs (SD on)"),
    "min_requests_per_window": Key((int, float), check=non_negative,
                                   doc="finished requests the window needs (SD off)"),
    "pending_timeout_seconds": Key(DURATION, check=parse_duration,
                                   doc="give up waiting for a requested switch"),
    "max_reenable_delay_seconds": Key(DURATION, check=parse_duration,
                                      doc="cap of the re-enable backoff"),
    "max_num_seqs": Key(int, check=positive_int(1), doc="largest batch of the schedule"),
    "max_attempts": Key(int, check=positive_int(1), doc="deliveries tried per decision"),
    "retry_backoff_seconds": Key(DURATION, check=parse_duration,
                                 doc="first retry delay (doubles)"),
    "max_retry_backoff_seconds": Key(DURATION, check=parse_duration,
                                     doc="largest retry delay"),
    "webhook": Key(dict, children={
        "url": Key(str, required=True, check=check_url_any_path, doc="receiver URL"),
        "timeout": Key(DURATION, check=parse_duration, doc="per attempt"),
        "headers": Key(dict, values=Key(str), doc="literal headers"),
        "headers_from_file": Key(dict, values=Key(str), doc="header -> file with the value"),
        "headers_from_env": Key(dict, values=Key(str), doc="header -> environment variable"),
    }, doc="mode webhook: where decisions are POSTed"),
    "command": Key(dict, children={
        "argv": Key(list, required=True, items=Key(str), doc="program and arguments, no shell"),
        "timeout": Key(DURATION, check=parse_duration, doc="per attempt"),
    }, doc="mode command: the program run per decision"),
}
#: Exporter-wide `controller:` block: the Alertmanager webhook receiver.
CONTROLLER_GLOBAL_SCHEMA: dict[str, Key] = {
    "alertmanager": Key(dict, children={
        "token_file": Key(str, required=True, doc="file holding the bearer token"),
        "alerts": Key(list, items=Key(str), doc="alert names meaning 'switch SD off'"),
    }, doc="POST /controller/alertmanager"),
}

@dataclass(frozen=True)
class Settings:
    """One target's validated ``controller:`` block (defaults: README, "Controller")."""

    mode: str = "recommend"
    models: tuple[str, ...] | None = None
    window: str = "5m"
    window_seconds: float | None = 300.0  # None: the count window (complete when present)
    disable_below_speedup: float = 1.05
    enable_above_speedup: float = 1.2
    min_acceptance_alpha: float = 0.4
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


_SETTING_KEYS = ("disable_below_speedup", "enable_above_speedup", "min_acceptance_alpha",
                 "stabilization_seconds", "min_switch_interval_seconds",
                 "min_drafts_per_window", "min_requests_per_window", "pending_timeout_seconds",
                 "max_reenable_delay_seconds", "max_num_seqs", "max_attempts",
                 "retry_backoff_seconds", "max_retry_backoff_seconds")


def settings_from_raw(raw: Mapping[str, Any], where: str, path: str,
                      windows: Mapping[str, float | None], window: str) -> Settings:
    """One validated ``controller:`` block checked across keys (:func:`parse_block`) and on
    its decision window (:func:`with_window`)."""
    return with_window(parse_block(raw, where, path), where, path, windows, window)


def with_window(s: Settings, where: str, path: str, windows: Mapping[str, float | None],
                window: str) -> Settings:
    """``s`` deciding on ``window``, the target's model window. ``windows`` maps every
    computed window label to its length (None for the count window)."""
    if window not in windows:
        raise ConfigError(f"{where}: {path}: the controller decides on the model window "
                          f"{window!r}, which is not computed; expected one of "
                          f"{', '.join(windows)} (add it to global.windows)")
    return dataclasses.replace(s, window=window, window_seconds=windows[window])


def parse_block(raw: Mapping[str, Any], where: str, path: str) -> Settings:
    """Cross-key checks of one validated ``controller:`` block; reads header secrets. The
    window is the default until :func:`with_window` sets the target's."""
    def fail(key: str, msg: str) -> ConfigError:
        return ConfigError(f"{where}: {path}.{key}: {msg}" if key else f"{where}: {path}: {msg}")

    values: dict[str, Any] = {k: raw[k] for k in _SETTING_KEYS if k in raw}
    if "min_acceptance_rate" in raw:
        # The old name compared vLLM's acceptance rate, which falls with k by construction;
        # the guard now compares the α that does not, which equals that rate at k = 1.
        if "min_acceptance_alpha" in raw:
            raise fail("min_acceptance_rate", "the deprecated name of min_acceptance_alpha; "
                       "set only min_acceptance_alpha")
        values["min_acceptance_alpha"] = raw["min_acceptance_rate"]
        log.warning("%s: %s.min_acceptance_rate is deprecated: it now sets "
                    "min_acceptance_alpha, compared with the first-position acceptance (else "
                    "the per-token α), which does not fall with k; rename the key",
                    where, path)
    mode = raw.get("mode", "recommend")
    s = Settings(mode=mode, **values)
    if s.enable_above_speedup <= s.disable_below_speedup:
        raise fail("enable_above_speedup",
                   f"must be above disable_below_speedup ({s.disable_below_speedup:g}): the "
                   f"gap between them is the hysteresis band, got {s.enable_above_speedup:g}")
    if s.max_retry_backoff_seconds < s.retry_backoff_seconds:
        raise fail("max_retry_backoff_seconds", "must be >= retry_backoff_seconds")
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
            headers[name] = read_secret_file(fpath, f"{where}: {path}.webhook."
                                                    f"headers_from_file.{name}")
        for name, var in webhook.get("headers_from_env", {}).items():
            value = os.environ.get(var, "")
            if not value:
                raise fail(f"webhook.headers_from_env.{name}",
                           f"environment variable {var!r} is not set or empty")
            headers[name] = value
        for name, value in headers.items():
            # A webhook header may carry a credential (Authorization, X-Api-Key, a
            # signature...): none may reach a log line in any form.
            redact.register_header(name, value)
        redact.register_url(webhook["url"])
    return dataclasses.replace(
        s, models=tuple(raw["models"]) if "models" in raw else None,
        webhook_url=webhook["url"] if webhook else None,
        webhook_timeout=webhook.get("timeout", 10.0) if webhook else 10.0,
        webhook_headers=headers,
        command=tuple(command["argv"]) if command else None,
        command_timeout=command.get("timeout", 120.0) if command else 120.0)


@dataclass(frozen=True)
class TargetController:
    """One target's parsed ``controller:`` block and its key path (for later messages)."""

    path: str
    settings: Settings


@dataclass(frozen=True)
class AlertmanagerSettings:
    """``controller.alertmanager``: the bearer token's file and the alerts that mean
    'switch SD off'."""

    token_file: str
    alerts: tuple[str, ...] = DEFAULT_ALERTS


def target_settings(raw: Mapping[str, Any], path: str, where: str) -> TargetController | None:
    """A target's ``controller:`` block parsed (None: the target has none)."""
    block = raw.get("controller")
    if block is None:
        return None
    path = f"{path}.controller" if path else "--target controller"
    return TargetController(path, parse_block(block, where, path))


def receiver_settings(raw: Mapping[str, Any], _ctx: SectionContext
                      ) -> AlertmanagerSettings | None:
    """The top-level ``controller.alertmanager`` block (None: no receiver)."""
    am = raw.get("controller", {}).get("alertmanager")
    if am is None:
        return None
    return AlertmanagerSettings(am["token_file"], tuple(am.get("alerts", DEFAULT_ALERTS)))


def resolve_header_files(target: Mapping[str, Any], rel: Resolve) -> Mapping[str, Any]:
    """A target's webhook ``headers_from_file`` files relative to the config file."""
    webhook = (target.get("controller") or {}).get("webhook")
    if not webhook or "headers_from_file" not in webhook:
        return target
    return {**target, "controller": {**target["controller"], "webhook": {
        **webhook, "headers_from_file": {
            h: rel(f) for h, f in webhook["headers_from_file"].items()}}}}


def resolve_token_file(raw: Mapping[str, Any], rel: Resolve) -> Mapping[str, Any]:
    """The receiver's ``token_file`` relative to the config file."""
    am = (raw.get("controller") or {}).get("alertmanager")
    if not am or "token_file" not in am:
        return raw
    return {**raw, "controller": {**raw["controller"],
                                  "alertmanager": {**am, "token_file": rel(am["token_file"])}}}


#: The controller's keys of the serve config: ``targets[].controller`` and the top-level
#: ``controller``.
SECTION: ConfigSection[AlertmanagerSettings | None] = ConfigSection(
    "controller",
    top={"controller": Key(dict, children=CONTROLLER_GLOBAL_SCHEMA)},
    top_after="file_sd_configs",
    target={"controller": Key(dict, children=CONTROLLER_SCHEMA,
                              doc="SD controller (off by default)")},
    target_after="max_models",
    build=receiver_settings, target_build=target_settings,
    resolve_top=resolve_token_file, resolve_target=resolve_header_files)
