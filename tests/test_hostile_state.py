"""Controller and receiver side: state stays bounded under rotating names.

A target whose ``model_name`` values change every poll, with a ``controller:`` block, and an
Alertmanager receiver fed alerts for models nobody knows: the controller keeps at most
``max_models`` models per target (the least recently seen absent one goes first, counted),
forgets a model gone longer than the exporter's history retention (counted), and the receiver
never creates state for a model the controller does not follow and logs one line per POST.
The exporter and the HTTP server are the real ones (in-process, fake poll clock); the pages
are real vLLM pages (helpers.vllmpage) with the model name rewritten.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from pathlib import Path

import pytest
from helpers import testsecrets
from helpers.controlkit import RECOMMEND, Clock, webhook_payload
from helpers.paths import REPO
from helpers.scrape import parse_exposition
from helpers.vllmpage import VllmState

from specwatch.app import settings as app_settings
from specwatch.app.serve import ServeApp
from specwatch.plugins.control.controller import DEFAULT_MAX_MODELS
from specwatch.poll.pipeline import PollResult

PARAMS = REPO / "examples/params/qwen3-32b-h100-eagle3.yaml"
GOOD = (0.8, 0.6, 0.45)


class Rotating:
    """An exporter with one controlled target whose page carries ``per_poll`` new model
    names every poll, and the Alertmanager receiver on."""

    def __init__(self, tmp_path: Path, target_extra: str = "") -> None:
        token = tmp_path / "token"
        token.write_text(testsecrets.RECEIVER_TOKEN + "\n")
        cfg = tmp_path / "specwatch.yaml"
        cfg.write_text(
            "global:\n  windows: [1m]\n  model_window: 1m\n  count_window: 0\n"
            "targets:\n"
            f"  - name: a\n    url: http://127.0.0.1:1/metrics\n    params: {PARAMS}\n"
            f"    max_series: 1000000\n{target_extra}    controller:\n{RECOMMEND}"
            "controller:\n  alertmanager:\n"
            f"    token_file: {token}\n    alerts: [SDAcceptanceRateLow]\n")
        self.clock = Clock()
        self.app = ServeApp(app_settings.build_config(str(cfg), [], "127.0.0.1:0", 1.0),
                            clock=self.clock)
        self.app.start(poll=False)
        host, port = self.app.web.address
        self.base = f"http://{host}:{port}"
        self.state = VllmState(model="m")
        self.polls = 0

    def poll(self, names: list[str], seconds: float = 1.0) -> None:
        self.clock.t += seconds
        self.state.advance(seconds, 4.0, GOOD, 2.0, 0.1)
        out = []
        for line in self.state.render().splitlines():
            if line.startswith("#") or 'model_name="m"' not in line:
                out.append(line)
            else:
                out.extend(line.replace('model_name="m"', f'model_name="{n}"') for n in names)
        self.app.pipeline.apply(PollResult("a", self.clock.t, self.clock.t, 0.01,
                                           body="\n".join(out) + "\n"))

    def rotate(self, polls: int, per_poll: int) -> None:
        for _ in range(polls):
            self.polls += 1
            self.poll([f"m{self.polls}-{i}" for i in range(per_poll)])

    def controller_series(self) -> tuple[int, int]:
        """(sd_controller_* series, distinct model names among them) on /metrics."""
        with urllib.request.urlopen(self.base + "/metrics", timeout=30) as resp:
            series = parse_exposition(resp.read().decode())
        ctl = [k for k in series if k[0].startswith("sd_controller_")]
        models = {dict(k[1]).get("model_name") for k in ctl} - {None}
        return len(ctl), len(models)

    def post(self, body: bytes) -> tuple[int, bytes]:
        req = urllib.request.Request(self.base + "/controller/alertmanager", data=body,
                                     method="POST")
        req.add_header("Authorization", f"Bearer {testsecrets.RECEIVER_TOKEN}")
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()

    def close(self) -> None:
        self.app.stop()


@pytest.fixture
def rotating(tmp_path):
    r = Rotating(tmp_path)
    yield r
    r.close()


def _rotating_names_run(r: Rotating, polls: int, per_poll: int) -> dict:
    tc = r.app.controller.targets["a"]
    r.rotate(polls, per_poll)
    series, models = r.controller_series()
    kept = len(tc.models)
    with urllib.request.urlopen(r.base + "/metrics", timeout=30) as resp:
        page = parse_exposition(resp.read().decode())
    exporter_dropped = page.get(("specwatch_target_models_dropped_total",
                                 frozenset({("target", "a"), ("reason", "max_models")})), 0.0)
    # Everything gone for longer than the retention is forgotten at the next poll.
    r.poll(["steady"], seconds=r.app.controller.retention + 1)
    after_series, after_models = r.controller_series()
    return {"series": series, "models": models, "kept": kept,
            "after_series": after_series, "after_models": after_models,
            "dropped": dict(tc.dropped), "left": sorted(tc.models),
            "exporter_dropped": exporter_dropped}


def test_controller_keeps_at_most_max_models_under_rotating_names(rotating):
    """12 polls of 150 new model names each (1,800 names; the exporter
    follows 100 of each page) leave at most 100 models and their series in the controller
    (old code: every name kept forever, 492,000 series in 40 s); drops are counted by
    reason; after the exporter's retention only the model still on the page is left."""
    got = _rotating_names_run(rotating, 12, 150)
    print(f"\ncontroller under rotating names (1,800 names): {got['series']} sd_controller "
          f"series for {got['models']} models; after the retention: {got['after_series']} "
          f"series, {got['after_models']} model(s); dropped {got['dropped']}")
    assert got["kept"] == DEFAULT_MAX_MODELS
    assert got["models"] <= DEFAULT_MAX_MODELS
    # The exporter follows at most 100 models of a page (exporter side):
    # 50 of each poll's 150 names are never followed, so the controller saw 1,200 names.
    assert got["exporter_dropped"] == 12 * 50
    assert got["dropped"]["limit"] >= 1200 - DEFAULT_MAX_MODELS
    assert got["left"] == ["steady"] and got["after_models"] == 1
    assert got["dropped"]["retention"] == DEFAULT_MAX_MODELS
    with urllib.request.urlopen(rotating.base + "/metrics", timeout=30) as resp:
        series = parse_exposition(resp.read().decode())
    assert series[("sd_controller_models_dropped_total",
                   frozenset({("target", "a"), ("reason", "retention")}))] == 100.0


def test_controller_forgets_what_the_exporter_forgets(tmp_path):
    """The controller plugs into the exporter's forget hook: a model the exporter forgets
    (here the oldest vanished beyond a target's max_models: 10) leaves the controller too,
    counted under the exporter's reason, so the controller never follows more models than
    the exporter keeps (without the hook it kept up to its own cap of 100)."""
    r = Rotating(tmp_path, target_extra="    max_models: 10\n")
    try:
        tc = r.app.controller.targets["a"]
        r.rotate(5, 10)
        exporter_models = set(r.app.pipeline.target_history("a").models)
        assert len(exporter_models) == 20  # 10 live + 10 remembered vanished
        assert set(tc.models) == exporter_models
        assert tc.dropped.get("vanished_limit") == 30
        assert tc.dropped["limit"] == 0
    finally:
        r.close()


@pytest.mark.slow
def test_controller_series_stay_flat_for_minutes_of_rotating_names(rotating):
    """The same for 150 polls of 200 new names (30,000 names, minutes; make test-all)."""
    got = _rotating_names_run(rotating, 150, 200)
    print(f"\n150 polls x 200 names: {got}")
    assert got["kept"] == DEFAULT_MAX_MODELS and got["models"] <= DEFAULT_MAX_MODELS


def test_receiver_acts_only_on_known_models_and_logs_one_line_per_post(rotating, caplog):
    """5 POSTs of 1,000 firing alerts, each for a new model_name, create no
    state (every alert ignored_model), leave /controller and the series as they were, and
    log one line per POST (old code: 75,000 series, a 17 MB /controller, 25,000 log
    lines). An alert for a model the controller follows is still accepted."""
    rotating.poll(["known"])
    before = rotating.controller_series()
    caplog.set_level(logging.DEBUG)
    caplog.clear()
    for p in range(5):
        alerts = [{"status": "firing", "labels": {"alertname": "SDAcceptanceRateLow",
                                                  "target": "a", "model_name": f"x{p}-{i}"},
                   "annotations": {}, "startsAt": "2027-01-15T08:00:00Z",
                   "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prom",
                   "fingerprint": f"f{p}-{i}"} for i in range(1000)]
        status, answer = rotating.post(webhook_payload(*alerts))
        assert status == 200
        # A short answer: counts, never an echo of each alert (no fingerprints).
        assert len(answer) < 2048 and json.loads(answer)["outcomes"] == {"ignored_model": 1000}
        assert f"f{p}-999".encode() not in answer
    ctl = rotating.app.controller
    assert sorted(ctl.targets["a"].models) == ["known"]
    assert ctl.alerts_received["ignored_model"] == 5000
    assert rotating.controller_series() == before
    with urllib.request.urlopen(rotating.base + "/controller", timeout=30) as resp:
        size = len(resp.read())
    records = [r for r in caplog.records if r.name.startswith("specwatch.plugins.control")]
    print(f"\nreceiver, 5 x 1,000 alerts for unknown models: {before[0]} sd_controller series "
          f"before and after, /controller {size} bytes, {len(records)} log lines")
    assert len(records) == 5
    assert size < 10_000
    status, body = rotating.post(webhook_payload(
        {"status": "firing", "labels": {"alertname": "SDAcceptanceRateLow", "target": "a",
                                        "model_name": "known"},
         "annotations": {}, "startsAt": "2027-01-15T08:00:00Z",
         "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prom",
         "fingerprint": "k1"}))
    assert json.loads(body)["alerts"][0]["outcome"] == "accepted"
