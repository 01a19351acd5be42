"""OpenMetrics ``# EOF`` ends the page: nothing after it is read.

Protects: a recorded vLLM 0.32 page followed by ``# EOF`` and a second engine's speculative
decoding counters reads exactly as the page alone, with the fast parser (with and without a
page plan) and the full parser; through the real exporter its ``sd_acceptance_rate`` is the
page's own. ``# EOF`` is a line of its own: the text inside a HELP line or a label value does
not end the page. A page whose last line is ``# EOF`` without a line feed is whole (OpenMetrics
ends there), and what follows ``# EOF`` may even be cut mid-line without failing the poll.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.pageserver import Page, PageSequenceServer
from helpers.paths import FIXTURES
from helpers.scrape import fetch_text, parse_exposition, select

from specwatch.app import settings as app_settings
from specwatch.app.serve import ServeApp
from specwatch.poll import pageplan, sources

REAL = sorted((FIXTURES / "vllm-0.32-cpu-ngram").glob("snap_*.prom"),
              key=lambda p: int(p.stem.split("_")[1]))
FIRST, LAST = REAL[0].read_text(), REAL[18].read_text()


def _second_engine(page: str) -> str:
    """The page's speculative-decoding counters as engine 1, accepting nothing."""
    lines = [ln.replace('engine="0"', 'engine="1"') for ln in page.splitlines()
             if ln.startswith("vllm:spec_decode_num_")]
    lines = [re.sub(r"(accepted_tokens(?:_per_pos)?_total\{[^}]*\}) \S+", r"\1 0.0", ln)
             for ln in lines]
    return "\n".join(lines) + "\n"


def _after_eof(page: str, tail: str) -> str:
    return page + "# EOF\n" + tail


def _comparable(page: sources.ParsedPage) -> tuple:
    return (page.engine, dict(page.counters), dict(page.created), dict(page.gauges),
            dict(page.configured_k), page.process_start_time, page.invalid_series,
            page.server)


@pytest.mark.parametrize("tail", [
    "engine",  # a second engine after EOF
    "cut",  # the same, cut inside its last line
    "garbage",  # not a page at all
])
def test_nothing_after_eof_is_read(tail: str) -> None:
    extra = {"engine": _second_engine(LAST), "cut": _second_engine(LAST)[:-20],
             "garbage": "}}} not a sample {{{\n"}[tail]
    text = _after_eof(LAST, extra)
    want = _comparable(sources.parse_page(LAST, parser="full"))
    assert _comparable(sources.parse_page(text, parser="full")) == want
    assert _comparable(sources.parse_page(text, parser="fast")) == want
    plan = pageplan.PagePlan()
    sources.parse_page(_after_eof(FIRST, extra), plan=plan)
    assert _comparable(sources.parse_page(text, plan=plan)) == want
    # The plan learnt from a page with EOF reads the next page with EOF.
    assert _comparable(sources.parse_page(text, plan=plan)) == want


@pytest.mark.parametrize("parser", sources.PARSERS)
def test_eof_without_a_line_feed_ends_a_whole_page(parser: str) -> None:
    assert (_comparable(sources.parse_page(LAST + "# EOF", parser=parser))
            == _comparable(sources.parse_page(LAST, parser=parser)))


@pytest.mark.parametrize("parser", sources.PARSERS)
def test_eof_inside_a_line_does_not_end_the_page(parser: str) -> None:
    """Only a line that is exactly ``# EOF`` ends the page."""
    tail = _second_engine(LAST)
    for text in (LAST + "# HELP vllm:x text # EOF\n" + tail,
                 LAST + "# EOFX\n" + tail, LAST + " # EOF\n" + tail):
        page = sources.parse_page(text, parser=parser)
        assert ("tiny-llama", "drafts", (("engine", "1"),)) in page.counters, text[-300:]


class Clock:
    t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def _acceptance(tmp_path: Path, pages: list[str]) -> dict:
    """sd_acceptance_rate of target `a` after polling `pages` 300 s apart."""
    with PageSequenceServer([Page(p) for p in pages]) as server:
        (tmp_path / "specwatch.yaml").write_text(
            f"global:\n  poll_interval: 5\ntargets:\n  - name: a\n    url: {server.url}\n")
        cfg = app_settings.build_config(str(tmp_path / "specwatch.yaml"), [], "127.0.0.1:0", None)
        clock = Clock()
        app = ServeApp(cfg, clock=clock)
        app.start(poll=False)
        try:
            for i in range(len(pages)):
                server.set_step(i)
                clock.t = 1_000_000.0 + 300.0 * i
                app.poller.poll_now("a")
            host, port = app.web.address
            series = parse_exposition(fetch_text(f"http://{host}:{port}/metrics"))
            return select(series, "sd_acceptance_rate", target="a", window="5m")
        finally:
            app.stop()


def test_a_second_engine_after_eof_leaves_the_acceptance_rate_alone(tmp_path: Path) -> None:
    alone = _acceptance(tmp_path, [FIRST, LAST])
    assert alone and all(0 < v < 1 for v in alone.values())
    # The premise: the second engine changes the rate when it is part of the page.
    inside = _acceptance(tmp_path, [FIRST + _second_engine(FIRST), LAST + _second_engine(LAST)])
    assert inside != alone
    after = _acceptance(tmp_path, [_after_eof(FIRST, _second_engine(FIRST)),
                                   _after_eof(LAST, _second_engine(LAST))])
    assert after == alone


@pytest.mark.parametrize("text", [
    "# EOF\n" + LAST,  # an empty page
    LAST + "# EOF\r\n" + _second_engine(LAST),  # a CRLF line end
    LAST.replace("\n", "\n# EOF\n", 1) + _second_engine(LAST),  # after the first line
    LAST + "# EOF\r" + _second_engine(LAST),  # a carriage return inside a line: not EOF
])
def test_fast_and_full_parsers_agree_on_where_the_page_ends(text: str) -> None:
    want = _comparable(sources.parse_page(text, parser="full"))
    assert _comparable(sources.parse_page(text, parser="fast")) == want
    plan = pageplan.PagePlan()
    sources.parse_page(text, plan=plan)
    assert _comparable(sources.parse_page(text, plan=plan)) == want
