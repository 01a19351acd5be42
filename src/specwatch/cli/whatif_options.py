"""The options the what-if commands (predict, sweep, advise) share, and their typed form.

Declares the parameters file, acceptance, length, interval, k_max and ``--json`` options once,
so the three commands spell and explain them alike; :func:`model_options` and
:func:`acceptance_options` turn a parsed namespace into the dataclasses of
:mod:`specwatch.model.whatif.common`. Imports only the model's what-if layer.
"""

from __future__ import annotations

import argparse
from typing import Any

from specwatch.cli import numbers
from specwatch.model.whatif.common import AcceptanceOptions, ModelOptions, print_json


def add_params_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", required=True, metavar="FILE|NAME",
                        help="parameters file (YAML) with the fitted coefficients, or the name "
                             "of a shipped example (qwen3-32b-h100-eagle3, ...)")
    parser.add_argument("--max-utilization", type=numbers.UTILIZATION, metavar="U",
                        help="validity ceiling on λ·C2 (default: the file's, else 0.9)")


def add_length_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt-tokens", type=numbers.TOKENS, required=True, metavar="P",
                        help="mean prompt tokens per request")
    parser.add_argument("--generation-tokens", type=numbers.TOKENS, required=True, metavar="G",
                        help="mean generated tokens per request")


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of a table")


def print_json_error(message: str, empty: dict[str, Any]) -> None:
    """A bad option under ``--json``: the command's empty result with ``valid: false`` and
    the reason, as for any other bad input (:func:`common.run_guarded`)."""
    print_json({**empty, "valid": False, "reason": message})


def add_interval_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-interval", type=numbers.INTERVAL, metavar="F",
                        help="widest relative half-width of the 90%% latency interval a valid "
                             "prediction may have (0.15 = ±15%%; default: the file's, else "
                             "0.15); wider is `sensitive`")


def add_k_max_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--k-max", type=numbers.K_MAX, metavar="K",
                        help="largest draft length considered (default: the file's, else 8)")


def model_options(args: argparse.Namespace) -> ModelOptions:
    """The parameters file and overrides; a command without an option leaves it None."""
    return ModelOptions(params=args.params,
                        max_utilization=getattr(args, "max_utilization", None),
                        k_max=getattr(args, "k_max", None),
                        max_interval=getattr(args, "max_interval", None))


def acceptance_options(args: argparse.Namespace) -> AcceptanceOptions:
    return AcceptanceOptions(alpha=getattr(args, "alpha", None),
                             acceptance_length=getattr(args, "acceptance_length", None))
