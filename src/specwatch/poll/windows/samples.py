"""The per-poll acceptance-rate sample: the acceptance rate of one poll interval, from the
aggregated counters at its two ends.

Owns which counters the sample reads and when it is taken: at least ``min_drafts`` drafts
or verify calls in the interval, else no sample. The history takes one per
poll (:mod:`specwatch.poll.windows.history`); the windows' bimodality coefficient reads them.
"""

from __future__ import annotations

from collections.abc import Container, Mapping

from specwatch.poll import sources
from specwatch.poll.formulas import (
    acceptance_rate,
    verify_acceptance_length,
    verify_acceptance_rate,
)

#: Aggregated counters by (canonical signal, position or bucket bound or None).
Counters = Mapping[tuple[str, str | None], float]

#: The counters the interval acceptance rate reads (all without position).
SAMPLE_KEYS: tuple[tuple[str, str | None], ...] = tuple((s, None) for s in (
    sources.DRAFTS, sources.DRAFT_TOKENS, sources.ACCEPTED_TOKENS, sources.VERIFY_CALLS,
    sources.GENERATION_TOKENS, sources.REQUESTS_FINISHED))


def delta(base: Counters, cur: Counters, key: tuple[str, str | None]) -> float:
    """Increase of one aggregated counter; a key missing from ``base`` started at 0 later."""
    return max(0.0, cur.get(key, 0.0) - base.get(key, 0.0))


def _has(cur: Counters, signal: str) -> bool:
    return (signal, None) in cur


def interval_acceptance_rate(base: Counters, cur: Counters, min_drafts: float,
                             proposed_per_verify: float | None = None) -> float | None:
    """Acceptance rate over one poll interval, or None with fewer than ``min_drafts`` drafts.

    Token counters: accepted / proposed draft tokens (without a drafts counter, proposed
    draft tokens stand in for the threshold). Verify calls: (E − 1) / proposed-per-verify.
    """
    if _has(cur, sources.DRAFT_TOKENS) and _has(cur, sources.ACCEPTED_TOKENS):
        d_tok = delta(base, cur, (sources.DRAFT_TOKENS, None))
        volume = delta(base, cur, (sources.DRAFTS, None)) if _has(cur, sources.DRAFTS) \
            else d_tok
        if volume < min_drafts or d_tok <= 0:
            return None
        return acceptance_rate(delta(base, cur, (sources.ACCEPTED_TOKENS, None)), d_tok)
    if _has(cur, sources.VERIFY_CALLS) and proposed_per_verify:
        d_verify = delta(base, cur, (sources.VERIFY_CALLS, None))
        if d_verify < min_drafts:
            return None
        e = verify_acceptance_length(delta(base, cur, (sources.GENERATION_TOKENS, None)),
                                     delta(base, cur, (sources.REQUESTS_FINISHED, None)),
                                     d_verify)
        return None if e is None else verify_acceptance_rate(e, proposed_per_verify)
    return None


def interval_sample_reads(cur: Container[tuple[str, str | None]]
                          ) -> tuple[tuple[str, str | None], ...]:
    """The counters :func:`interval_acceptance_rate` reads when the newer end has the keys
    ``cur`` (a sample with one of them unknown is not taken)."""
    if (sources.DRAFT_TOKENS, None) in cur and (sources.ACCEPTED_TOKENS, None) in cur:
        sigs = (sources.DRAFT_TOKENS, sources.ACCEPTED_TOKENS, sources.DRAFTS)
    else:
        sigs = (sources.VERIFY_CALLS, sources.GENERATION_TOKENS, sources.REQUESTS_FINISHED)
    return tuple((s, None) for s in sigs)
