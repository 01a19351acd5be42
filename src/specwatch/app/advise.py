"""`specwatch advise`: the pure advice core plus ``--prometheus URL`` (issue 16).

Why a module in ``app``: the advice itself is the latency model's (``specwatch.model`` is
pure numpy and must not import an HTTP client), and reading a deployment's traffic from
Prometheus belongs to the calibrate layer (:mod:`specwatch.calibrate.traffic`). This layer
may import both: it adds the Prometheus options, reads the load percentiles, lengths,
acceptance profile and peak batch, and hands them to
:func:`specwatch.model.whatif.advise.compute` as a ``Traffic``. Without ``--prometheus`` it is
the plain command (``--arrival-rate-p50/p95/p99`` and the lengths by hand).
"""

from __future__ import annotations

import argparse
import sys

from specwatch.calibrate.prometheus import parse_time
from specwatch.calibrate.traffic import TrafficQuery, read_traffic
from specwatch.model.whatif import advise as core
from specwatch.model.whatif import common


def add_arguments(parser: argparse.ArgumentParser) -> None:
    core.add_arguments(parser, required=False)
    prom = parser.add_argument_group("reading the load from Prometheus")
    prom.add_argument("--prometheus", metavar="URL",
                      help="read the arrival-rate percentiles, lengths, acceptance profile "
                           "and peak batch from this Prometheus (instead of the flags)")
    prom.add_argument("--selector", default="", metavar="MATCHERS",
                      help='label matchers of the vLLM series, e.g. model_name="llama"')
    prom.add_argument("--range", dest="range_", default="7d", metavar="DURATION",
                      help="history to read (default 7d)")
    prom.add_argument("--rate-window", default="5m", metavar="DURATION",
                      help="rate() window of the request rate (default 5m)")
    prom.add_argument("--step", default="1m", metavar="DURATION",
                      help="resolution of the request-rate percentiles (default 1m)")
    prom.add_argument("--at", default="now", metavar="TIME",
                      help="end of the range: now (default), now-1d, RFC 3339 or Unix seconds")
    prom.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                      help="per Prometheus query (default 30)")
    parser.add_argument("--prefill-ratio", type=float, default=core.DEFAULT_PREFILL_RATIO,
                        metavar="R",
                        help="prompt/generation ratio from which traffic is prefill-heavy and "
                             "sized by the peak batch (default "
                             f"{core.DEFAULT_PREFILL_RATIO:g})")


def run(args: argparse.Namespace) -> int:
    if not args.prometheus:
        return core.run(args)

    def body() -> int:
        typed = [f for f in ("arrival_rate_p50", "arrival_rate_p95", "arrival_rate_p99")
                 if getattr(args, f) is not None]
        if typed:
            raise common.InputError(f"--{typed[0].replace('_', '-')}: not with --prometheus "
                                    "(the percentiles are read from it)")
        q = TrafficQuery.from_args(url=args.prometheus, selector=args.selector,
                                   range_=args.range_, rate_window=args.rate_window,
                                   step=args.step, timeout=args.timeout)
        q = TrafficQuery(q.url, q.selector, q.range_s, q.rate_window_s, q.step_s,
                         parse_time(args.at, "--at"), q.timeout)
        r = read_traffic(q)
        traffic = core.Traffic(
            arrival_rates=r.arrival_rates,
            prompt_tokens=r.prompt_tokens if args.prompt_tokens is None else args.prompt_tokens,
            generation_tokens=(r.generation_tokens if args.generation_tokens is None
                               else args.generation_tokens),
            prompt_tokens_p95=r.prompt_tokens_p95,
            generation_tokens_p95=r.generation_tokens_p95,
            acceptance_profile=r.acceptance_profile, peak_batch=r.peak_batch,
            source=f"{q.url} {{{q.selector}}} over {args.range_}")
        out = core.compute(args, traffic)
        if args.json:
            common.print_json(out)
        else:
            f = common.fmt
            rates = ", ".join(f"{k} {v:.4g}" for k, v in r.arrival_rates.items())
            print(f"Traffic from {traffic.source}: arrival rate {rates} req/s; prompt mean "
                  f"{f(r.prompt_tokens)} (P95 {f(r.prompt_tokens_p95)}), generation mean "
                  f"{f(r.generation_tokens)} (P95 {f(r.generation_tokens_p95)}) tokens; peak "
                  f"batch {f(r.peak_batch)}; acceptance "
                  + (", ".join(f"{x:.3g}" for x in r.acceptance_profile)
                     if r.acceptance_profile else "from the flags/parameters file"))
            sys.stdout.flush()
            core.render(out)
        return 0

    return common.run_guarded(args, body, core.EMPTY)
