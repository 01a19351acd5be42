"""`calibrate --prometheus --point-sources pairs,switches` against a REAL Prometheus.

The exporter's measured-pair series (``sd_measured_*{side}``) and the controller's switch
records (``sd_switch_timestamp_seconds``, ``sd_switch_window_*{side}``) of a known system
(the latency model with tests/promsim.py's TRUE coefficients, ±0.5% seeded noise) are
rendered as a scrape history, backfilled with ``promtool tsdb create-blocks-from
openmetrics`` and served by the ``prometheus`` binary. The history has what a live one has:
each bin's series appears when its load comes, fills up, stays for the retention, and
vanishes; a bin that other traffic joins after its visit; a missed scrape inside a visit; a
sample whose draft length mixes two configurations; each switch record repeated at every
scrape until the next one. The same code path as the live test (tests/test_calibration_
pair_e2e.py, slow) in a few seconds: which points are taken, how they are counted, the fit.
"""

from __future__ import annotations

import json
import random
import time

import pytest
from promsim import ALPHA, TRUE, backfill, running_prometheus

from specwatch.calibrate import measured
from specwatch.calibrate.prometheus import PrometheusQuery
from specwatch.cli import main
from specwatch.model.acceptance import acceptance_length_from_alpha
from specwatch.model.closed_form import latency
from specwatch.model.params import load_params

MODEL = "qwen-pair"
SCRAPE = 15.0
#: (prompt, generation) -> loads (req/s). The short, prefill-heavy workload at high loads
#: is what separates a_p and b_p from the decode terms (docs/calibration.md).
LOADS = {(150.0, 200.0): (1.0, 4.0, 8.0), (1500.0, 16.0): (2.0, 12.0, 30.0)}
WORKLOADS = tuple(LOADS)
COEFFICIENTS = ("a_p", "a_v", "a_d", "b_p", "b_v", "b_d")


def figures(k: int, p: float, g: float, lam: float, rng: random.Random) -> dict[str, float]:
    """What the exporter shows for a steady stretch of (k, workload, load) of TRUE."""
    e = float(acceptance_length_from_alpha(ALPHA, k)) if k else 1.0
    lat = float(latency(TRUE, lam, k, e, p, g, max_utilization=1.0).latency)
    out = {"latency_seconds": lat * (1 + rng.uniform(-0.005, 0.005)), "arrival_rate": lam,
           "prompt_tokens": p, "generation_tokens": g}
    if k:
        out.update(draft_length=float(k), acceptance_length=e)
    return out


class History:
    """Samples per series, rendered as OpenMetrics (one family's samples together)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, list[tuple[float, float]]]] = {}

    def add(self, metric: str, labels: str, value: float, t: float) -> None:
        self.rows.setdefault(metric, {}).setdefault(labels, []).append((t, value))

    def text(self) -> str:
        lines = []
        for metric, series in self.rows.items():
            lines.append(f"# TYPE {metric} gauge")
            for labels, values in series.items():
                lines.extend(f"{metric}{{{labels}}} {v:.9g} {t:.3f}" for t, v in sorted(values))
        return "\n".join([*lines, "# EOF"]) + "\n"


PAIR_METRIC = {"latency_seconds": "sd_measured_latency_seconds",
               "arrival_rate": "sd_measured_side_arrival_rate",
               "prompt_tokens": "sd_measured_prompt_tokens",
               "generation_tokens": "sd_measured_generation_tokens",
               "draft_length": "sd_measured_draft_length",
               "acceptance_length": "sd_measured_acceptance_length"}


def pair_visit(h: History, t0: float, side: str, bin_: str, fig: dict[str, float],
               *, skip: tuple[int, ...] = (), then: dict[str, float] | None = None) -> float:
    """One visit of a bin by one side: 8 scrapes filling up (60 requests each), 6 at the
    full count; `skip`: scrapes that missed; `then`: another load's windows joining the
    bin afterwards (4 more scrapes with these figures). Returns the time after the visit."""
    labels = (f'pair="ab",target="sd",model_name="{MODEL}",arrival_rate_bin="{bin_}",'
              f'side="{side}"')
    stages = [(fig, 60.0 * min(i + 1, 8)) for i in range(14)]
    if then is not None:
        stages += [(then, 480.0 + 60.0 * (i + 1)) for i in range(4)]
    for i, (f, count) in enumerate(stages):
        if i in skip:
            continue
        t = t0 + i * SCRAPE
        for name, value in f.items():
            h.add(PAIR_METRIC[name], labels, value, t)
        h.add("sd_measured_requests", labels, count, t)
    # Then absent (the bin aged out). A backfilled history has no staleness markers, so a
    # query still sees the last sample for Prometheus's 5 minute lookback: 40 scrapes.
    return t0 + (len(stages) + 40) * SCRAPE


def switch_record(h: History, t0: float, until: float, action: str,
                  before: dict[str, float], after: dict[str, float]) -> None:
    """A completed before/after record, exposed at every scrape until the next one."""
    key = f'target="sd",model_name="{MODEL}",action="{action}"'
    t = t0
    while t < until:
        h.add("sd_switch_timestamp_seconds", key, t0 - 300.0, t)
        for side, fig in (("before", before), ("after", after)):
            for name, value in fig.items():
                h.add(f"sd_switch_window_{name}", f'{key},side="{side}"', value, t)
        t += SCRAPE


def bins(lam: float) -> str:
    """One bin per load (the labels are the exporter's business; calibration keys on them)."""
    return f"{lam:g}-{lam * 1.5:g}"


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    """(url, start, end) of a Prometheus holding the pair and switch history."""
    rng = random.Random(16)
    h = History()
    end = time.time() - 600
    start = t = float(int(end - 6 * 3600))
    # SD side at k = 2, then (after a restart) k = 4; the baseline visits every bin once
    # per SD configuration. Two workloads, three loads.
    for k in (2, 4):
        for p, g in WORKLOADS:
            for i, lam in enumerate(LOADS[(p, g)]):
                sd = figures(k, p, g, lam, rng)
                base = figures(0, p, g, lam, rng)
                # After the first visit of each epoch, traffic of the next load joins the
                # bin (the passage to the next level): not a point of its own.
                joined = figures(k, p, g, LOADS[(p, g)][1], rng) | {"generation_tokens": g * 1.3} \
                    if i == 0 else None
                pair_visit(h, t, "baseline", bins(lam), base, skip=(9, 10) if i == 1 else ())
                t = pair_visit(h, t, "sd", bins(lam), sd, then=joined)
    # A bin mixing two draft lengths (an exporter without the per-side reset): skipped.
    pair_visit(h, t, "sd", bins(1.0), figures(2, *WORKLOADS[0], 1.0, rng)
               | {"draft_length": 3.4})
    # Two switch records: SD off at 4 req/s (k = 2 before), back on at k = 4 at 8 req/s.
    p, g = WORKLOADS[0]
    t1 = t + 20 * SCRAPE
    t2 = t1 + 40 * SCRAPE
    switch_record(h, t1, t2, "disable", figures(2, p, g, 4.0, rng),
                  figures(0, p, g, 4.0, rng))
    switch_record(h, t2, t2 + 40 * SCRAPE, "enable", figures(0, *WORKLOADS[1], 8.0, rng),
                  figures(4, *WORKLOADS[1], 8.0, rng))
    assert t2 + 40 * SCRAPE < end
    work = tmp_path_factory.mktemp("prom-measured")
    backfill(h.text(), work / "tsdb")
    with running_prometheus(work / "tsdb", work) as url:
        yield url, start, end


def calibrate(prom, *extra: str) -> list[str]:
    url, start, end = prom
    return ["calibrate", "--prometheus", url, "--start", f"{start:.0f}", "--end",
            f"{end:.0f}", "--step", "15s", *extra]


def test_pairs_and_switches_recover_the_coefficients(prom, tmp_path, capsys):
    """24 pair visits (12 SD, 12 baseline) and 2 switch records (4 points) are taken, each
    once; nothing of the joined bins or the mixed bin; the six coefficients within 5% of
    the truth (the latencies carry ±0.5% noise, which moves a_p by about 3%)."""
    out = tmp_path / "params.yaml"
    rc = main(calibrate(prom, "--point-sources", "pairs,switches", "--model", "linear",
                        "--json", "--out", str(out)))
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert doc["point_sources"] == {MODEL: {"pairs": 24, "switches": 4}}
    assert doc["systems"][MODEL]["mode"] == "six-coefficient"
    fitted = load_params(str(out)).model()
    errors = {n: getattr(fitted, n) / getattr(TRUE, n) - 1 for n in COEFFICIENTS}
    print({n: f"{e:+.2%}" for n, e in errors.items()})
    assert all(abs(e) < 0.05 for e in errors.values()), errors


def test_the_text_report_says_where_points_came_from(prom, capsys):
    rc = main(calibrate(prom, "--point-sources", "switches,pairs", "--model", "linear"))
    text = capsys.readouterr().out
    assert rc == 0
    assert f"points of {MODEL}: 24 from pairs, 4 from switches" in text


def test_each_pair_point_is_a_visit_at_its_fullest(prom):
    """Every point is a steady (k, workload, load) of TRUE: its figures are the visit's,
    never the joined mixture's (generation 1.3x) nor the 3.4 mixed draft length."""
    url, start, end = prom
    points = measured.read_pair_points(PrometheusQuery(url, start, end, 15.0))
    assert len(points) == 24
    seen = set()
    for p in points:
        assert p.draft_length in (0.0, 2.0, 4.0)
        assert (p.prompt_tokens, p.generation_tokens) in WORKLOADS
        assert p.arrival_rate in LOADS[(p.prompt_tokens, p.generation_tokens)]
        e = float(acceptance_length_from_alpha(ALPHA, int(p.draft_length))) \
            if p.draft_length else 1.0
        want = float(latency(TRUE, p.arrival_rate, p.draft_length, e, p.prompt_tokens,
                             p.generation_tokens, max_utilization=1.0).latency)
        assert p.latency_s == pytest.approx(want, rel=0.006)
        seen.add((p.source.split()[2], p.draft_length, p.generation_tokens, p.arrival_rate))
    assert len(seen) == 18  # the baseline's visits repeat in the second epoch


@pytest.mark.parametrize("sources, selector, message", [
    ("switches", 'target="nope"', "no complete switch record"),
    ("pairs", 'pair="nope"', "no measured-pair series"),
])
def test_missing_series_is_one_clear_error_and_nothing_is_written(
        prom, tmp_path, capsys, sources, selector, message):
    out = tmp_path / "params.yaml"
    rc = main(calibrate(prom, "--point-sources", sources, "--selector", selector,
                        "--out", str(out)))
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and "nothing was written" in err
    assert "Traceback" not in err
    assert not out.exists()


def test_unknown_point_source_is_refused(prom, capsys):
    assert main(calibrate(prom, "--point-sources", "pairs,bench")) == 2
    assert "vllm, pairs, switches" in capsys.readouterr().err


def test_visits_end_at_a_gap_and_skip_mixtures():
    """Unit view of the rules: a short gap (missed scrapes) keeps one visit, a long one
    starts the next; after a workload change the rest of the presence is not a visit."""
    step = 15.0
    ts = [i * step for i in range(6)] + [9 * step, 10 * step] + [30 * step, 31 * step]
    g = dict.fromkeys(ts, 200.0)
    g[5 * step] = 150.0  # another workload joined: this and the rest of the presence go
    fields = {"latency_s": dict.fromkeys(ts, 1.0), "arrival_rate": dict.fromkeys(ts, 2.0),
              "generation_tokens": g}
    assert measured.visits(fields, step) == [[0.0, 15.0, 30.0, 45.0, 60.0], [450.0, 465.0]]
