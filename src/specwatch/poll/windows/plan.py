"""What a window reads: the keys present in a model's newest entry and the plan of indices
and branches the window formulas take on them.

Which branches the formulas (:mod:`specwatch.poll.windows.derive`) take depends only on the keys
present in the window's newest entry: the same for every window of a model, and for as long
as no key appears or vanishes. So they are decided once here, and a window's increases are a
list (a *row*) read at the plan's indices instead of a dictionary of every counter.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass

from specwatch.poll import sources
from specwatch.poll.signals import MEAN_GENERATION_TOKENS, MEAN_PROMPT_TOKENS

#: Window histograms kept in WindowSignals.histograms: name -> canonical bucket signal.
LATENCY_HISTOGRAMS: dict[str, str] = {
    "e2e_latency_seconds": sources.E2E_LATENCY_BUCKET,
    "ttft_seconds": sources.TTFT_BUCKET,
    "inter_token_latency_seconds": sources.ITL_BUCKET,
}


@functools.lru_cache(maxsize=4096)
def bucket_bound(le: str) -> float:
    """The upper bound a bucket's ``le`` label spells (+Inf for one that is not a number)."""
    try:
        return float(le)
    except ValueError:
        return math.inf


def _position_order(p: str) -> tuple[int, str]:
    try:
        return (int(p), p)
    except ValueError:
        return (1 << 30, p)


def _has(keys: Container[tuple[str, str | None]], signal: str) -> bool:
    return (signal, None) in keys


@dataclass(frozen=True)
class Present:
    """What the newest entry of a window holds: the keys present and what is sorted from
    them (the same for every window of a model at one poll, so computed once)."""

    keys: Mapping[tuple[str, str | None], None]
    signals: frozenset[str]
    positions: tuple[str, ...]  # accepted-per-position positions, in position order
    buckets: Mapping[str, tuple[tuple[float, tuple[str, str]], ...]]  # by bound

    @classmethod
    def of(cls, keys: Iterable[tuple[str, str | None]]) -> Present:
        present = dict.fromkeys(keys)
        signals = frozenset(s for s, _ in present)
        positions = tuple(sorted((p for (s, p) in present
                                  if s == sources.ACCEPTED_PER_POSITION and p is not None),
                                 key=_position_order))
        buckets: dict[str, tuple[tuple[float, tuple[str, str]], ...]] = {}
        for sig in LATENCY_HISTOGRAMS.values():
            les = [le for (s, le) in present if s == sig and le is not None]
            if les:
                buckets[sig] = tuple((bound, (sig, le))
                                     for bound, le in sorted((bucket_bound(le), le)
                                                             for le in les))
        return cls(present, signals, positions, buckets)


#: The counters without position or bound that a window reads, in the order of a plan's
#: first indices.
_READ: tuple[str, ...] = (
    sources.DRAFT_TOKENS, sources.ACCEPTED_TOKENS, sources.DRAFTS, sources.VERIFY_CALLS,
    sources.GENERATION_TOKENS, sources.REQUESTS_FINISHED, sources.E2E_LATENCY_COUNT,
    sources.E2E_LATENCY_SUM, sources.PROMPT_LEN_COUNT, sources.PROMPT_LEN_SUM,
    sources.PROMPT_TOKENS, sources.GENERATION_LEN_COUNT, sources.GENERATION_LEN_SUM)


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """What a window reads, decided once per set of present keys.

    ``keys`` are the counters of the row, in order; index -1 reads the 0.0 appended to
    every row (a counter the history has no column for never increased).
    """

    keys: tuple[tuple[str, str | None], ...]
    sd: bool  # drafts counted: draft tokens or verify calls
    by_tokens: bool  # draft and accepted tokens present: acceptance from token counters
    by_verify: bool  # otherwise verify calls present: acceptance from verify calls
    has_drafts: bool
    has_requests: bool
    tok: int
    acc: int
    drafts: int
    verify: int
    gen: int
    req: int
    lat_count: int
    lat_sum: int
    volume: int | None  # the window's draft volume (WindowSignals.drafts); None: 0.0
    positions: tuple[tuple[str, int], ...]  # accepted per position, in position order
    #: (mean name, index of the count or None, index of the sum; or, for pages with verify
    #: calls and without the per-request histograms, None and the token counter's index).
    means: tuple[tuple[str, int | None, int], ...]
    buckets: tuple[tuple[str, tuple[tuple[float, int], ...]], ...]  # by histogram name

    @classmethod
    def of(cls, present: Present, histograms: bool,
           available: Container[tuple[str, str | None]] | None = None) -> WindowPlan:
        """The plan for ``present``; ``available``: the keys that can have increased (all
        when None), the others read 0.0 without a place in the row."""
        keys: dict[tuple[str, str | None], int] = {}

        def at(key: tuple[str, str | None]) -> int:
            if available is not None and key not in available:
                return -1
            return keys.setdefault(key, len(keys))

        c = present.keys
        i = {sig: at((sig, None)) for sig in _READ}
        by_tokens = _has(c, sources.DRAFT_TOKENS) and _has(c, sources.ACCEPTED_TOKENS)
        volume = next((i[sig] for sig in (sources.DRAFTS, sources.VERIFY_CALLS,
                                           sources.DRAFT_TOKENS) if _has(c, sig)), None)
        means: list[tuple[str, int | None, int]] = []
        for mean_name, s_sum, s_count, fallback in (
            (MEAN_PROMPT_TOKENS, sources.PROMPT_LEN_SUM, sources.PROMPT_LEN_COUNT,
             sources.PROMPT_TOKENS),
            (MEAN_GENERATION_TOKENS, sources.GENERATION_LEN_SUM, sources.GENERATION_LEN_COUNT,
             sources.GENERATION_TOKENS),
        ):
            if _has(c, s_count):
                means.append((mean_name, i[s_count], i[s_sum]))
            elif sources.VERIFY_CALLS in present.signals and _has(c, fallback):
                means.append((mean_name, None, i[fallback]))
        positions = tuple((p, at((sources.ACCEPTED_PER_POSITION, p)))
                          for p in present.positions)
        buckets = tuple((name, tuple((bound, at(key)) for bound, key in
                                     present.buckets[sig]))
                        for name, sig in LATENCY_HISTOGRAMS.items()
                        if histograms and sig in present.buckets)
        return cls(
            keys=tuple(keys), sd=_has(c, sources.DRAFT_TOKENS) or _has(c, sources.VERIFY_CALLS),
            by_tokens=by_tokens, by_verify=not by_tokens and _has(c, sources.VERIFY_CALLS),
            has_drafts=_has(c, sources.DRAFTS),
            has_requests=_has(c, sources.REQUESTS_FINISHED),
            tok=i[sources.DRAFT_TOKENS], acc=i[sources.ACCEPTED_TOKENS],
            drafts=i[sources.DRAFTS], verify=i[sources.VERIFY_CALLS],
            gen=i[sources.GENERATION_TOKENS], req=i[sources.REQUESTS_FINISHED],
            lat_count=i[sources.E2E_LATENCY_COUNT], lat_sum=i[sources.E2E_LATENCY_SUM],
            volume=volume, positions=positions, means=tuple(means), buckets=buckets)
