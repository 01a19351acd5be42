"""`specwatch advise --prometheus` against a real Prometheus backfilled with known traffic.

Seven days of vLLM series at one sample a minute are written as OpenMetrics and turned into
TSDB blocks by `promtool tsdb create-blocks-from openmetrics`; Prometheus serves them. The
request rate is a staircase whose shares of time put each percentile on a plateau far from
the steps (2 req/s for 55% of the week, 5 for 35%, 8 for 8%, 12 for 2%), so the exact
values are known: p50 = 2, p95 = 8, p99 = 12. Lengths, their P95 (bucket fractions fixed),
the acceptance profile and the peak batch (one 37-request spike) are known the same way.

Also: no traffic for the selector, and Prometheus unreachable, are one clear error, exit 2.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from specwatch.app.demo import free_port
from specwatch.cli import main

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="needs Debian's prometheus and promtool (make setup installs them)")

REPO = Path(__file__).resolve().parents[2]
PARAMS = REPO / "src/specwatch/sim/data/scenarios/demo-params.yaml"
MINUTES = 7 * 24 * 60
LEVELS = [(2, 0.55), (5, 0.35), (8, 0.08), (12, 0.02)]  # req/s, share of the week
PROMPT_BUCKETS = [(400, 0.2), (800, 0.5), (1600, 1.0)]  # p95 = 800 + 800 * 0.45/0.5 = 1520
GEN_BUCKETS = [(100, 0.3), (200, 0.6), (400, 1.0)]  # p95 = 200 + 200 * 0.35/0.4 = 375
PROFILE = (0.7, 0.49, 0.343)
DRAFTS_PER_MIN = 1000
PEAK = 37
LABELS = 'model_name="llama",engine="0"'


def _rates() -> list[int]:
    out: list[int] = []
    for rate, share in LEVELS:
        out += [rate] * round(share * MINUTES)
    return out[:MINUTES] + [LEVELS[-1][0]] * (MINUTES - len(out))


def openmetrics(end: int) -> str:
    """The week of series ending at ``end`` (Unix seconds, a whole minute)."""
    rates = _rates()
    times = [end - (MINUTES - 1 - i) * 60 for i in range(MINUTES)]
    fams: dict[str, list[str]] = {}

    def counter(name: str, labels: str, incs: list[float]) -> None:
        total = 0.0
        lines = fams.setdefault(name, [])
        for t, inc in zip(times, incs, strict=True):
            total += inc
            lines.append(f"{name}{{{labels}}} {total:g} {t}")

    reqs = [r * 60 for r in rates]
    counter("vllm:e2e_request_latency_seconds_count", LABELS, reqs)
    for name, mean, buckets in (("vllm:request_prompt_tokens", 800, PROMPT_BUCKETS),
                                ("vllm:request_generation_tokens", 200, GEN_BUCKETS)):
        counter(f"{name}_count", LABELS, reqs)
        counter(f"{name}_sum", LABELS, [n * mean for n in reqs])
        for le, frac in [*buckets, ("+Inf", 1.0)]:
            counter(f"{name}_bucket", f'{LABELS},le="{le}"', [n * frac for n in reqs])
    counter("vllm:spec_decode_num_drafts_total", LABELS, [DRAFTS_PER_MIN] * MINUTES)
    for pos, p in enumerate(PROFILE):
        counter("vllm:spec_decode_num_accepted_tokens_per_pos_total",
                f'{LABELS},position="{pos}"', [DRAFTS_PER_MIN * p] * MINUTES)
    running = fams.setdefault("vllm:num_requests_running", [])
    for i, t in enumerate(times):
        value = PEAK if i == MINUTES // 3 else 5 + (i % 7)
        running.append(f"vllm:num_requests_running{{{LABELS}}} {value} {t}")
    text = []
    for name, lines in fams.items():
        kind = "gauge" if name == "vllm:num_requests_running" else "unknown"
        text.append(f"# TYPE {name} {kind}")
        text += lines
    return "\n".join(text) + "\n# EOF\n"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    tmp = tmp_path_factory.mktemp("advise-prom")
    end = (int(time.time()) // 60) * 60 - 3600
    (tmp / "week.om").write_text(openmetrics(end))
    data = tmp / "data"
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics",
                    str(tmp / "week.om"), str(data)], check=True, capture_output=True)
    (tmp / "prometheus.yml").write_text("global: {scrape_interval: 1m}\n")
    port = free_port()
    log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={data}", "--storage.tsdb.retention.time=30d",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, (tmp / "prometheus.log").read_text()
            time.sleep(0.3)
        yield url, end
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()


def advise_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict]:
    rc = main(["advise", "--params", str(PARAMS), "--json", *argv])
    out = capsys.readouterr().out
    return rc, json.loads(out) if out.strip() else {}


def test_every_percentile_lengths_profile_and_peak_batch_exactly(prometheus, capsys):
    url, end = prometheus
    rc, out = advise_json(capsys, ["--prometheus", url, "--selector", 'model_name="llama"',
                                   "--at", str(end)])
    assert rc == 0, out
    pq = out["percentiles"]
    assert pq["p50"]["arrival_rate"] == pytest.approx(2.0, rel=1e-9)
    assert pq["p95"]["arrival_rate"] == pytest.approx(8.0, rel=1e-9)
    assert pq["p99"]["arrival_rate"] == pytest.approx(12.0, rel=1e-9)
    t = out["traffic"]
    assert t["peak_batch"] == PEAK
    assert out["prompt_tokens"] == pytest.approx(800, rel=1e-9)
    assert out["generation_tokens"] == pytest.approx(200, rel=1e-9)
    assert t["prompt_tokens_p95"] == pytest.approx(1520, rel=1e-9)
    assert t["generation_tokens_p95"] == pytest.approx(375, rel=1e-9)
    assert t["acceptance_profile"] == pytest.approx(list(PROFILE), rel=1e-9)
    assert out["acceptance_source"] == "measured profile"
    # A decision for every percentile and for the peak batch, with validity.
    for q in ("p50", "p95", "p99"):
        assert {"speedup", "optimal_draft_length", "valid", "schedule_draft_length"} <= set(
            pq[q])
    assert out["peak"]["batch"] == PEAK and "valid" in out["peak"]
    assert out["min_gain"] == 1.1 and out["schedule"]
    # prompt/generation = 4 meets the default prefill ratio: sized by the peak batch.
    assert out["sized_by_peak_batch"] is True
    assert any("sized by the peak batch" in line for line in out["advice"])


def test_text_output_names_where_the_numbers_came_from(prometheus, capsys):
    url, end = prometheus
    rc = main(["advise", "--params", str(PARAMS), "--prometheus", url, "--at", str(end),
               "--prefill-ratio", "10"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "Traffic from" in text and "peak batch 37" in text
    assert "sized by the peak batch" not in text  # 800/200 = 4 < 10


def test_min_gain_keeps_sd_off_below_it(prometheus, capsys):
    url, end = prometheus
    rc, out = advise_json(capsys, ["--prometheus", url, "--at", str(end), "--min-gain", "50",
                                   "--prefill-ratio", "100"])
    assert rc == 0
    assert out["enable"] is False and out["below_min_gain"] is not None


def test_no_traffic_for_the_selector_is_exit_2(prometheus, capsys):
    url, end = prometheus
    rc = main(["advise", "--params", str(PARAMS), "--prometheus", url, "--selector",
               'model_name="nope"', "--at", str(end)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "no request-rate data" in err and "Traceback" not in err


def test_unreachable_prometheus_is_exit_2(capsys):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    rc = main(["advise", "--params", str(PARAMS), "--prometheus", f"http://127.0.0.1:{port}"])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot reach Prometheus" in err


def test_calibrate_from_pairs_without_pair_series_is_exit_2_and_writes_nothing(
        prometheus, capsys, tmp_path):
    """`calibrate --prometheus --point-sources pairs` where no exporter pair was ever
    scraped: one clear error, exit 2, no parameters file."""
    url, end = prometheus
    out = tmp_path / "params.yaml"
    rc = main(["calibrate", "--prometheus", url, "--start", str(end - 3600), "--end",
               str(end), "--point-sources", "pairs", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "no measured-pair series" in err and "Traceback" not in err
    assert not out.exists()
