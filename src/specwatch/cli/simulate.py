"""`specwatch simulate`: its options, and the process around
:class:`specwatch.sim.server.SimulatorServer` (and its SD-off baseline with ``--pair``).

SIGTERM/SIGINT stop both servers.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from specwatch.cli import logs, numbers
from specwatch.sim.scenario import load_scenario
from specwatch.sim.server import (
    DEFAULT_LISTEN,
    SimulatorServer,
    baseline_scenario,
    default_baseline_listen,
)

log = logging.getLogger("specwatch.sim.server")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                        help=f"address to serve /metrics on (default {DEFAULT_LISTEN}; "
                             "port 0 picks a free one)")
    parser.add_argument("--scenario", default="demo", metavar="FILE|NAME",
                        help="scenario YAML file, or the name of a packaged scenario "
                             "(default: demo)")
    parser.add_argument("--speed", type=numbers.SPEED, default=1.0, metavar="X",
                        help="run simulated time X times faster than the wall clock; durations "
                             "on the page are divided by X so the page stays self-consistent "
                             f"(default 1, at most {numbers.MAX_SPEED:g}: what the simulator "
                             "keeps up with)")
    parser.add_argument("--seed", type=numbers.SEED, default=None, metavar="N",
                        help="random seed (default: the scenario's)")
    parser.add_argument("--pair", action="store_true",
                        help="also run the scenario's A/B baseline: a second server with SD "
                             "off for every model (num_speculative_tokens 0), same traffic, "
                             "on --baseline-listen; pair them in the serve config (pairs:)")
    parser.add_argument("--baseline-listen", default=None, metavar="HOST:PORT",
                        help="address of the --pair baseline (default: the port after "
                             "--listen's; port 0 picks a free one)")
    logs.add_log_level_argument(parser)


def run(args: argparse.Namespace) -> int:
    logs.configure(args.log_level)
    scenario = load_scenario(args.scenario)
    server = SimulatorServer(scenario, args.listen, args.speed, args.seed)
    baseline = None
    if args.pair:
        baseline = SimulatorServer(baseline_scenario(scenario),
                                   args.baseline_listen or default_baseline_listen(args.listen),
                                   args.speed, args.seed)
        baseline.wall0 = server.wall0  # one clock: both sides see the same phase
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    if baseline is not None:
        baseline.start()
        log.info("A/B baseline (SD off) on %s/metrics", baseline.url)
    models = ", ".join(f"{m.model_name} (k={m.num_speculative_tokens}, {m.engines} engine(s))"
                       for m in scenario.models)
    log.info("simulated vLLM on %s/metrics (%s; scenario %s, %gx real time)",
             server.url, models, scenario.source, server.speed)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
        if baseline is not None:
            baseline.stop()
    return 0
