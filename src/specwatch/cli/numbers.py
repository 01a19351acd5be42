"""The argparse types of every numeric option: each one is checked while the command line is
parsed, before anything it sizes is allocated or started.

A :class:`Number` parses a finite float (or an integer) and checks it against its declared
range; ``inf``, ``nan``, an empty string and values out of range are one argparse error
naming the option and what was expected (exit 2). The ranges are the option's meaning
(a probability in [0, 1)), else generous bounds far above any real value that keep
arithmetic finite and allocations small (:data:`MAX_RATE`, :data:`MAX_TOKENS`, ...).
List-valued numeric options (``--draft-lengths 1-8``, ``--arrival-rates 0:40:81``),
durations and times are checked by the parser of the layer that owns them, bounds first.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass

from specwatch.common.errors import SpecwatchError
from specwatch.model.closed_form import MAX_DRAFT_LENGTH

#: Highest arrival rate (req/s) an option takes: far above any server.
MAX_RATE = 1e6
#: Most tokens per request (prompt or generation): far above any context window.
MAX_TOKENS = 1e8
#: Largest count (KV-cache tokens, concurrency): the calibration inputs' bound.
MAX_COUNT = 1e12
#: Longest duration in seconds (a year), as the config files' durations.
MAX_SECONDS = 365 * 86400.0
#: Fastest simulated time the simulator keeps up with: the packaged demo scenario runs
#: about 2,500 simulated seconds per CPU second on a shared 2-core machine; past a few
#: thousand the driver falls behind the wall clock. The demo runs at 20.
MAX_SPEED = 1000.0
#: Largest random seed (numpy's seeds are 32-bit words).
MAX_SEED = 2**32 - 1
#: Most exporters sharing the targets.
MAX_SHARDS = 10_000
#: Longest timeout of one query in seconds (a day).
MAX_TIMEOUT = 86400.0
#: Largest ratio or factor (gains, tolerances, interval widths, ratios of token counts).
MAX_RATIO = 1e6


@dataclass(frozen=True)
class Number:
    """An argparse ``type``: a finite number in ``[lo, hi]`` (ends open where stated)."""

    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False
    integer: bool = False

    @property
    def __name__(self) -> str:  # argparse names the type in some of its messages
        return "integer" if self.integer else "number"

    def expected(self) -> str:
        what = "an integer" if self.integer else "a number"
        left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
        return f"{what} in {left}{self.lo:g}, {self.hi:g}{right}"

    def accepts(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        return above and below and (not self.integer or value == int(value))

    def __call__(self, text: str) -> float | int:
        try:
            value: float | int = int(text.strip(), 10) if self.integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {self.expected()}, got {text!r}") from None
        if not self.accepts(value):
            raise argparse.ArgumentTypeError(f"expected {self.expected()}, got {text!r}")
        return value


def positive(hi: float) -> Number:
    return Number(0.0, hi, lo_open=True)


def nonnegative(hi: float) -> Number:
    return Number(0.0, hi)


def integer(lo: int, hi: int) -> Number:
    return Number(lo, hi, integer=True)


RATE = nonnegative(MAX_RATE)
TOKENS = nonnegative(MAX_TOKENS)
SECONDS = positive(MAX_SECONDS)
DRAFT_LENGTH = nonnegative(MAX_DRAFT_LENGTH)
ALPHA = Number(0.0, 1.0, hi_open=True)
ACCEPTANCE_LENGTH = Number(1.0, MAX_DRAFT_LENGTH + 1.0)
UTILIZATION = Number(0.0, 1.0, lo_open=True)
K_MAX = integer(1, MAX_DRAFT_LENGTH)
SPEED = positive(MAX_SPEED)
SEED = integer(0, MAX_SEED)
PORT = integer(0, 65535)
TIMEOUT = positive(MAX_TIMEOUT)
RATIO = positive(MAX_RATIO)
INTERVAL = positive(MAX_RATIO)
COUNT = positive(MAX_COUNT)


def checked_text(parse: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse type that checks a list-valued option with the parser of the layer that
    owns it (its error, less the option name argparse adds, becomes argparse's) and keeps
    the text."""
    def check(text: str) -> str:
        try:
            parse(text)
        except SpecwatchError as exc:
            message = str(exc)
            raise argparse.ArgumentTypeError(message.split(": ", 1)[-1]) from None
        return text
    return check


def _draft_lengths(text: str) -> object:
    from specwatch.model.whatif import sweep  # numpy: only the commands that take it

    return sweep.parse_draft_lengths(text)


def _arrival_rates(text: str) -> object:
    from specwatch.model.whatif import sweep

    return sweep.parse_arrival_rates(text)


def _duration(text: str) -> object:
    from specwatch.calibrate import prometheus  # only the commands that query Prometheus

    return prometheus.parse_duration(text, "duration")


def _time(text: str) -> object:
    from specwatch.calibrate import prometheus

    return prometheus.parse_time(text, "time")


DRAFT_LENGTHS = checked_text(_draft_lengths)
ARRIVAL_RATES = checked_text(_arrival_rates)
#: A Prometheus-style duration (60s, 5m, 1h; at most 10 years).
DURATION = checked_text(_duration)
#: A time: RFC 3339, Unix seconds, now or now-DURATION.
TIME = checked_text(_time)
