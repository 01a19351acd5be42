"""TensorRT-LLM and llama.cpp live: pages served over HTTP, `specwatch serve`, a real Prometheus.

Protected behaviour: the constructed page sequences of tests/fixtures/engines-constructed/
are served as two live targets that advance through their four scrapes (serving, one
minute later, restarted, one minute after the restart); a `specwatch serve` process, its
config naming them `engine: trtllm` and `engine: llamacpp`, polls them every second; Debian's
Prometheus scrapes the exporter every second. The SD overview dashboard's own queries
(exporter series only), run against that Prometheus, return data for each signal the engine
allows (docs/metrics.md, "Signals per engine") and none for each one it cannot give: absent,
not 0.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers.pageserver import Page, PageSequenceServer
from helpers.paths import FIXTURES
from mixin_helpers import dashboard_exprs, load_dashboards, metric_names, substitute_target_vars
from promsim import query_range, scrape_job, scraping_prometheus, wait_for_scrape_after

from specwatch.app.demo import free_port

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="needs Debian's prometheus (make setup installs it)")

PAGES = FIXTURES / "engines-constructed"
WINDOW = "10s"  # the exporter's short window (a page change stays in it for ten 1 s polls);
# it also derives 1m, the window some panels name outright
HOLD = 4  # polls of the exporter each page is served for
SD = "specwatch-sd-overview.json"
#: What each engine's target gives, and what it cannot (docs/metrics.md).
ALLOWED = {"sd_acceptance_rate", "sd_acceptance_length", "sd_acceptance_alpha",
           "sd_draft_length", "sd_position_acceptance_rate", "sd_draft_length_configured"}
CANNOT = {"sd_mean_prompt_tokens", "sd_mean_generation_tokens"}
ENGINE_ONLY = {"sd_arrival_rate", "sd_mean_latency_seconds", "sd_effective_batch_size",
               "sd_server_kv_cache_tokens"}
TARGETS = {"trt": ("trtllm", ALLOWED | ENGINE_ONLY, CANNOT),
           "lcpp": ("llamacpp", ALLOWED, CANNOT | ENGINE_ONLY)}


def _sequence(engine: str) -> list[Page]:
    return [Page(p.read_text()) for p in sorted((PAGES / engine).glob("snap_*.txt"))]



def _wait_polls(servers: list[PageSequenceServer], polls: int) -> None:
    """Until each server has answered ``polls`` more requests (the exporter's polls)."""
    marks = [s.requests + polls for s in servers]
    deadline = time.monotonic() + 30
    while any(s.requests < m for s, m in zip(servers, marks, strict=True)):
        assert time.monotonic() < deadline, "the exporter did not poll the page servers"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """Both sequences served and advanced live under `specwatch serve` scraped by Prometheus;
    yields (Prometheus URL, start, end)."""
    tmp: Path = tmp_path_factory.mktemp("engines-serve")
    port = free_port()
    with PageSequenceServer(_sequence("trtllm")) as trt, \
            PageSequenceServer(_sequence("llamacpp")) as lcpp:
        cfg = {"global": {"listen": f"127.0.0.1:{port}", "poll_interval": "1s",
                          "windows": [WINDOW, "1m"]},
               "targets": [{"name": "trt", "url": trt.url, "engine": "trtllm"},
                           {"name": "lcpp", "url": lcpp.url, "engine": "llamacpp"}]}
        (tmp / "specwatch.yaml").write_text(yaml.safe_dump(cfg))
        log = (tmp / "exporter.log").open("wb")
        exporter = subprocess.Popen(
            [sys.executable, "-m", "specwatch", "serve", "--config", str(tmp / "specwatch.yaml")],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            with scraping_prometheus(tmp, [scrape_job("specwatch", f"127.0.0.1:{port}")]) as prom:
                start = time.time()
                servers = [trt, lcpp]
                for step in range(len(trt.steps)):
                    for s in servers:
                        s.set_step(step)
                    _wait_polls(servers, HOLD)
                    assert exporter.poll() is None, (tmp / "exporter.log").read_text()
                end = wait_for_scrape_after(prom, time.time())
                yield prom, start, end
        finally:
            exporter.terminate()
            exporter.wait(timeout=30)
            log.close()


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_the_sd_dashboard_shows_what_the_engine_gives_live(live, target):
    """Each exporter-only query of the SD dashboard returns data for the target where the
    engine gives all its series, and none where it reads one the engine cannot give."""
    prom, start, end = live
    engine, allowed, cannot = TARGETS[target]
    missing = sorted(n for n in allowed
                     if not query_range(prom, f'{n}{{target="{target}"}}', start, end, "1s"))
    assert missing == [], f"{engine}: signals it gives have no data: {missing}"
    present = sorted(n for n in cannot
                     if query_range(prom, f'{n}{{target="{target}"}}', start, end, "1s"))
    assert present == [], f"{engine}: signals it cannot give have data: {present}"
    checked, empty, silent = 0, [], []
    for where, expr in dashboard_exprs(SD, load_dashboards()[SD]):
        names = metric_names(expr)
        sd_names = {n for n in names if n.startswith("sd_")}
        if "panel" not in where or not sd_names or names - sd_names:
            continue  # not a panel, or reads engine or Prometheus series
        result = query_range(prom, substitute_target_vars(expr, target, WINDOW), start, end, "1s")
        if sd_names <= allowed:
            checked += 1
            if not result:
                empty.append(where)
        elif sd_names <= cannot and result:
            silent.append(where)
    assert empty == []
    assert silent == []
    assert checked >= 8
