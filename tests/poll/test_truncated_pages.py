"""A cut page is never half a page: the fast path (selective parse, page plan) reaches the
full path's verdict on every recorded vLLM page cut anywhere, on both transports.

The text format says the last line of a page ends with a line feed, so a page that ends
inside a line is one a Prometheus rejects: both parsers reject it (reason="parse"). A page
cut exactly after a line feed is a valid shorter page: both parsers read the same values
from it (the fast path with and without a plan learnt from the page before).
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
from helpers.faultserver import FaultServer, Serve
from helpers.paths import FIXTURES
from helpers.scrape import parse_exposition, select

from specwatch.app import settings as app_settings
from specwatch.app.serve import ServeApp
from specwatch.poll import pageplan, sources
from specwatch.poll.fetch import client as fetch

FIXTURES = FIXTURES / "vllm-0.32-cpu-ngram"
PAGES = sorted(FIXTURES.glob("*.prom"))
#: Random byte offsets and line boundaries per page in the default run (the slow run
#: takes every line boundary of every page).
RANDOM_CUTS = 4
SAMPLED_LINES = 2


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _comparable(page: sources.ParsedPage, buckets: bool) -> tuple:
    """What a poll publishes from a page (bucket series only when they are read)."""
    counters = {k: v for k, v in page.counters.items()
                if buckets or k[1] not in sources.BUCKET_SIGNALS}
    created = {k: v for k, v in page.created.items()
               if buckets or k[1] not in sources.BUCKET_SIGNALS}
    return (page.engine, counters, created, dict(page.gauges), dict(page.configured_k),
            page.process_start_time, page.invalid_models)


def _verdict(text: str, **kw: object) -> tuple | None:
    """None when the page is rejected, else what is read from it."""
    try:
        page = sources.parse_page(text, **kw)  # type: ignore[arg-type]
    except sources.PageParseError:
        return None
    return _comparable(page, bool(kw.get("buckets", True)))


def _cuts(text: str, rng: random.Random, every_line: int) -> list[int]:
    """Offsets to cut ``text`` at: line boundaries (every ``every_line``-th one, or a
    sample of them when 0), the last newline removed, half the page plus a few bytes,
    random bytes."""
    bounds = [i + 1 for i, c in enumerate(text) if c == "\n"]
    bounds = bounds[::every_line] if every_line else rng.sample(bounds, SAMPLED_LINES)
    offsets = {*bounds, len(text) - 1, len(text) // 2 + 15}
    offsets.update(rng.randrange(1, len(text)) for _ in range(RANDOM_CUTS))
    return sorted(offsets)


def _check_cut(text: str, before: str) -> bool:
    """Fast (with and without a plan from ``before``) against full, buckets read or not;
    returns whether the full path accepted the cut page."""
    try:
        oracle: sources.ParsedPage | None = sources.parse_page(text, parser="full")
    except sources.PageParseError:
        oracle = None
    for buckets in (True, False):
        # Without buckets the full path reads the same page minus the bucket series
        # (test_sources checks that); one full parse a cut keeps the run short.
        want = None if oracle is None else _comparable(oracle, buckets)
        assert _verdict(text, parser="fast", buckets=buckets) == want, (len(text), buckets)
        plan = pageplan.PagePlan()
        sources.parse_page(before, buckets=buckets, plan=plan)
        assert plan.key is not None  # the plan was learnt: the cut page meets it
        assert _verdict(text, parser="fast", buckets=buckets, plan=plan) == want, \
            (len(text), buckets, "plan")
    return oracle is not None


def _property(pages: list[Path], every_line: int) -> int:
    rng = random.Random(36)
    cases = 0
    for before, page in itertools.pairwise(pages):
        full, prev = _text(page), _text(before)
        for cut in _cuts(full, rng, every_line):
            text = full[:cut]
            accepted = _check_cut(text, prev)
            # A page ending inside a line is rejected; one ending after a line feed is not.
            assert accepted == text.endswith("\n"), (page.name, cut, repr(text[-40:]))
            cases += 1
    return cases


def test_cut_pages_same_verdict_fast_and_full():
    """One page at every fifth line boundary, every page at sampled cuts (the exhaustive
    run is test_cut_pages_every_line_boundary_every_page, marked slow)."""
    dense = _property(PAGES[20:22], every_line=5)
    sparse = _property(PAGES, every_line=0)
    assert dense + sparse > 450


@pytest.mark.slow
def test_cut_pages_every_line_boundary_every_page():
    """Every page after the first at every line boundary and at random offsets."""
    assert _property(PAGES, every_line=1) > 30000


def test_last_newline_removed_is_rejected_by_both_parsers():
    for page in PAGES:
        text = _text(page)
        assert text.endswith("\n")
        for parser in sources.PARSERS:
            for buckets in (True, False):
                with pytest.raises(sources.PageParseError):
                    sources.parse_page(text[:-1], parser=parser, buckets=buckets)


@pytest.mark.usefixtures("fetch_path")
@pytest.mark.parametrize("parser", sources.PARSERS)
def test_cut_pages_through_each_transport(parser: str):
    """The bodies each transport hands over for cut pages (correct Content-Length) get the
    verdict of the full path on the whole body."""
    rng = random.Random(7)
    text = _text(PAGES[21])
    with FaultServer(Serve(text.encode())) as server:
        target = fetch.PollTarget(name="t", url=server.url)
        session = fetch.new_session(target.url)
        try:
            for cut in _cuts(text, rng, every_line=0):
                cut_text = text[:cut]
                server.set(Serve(cut_text.encode()))
                body = fetch.fetch(session, target)
                assert body == cut_text
                want = _verdict(cut_text, parser="full", buckets=False)
                assert _verdict(body, parser=parser, buckets=False) == want
                assert (want is not None) == cut_text.endswith("\n")
        finally:
            session.close()


@pytest.mark.usefixtures("fetch_path")
@pytest.mark.parametrize("parser", sources.PARSERS)
def test_half_page_cut_mid_line_is_a_failed_poll(tmp_path, parser: str):
    """A real page cut at half plus a few bytes (the last line ends inside its labels),
    served with a correct Content-Length after a good page: the target is down with
    reason="parse" and publishes nothing from half a page; the next whole page is read."""
    pages = [_text(p) for p in PAGES[20:23]]
    half = len(pages[1]) // 2
    cut = pages[1][: pages[1].index("model_name=", half) + len("model_name=")]
    assert len(cut) - half < 120 and "_bucket{" in cut.rsplit("\n", 1)[1]
    with FaultServer(Serve(pages[0].encode())) as server:
        cfg_file = tmp_path / "specwatch.yaml"
        cfg_file.write_text(
            f"global:\n  listen: 127.0.0.1:0\n  parser: {parser}\n"
            f"targets:\n  - {{name: t, url: '{server.url}'}}\n")
        cfg = app_settings.build_config(str(cfg_file), [], None, 5.0)
        app = ServeApp(cfg, clock=lambda: 1_800_000_000.0)
        app.start(poll=False)
        try:
            host, port = app.web.address

            def poll(body: str) -> dict:
                server.set(Serve(body.encode()))
                app.poller.poll_now("t")
                import urllib.request
                with urllib.request.urlopen(f"http://{host}:{port}/metrics",
                                            timeout=10) as resp:
                    return parse_exposition(resp.read().decode())

            first = poll(pages[0])
            assert list(select(first, "specwatch_target_up", target="t").values()) == [1.0]
            during = poll(cut)
            assert list(select(during, "specwatch_target_up", target="t").values()) == [0.0]
            errors = {dict(k[1])["reason"]: v for k, v in select(
                during, "specwatch_target_poll_errors_total", target="t").items()}
            assert errors["parse"] == 1.0 and sum(errors.values()) == 1.0, errors
            after = poll(pages[2])
            assert list(select(after, "specwatch_target_up", target="t").values()) == [1.0]
        finally:
            app.stop()
