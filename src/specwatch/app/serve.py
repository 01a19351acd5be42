"""`specwatch serve`: poll vLLM/SGLang targets, derive SD signals, serve them on /metrics.

:class:`ServeApp` wires the parts (config → poller → pipeline → snapshot → collector → web)
and installs the plug-ins (live model, pairs, controller) through a typed
:class:`specwatch.plugins.host.PluginHost`, in that order: hooks run and families render in
install order, and the controller is handed the live model's parameters explicitly.
Importing this module imports the plug-ins, which registers their metric definitions; their
config sections are composed in :mod:`specwatch.app.settings`. Tests
build on the same parts: ``app.pipeline.add_target_hook(...)``,
``app.collector.add_family_builder(...)``, ``app.web.routes["/path"] = handler`` (before
``start()``). The command's options and signal handling: :mod:`specwatch.cli.serve`.
"""

from __future__ import annotations

import dataclasses
import gc
import html
import logging
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder

from specwatch import __version__
from specwatch.common import memory
from specwatch.expose import metricdefs
from specwatch.expose.collector import (
    FamilyBuilder,
    SpecwatchCollector,
    gzip_join,
    server_families,
)
from specwatch.plugins.control import controller
from specwatch.plugins.live import plugin as model_live
from specwatch.plugins.pairs import plugin as pairs
from specwatch.plugins.pairs import settings as pair_config
from specwatch.poll import config
from specwatch.poll.discovery import TargetSource
from specwatch.poll.pipeline import DEFAULT_MAX_MODELS, ForgetHook, Pipeline, PollResult, TargetHook
from specwatch.poll.poller import Poller, PollTarget
from specwatch.poll.snapshot import Snapshot, TargetSnapshot
from specwatch.poll.windows import derive
from specwatch.web.limits import REJECT_REASONS
from specwatch.web.negotiate import accepts_gzip, by_preference
from specwatch.web.routing import Handler, Request, Response, only_get
from specwatch.web.server import WebServer

log = logging.getLogger("specwatch.serve")


class ServeApp:
    """The running exporter. ``clock`` stamps poll results (tests inject a fake one)."""

    def __init__(self, cfg: config.ServeConfig, clock: Callable[[], float] = time.time,
                 listen_option: str = "--listen") -> None:
        self.cfg = cfg
        self.clock = clock
        # One worker thread per target: bound glibc's per-thread arenas (common/memory.py).
        memory.bound_malloc_arenas()
        self._gc_thresholds: tuple[int, ...] | None = None  # set while started
        dcfg = derive.DeriveConfig(windows=cfg.windows, count_window=cfg.count_window,
                                   min_drafts_per_sample=cfg.min_drafts_per_sample,
                                   min_bimodality_samples=cfg.min_bimodality_samples)
        # The targets: static ones plus file_sd, this shard's share (discovery.py).
        self.targets = TargetSource(cfg.targets, cfg.file_sd, cfg.discovered_target,
                                    cfg.shard_index, cfg.shard_count, cfg.max_targets,
                                    static_dropped=len(cfg.dropped_targets),
                                    shard_keys=cfg.shard_keys)
        self.targets.refresh(strict=True)  # a bad file_sd file at start-up is exit 2
        targets = self.targets.targets
        self.pipeline = Pipeline([(t.name, t.engine) for t in targets], dcfg,
                                 cfg.poll_interval,
                                 max_series={t.name: t.max_series for t in targets},
                                 parser=cfg.parser, max_models=self._max_models(targets),
                                 max_label_value_bytes=cfg.max_label_value_bytes)
        # Windows on a monotonic clock (a wall-clock jump must not bend them); an injected
        # clock (tests, the demo's simulated time) drives both.
        self.history_clock = time.monotonic if clock is time.time else clock
        self.collector = SpecwatchCollector(lambda: self.pipeline.snapshot)
        # Each published target's lines are rendered after the worker's run of polls, all
        # together (collector.prerender_later).
        self.pipeline.add_publish_listener(self.collector.prerender_later)
        self.poller = Poller([_poll_target(t) for t in targets], cfg.poll_interval,
                             self.on_poll_result, clock=clock, stamp=self.history_clock,
                             max_concurrent=cfg.max_concurrent_polls,
                             spread=cfg.poll_spread, after_run=self.collector.render_queued)
        # ``registry``: everything, through collect() (for registry users). ``_per_scrape``:
        # what /metrics renders on each scrape after the collector's cached bytes.
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self._per_scrape = CollectorRegistry(auto_describe=False)
        self._per_scrape.register(self.collector.per_scrape())
        for extra in (ProcessCollector, PlatformCollector, GCCollector):
            self._per_scrape.register(extra(registry=self.registry))
        self.web = WebServer(cfg.listen, {
            "/metrics": only_get(self.metrics_handler),
            "/healthz": only_get(lambda _req: Response(200, b"ok\n")),
            "/": only_get(self.landing_handler),
        }, web_config_file=cfg.web_config, limits=cfg.http_server,
            listen_option=listen_option)
        self._host = _Host(self.pipeline, self.collector, self.web)
        self.model = model_live.install(self._host, model_live.from_config(cfg))
        self.pairs = pairs.install(self._host, cfg.section(pair_config.SECTION))
        self.controller = controller.install(self._host, controller.from_config(
            cfg, self.model.params, self.model.windows, clock=clock,
            live_of=lambda m: m.slot(model_live.PREDICTION),
            measured_of=self.pairs.current_speedup if self.pairs is not None else None))
        if self.controller is None and self.pairs is None:
            # Only the controller and the A/B pairs read the windows' latency histograms: not
            # built without them.
            self.pipeline.derive_config = dataclasses.replace(dcfg, histograms=False)
        self.collector.add_family_builder(self.exporter_families)
        seqs = {t.name: t.max_num_seqs for t in cfg.targets if t.max_num_seqs is not None}
        self.collector.add_family_builder(
            lambda snap: server_families(snap, seqs), per_snapshot=True)

    def on_poll_result(self, result: PollResult) -> None:
        """A finished poll (the poller's callback): stamped with the history clock (the
        poller stamps its results; others are stamped here), then applied by the pipeline."""
        if result.monotonic is None:
            result = dataclasses.replace(result, monotonic=self.history_clock())
        self.pipeline.apply(result)

    def _max_models(self, targets: tuple[config.TargetConfig, ...]) -> dict[str, int]:
        return {t.name: t.max_models if t.max_models is not None else DEFAULT_MAX_MODELS
                for t in targets}

    def exporter_families(self, _snap: Snapshot) -> list[Metric]:
        """The exporter's own limits and HTTP server: what it refused and dropped."""
        st = self.web.stats()
        rejected = metricdefs.counter("specwatch_http_requests_rejected")
        for reason in REJECT_REASONS:
            rejected.add_metric([reason], float(st.rejected.get(reason, 0)))
        in_flight = metricdefs.gauge("specwatch_http_requests_in_flight", float(st.in_flight))
        sd = self.targets.stats
        targets_dropped = metricdefs.gauge("specwatch_targets_dropped", float(sd.dropped))
        discovered = metricdefs.gauge("specwatch_targets_discovered", float(sd.discovered))
        fams: list[Metric] = [rejected, in_flight, targets_dropped, discovered]
        if self.cfg.file_sd:
            fams.append(metricdefs.counter("specwatch_sd_file_read_errors",
                                           float(sd.read_errors_total)))
        if self.web.web_config_file:
            ok = metricdefs.gauge("specwatch_web_config_last_reload_successful",
                                  1.0 if st.web_config_reload_success else 0.0)
            fams.append(ok)
            if st.web_config_reload_timestamp is not None:
                fams.append(metricdefs.gauge(
                    "specwatch_web_config_last_reload_success_timestamp_seconds",
                    st.web_config_reload_timestamp))
        return fams

    def metrics_handler(self, req: Request) -> Response:
        """/metrics: the collector's cached bytes of the current snapshot (and their cached
        deflate stream when the client takes gzip), then what changes per scrape."""
        encoder, content_type = choose_encoder(by_preference(req.headers.get("accept")))
        openmetrics = content_type.startswith("application/openmetrics-text")
        snap = self.pipeline.snapshot
        tail = encoder(self._per_scrape)
        if accepts_gzip(req.headers.get("accept-encoding")):
            head = self.collector.exposition_deflate(snap, openmetrics)
            return Response(200, gzip_join(head, tail), content_type,
                            {"Content-Encoding": "gzip"})
        return Response(200, self.collector.exposition(snap, openmetrics) + tail,
                        content_type)

    def landing_handler(self, _req: Request) -> Response:
        rows = "".join(
            f"<li>{html.escape(t.name)}: {html.escape(_target_state(t))}</li>"
            for t in self.pipeline.snapshot.targets.values())
        page = (f"<!doctype html><html><head><title>specwatch</title></head><body>"
                f"<h1>specwatch {html.escape(__version__)}</h1>"
                f"<p><a href=\"/metrics\">Metrics</a> · <a href=\"/healthz\">Health</a></p>"
                f"<h2>Targets</h2><ul>{rows}</ul></body></html>")
        return Response(200, page.encode(), "text/html; charset=utf-8")

    def start(self, poll: bool = True) -> None:
        """Bind the HTTP server, then start polling (``poll=False``: tests drive polls).

        While it runs, the garbage collector's young passes are paced for a poller
        (:func:`specwatch.common.memory.pace_garbage_collector`); :meth:`stop` restores the
        former thresholds."""
        self.web.start()
        if self._gc_thresholds is None:
            self._gc_thresholds = memory.pace_garbage_collector()
        for start, _stop in self._host.lifecycle:
            start()
        if poll:
            self.poller.start()
            self.targets.start(self.apply_targets)

    def apply_targets(self, targets: tuple[config.TargetConfig, ...]) -> None:
        """A new target set from discovery: pipeline first (so results of new targets have
        a state), then the poller."""
        self.pipeline.set_targets([(t.name, t.engine) for t in targets],
                                  {t.name: t.max_series for t in targets},
                                  self._max_models(targets))
        self.poller.set_targets([_poll_target(t) for t in targets])
        log.info("now polling %d target(s)", len(targets))

    def stop(self) -> None:
        self.web.stop()
        self.targets.stop()
        self.poller.stop(timeout=10)
        for _start, stop in self._host.lifecycle:
            stop()
        if self._gc_thresholds is not None:
            gc.set_threshold(*self._gc_thresholds)
            self._gc_thresholds = None

    def reload(self) -> bool:
        """Re-read the web config (SIGHUP). False, with the old config kept, on error."""
        return self.web.reload_web_config()


class _Host:
    """The :class:`~specwatch.plugins.host.PluginHost` ServeApp hands its plug-ins: the
    pipeline's, collector's and web server's registries, and the plug-ins' start/stop."""

    def __init__(self, pipeline: Pipeline, collector: SpecwatchCollector,
                 web: WebServer) -> None:
        self._pipeline = pipeline
        self._collector = collector
        self._web = web
        #: (start, stop) of each plug-in that has threads, in install order.
        self.lifecycle: list[tuple[Callable[[], None], Callable[[], None]]] = []

    def add_target_hook(self, hook: TargetHook) -> None:
        self._pipeline.add_target_hook(hook)

    def add_forget_hook(self, hook: ForgetHook) -> None:
        self._pipeline.add_forget_hook(hook)

    def add_family_builder(self, builder: FamilyBuilder) -> None:
        self._collector.add_family_builder(builder)

    def add_route(self, path: str, handler: Handler, own_auth: bool = False) -> None:
        self._web.routes[path] = handler
        if own_auth:
            self._web.own_auth_paths.add(path)

    def add_lifecycle(self, start: Callable[[], None], stop: Callable[[], None]) -> None:
        self.lifecycle.append((start, stop))


def _poll_target(t: config.TargetConfig) -> PollTarget:
    return PollTarget(t.name, t.url, t.timeout, t.max_body_bytes, t.headers, t.basic_auth,
                      verify=t.tls_verify, cert=t.tls_client_cert,
                      follow_redirects=t.follow_redirects)


def _target_state(t: TargetSnapshot) -> str:
    """A landing-page line's state: up with the engine read, or down with why (the last
    poll's error, already free of credentials as logged), or not polled yet."""
    if t.up:
        return f"up ({t.engine})"
    engine = "" if t.engine == "unknown" else f" ({t.engine})"
    if t.last_error:
        return f"down{engine}: {t.last_error}"
    return f"down{engine}: not polled yet" if t.timestamp is None else f"down{engine}"
