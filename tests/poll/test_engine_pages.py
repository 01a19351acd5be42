"""The constructed TensorRT-LLM and llama.cpp page sequences (tests/fixtures/engines-constructed/):
they are what build_engine_pages.py makes from the engines' definitions, Prometheus's parsers read
them, and they carry the traffic their README states (counters advancing, a restart)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from helpers.enginepages import PAGES, builder, sequence
from prometheus_client.parser import text_string_to_metric_families

ENGINES = ("trtllm", "llamacpp")


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, labels without pid) -> value, through prometheus_client's parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "pid"))
            out[(s.name, labels)] = s.value
    return out


def _sum(samples: dict, name: str, **labels: str) -> float | None:
    """Sum of a sample over the series carrying ``labels``; None when no series has it."""
    values = [v for (n, lab), v in samples.items()
              if n == name and all((k, v2) in lab for k, v2 in labels.items())]
    return sum(values) if values else None


def test_committed_pages_are_what_the_builder_makes():
    built = builder().pages()
    committed = {p.relative_to(PAGES).as_posix(): p.read_text()
                 for p in PAGES.rglob("snap_*.txt")}
    assert committed.keys() == built.keys()
    for rel, text in built.items():
        assert committed[rel] == text, f"regenerate {rel}: python build_engine_pages.py"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
@pytest.mark.parametrize("engine", ENGINES)
def test_promtool_parses_every_page(engine):
    """promtool reports only naming lint (llama.cpp's `llamacpp:` names carry a colon and
    its n_tokens_max is a counter without _total); no page has a format error."""
    for text in sequence(engine):
        proc = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                              capture_output=True, check=False)
        problems = [line for line in (proc.stdout + proc.stderr).splitlines() if line]
        lint = [p for p in problems if "should not contain ':'" in p
                or 'should have "_total" suffix' in p]
        assert problems == lint, problems


# Each engine's spec-decode counters: drafts (TensorRT-LLM: drafted tokens at position 0),
# draft tokens, accepted tokens.
COUNTERS = {
    "trtllm": ("trtllm_spec_decode_drafted_tokens_total",
               "trtllm_spec_decode_num_draft_tokens_total",
               "trtllm_spec_decode_num_accepted_tokens_total"),
    "llamacpp": ("llamacpp:spec_decode_num_drafts_total",
                 "llamacpp:spec_decode_num_draft_tokens_total",
                 "llamacpp:spec_decode_num_accepted_tokens_total"),
}
POSITION = {"trtllm": ("trtllm_spec_decode_accepted_tokens_total", "token_position"),
            "llamacpp": ("llamacpp:spec_decode_num_accepted_tokens_per_pos_total", "position")}
# Per README: acceptance rate, acceptance length, per-position share of the drafts.
EXPECTED = {"trtllm": (0.55, 2.65, (0.75, 0.55, 0.35)),
            "llamacpp": (0.55, 2.76, (0.75, 0.52, 0.32, 0.17))}


def _minute(engine: str, before: dict, after: dict) -> tuple[float, float, tuple[float, ...]]:
    drafts_name, tokens_name, accepted_name = COUNTERS[engine]
    first = {"token_position": "0"} if engine == "trtllm" else {}

    def delta(name: str, **labels: str) -> float:
        return (_sum(after, name, **labels) or 0.0) - (_sum(before, name, **labels) or 0.0)

    drafts = delta(drafts_name, **first)
    accepted = delta(accepted_name)
    pos_name, pos_label = POSITION[engine]
    k = len(EXPECTED[engine][2])
    per_pos = tuple(delta(pos_name, **{pos_label: str(i)}) / drafts for i in range(k))
    return accepted / delta(tokens_name), 1 + accepted / drafts, per_pos


@pytest.mark.parametrize("engine", ENGINES)
def test_a_minute_of_traffic_before_and_after_the_restart(engine):
    """Scrapes 1 -> 2 and 3 -> 4 each hold one minute of the README's traffic; the restart
    between 2 and 3 takes every counter back (below its value before, or off the page)."""
    s1, s2, s3, s4 = (_samples(t) for t in sequence(engine))
    rate, length, per_pos = EXPECTED[engine]
    for before, after in ((s1, s2), (s3, s4)):
        got = _minute(engine, before, after)
        assert got[0] == pytest.approx(rate)
        assert got[1] == pytest.approx(length)
        assert got[2] == pytest.approx(per_pos)
    for (name, labels), value in s2.items():
        if name.endswith(("_total", "_count", "_bucket", "_sum")) and value > 0:
            assert s3.get((name, labels), 0.0) < value, (name, labels)
    pos_name = POSITION[engine][0]
    assert _sum(s3, pos_name) is None, "per-position series appear with the first request"


def test_trtllm_states_its_draft_length_and_requests():
    s = _samples(sequence("trtllm")[1])
    info = [lab for (n, lab) in s if n == "trtllm_speculative_config_info"]
    assert [dict(lab)["spec_num_tokens"] for lab in info] == ["3"]
    finished = _sum(s, "trtllm_request_success_total")
    assert finished == _sum(s, "trtllm_e2e_request_latency_seconds_count") == 41 * 120


def test_llamacpp_has_no_request_counter_histogram_or_labels():
    """What llama-server cannot give: no finished requests, no histogram, no model label."""
    for text in sequence("llamacpp"):
        families = list(text_string_to_metric_families(text))
        assert {f.type for f in families} <= {"counter", "gauge"}
        assert not any("request" in f.name and f.type == "counter" for f in families)
        assert all(set(s.labels) <= {"position"} for f in families for s in f.samples)
