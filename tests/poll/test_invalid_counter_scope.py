"""An invalid counter invalidates only the signals that read it.

A real vLLM 0.32 recording is polled in order twice through what the pipeline runs on every
poll (parse, history, derive): once as recorded, once with every sample of one counter
family made NaN on one page. On that page and after it, the model stays; each signal that
does not read the family has the value it has on the unmodified sequence; a signal that
reads it has the value of the same sequence with the bad poll failed (a bad sample is a
missed sample: at the bad poll, the poll before's), never a different (biased) value;
windows that start after it are all back, exact. One case
per family the exporter reads, histograms included (one with an unknown bucket is left out).
SGLang (the constructed 0.5 page, grown poll by poll): NaN in the verify calls, or in one of
the two series summed into the generation tokens, changes only what reads them (to the
value of the poll before, as a failed poll would).
"""

from __future__ import annotations

import math
import re

import pytest
from helpers.paths import FIXTURES

from specwatch.engines import registry
from specwatch.poll import sources
from specwatch.poll.windows import derive, history
from specwatch.poll.windows.plan import LATENCY_HISTOGRAMS

RECORDING = FIXTURES / "vllm-0.32-cpu-ngram"
BAD = 20  # the page (poll index) that carries the invalid family
CFG = derive.DeriveConfig(windows=(("10s", 10.0), ("1m", 60.0)), count_window=20,
                          min_drafts_per_sample=5.0)

S = sources
#: Canonical counters each derived signal reads (the specification under test).
READS: dict[str, frozenset[str]] = {
    derive.ACCEPTANCE_RATE: frozenset({S.DRAFT_TOKENS, S.ACCEPTED_TOKENS}),
    derive.DRAFT_LENGTH: frozenset({S.DRAFT_TOKENS, S.DRAFTS}),
    derive.ACCEPTANCE_LENGTH: frozenset({S.DRAFT_TOKENS, S.ACCEPTED_TOKENS, S.DRAFTS}),
    derive.TOKEN_ACCEPTANCE_PROBABILITY: frozenset({S.DRAFT_TOKENS, S.ACCEPTED_TOKENS,
                                                    S.DRAFTS}),
    derive.ACCEPTANCE_HETEROGENEITY: frozenset({S.DRAFTS, S.ACCEPTED_PER_POSITION}),
    derive.ARRIVAL_RATE: frozenset({S.REQUESTS_FINISHED}),
    derive.MEAN_LATENCY_SECONDS: frozenset({S.E2E_LATENCY_SUM, S.E2E_LATENCY_COUNT}),
    derive.EFFECTIVE_BATCH_SIZE: frozenset({S.REQUESTS_FINISHED, S.E2E_LATENCY_SUM,
                                            S.E2E_LATENCY_COUNT}),
    derive.MEAN_PROMPT_TOKENS: frozenset({S.PROMPT_LEN_SUM, S.PROMPT_LEN_COUNT}),
    derive.MEAN_GENERATION_TOKENS: frozenset({S.GENERATION_LEN_SUM, S.GENERATION_LEN_COUNT}),
}
#: Read through the per-poll acceptance samples: a poll whose sample reads an invalid counter
#: (the bad one and the one after it) has none, so the coefficient is that of the samples
#: taken, compared only where no sample is missing.
SAMPLE_READS = frozenset({S.DRAFT_TOKENS, S.ACCEPTED_TOKENS, S.DRAFTS})
READS[derive.BIMODALITY_COEFFICIENT] = SAMPLE_READS
POSITION_READS = frozenset({S.DRAFTS, S.ACCEPTED_PER_POSITION})
#: The count window's base is found from the finished requests.
COUNT_WINDOW_READS = frozenset({S.REQUESTS_FINISHED})

#: Each counter family the exporter reads on a vLLM v1 page (source sample name).
V1_COUNTERS = registry.by_kind("vllm").counters
FAMILIES = sorted(V1_COUNTERS)


def pages() -> list[tuple[float, str]]:
    files = sorted(RECORDING.glob("snap_*.prom"))
    t0 = int(files[0].stem.split("_")[1])
    return [((int(f.stem.split("_")[1]) - t0) / 1000.0, f.read_text()) for f in files]


def with_nan(text: str, family: str) -> str:
    """Every sample of ``family`` on the page made NaN (the rest as recorded)."""
    pattern = re.compile(rf"^({re.escape(family)}(?:\{{[^}}]*\}})?) \S+$", re.MULTILINE)
    out, n = pattern.subn(r"\1 NaN", text)
    assert n, family
    return out


def run(seq: list[tuple[float, str]]) -> list[dict]:
    """The derived model of each poll: {window label: (values, positions, histograms)},
    or None."""
    hist = history.TargetHistory(3600.0, 2000, CFG.min_drafts_per_sample)
    out: list[dict] = []
    for t, text in seq:
        page = sources.parse_page(text)
        hist.update(page, t)
        snaps = derive.derive_models(
            [hist.models[m] for m in sorted(hist.present_models)], CFG, page.engine)
        models = dict(snaps)
        assert len(models) <= 1
        snap = next(iter(models.values()), None)
        out.append(None if snap is None else {
            w.window: (dict(w.values), {k: dict(v) for k, v in w.positions.items()},
                       dict(w.histograms))
            for w in snap.windows})
    return out


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
def test_nan_in_one_family_keeps_the_signals_that_do_not_read_it(family):
    seq = pages()
    bad_sig = V1_COUNTERS[family]
    bad_histogram = next((name for name, sig in LATENCY_HISTOGRAMS.items()
                          if sig == bad_sig), None)
    if bad_sig in S.BUCKET_SIGNALS:
        bad_sig = {S.E2E_LATENCY_BUCKET: S.E2E_LATENCY_SUM,  # a bucket: no window reads it
                   S.TTFT_BUCKET: S.TTFT_SUM, S.ITL_BUCKET: S.TTFT_SUM}[bad_sig]
        reads_bad = frozenset()
    else:
        reads_bad = frozenset({bad_sig})
    want = run(seq)
    bad_seq = list(seq)
    bad_seq[BAD] = (seq[BAD][0], with_nan(seq[BAD][1], family))
    got = run(bad_seq)
    # What a failed poll in place of the bad one gives (at the bad poll: the poll before).
    failed = run(seq[:BAD] + seq[BAD + 1:])
    assert got[:BAD] == want[:BAD]
    checked = 0
    for i in range(BAD, len(seq)):
        assert got[i] is not None, f"poll {i}: the model lost every series"
        oracle = failed[i - 1]
        for label, (values, positions, histograms) in want[i].items():
            if label == CFG.count_window_label and COUNT_WINDOW_READS & reads_bad \
                    and label not in got[i]:
                continue  # its base is not known
            assert label in got[i], (i, label)
            got_values, got_positions, got_histograms = got[i][label]
            o_values, o_positions, o_histograms = oracle.get(label, ({}, {}, {}))
            # A histogram with an unknown bucket is that of the failed poll's run.
            for name, buckets in histograms.items():
                if name == bad_histogram:
                    if name in got_histograms or i > BAD:
                        assert got_histograms.get(name) == o_histograms.get(name), (i, label)
                    continue
                assert got_histograms[name] == buckets, (i, label, name)
            for name, x in values.items():
                if name == derive.BIMODALITY_COEFFICIENT and SAMPLE_READS & reads_bad:
                    continue
                reads = READS[name] & reads_bad
                if reads:
                    # As across a failed poll: the oracle's value (at the bad poll itself,
                    # absent where the window up to it counted none of what it divides by).
                    if i == BAD and name not in got_values:
                        continue
                    assert (name in got_values) == (name in o_values), (i, label, name)
                    if name in got_values:
                        assert close(got_values[name], o_values[name]), (i, label, name)
                    continue
                assert name in got_values, (i, label, name, "lost though it does not read", family)
                assert close(got_values[name], x), (i, label, name, got_values[name], x)
                checked += 1
            for name, per in positions.items():
                got_per = got_positions.get(name, {})
                for p, x in per.items():
                    if POSITION_READS & reads_bad:
                        if p in got_per or i > BAD:
                            assert close(got_per[p], o_positions[name][p]), (i, label, name, p)
                        continue
                    assert close(got_per[p], x), (i, label, name, p)
            # Nothing appears that neither the unmodified run nor the failed poll's run has.
            assert got_values.keys() <= values.keys() | o_values.keys(), (i, label)
    assert checked
    if bad_histogram is not None:
        assert bad_histogram in {n for label in want[BAD] for n in want[BAD][label][2]}
    # Windows that start after the bad poll: every signal is back, as in the unmodified run
    # (the series' next valid value is measured from its last valid one).
    last_values = {label: values for label, (values, _p, _h) in got[-1].items()}
    assert last_values.keys() == want[-1].keys()
    for label, (values, _positions, _histograms) in want[-1].items():
        assert last_values[label].keys() == values.keys(), (label, family)
        for name, x in values.items():
            assert close(last_values[label][name], x), (label, name, family)


SGLANG_PAGE = FIXTURES / "constructed" / "sglang-0.5.23-spec.prom"
_COUNTER_LINE = re.compile(r"^(sglang:\w+(?:_total|_sum|_count|_bucket)(?:\{[^}]*\})?) (\S+)$",
                           re.MULTILINE)


def sglang_pages(n: int = 8) -> list[tuple[float, str]]:
    """The constructed SGLang 0.5 page as a server whose counters grow 10% of their
    recorded value every 5 s poll."""
    text = SGLANG_PAGE.read_text()
    return [(5.0 * i, _COUNTER_LINE.sub(
        lambda m, f=1.0 + 0.1 * i: f"{m[1]} {float(m[2]) * f!r}", text)) for i in range(n)]


@pytest.mark.parametrize(("family", "reads"), [
    ("sglang:spec_verify_calls_total", {derive.ACCEPTANCE_LENGTH, derive.ACCEPTANCE_RATE,
                                        derive.TOKEN_ACCEPTANCE_PROBABILITY}),
    # One of the two is_streaming series: the model's sum is unknown, not one term short.
    ('sglang:generation_tokens_total{engine_type="unified",is_streaming="false"',
     {derive.ACCEPTANCE_LENGTH, derive.ACCEPTANCE_RATE, derive.TOKEN_ACCEPTANCE_PROBABILITY,
      derive.MEAN_GENERATION_TOKENS}),
])
def test_sglang_nan_leaves_out_only_what_reads_it(family, reads):
    seq = sglang_pages()
    bad = 4
    want = run(seq)
    text = seq[bad][1]
    start = text.index("\n" + family) + 1
    end = text.index("\n", start)
    line = text[start:end]
    bad_seq = list(seq)
    bad_seq[bad] = (seq[bad][0], text[:start] + line.rsplit(" ", 1)[0] + " NaN" + text[end:])
    got = run(bad_seq)
    before = want[bad - 1]  # what the bad poll failed would leave
    for label, (values, _positions, _histograms) in want[bad].items():
        assert reads <= values.keys()
        got_values = got[bad][label][0]
        assert values.keys() == got_values.keys()
        for name in got_values:
            x = before[label][0][name] if name in reads else values[name]
            assert close(got_values[name], x), (label, name)


def with_value(text: str, family: str, value: str) -> str:
    """Every sample of ``family`` on the page given ``value`` (the rest as recorded)."""
    pattern = re.compile(rf"^({re.escape(family)}(?:\{{[^}}]*\}})?) \S+$", re.MULTILINE)
    out, n = pattern.subn(rf"\g<1> {value}", text)
    assert n, family
    return out


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "-5"])
def test_a_bad_sample_on_every_other_poll_is_a_missed_sample(value):
    """The accepted-tokens counter invalid (NaN, ±Inf, negative: all alike) on every other
    poll: every window's acceptance signals are those of the same recording with those polls
    failed, at every poll (at a bad poll, those of the poll before, as a failed poll leaves
    them, or none where the window up to the bad poll drew no tokens): the good polls'
    values, never absent for want of a good base, never biased."""
    family = "vllm:spec_decode_num_accepted_tokens_total"
    seq = pages()
    bad = {i for i in range(1, len(seq)) if i % 2 == 1}
    got = run([(t, with_value(text, family, value) if i in bad else text)
               for i, (t, text) in enumerate(seq)])
    good = [i for i in range(len(seq)) if i not in bad]
    failed = dict(zip(good, run([seq[i] for i in good]), strict=True))
    reading = (derive.ACCEPTANCE_RATE, derive.ACCEPTANCE_LENGTH,
               derive.TOKEN_ACCEPTANCE_PROBABILITY)
    present = 0
    for i in range(len(seq)):
        want = failed[max(g for g in good if g <= i)]
        assert (got[i] is None) == (want is None), i
        if want is None:
            continue
        for label, (values, _positions, _histograms) in want.items():
            if label not in got[i]:
                # Only the count window, whose base reads the requests at the newest poll.
                assert label == CFG.count_window_label, (i, label)
                continue
            got_values = got[i][label][0]
            for name in reading:
                if i in bad and name not in got_values:
                    # The window up to the bad poll itself may have no drafts at all (a
                    # pause in the recording): its rate is then undefined, not unknown.
                    assert got[i][label][1] == {} or not got_values.get(derive.DRAFT_LENGTH)
                    continue
                assert (name in got_values) == (name in values), (i, label, name)
                if name in values:
                    assert close(got_values[name], values[name]), (i, label, name)
                    present += name == derive.ACCEPTANCE_RATE
    # The acceptance rate is there at every poll after the first window closed.
    assert present >= 2 * (len(seq) - 6), present


@pytest.mark.parametrize("value", ["NaN", "-5"])
def test_the_per_poll_sample_spans_a_bad_poll_like_a_failed_one(value):
    """The per-poll acceptance samples (the sample histogram, the bimodality coefficient)
    with the accepted tokens invalid on every other poll are those of the recording with
    those polls failed: each good poll's sample spans the interval from the good poll
    before."""
    family = "vllm:spec_decode_num_accepted_tokens_total"
    seq = pages()

    def samples(polls: list[tuple[float, str]]) -> tuple[int, float]:
        hist = history.TargetHistory(3600.0, 2000, CFG.min_drafts_per_sample)
        for t, text in polls:
            hist.update(sources.parse_page(text), t)
        (model,) = hist.models.values()
        return model.sample_count, model.sample_sum

    bad = samples([(t, with_value(text, family, value) if i % 2 else text)
                   for i, (t, text) in enumerate(seq)])
    failed = samples([p for i, p in enumerate(seq) if not i % 2])
    assert bad[0] == failed[0] > 5 and close(bad[1], failed[1]), (bad, failed)
