"""Fuzzing the parse-and-derive path: page text → sources → limits → history → derive →
collector exposition. The only allowed failure is PageParseError (the target is then down
with reason "parse"); anything else raising is a bug.

Properties checked on every accepted page sequence:

* no exception other than PageParseError, anywhere on the path;
* every derived value is finite; ratios are within [0, 1]; acceptance length >= 1;
* reset-corrected cumulative counters never decrease;
* the rendered exposition parses back with no duplicate series.

Three entry points:

* the default suite runs a few thousand generated cases with a fixed seed (deterministic in
  CI) plus every file of the committed corpus ``tests/fixtures/fuzz-corpus/`` (past bad
  inputs: what real servers and earlier fuzzing produced);
* ``make fuzz`` runs ``SPECWATCH_FUZZ_EXAMPLES`` (default 100,000) random seeded cases plus
  a twentieth as many structured ones, with random seeds; a failing input is written to
  ``SPECWATCH_FUZZ_FAILURE_FILE`` so it can be added to the corpus.
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

import pytest
from helpers.paths import FIXTURES
from helpers.scrape import parse_exposition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from specwatch.expose.collector import SpecwatchCollector
from specwatch.poll import limits, sources
from specwatch.poll.snapshot import Snapshot, TargetSnapshot
from specwatch.poll.windows import derive, history

CORPUS = FIXTURES / "fuzz-corpus"
LONG_RUN = int(os.environ.get("SPECWATCH_FUZZ_EXAMPLES", "0"))
FAILURE_FILE = os.environ.get("SPECWATCH_FUZZ_FAILURE_FILE")
MAX_INPUT = 10240  # bytes per page (OSS-Fuzz guidance, as Prometheus' fuzz targets)
RATIOS = (derive.ACCEPTANCE_RATE, derive.TOKEN_ACCEPTANCE_PROBABILITY,
          derive.ACCEPTANCE_HETEROGENEITY)

NAMES = [
    *sorted(sources.source_metric_names()), "vllm:spec_decode_num_drafts_created",
    "vllm:spec_decode_num_draft_tokens_created",
    "vllm:spec_decode_num_accepted_tokens_created",
    "vllm:spec_decode_num_accepted_tokens_per_pos_created", "process_start_time_seconds",
    "vllm:e2e_request_latency_seconds_bucket", "vllm:iteration_tokens_total",
    "vllm:spec_decode_num_drafts", "unrelated_metric_total", "sglang:spec_accept_length"]
LABEL_NAMES = ["engine", "model_name", "position", "finished_reason", "le", "tp_rank",
               "pp_rank", "x"]
LABEL_VALUES = ["0", "1", "2", "m", "lora-a", "", "+Inf", "0.5", "-1", "abc", "é模型",
                'q"uote', "back\\slash", "new\nline", "x" * 40]
VALUES = st.one_of(
    st.integers(min_value=0, max_value=10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "-1", "1e308", "1e-320", "0x10", "", "1_000",
                     "-0.0", "18446744073709551616", "9007199254740993", "1e16"]),
)
# Strategies are built once at import: building them inside a composite makes hypothesis
# re-validate them on every draw (most of the run time).
_NAME = st.one_of(st.sampled_from(NAMES), st.sampled_from(["", "9bad", "a b", "{", "x}"]))
_LABELS = st.lists(st.tuples(st.sampled_from(LABEL_NAMES), st.sampled_from(LABEL_VALUES)),
                   max_size=4)


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _render_line(parts: tuple[str, list, str, int]) -> str:
    name, labels, value, cut = parts
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    line = f"{name}{{{body}}} {value}" if labels else f"{name} {value}"
    # One line in 16 is truncated somewhere.
    return line[: cut % (len(line) + 1)] if cut % 16 == 0 else line


SAMPLE_LINE = st.tuples(_NAME, _LABELS, VALUES, st.integers(0, 1 << 16)).map(_render_line)
META_LINE = st.tuples(st.sampled_from(["# TYPE", "# HELP"]), _NAME, st.sampled_from(
    ["counter", "gauge", "histogram", "summary", "untyped", "info", "bogus", "", "x y"])
).map(lambda t: f"{t[0]} {t[1]} {t[2]}")
GARBAGE = st.text(max_size=24)
PAGE = st.lists(st.one_of(SAMPLE_LINE, SAMPLE_LINE, SAMPLE_LINE, SAMPLE_LINE, META_LINE,
                          GARBAGE), max_size=40).map(lambda ls: "\n".join(ls) + "\n")
ENGINE = st.sampled_from(list(sources.ENGINE_KINDS))
_ODD_NAMES = ["", "9bad", "a b", "{", "x}"]
_TYPES = ["counter", "gauge", "histogram", "summary", "untyped", "info", "bogus", "", "x y"]
_ODD_VALUES = ["NaN", "+Inf", "-Inf", "-1", "1e308", "1e-320", "0x10", "", "1_000", "-0.0",
               "18446744073709551616", "9007199254740993", "1e16"]


def _random_value(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.5:
        return str(rng.randint(0, 10**6))
    if r < 0.75:
        return repr(rng.choice([rng.uniform(-1e6, 1e6), rng.expovariate(1e-3),
                                math.ldexp(rng.random(), rng.randint(-1074, 1023))]))
    return rng.choice(_ODD_VALUES)


def _random_line(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.08:
        return "".join(chr(rng.randint(0, 0x2FF)) for _ in range(rng.randint(0, 24)))
    name = rng.choice(NAMES) if rng.random() < 0.95 else rng.choice(_ODD_NAMES)
    if r < 0.2:
        return f"# {rng.choice(['TYPE', 'HELP'])} {name} {rng.choice(_TYPES)}"
    labels = [(rng.choice(LABEL_NAMES), rng.choice(LABEL_VALUES))
              for _ in range(rng.randint(0, 4))]
    return _render_line((name, labels, _random_value(rng), rng.randint(0, 1 << 16)))


_VLLM_COUNTERS = ["vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                  "vllm:spec_decode_num_accepted_tokens_total", "vllm:request_success_total",
                  "vllm:e2e_request_latency_seconds_sum", "vllm:e2e_request_latency_seconds_count",
                  "vllm:request_prompt_tokens_sum", "vllm:request_prompt_tokens_count",
                  "vllm:generation_tokens_total", "vllm:spec_decode_num_emitted_tokens_total"]
_SGLANG_COUNTERS = ["sglang:spec_verify_calls_total", "sglang:generation_tokens_total",
                    "sglang:num_requests_total", "sglang:prompt_tokens_total",
                    "sglang:e2e_request_latency_seconds_sum",
                    "sglang:e2e_request_latency_seconds_count"]
_GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "sglang:spec_num_steps",
           "sglang:spec_num_draft_tokens", "sglang:num_running_reqs",
           "vllm:spec_decode_draft_acceptance_rate"]


def _evolving_pages(rng: random.Random) -> list[str]:
    """Mostly valid pages of one server evolving poll to poll: counters grow, sometimes
    reset (one series, or the whole process), series vanish and return, and now and then
    a value turns NaN/Inf/negative/huge, a series is duplicated or the page is cut."""
    models = rng.sample(["m", "lora-a", "", "é模型", 'q"uote', "x" * 40], rng.randint(1, 3))
    engines = [str(e) for e in range(rng.randint(1, 3))]
    k = rng.randint(0, 4)
    names = rng.sample(_VLLM_COUNTERS + _SGLANG_COUNTERS, rng.randint(1, 10))
    keys: list[tuple[str, str]] = []
    for m in models:
        for e in engines:
            lab = f'engine="{e}",model_name="{_escape(m)}"'
            keys += [(n, lab) for n in names]
            keys += [("vllm:spec_decode_num_accepted_tokens_per_pos_total",
                      f'{lab},position="{p}"') for p in range(k)]
            keys += [(g, f'model_name="{_escape(m)}"') for g in rng.sample(_GAUGES, 2)]
    values = dict.fromkeys(keys, 0.0)
    start = 1.7e9
    pages = []
    for _ in range(rng.randint(2, 5)):
        if rng.random() < 0.1:
            start += rng.choice([0.0, 1.0, 3600.0])  # whole-server restart
            values = dict.fromkeys(values, 0.0)
        lines = [f"process_start_time_seconds {start!r}"] if rng.random() < 0.8 else []
        for key in keys:
            r = rng.random()
            if r < 0.05:
                values[key] = float(rng.randint(0, 10))  # this series restarted
            else:
                values[key] += rng.choice([0, 1, rng.randint(0, 5000), rng.random() * 1e3])
            if r > 0.95:
                continue  # vanished from this page
            value = repr(values[key]) if rng.random() > 0.03 else rng.choice(_ODD_VALUES)
            name, lab = key
            lines.append(f"{name}{{{lab}}} {value}")
            if rng.random() < 0.02:
                lines.append(f"{name}{{{lab}}} {rng.choice([value, _random_value(rng)])}")
        if rng.random() < 0.1:
            rng.shuffle(lines)
        page = "\n".join(lines) + "\n"
        if rng.random() < 0.03:
            page = page[: rng.randint(0, len(page))]
        pages.append(page[:MAX_INPUT])
    return pages


def random_pages(seed: int) -> tuple[list[str], str]:
    """1-5 polls from ``seed``: two thirds evolving, mostly valid servers (deep paths:
    history, resets, windows), one third hostile text (odd names, labels and values,
    truncated lines, random characters) mutated poll to poll."""
    rng = random.Random(seed)
    engine = rng.choice(list(sources.ENGINE_KINDS))
    if rng.random() < 0.67:
        return _evolving_pages(rng), engine
    lines = [_random_line(rng) for _ in range(rng.randint(0, 40))]
    pages = []
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.3:
            lines = [_random_line(rng) for _ in range(rng.randint(0, 40))]
        for _ in range(rng.randint(0, 5)):
            if not lines:
                break
            j = rng.randrange(len(lines))
            op = rng.random()
            if op < 0.3:
                lines.pop(j)
            elif op < 0.5:
                lines.insert(j, lines[j])
            else:
                lines[j] = f"{lines[j].rsplit(' ', 1)[0]} {_random_value(rng)}"
        pages.append(("\n".join(lines) + "\n")[:MAX_INPUT])
    return pages, engine


def check_sequence(pages: list[str], engine: str = "auto") -> int:
    """Run pages (one poll each, 5 s apart) through the whole pure path; returns how many
    parsed. Raises AssertionError (or the bug's own exception) on a violated property."""
    cfg = derive.DeriveConfig(windows=(("1m", 60.0), ("5m", 300.0)), count_window=10,
                              min_drafts_per_sample=1, min_bimodality_samples=4)
    hist = history.TargetHistory(600.0, 64, cfg.min_drafts_per_sample)
    last_cumulative: dict[str, dict] = {}
    parsed = 0
    for i, text in enumerate(pages):
        try:
            page = sources.parse_page(text, engine)
        except sources.PageParseError:
            continue
        parsed += 1
        assert page.invalid_series >= 0
        page, dropped = limits.cap_series(page, 50, keep_first=hist.present_models)
        assert dropped >= 0 and limits.series_count(page) <= 50
        hist.update(page, 1000.0 + 5.0 * i)
        models = {}
        for name in sorted(hist.present_models):
            mh = hist.models.get(name)
            if mh is None or not mh.entries:
                continue
            prev = last_cumulative.get(name, {})
            for key, value in mh.cumulative.items():
                assert math.isfinite(value) and value >= 0, (key, value)
                assert value >= prev.get(key, 0.0) - 1e-9 * max(1.0, abs(value)), key
            last_cumulative[name] = dict(mh.cumulative)
            snap = derive.derive_model(mh, cfg, page.engine)
            for w in snap.windows:
                for metric, value in w.values.items():
                    assert math.isfinite(value), (metric, value)
                    if metric in RATIOS:
                        assert 0.0 <= value <= 1.0, (metric, value)
                    if metric == derive.ACCEPTANCE_LENGTH:
                        assert value >= 1.0, value
                for per_pos in w.positions.values():
                    for value in per_pos.values():
                        assert 0.0 <= value <= 1.0
            if snap.samples is not None:
                counts = snap.samples.cumulative_counts
                assert list(counts) == sorted(counts) and counts[-1] == snap.samples.count
            models[name] = snap
        rendered = _render(models, page.engine)
        parse_exposition(rendered)  # parses, and no duplicate series
    return parsed


def _render(models: dict, engine: str) -> str:
    target = TargetSnapshot(name="t", up=True, engine=engine, models=models)
    collector = SpecwatchCollector(lambda: Snapshot(version="fuzz", targets={"t": target}))
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return generate_latest(reg).decode()


def _run(pages: list[str], engine: str) -> int:
    try:
        return check_sequence(pages, engine)
    except BaseException:
        if FAILURE_FILE:
            sep = "\n# ---- next poll ----\n"
            Path(FAILURE_FILE).write_text(f"# engine: {engine}\n" + sep.join(pages))
        raise


# Default suite: deterministic (derandomized, so CI never flakes on a new random case).
# `make fuzz`: random seeds, plus the long plain loop below.
_HC = [HealthCheck.too_slow, HealthCheck.data_too_large]
_seeded = settings(max_examples=2500, deadline=None, derandomize=not LONG_RUN,
                   database=None, suppress_health_check=_HC)
_structured = settings(max_examples=LONG_RUN // 20 if LONG_RUN else 200, deadline=None,
                       derandomize=not LONG_RUN, database=None, suppress_health_check=_HC)


@_seeded
@given(seed=st.integers(min_value=0, max_value=2**64 - 1))
def test_fuzz_seeded_page_sequences(seed):
    """Pages generated from a seed (hypothesis explores seeds; generation is plain
    ``random``, far cheaper than drawing every byte through hypothesis): evolving, mostly
    valid servers with resets, vanishing series and the odd NaN/Inf/negative/huge value,
    duplicate or cut page; and hostile text (odd names and labels, truncated lines, random
    characters). Nothing but PageParseError may raise."""
    pages, engine = random_pages(seed)
    _run(pages, engine)


@_structured
@given(pages=st.lists(PAGE, min_size=1, max_size=3), engine=ENGINE)
def test_fuzz_structured_pages(pages, engine):
    """The same grammar drawn through hypothesis strategies, so a failure shrinks to a
    minimal page."""
    _run([p[:MAX_INPUT] for p in pages], engine)


def test_fuzz_long_run():
    """`make fuzz`: SPECWATCH_FUZZ_EXAMPLES (>= 100,000) seeded page sequences from a random
    base seed, in a plain loop (hypothesis' bookkeeping grows with the example count and
    adds nothing to seed-driven generation). Zero unhandled exceptions; the first failing
    input goes to SPECWATCH_FUZZ_FAILURE_FILE and the seed is in the failure message."""
    if not LONG_RUN:
        pytest.skip("only under make fuzz (SPECWATCH_FUZZ_EXAMPLES)")
    base = int.from_bytes(os.urandom(8), "big")
    cases = parsed = 0
    for i in range(LONG_RUN):
        seed = (base + i) % 2**64
        pages, engine = random_pages(seed)
        try:
            parsed += _run(pages, engine)
        except BaseException as exc:
            raise AssertionError(f"fuzz case {i} (seed {seed}) failed: {exc!r}") from exc
        cases += 1
    assert cases == LONG_RUN
    print(f"\nfuzz: {cases} seeded cases (base seed {base}), {parsed} pages parsed and "
          f"derived, no unhandled exception")


def _corpus_files() -> list[Path]:
    return sorted(p for p in CORPUS.iterdir() if p.is_file() and p.name != "README.md")


@pytest.mark.parametrize("path", _corpus_files(), ids=lambda p: p.name)
def test_corpus_input_is_handled(path):
    """Each committed bad input: only PageParseError or a clean result, invariants kept.
    A corpus file may hold several polls separated by '# ---- next poll ----'."""
    raw = path.read_bytes()
    text = raw.decode("utf-8", errors="surrogateescape")
    engine = "auto"
    if text.startswith("# engine: "):
        first, _, text = text.partition("\n")
        engine = first.split(": ", 1)[1].strip()
    pages = text.split("\n# ---- next poll ----\n")
    check_sequence(pages, engine)


def test_corpus_is_not_empty():
    assert len(_corpus_files()) >= 20
