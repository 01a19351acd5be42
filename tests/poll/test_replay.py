"""Replay of the real vLLM 0.32 snapshots through the real exporter, checked independently.

The recorded pages (tests/fixtures/vllm-0.32-cpu-ngram/, one every 2 s, with a ~39 s server
restart) are served in order by a local HTTP server. The exporter (config → poller → HTTP →
sources → history → derive → collector → its own HTTP server) polls them with a clock set to
each page's capture time, and after every poll its /metrics is scraped and compared with
values computed here from the raw pages by deliberately simple, separate code (no specwatch
import in the expectation path). During the restart gap the target answers 503 and then
drops connections: the exporter must report it down with no derived series, count the
errors by reason, and after the restart count one reset with no negative delta and no spike.
"""

from __future__ import annotations

import itertools
import math
import shutil
import subprocess
import sys
import time

import pytest
from helpers.pageserver import Drop, Page, PageSequenceServer, fixture_pages
from helpers.paths import FIXTURES
from helpers.scrape import fetch_text, parse_exposition, scrape, select
from prometheus_client.parser import text_string_to_metric_families
from scipy import optimize, stats

from specwatch.app import settings as app_settings
from specwatch.app.serve import ServeApp

FIXTURES = FIXTURES / "vllm-0.32-cpu-ngram"
WINDOWS = {"1m": 60.0, "5m": 300.0, "15m": 900.0}
COUNT_N = 1000
MIN_DRAFTS = 50
MIN_BC_SAMPLES = 10

ACC = "vllm:spec_decode_num_accepted_tokens_total"
TOK = "vllm:spec_decode_num_draft_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
REQ = "vllm:request_success_total"
LAT_SUM, LAT_CNT = "vllm:e2e_request_latency_seconds_sum", "vllm:e2e_request_latency_seconds_count"
P_SUM, P_CNT = "vllm:request_prompt_tokens_sum", "vllm:request_prompt_tokens_count"
G_SUM, G_CNT = "vllm:request_generation_tokens_sum", "vllm:request_generation_tokens_count"
COUNTERS = {ACC, TOK, DRAFTS, POS, REQ, LAT_SUM, LAT_CNT, P_SUM, P_CNT, G_SUM, G_CNT}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def raw_counters(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in COUNTERS:
                out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


class Independent:
    """Reset-corrected sums per (metric, position), kept per successful poll."""

    def __init__(self) -> None:
        self.prev: dict[tuple[str, frozenset], float] = {}
        self.totals: dict[tuple[str, str | None], float] = {}
        self.history: list[tuple[float, dict]] = []
        self.samples: list[tuple[float, float]] = []  # (end time, interval acceptance rate)
        self.resets = 0
        self.positions: set[str] = set()

    def add(self, t: float, text: str) -> None:
        cur = raw_counters(text)
        went_down = False
        for key, v in cur.items():
            p = self.prev.get(key)
            if p is None:
                d = 0.0
            elif v >= p:
                d = v - p
            else:
                d = v
                went_down = True
            assert d >= 0
            labels = dict(key[1])
            pos = labels.get("position") if key[0] == POS else None
            if pos is not None:
                self.positions.add(pos)
            self.totals[(key[0], pos)] = self.totals.get((key[0], pos), 0.0) + d
        self.resets += went_down
        self.prev = cur
        snap = dict(self.totals)
        if self.history:
            b = self.history[-1][1]
            dd = snap[(DRAFTS, None)] - b[(DRAFTS, None)]
            dt = snap[(TOK, None)] - b[(TOK, None)]
            if dd >= MIN_DRAFTS and dt > 0:
                self.samples.append((t, (snap[(ACC, None)] - b[(ACC, None)]) / dt))
        self.history.append((t, snap))

    def expected(self) -> dict[tuple[str, str, str | None], float]:
        """{(metric, window, position or method): value} for the newest poll."""
        t, cur = self.history[-1]
        out: dict[tuple[str, str, str | None], float] = {}
        bases = {}
        older = self.history[:-1]
        if older:
            for label, w in WINDOWS.items():
                within = [h for h in older if h[0] <= t - w + 1e-9]
                bases[label] = within[-1] if within else older[0]
            back = [h for h in older
                    if cur[(REQ, None)] - h[1].get((REQ, None), 0) >= COUNT_N]
            if back:
                bases[f"{COUNT_N}req"] = back[-1]
        for label, (tb, base) in bases.items():
            def d(name, pos=None, base=base):
                return cur.get((name, pos), 0.0) - base.get((name, pos), 0.0)
            span = t - tb
            drafts, tok, acc = d(DRAFTS), d(TOK), d(ACC)
            if tok > 0:
                out[("sd_acceptance_rate", label, None)] = acc / tok
            if drafts > 0:
                gamma = tok / drafts
                e = 1 + acc / drafts
                out[("sd_draft_length", label, None)] = gamma
                out[("sd_acceptance_length", label, None)] = e
                out[("sd_token_acceptance_probability", label, None)] = solve_alpha(e, gamma)
                p = {pos: d(POS, pos) / drafts for pos in self.positions}
                prev = 1.0
                for pos in sorted(p, key=int):
                    out[("sd_position_acceptance_rate", label, pos)] = p[pos]
                    out[("sd_position_conditional_acceptance_rate", label, pos)] = p[pos] / prev
                    prev = p[pos]
                p0, p1 = p["0"], p["1"]
                # vLLM counts positions: the draft-length-independent α is position 0's.
                out[("sd_acceptance_alpha", label, "first_position")] = p0
                if 0 < p0 < 1:
                    h = (p1 - p0 * p0) / (p0 * (1 - p0))
                    out[("sd_acceptance_heterogeneity", label, None)] = min(1.0, max(0.0, h))
            req = d(REQ)
            out[("sd_arrival_rate", label, None)] = req / span
            if d(LAT_CNT) > 0:
                lat = d(LAT_SUM) / d(LAT_CNT)
                out[("sd_mean_latency_seconds", label, None)] = lat
                if req > 0:
                    out[("sd_effective_batch_size", label, None)] = req / span * lat
            if d(P_CNT) > 0:
                out[("sd_mean_prompt_tokens", label, None)] = d(P_SUM) / d(P_CNT)
            if d(G_CNT) > 0:
                out[("sd_mean_generation_tokens", label, None)] = d(G_SUM) / d(G_CNT)
            xs = [x for te, x in self.samples if te > tb]
            if len(xs) >= MIN_BC_SAMPLES and len(set(xs)) > 1:
                bc = coexistence_bc(xs)
                if bc is not None:
                    out[("sd_acceptance_bimodality_coefficient", label, None)] = bc
        return out


def sarle(xs: list[float]) -> float | None:
    n = len(xs)
    if n < 4 or len(set(xs)) < 2:
        return None
    g = stats.skew(xs, bias=False)
    k = stats.kurtosis(xs, bias=False)
    return (g * g + 1) / (k + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3)))


def coexistence_bc(xs: list[float]) -> float | None:
    """docs/metrics.md: split at <= 2 change points (greedy, levels), drop the samples beside
    each change, sample-weighted mean of Sarle's coefficient per segment, min with the raw."""
    def sse(seg: list[float]) -> float:
        m = sum(seg) / len(seg)
        return sum((x - m) ** 2 for x in seg)

    bounds = [0, len(xs)]
    for _ in range(2):
        best = (1e-15, None)
        for a, b in itertools.pairwise(bounds):
            for c in range(a + 1, b):
                gain = sse(xs[a:b]) - sse(xs[a:c]) - sse(xs[c:b])
                if gain > best[0] + 1e-12:
                    best = (gain, c)
        if best[1] is None:
            break
        bounds = sorted([*bounds, best[1]])
    dropped = {i for c in bounds[1:-1] for i in (c - 1, c)}
    total = weight = 0.0
    for a, b in itertools.pairwise(bounds):
        seg = [xs[i] for i in range(a, b) if i not in dropped]
        bc = sarle(seg)
        if bc is not None:
            total += bc * len(seg)
            weight += len(seg)
    raw = sarle(xs)
    return None if raw is None or weight == 0 else min(raw, total / weight)


def solve_alpha(e: float, k: float) -> float:
    if e >= k + 1:
        return 1.0
    if e <= 1:
        return 0.0
    return optimize.brentq(lambda a: (1 - a ** (k + 1)) / (1 - a) - e, 0.0, 1 - 1e-15,
                           xtol=1e-14)


def build_steps(skip_zero_page: bool = False) -> tuple[list, list[tuple[float, str | None]]]:
    """Server steps plus (time, page text or None for a failed poll) for each poll.

    ``skip_zero_page``: the first page after the restart (all counters 0) is also lost, so
    the first page the exporter sees after the restart already counts new work: its delta
    must be the new value itself (counter restarted from 0), not 0 and not negative.
    """
    pages = fixture_pages(FIXTURES)
    steps, timeline = [], []
    after_gap = False
    for i, (t, text) in enumerate(pages):
        if after_gap and skip_zero_page:
            steps.append(Drop())
            timeline.append((t, None))
            after_gap = False
            continue
        after_gap = False
        steps.append(Page(text))
        timeline.append((t, text))
        if i + 1 < len(pages) and pages[i + 1][0] - t > 10:  # the restart gap
            gap_t = t + 2.0
            n = 0
            while gap_t < pages[i + 1][0] - 1.0:
                # First the server answers 503 (shutting down), then nothing listens.
                steps.append(Page("service unavailable\n", status=503) if n < 5 else Drop())
                timeline.append((gap_t, None))
                gap_t += 2.0
                n += 1
            after_gap = True
    return steps, timeline


def derived_from_scrape(series) -> dict[tuple[str, str, str | None], float]:
    out = {}
    for (name, labels), v in series.items():
        if name.startswith("sd_") and "window" in dict(labels):
            lab = dict(labels)
            # The third part: the position, or the α's method.
            out[(name, lab["window"], lab.get("position", lab.get("method")))] = v
    return out


@pytest.mark.parametrize("skip_zero_page", [False, True], ids=["full", "zero-page-lost"])
def test_replay_matches_independent_computation_across_restart(skip_zero_page):
    """Every derived value, at every poll, equals the independent computation; the restart
    gap shows the target down with no derived series; one reset is counted; no spike."""
    steps, timeline = build_steps(skip_zero_page)
    assert sum(1 for _, p in timeline if p is None) >= 15, "fixture restart gap not found"
    clock = Clock()
    with PageSequenceServer(steps) as server:
        cfg = app_settings.build_config(None, [f"vllm={server.url}"], "127.0.0.1:0", 2.0)
        app = ServeApp(cfg, clock=clock)
        app.start(poll=False)
        try:
            host, port = app.web.address
            metrics_url = f"http://{host}:{port}/metrics"
            ind = Independent()
            http_errors = conn_errors = 0
            max_rate_before_restart = 0.0
            restarted = False
            for i, (t, text) in enumerate(timeline):
                server.set_step(i)
                clock.t = t
                result = app.poller.poll_now("vllm")
                series = scrape(metrics_url)
                up = series[("specwatch_target_up", frozenset({("target", "vllm")}))]
                derived = derived_from_scrape(series)
                if text is None:
                    assert result.error_reason in ("http_status", "connection")
                    http_errors += result.error_reason == "http_status"
                    conn_errors += result.error_reason == "connection"
                    assert up == 0.0
                    assert not [k for k in series if k[0].startswith("sd_")], \
                        "a down target must expose no derived series"
                    restarted = True
                    continue
                assert result.error_reason is None, result.error_message
                assert up == 1.0
                ind.add(t, text)
                expected = ind.expected()
                assert set(derived) == set(expected), (
                    f"poll {i}: missing {set(expected) - set(derived)}, "
                    f"unexpected {set(derived) - set(expected)}")
                for key, want in expected.items():
                    assert derived[key] == pytest.approx(want, rel=1e-9, abs=1e-12), key
                    if ("rate" in key[0] and key[0] != "sd_arrival_rate") or \
                            key[0] == "sd_token_acceptance_probability":
                        assert 0.0 <= derived[key] <= 1.0, key
                    assert derived[key] >= 0.0, key
                one_min = derived.get(("sd_arrival_rate", "1m", None))
                if one_min is not None:
                    if not restarted:
                        max_rate_before_restart = max(max_rate_before_restart, one_min)
                    else:
                        assert one_min <= max_rate_before_restart, "spike after restart"
                resets = series[("specwatch_target_resets_total",
                                 frozenset({("target", "vllm")}))]
                assert resets == ind.resets
                k = series.get(("sd_draft_length_configured",
                                frozenset({("target", "vllm"), ("model_name", "tiny-llama")})))
                assert k == len(ind.positions) == 4
                # The lifetime sample histogram matches the independent samples.
                n = len(ind.samples)
                count = select(series, "sd_acceptance_rate_samples_count")
                assert list(count.values()) == ([float(n)] if i > 0 else [0.0])
                for le in ("0.05", "0.5", "0.75", "1.0"):
                    bucket = select(series, "sd_acceptance_rate_samples_bucket", le=le)
                    want = sum(1 for _, x in ind.samples if x <= float(le) + 1e-12)
                    assert list(bucket.values()) == [float(want)]
            assert ind.resets == 1, "the fixture restarts the server exactly once"
            assert http_errors == 5 and conn_errors >= 10
            errors = select(series, "specwatch_target_poll_errors_total", target="vllm")
            by_reason = {dict(k[1])["reason"]: v for k, v in errors.items()}
            assert by_reason == {"timeout": 0.0, "connection": float(conn_errors), "tls": 0.0,
                                 "http_status": 5.0, "parse": 0.0, "too_large": 0.0}
            last = series[("specwatch_target_last_success_timestamp_seconds",
                           frozenset({("target", "vllm")}))]
            assert last == timeline[-1][0]
            # Sanity on the real data: the last phase (temperature 0) accepts about 0.65.
            assert 0.55 < derived[("sd_acceptance_rate", "1m", None)] < 0.8
        finally:
            app.stop()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_real_serve_command_polls_serves_and_passes_promtool(tmp_path):
    """`specwatch serve` as a subprocess (real scheduler, real config file) polls the
    recorded pages, serves derived series that pass `promtool check metrics`, answers
    /healthz and /, and exits 0 on SIGTERM."""
    pages = [Page(text) for _, text in fixture_pages(FIXTURES)[:30]]
    with PageSequenceServer(pages, advance="per_request") as server:
        cfg = tmp_path / "specwatch.yaml"
        cfg.write_text(
            "global:\n  poll_interval: 0.1\n  windows: [1m]\n  count_window: 200\n"
            f"targets:\n  - name: replay\n    url: {server.url}\n    engine: vllm\n")
        proc = subprocess.Popen(
            [sys.executable, "-m", "specwatch", "serve", "--config", str(cfg),
             "--listen", "127.0.0.1:0", "--log-level", "info"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            port = _wait_for_port(proc)
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 20
            text = ""
            while time.monotonic() < deadline:
                text = fetch_text(base + "/metrics")
                if "sd_acceptance_rate{" in text and "window=\"200req\"" in text:
                    break
                time.sleep(0.1)
            series = parse_exposition(text)
            assert select(series, "sd_acceptance_rate", target="replay", window="1m")
            assert select(series, "sd_arrival_rate", target="replay", window="200req")
            check = subprocess.run(["promtool", "check", "metrics"], input=text,
                                   capture_output=True, text=True, timeout=30)
            assert check.returncode == 0, check.stdout + check.stderr
            assert fetch_text(base + "/healthz") == "ok\n"
            assert "/metrics" in fetch_text(base + "/")
        finally:
            proc.terminate()
            _out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err


def _wait_for_port(proc: subprocess.Popen) -> int:
    """The exporter logs its bound address at startup; read it from stderr."""
    assert proc.stderr is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            if proc.poll() is not None:
                raise AssertionError(f"serve exited early: {proc.returncode}")
            continue
        if "serving on http://" in line:
            return int(line.split("serving on http://", 1)[1].split("/")[0].rsplit(":", 1)[1])
    raise AssertionError("serve did not report its address")


def test_math_sanity_of_helpers():
    """The independent α solver inverts E(α, k) (guards the test's own reference code)."""
    for a in (0.1, 0.5, 0.9):
        e = (1 - a ** 4) / (1 - a)
        assert solve_alpha(e, 3) == pytest.approx(a, abs=1e-9)
    assert math.isclose(solve_alpha(4.0, 3), 1.0)
