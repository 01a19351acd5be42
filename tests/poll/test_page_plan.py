"""A target's page parsed from its plan is the page parsed without one.

Protected behaviour: :func:`specwatch.poll.sources.parse_page` with a
:class:`~specwatch.poll.pageplan.PagePlan` kept across one target's pages returns exactly
the :class:`~specwatch.poll.sources.ParsedPage` that parsing each page alone returns
(counters, created and gauges with their order and value types, configured k, start time,
invalid and truncated counts, engine kind): on the recorded vLLM 0.32 pages in capture order
(a restart included), on the constructed vLLM and SGLang pages, and on generated changes to
a recorded page (values: integers, floats, exponents, signs, NaN, Inf, negative, above
2**53; a changed first line; a line added outside the canonical shape: braced, indented,
a comment declaring a counter; a wanted line dropped or given twice; a changed label; label
values long enough to be cut). And the plan is used: on a steady server every page after
the first is parsed from it, through the pipeline too.
"""

from __future__ import annotations

import re

import pytest
from helpers.paths import FIXTURES
from hypothesis import given, settings
from hypothesis import strategies as st

from specwatch.poll import pageplan, sources
from specwatch.poll.pipeline import Pipeline, PollResult
from specwatch.poll.windows.derive import DeriveConfig

FIXTURES = FIXTURES
REAL = [p.read_text() for p in sorted(
    (FIXTURES / "vllm-0.32-cpu-ngram").glob("snap_*.prom"),
    key=lambda p: int(p.stem.split("_")[1]))]
CONSTRUCTED = {p.name: p.read_text() for p in sorted((FIXTURES / "constructed").glob("*.prom"))}
#: (engine, buckets, max_label_value_bytes) the pipeline may parse with.
SETTINGS = [("auto", False, 256), ("vllm", True, 256), ("auto", True, None), ("auto", False, 40)]


def content(page: sources.ParsedPage) -> dict[str, object]:
    """Every field, dicts as ordered items with each value's type and repr (NaN equal to
    NaN, -0.0 apart from 0.0)."""
    def items(d: object) -> list[tuple[object, type, str]]:
        return [(k, type(v), repr(v)) for k, v in d.items()]  # type: ignore[attr-defined]
    return {"engine": page.engine, "counters": items(page.counters),
            "created": items(page.created), "gauges": items(page.gauges),
            "configured_k": items(page.configured_k),
            "process_start": (type(page.process_start_time), repr(page.process_start_time)),
            "invalid": (page.invalid_series, page.invalid_models),
            "truncated": page.truncated_label_values, "server": page.server}


def alone(text: str, engine: str, buckets: bool, limit: int | None) -> object:
    try:
        return content(sources.parse_page(text, engine, "fast", limit, buckets=buckets))
    except sources.PageParseError as exc:
        return str(exc)


def with_plan(plan: pageplan.PagePlan, text: str, engine: str, buckets: bool,
              limit: int | None) -> object:
    try:
        return content(sources.parse_page(text, engine, "fast", limit, buckets=buckets,
                                          plan=plan))
    except sources.PageParseError as exc:
        return str(exc)


def check_sequence(pages: list[str], engine: str = "auto", buckets: bool = False,
                   limit: int | None = 256) -> pageplan.PagePlan:
    plan = pageplan.PagePlan()
    for text in pages:
        assert with_plan(plan, text, engine, buckets, limit) == alone(text, engine, buckets,
                                                                      limit)
    return plan


@pytest.mark.parametrize(("engine", "buckets", "limit"), SETTINGS)
def test_the_recorded_pages_in_order(engine: str, buckets: bool, limit: int | None) -> None:
    plan = check_sequence(REAL, engine, buckets, limit)
    # Each recorded page has the wanted lines of the one before (the server's restart
    # keeps them): every page after the first is parsed from the plan, so the comparison
    # is not the full path against itself.
    assert plan.hits == len(REAL) - 1


@pytest.mark.parametrize("name", sorted(CONSTRUCTED))
def test_the_constructed_pages_twice_and_changed(name: str) -> None:
    text = CONSTRUCTED[name]
    changed = re.sub(r"(?m)^([a-z][^#\n]* )([0-9]+)(\.0)?$",
                     lambda m: m[1] + str(int(m[2]) + 7) + (m[3] or ""), text)
    for engine, buckets, limit in SETTINGS:
        check_sequence([text, text, changed, text], engine, buckets, limit)


VALUE = st.sampled_from(["0", "7", "12.0", "1e3", "1.5e+02", "+4", "-1", "-0.0", "NaN", "Inf",
                         "+Inf", "-Inf", "9007199254740993", "9007199254740992.0", ".5",
                         "123456789012345678901234567890"])


@st.composite
def changed_pages(draw: st.DrawFn) -> list[str]:
    """A recorded page, then pages each made from the one before by new values and, often,
    one change of its lines (so a plan is learnt from a changed page and used on the next)."""
    lines = REAL[draw(st.integers(0, len(REAL) - 1))].split("\n")
    pages = ["\n".join(lines)]
    for _ in range(draw(st.integers(1, 4))):
        lines = list(lines)
        wanted = [i for i, line in enumerate(lines)
                  if line.startswith(("vllm:", "process_start")) and " " in line]
        for i in draw(st.lists(st.sampled_from(wanted), max_size=5)):
            lines[i] = lines[i].rsplit(" ", 1)[0] + " " + draw(VALUE)
        change = draw(st.sampled_from(["none"] * 10 + ["first_comment", "first_sample",
                                       "braced", "indented", "counter_type", "odd_value",
                                       "drop", "twice", "label", "long"]))
        i = draw(st.sampled_from(wanted))
        if change == "first_comment":
            lines[0] = "# HELP something else"
        elif change == "first_sample":
            lines[0] = 'vllm:num_requests_running{model_name="first"} 4'
        elif change == "braced":
            lines.insert(i, '{__name__="vllm:num_requests_running",model_name="m"} 3')
        elif change == "indented":
            lines[i] = "  " + lines[i]
        elif change == "counter_type":
            lines.insert(i, "# TYPE vllm:num_requests_running counter")
        elif change == "odd_value":  # outside the canonical shape, read by the parser
            lines[i] = lines[i].rsplit(" ", 1)[0] + " 1_0"
        elif change == "drop":
            del lines[i]
        elif change == "twice":
            lines.insert(i, lines[i])
        elif change == "label":
            lines[i] = lines[i].replace('model_name="', 'model_name="x', 1)
        elif change == "long":
            lines[i] = lines[i].replace('model_name="', 'model_name="' + "m" * 300, 1)
        pages.append("\n".join(lines))
    return pages


@settings(max_examples=300, deadline=None)
@given(changed_pages(), st.sampled_from(SETTINGS))
def test_generated_changes(pages: list[str], setting: tuple[str, bool, int | None]) -> None:
    check_sequence(pages, *setting)


def test_a_steady_target_is_parsed_from_its_plan_through_the_pipeline() -> None:
    """Every poll of a server whose page changed only in its values, after the first, is
    parsed from the target's plan; a changed line set (the restart's page) is not."""
    pipe = Pipeline([("a", "vllm")], DeriveConfig(), poll_interval=5.0)
    steady = REAL[20:26]
    for k, text in enumerate(steady):
        pipe.apply(PollResult("a", 100.0 + k, 100.0 + k, 0.01, body=text, monotonic=5.0 * k))
    plan = pipe._states["a"].page_plan
    assert plan.hits == len(steady) - 1


def test_a_counter_series_given_twice_is_judged_on_every_page() -> None:
    """The same counter series twice with equal values is valid; with different values its
    model is invalid. A page with such a pair never becomes a plan, so the next page, where
    the two values part, is judged as it would be alone."""
    lines = REAL[30].split("\n")
    i = next(k for k, line in enumerate(lines)
             if line.startswith("vllm:spec_decode_num_drafts_total"))
    twice = [*lines[:i + 1], lines[i], *lines[i + 1:]]
    parted = list(twice)
    parted[i + 1] = parted[i + 1].rsplit(" ", 1)[0] + " 1.0"
    plan = check_sequence(["\n".join(twice), "\n".join(parted)])
    assert plan.hits == 0
    assert sources.parse_page("\n".join(parted), plan=pageplan.PagePlan()).invalid_models


@pytest.mark.parametrize("value", ["NaN", "Inf", "-Inf", "-1", "1e300", "+7"])
@pytest.mark.parametrize("family", ["vllm:num_requests_running", "vllm:prompt_tokens_created",
                                    "vllm:spec_decode_num_drafts_total",
                                    "process_start_time_seconds"])
def test_odd_values_on_a_steady_page(family: str, value: str) -> None:
    """A gauge, created, counter or start-time value that the rules skip, refuse or keep
    as an int, on a page the plan reads: the same page as alone."""
    lines = REAL[30].split("\n")
    i = next(k for k, line in enumerate(lines) if line.startswith(family))
    odd = list(lines)
    odd[i] = odd[i].rsplit(" ", 1)[0] + " " + value
    check_sequence([REAL[30], "\n".join(odd), REAL[30]])


def test_a_plan_keeps_bounded_text(monkeypatch) -> None:
    """Heads holding more text than PLAN_MAX_HEAD_BYTES are not kept: the next page is
    parsed alone, with the same result (a target cannot make the plan hold its
    page)."""
    monkeypatch.setattr(pageplan, "PLAN_MAX_HEAD_BYTES", 2000)
    plan = check_sequence([REAL[30], REAL[31]])
    assert plan.hits == 0 and plan.heads == []
    monkeypatch.setattr(pageplan, "PLAN_MAX_HEAD_BYTES", 1 << 20)
    assert check_sequence([REAL[30], REAL[31]]).hits == 1
