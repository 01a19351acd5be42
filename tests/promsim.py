"""A real Prometheus for tests: simulated vLLM history backfilled into a TSDB, or live scraping.

`openmetrics_history` renders what Prometheus would have scraped from a vLLM server every
15 s while an operator ran it through phases (no SD, then SD at several draft lengths, two
workloads, three loads each), with mean latencies from the latency model and KNOWN
coefficients (plus seeded noise), counters reset at each restart that changed the draft
length, and SD families absent while SD was off. `promtool tsdb create-blocks-from
openmetrics` turns it into TSDB blocks and `running_prometheus` serves them on a free port.

Prometheus 2.42 notes that shape this: backfilled blocks older than the retention
(15 d by default) are deleted at start, so the history ends shortly before "now"; a range
query's rate() needs two samples per window, so --step is several scrape intervals; the
OpenMetrics input must group each family's samples together and end with "# EOF".

`scraping_prometheus` is the live counterpart the end-to-end tests share: a Prometheus that
scrapes their exporter (or simulator) every second and evaluates the mixin's rules;
`query` and `wait_for_scrape_after` read it (a test that steps its own clock waits for a
scrape of each state it must see).
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

from specwatch.model.acceptance import acceptance_length_from_alpha
from specwatch.model.closed_form import latency
from specwatch.model.coefficients import Coefficients

SCRAPE_S = 15.0
MODEL = "qwen-sim"


@dataclass(frozen=True)
class Phase:
    """One steady stretch of traffic: draft length, workload, arrival rate, duration."""

    k: int
    prompt_tokens: float
    generation_tokens: float
    arrival_rate: float
    seconds: float


TRUE = Coefficients(a_p=0.05, b_p=0.002, a_v=0.03, b_v=0.0001, a_d=0.003, b_d=0.00005)
ALPHA = 0.7


def default_phases(minutes: float = 12.0) -> list[Phase]:
    """k in {0, 2, 4} (restart between), two workloads, loads 1, 4 and 8 req/s."""
    out = []
    for k in (0, 2, 4):
        for p, g in ((150.0, 200.0), (600.0, 400.0)):
            for lam in (1.0, 4.0, 8.0):
                out.append(Phase(k, p, g, lam, minutes * 60.0))
    return out


def openmetrics_history(
    phases: list[Phase], end: float, coef: Coefficients = TRUE, seed: int = 7, noise: float = 0.02,
    kv_cache_tokens: dict[int, int] | None = None,
) -> tuple[str, float]:
    """OpenMetrics text of the whole history ending at `end`; returns (text, start time).

    `kv_cache_tokens` (draft length -> tokens): the server states its KV cache in
    vllm:cache_config_info as vLLM 0.32 does (no model_name label; blocks of 16 tokens), on
    two engines holding half each."""
    rng = random.Random(seed)
    total = sum(ph.seconds for ph in phases) + SCRAPE_S * 2 * len(phases)
    t = math.floor((end - total) / SCRAPE_S) * SCRAPE_S
    start = t
    # family -> list of (labels, value, ts) in time order
    samples: dict[str, list[tuple[str, float, float]]] = {}
    types: dict[str, str] = {}

    def emit(family: str, kind: str, name: str, labels: str, value: float, ts: float) -> None:
        types[family] = kind
        samples.setdefault(family, []).append((f"{name}{{{labels}}}", value, ts))

    counters: dict[str, float] = {}

    def add(key: str, inc: float) -> float:
        counters[key] = counters.get(key, 0.0) + inc
        return counters[key]

    previous_k: int | None = None
    base = f'engine="0",model_name="{MODEL}"'
    for ph in phases:
        if previous_k is not None and ph.k != previous_k:
            counters.clear()  # vLLM restarted with a new speculative config
            t += 2 * SCRAPE_S  # no scrape while it restarts
        previous_k = ph.k
        e = float(acceptance_length_from_alpha(ALPHA, ph.k)) if ph.k else 1.0
        mean_l = float(
            latency(
                coef,
                ph.arrival_rate,
                ph.k,
                e,
                ph.prompt_tokens,
                ph.generation_tokens,
                max_utilization=1.0,
            ).latency
        )
        steps = int(ph.seconds / SCRAPE_S)
        for _ in range(steps):
            t += SCRAPE_S
            n = ph.arrival_rate * SCRAPE_S
            lat = mean_l * (1.0 + rng.uniform(-noise, noise))
            e_now = e if ph.k == 0 else min(ph.k + 1.0, e * (1.0 + rng.uniform(-0.01, 0.01)))

            count = add("count", n)
            if kv_cache_tokens is not None:  # two data-parallel engines, half each
                half = kv_cache_tokens[ph.k] // 2
                for engine in ("0", "1"):
                    emit("vllm:cache_config_info", "gauge", "vllm:cache_config_info",
                         f'block_size="16",cache_dtype="auto",engine="{engine}",'
                         f'kv_cache_size_tokens="{half}",num_gpu_blocks="{half // 16}"', 1.0, t)
            histograms = {
                "vllm:e2e_request_latency_seconds": add("lat", n * lat),
                "vllm:request_prompt_tokens": add("prompt", n * ph.prompt_tokens),
                "vllm:request_generation_tokens": add("gen", n * ph.generation_tokens),
                "vllm:time_to_first_token_seconds": add("ttft", n * 0.06),
            }
            for family, total_sum in histograms.items():
                emit(family, "histogram", f"{family}_bucket", f'{base},le="+Inf"', count, t)
                emit(family, "histogram", f"{family}_count", base, count, t)
                emit(family, "histogram", f"{family}_sum", base, total_sum, t)
            emit(
                "vllm:request_success",
                "counter",
                "vllm:request_success_total",
                f'{base},finished_reason="stop"',
                count,
                t,
            )
            if ph.k:
                drafts = n * ph.generation_tokens / e_now
                emit(
                    "vllm:spec_decode_num_drafts",
                    "counter",
                    "vllm:spec_decode_num_drafts_total",
                    base,
                    add("drafts", drafts),
                    t,
                )
                emit(
                    "vllm:spec_decode_num_draft_tokens",
                    "counter",
                    "vllm:spec_decode_num_draft_tokens_total",
                    base,
                    add("draft_tokens", drafts * ph.k),
                    t,
                )
                emit(
                    "vllm:spec_decode_num_accepted_tokens",
                    "counter",
                    "vllm:spec_decode_num_accepted_tokens_total",
                    base,
                    add("accepted", drafts * (e_now - 1.0)),
                    t,
                )
                for i in range(ph.k):
                    emit(
                        "vllm:spec_decode_num_accepted_tokens_per_pos",
                        "counter",
                        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                        f'{base},position="{i}"',
                        add(f"pos{i}", drafts * ALPHA ** (i + 1)),
                        t,
                    )
    lines = []
    for family, rows in samples.items():
        lines.append(f"# TYPE {family} {types[family]}")
        by_series: dict[str, list[tuple[float, float]]] = {}
        for series, value, ts in rows:
            by_series.setdefault(series, []).append((value, ts))
        for series, values in by_series.items():
            lines.extend(f"{series} {v:.6f} {ts:.3f}" for v, ts in values)
    lines.append("# EOF")
    return "\n".join(lines) + "\n", start


def backfill(text: str, tsdb: Path) -> None:
    """promtool tsdb create-blocks-from openmetrics (the real Debian promtool)."""
    tsdb.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".om", delete=False) as fh:
        fh.write(text)
        src = fh.name
    try:
        subprocess.run(
            ["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", src, str(tsdb)],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        Path(src).unlink(missing_ok=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_prometheus(tsdb: Path, workdir: Path, args: Sequence[str] = ()) -> Iterator[str]:
    """Start the real prometheus binary on a free port over `tsdb` (with `args` added to its
    flags); yield its base URL."""
    config = workdir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\nscrape_configs: []\n", encoding="utf-8")
    with _prometheus(config, tsdb, workdir, ["--storage.tsdb.retention.time=30d", *args]) as url:
        yield url


def scrape_job(name: str, *addresses: str) -> dict[str, Any]:
    """A scrape config of static targets (``HOST:PORT``), for :func:`scraping_prometheus`."""
    return {"job_name": name, "static_configs": [{"targets": list(addresses)}]}


@contextlib.contextmanager
def scraping_prometheus(workdir: Path, scrape_configs: Sequence[dict[str, Any]],
                        rule_files: Sequence[Path] = (), interval: str = "1s") -> Iterator[str]:
    """The real prometheus binary on a free port, scraping ``scrape_configs`` and evaluating
    ``rule_files`` every ``interval`` (its TSDB and log in ``workdir``): yield its base URL
    once it is ready, stop it on exit.

    What the live end-to-end tests share (a simulator or exporter is scraped, the mixin's
    rules are evaluated on the wall clock): one place for the config, the free port and its
    retry, the readiness wait and the shutdown."""
    config = workdir / "prometheus.yml"
    doc = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
           "rule_files": [str(f) for f in rule_files],
           "scrape_configs": list(scrape_configs)}
    config.write_text(yaml.safe_dump(doc), encoding="utf-8")
    with _prometheus(config, workdir / "data", workdir, ["--log.level=warn"]) as url:
        yield url


def get_json(url: str, timeout: float = 5.0) -> Any:
    """GET ``url`` and decode its JSON body."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def query(prom: str, expr: str) -> list[dict[str, Any]]:
    """An instant query of Prometheus at ``prom``: its result rows."""
    data = get_json(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert data["status"] == "success", data
    return data["data"]["result"]


def query_range(prom: str, expr: str, start: float, end: float, step: str,
                timeout: float = 5.0) -> list[dict[str, Any]]:
    """A range query of Prometheus at ``prom``: its result rows."""
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    data = get_json(f"{prom}/api/v1/query_range?{q}", timeout)
    assert data["status"] == "success", data
    return data["data"]["result"]


def wait_for_scrape_after(prom: str, wall: float, job: str = "specwatch",
                          timeout: float = 60.0, poll: float = 0.2) -> float:
    """Until Prometheus has scraped ``job`` successfully in a scrape that started after
    ``wall`` (Unix seconds); returns that scrape's timestamp.

    Only a successful scrape counts: a failed one stores no sample of the page (and
    marks its series stale), so what the page showed after ``wall`` would be missing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            rows = query(prom, f'timestamp(up{{job="{job}"}} == 1)')
        except OSError:
            rows = []
        if rows and float(rows[0]["value"][1]) > wall:
            return float(rows[0]["value"][1])
        time.sleep(poll)
    raise AssertionError(f"Prometheus at {prom} did not scrape {job} in {timeout}s")


@contextlib.contextmanager
def _prometheus(config: Path, tsdb: Path, workdir: Path, args: Sequence[str]) -> Iterator[str]:
    """Run prometheus with ``config`` over ``tsdb`` on a free port (three tries: the port
    can be taken between picking and binding); yield its URL once /-/ready answers."""
    if shutil.which("prometheus") is None:
        raise RuntimeError("prometheus is not installed (make setup installs it)")
    for _attempt in range(3):
        port = _free_port()
        with (workdir / "prometheus.log").open("w") as log:
            proc = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tsdb}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    *args,
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        ready = False
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    ready = True
                    break
            time.sleep(0.1)
        if ready:
            try:
                yield url
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            return
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if proc.poll() is None:
            proc.kill()
    log_text = (workdir / "prometheus.log").read_text(encoding="utf-8", errors="replace")
    raise RuntimeError(f"prometheus did not become ready:\n{log_text[-2000:]}")
