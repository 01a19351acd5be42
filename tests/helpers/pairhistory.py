"""The recorded real A/B pair (tests/fixtures/vllm-0.32-cpu-pair-k2) as a user's Prometheus
would hold it, and the parameters file `calibrate --point-sources pairs --reference` fits
from it.

Both sides' pages are fed to the real exporter on a clock set to each page's capture time
(its pair plug-in as tests/plugins/pairs/test_pairs_replay.py configures it); every exporter
page becomes OpenMetrics history ending a minute ago, which the real promtool backfills and
the real Prometheus serves. Used by tests/calibrate/test_calibrate_reference_pair.py;
`predicted_speedup` by tests/live/test_live_pair.py too.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import yaml
from promsim import backfill

from helpers.pageserver import fixture_pages
from helpers.paths import FIXTURES

FIXTURE = FIXTURES / "vllm-0.32-cpu-pair-k2"
ROOT = Path(__file__).resolve().parents[2]
EAGLE3 = ROOT / "examples" / "params" / "qwen3-32b-h100-eagle3.yaml"
#: The recording's phases (seconds from its first page; its README): 1, 2, 4, 8 clients,
#: 4 clients with 70% of requests at temperature 1, then 2 clients at temperature 0.
PHASES = ((0, 30), (30, 60), (60, 90), (90, 120), (120, 150), (150, 175))
BINS = [0, 10, 17, 22, 33, 100]
BANDS = [0, 0.25, 0.5, 0.75]
#: The bins a fit takes: 1, 4 and 8 clients (about 7, 25 and 42 req/s) at temperature 0.
TRAIN_BINS = ("0-10", "22-33", "33-100")


def _value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def exporter_history(tmp: Path) -> tuple[str, float, float]:
    """The exporter's pages after every poll of the recording, as OpenMetrics history
    ending a minute ago; with its first and last timestamps."""
    from specwatch.app.serve import ServeApp
    from specwatch.poll import config
    from specwatch.poll.pipeline import PollResult

    sd, base = fixture_pages(FIXTURE / "sd"), fixture_pages(FIXTURE / "base")
    # A whole number of seconds: a query grid falls on the same samples on every run.
    shift = math.floor(time.time() - 60 - sd[-1][0])
    path = tmp / "specwatch.yaml"
    path.write_text(yaml.safe_dump({
        "global": {"windows": ["10s", "1m"], "poll_interval": 2},
        "targets": [{"name": "sd", "url": "http://127.0.0.1:9/metrics"},
                    {"name": "base", "url": "http://127.0.0.1:9/metrics"}],
        "pairs": [{"name": "ab", "sd": "sd", "baseline": "base"}],
        "pair_options": {"window": "10s", "min_requests": 50, "arrival_rate_bins": BINS,
                         "acceptance_bands": BANDS}}))
    clock = {"t": 0.0}
    app = ServeApp(config.build_config(str(path), [], "127.0.0.1:0", None),
                   clock=lambda: clock["t"])
    series: dict[str, list[tuple[str, float, str]]] = {}
    for (t, text_sd), (_, text_base) in zip(sd, base, strict=True):
        clock["t"] = t
        app.pipeline.apply(PollResult("sd", t, t, 0.05, body=text_sd))
        app.pipeline.apply(PollResult("base", t, t, 0.05, body=text_base))
        for family in app.collector.collect():
            for s in family.samples:
                labels = {**s.labels, "job": "specwatch", "instance": "exporter:9090"}
                lab = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                series.setdefault(s.name, []).append((lab, t + shift, _value(s.value)))
    lines = []
    for name in sorted(series):
        lines.append(f"# TYPE {name} unknown")
        lines.extend(f"{name}{{{lab}}} {v} {ts:.3f}" for lab, ts, v in sorted(series[name]))
    lines.append("# EOF")
    return "\n".join(lines) + "\n", sd[0][0] + shift, sd[-1][0] + shift


def backfilled(tmp: Path) -> tuple[Path, float, float]:
    """The recording's exporter history backfilled into a TSDB under `tmp`."""
    text, start, end = exporter_history(tmp)
    tsdb = tmp / "tsdb"
    backfill(text, tsdb)
    return tsdb, start, end


def calibrate_args(prom: str, start: float, end: float, out: Path) -> list[str]:
    """`specwatch calibrate` from the pair points of the training bins, the shipped EAGLE-3
    file as the reference."""
    return ["calibrate", "--prometheus", prom, "--start", f"{start - 5:.0f}",
            "--end", f"{end + 5:.0f}", "--step", "2s", "--point-sources", "pairs",
            "--selector", f'arrival_rate_bin=~"{"|".join(TRAIN_BINS)}"',
            "--reference", str(EAGLE3), "--out", str(out), "--json"]


def predicted_speedup(capsys: Any, params: Path, sd: Any, base: Any) -> dict[str, Any]:
    """The speedup a pair measures, predicted by `specwatch predict --json`: each side's
    latency at its own measured arrival rate and lengths (a phase whose sides ended their
    answers at different lengths compares those, not one workload), the interval from the
    two latency intervals' corners, valid when both latencies are."""
    from specwatch.cli import main

    def latency(p: Any) -> dict[str, Any]:
        args = ["predict", "--params", str(params), "--arrival-rate", f"{p.arrival_rate:.4f}",
                "--draft-length", f"{p.draft_length:g}", "--prompt-tokens",
                f"{p.prompt_tokens:.2f}", "--generation-tokens", f"{p.generation_tokens:.2f}",
                "--json"]
        if p.draft_length > 0:
            args += ["--acceptance-length", f"{p.acceptance_length:.4f}"]
        main(args)
        return json.loads(capsys.readouterr().out)

    s, b = latency(sd), latency(base)
    lo_s, hi_s = s["latency_interval"] or (None, None)
    lo_b, hi_b = b["latency_interval"] or (None, None)
    valid = bool(s["valid"] and b["valid"] and hi_s and hi_b)
    return {"speedup": round(b["latency_sd_s"] / s["latency_sd_s"], 4),
            "lower": round(lo_b / hi_s, 4) if valid else None,
            "upper": round(hi_b / lo_s, 4) if valid else None,
            "valid": valid, "reasons": (s["validity_reasons"], b["validity_reasons"])}
