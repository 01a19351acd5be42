"""A real A/B pair replayed through the exporter: two real vLLM 0.32 CPU servers fed the
same requests (tests/fixtures/vllm-0.32-cpu-pair-k2/: n-gram SD at k = 2, and no SD).

Both sides' recorded pages are served by local HTTP servers; the exporter (real config,
poller, HTTP, parse, history, derive, pair tracker, its own /metrics) polls them on a clock
set to each page's capture time, so the replay takes seconds. At the end its /metrics is
read as a user reads it and checked against the pages' own counters, computed here by
separate code (no specwatch import in the expectation path):

* every phase of the recording has its bin (arrival rate x acceptance band) at the end;
* each bin's mean ratio is within 10% of the truth: baseline mean e2e latency / SD mean e2e
  latency over the phases that fall in that bin (their steady part, the first 10 s of a
  phase dropped: it holds requests started under the previous load);
* the phase at temperature 1 (acceptance falls to about 0.1) is below 1, and so is the
  upper end of its 90% interval; every interval holds its point;
* no quantile ratio is exposed where the two sides' quantiles sit in one bucket: here
  every e2e median is inside vLLM's first bucket (0-0.3 s), so no e2e p50 ratio at all.

What only real pages show, and the simulator pair never did: the effective draft length
(1.84-1.95) is below the configured k and moves; both sides' latencies sit inside one
wide bucket; the first window of a phase straddles two loads.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers.pageserver import Page, PageSequenceServer, fixture_pages
from helpers.pairtruth import counters, median_bucket
from helpers.pairtruth import truth as pair_truth
from helpers.paths import FIXTURES
from helpers.scrape import scrape, select

from specwatch.app import settings as app_settings
from specwatch.app.serve import ServeApp

REPO = Path(__file__).resolve().parents[3]
FIXTURE = FIXTURES / "vllm-0.32-cpu-pair-k2"
#: The recording's phases (seconds from its first page; its README): 1, 2, 4, 8 clients,
#: 4 clients with 70% of requests at temperature 1, then 2 clients at temperature 0.
PHASES = ((0, 30), (30, 60), (60, 90), (90, 120), (120, 150), (150, 175))
SETTLE_S = 10.0  # a phase's first seconds hold requests of the previous one
BINS = [0, 10, 17, 22, 33, 100]  # req/s: a bin per load (the last phase shares the second's)
BANDS = [0, 0.25, 0.5, 0.75]
WINDOW = "10s"



class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def truth() -> dict[tuple[str, str], dict[str, float]]:
    """Per bin: the pooled counter increases of its phases' steady parts, from the pages."""
    sides = {s: [(t, counters(text)) for t, text in fixture_pages(FIXTURE / s)]
             for s in ("sd", "base")}
    t0 = sides["sd"][0][0]
    return pair_truth(sides, [(t0 + a, t0 + b) for a, b in PHASES], SETTLE_S, BINS, BANDS)


def replay(tmp_path: Path, keep: float | None = None) -> dict:
    """The exporter's /metrics after the whole recording (key ``"end"``) and, with
    ``keep`` (seconds from the first page), after the last poll before then (``"keep"``)."""
    kept: dict = {}
    sd = fixture_pages(FIXTURE / "sd")
    base = fixture_pages(FIXTURE / "base")
    assert [t for t, _ in sd] == [t for t, _ in base], "both sides recorded at once"
    with PageSequenceServer([Page(x) for _, x in sd]) as s1, \
            PageSequenceServer([Page(x) for _, x in base]) as s2:
        path = tmp_path / "specwatch.yaml"
        path.write_text(yaml.safe_dump({
            "global": {"windows": [WINDOW, "1m"], "poll_interval": 2},
            "targets": [{"name": "sd", "url": s1.url}, {"name": "base", "url": s2.url}],
            "pairs": [{"name": "ab", "sd": "sd", "baseline": "base"}],
            "pair_options": {"window": WINDOW, "min_requests": 50, "arrival_rate_bins": BINS,
                             "acceptance_bands": BANDS}}))
        cfg = app_settings.build_config(str(path), [], "127.0.0.1:0", None)
        clock = Clock()
        app = ServeApp(cfg, clock=clock)
        app.start(poll=False)
        try:
            host, port = app.web.address
            for i, (t, _) in enumerate(sd):
                s1.set_step(i)
                s2.set_step(i)
                clock.t = t
                assert app.poller.poll_now("sd").error_reason is None
                assert app.poller.poll_now("base").error_reason is None
                nxt = sd[i + 1][0] if i + 1 < len(sd) else math.inf
                if keep is not None and t <= sd[0][0] + keep < nxt:
                    kept["keep"] = scrape(f"http://{host}:{port}/metrics")
            kept["end"] = scrape(f"http://{host}:{port}/metrics")
            return kept
        finally:
            app.stop()


def test_real_pair_replay_measures_every_phase(tmp_path):
    want = truth()
    got = replay(tmp_path)["end"]
    # The recording's own story, from its pages: five bins (the last phase is the second's
    # load and regime), one of them at low acceptance where SD is slower.
    assert len(want) == 5
    slow = [k for k, v in want.items() if v["acceptance"] < 0.25]
    assert len(slow) == 1 and want[slow[0]]["speedup"] < 1
    figures = []
    for (bin_, band), w in sorted(want.items()):
        labels = {"pair": "ab", "arrival_rate_bin": bin_, "acceptance_band": band}
        mean = select(got, "sd_measured_speedup", statistic="mean", **labels)
        assert len(mean) == 1, f"bin {bin_} / {band}: no measured speedup at the end"
        measured = next(iter(mean.values()))
        lo = next(iter(select(got, "sd_measured_speedup_lower", statistic="mean",
                              **labels).values()))
        hi = next(iter(select(got, "sd_measured_speedup_upper", statistic="mean",
                              **labels).values()))
        figures.append(f"{bin_} req/s, acceptance {band}: measured {measured:.3f}, truth "
                       f"{w['speedup']:.3f}, 90% interval [{lo:.3f}, {hi:.3f}]")
        assert measured == pytest.approx(w["speedup"], rel=0.10), figures[-1]
        assert lo < measured < hi
        if (bin_, band) in slow:
            assert measured < 1 and hi < 1, figures[-1]
        # Both sides' e2e medians are inside one bucket (the pages say which): no p50.
        assert median_bucket(w, "sd") == median_bucket(w, "base") == 0.3
        assert not select(got, "sd_measured_speedup", statistic="p50", **labels)
    print("\n".join(figures))
    # The pair ends at the second phase's load and regime: the current bin is that one.
    current = select(got, "sd_pair_current_arrival_rate_bin", pair="ab")
    assert [(dict(k[1])["arrival_rate_bin"], dict(k[1])["acceptance_band"])
            for k in current] == [("10-17", "0.75-1")]


#: The dashboard's speedup-vs-arrival-rate chart: its measured-pair points (ref H).
OVERLAY = ("Predicted speedup against arrival rate, now", "H")
DASH_VARIABLES = {"job": ".+", "target": ".+", "model_name": ".+"}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_the_chart_draws_only_the_current_regime(tmp_path):
    """After the acceptance step the chart's measured points are those of the new regime
    only, and after the step back those of the old one: the dashboard's own query,
    evaluated by Prometheus's engine (promtool) on the exporter's series at the end of the
    temperature-1 phase and at the end of the recording."""
    got = replay(tmp_path, keep=PHASES[4][1] - 1.0)
    dashboard = json.loads((REPO / "dashboards" / "specwatch-sd-overview.json").read_text())
    expr = next(t["expr"] for p in _panels(dashboard) if p.get("title") == OVERLAY[0]
                for t in p.get("targets", []) if t.get("refId") == OVERLAY[1])
    for name, value in DASH_VARIABLES.items():
        expr = expr.replace(f"${name}", value)
    moments = [got["keep"], got["end"]]
    names = ("sd_measured_speedup", "sd_pair_current_arrival_rate_bin")
    keys = sorted({k for m in moments for k in m if k[0] in names}, key=str)
    series = []
    for name, labels in keys:
        values = [m.get((name, labels)) for m in moments]
        text = " ".join("_" if v is None else repr(v) for v in values)
        if values[0] is not None and values[1] is None:
            text = f"{values[0]!r} stale"
        lab = ", ".join(f'{k}="{v}"' for k, v in sorted(
            {**dict(labels), "job": "specwatch", "instance": "x"}.items()))
        series.append({"series": f"{name}{{{lab}}}", "values": text})
    expected = []
    for m in moments:
        current = {(dict(lb)["pair"], dict(lb)["acceptance_band"])
                   for (n, lb) in m if n == "sd_pair_current_arrival_rate_bin"}
        expected.append({
            dict(lb)["arrival_rate_bin"]: v for (n, lb), v in m.items()
            if n == "sd_measured_speedup" and dict(lb)["statistic"] == "mean"
            and (dict(lb)["pair"], dict(lb)["acceptance_band"]) in current})
    # The regime of each moment, from the recording: the slow bin alone in the first, the
    # four bins at temperature 0 in the second.
    assert set(expected[0]) == {"17-22"}
    assert set(expected[1]) == {"0-10", "10-17", "22-33", "33-100"}
    tests = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [
            {"expr": expr, "eval_time": f"{i}m", "exp_samples": [
                {"labels": f'{{arrival_rate_bin="{b}", model_name="pair-model", '
                           f'target="sd"}}', "value": v} for b, v in sorted(exp.items())]}
            for i, exp in enumerate(expected)]}]}
    path = tmp_path / "overlay-test.yaml"
    path.write_text(yaml.safe_dump(tests, width=1000))
    run = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def _panels(dashboard: dict):
    for p in dashboard.get("panels", []):
        yield p
        yield from p.get("panels", [])
