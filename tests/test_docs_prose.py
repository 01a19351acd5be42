"""Words for people: no sentence in the prose of README.md, runbook.md, deploy/README.md and
docs/*.md runs over 300 characters (about three lines of the wrapped source).

What counts as prose, and where a sentence ends:

- fenced code blocks, blocks indented by four spaces, table rows and lines that open an HTML
  comment are not prose;
- a blank line, a heading and a list item each start a new paragraph (a list's items are
  separate statements even when they end without a full stop);
- inside a paragraph a sentence ends at `.`, `!` or `?` followed by white space and an
  upper-case letter, a backtick, a parenthesis, an asterisk or a bracket.

docs/cli.md, the metric table of docs/metrics.md and docs/deployment.md are generated (from
the argparse help texts, `specwatch.expose.metricdefs` and deploy/README.md): a long sentence
there is split in its source.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 300

#: Pages not checked yet, with the reason. Each still holds long sentences (the last test
#: says so): when one no longer does, it leaves this list.
NOT_YET_CHECKED: dict[str, str] = {}

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(*\[])")
_LIST_ITEM = re.compile(r"^\s{0,3}(?:[-*+]|\d+[.)])\s+")


def _pages() -> list[Path]:
    pages = [ROOT / "README.md", ROOT / "runbook.md", ROOT / "deploy" / "README.md"]
    pages += sorted(p for p in (ROOT / "docs").glob("*.md") if not p.is_symlink())
    return [p for p in pages if str(p.relative_to(ROOT)) not in NOT_YET_CHECKED]


def _paragraphs(text: str) -> list[tuple[list[tuple[int, int]], str]]:
    """Each prose paragraph: (line number, offset in the joined text) of each of its lines,
    and the joined text."""
    out: list[tuple[list[tuple[int, int]], str]] = []
    starts: list[tuple[int, int]] = []
    parts: list[str] = []
    in_code = False

    def close() -> None:
        if parts:
            out.append((list(starts), " ".join(parts)))
            starts.clear()
            parts.clear()

    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            in_code = not in_code
            close()
            continue
        if in_code or not line.strip() or line.startswith(("    ", "|", "<!--")):
            close()
            continue
        if line.startswith("#") or _LIST_ITEM.match(line):
            close()
        starts.append((number, sum(len(p) + 1 for p in parts)))
        parts.append(line.strip())
    close()
    return out


def long_sentences(text: str, limit: int = LIMIT) -> list[tuple[int, str]]:
    """(line it starts on, sentence) for each sentence over `limit` characters."""
    found: list[tuple[int, str]] = []
    for starts, paragraph in _paragraphs(text):
        at = 0
        for sentence in _SENTENCE_END.split(paragraph):
            at = paragraph.index(sentence, at)
            if len(sentence) > limit:
                found.append((max(n for n, offset in starts if offset <= at), sentence))
            at += len(sentence)
    return found


def test_the_splitter_counts_prose_only_and_ends_sentences_where_a_reader_does() -> None:
    long = "word " * 70
    text = "\n".join([
        "# Title", "", f"First. Then {long}.", "", "```", long, "```", "", f"    {long}",
        f"| {long} |", f"<!-- {long} -->", "", f"- {long[:200]}", f"- {long[:200]}", "",
        f"A {long[:150]}. B {long[:150]}.", f"Wrapped {long[:150]}", f"over lines {long[:150]}.",
    ])
    found = long_sentences(text)
    assert [line for line, _ in found] == [3, 17], found
    assert found[0][1].startswith("Then") and found[1][1].startswith("Wrapped")
    assert found[1][1].endswith("word .") and len(found[1][1]) > LIMIT


def test_no_sentence_runs_over_three_lines() -> None:
    found = [f"{page.relative_to(ROOT)}:{line}: {len(sentence)} characters: "
             f"{sentence[:100]}..."
             for page in _pages()
             for line, sentence in long_sentences(page.read_text(encoding="utf-8"))]
    assert not found, (f"{len(found)} sentence(s) over {LIMIT} characters; split them:\n"
                       + "\n".join(found))


def test_pages_not_yet_checked_are_listed_for_a_reason() -> None:
    for name, reason in NOT_YET_CHECKED.items():
        page = ROOT / name
        assert page.is_file(), f"{name} is gone: drop it from NOT_YET_CHECKED"
        assert reason
        assert long_sentences(page.read_text(encoding="utf-8")), (
            f"{name} has no sentence over {LIMIT} characters now: drop it from "
            "NOT_YET_CHECKED so that it stays that way")
