"""`specwatch demo`: its options, and the run that starts :class:`specwatch.app.demo.Demo`,
reports each scenario phase as it begins, and stops it on Ctrl-C, SIGTERM or ``--duration``.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
import time
from collections.abc import Iterator

from specwatch.app import demo
from specwatch.cli import logs, numbers
from specwatch.common.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", default="demo", metavar="FILE|NAME",
                        help="scenario to simulate (default: the packaged demo)")
    parser.add_argument("--speed", type=numbers.SPEED, default=demo.DEFAULT_SPEED, metavar="X",
                        help=f"run the scenario X times faster than real time (default "
                             f"{demo.DEFAULT_SPEED:g}: the packaged demo's whole story in under 4 "
                             "minutes; 1 runs it in real time; at most "
                             f"{numbers.MAX_SPEED:g})")
    parser.add_argument("--seed", type=numbers.SEED, default=None, metavar="N", help="random seed")
    parser.add_argument("--simulator-listen", default="127.0.0.1:0", metavar="HOST:PORT",
                        help="simulated vLLM address (default: a free port on 127.0.0.1)")
    parser.add_argument("--exporter-listen", default=demo.DEFAULT_EXPORTER_LISTEN,
                        metavar="HOST:PORT",
                        help=f"exporter address (default {demo.DEFAULT_EXPORTER_LISTEN})")
    parser.add_argument("--poll-interval", type=numbers.SECONDS, default=5.0, metavar="SECONDS",
                        help="exporter poll interval (default 5)")
    parser.add_argument("--prometheus", default="auto", metavar="auto|off|PATH",
                        help="Prometheus binary: auto (the one on PATH, if any), off, or a path")
    parser.add_argument("--prometheus-port", type=numbers.PORT, default=0, metavar="PORT",
                        help="Prometheus web port (default: a free one)")
    parser.add_argument("--rules", action="append", default=None, metavar="FILE",
                        help="rule files for Prometheus (default: the bundle's generated "
                             "alerts/*.yaml)")
    parser.add_argument("--duration", type=numbers.SECONDS, default=None, metavar="SECONDS",
                        help="stop by itself after this many seconds (default: run until "
                             "Ctrl-C)")
    parser.add_argument("--no-pair", dest="pair", action="store_false",
                        help="do not run the A/B baseline (a second simulated vLLM with SD "
                             "off, paired with the first: sd_measured_speedup)")
    logs.add_log_level_argument(parser, default="warning")


def options(args: argparse.Namespace) -> demo.DemoOptions:
    return demo.DemoOptions(
        scenario=args.scenario, speed=args.speed, seed=args.seed,
        simulator_listen=args.simulator_listen, exporter_listen=args.exporter_listen,
        poll_interval=args.poll_interval, prometheus=args.prometheus,
        prometheus_port=args.prometheus_port, rules=args.rules, pair=args.pair)


@contextlib.contextmanager
def _signals_stop(stop: threading.Event) -> Iterator[None]:
    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run(args: argparse.Namespace) -> int:
    logs.configure(args.log_level)
    if not args.speed > 0:
        raise ConfigError(f"--speed: expected a positive number, got {args.speed}")
    stop = threading.Event()
    with _signals_stop(stop):
        app = demo.Demo(options(args))
        try:
            app.start()
            print(app.banner(), flush=True)
            seen = app.phases_now()
            deadline = None if args.duration is None else time.monotonic() + args.duration
            while not stop.wait(0.5):
                now = app.phases_now()
                for (model, phase), (_, before) in zip(now, seen, strict=True):
                    if phase != before:
                        print(f"[{time.strftime('%H:%M:%S')}] {model}: phase {phase!r} "
                              "begins", flush=True)
                seen = now
                if deadline is not None and time.monotonic() >= deadline:
                    break
        finally:
            print("specwatch demo: stopping", flush=True)
            app.stop()
    print("specwatch demo: stopped", flush=True)
    return 0
