"""Every numeric flag of every command is checked before it is used: hostile values (inf,
nan, negative, 1e308, huge ranges, empty, thousands of digits) are one line on stderr and
exit 2, or accepted where they are legitimately valid; never a traceback, in bounded time
and memory.

The flags are found by walking the argparse parsers of every command (subcommands
included), not by listing them: a flag added later is fuzzed too, and a numeric flag
without a checked type (a bare ``float`` or ``int``) fails
:func:`test_every_numeric_flag_has_a_checked_type`. The fast tests call the parsers
in-process; a small sample runs the real command in a subprocess, and the what-if
commands run end to end at each flag's extreme accepted values. The slow-marked variants
run more hypothesis examples and every flag through a subprocess.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specwatch.cli import COMMANDS, build_parser, main, numbers

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = ["inf", "-inf", "nan", "NaN", "-1", "1e308", "-1e308", "1e400", "", " ",
           "1-100000000", "0:1e308:1000000000", "9" * 5000, "0x10", "1e-400", "1,2,,3"]
#: Bounds of one in-process parse, in CPU seconds (the load on a shared machine stretches
#: wall time, not the parse's work) and bytes.
PARSE_SECONDS = 2.0
PARSE_BYTES = 64 << 20


def parsers() -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
    """(command words, parser) of every command and subcommand."""
    for name in COMMANDS:
        top = build_parser(name)
        yield [name], top
        for action in top._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, parser in action.choices.items():
                    yield [name, sub], parser


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.nargs is None
            and not isinstance(a, argparse._SubParsersAction)]


def valid_value(action: argparse.Action) -> str:
    """A value the option accepts (for the options a command requires)."""
    kind = action.type
    if isinstance(kind, numbers.Number):
        value = kind.lo if not kind.lo_open else min(kind.hi, kind.lo + 1.0)
        return str(int(value)) if kind.integer else repr(value)
    if kind is numbers.ARRIVAL_RATES:
        return "0:10:5"
    if kind is numbers.DRAFT_LENGTHS:
        return "1-3"
    if action.choices:
        return str(next(iter(action.choices)))
    return "qwen3-32b-h100-eagle3" if action.dest == "params" else "x"


def base_argv(words: list[str], parser: argparse.ArgumentParser,
              leave_out: argparse.Action) -> list[str]:
    argv = list(words)
    for action in options(parser):
        if action.required and action is not leave_out:
            argv += [action.option_strings[0], valid_value(action)]
    return argv


def checked_flags() -> list[tuple[list[str], argparse.ArgumentParser, argparse.Action]]:
    return [(words, parser, action) for words, parser in parsers()
            for action in options(parser) if action.type is not None
            and action.type not in (str, Path) and not action.choices]


FLAGS = checked_flags()
FLAG_IDS = [f"{' '.join(w)} {a.option_strings[0]}" for w, _, a in FLAGS]


def parse(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, float, int]:
    """(exit status, stderr, CPU seconds, peak bytes) of parsing ``argv`` in-process."""
    name, rest = argv[0], argv[1:]
    parser = build_parser(name)
    tracemalloc.start()
    started = time.process_time()
    try:
        parser.parse_args(rest)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        seconds = time.process_time() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return code, capsys.readouterr().err, seconds, peak


def legitimately_valid(action: argparse.Action, value: str) -> bool:
    kind = action.type
    if isinstance(kind, numbers.Number):
        try:
            number = int(value.strip(), 10) if kind.integer else float(value)
        except ValueError:
            return False
        return kind.accepts(number)
    try:
        kind(value)
    except argparse.ArgumentTypeError:
        return False
    return True


def check_one(words: list[str], parser: argparse.ArgumentParser, action: argparse.Action,
              value: str, capsys: pytest.CaptureFixture[str]) -> None:
    flag = action.option_strings[0]
    argv = base_argv(words, parser, action)
    code, err, seconds, peak = parse([*argv, flag, value], capsys)
    assert seconds < PARSE_SECONDS and peak < PARSE_BYTES, (flag, value, seconds, peak)
    assert "Traceback" not in err
    # argparse reads "-x" (but not "-1" or "-.5") as an option: the flag lacks its value
    taken_as_option = value.startswith("-") and not parser._negative_number_matcher.match(value)
    if legitimately_valid(action, value) and not taken_as_option:
        assert code == 0, (flag, value, err)
        return
    assert code == 2, (flag, value, err)
    prog = "specwatch " + " ".join(words)
    assert err.startswith(f"{prog}: error: {flag}: ") and err.count("\n") == 1, err


def test_every_numeric_flag_has_a_checked_type():
    bare = [f"{' '.join(w)} {a.option_strings[0]}" for w, _, a in FLAGS
            if a.type in (int, float)]
    assert not bare, f"numeric flags without a checked type (cli/numbers.py): {bare}"
    assert len(FLAGS) >= 40  # every command's numeric flags were found


@pytest.mark.parametrize(("words", "parser", "action"), FLAGS, ids=FLAG_IDS)
def test_hostile_values_are_one_line_or_legitimately_valid(words, parser, action, capsys):
    for value in HOSTILE:
        check_one(words, parser, action, value, capsys)


VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.text(alphabet="0123456789.-:,eEinfa+ ", max_size=40),
    st.text(max_size=20),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(index=st.integers(min_value=0, max_value=len(FLAGS) - 1), value=VALUES)
def test_random_values_are_one_line_or_legitimately_valid(index, value, capsys):
    words, parser, action = FLAGS[index]
    check_one(words, parser, action, value.replace("\x00", ""), capsys)


def run_subprocess(argv: list[str]) -> tuple[int, str, float]:
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    before = _children_cpu()
    proc = subprocess.run([sys.executable, "-m", "specwatch", *argv], capture_output=True,
                          text=True, timeout=60, preexec_fn=cap, check=False)
    return proc.returncode, proc.stderr, _children_cpu() - before


def _children_cpu() -> float:
    """CPU seconds of this process' finished children: a command's work, whatever the load
    on the machine (its wall time stretches with the load, its CPU time does not)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


SAMPLE = [
    ["sweep", "--params", "qwen3-32b-h100-eagle3", "--prompt-tokens", "144",
     "--generation-tokens", "200", "--arrival-rates", "0:10:5",
     "--draft-lengths", "1-100000000"],
    ["simulate", "--listen", "127.0.0.1:0", "--speed", "inf"],
    ["predict", "--params", "qwen3-32b-h100-eagle3", "--draft-length", "2",
     "--prompt-tokens", "144", "--generation-tokens", "200", "--arrival-rate", "nan"],
    ["calibrate", "x.csv", "--kv-cache-tokens", "1e308"],
    ["serve", "--target", "http://127.0.0.1:9/metrics", "--shard-count", "1e308"],
    ["calibrate", "--prometheus", "http://127.0.0.1:9", "--start", "nan"],
    ["advise", "--params", "qwen3-32b-h100-eagle3", "--prometheus", "http://127.0.0.1:9",
     "--range", "99999999999999999d"],
]


@pytest.mark.parametrize("argv", SAMPLE, ids=[" ".join(a[:1] + a[-2:]) for a in SAMPLE])
def test_real_exit_path_is_one_line_and_exit_2(argv):
    """The command as a user runs it (console script path, real interpreter start):
    one line, exit 2, within a memory cap the old MemoryError paths broke."""
    rc, err, _ = run_subprocess(argv)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"specwatch {argv[0]}: error: {argv[-2]}: "), err


WHATIF = [(w, p, a) for w, p, a in FLAGS if w[0] in ("predict", "sweep", "advise")
          and isinstance(a.type, numbers.Number)
          and a.dest not in ("timeout",)]  # advise --timeout needs --prometheus


def extremes(kind: numbers.Number) -> list[str]:
    lo = kind.lo if not kind.lo_open else kind.lo + (1e-9 if not kind.integer else 1)
    hi = kind.hi if not kind.hi_open else kind.hi - 1e-9
    return [str(int(v)) if kind.integer else repr(v) for v in (lo, hi)]


WHATIF_BASE = {
    "predict": ["--params", "qwen3-32b-h100-eagle3", "--arrival-rate", "2",
                "--draft-length", "3", "--prompt-tokens", "144", "--generation-tokens", "200"],
    "sweep": ["--params", "qwen3-32b-h100-eagle3", "--arrival-rates", "0:20:5",
              "--prompt-tokens", "144", "--generation-tokens", "200"],
    "advise": ["--params", "qwen3-32b-h100-eagle3", "--arrival-rate-p50", "1",
               "--arrival-rate-p95", "2", "--arrival-rate-p99", "3", "--prompt-tokens", "144",
               "--generation-tokens", "200"],
}


@pytest.mark.parametrize(("words", "parser", "action"), WHATIF,
                         ids=[f"{w[0]} {a.option_strings[0]}" for w, _, a in WHATIF])
def test_whatif_commands_run_at_each_flags_extremes(words, parser, action, capsys):
    """At the ends of a flag's accepted range the command answers (a result, a verdict, or
    one line saying why not), never a traceback: the ranges keep the arithmetic finite."""
    flag = action.option_strings[0]
    base = WHATIF_BASE[words[0]]
    if flag in base:
        i = base.index(flag)
        base = base[:i] + base[i + 2:]
    for value in extremes(action.type):
        started = time.process_time()  # the command's work, not the machine's load
        rc = main([words[0], *base, flag, value, "--json"])
        out = capsys.readouterr()
        assert time.process_time() - started < 30
        assert rc in (0, 1, 2), (flag, value, rc)
        assert "Traceback" not in out.err
        if rc == 2:
            assert out.err.count("\n") <= 1, (flag, value, out.err)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.function_scoped_fixture])
@given(index=st.integers(min_value=0, max_value=len(FLAGS) - 1), value=VALUES)
def test_random_values_many(index, value, capsys):
    words, parser, action = FLAGS[index]
    check_one(words, parser, action, value.replace("\x00", ""), capsys)


@pytest.mark.slow
@pytest.mark.parametrize(("words", "parser", "action"), FLAGS, ids=FLAG_IDS)
@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e308", ""])
def test_every_flag_through_a_subprocess(words, parser, action, value):
    if legitimately_valid(action, value):
        pytest.skip("a valid value starts the command")
    flag = action.option_strings[0]
    rc, err, seconds = run_subprocess([*base_argv(words, parser, action), flag, value])
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert seconds < 30
