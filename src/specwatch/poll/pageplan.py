"""What :func:`specwatch.poll.sources.parse_page` learned from a target's last page, to
parse a steady server's next page from it (the same wanted lines in the same order, only
their values changed).

Invariant: a page parsed from the plan equals the page parsed without it
(``tests/poll/test_page_plan.py``).
"""

from __future__ import annotations

import math

from specwatch.poll.fastparse import SampleSelector, parse_value
from specwatch.poll.sources import (
    COUNTER_SAMPLE,
    CREATED_SAMPLE,
    INFO_SAMPLE,
    MAX_COUNTER_VALUE,
    PROCESS_START_SAMPLE,
    ParsedPage,
    SeriesKey,
    assemble_page,
)

#: Most text a target's plan keeps in its heads (name and labels of each wanted line, as
#: written): a vLLM page of 60 models on 4 engines holds about a quarter of it.
PLAN_MAX_HEAD_BYTES = 1 << 20


class PagePlan:
    """What :func:`parse_page` learned from a target's last page: a steady server's next
    page has the same wanted lines in the same order, only their values change.

    Why: the selective parse spends about a third of its CPU on Python work per
    wanted line (the finder's groups, the label set, what the sample is, its checks), the
    same every poll for the same lines. With a plan, :meth:`parse` runs the finder and
    compares the lines' heads (name and label set as written) with the plan's at C speed;
    when they are the same, the values go straight to the keys the plan holds.

    Same result as without a plan, always: a plan is learnt only from a page whose first
    line is a comment and whose every wanted line has the canonical shape (no line read
    by the full parser, none examined alone), with no invalid counter and no counter series
    twice; and it is used only for a page with the same first line and exactly the same
    heads, in order, every one with a canonical value. Then the finder gives the same
    samples except for their values (the heads fix names and labels, so what each sample
    is and every label-value cut), and the values get the same rules: a counter outside
    [0, ``MAX_COUNTER_VALUE``] (or NaN) sends the page to the full path, which marks the
    series invalid; created and gauge values are kept only when finite.
    ``tests/poll/test_page_plan.py`` compares the two paths on recorded pages and on
    generated changes.

    One per target (not shared between threads: a target's polls are serialized). Its
    memory is bounded whatever a target sends: a page whose wanted heads hold
    more than :data:`PLAN_MAX_HEAD_BYTES` of text is parsed without a plan.
    """

    __slots__ = ("counter_idx", "counter_keys", "first", "heads", "hits", "key", "others",
                 "positions", "truncated")

    def __init__(self) -> None:
        self.key: tuple[str, bool, int | None] | None = None
        self.first = ""
        self.heads: list[str] = []
        self.counter_idx: list[int] = []
        self.counter_keys: list[SeriesKey] = []
        self.others: list[tuple[int, int, SeriesKey]] = []
        self.positions: dict[str, set[str]] = {}
        self.truncated = 0
        #: Pages parsed from the plan (for tests and benchmarks).
        self.hits = 0

    def learn(self, key: tuple[str, bool, int | None], text: str, heads: list[str],
              rows: list[tuple[int, SeriesKey]], positions: dict[str, set[str]],
              truncated: int) -> None:
        """Remember this page when it allows a plan (see the class docstring)."""
        end = text.find("\n")
        first = text[:end]
        if end < 0 or not first.strip().startswith("#") or not heads \
                or sum(map(len, heads)) > PLAN_MAX_HEAD_BYTES:
            return
        counter_idx = [i for i, (what, _) in enumerate(rows) if what == COUNTER_SAMPLE]
        counter_keys = [rows[i][1] for i in counter_idx]
        if len(set(counter_keys)) != len(counter_keys):
            return
        self.first, self.heads, self.positions, self.truncated = first, heads, positions, \
            truncated
        self.counter_idx, self.counter_keys = counter_idx, counter_keys
        self.others = [(i, what, k) for i, (what, k) in enumerate(rows) if what != COUNTER_SAMPLE]
        self.key = key

    def parse(self, text: str, selector: SampleSelector) -> ParsedPage | None:
        """The page, when its wanted lines are the plan's; None otherwise."""
        end = text.find("\n")
        if end < 0 or text[:end] != self.first:
            return None
        found = selector.lines(text)
        if len(found) != len(self.heads) or [f[1] for f in found] != self.heads:
            return None
        texts = [f[4] for f in found]
        if "" in texts:  # a wanted line outside the canonical shape
            return None
        # fastparse._value, the parser's int-or-float, inlined (a call a line costs more).
        values = [int(v) if v.isdigit() else parse_value(v) if v[0] in "+-" else float(v)
                  for v in texts]
        counts = [values[i] for i in self.counter_idx]
        for v in counts:
            if not 0 <= v <= MAX_COUNTER_VALUE:
                return None
        created: dict[SeriesKey, float] = {}
        gauge_series: dict[SeriesKey, float] = {}
        infos: dict[SeriesKey, float] = {}
        process_start = None
        isfinite = math.isfinite
        for i, what, k in self.others:
            v = values[i]
            if what == PROCESS_START_SAMPLE:
                process_start = v
            elif what == INFO_SAMPLE:
                if isfinite(v):
                    infos[k] = v
            elif what == CREATED_SAMPLE:
                if isfinite(v):
                    created[k] = v
            elif isfinite(v):
                gauge_series[k] = v
        self.hits += 1

        def saw(prefix: str) -> bool:  # Selection.saw with no line examined alone
            return text.startswith(prefix) or f"\n{prefix}" in text

        return assemble_page(dict(zip(self.counter_keys, counts, strict=True)), created,
                             gauge_series, self.positions, process_start, set(),
                             self.truncated, saw, infos)
