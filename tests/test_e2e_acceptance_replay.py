"""The acceptance alert on a real vLLM's pages: it fires in the real low-acceptance phase and
stays silent in the high one.

The SD side of the real A/B pair (tests/fixtures/vllm-0.32-cpu-pair-k2/sd: vLLM 0.32, n-gram
drafts, k = 2, 88 pages about 2 s apart) is served page by page to the real exporter, whose
clock is each page's capture time, while the real Prometheus scrapes the exporter every
second and evaluates the mixin's rules. The pages are replayed SPEED times faster than they
were recorded. Its phases (the fixture's README): 120 s of temperature-0 traffic at 1 to 8
clients (acceptance rate about 0.79), then 30 s with 70% of the requests at temperature 1
(n-gram lookups mostly fail: acceptance rate 0.06 in its 10 s windows, SD slower), then 25 s
at temperature 0 again. The phases are short, so time is compressed through the mixin's own
config (`render_rules` overrides, no edited rule file): the exporter's window is 10 s of
recorded time and SDAcceptanceRateLow waits FOR of Prometheus' (wall) time.
"""

from __future__ import annotations

import shutil
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.pageserver import Page, PageSequenceServer, fixture_pages
from helpers.paths import FIXTURES
from prometheus_client.parser import text_string_to_metric_families
from promsim import get_json, scrape_job, scraping_prometheus, wait_for_scrape_after

from specwatch.app import settings as app_settings
from specwatch.app.serve import ServeApp
from specwatch.mixin.render import dump_rules, render_rules

PAGES = FIXTURES / "vllm-0.32-cpu-pair-k2" / "sd"
SPEED = 2.0  # recorded seconds per wall second
WINDOW = "10s"  # recorded time (the exporter's clock)
FOR = "5s"  # wall time (Prometheus' clock): 10 s of recorded time
LOW = (120.0, 150.0)  # the temperature-1 phase, seconds after the first page (README)
ALERT = "SDAcceptanceRateLow"

# Slow (a live stack on the wall clock for tens of seconds): `make test-all` and CI.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("prometheus") is None,
                       reason="needs Debian's prometheus (make setup installs it)"),
]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _counters(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def _first_position(a: str, b: str) -> float:
    """Position 0's accepted tokens over drafts between two raw pages (no specwatch code)."""
    pos = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    drafts = "vllm:spec_decode_num_drafts_total"
    return ((_counters(b, pos, position="0") - _counters(a, pos, position="0"))
            / (_counters(b, drafts) - _counters(a, drafts)))


def _query_range(prom: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "1s"})
    data = get_json(f"{prom}/api/v1/query_range?{q}")
    assert data["status"] == "success", data
    return data["data"]["result"]


def test_premise_the_recorded_phases_straddle_the_threshold():
    """From the raw pages: the first position's acceptance is far above 0.4 in the high
    phase and far below it in the low one (vLLM's rate is lower still at k = 2)."""
    pages = fixture_pages(PAGES)
    t0 = pages[0][0]
    at = {round(t - t0): text for t, text in pages}

    def page(t: float) -> str:
        return at[min(at, key=lambda s: abs(s - t))]

    assert _first_position(page(0), page(LOW[0])) > 0.8
    assert _first_position(page(LOW[0] + 8), page(LOW[1])) < 0.15


def test_alert_fires_in_the_low_phase_and_not_in_the_high(tmp_path: Path):
    pages = fixture_pages(PAGES)
    t0 = pages[0][0]
    rules = render_rules({"exporterWindow": WINDOW,
                          "alerts": {ALERT: {"window": WINDOW, "for": FOR, "keepFiringFor": "",
                                             "missingSampleGrace": ""}}})
    (tmp_path / "rules.yaml").write_text(dump_rules(rules))
    clock = Clock()
    with PageSequenceServer([Page(text) for _, text in pages]) as server:
        cfg_file = tmp_path / "specwatch.yaml"
        cfg_file.write_text(yaml.safe_dump({
            "global": {"listen": "127.0.0.1:0", "poll_interval": "2s", "windows": [WINDOW],
                       "count_window": 500},
            "targets": [{"name": "sd", "url": server.url, "engine": "vllm"}]}))
        app = ServeApp(app_settings.build_config(str(cfg_file), [], "127.0.0.1:0", None),
                       clock=clock)
        app.start(poll=False)
        try:
            host, port = app.web.address
            with scraping_prometheus(tmp_path, [scrape_job("specwatch", f"{host}:{port}")],
                                     [tmp_path / "rules.yaml"]) as prom:
                wall0 = time.time() + 1.0
                for i, (t, _) in enumerate(pages):
                    time.sleep(max(0.0, wall0 + (t - t0) / SPEED - time.time()))
                    server.set_step(i)
                    clock.t = t
                    result = app.poller.poll_now("sd")
                    assert result.error_reason is None, result.error_message
                wall_end = time.time()
                wait_for_scrape_after(prom, wall_end)
                time.sleep(2.0)  # one more rule evaluation after the last scrape

                def recorded(wall: float) -> float:
                    return (wall - wall0) * SPEED

                alerts = _query_range(prom, f'ALERTS{{alertname="{ALERT}"}}', wall0, wall_end)
                alpha = _query_range(prom, f'sd_acceptance_alpha{{window="{WINDOW}"}}',
                                     wall0, wall_end)
                rate = _query_range(prom, f'sd_acceptance_rate{{window="{WINDOW}"}}',
                                    wall0, wall_end)
        finally:
            app.stop()
    states = {(r["metric"]["alertstate"], round(recorded(float(ts)), 1))
              for r in alerts for ts, _ in r["values"]}
    print(f"\n{ALERT} (recorded seconds): "
          + ", ".join(f"{s}@{t:g}" for s, t in sorted(states, key=lambda x: x[1])))
    [series] = alpha
    assert series["metric"]["method"] == "first_position"
    alpha_at = {round(recorded(float(ts)), 1): float(v) for ts, v in series["values"]}
    rate_at = {round(recorded(float(ts)), 1): float(v) for ts, v in rate[0]["values"]}
    # Windows wholly inside the low phase: its first 10 s window still holds requests begun
    # at temperature 0 (acceptance rate 0.32 there, README), and a scrape lags a poll.
    inside = LOW[0] + 16.0
    high = [a for t, a in alpha_at.items() if 20.0 <= t < LOW[0]]
    low = [a for t, a in alpha_at.items() if inside <= t < LOW[1]]
    print(f"α: high phase {min(high):.2f}-{max(high):.2f}, low phase {min(low):.2f}-"
          f"{max(low):.2f}; vLLM's rate in the low phase: "
          f"{min(r for t, r in rate_at.items() if inside <= t < LOW[1]):.2f}-"
          f"{max(r for t, r in rate_at.items() if inside <= t < LOW[1]):.2f}")
    assert min(high) > 0.6 and max(low) < 0.3
    # Silent (not even pending) through the whole high phase; firing in the low one.
    assert not [t for _, t in states if t < LOW[0]], sorted(states)
    firing = sorted(t for s, t in states if s == "firing")
    assert firing, sorted(states)
    assert LOW[0] < firing[0] < LOW[1] + 10.0, firing
