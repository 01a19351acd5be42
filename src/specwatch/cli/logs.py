"""The ``--log-level`` option of the long-running commands (serve, simulate, demo) and the
logging set-up it selects. Imports only the standard library."""

from __future__ import annotations

import argparse
import logging


def add_log_level_argument(parser: argparse.ArgumentParser, default: str = "info") -> None:
    parser.add_argument("--log-level", default=default,
                        choices=["debug", "info", "warning", "error"])


def configure(level: str) -> None:
    """Log records to stderr with their time, level and logger name."""
    logging.basicConfig(level=level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
