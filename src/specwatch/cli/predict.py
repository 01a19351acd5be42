"""`specwatch predict`: its options, and the run that prints :mod:`specwatch.model.whatif.predict`.

Exit 0 when the latency asked for (SD at k; no SD at k = 0) is valid; exit 2 (with
`valid: false` and a reason under `--json`) on bad input or a declined latency (saturated,
above the validity ceiling, outside the calibrated range, sensitive). The speedup has its own
verdict (`speedup_valid`), which does not set the exit status.
"""

from __future__ import annotations

import argparse

from specwatch.cli import numbers
from specwatch.cli import whatif_options as opts
from specwatch.model.whatif import common, predict


def add_arguments(parser: argparse.ArgumentParser) -> None:
    opts.add_params_argument(parser)
    parser.add_argument("--arrival-rate", type=numbers.RATE, required=True, metavar="R",
                        help="request arrival rate λ (req/s)")
    parser.add_argument("--draft-length", type=numbers.DRAFT_LENGTH, required=True, metavar="K",
                        help="draft length k (tokens proposed per draft; 0 = SD off)")
    acc = parser.add_mutually_exclusive_group()
    acc.add_argument("--acceptance-length", type=numbers.ACCEPTANCE_LENGTH, metavar="E",
                     help="mean tokens committed per verify cycle, bonus token included")
    acc.add_argument("--alpha", type=numbers.ALPHA, metavar="A",
                     help="per-token acceptance probability of the i.i.d. model, in [0, 1)")
    opts.add_length_arguments(parser)
    opts.add_k_max_argument(parser)
    opts.add_interval_argument(parser)
    opts.add_json_argument(parser)


def inputs(args: argparse.Namespace) -> predict.PredictInputs:
    return predict.PredictInputs(
        model=opts.model_options(args), acceptance=opts.acceptance_options(args),
        arrival_rate=args.arrival_rate, draft_length=args.draft_length,
        prompt_tokens=args.prompt_tokens, generation_tokens=args.generation_tokens)


def json_error(message: str) -> None:
    opts.print_json_error(message, predict.EMPTY)


def run(args: argparse.Namespace) -> int:
    def body() -> int:
        out = predict.compute(inputs(args))
        common.print_result(out, args.json, predict.render)
        if not out["valid"]:
            if args.json:
                return 2
            raise common.InputError(out["reason"])
        return 0

    return common.run_guarded(args.json, body, predict.EMPTY)
