"""`specwatch sweep`: its options, and the run that prints, writes and draws
:mod:`specwatch.model.whatif.sweep` (table to stdout, ``--csv``, ``--plot``, ``--json``)."""

from __future__ import annotations

import argparse

from specwatch.cli import numbers
from specwatch.cli import whatif_options as opts
from specwatch.model.whatif import common, sweep


def add_arguments(parser: argparse.ArgumentParser) -> None:
    opts.add_params_argument(parser)
    parser.add_argument("--alpha", type=numbers.ALPHA, metavar="A",
                        help="per-token acceptance probability (i.i.d.), in [0, 1); default: "
                             "the parameters file's acceptance_profile")
    opts.add_length_arguments(parser)
    parser.add_argument("--draft-lengths", default="1-8", type=numbers.DRAFT_LENGTHS,
                        metavar="LIST",
                        help="draft lengths to draw: '1-8', '1,2,4' or '1-3,6' (default 1-8)")
    parser.add_argument("--arrival-rates", required=True, type=numbers.ARRIVAL_RATES,
                        metavar="START:STOP:N",
                        help="N evenly spaced arrival rates from START to STOP req/s, "
                             "e.g. 0:40:81")
    parser.add_argument("--csv", metavar="OUT", help="write every (λ, k) point as CSV")
    parser.add_argument("--plot", metavar="OUT.png", help="write a speedup plot (PNG)")
    opts.add_interval_argument(parser)
    opts.add_json_argument(parser)


def inputs(args: argparse.Namespace) -> sweep.SweepInputs:
    return sweep.SweepInputs(
        model=opts.model_options(args), alpha=args.alpha, prompt_tokens=args.prompt_tokens,
        generation_tokens=args.generation_tokens, draft_lengths=args.draft_lengths,
        arrival_rates=args.arrival_rates)


def json_error(message: str) -> None:
    opts.print_json_error(message, sweep.EMPTY)


def run(args: argparse.Namespace) -> int:
    def body() -> int:
        out = sweep.compute(inputs(args))
        if args.csv:
            sweep.write_csv(out, args.csv)
        if args.plot:
            sweep.write_plot(out, args.plot)
        common.print_result(out, args.json, sweep.render)
        return 0

    return common.run_guarded(args.json, body, sweep.EMPTY)
