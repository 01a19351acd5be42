"""The selective ("fast") parse gives exactly the full prometheus_client parse's result.

Protected behaviour: on every page prometheus_client accepts, ``parse_page(parser="fast")``
equals ``parse_page(parser="full")`` field by field, value types included; on every fixture
page the fast path really runs (it does not quietly fall back to the full parser); the cases
where it must fall back (a counter family declared without ``_total``, nothing readable on
the page) fall back; invalid pages fail the same way where specwatch reads the broken line.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

import pytest
from helpers.paths import FIXTURES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specwatch.poll import sources
from specwatch.poll.fastparse import SampleSelector

FIX = FIXTURES
PAGES = sorted(FIX.rglob("*.prom"))
REAL = sorted((FIX / "vllm-0.32-cpu-ngram").glob("*.prom"))
ENGINES = ("auto", "vllm", "sglang")
EXAMPLES = int(os.environ.get("SPECWATCH_HYPOTHESIS_EXAMPLES", "150"))


def canonical(page: sources.ParsedPage) -> dict[str, object]:
    """Every field, values as (type, repr) so 5 vs 5.0 and NaN compare exactly."""
    def v(x: object) -> tuple[str, str]:
        return (type(x).__name__, repr(x))

    return {
        "engine": page.engine,
        "counters": {k: v(x) for k, x in page.counters.items()},
        "created": {k: v(x) for k, x in page.created.items()},
        "gauges": {k: v(x) for k, x in page.gauges.items()},
        "configured_k": dict(page.configured_k),
        "process_start_time": v(page.process_start_time),
        "counters_order": list(page.counters),
        "invalid": (page.invalid_series, page.invalid_models),
        "server": page.server,
    }


def outcome(text: str, engine: str, parser: str) -> object:
    try:
        return canonical(sources.parse_page(text, engine, parser))
    except sources.PageParseError:
        return "PageParseError"


def assert_same(text: str, engine: str = "auto") -> object:
    full = outcome(text, engine, "full")
    assert outcome(text, engine, "fast") == full
    return full


def selected(text: str, engine: str = "auto") -> bool:
    """True when the fast path handled the page itself (no fall-back to the full parser)."""
    return sources._names(engine).selector.select(text) is not None


# -- every fixture page -------------------------------------------------------------------

@pytest.mark.parametrize("path", PAGES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_fixture_page_same_result_without_fallback(path):
    """All 54 fixture pages (real vLLM 0.32 snapshots, constructed v1/v0/multi-engine/
    multi-model/SGLang pages), every engine setting: same result, fast path really used."""
    text = path.read_text()
    for engine in ENGINES:
        result = assert_same(text, engine)
        assert result != "PageParseError"
    assert selected(text)
    page = sources.parse_page(text, parser="fast")
    assert page.counters  # the comparison is not between two empty results


# -- constructed variants of one real page ------------------------------------------------

BASE = REAL[-1].read_text()
SPEC = (FIX / "constructed" / "vllm-0.33-spec-decode.prom").read_text()


def on_samples(text: str, fn) -> str:
    """Apply fn(name, labels_text_or_None, rest) -> line to every sample line."""
    out = []
    for line in text.split("\n"):
        m = re.match(r"^([^#\s{][^{ ]*)(\{[^}]*\})? (.*)$", line)
        out.append(fn(m.group(1), m.group(2), m.group(3)) if m else line)
    return "\n".join(out)


def many_models(text: str, models: int, engines: int) -> str:
    out = []
    for line in text.split("\n"):
        if line.startswith("#") or 'model_name="tiny-llama"' not in line:
            out.append(line)
            continue
        for m in range(models):
            for e in range(engines):
                out.append(line.replace('model_name="tiny-llama"', f'model_name="org/m{m}"')
                           .replace('engine="0"', f'engine="{e}"'))
    return "\n".join(out)


def with_label(name, labels, rest, extra):
    inner = labels[1:-1] if labels else ""
    inner = f"{inner},{extra}" if inner else extra
    return f"{name}{{{inner}}} {rest}"


VARIANTS = {
    "many models and engines": lambda t: many_models(t, 5, 3),
    "escaped label values": lambda t: on_samples(
        t, lambda n, lab, r: with_label(n, lab, r, r'lora="a\"b\\c\nd"')),
    "braces commas and unicode in label values": lambda t: on_samples(
        t, lambda n, lab, r: with_label(n, lab, r, 'odd="}{,=é x"')),
    "timestamps": lambda t: on_samples(
        t, lambda n, lab, r: f"{n}{lab or ''} {r} 1795971959186"),
    "exemplars": lambda t: on_samples(
        t, lambda n, lab, r: f'{n}{lab or ""} {r} # {{trace_id="abc"}} 1.0'),
    "CRLF line ends": lambda t: t.replace("\n", "\r\n"),
    "tabs and trailing blanks": lambda t: on_samples(
        t, lambda n, lab, r: f"{n}{lab or ''}\t{r} \t"),
    "indented lines": lambda t: "\n".join("  " + ln if i % 3 == 0 else ln
                                          for i, ln in enumerate(t.split("\n"))),
    "blank lines and free comments": lambda t: t.replace(
        "\n# HELP", "\n\n# just a comment \"quoted\" TYPE\n#\n# HELP"),
    "no HELP or TYPE lines": lambda t: "\n".join(
        ln for ln in t.split("\n") if not ln.startswith("#")),
    "integer values": lambda t: re.sub(r" (\d+)\.0$", r" \1", t, flags=re.M),
    "special values": lambda t: t.replace(
        'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 0.0',
        'vllm:num_requests_running{engine="0",model_name="tiny-llama"} NaN').replace(
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny-llama"}',
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny-llama"} +Inf\n'
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="tiny-llama"} -5\n'
        'vllm:spec_decode_num_drafts_total{engine="2",model_name="tiny-llama"}'),
    "duplicate series (the last one wins)": lambda t: t + (
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny-llama"} 12345.0\n'),
    "name inside the braces": lambda t: t.replace(
        'vllm:spec_decode_num_draft_tokens_total{engine="0",',
        '{__name__="vllm:spec_decode_num_draft_tokens_total",engine="0",').replace(
        'vllm:prompt_tokens_total{engine="0",',
        '{"vllm:prompt_tokens_total",engine="0",'),
    "spaces inside the label set": lambda t: t.replace(
        'vllm:generation_tokens_total{engine="0",model_name="tiny-llama"}',
        'vllm:generation_tokens_total{ engine = "0" , model_name="tiny-llama" }'),
    "histogram named _total (vLLM's iteration_tokens) and a counter-named histogram":
        lambda t: t + ("# TYPE vllm:prompt_tokens_total histogram\n"
                       'vllm:prompt_tokens_total_bucket{le="+Inf",model_name="x"} 3.0\n'
                       'vllm:prompt_tokens_total_sum{model_name="x"} 9.0\n'
                       'vllm:prompt_tokens_total_count{model_name="x"} 3.0\n'),
    "created samples of a restarted engine": lambda t: t.replace(
        'vllm:spec_decode_num_drafts_created{engine="0",model_name="tiny-llama"} 1.79',
        'vllm:spec_decode_num_drafts_created{engine="0",model_name="tiny-llama"} 1.80'),
    "multi-engine page as SGLang-free auto": lambda _t: (
        FIX / "constructed" / "vllm-0.33-multi-engine.prom").read_text(),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_same_result(name):
    """Each variant of the real page parses to the same result on both paths, and the
    fast path handles it without falling back to the full parser."""
    for source in (BASE, SPEC):
        text = VARIANTS[name](source)
        result = assert_same(text)
        assert result != "PageParseError", name
        assert selected(text), name


def test_counter_family_without_total_falls_back_and_matches():
    """``# TYPE x counter`` renames samples ``x`` to ``x_total`` in the full parser: a page
    declaring a wanted family that way goes to the full parser, with the same result, and
    an unrelated sample between the TYPE line and the sample cancels the renaming there."""
    declared = BASE + ("# TYPE vllm:spec_decode_num_drafts counter\n"
                       'vllm:spec_decode_num_drafts{engine="7",model_name="tiny-llama"} 5.0\n')
    assert not selected(declared)
    result = assert_same(declared)
    assert any(dict(k[2]).get("engine") == "7" for k in sources.parse_page(declared).counters)
    assert result != "PageParseError"
    interrupted = BASE + ("# TYPE vllm:spec_decode_num_drafts counter\n"
                          "unrelated_metric 1\n"
                          'vllm:spec_decode_num_drafts{engine="7",model_name="tiny-llama"} 5\n')
    assert_same(interrupted)
    gauge_as_counter = BASE.replace("# TYPE process_start_time_seconds gauge",
                                    "# TYPE process_start_time_seconds counter")
    assert not selected(gauge_as_counter)
    assert sources.parse_page(gauge_as_counter, parser="fast").process_start_time is None
    assert_same(gauge_as_counter)


def test_kind_detection_sees_prefixes_on_lines_not_read():
    """The engine kind comes from any vllm:/sglang: sample line, also those not read."""
    only_other = "vllm:kv_cache_usage_perc 0.5\nprocess_start_time_seconds 1.0\n"
    assert sources.parse_page(only_other, parser="fast").engine == "vllm"
    assert_same(only_other)
    indented = "process_start_time_seconds 1.0\n   sglang:other 2\n"
    assert sources.parse_page(indented, parser="fast").engine == "sglang"
    assert_same(indented)
    braced = 'process_start_time_seconds 1.0\n{__name__="vllm:x"} 2\n'
    assert sources.parse_page(braced, parser="fast").engine == "vllm"
    assert_same(braced)


@pytest.mark.parametrize("text", [
    "<html><body>502 Bad Gateway</body></html>\n",
    "\x1f\x8b\x08\x00garbage",
    "",
    "# HELP only a comment\n",
    'vllm:spec_decode_num_drafts_total{model_name="m" 5\n',
    'vllm:spec_decode_num_drafts_total{model_name="m"} five\n',
    'vllm:spec_decode_num_drafts_total{model_name="m",model_name="n"} 5\n',
    'vllm:spec_decode_num_drafts_total{__x="m"} 5\n',
    'vllm:spec_decode_num_drafts_total 1_000\n',
    "vllm:spec_decode_num_drafts_total " + "9" * 400 + "\n",
])
def test_invalid_or_empty_pages_fail_or_pass_the_same_way(text):
    """Error pages, binary bodies and broken lines of a family specwatch reads: the same
    outcome (PageParseError, or an empty page) on both paths."""
    assert_same(text)


def test_broken_line_outside_the_read_families_is_the_documented_difference():
    """A broken line in a family specwatch does not read fails the full parse only (the
    fast path never looks at it); the families read are unaffected."""
    text = SPEC + "some_other_metric{oops 1\n"
    assert outcome(text, "auto", "full") == "PageParseError"
    assert sources.parse_page(text, parser="fast") == sources.parse_page(SPEC, parser="full")


def test_selector_rejects_an_empty_name_set():
    with pytest.raises(ValueError):
        SampleSelector([])


# -- generated pages ----------------------------------------------------------------------

WANTED = sorted(sources._names("auto").wanted)
STEMS = sorted({n[:-6] for n in WANTED if n.endswith("_total")}
               | {n.rsplit("_", 1)[0] for n in WANTED if n.endswith(("_sum", "_count"))})
OTHER = ["vllm:kv_cache_usage_perc", "vllm:iteration_tokens_total", "sglang:cache_hit_rate",
         "python_gc_objects_collected_total", "http_requests", "a"]
SUFFIXES = ["", "_total", "_created", "_sum", "_count", "_bucket"]

names = st.one_of(
    st.sampled_from(WANTED),
    st.builds(lambda s, x: s + x, st.sampled_from(STEMS + OTHER), st.sampled_from(SUFFIXES)))
label_values = st.one_of(
    st.sampled_from(["0", "1", "m", "org/model-1", "tiny-llama", "", "é", "}", ",", "=",
                     " x ", r"a\"b", r"c\\d", r"e\nf"]),
    st.text(alphabet="abc ,{}=é", max_size=5))
label_sets = st.dictionaries(
    st.sampled_from(["model_name", "engine", "position", "finished_reason", "tp_rank", "le"]),
    label_values, max_size=4)
values = st.one_of(
    st.sampled_from(["0", "1", "5.0", "-3", "+7", "007", "1e3", "2.5E-2", ".5", "NaN",
                     "+Inf", "-Inf", "1795971943.5530813"]),
    st.integers(-10, 10**20).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr))


@st.composite
def sample_lines(draw) -> str:
    name = draw(names)
    labels = draw(label_sets)
    sep = draw(st.sampled_from([" ", " ", "\t", "  "]))
    lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
    head = draw(st.sampled_from([
        f"{name}{{{lab}}}" if labels else name,
        f"{name}{{{lab}}}" if labels else f"{name}{{}}",
        f'{{__name__="{name}"{"," + lab if lab else ""}}}',
    ]))
    tail = draw(st.sampled_from(["", "", " 1795971959186", ' # {trace_id="t"} 1', " ", "\r"]))
    indent = draw(st.sampled_from(["", "", "", " ", "\t"]))
    return f"{indent}{head}{sep}{draw(values)}{tail}"


comment_lines = st.one_of(
    st.builds(lambda n, t: f"# TYPE {n} {t}", names,
              st.sampled_from(["counter", "gauge", "histogram", "summary", "untyped"])),
    st.builds(lambda n, d: f"# HELP {n} {d}", names,
              st.sampled_from(["doc", "with \\n escape", 'a "quote"', "counter TYPE"])),
    st.sampled_from(["", "#", "# free comment", '# TYPE "vllm:prompt_tokens" counter',
                     "  # TYPE vllm:request_success counter"]),
    # Declarations the finder leaves in C or must not (a type is the rest of the line):
    # blanks after the type, other separators, a name ending _total. Only spellings the
    # full parser accepts: a page with one it rejects is outside the equivalence domain
    # and compares nothing, and the four such spellings this list had (the types
    # "counter # note", "_total counter" after a tab, "x_total counter", "Counter") made
    # generated pages valid too rarely (test_generated_pages_are_mostly_valid failed for
    # 7 seeds of 40, 1 of 40 without them).
    st.builds(lambda n, form: form.format(n), names, st.sampled_from([
        "# TYPE {} counter \t", "#\tTYPE {} counter", "# TYPE {}\x0b counter",
        "# TYPE  {}  counter\x0c", "# TYPE {}\tcounter", '# TYPE "{}" counter',
        "# TYPE {}_total counter", "#  HELP {} counter"])),
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(sample_lines(), sample_lines(), comment_lines), min_size=1,
                max_size=40),
       st.sampled_from(ENGINES))
def test_generated_pages_same_result(lines, engine):
    """Hypothesis pages (wanted, renamed and unrelated families, TYPE/HELP lines of every
    type, escaped and odd label values, braced names, timestamps, exemplars, indentation,
    CR line ends): wherever the full parser accepts the page, the fast path agrees."""
    text = "\n".join(lines) + "\n"
    full = outcome(text, engine, "full")
    if full == "PageParseError":
        return  # outside the equivalence domain (see fastparse's docstring)
    assert outcome(text, engine, "fast") == full


def test_generated_pages_are_mostly_valid():
    """The generator is useful: most of its pages are accepted by the full parser and
    hold samples specwatch reads (otherwise the test above would compare nothing)."""
    valid = 0

    # The same examples on every run (derandomize): a property of the generator, checked
    # once, not a draw that fails one run in forty.
    @settings(max_examples=60, deadline=None, database=None, derandomize=True)
    @given(st.lists(st.one_of(sample_lines(), sample_lines(), comment_lines), min_size=1,
                    max_size=40))
    def count(lines):
        nonlocal valid
        text = "\n".join(lines) + "\n"
        result = outcome(text, "auto", "full")
        # A model skipped as invalid (a value above 2**53, NaN...) was still read.
        if result != "PageParseError" and (result["counters"] or result["gauges"]
                                           or result["invalid"][0]):
            valid += 1

    count()
    assert valid >= 15


def test_nan_process_start_compares():
    """canonical() compares NaN values (the test helper itself must not hide differences)."""
    text = "process_start_time_seconds NaN\n"
    a = canonical(sources.parse_page(text, parser="fast"))
    assert a == canonical(sources.parse_page(text, parser="full"))
    assert math.isnan(sources.parse_page(text, parser="fast").process_start_time)


# -- without the histogram buckets (nothing reads them) -------------------------------------

def without_buckets(page: sources.ParsedPage) -> dict[str, object]:
    """canonical(page) with the bucket series taken out (what buckets=False must give)."""
    def drop(d):
        return {k: x for k, x in d.items() if k[1] not in sources.BUCKET_SIGNALS}

    return canonical(dataclasses.replace(
        page, counters=drop(page.counters), created=drop(page.created)))


@pytest.mark.parametrize("path", PAGES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_fixture_page_without_buckets_is_the_page_minus_its_buckets(path):
    """``buckets=False`` (no controller and no pair reads the latency histograms) gives the
    same page minus the bucket series, for both parsers and every engine setting, and
    really reads no bucket line (the fast path still runs)."""
    text = path.read_text()
    for engine in ENGINES:
        for parser in sources.PARSERS:
            whole = sources.parse_page(text, engine, parser)
            lean = sources.parse_page(text, engine, parser, buckets=False)
            assert canonical(lean) == without_buckets(whole)
            assert not any(k[1] in sources.BUCKET_SIGNALS for k in lean.counters)
    if any(k[1] in sources.BUCKET_SIGNALS for k in sources.parse_page(text).counters):
        lean_sel = sources._names("auto", False).selector.select(text)
        assert lean_sel is not None
        assert not any(s[0].endswith("_bucket") for s in lean_sel.samples)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(sample_lines(), sample_lines(), comment_lines), min_size=1,
                max_size=40),
       st.sampled_from(ENGINES))
def test_generated_pages_without_buckets(lines, engine):
    """Hypothesis pages: wherever both parses succeed, buckets=False is the page minus its
    bucket series (a broken or invalid bucket line is not read, so it may only fail or void
    its model with buckets)."""
    text = "\n".join(lines) + "\n"
    try:
        whole = sources.parse_page(text, engine, "full")
    except sources.PageParseError:
        return
    if whole.invalid_models:
        return  # a bad bucket counter voids its model only when buckets are read
    try:
        lean_page = sources.parse_page(text, engine, "fast", buckets=False)
    except sources.PageParseError:
        pytest.fail("a page the full parser accepts failed without its buckets")
    assert canonical(lean_page) == without_buckets(whole)


# -- the finder's trie, its canonical-line path and the per-series cache ---------------------

from specwatch.poll import fastparse  # noqa: E402


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.sets(st.text(alphabet="ab:_", min_size=1, max_size=4), min_size=1, max_size=8),
       st.lists(st.text(alphabet="ab:_x", max_size=6), max_size=20))
def test_trie_alternation_matches_what_the_plain_alternation_matches(names, probes):
    """The trie is the plain alternation (longest name first) rewritten: on any text it
    matches the same prefix, names that are prefixes of each other included."""
    plain = re.compile("|".join(re.escape(n) for n in sorted(names, key=lambda s: (-len(s), s))))
    trie = re.compile(fastparse._alternation(names))
    for text in [*probes, *names, *(n + "x" for n in names)]:
        a, b = plain.match(text), trie.match(text)
        assert (a and a.group()) == (b and b.group()), (names, text)


def test_help_lines_are_never_type_declarations():
    """A HELP line that mentions TYPE, counter, quotes and a renamable name (once sent to
    the conservative quoted-comment check) is skipped by the finder: same result, no
    fall-back; a free comment of that kind still falls back (it may be a declaration)."""
    help_line = '# HELP vllm:spec_decode_num_drafts "x" TYPE counter\n'
    text = BASE.replace("\n# TYPE process_start_time_seconds",
                        "\n" + help_line + "# TYPE process_start_time_seconds")
    assert help_line in text
    assert selected(text)
    assert_same(text)
    tab = BASE.replace("# HELP vllm:spec_decode_num_drafts_total",
                       "# HELP\tvllm:spec_decode_num_drafts TYPE counter \"q\"")
    assert selected(tab)
    assert_same(tab)
    free = BASE + '#  TYPE "vllm:spec_decode_num_drafts" counter\n'
    assert not selected(free)
    assert_same(free)


@pytest.mark.parametrize("declaration", [
    "# TYPE vllm:spec_decode_num_drafts counter \t",   # blanks after the type
    "# TYPE vllm:spec_decode_num_drafts counter\r",
    "#\tTYPE vllm:spec_decode_num_drafts counter",      # a tab between the tokens
    "# TYPE vllm:spec_decode_num_drafts\x0b counter",   # separators the parser splits on
    "# TYPE  vllm:spec_decode_num_drafts \x0ccounter",
    '# TYPE "vllm:spec_decode_num_drafts" counter',     # a quoted name
])
def test_every_counter_declaration_that_renames_falls_back(declaration):
    """A comment the parser reads as ``# TYPE x counter`` for a wanted ``x_total`` renames
    its samples, whatever blanks and separators it is written with: the finder must hand
    each to the full parser (it leaves in C only comments that cannot end in a counter
    type), which gives the renamed samples."""
    text = BASE + declaration + "\nvllm:spec_decode_num_drafts{model_name=\"m\"} 3\n"
    assert not selected(text)
    full = assert_same(text)
    assert full != "PageParseError"


@pytest.mark.parametrize("declaration", [
    "# TYPE vllm:iteration_tokens_total counter",        # how prometheus_client writes one
    "# TYPE vllm:spec_decode_num_drafts_total counter",  # a wanted family, renamed itself
    "# TYPE vllm:spec_decode_num_drafts gauge",
    "# HELP vllm:spec_decode_num_drafts counter",
])
def test_declarations_that_cannot_rename_stay_on_the_fast_path(declaration):
    """Comments that cannot declare a renaming counter (the common ``*_total counter``
    line included) are skipped by the finder: no fall-back, the same result."""
    text = BASE + declaration + "\n"
    assert selected(text)
    assert_same(text)


@pytest.mark.parametrize("line", [
    'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 5',       # canonical
    'vllm:spec_decode_num_drafts_total{engine="0",model_name="m",} 5 17',   # comma, stamp
    'vllm:spec_decode_num_drafts_total{} 5',                                # empty set
    'vllm:spec_decode_num_drafts_total 5\r',                                # no labels, CR
    'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"}\t+7 \t',  # tab, sign
    'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 5 # {a="b"} 1',  # exemplar
    'vllm:spec_decode_num_drafts_total{engine="0",model_name="a}b"} 5',     # brace in value
    'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} NaN',
    'vllm:spec_decode_num_drafts_totalx{model_name="m"} 5',                 # longer name
    'vllm:spec_decode_num_drafts_total{engine="0",engine="1"} 5',           # repeated label
])
def test_wanted_line_shapes_in_and_outside_the_canonical_form(line):
    """Each shape of a wanted line, as the first line and after another line (the finder's
    path and the first-line path): the same outcome as the full parser, value types
    included."""
    for text in (line + "\n", "# HELP x y\n" + line + "\n", "a 1\n" + line):
        assert_same(text)


@pytest.mark.parametrize("opened", [
    'vllm:spec_decode_num_drafts_total{model_name="m" 5',
    'vllm:spec_decode_num_drafts_total{model_name="m",',
    "vllm:spec_decode_num_drafts_total{",
])
@pytest.mark.parametrize("after", [
    'vllm:spec_decode_num_drafts_total{engine="1"} 7',      # a "}" and a value later
    "# TYPE vllm:spec_decode_num_drafts counter\nx} 5",     # a context line in between
    'x="1"} 5\nvllm:spec_decode_num_drafts_total{engine="2"} 8',
    "no closing brace anywhere 1",
])
def test_label_set_never_closed_on_its_line(opened, after):
    """The finder takes a label text up to the first "}", which for a "{" never closed on
    its line is on a later line: the page goes to the full parser (which rejects such a
    line), never a sample made of two lines or a line hidden inside one."""
    text = f"a 1\n{opened}\n{after}\n"
    assert outcome(text, "auto", "fast") == outcome(text, "auto", "full") == "PageParseError"


def test_series_cache_is_bounded_and_gives_the_same_pages(monkeypatch):
    """The per-series cache (sample key -> what the series is) never holds more than its
    bound, never holds a key over LABEL_CACHE_MAX_KEY, and a page parsed from the cache, a
    page parsed after the cache was cleared and the full parse are equal."""
    monkeypatch.setattr(sources, "LABEL_CACHE_SIZE", 8)
    names = sources._names("vllm", False)
    names.series.clear()
    text = many_models(BASE, 5, 3)  # 5 x 3 x 39 distinct series
    long = BASE.replace('model_name="tiny-llama"',
                        f'model_name="{"m" * (fastparse.LABEL_CACHE_MAX_KEY + 1)}"')
    full = sources.parse_page(text, "vllm", "full", buckets=False)
    for _ in range(3):
        assert sources.parse_page(text, "vllm", "fast", buckets=False) == full
        assert len(names.series) <= 8
        assert sources.parse_page(long, "vllm", "fast", buckets=False) == \
            sources.parse_page(long, "vllm", "full", buckets=False)
        assert all(len(k) <= fastparse.LABEL_CACHE_MAX_KEY for k in names.series)
    monkeypatch.undo()
    names.series.clear()
    for _ in range(2):  # the second time every series comes from the cache
        assert sources.parse_page(text, "vllm", "fast", buckets=False) == full


def test_cached_series_are_truncated_per_call():
    """A series remembered while parsing without a limit is still cut (and counted) when a
    later call sets one, and vice versa: truncation is never cached with the series."""
    text = BASE.replace('model_name="tiny-llama"', f'model_name="{"é" * 40}"')
    for limit in (None, 64, None, 64, 300):
        fast = sources.parse_page(text, "vllm", "fast", limit)
        assert fast == sources.parse_page(text, "vllm", "full", limit)
        assert (fast.truncated_label_values == 1) == (limit == 64)


def test_vllm_kind_wins_over_sglang_lines_on_both_paths():
    """The kind is decided vllm: first (the fast path looks for sglang: only when no vllm:
    line is on the page): a page with both is "vllm" on both paths, one with sglang: lines
    only is "sglang"."""
    both = BASE + "sglang:cache_hit_rate 0.5\n"
    assert sources.parse_page(both, parser="fast").engine == "vllm"
    assert_same(both)
    only = "sglang:cache_hit_rate 0.5\nprocess_start_time_seconds 1.0\n"
    assert sources.parse_page(only, parser="fast").engine == "sglang"
    assert_same(only)
