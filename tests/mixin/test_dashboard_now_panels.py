"""The dashboards' "now" panels show only what holds now.

A stat panel reduces its query's frames to one value. Fed a range query and reduced with
`lastNotNull`, it keeps showing a series that has ended (a resolved alert, a target that
stopped drafting) for as long as that series has a sample in the time range: "Firing
specwatch alerts" counted alerts that had resolved. An instant query returns only the series
that exist at the current time, so every stat panel's queries are instant, and a real
Prometheus shows that once an alert resolves and a signal ends, the panels' own queries,
run as Grafana runs them, return nothing.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from mixin_helpers import load_dashboards, panels
from promsim import scrape_job, scraping_prometheus

SD = "specwatch-sd-overview.json"
#: The labels of the one exporter series the probe serves (the dashboards' filters match them).
TARGET, MODEL = "probe-target", "probe-model"


def stat_panels() -> list[tuple[str, dict[str, Any]]]:
    return [(name, p) for name, d in sorted(load_dashboards().items()) for p in panels(d)
            if p["type"] == "stat"]


@pytest.mark.parametrize(("dashboard", "title"),
                         [(n, p["title"]) for n, p in stat_panels()])
def test_every_stat_panel_queries_the_current_time(dashboard: str, title: str) -> None:
    [p] = [p for n, p in stat_panels() if n == dashboard and p["title"] == title]
    for t in p["targets"]:
        assert t.get("instant") is True and t.get("range") is False, (dashboard, title, t)


# --------------------------------------------------------------------------- real Prometheus


class _Page:
    """A /metrics page whose text the test sets."""

    def __init__(self) -> None:
        self.text = ""
        page = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = page.text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"

    @contextlib.contextmanager
    def serving(self) -> Iterator[_Page]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()


def _get(prom: str, path: str, params: dict[str, Any]) -> Any:
    with urllib.request.urlopen(f"{prom}{path}?{urllib.parse.urlencode(params)}",
                                timeout=10) as r:
        body = json.loads(r.read().decode())
    assert body["status"] == "success", body
    return body["data"]["result"]


def _variables(dashboard: dict[str, Any]) -> dict[str, str]:
    """Every variable of the dashboard as a user with the probe's target and model selected
    sets it: query variables to the probe's values, custom ones to their default."""
    chosen = {"job": "specwatch", "vllm_job": "vllm", "target": TARGET, "model_name": MODEL,
              "vllm_instance": ".+", "engine": ".+"}
    out = {"__rate_interval": "4s"}
    for v in dashboard["templating"]["list"]:
        if v["type"] == "custom":
            out[v["name"]] = v["current"]["value"]
        elif v["type"] == "query":
            out[v["name"]] = chosen[v["name"]]
    return out


def _substitute(expr: str, variables: dict[str, str]) -> str:
    for name in sorted(variables, key=len, reverse=True):
        for form in (f"${{{name}:regex}}", f"${{{name}}}", f"${name}"):
            expr = expr.replace(form, variables[name])
    return expr


def panel_now(prom: str, dashboard: str, title: str, lookback_s: float = 300.0
              ) -> list[tuple[dict[str, str], float]]:
    """What a stat panel shows now, computed as Grafana does: each target's query at the
    current time if it is instant, else over the last ``lookback_s`` seconds reduced to
    the last non-null value of each series."""
    d = load_dashboards()[dashboard]
    [p] = [p for p in panels(d) if p.get("title") == title]
    assert p["options"]["reduceOptions"]["calcs"] == ["lastNotNull"], p["options"]
    variables, now, shown = _variables(d), time.time(), []
    for t in p["targets"]:
        expr = _substitute(t["expr"], variables)
        if t.get("instant"):
            rows = _get(prom, "/api/v1/query", {"query": expr, "time": now})
            shown += [(r["metric"], float(r["value"][1])) for r in rows]
        else:
            rows = _get(prom, "/api/v1/query_range", {"query": expr, "start": now - lookback_s,
                                                      "end": now, "step": 1})
            shown += [(r["metric"], float(r["values"][-1][1])) for r in rows]
    return shown


def _wait(what: str, ok, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


PROBE_ALERT = "SDNowPanelProbe"


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="needs Debian's prometheus (make setup installs it)")
def test_now_panels_return_nothing_once_the_alert_resolves_and_the_signal_ends(
        tmp_path: Path) -> None:
    """A low α fires an alert (for 0s, so the test takes seconds); "Firing specwatch alerts"
    and "Acceptance now" show it. The exporter then stops exposing the series (as it does
    for a target that stops drafting): the alert resolves, and both panels' queries return
    nothing, while the same expressions over the last minutes, which a range query reduced
    to its last value would show, still find them."""
    alpha = "".join(f'sd_acceptance_alpha{{target="{TARGET}", model_name="{MODEL}", '
                    f'window="{w}", method="first_position"}} 0.2\n' for w in ("1m", "5m"))
    rules = tmp_path / "probe.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "probe", "rules": [{
        "alert": PROBE_ALERT, "expr": 'sd_acceptance_alpha{job="specwatch"} < 0.4',
        "for": "0s", "labels": {"severity": "warning"}}]}]}), encoding="utf-8")
    with _Page().serving() as page, scraping_prometheus(
            tmp_path, [scrape_job("specwatch", page.address)], [rules]) as prom:
        page.text = alpha
        firing = "Firing specwatch alerts"
        _wait("the probe alert to fire and show on the panel", lambda: any(
            labels.get("alertname") == PROBE_ALERT for labels, _ in panel_now(prom, SD, firing)))
        acceptance = panel_now(prom, SD, "Acceptance now")
        assert acceptance and all(v == 0.2 for _, v in acceptance), acceptance

        page.text = ""
        _wait("the probe alert to resolve", lambda: not _get(
            prom, "/api/v1/query", {"query": f'ALERTS{{alertname="{PROBE_ALERT}"}}'}))
        assert panel_now(prom, SD, firing) == []
        assert panel_now(prom, SD, "Acceptance now") == []
        # The test can fail: a range query reduced to its last value still shows both.
        past = _get(prom, "/api/v1/query", {
            "query": f'last_over_time(ALERTS{{alertname="{PROBE_ALERT}", '
                     f'alertstate="firing"}}[5m])'})
        assert past, "the firing alert left no samples in the last minutes"
