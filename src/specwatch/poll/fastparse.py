"""Selective parse of a Prometheus text page: only the sample lines of the families we read.

Why: prometheus_client's text parser walks every character of every line in Python
(about 40 µs per line in 0.26.0, anchors-reliability.md §2.3), so a 60 KB vLLM page costs
about 15 ms of CPU and a 2 MB page (many models, LoRA adapters, data-parallel engines) about
0.5-0.8 s. specwatch reads a few dozen families out of hundreds. This module finds the
lines of those families with one compiled regular expression (C speed over the whole body)
and parses only them: lines in the canonical shape (``name{a="b",...} value [timestamp]``,
no escapes) with a strict regular expression, any other line with prometheus_client's own
parser. Nothing else of the page is turned into Python objects.

**Equivalence.** For every page that ``prometheus_client.parser.text_string_to_metric_families``
accepts, :meth:`SampleSelector.select` returns exactly the samples of the wanted names that
the full parser yields, in the same order, with the same labels and values (int/float type
included), or ``None`` ("use the full parser"). The proof obligations and where they are met:

* *Which lines are samples of a wanted name.* The parser strips every line (Unicode
  whitespace) and takes the name up to ``{`` or the first blank. The finder accepts any line
  whose stripped text starts with a wanted name followed by a character that cannot continue
  a name, plus every line that starts with ``{`` (the name can be inside the braces), plus
  every indented line (re-examined after stripping). The name is then checked again on the
  parsed sample, so the finder may over-select but never misses a line.
* *Context.* The parser is stateful in exactly one way that changes a sample: a family
  declared ``# TYPE x counter`` whose name does not end in ``_total`` renames its samples
  ``x`` to ``x_total``. That can only touch a wanted sample when ``x`` is a wanted name or a
  wanted ``*_total`` name without the suffix; the finder also returns every comment that
  mentions ``TYPE`` and whose line ends with ``counter`` (and blanks), and :meth:`select`
  returns ``None`` (full parse) when one of them could declare such a family. The parser's
  type is the rest of the stripped line after the name (its fourth token with at most three
  splits), so no other comment declares a counter. Left out as well: canonical
  declarations that cannot rename, ``# HELP`` lines (the parser's second token of those is
  ``HELP``, never a declaration), and lines ending ``_total counter`` (the type is then
  ``counter`` only if the name is the token before it, unquoted and ending ``_total``: the
  parser renames the family, not its samples; any other split leaves a type that is not
  ``counter`` or a page it rejects). Without
  that, every wanted sample's name is what its line says, independent of the lines around
  it, so lines can be parsed alone.
* *Strict shape.* The strict expression accepts a sub-language of what the parser accepts
  (ASCII label names not starting with ``__``, values without ``"`` or ``\\``, comma-separated,
  one value and an optional integer millisecond timestamp) and converts values the way the
  parser does (``int`` for an integer literal, else ``float``); a line outside it goes to the
  parser itself. A duplicate label name falls back too (the parser rejects it). The finder
  checks the label text of a wanted line only loosely (up to the first ``}``); the strict
  check is made once per distinct text before it is remembered, and a text that runs past
  its line (a ``{`` never closed, a line the parser rejects) sends the page to the full
  parser.
* *Prefix detection.* Which engine prefixes (``vllm:``, ``sglang:``) appear on any sample line
  is answered from the text: a line starting with the prefix is a sample line of a name with
  that prefix, and braced or indented lines are examined one by one.
  (:meth:`Selection.saw`, on demand: an absent prefix costs a scan of the whole body.)

**Cost (issue 15).** One pass of one compiled expression over the body, about 0.1 ms for
the 55 KB vLLM page (of ~0.14 ms for all of ``parse_page`` without buckets, 0.25 ms before
this design): the names are a trie (each branch starts with a distinct character, so a
line of another family is left at the first character where it leaves every wanted name),
a wanted name is matched once for both its canonical and its other shape, the canonical
line is parsed by that same match (no second expression per line) with its label text
taken up to the first ``}`` (a character class is ~50 instructions a character in the
engine, a scan for one character a few), ``# HELP`` lines are rejected after six
characters, and a comment is examined further only when its line ends with ``counter``
(a scan for one character, backwards from the line's end), so the canonical-name check
(a character class per character) runs only on the rare declaration that ends that way
without ``_total``: the finder's pass over the 55 KB page went from 1.30 to 1.09 million
instructions (callgrind), of 1.56 for the whole :meth:`SampleSelector.select` before. Each
alternative starts with a literal or a character class where it can (the engine tries such
an alternative only when the line's first character fits). A line of another family
costs ~1.5k instructions, a wanted line ~7k. What remains in
Python is a few operations per wanted line; label texts are checked and parsed once and
remembered (bounded, see :data:`LABEL_CACHE_SIZE`), and each sample carries its head (name
and label set as written) so that callers can remember what they derive from it.

tests/poll/test_fastparse.py checks this on every fixture page, on constructed variants of each
case above and on pages generated by hypothesis.

**Invalid pages.** The full parser rejects a page for a bad line anywhere; the selective
parse sees only the lines it reads. A page where no wanted line is found is handed to the
full parser (an HTML error page or a binary body still fails as ``parse``), and a page that
ends inside a line (a cut page) is rejected by :func:`specwatch.poll.sources.parse_page`
before either parser runs; a broken complete line of a family specwatch does not read is
otherwise ignored. That is the one documented difference, and it is why the full parser
stays available (``global.parser: full``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

#: (sample name, labels, value, key): the value is an int for an integer literal, like the
#: parser; the key is the head of a strict line, its name and label set as written (the same
#: key means the same name and labels, so callers may cache what they derive from them), or
#: None. ``labels`` dicts may be shared between calls: read them, never change them.
RawSample = tuple[str, dict[str, str], float, str | None]

#: Label texts remembered per selector (the same series recur on every poll of every target).
LABEL_CACHE_SIZE = 16384
#: Longest label text remembered (a hostile page with huge label values must not make the
#: caches hold megabytes per entry: issue 17).
LABEL_CACHE_MAX_KEY = 2048
_NO_LABELS: dict[str, str] = {}

_NAME_CHAR = "A-Za-z0-9_:"
_LABEL = r'(?!__)[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"'
_NUMBER = r"[+-]?(?:[0-9]{1,300}(?:\.[0-9]*)?(?:[eE][+-]?[0-9]{1,4})?" \
          r"|\.[0-9]{1,300}(?:[eE][+-]?[0-9]{1,4})?|Inf|NaN)"
_LABELS = rf"(?:{_LABEL}(?:,{_LABEL})*,?)?"
#: What follows the labels in the canonical shape: the value and an optional timestamp.
_VALUE = rf"[ \t]+({_NUMBER})(?:[ \t]+-?[0-9]{{1,18}})?[ \t\r]*"
#: The canonical sample line: what prometheus_client and vLLM/SGLang write. Groups: the
#: head (name and label set as written: the sample's key), name, label text, value.
_STRICT = re.compile(rf"(([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{{({_LABELS})\}})?){_VALUE}")
_LABEL_TEXT = re.compile(_LABELS)
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')
#: Separators of prometheus_client's comment tokenizer (string.whitespace).
_COMMENT_SPLIT = re.compile(r"[ \t\n\r\x0b\x0c]+")


@dataclass(frozen=True)
class Selection:
    """The wanted samples in page order, and what is needed to tell the prefixes on the page.

    ``seen``: prefixes seen on the lines examined one by one (braced, indented); any other
    sample line starts at a line start, so :meth:`saw` answers the rest from the text, only
    when asked (a prefix absent from the page costs a scan of the whole body: a caller that
    needs one answer asks for that one only).
    """

    samples: list[RawSample]
    seen: frozenset[str]
    text: str

    def saw(self, prefix: str) -> bool:
        """Does a sample line of the page start with ``prefix`` (one of the selector's)?"""
        text = self.text
        return prefix in self.seen or text.startswith(prefix) or f"\n{prefix}" in text


def _alternation(names: Iterable[str]) -> str:
    """A regex alternation of the names as a trie: each branch starts with a distinct
    character, so the engine rejects a line of another family at the first character where
    it leaves every wanted name (instead of trying each name that shares the prefix).
    Matches exactly the same strings as ``a|b|...``, longest first where one name is a prefix
    of another."""
    trie: dict[str, dict] = {}
    for n in names:
        node = trie
        for ch in n:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, dict]) -> str:
        alts = []
        for ch in sorted(k for k in node if k):
            sub, run = node[ch], re.escape(ch)
            while len(sub) == 1 and "" not in sub:  # a chain of single children: one literal
                (c, sub), = sub.items()
                run += re.escape(c)
            alts.append(run + emit(sub))
        if not alts:
            return ""
        alt = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        if "" in node:  # a name ends here: the longer names first (greedy), then this one
            return f"(?:{alt})?"
        return alt

    return emit(trie)


class SampleSelector:
    """Finds and parses the sample lines of ``names``; see the module docstring.

    ``prefixes``: name prefixes whose presence on any sample line of the page is reported
    (the page's engine kind is decided from them). Build once, use from any thread.
    """

    def __init__(self, names: Iterable[str], prefixes: Iterable[str] = ()) -> None:
        self.names = frozenset(names)
        if not self.names:
            raise ValueError("no names to select")
        self.prefixes = tuple(prefixes)
        #: Names whose samples a counter TYPE line could rename (see "Context").
        self.renamable = frozenset(
            {n[: -len("_total")] for n in self.names if n.endswith("_total")}
            | {n for n in self.names if not n.endswith("_total")})
        wanted = _alternation(self.names)
        renamable = _alternation(self.renamable)
        # The lines the finder picks. Branches start with distinct characters (the engine
        # leaves a branch at its first character) and the whole match is the line (with its
        # "\n"), so only a wanted line has groups: head, name, label text, value.
        self._lines = re.compile(
            # A TYPE comment that may rename a wanted sample (context guard, see "Context"):
            # not "# HELP ..." (its second token is HELP: never a type declaration), a line
            # ending with "counter" but not "_total counter" (every other TYPE line of a
            # page is left here, in C), and then the canonical "# TYPE x counter" of a
            # renamable x, or any such comment mentioning TYPE except the canonical
            # declaration of a name that cannot be renamed.
            r"\n(?:\#(?! HELP[ \t])(?=[^\n]*counter(?<!_total counter)[^\S\n]*(?:\n|\Z))"
            rf"(?: TYPE (?:{renamable}) counter\r?(?=\n|\Z)"
            rf"|(?! TYPE [a-zA-Z_:][a-zA-Z0-9_:]* [a-z]+\r?(?:\n|\Z))(?=[^\n]*TYPE)[^\n]*)"
            r"|\{[^\n]*"                                  # name inside the braces
            # An indented line; written to start with a character class (not a repeat),
            # so the engine tries it only on a line that starts with a blank.
            r"|[^\S\n][^\S\n]*\S[^\n]*"
            # A line starting with a wanted name (matched once for both shapes: the trie is
            # most of the cost of a line of another family): parsed by the finder itself in
            # the canonical shape, else taken whole (value None). The label text is taken
            # loosely here, up to the first "}" (a scan in C, a third of the cost of the
            # strict form), and checked strictly once per distinct text (_labels_of); a
            # text with a newline (a "{" never closed) may span lines: see select().
            rf"|(({wanted})(?:\{{([^}}]*)\}})?)"
            rf"(?:{_VALUE}(?=\n|\Z)|(?![{_NAME_CHAR}])[^\n]*))")
        self._labels: dict[str, dict[str, str]] = {}
        self._starts_wanted = re.compile(rf"(?:{wanted})(?![{_NAME_CHAR}])")

    def select(self, text: str) -> Selection | None:
        """The wanted samples of ``text``; None when the full parser must decide.

        Raises ValueError (like the full parser) when a wanted line is not a valid sample.
        """
        samples: list[RawSample] = []
        seen: set[str] = set()
        end = text.find("\n")
        first = text if end < 0 else text[:end]
        if not self._line(first.strip(), samples, seen):
            return None
        line_fn = self._line
        labels_of = self._labels_of
        append = samples.append
        for m in self._lines.finditer(text):
            head, name, label_text, value_text = m.groups()
            if value_text is None:
                line = m.group()[1:]
                if head is None:  # "#", "{" or indented
                    if not line_fn(line.strip(), samples, seen):
                        return None
                elif "\n" in line:  # a "{" never closed: the full parser decides
                    return None
                else:  # a wanted name outside the canonical shape
                    samples.extend(self._parse_alone(line))
                continue
            labels = labels_of(label_text)
            if labels is None:
                if "\n" in label_text:  # a "{" never closed: the full parser decides
                    return None
                samples.extend(self._parse_alone(m.group()[1:]))
                continue
            append((name, labels, parse_value(value_text), head))
        if not samples:
            return None  # nothing we read: let the full parser judge the page
        return Selection(samples, frozenset(seen), text)

    def lines(self, text: str) -> list[tuple[str, str, str, str]]:
        """What the finder matches in ``text`` (the first line aside), as (head, name,
        label text, value text) with ``""`` for a part it did not match: a line the
        finder took whole (a comment, a braced or indented line) has no head, a wanted
        line outside the canonical shape no value (see :meth:`select` for their meaning)."""
        return self._lines.findall(text)

    def _line(self, line: str, samples: list[RawSample], seen: set[str]) -> bool:
        """A stripped line outside the common shape; False means "full parse needed"."""
        if not line:
            return True
        if line[0] == "#":
            return not self._may_rename(line)
        if line[0] == "{":
            for sample in _parse_line(line):
                seen.update(p for p in self.prefixes if sample[0].startswith(p))
                if sample[0] in self.names:
                    samples.append(sample)
            return True
        seen.update(p for p in self.prefixes if line.startswith(p))
        if self._starts_wanted.match(line):
            s = _STRICT.fullmatch(line)
            sample = self._strict_sample(s) if s is not None else None
            if sample is not None:
                samples.append(sample)
            else:
                samples.extend(self._parse_alone(line))
        return True

    def _may_rename(self, line: str) -> bool:
        """Could this comment declare ``# TYPE x counter`` for a renamable wanted name x?"""
        if "counter" not in line or "TYPE" not in line:
            return False
        if '"' in line:  # quoted tokens: be conservative
            return any(n in line for n in self.renamable)
        parts = _COMMENT_SPLIT.split(line, maxsplit=3)
        return (len(parts) == 4 and parts[1] == "TYPE" and parts[3] == "counter"
                and parts[2] in self.renamable)

    def _parse_alone(self, line: str) -> list[RawSample]:
        return [s for s in _parse_line(line) if s[0] in self.names]

    def _labels_of(self, label_text: str | None) -> dict[str, str] | None:
        """The labels of a label text (none: no labels), remembered (bounded); None for a
        text outside the strict form (the parser decides) or with a repeated label name (it
        rejects that). Remembered texts are strict, so a cached one is a single line."""
        if not label_text:
            return _NO_LABELS
        labels = self._labels.get(label_text)
        if labels is not None:
            return labels
        if _LABEL_TEXT.fullmatch(label_text) is None:
            return None
        labels = dict(_PAIR.findall(label_text))
        if len(labels) != label_text.count('="'):
            return None
        if len(label_text) <= LABEL_CACHE_MAX_KEY:
            if len(self._labels) >= LABEL_CACHE_SIZE:
                self._labels.clear()
            self._labels[label_text] = labels
        return labels

    def _strict_sample(self, m: re.Match[str]) -> RawSample | None:
        head, name, label_text, value_text = m.groups()
        labels = self._labels_of(label_text)
        if labels is None:
            return None
        return name, labels, parse_value(value_text), head


def parse_value(text: str) -> float:
    """A strict value literal as the parser converts it: the strict form already checked
    the literal, so it is an integer unless it has a point, an exponent, Inf or NaN
    (prometheus_client: int() first, then float())."""
    if text.isdigit() or (text[0] in "+-" and text[1:].isdigit()):
        return int(text)
    return float(text)


def _parse_line(line: str) -> list[RawSample]:
    """One line through prometheus_client's parser (raises ValueError like it does)."""
    return [(s.name, s.labels, s.value, None)
            for fam in text_string_to_metric_families(line) for s in fam.samples]
