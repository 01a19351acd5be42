"""`specwatch serve`: poll vLLM/SGLang targets, derive SD signals, serve them on /metrics.

:class:`ServeApp` wires the parts (config → poller → pipeline → snapshot → collector → web)
and is what tests and later features build on: ``app.pipeline.add_target_hook(...)``,
``app.collector.add_family_builder(...)``, ``app.web.routes["/path"] = handler`` (before
``start()``).
"""

from __future__ import annotations

import argparse
import html
import logging
import signal
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder

from specwatch import __version__, config, derive, model_live
from specwatch.collector import SpecwatchCollector
from specwatch.pipeline import Pipeline
from specwatch.poller import Poller, PollTarget
from specwatch.web import Request, Response, WebServer, only_get

log = logging.getLogger("specwatch.serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", action="append", default=[], metavar="[NAME=]URL",
                        help="a vLLM or SGLang /metrics URL (repeatable); NAME defaults to "
                             "host:port")
    parser.add_argument("--config", metavar="FILE", help="YAML configuration file")
    parser.add_argument("--listen", metavar="HOST:PORT",
                        help=f"address to serve on (default {config.DEFAULT_LISTEN})")
    parser.add_argument("--poll-interval", type=float, metavar="SECONDS",
                        help=f"seconds between polls of each target "
                             f"(default {config.DEFAULT_POLL_INTERVAL:g})")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])


class ServeApp:
    """The running exporter. ``clock`` stamps poll results (tests inject a fake one)."""

    def __init__(self, cfg: config.ServeConfig, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        dcfg = derive.DeriveConfig(windows=cfg.windows, count_window=cfg.count_window,
                                   min_drafts_per_sample=cfg.min_drafts_per_sample,
                                   min_bimodality_samples=cfg.min_bimodality_samples)
        self.pipeline = Pipeline([(t.name, t.engine) for t in cfg.targets], dcfg,
                                 cfg.poll_interval)
        self.poller = Poller(
            [PollTarget(t.name, t.url, t.timeout, t.max_body_bytes, t.headers, t.basic_auth)
             for t in cfg.targets],
            cfg.poll_interval, self.pipeline.apply, clock=clock)
        self.collector = SpecwatchCollector(lambda: self.pipeline.snapshot)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        for extra in (ProcessCollector, PlatformCollector, GCCollector):
            extra(registry=self.registry)
        self.web = WebServer(cfg.listen, {
            "/metrics": only_get(self.metrics_handler),
            "/healthz": only_get(lambda _req: Response(200, b"ok\n")),
            "/": only_get(self.landing_handler),
        })
        self.model = model_live.install(self)

    def metrics_handler(self, req: Request) -> Response:
        encoder, content_type = choose_encoder(req.headers.get("accept"))
        return Response(200, encoder(self.registry), content_type)

    def landing_handler(self, _req: Request) -> Response:
        rows = "".join(
            f"<li>{html.escape(t.name)}: {'up' if t.up else 'down'} "
            f"({html.escape(t.engine)})</li>"
            for t in self.pipeline.snapshot.targets.values())
        page = (f"<!doctype html><html><head><title>specwatch</title></head><body>"
                f"<h1>specwatch {html.escape(__version__)}</h1>"
                f"<p><a href=\"/metrics\">Metrics</a> · <a href=\"/healthz\">Health</a></p>"
                f"<h2>Targets</h2><ul>{rows}</ul></body></html>")
        return Response(200, page.encode(), "text/html; charset=utf-8")

    def start(self, poll: bool = True) -> None:
        """Bind the HTTP server, then start polling (``poll=False``: tests drive polls)."""
        self.web.start()
        if poll:
            self.poller.start()

    def stop(self) -> None:
        self.web.stop()
        self.poller.stop(timeout=10)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = config.build_config(args.config, args.target, args.listen, args.poll_interval)
    app = ServeApp(cfg)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    app.start()
    host, port = app.web.address
    log.info("specwatch %s serving on http://%s:%d/metrics, polling %d target(s) every %gs",
             __version__, host, port, len(cfg.targets), cfg.poll_interval)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        app.stop()
    return 0
