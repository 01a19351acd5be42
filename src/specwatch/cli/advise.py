"""`specwatch advise`: its options, and the run that prints :mod:`specwatch.model.whatif.advise`.

The load comes from the flags (``--arrival-rate-p50/p95/p99`` and the lengths), or with
``--prometheus URL`` from a deployment's history, read by :mod:`specwatch.calibrate.traffic`
(the model itself is pure numpy and imports no HTTP client) and handed to the advice as a
``Traffic``.
"""

from __future__ import annotations

import argparse
import sys

from specwatch.calibrate.prometheus import parse_time
from specwatch.calibrate.traffic import TrafficQuery, TrafficReading, read_traffic
from specwatch.cli import numbers
from specwatch.cli import whatif_options as opts
from specwatch.model.whatif import advice_text, advise, common


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_advice_arguments(parser)
    prom = parser.add_argument_group("reading the load from Prometheus")
    prom.add_argument("--prometheus", metavar="URL",
                      help="read the arrival-rate percentiles, lengths, acceptance profile "
                           "and peak batch from this Prometheus (instead of the flags)")
    prom.add_argument("--selector", default="", metavar="MATCHERS",
                      help='label matchers of the vLLM series, e.g. model_name="llama"')
    prom.add_argument("--range", type=numbers.DURATION, dest="range_", default="7d",
                      metavar="DURATION",
                      help="history to read (default 7d)")
    prom.add_argument("--rate-window", type=numbers.DURATION, default="5m", metavar="DURATION",
                      help="rate() window of the request rate (default 5m)")
    prom.add_argument("--step", type=numbers.DURATION, default="1m", metavar="DURATION",
                      help="resolution of the request-rate percentiles (default 1m)")
    prom.add_argument("--at", type=numbers.TIME, default="now", metavar="TIME",
                      help="end of the range: now (default), now-1d, RFC 3339 or Unix seconds")
    prom.add_argument("--timeout", type=numbers.TIMEOUT, default=30.0, metavar="SECONDS",
                      help="per Prometheus query (default 30)")
    parser.add_argument("--prefill-ratio", type=numbers.RATIO, default=advise.DEFAULT_PREFILL_RATIO,
                        metavar="R",
                        help="prompt/generation ratio from which traffic is prefill-heavy and "
                             "sized by the peak batch (default "
                             f"{advise.DEFAULT_PREFILL_RATIO:g})")


def _add_advice_arguments(parser: argparse.ArgumentParser) -> None:
    """The load, acceptance and decision options (the load is optional: Prometheus may
    fill it)."""
    opts.add_params_argument(parser)
    for q in advise.PERCENTILES:
        parser.add_argument(f"--arrival-rate-{q}", type=numbers.RATE, metavar="R",
                            help=f"arrival rate at the {q} of your load (req/s)")
    acc = parser.add_mutually_exclusive_group()
    acc.add_argument("--alpha", type=numbers.ALPHA, metavar="A",
                     help="per-token acceptance probability of the i.i.d. model, in [0, 1)")
    acc.add_argument("--acceptance-length", type=numbers.ACCEPTANCE_LENGTH, metavar="E",
                     help="measured tokens per verify cycle at --draft-length")
    parser.add_argument("--draft-length", type=numbers.DRAFT_LENGTH, metavar="K",
                        help="the k --acceptance-length was measured at")
    parser.add_argument("--prompt-tokens", type=numbers.TOKENS, metavar="P",
                        help="mean prompt tokens per request")
    parser.add_argument("--generation-tokens", type=numbers.TOKENS, metavar="G",
                        help="mean generated tokens per request")
    parser.add_argument("--min-gain", type=numbers.RATIO, default=advise.DEFAULT_MIN_GAIN,
                        metavar="X",
                        help="recommend SD only at or above this load-weighted predicted "
                             f"speedup (default {advise.DEFAULT_MIN_GAIN:g})")
    opts.add_interval_argument(parser)
    opts.add_k_max_argument(parser)
    parser.add_argument("--max-num-seqs", type=numbers.integer(1, 1_000_000), default=256,
                        metavar="N",
                        help="vLLM max_num_seqs: the schedule's last range ends here "
                             "(default 256)")
    opts.add_json_argument(parser)


def inputs(args: argparse.Namespace) -> advise.AdviseInputs:
    return advise.AdviseInputs(
        model=opts.model_options(args), acceptance=opts.acceptance_options(args),
        arrival_rates={q: getattr(args, f"arrival_rate_{q}") for q in advise.PERCENTILES},
        draft_length=args.draft_length, prompt_tokens=args.prompt_tokens,
        generation_tokens=args.generation_tokens, min_gain=args.min_gain,
        max_num_seqs=args.max_num_seqs, prefill_ratio=args.prefill_ratio)


def json_error(message: str) -> None:
    opts.print_json_error(message, advise.EMPTY)


def run(args: argparse.Namespace) -> int:
    def body() -> int:
        if not args.prometheus:
            out = advise.compute(inputs(args))
        else:
            traffic, reading = _traffic(args)
            out = advise.compute(inputs(args), traffic)
            if not args.json:
                print(_traffic_line(traffic, reading))
                sys.stdout.flush()
        common.print_result(out, args.json, advice_text.render)
        return 0

    return common.run_guarded(args.json, body, advise.EMPTY)


def _traffic(args: argparse.Namespace) -> tuple[advise.Traffic, TrafficReading]:
    """The load read from ``--prometheus``; typed lengths take precedence over the measured."""
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
    traffic = advise.Traffic(
        arrival_rates=r.arrival_rates,
        prompt_tokens=r.prompt_tokens if args.prompt_tokens is None else args.prompt_tokens,
        generation_tokens=(r.generation_tokens if args.generation_tokens is None
                           else args.generation_tokens),
        prompt_tokens_p95=r.prompt_tokens_p95,
        generation_tokens_p95=r.generation_tokens_p95,
        acceptance_profile=r.acceptance_profile, peak_batch=r.peak_batch,
        source=f"{q.url} {{{q.selector}}} over {args.range_}")
    return traffic, r


def _traffic_line(traffic: advise.Traffic, r: TrafficReading) -> str:
    f = common.fmt
    rates = ", ".join(f"{k} {v:.4g}" for k, v in r.arrival_rates.items())
    return (f"Traffic from {traffic.source}: arrival rate {rates} req/s; prompt mean "
            f"{f(r.prompt_tokens)} (P95 {f(r.prompt_tokens_p95)}), generation mean "
            f"{f(r.generation_tokens)} (P95 {f(r.generation_tokens_p95)}) tokens; peak "
            f"batch {f(r.peak_batch)}; acceptance "
            + (", ".join(f"{x:.3g}" for x in r.acceptance_profile)
               if r.acceptance_profile else "from the flags/parameters file"))
