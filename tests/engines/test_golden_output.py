"""The exporter's output on every recorded page sequence is byte-identical to its golden copy.

Protected behaviour: what specwatch derives from the real vLLM 0.32 recordings
(``vllm-0.32-cpu-ngram``, both sides of ``vllm-0.32-cpu-pair-k2``) and from the constructed
vLLM v1, vLLM v0 and SGLang pages does not change when code moves: the exposition bytes after
every poll, and what the controller and the pairs read from each model's snapshot (engine
kind, configured k, gauges, SD-families flag, window histograms). Each page sequence goes
through the real pipeline (parse, history, derive) and the real collector, once per engine
setting that accepts it. A constructed page is one page; it is preceded by the same page with
every cumulative value halved, so its windows have increases to derive from.

The golden file (``tests/fixtures/golden/exposition.json``) holds, per sequence, the
SHA-256 of each poll's exposition and snapshot summary, and the last exposition in full (a
failure shows which poll changed first and the last page's text diff). It is rewritten only
on purpose: ``SPECWATCH_UPDATE_GOLDEN=1 pytest tests/engines/test_golden_output.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
from helpers.paths import FIXTURES

from specwatch.expose.collector import SpecwatchCollector
from specwatch.poll.pipeline import Pipeline, PollResult
from specwatch.poll.snapshot import Snapshot
from specwatch.poll.windows import derive

GOLDEN = FIXTURES / "golden" / "exposition.json"
POLL_INTERVAL = 2.0
_CUMULATIVE = re.compile(r"^(?P<head>[^#\s][^ ]*?(?:_total|_count|_sum|_bucket)(?:\{[^}]*\})?) "
                         r"(?P<value>\S+)$", re.MULTILINE)


def _recorded(folder: Path) -> list[tuple[float, str]]:
    pages = sorted(folder.glob("snap_*.prom"), key=lambda p: int(p.stem.split("_")[1]))
    return [(int(p.stem.split("_")[1]) / 1000.0, p.read_text()) for p in pages]


def _halved(text: str) -> str:
    return _CUMULATIVE.sub(lambda m: f"{m['head']} {float(m['value']) / 2!r}", text)


def _constructed(name: str) -> list[tuple[float, str]]:
    text = (FIXTURES / "constructed" / name).read_text()
    return [(1000.0, _halved(text)), (1060.0, text)]


#: sequence id -> (pages, the engine settings that read it)
SEQUENCES: dict[str, tuple[list[tuple[float, str]], tuple[str, ...]]] = {
    "vllm-0.32-cpu-ngram": (_recorded(FIXTURES / "vllm-0.32-cpu-ngram"), ("auto", "vllm")),
    "vllm-0.32-cpu-pair-k2/sd": (_recorded(FIXTURES / "vllm-0.32-cpu-pair-k2" / "sd"),
                                 ("auto", "vllm")),
    "vllm-0.32-cpu-pair-k2/base": (_recorded(FIXTURES / "vllm-0.32-cpu-pair-k2" / "base"),
                                   ("auto",)),
    "vllm-0.33-spec-decode": (_constructed("vllm-0.33-spec-decode.prom"), ("auto", "vllm")),
    "vllm-0.33-multi-engine": (_constructed("vllm-0.33-multi-engine.prom"), ("auto",)),
    "vllm-0.33-multi-model": (_constructed("vllm-0.33-multi-model.prom"), ("auto",)),
    "vllm-0.9-v0-spec-decode": (_constructed("vllm-0.9-v0-spec-decode.prom"), ("auto", "vllm")),
    "sglang-0.5.23-spec": (_constructed("sglang-0.5.23-spec.prom"), ("auto", "sglang")),
}


def _summary(snap: Snapshot) -> str:
    """What plug-ins read from each model beyond the exposition, as canonical JSON."""
    out = {}
    for target, t in snap.targets.items():
        for name, m in t.models.items():
            out[f"{target}/{name}"] = {
                "engine": m.engine, "configured_k": m.configured_k,
                "sd_families_present": m.sd_families_present,
                "gauges": {k: repr(v) for k, v in sorted(m.gauges.items())},
                "histograms": {w.window: {h: [[repr(b), repr(c)] for b, c in buckets]
                                          for h, buckets in sorted(w.histograms.items())}
                               for w in m.windows},
            }
    return json.dumps(out, sort_keys=True)


def run(pages: list[tuple[float, str]], engine: str) -> dict[str, object]:
    """Every poll's exposition and summary digests, and the last exposition."""
    pipeline = Pipeline([("t", engine)], derive.DeriveConfig(), POLL_INTERVAL)
    collector = SpecwatchCollector(lambda: pipeline.snapshot)
    steps: list[str] = []
    last = b""
    for t, text in pages:
        pipeline.apply(PollResult("t", t, t, 0.01, body=text))
        snap = pipeline.snapshot
        last = collector.exposition(snap, openmetrics=False)
        digest = hashlib.sha256(last)
        digest.update(_summary(snap).encode())
        steps.append(digest.hexdigest()[:16])
    return {"steps": steps, "last": last.decode()}


CASES = [(seq, engine) for seq, (_, engines) in SEQUENCES.items() for engine in engines]


@pytest.mark.parametrize(("sequence", "engine"), CASES, ids=[f"{s}-{e}" for s, e in CASES])
def test_output_equals_the_golden_copy(sequence: str, engine: str) -> None:
    got = run(SEQUENCES[sequence][0], engine)
    key = f"{sequence} engine={engine}"
    if os.environ.get("SPECWATCH_UPDATE_GOLDEN") == "1":
        golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        golden[key] = got
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())[key]
    changed = next((i for i, (a, b) in enumerate(zip(got["steps"], want["steps"], strict=True))
                    if a != b), None)
    assert changed is None, f"{key}: the output first differs after poll {changed}"
    assert got["last"] == want["last"]


def test_every_recorded_sequence_is_covered() -> None:
    """A recorded vLLM page sequence added to the fixtures gets a golden copy too."""
    recorded = {str(p.parent.relative_to(FIXTURES)) for p in FIXTURES.glob("vllm-*/**/snap_*.prom")}
    assert recorded <= set(SEQUENCES)
