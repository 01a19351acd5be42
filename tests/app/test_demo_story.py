"""`specwatch demo`, as a user runs it (default speed, real Prometheus, the mixin's rules),
tells its whole story: every alert it is about goes pending, fires once its condition has
held for its `for` (in scenario time) and resolves, and the dashboards' own queries agree
with each other on that Prometheus.

One run of the packaged demo scenario (75 scenario minutes, under 4 wall minutes at the
default speed) feeds every test here; the dashboards' queries are read from the generated
JSON with Grafana's variables set as a user's Grafana on the demo's 1 s scrape interval
would set them. Times are reported in scenario time: (wall − the simulator's start) × speed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import shutil
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from mixin_helpers import alert_signals, load_dashboards, panels, selectors

from specwatch.app import demo as demo_app
from specwatch.cli import demo as demo_cli
from specwatch.common.schema import parse_duration
from specwatch.mixin import render as mixin_render

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("prometheus") is None,
                       reason="needs Debian's prometheus (make setup installs it)"),
]

#: Scenario seconds after the story's end (75 min) that the run goes on, so that alerts of
#: the last phase resolve and the 5m windows of the end are complete.
TAIL_S = 120.0
#: Prometheus' evaluation interval in the demo is 1 wall second: times read from it are
#: this coarse (in scenario seconds: × speed).
EVAL_S = 1.0
#: The alerts of the demo's story and the phase each one fires in.
STORY = {
    "SDPredictedSpeedupLow": "peak",
    "SDArrivalRateAboveBreakeven": "peak",
    "SDMeasuredSlowdown": "peak",
    "SDAcceptanceRateLow": "acceptance-drop",
}
ALERT_FOR = {"SDPredictedSpeedupLow": "15m", "SDArrivalRateAboveBreakeven": "15m",
             "SDMeasuredSlowdown": "30m", "SDAcceptanceRateLow": "10m"}


@dataclass
class Run:
    prom: str
    wall0: float
    speed: float
    start: float  # wall
    end: float  # wall
    phases: list[tuple[str, float, float]]  # (name, start, end) in scenario seconds

    def scenario_t(self, wall: float) -> float:
        return (wall - self.wall0) * self.speed

    def phase_at(self, t: float) -> str:
        for name, lo, hi in self.phases:
            if lo <= t < hi:
                return name
        return "after"

    def query_range(self, expr: str, step: float = EVAL_S) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"query": expr, "start": self.start, "end": self.end,
                                    "step": f"{step:g}"})
        with urllib.request.urlopen(f"{self.prom}/api/v1/query_range?{q}", timeout=60) as r:
            body = json.loads(r.read().decode())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def query_at(self, expr: str, wall: float) -> list[dict[str, Any]]:
        """An instant query at ``wall`` (Unix seconds), as a panel's instant query runs."""
        q = urllib.parse.urlencode({"query": expr, "time": wall})
        with urllib.request.urlopen(f"{self.prom}/api/v1/query?{q}", timeout=60) as r:
            body = json.loads(r.read().decode())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def series(self, expr: str) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        """(labels, [(scenario time, value)]) of a range query over the whole run."""
        return [(r["metric"], [(self.scenario_t(float(ts)), float(v)) for ts, v in r["values"]])
                for r in self.query_range(expr)]


@pytest.fixture(scope="module")
def run() -> Iterator[Run]:
    parser = argparse.ArgumentParser()
    demo_cli.add_arguments(parser)
    # The user's command, `specwatch demo`, on free ports.
    args = parser.parse_args(["--exporter-listen", "127.0.0.1:0"])
    assert args.speed == demo_app.DEFAULT_SPEED
    d = demo_app.Demo(args)
    try:
        d.start()
        assert d.prometheus_url, d.prometheus_note
        model = d.scenario.models[0]
        phases, t = [], 0.0
        for ph in model.phases:
            phases.append((ph.name, t, t + ph.duration_s))
            t += ph.duration_s
        story_end = t
        start = time.time()
        assert story_end / args.speed < 300.0, "the story must play in under 5 minutes"
        while d.simulator.sim_time_now() < story_end + TAIL_S:
            time.sleep(1.0)
        time.sleep(2 * EVAL_S)
        yield Run(d.prometheus_url.rstrip("/"), d.simulator.wall0, args.speed, start,
                  time.time(), phases)
    finally:
        d.stop()


# --------------------------------------------------------------------------- the alerts


def alert_timeline(run: Run) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """alert -> state -> [(from, to)] intervals in scenario seconds (each series' own
    intervals, then all of an alert's series together, in order)."""
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    step = EVAL_S * run.speed
    for labels, values in run.series('ALERTS{alertname=~"SD.+"}'):
        spans: list[tuple[float, float]] = []
        for t, _ in values:
            if spans and t - spans[-1][1] <= 1.5 * step:
                spans[-1] = (spans[-1][0], t)
            else:
                spans.append((t, t))
        out.setdefault(labels["alertname"], {}).setdefault(labels["alertstate"], []).extend(
            spans)
    for states in out.values():
        for spans in states.values():
            spans.sort()
    return out


def _mmss(t: float) -> str:
    return f"{int(t // 60)}:{int(t % 60):02d}"


def test_every_alert_of_the_story_fires_after_its_for_and_resolves(run: Run) -> None:
    timeline = alert_timeline(run)
    step = EVAL_S * run.speed
    lines = []
    for name, states in sorted(timeline.items()):
        for state, spans in sorted(states.items()):
            lines.append(f"  {name:28s} {state:8s} " + ", ".join(
                f"{_mmss(a)}-{_mmss(b)} ({run.phase_at(a)})" for a, b in spans))
    print("\nalert timeline (scenario time, m:ss):\n" + "\n".join(lines))
    for name, phase in STORY.items():
        states = timeline.get(name, {})
        assert states.get("firing"), f"{name} never fired: {states}"
        firing = states["firing"][0]
        # The pending stretch that led to it (an earlier blip of another label set, such as
        # a pair's neighbouring arrival-rate bin, is not its start).
        pending = max((s for s in states["pending"] if s[0] <= firing[0]), key=lambda s: s[0])
        assert run.phase_at(firing[0]) == phase, (name, _mmss(firing[0]))
        # Firing comes once the condition held for the whole `for` (pending from its start),
        # within a few evaluation intervals.
        held = firing[0] - pending[0]
        need = parse_duration(ALERT_FOR[name])
        assert need - 2 * step <= held <= need + 3 * step, (name, held, need)
        # ... and resolves before the run ends.
        assert firing[1] < run.scenario_t(run.end) - 3 * step, (name, _mmss(firing[1]))


# --------------------------------------------------------------------------- "now" panels

SD_DASHBOARD = "specwatch-sd-overview.json"


def _firing_spans(run: Run) -> dict[str, list[tuple[float, float]]]:
    return {name: states.get("firing", []) for name, states in alert_timeline(run).items()}


def test_alert_list_shows_only_firing_alerts_at_every_minute(run: Run) -> None:
    """"Firing specwatch alerts", its own query at the current time, minute by minute over
    the story: every alert it shows is firing then (within one evaluation), and every
    alert firing then is shown. As a range query reduced to its last value it showed 3
    firing at minute 56 and 4 at 70-75, when none were."""
    p = panel(SD_DASHBOARD, "Firing specwatch alerts")
    [target] = p["targets"]
    assert target.get("instant") is True
    expr = substitute(target["expr"], grafana_vars(run, SD_DASHBOARD))
    spans, step = _firing_spans(run), EVAL_S * run.speed
    first = math.ceil(run.scenario_t(run.start) / 60) + 1
    shown_minutes = 0
    for minute in range(first, int(run.scenario_t(run.end) // 60)):
        t = minute * 60.0
        shown = {r["metric"]["alertname"]: float(r["value"][1])
                 for r in run.query_at(expr, run.wall0 + t / run.speed)}
        for name in shown:
            assert any(a - step <= t <= b + step for a, b in spans.get(name, [])), (
                f"minute {minute}: the panel shows {name} firing, which is not")
        for name, ss in spans.items():
            if any(a + step < t < b - step for a, b in ss):
                assert name in shown, f"minute {minute}: {name} is firing, the panel misses it"
        shown_minutes += bool(shown)
    print(f"alert list: alerts shown in {shown_minutes} of the story's minutes")
    assert shown_minutes > 0


def _story_stats() -> list[tuple[str, Any]]:
    """(stat panel title, signal) for every stat of the SD overview that shows the signal
    of an alert of the story (the mapping of tests/mixin/test_dashboard_decisions.py)."""
    out = []
    for p in panels(load_dashboards()[SD_DASHBOARD]):
        if p["type"] != "stat":
            continue
        read = {n.name for t in p["targets"] for n in selectors(t["expr"])}
        out += [(p["title"], s) for s in alert_signals() if s.alert in STORY and s.metric in read]
    return out


@pytest.mark.parametrize(("title", "signal"), _story_stats(),
                         ids=[f"{t}-{s.alert}" for t, s in _story_stats()])
def test_alert_backed_stat_crosses_its_threshold_when_its_alert_goes_pending(
        run: Run, title: str, signal: Any) -> None:
    """The stat's own query crosses its alert's threshold within one evaluation of the
    alert going pending (the pending stretch that led to its first firing)."""
    p = panel(SD_DASHBOARD, title)
    [target] = [t for t in p["targets"] if signal.metric in {n.name for n in selectors(t["expr"])}]
    series = run.series(substitute(target["expr"], grafana_vars(run, SD_DASHBOARD)))
    states = alert_timeline(run)[signal.alert]
    firing = states["firing"][0]
    pending = max((s for s in states["pending"] if s[0] <= firing[0]), key=lambda s: s[0])[0]
    crossed = {"<": lambda v: v < signal.threshold, ">": lambda v: v > signal.threshold}[signal.op]
    # The start of the stretch in which the stat is across the threshold at `pending`.
    starts = []
    for _labels, values in series:
        start = None
        for t, v in values:
            if t > pending + 1.5 * EVAL_S * run.speed:
                break
            start = (start if start is not None else t) if crossed(v) else None
        if start is not None:
            starts.append(start)
    assert starts, f"{title} is not across {signal.threshold} when {signal.alert} goes pending"
    lag = pending - min(starts)
    print(f"{title}: crosses {signal.threshold} at {_mmss(min(starts))}, {signal.alert} "
          f"pending at {_mmss(pending)} ({lag:+.0f} s)")
    assert abs(lag) <= 1.5 * EVAL_S * run.speed, (title, signal.alert, lag)


# --------------------------------------------------------------------------- time base


_REGEX_SPECIAL = re.compile(r"([$^*{}\[\]'+?.()|\\])")
_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.*),\s*(?P<label>[a-zA-Z_]\w*)\)$")


def _regex_escape(value: str) -> str:
    """A label value as Grafana escapes it in a multi-value regex (in a PromQL string)."""
    return _REGEX_SPECIAL.sub(r"\\\\\1", value)


def grafana_vars(run: Run, dashboard: str) -> dict[str, str]:
    """The dashboard's variables as a user's Grafana sets them by default on the demo:
    each query variable at All (its allValue, or the regex of the values its label_values()
    query finds over the run), each custom variable at its default, and $__rate_interval for
    the demo's 1 s scrape interval (4 x the scrape interval)."""
    out = {"__rate_interval": "4s"}
    for v in load_dashboards()[dashboard]["templating"]["list"]:
        if v["type"] == "datasource":
            out[v["name"]] = "prometheus"
        elif v["type"] == "custom":
            out[v["name"]] = v["current"]["value"]
        elif v["type"] == "query":
            m = _LABEL_VALUES.match(v["query"])
            assert m, v["query"]
            values = label_values(run, substitute(m.group("selector"), out), m.group("label"))
            assert values, (dashboard, v["name"])
            out[v["name"]] = v.get("allValue") or \
                "(" + "|".join(_regex_escape(x) for x in values) + ")"
    return out


def label_values(run: Run, selector: str, label: str) -> list[str]:
    q = urllib.parse.urlencode({"match[]": selector, "start": run.start, "end": run.end})
    with urllib.request.urlopen(f"{run.prom}/api/v1/series?{q}", timeout=60) as r:
        body = json.loads(r.read().decode())
    return sorted({s[label] for s in body["data"] if label in s})


def substitute(expr: str, variables: dict[str, str]) -> str:
    for name in sorted(variables, key=len, reverse=True):
        value = variables[name]
        expr = re.sub(r"\$\{" + name + r"(?::\w+)?\}", lambda _m, v=value: v, expr)
        expr = expr.replace("$" + name, value)
    return expr


def panel(dashboard: str, title: str) -> dict[str, Any]:
    found = [p for p in panels(load_dashboards()[dashboard]) if p.get("title") == title]
    assert len(found) == 1, (dashboard, title, len(found))
    return found[0]


def panel_series(run: Run, dashboard: str, title: str, ref: str,
                 variables: dict[str, str] | None = None
                 ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
    p = panel(dashboard, title)
    [target] = [t for t in p["targets"] if t["refId"] == ref]
    return run.series(substitute(target["expr"], variables or grafana_vars(run, dashboard)))


def steady_points(run: Run, values: list[tuple[float, float]], margin: float = 420.0
                  ) -> dict[float, float]:
    """The values at least ``margin`` scenario seconds inside a constant-load phase."""
    steady = {"peak", "acceptance-drop"}
    return {t: v for t, v in values
            if any(name in steady and lo + margin <= t <= hi - 60 for name, lo, hi in run.phases)}


@pytest.mark.parametrize(("title", "exporter", "vllm"), [
    ("Acceptance α and rate", "sd_acceptance_alpha{", "α (engine counters"),
    ("Acceptance α and rate", "sd_acceptance_rate{", "rate (engine counters"),
    ("Break-even and SD throughput ceiling vs current arrival rate", "sd_arrival_rate{",
     "engine counters"),
])
def test_vllm_counter_lines_agree_with_the_exporter(run: Run, title: str, exporter: str,
                                                    vllm: str) -> None:
    """On one panel, the exporter's line (scenario time) and the line from vLLM's counters
    (the recording rule's 5m, Prometheus on the wall clock) tell the same figure in the
    steady phases: within 10%. Both over 5m: the acceptance panel's exporter lines read the
    alert's 1m window, whose sampling noise at the drop's 3 req/s differed from the 5m
    line by up to 12% in a run."""
    p = panel("specwatch-sd-overview.json", title)
    [exporter_ref] = [t["refId"] for t in p["targets"] if t["expr"].startswith(exporter)]
    [vllm_ref] = [t["refId"] for t in p["targets"] if vllm in t["legendFormat"]]
    [target] = [t for t in p["targets"] if t["refId"] == exporter_ref]
    variables = grafana_vars(run, "specwatch-sd-overview.json")
    expr = re.sub(r'window="[^"$]+"', 'window="5m"', target["expr"])
    [(_, exp_values)] = run.series(substitute(expr, variables))
    [(_, vllm_values)] = panel_series(run, "specwatch-sd-overview.json", title, vllm_ref)
    exp_pts, vllm_pts = steady_points(run, exp_values), dict(vllm_values)
    pairs = [(t, v, vllm_pts[t]) for t, v in exp_pts.items() if t in vllm_pts]
    assert len(pairs) > 100
    worst = max(pairs, key=lambda p: abs(p[2] / p[1] - 1))
    print(f"{title} ({exporter}): {len(pairs)} points, worst at {_mmss(worst[0])}: "
          f"exporter {worst[1]:.3f}, vLLM counters {worst[2]:.3f}")
    assert abs(worst[2] / worst[1] - 1) < 0.10


def test_tokens_per_second_are_scenario_rates(run: Run) -> None:
    """"Tokens per second" (rate() over vLLM's counters) in the peak is the scenario's:
    12 req/s x the mean generation length the exporter measures (within 10%)."""
    [(_, gen)] = panel_series(run, "specwatch-sd-overview.json", "Tokens per second", "A")
    [(_, mean_gen)] = run.series('sd_mean_generation_tokens{target="vllm-sim", window="5m"}')
    [(_, arrival)] = run.series('sd_arrival_rate{target="vllm-sim", window="5m"}')
    g, m, a = steady_points(run, gen), dict(mean_gen), dict(arrival)
    ratios = sorted(v / (m[t] * a[t]) for t, v in g.items() if t in m and t in a)
    assert len(ratios) > 100
    median = ratios[len(ratios) // 2]
    print(f"generated tokens/s over arrival x mean generation tokens: median {median:.3f}")
    assert 0.9 < median < 1.1


def test_time_since_last_successful_poll_is_a_real_age(run: Run) -> None:
    """Never negative, and small while the target is polled (a few poll intervals)."""
    values = [v for _, vs in panel_series(run, "specwatch-exporter.json",
                                          "Time since last successful poll", "A")
              for _, v in vs]
    assert values
    print(f"time since last successful poll: {min(values):.2f} to {max(values):.2f} s")
    assert min(values) >= 0.0 and max(values) < 5.0


# --------------------------------------------------------------------------- quantiles

#: The mixin's default `grafana.quantileResolution`: a quantile is shown as a value only
#: where the bucket holding it is at most this fraction of the value wide.
RESOLUTION = 0.5
LATENCY_PANELS = ("End-to-end latency P50 / P99", "Time to first token P50 / P99",
                  "Inter-token latency P50 / P99", "Time per output token P50 / P99",
                  "Queue time P50 / P99")


def bucket_bounds(run: Run, expr: str) -> list[float]:
    [name] = set(re.findall(r"(vllm:[a-z0-9_]+)_bucket", expr)) - {
        "vllm:time_per_output_token_seconds"}  # the pre-0.11 name: absent on the page
    return sorted(float(le) for le in label_values(run, f"{name}_bucket", "le")
                  if le != "+Inf")


def containing_bucket(bounds: list[float], v: float) -> tuple[float, float] | None:
    lower = 0.0
    for b in bounds:
        if v <= b * (1 + 1e-9):
            return lower, b
        lower = b
    return None


@pytest.mark.parametrize("title", LATENCY_PANELS)
def test_latency_quantiles_claim_no_more_resolution_than_their_buckets(run: Run,
                                                                       title: str) -> None:
    """Every line of a latency panel drawn as a quantile lies in a bucket at most
    RESOLUTION x its value wide (never inside the first bucket); a line drawn as a bucket
    bound (label bound=" ≤ bucket bound") is exactly a bucket bound; the mean is always
    there. Queue time in the
    demo is 0 (nothing waits): interpolated, its P50 read 150 ms, the middle of 0-0.3 s.
    The bounds are drawn only on request (quantile_bounds = 1); by default no line is a
    bound."""
    p = panel("specwatch-sd-overview.json", title)
    default = grafana_vars(run, "specwatch-sd-overview.json")
    assert default["quantile_bounds"] == "0"
    for t in p["targets"]:
        for labels, _ in run.series(substitute(t["expr"], default)):
            assert "≤" not in labels.get("bound", ""), (title, t["legendFormat"])
    variables = default | {"quantile_bounds": "1"}
    shown = {"value": 0, "bound": 0}
    for t in p["targets"]:
        leg = t["legendFormat"]
        if "p50" not in leg and "p99" not in leg:
            continue
        bounds = bucket_bounds(run, t["expr"])
        for labels, values in run.series(substitute(t["expr"], variables)):
            for when, v in values:
                if "≤" in labels.get("bound", ""):
                    assert any(math.isclose(v, b, rel_tol=1e-9) for b in bounds), (leg, v)
                    shown["bound"] += 1
                    continue
                bucket = containing_bucket(bounds, v)
                assert bucket is not None and bucket[1] - bucket[0] <= RESOLUTION * v, (
                    f"{title}: {leg} shows {v:.4g} s at {_mmss(when)}, inside the bucket "
                    f"{bucket}")
                shown["value"] += 1
    print(f"{title}: {shown['value']} quantile points shown as values, "
          f"{shown['bound']} as bucket bounds")
    assert shown["value"] + shown["bound"] > 0
    if title.startswith("Queue time"):
        assert shown["bound"] > 0
    legends = [t["legendFormat"] for t in p["targets"]]
    assert any("mean" in leg for leg in legends), legends
    assert "≤" in p["description"] and "upper bound" in p["description"]


# --------------------------------------------------------------------------- controller

REASONS = {"agrees", "acceptance_guard", "alert", "hysteresis", "stabilization",
           "min_interval", "no_prediction", "no_data", "pending", "uncertain", "sd_pays"}
#: The demo controller's enable_above_speedup (the default): the top of the hysteresis band.
ENABLE_ABOVE = 1.2


def _at(values: list[tuple[float, float]], when: float) -> float | None:
    """The last sample at or before ``when`` (None without one)."""
    before = [v for t, v in values if t <= when + 1e-6]
    return before[-1] if before else None


def controller_timeline(run: Run) -> list[tuple[float, str]]:
    """(scenario time, "state (reason)") at each change of the controller's state series."""
    points: dict[float, str] = {}
    for labels, values in run.series('sd_controller_state{target="vllm-sim"} == 1'):
        for when, _ in values:
            points[round(when, 3)] = f"{labels['state']} ({labels['reason']})"
    out: list[tuple[float, str]] = []
    for when in sorted(points):
        if not out or out[-1][1] != points[when]:
            out.append((when, points[when]))
    return out


def test_controller_never_switches_sd_off_while_sd_pays(run: Run) -> None:
    """Every switch-off the controller recommends comes when no signal shows SD paying
    beyond the hysteresis band: the predicted speedup (`sd_predicted_speedup`, the model's
    window; the demo's parameters have no interval, so its value) and the measured A/B
    speedup's 90% lower bound where the pair is now are both below enable_above_speedup.
    The timeline of states is printed (scenario time)."""
    timeline = controller_timeline(run)
    print("\ncontroller timeline (scenario time, m:ss):\n" + "\n".join(
        f"  {_mmss(t)}  {what}  ({run.phase_at(t)})" for t, what in timeline))
    [(_, predicted)] = run.series('sd_predicted_speedup{target="vllm-sim", window="5m"}')
    measured = run.series(
        'max(sd_measured_speedup_lower{target="vllm-sim", statistic="mean"} * on(pair, '
        'target, model_name, arrival_rate_bin, acceptance_band) group_left '
        'sd_pair_current_arrival_rate_bin)')
    measured_lower = measured[0][1] if measured else []
    [(_, disables)] = run.series(
        'sd_controller_transitions_total{target="vllm-sim", action="disable"}')
    switch_offs = [t for (_t0, v0), (t, v) in itertools.pairwise(disables) if v > v0]
    assert switch_offs, "the controller never switched SD off in the story"
    for when in switch_offs:
        pred, meas = _at(predicted, when), _at(measured_lower, when)
        print(f"switch-off at {_mmss(when)} ({run.phase_at(when)}): predicted {pred}, "
              f"measured lower bound {meas}")
        assert pred is None or pred < ENABLE_ABOVE, (_mmss(when), pred)
        assert meas is None or meas < ENABLE_ABOVE, (_mmss(when), meas)


def test_controller_says_why_it_disagrees_with_the_model(run: Run) -> None:
    """The state panel shows a reason with every state. Whenever the controller has SD
    off while the model's optimal k is above 0, or recommends a k below the model's, the
    reason is not `agrees`. In the acceptance drop (first-position acceptance 0.29 < 0.4,
    the model's best about 1.09x, inside the hysteresis band) the controller has SD off for
    its acceptance guard and says so."""
    variables = grafana_vars(run, "specwatch-sd-overview.json")
    states = panel_series(run, "specwatch-sd-overview.json", "Controller state and why", "A",
                          variables)
    assert states
    by_t: dict[float, tuple[float, str]] = {}
    for labels, values in states:
        assert labels.get("reason") in REASONS, labels
        for when, v in values:
            by_t[round(when, 3)] = (v, labels["reason"])
    k_panel = panel("specwatch-sd-overview.json",
                    "Controller: recommended draft length and actions")
    refs = {t["legendFormat"].rsplit(" ", 2)[-2]: t["refId"] for t in k_panel["targets"]
            if t["legendFormat"].endswith(" k")}
    [(_, recommended)] = panel_series(run, "specwatch-sd-overview.json", k_panel["title"],
                                      refs["recommended"], variables)
    [(_, optimal)] = panel_series(run, "specwatch-sd-overview.json", k_panel["title"],
                                  refs["optimal"], variables)
    rec = {round(t, 3): v for t, v in recommended}
    opt = {round(t, 3): v for t, v in optimal}
    reasons: dict[str, dict[str, int]] = {}
    for when, (state, reason) in sorted(by_t.items()):
        name = {1.0: "enabled", 2.0: "disabled", 3.0: "pending"}[state]
        reasons.setdefault(run.phase_at(when), {}).setdefault(f"{name} ({reason})", 0)
        reasons[run.phase_at(when)][f"{name} ({reason})"] += 1
        if when in opt and opt[when] > 0 and name == "disabled":
            assert reason != "agrees", (_mmss(when), name, reason, opt[when])
        if when in opt and when in rec and rec[when] < opt[when] and name == "enabled":
            assert reason != "agrees", (_mmss(when), reason, rec[when], opt[when])
    print("controller state (reason), evaluations per phase:", json.dumps(reasons, indent=1))
    assert reasons["acceptance-drop"].get("disabled (acceptance_guard)", 0) > 0


# --------------------------------------------------------------------------- legends


def test_sd_panels_leave_out_targets_without_sd(run: Run) -> None:
    """The baseline of the A/B pair (no SD) appears on no panel of the SD overview: not in
    its target variable, not as a line (its arrival rate on the break-even panel was one)."""
    variables = grafana_vars(run, "specwatch-sd-overview.json")
    assert "baseline" not in variables["target"], variables["target"]
    seen = set()
    for p in panels(load_dashboards()["specwatch-sd-overview.json"]):
        for t in p.get("targets", []):
            if "$__rate_interval" in t["expr"] and "vllm:" in t["expr"]:
                continue  # vLLM's own series: no target label
            expr = substitute(t["expr"], variables)
            q = urllib.parse.urlencode({"query": expr, "time": run.end})
            with urllib.request.urlopen(f"{run.prom}/api/v1/query?{q}", timeout=60) as r:
                result = json.loads(r.read().decode())["data"]["result"]
            seen |= {s["metric"].get("target") for s in result}
    assert "vllm-sim" in seen
    assert "vllm-sim-baseline" not in seen, p["title"]


def test_measured_speedup_legend_shows_one_statistic_by_default(run: Run) -> None:
    """By default one line per pair, arrival-rate bin and acceptance band (the mean); P50 and
    P99 on demand."""
    series = panel_series(run, "specwatch-sd-overview.json", "Measured speedup (A/B pairs)",
                          "A")
    stats = {labels["statistic"] for labels, _ in series}
    bins = {labels["arrival_rate_bin"] for labels, _ in series}
    print(f"measured speedup: {len(series)} lines, statistics {sorted(stats)}, "
          f"bins {sorted(bins)}")
    cells = {(labels["arrival_rate_bin"], labels["acceptance_band"]) for labels, _ in series}
    assert stats == {"mean"} and len(series) == len(cells)
    variables = grafana_vars(run, "specwatch-sd-overview.json") | {"statistic": "(p50|p99)"}
    others = panel_series(run, "specwatch-sd-overview.json", "Measured speedup (A/B pairs)",
                          "A", variables)
    assert {labels["statistic"] for labels, _ in others} == {"p50", "p99"}


def test_measured_speedup_current_line_is_the_current_bins(run: Run) -> None:
    """The thick "current bin" line of the measured-speedup panel is, at every time it has a
    value, the mean of the bin and band the pair is in then (sd_pair_current_arrival_rate_bin),
    and its interval brackets it; bins the pair has not been in for
    grafana.measuredBinMaxAge are not drawn."""
    title = "Measured speedup (A/B pairs)"
    p = panel(SD_DASHBOARD, title)
    refs = {t["legendFormat"].rsplit("· ", 1)[-1]: t["refId"] for t in p["targets"]
            if "current bin" in t["legendFormat"]}
    variables = grafana_vars(run, SD_DASHBOARD)
    [(_, current)] = panel_series(run, SD_DASHBOARD, title, refs["current bin (mean)"], variables)
    [(_, lower)] = panel_series(run, SD_DASHBOARD, title, refs["current bin (90% lower)"],
                                variables)
    [(_, upper)] = panel_series(run, SD_DASHBOARD, title, refs["current bin (90% upper)"],
                                variables)
    bins = run.series('sd_pair_current_arrival_rate_bin{target="vllm-sim"} == 1')
    means = {(labels["arrival_rate_bin"], labels["acceptance_band"]): dict(values) for labels,
             values in run.series('sd_measured_speedup{target="vllm-sim", statistic="mean"}')}
    at_bin = {t: (labels["arrival_rate_bin"], labels["acceptance_band"])
              for labels, values in bins for t, _ in values}
    lo, hi = dict(lower), dict(upper)
    checked = 0
    for t, v in current:
        assert at_bin.get(t) is not None, f"{_mmss(t)}: a current value without a current bin"
        assert math.isclose(v, means[at_bin[t]][t], rel_tol=1e-9), (_mmss(t), v, at_bin[t])
        if t in lo and t in hi:
            assert lo[t] <= v <= hi[t], (_mmss(t), lo[t], v, hi[t])
        checked += 1
    assert checked > 100
    # Bins the pair has not been in for grafana.measuredBinMaxAge (15 scenario minutes:
    # the dashboard as rendered for the demo's speed, like its rules) are not drawn.
    age = 15 * 60.0
    rendered = mixin_render.render({"grafana": {"measuredBinMaxAge": f"{age / run.speed:g}s"}})
    [recent_target] = [
        t for q in panels(rendered["dashboards"][SD_DASHBOARD]) if q.get("title") == title
        for t in q["targets"] if t["refId"] == "A"]
    recent = run.series(substitute(recent_target["expr"], variables))
    step = EVAL_S * run.speed
    drawn = 0
    for labels, values in recent:
        key = (labels["arrival_rate_bin"], labels["acceptance_band"])
        seen = [t for t, b in at_bin.items() if b == key]
        for t, _ in values:
            assert any(t - age - step <= s <= t + step for s in seen), (_mmss(t), key)
            drawn += 1
    everything = sum(len(v) for v in means.values())
    print(f"measured speedup: {checked} current-bin points; {drawn} of {everything} bin "
          f"points within {age / 60:g} min of their bin being current")
    assert 0 < drawn < everything


# --------------------------------------------------------------------------- vLLM parity

#: vLLM's own speculative-decoding dashboard, the queries the parity panels answer to:
#: examples/observability/dashboards/grafana/vllm_speculative_decoding.json in
#: vllm-project/vllm at commit b29712c6b2ed0daa860e65e2bbb8cd73365efbf8 (panels "Output from
#: accepted drafts", "Draft acceptance rate by engine", "Draft tokens / s", "Drafts / s").
_VLLM_SEL = 'job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"'
VLLM_DASHBOARD = {name: expr.replace("SEL", _VLLM_SEL) for name, expr in {
    "Output from accepted drafts":
        "sum(rate(vllm:spec_decode_num_accepted_tokens_total{SEL}[$__rate_interval])) / "
        "(sum(rate(vllm:generation_tokens_total{SEL}[$__rate_interval])) > 0)",
    "Draft acceptance rate by engine":
        "sum by (instance, engine) (rate(vllm:spec_decode_num_accepted_tokens_total{SEL}"
        "[$__rate_interval])) / (sum by (instance, engine) (rate("
        "vllm:spec_decode_num_draft_tokens_total{SEL}[$__rate_interval])) > 0)",
    "Draft tokens / s": "sum(rate(vllm:spec_decode_num_draft_tokens_total{SEL}[$__rate_interval]))",
    "Drafts / s": "sum(rate(vllm:spec_decode_num_drafts_total{SEL}[$__rate_interval]))",
}.items()}
#: (vLLM's panel, specwatch's panel, the legend suffix of specwatch's line).
PARITY = [
    ("Output from accepted drafts", "Output tokens from drafts", "{{model_name}}"),
    ("Draft acceptance rate by engine", "Acceptance per engine", " rate"),
    ("Draft tokens / s", "Drafts and proposed draft tokens per second", " proposed draft tokens"),
    ("Drafts / s", "Drafts and proposed draft tokens per second", " drafts"),
]


@pytest.mark.parametrize(("theirs", "ours", "legend"), PARITY, ids=[p[0] for p in PARITY])
def test_vllm_parity_panels_agree_with_vllms_own_dashboard(run: Run, theirs: str, ours: str,
                                                           legend: str) -> None:
    """On the demo's data (one model, one engine), specwatch's parity line and vLLM's own
    dashboard query agree within 1% at every time both have a value."""
    p = panel(SD_DASHBOARD, ours)
    [target] = [t for t in p["targets"] if t["legendFormat"].endswith(legend)]
    ours_series = panel_series(run, SD_DASHBOARD, ours, target["refId"])
    vllm_vars = {"__rate_interval": "4s", "job": "vllm", "model_name": ".+", "instance": ".+",
                 "engine": ".+"}
    theirs_series = run.series(substitute(VLLM_DASHBOARD[theirs], vllm_vars))
    assert len(ours_series) == len(theirs_series) == 1, (ours_series, theirs_series)
    a, b = dict(ours_series[0][1]), dict(theirs_series[0][1])
    both = [(t, a[t], b[t]) for t in a if t in b]
    assert len(both) > 100
    worst = max(both, key=lambda x: abs(x[1] - x[2]) / max(abs(x[2]), 1e-12))
    print(f"{ours} vs vLLM's {theirs!r}: {len(both)} points, worst at {_mmss(worst[0])}: "
          f"{worst[1]:.4g} vs {worst[2]:.4g}; "
          f"first {both[0][1]:.3g}, last {both[-1][1]:.3g}")
    assert abs(worst[1] - worst[2]) <= 0.01 * abs(worst[2]), worst

