"""`specwatch serve`: its options, and the process around :class:`specwatch.app.serve.ServeApp`.

Signals: SIGTERM/SIGINT stop; SIGHUP re-reads the ``--web-config`` file (certificates, users)
without dropping scrapes in flight, on a thread of its own (the main thread only waits for
signals, so SIGTERM is answered during a reload); a bad new file keeps the old config and
logs an error.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from specwatch import __version__
from specwatch.app import settings
from specwatch.app.serve import ServeApp
from specwatch.cli import logs, numbers
from specwatch.common import redact
from specwatch.poll import config

log = logging.getLogger("specwatch.serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", action="append", default=[], metavar="[NAME=]URL",
                        help="a vLLM or SGLang /metrics URL (repeatable); NAME defaults to "
                             "host:port")
    parser.add_argument("--config", metavar="FILE", help="YAML configuration file")
    # The dotted spellings are the exporter-toolkit's (every Prometheus exporter's).
    parser.add_argument("--listen", "--web.listen-address", dest="listen", metavar="HOST:PORT",
                        help=f"address to serve on (default {config.DEFAULT_LISTEN})")
    parser.add_argument("--poll-interval", type=numbers.SECONDS, metavar="SECONDS",
                        help=f"seconds between polls of each target "
                             f"(default {config.DEFAULT_POLL_INTERVAL:g})")
    parser.add_argument("--web-config", "--web.config.file", dest="web_config", metavar="FILE",
                        help="exporter-toolkit web config: TLS, client certificates, basic "
                             "auth (re-read on SIGHUP)")
    parser.add_argument("--shard-index", type=numbers.integer(0, numbers.MAX_SHARDS - 1),
                        metavar="I",
                        help="poll only the targets of shard I (0-based; with --shard-count)")
    parser.add_argument("--shard-count", type=numbers.integer(1, numbers.MAX_SHARDS),
                        metavar="N",
                        help="number of exporters sharing the targets (hashmod of the target "
                             "name, as Prometheus' relabel hashmod)")
    logs.add_log_level_argument(parser)


def run(args: argparse.Namespace) -> int:
    logs.configure(args.log_level)
    redact.install()
    cfg = settings.build_config(args.config, args.target, args.listen, args.poll_interval,
                                web_config=args.web_config, shard_index=args.shard_index,
                                shard_count=args.shard_count)
    if cfg.dropped_targets:
        log.error("global.max_targets is %d: not polling %d target(s): %s", cfg.max_targets,
                  len(cfg.dropped_targets), ", ".join(cfg.dropped_targets[:20]))
    insecure = [t.name for t in cfg.targets if t.tls_verify is False]
    if insecure:
        log.warning("TLS certificates of target(s) %s are NOT verified "
                    "(tls.insecure_skip_verify)", ", ".join(insecure))
    app = ServeApp(cfg)
    stop = threading.Event()
    reload_requested = threading.Event()
    # The main loop sleeps until a signal handler wakes it: an idle exporter's main thread
    # does not wake on a timer.
    wake = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()
        wake.set()

    def on_hup(_signum: int, _frame: object) -> None:
        reload_requested.set()  # reloaded by the main loop, not inside the signal handler
        wake.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_hup)
    app.start()
    _log_started(app, cfg)
    try:
        _wait(app, stop, reload_requested, wake)
    finally:
        app.stop()
    return 0


def _log_started(app: ServeApp, cfg: config.ServeConfig) -> None:
    host, port = app.web.address
    log.info("specwatch %s serving on %s://%s:%d/metrics, polling %d target(s) every %gs",
             __version__, app.web.scheme, host, port, len(app.targets.targets),
             cfg.poll_interval)
    if cfg.shard_count > 1:
        log.info("shard %d of %d: %d of %d known target(s) are this shard's",
                 cfg.shard_index, cfg.shard_count, len(app.targets.targets),
                 app.targets.stats.discovered)
    slow = [t.name for t in app.targets.targets if t.timeout >= cfg.poll_interval]
    if slow:
        log.warning("the poll deadline of %d target(s) (e.g. %s) is not below the poll "
                    "interval %gs: a target that hangs is polled every other interval",
                    len(slow), slow[0], cfg.poll_interval)


def _wait(app: ServeApp, stop: threading.Event, reload_requested: threading.Event,
          wake: threading.Event) -> None:
    """Sleep until stopped; on SIGHUP reload the web config on a thread of its own: the main
    thread is the one Python runs signal handlers on, so it must never block (a slow file, a
    hung read): SIGTERM is answered at once whatever a reload is doing."""
    reloader: threading.Thread | None = None

    def reload_loop() -> None:
        while reload_requested.is_set() and not stop.is_set():
            reload_requested.clear()  # a SIGHUP during this reload runs one more
            app.reload()

    while not stop.is_set():
        wake.wait(5.0)  # the timeout: a safety net only
        wake.clear()
        if reload_requested.is_set() and not stop.is_set() \
                and (reloader is None or not reloader.is_alive()):
            reloader = threading.Thread(target=reload_loop, name="specwatch-reload",
                                        daemon=True)
            reloader.start()
