"""The poll cycle: fetched body → sources → history → derive → hooks → published snapshot.

The poller calls :meth:`Pipeline.apply` from its worker thread when a poll of one target
ends (success or failure). The pipeline updates that target's state, derives its
:class:`~specwatch.poll.snapshot.TargetSnapshot`, runs the target hooks, and publishes it; a
reader gets an immutable :class:`~specwatch.poll.snapshot.Snapshot` of every target (made on the
first read after a publish), so the collector reads a consistent object.

Extension points: target hooks (``add_target_hook``: a new snapshot from each target's,
after derive, on every poll, also when the target is down; must not block) and forget hooks
(``add_forget_hook``: told when a model is forgotten, so state kept elsewhere per model is
bounded by the same rules). Their contract, the bounds on state, the clocks and failure
containment: docs/exporter.md, "The poll pipeline".

Invariant: whatever a page does to parsing or folding into the history (a bug included),
the target is reported down with reason ``parse`` and the other targets are untouched.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from specwatch import __version__
from specwatch.poll import limits, pageplan, sources
from specwatch.poll.snapshot import POLL_ERROR_REASONS, Snapshot, TargetSnapshot
from specwatch.poll.windows import derive, history

log = logging.getLogger(__name__)

TargetHook = Callable[[TargetSnapshot], TargetSnapshot]
#: fn(target name, model name, reason): the exporter forgot this model of this target.
ForgetHook = Callable[[str, str, str], None]
#: Default cap of live models per target (and of remembered vanished ones).
DEFAULT_MAX_MODELS = 100


@dataclass(frozen=True)
class PollResult:
    """What one poll produced: a body, or the reason it failed (one of POLL_ERROR_REASONS)."""

    target: str
    started: float  # poll clock (wall time, for timestamps)
    finished: float
    duration_seconds: float
    body: str | None = None
    error_reason: str | None = None
    error_message: str = ""
    #: When the poll ended on the clock windows are measured on (monotonic seconds; see the
    #: module docstring). None: the pipeline's ``clock``, else ``finished``.
    monotonic: float | None = None


@dataclass
class _TargetState:
    name: str
    engine: str
    history: history.TargetHistory
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(POLL_ERROR_REASONS, 0))
    last_success: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    max_series: int = 10000
    series_dropped: int = 0  # by the max_series cap
    series_invalid: int = 0  # counter series with an invalid value (NaN, negative, clash)
    last_reason: str | None = None  # reason of the failure being reported, None when up
    labels_truncated: int = 0  # label values cut to max_label_value_bytes
    #: (hash, length) of the last page body and its parse: an identical body is not parsed
    #: again (an idle server's page does not change); the windows still advance.
    last_body: tuple[int, int] | None = None
    last_page: sources.ParsedPage | None = None
    #: What the parse learnt from the last page (a steady server's next page is parsed
    #: from it: :class:`specwatch.poll.pageplan.PagePlan`).
    page_plan: pageplan.PagePlan = field(default_factory=pageplan.PagePlan)
    logged_drops: set[str] = field(default_factory=set)  # drop reasons already logged


class Pipeline:
    """Owns all per-target state and the latest snapshot."""

    def __init__(self, targets: Sequence[tuple[str, str]], derive_config: derive.DeriveConfig,
                 poll_interval: float, history_retention: float | None = None,
                 max_series: Mapping[str, int] | None = None, parser: str = "fast",
                 max_models: Mapping[str, int] | None = None,
                 max_label_value_bytes: int = sources.DEFAULT_MAX_LABEL_VALUE_BYTES,
                 clock: Callable[[], float] | None = None) -> None:
        """``targets``: (name, engine kind) in display order; ``max_series``: per-target cap
        of source series (default 10000); ``parser``: see
        :func:`specwatch.poll.sources.parse_page` ("fast" or "full"); ``max_models``:
        per-target cap of models (default 100); ``clock``: the time base of windows (see the
        module docstring)."""
        self._derive_config = derive_config
        self.parser = parser
        self.max_label_value_bytes = max_label_value_bytes
        self.clock = clock
        self._max_models = dict(max_models or {})
        self._forget_hooks: list[ForgetHook] = []
        longest = max([s for _, s in derive_config.windows] or [0.0])
        retention = history_retention if history_retention is not None \
            else max(longest, 3600.0) + 2 * poll_interval
        self._retention = retention
        self._max_entries = math.ceil(retention / max(poll_interval, 0.05)) * 4 + 16
        self._states = {name: self._new_state(name, engine, (max_series or {}).get(name))
                        for name, engine in targets}
        self._hooks: list[TargetHook] = []
        self._listeners: list[Callable[[TargetSnapshot], None]] = []
        self._publish_lock = threading.Lock()
        # The latest snapshot of each target (configuration order) and when the last was
        # published: the Snapshot object is made from them when read (see ``snapshot``).
        self._targets: dict[str, TargetSnapshot] = {
            name: TargetSnapshot(name=name, up=False) for name, _ in targets}
        self._created_at = 0.0
        self._snapshot: Snapshot | None = None

    def _new_state(self, name: str, engine: str, max_series: int | None) -> _TargetState:
        cap = self._max_models.get(name, DEFAULT_MAX_MODELS)
        hist = history.TargetHistory(
            self._retention, self._max_entries, self._derive_config.min_drafts_per_sample,
            max_models=cap, max_vanished_models=cap)
        hist.keep_buckets = self._derive_config.histograms
        hist.on_forget.append(lambda model, reason: self._forgotten(name, model, reason))
        return _TargetState(name, engine, hist, max_series=max_series or 10000)

    @property
    def derive_config(self) -> derive.DeriveConfig:
        """What derive computes. Without window histograms the histories do not keep the
        latency bucket counters (most of a ring's memory): set it before the first poll."""
        return self._derive_config

    @derive_config.setter
    def derive_config(self, cfg: derive.DeriveConfig) -> None:
        self._derive_config = cfg
        for st in self._states.values():
            with st.lock:
                st.history.keep_buckets = cfg.histograms
                st.last_body = st.last_page = None  # parsed with or without the buckets

    def add_forget_hook(self, hook: ForgetHook) -> None:
        """Register ``hook(target, model, reason)`` (see the module docstring)."""
        self._forget_hooks.append(hook)

    def _forgotten(self, target: str, model: str, reason: str) -> None:
        for hook in self._forget_hooks:
            try:
                hook(target, model, reason)
            except Exception:  # a broken extension must not stop polling
                log.exception("forget hook %r failed for %s/%s", hook, target, model[:200])

    def set_targets(self, targets: Sequence[tuple[str, str]],
                    max_series: Mapping[str, int] | None = None,
                    max_models: Mapping[str, int] | None = None) -> None:
        """Replace the target set (file_sd discovery). A kept target keeps its history; a
        new one starts empty (down until its first poll); a removed one disappears from the
        next snapshot, and a poll of it still in flight is dropped. A target whose engine
        setting changed starts over."""
        max_series = max_series or {}
        if max_models is not None:
            self._max_models = dict(max_models)
        removed: list[_TargetState] = []
        with self._publish_lock:
            states: dict[str, _TargetState] = {}
            for name, engine in targets:
                old = self._states.get(name)
                if old is not None and old.engine == engine:
                    old.max_series = max_series.get(name, old.max_series)
                    states[name] = old
                else:
                    states[name] = self._new_state(name, engine, max_series.get(name))
            kept = {n for n, st in states.items() if self._states.get(n) is st}
            removed = [st for n, st in self._states.items() if n not in kept]
            for name in kept:
                cap = self._max_models.get(name, DEFAULT_MAX_MODELS)
                states[name].history.max_models = cap
                states[name].history.max_vanished_models = cap
            self._states = states
            current = self._targets
            self._targets = {name: current[name] if name in kept and name in current
                             else TargetSnapshot(name=name, up=False) for name, _ in targets}
            self._snapshot = None
        for st in removed:  # the models of a removed (or replaced) target are forgotten
            with st.lock:
                names = list(st.history.models)
            for model in names:
                self._forgotten(st.name, model, "target_removed")

    @property
    def snapshot(self) -> Snapshot:
        """The latest published snapshot (an immutable object): the same object until a
        target is published again.

        Made when read, not at each publish: a publish copied the whole target mapping,
        O(targets) per poll (at 2,000 targets polled every 5 s and scraped every 15 s, 6,000
        copies of 2,000 entries for the one a scrape reads)."""
        snap = self._snapshot
        if snap is None:
            with self._publish_lock:
                snap = self._snapshot
                if snap is None:
                    snap = Snapshot(version=__version__, targets=dict(self._targets),
                                    created_at=self._created_at)
                    self._snapshot = snap
        return snap

    def target_history(self, name: str) -> history.TargetHistory:
        """The poll history of one target (for tools and benchmarks that inspect or preload
        it; only while no poll of the target is running)."""
        return self._states[name].history

    def add_target_hook(self, hook: TargetHook) -> None:
        """Register a post-derive hook (see the module docstring)."""
        self._hooks.append(hook)

    def add_publish_listener(self, listener: Callable[[TargetSnapshot], None]) -> None:
        """Call ``listener(target)`` after each published target snapshot, in the polling
        thread (e.g. to render its exposition lines once, not per scrape). It must not block
        and should not raise (an exception is logged)."""
        self._listeners.append(listener)

    def apply(self, result: PollResult) -> TargetSnapshot:
        """Fold one poll result into the target's state and publish a new snapshot.

        A result for a target no longer in the set is dropped (returned, not published)."""
        state = self._states.get(result.target)
        if state is None:
            return TargetSnapshot(name=result.target, up=False, timestamp=result.finished)
        with state.lock:
            target = self._build(state, result)
            for hook in self._hooks:
                try:
                    target = hook(target)
                except Exception:  # a broken extension must not stop polling
                    log.exception("target hook %r failed for %s", hook, state.name)
            with self._publish_lock:
                if self._states.get(state.name) is not state:
                    return target  # removed (or replaced) while this poll was in flight
                self._targets[state.name] = target
                self._created_at = result.finished
                self._snapshot = None
            for listener in self._listeners:
                try:
                    listener(target)
                except Exception:
                    log.exception("publish listener %r failed for %s", listener, state.name)
        return target

    def _build(self, state: _TargetState, result: PollResult) -> TargetSnapshot:
        reason, message = result.error_reason, result.error_message
        page = None
        if reason is None:
            body = result.body or ""
            fingerprint = (hash(body), len(body))
            if fingerprint == state.last_body and state.last_page is not None:
                page = state.last_page
            try:
                if page is None:
                    state.last_body = state.last_page = None
                    page = sources.parse_page(body, state.engine, self.parser,
                                              self.max_label_value_bytes,
                                              buckets=state.history.keep_buckets,
                                              plan=state.page_plan)
                    state.last_body, state.last_page = fingerprint, page
            except sources.PageParseError as exc:
                reason, message = "parse", str(exc)
            except Exception as exc:  # a parser bug must not freeze the target's last values
                log.exception("parsing the page of %s failed unexpectedly", state.name)
                reason, message = "parse", f"{type(exc).__name__}: {exc}"[:300]
        if reason is None and page is not None:
            try:
                return self._derive(state, page, result)
            except Exception as exc:
                log.exception("deriving the signals of %s failed", state.name)
                reason, message = "parse", f"{type(exc).__name__}: {exc}"[:300]
        reason = reason or "parse"
        state.errors[reason] = state.errors.get(reason, 0) + 1
        if state.last_reason != reason:
            log.warning("poll of %s failed (%s): %s", state.name, reason, message)
        else:
            log.debug("poll of %s failed (%s): %s", state.name, reason, message)
        state.last_reason = reason
        return TargetSnapshot(
            name=state.name, up=False, timestamp=result.finished,
            poll_duration_seconds=result.duration_seconds, errors_total=dict(state.errors),
            counter_resets_total=state.history.resets_total,
            series_dropped_total={"max_series": state.series_dropped,
                                  "invalid": state.series_invalid},
            models_dropped_total=dict(state.history.dropped),
            label_values_truncated_total=state.labels_truncated,
            last_success_timestamp=state.last_success, last_error=f"{reason}: {message}",
            engine=state.history.engine)

    def _derive(self, state: _TargetState, page: sources.ParsedPage, result: PollResult
                ) -> TargetSnapshot:
        hist = state.history
        if page.invalid_series:
            if state.series_invalid == 0:
                log.warning("target %s: unknown counter(s) of model(s) %s on this page (NaN, "
                            "infinite, negative or listed twice with different values), or a "
                            "KV-cache total that is not finite: the signals that read them "
                            "come from the polls around this one, as across a failed poll",
                            state.name, ", ".join(page.invalid_models)[:200])
            state.series_invalid += page.invalid_series
        page, dropped = limits.cap_series(page, state.max_series,
                                          keep_first=hist.present_models)
        if dropped:
            if state.series_dropped == 0:
                log.warning("target %s has more than %d source series: dropping %d (whole "
                            "models); raise targets[].max_series to keep them", state.name,
                            state.max_series, dropped)
            state.series_dropped += dropped
        if page.truncated_label_values:
            if state.labels_truncated == 0:
                log.warning("target %s sends label values longer than %d bytes: cutting "
                            "them (with a hash suffix)", state.name, self.max_label_value_bytes)
            state.labels_truncated += page.truncated_label_values
        before = dict(hist.dropped)
        t = result.monotonic if result.monotonic is not None \
            else self.clock() if self.clock is not None else result.finished
        hist.update(page, t)
        for reason, n in hist.dropped.items():
            if n > before.get(reason, 0) and reason not in state.logged_drops:
                state.logged_drops.add(reason)
                log.warning("target %s: dropping models (%s): more than %d %s; counted in "
                            "specwatch_target_models_dropped_total (logged once)", state.name,
                            reason, hist.max_models,
                            "models on a page" if reason == "max_models"
                            else "vanished models remembered")
        state.last_success = result.finished
        if state.last_reason is not None:
            log.info("poll of %s succeeded again", state.name)
            state.last_reason = None
        # Derived when first read (a render, a hook): most polls of a target scraped less
        # often than it is polled are never read.
        models = derive.derive_models(
            [mh for name in sorted(hist.present_models)
             if (mh := hist.models.get(name)) is not None and mh.entries],
            self.derive_config, page.engine)
        return TargetSnapshot(
            name=state.name, up=True, timestamp=result.finished,
            poll_duration_seconds=result.duration_seconds, errors_total=dict(state.errors),
            counter_resets_total=hist.resets_total,
            series_dropped_total={"max_series": state.series_dropped,
                                  "invalid": state.series_invalid},
            models_dropped_total=dict(hist.dropped),
            label_values_truncated_total=state.labels_truncated,
            last_success_timestamp=result.finished, engine=page.engine, models=models,
            server=page.server)
