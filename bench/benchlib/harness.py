"""Run one specwatch exporter (``ServeApp``, exactly what ``specwatch serve`` runs) and
measure it: every poll's start and end, process CPU seconds, resident memory.

Run as its own process by bench/bench_fleet.py:
``python bench/benchlib/harness.py --config FILE --duration S --out FILE.json [--prefill]``.
It prints ``LISTEN host:port`` once serving, so the driver can scrape ``/metrics`` like
Prometheus would, and writes the measurements as JSON when done.

``--prefill`` first fills every target's history with one retention period of polls (one
hour at the poll interval, from the recorded vLLM pages, already parsed): the memory and the
per-poll derive work of an exporter that has run for an hour, not of one that just started.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import resource
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specwatch.app.serve import ServeApp
from specwatch.exporter import config, sources

from benchlib.pages import real_pages

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE_SIZE


def prefill(app: ServeApp, interval: float, seconds: float) -> int:
    """Preload ``seconds`` of poll history per target, ending now; returns polls per target."""
    pages = [sources.parse_page(p) for p in real_pages()]
    n = int(seconds / interval)
    now = app.history_clock()  # the clock windows are measured on (monotonic)
    for i, name in enumerate(app.pipeline.snapshot.targets):
        hist = app.pipeline.target_history(name)
        for k in range(n):
            hist.update(pages[(i + k) % len(pages)], now - (n - k) * interval)
    return n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--prefill", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    cfg = config.build_config(args.config, [], None, None)
    app = ServeApp(cfg)
    prefill_polls = 0
    t_prefill = time.process_time()
    if args.prefill:
        retention = max(max(s for _, s in cfg.windows), 3600.0)
        prefill_polls = prefill(app, cfg.poll_interval, retention)
    t_prefill = time.process_time() - t_prefill
    gc.collect()

    records: list[tuple[str, float, float, str | None]] = []
    deliver = app.poller.on_result

    def on_result(result) -> None:
        deliver(result)
        records.append((result.target, result.started, result.finished, result.error_reason))

    app.poller.on_result = on_result
    rss_samples: list[int] = []
    thread_samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.25):
            rss_samples.append(rss_bytes())
            thread_samples.append(threading.active_count())

    rss_before = rss_bytes()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    cpu0, wall0 = time.process_time(), time.time()
    app.start()
    host, port = app.web.address
    print(f"LISTEN {host}:{port}", flush=True)
    time.sleep(args.duration)
    cpu1, wall1 = time.process_time(), time.time()
    stop.set()
    app.stop()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out = {
        "targets": len(app.targets.targets), "interval": cfg.poll_interval,
        "parser": cfg.parser, "start": wall0, "end": wall1, "cpu_seconds": cpu1 - cpu0,
        "prefill_polls_per_target": prefill_polls, "prefill_cpu_seconds": t_prefill,
        "rss_before_bytes": rss_before, "rss_peak_sampled_bytes": max(rss_samples or [0]),
        "maxrss_lifetime_bytes": usage.ru_maxrss * 1024, "threads_peak": max(thread_samples or [0]),
        "polls": records,
    }
    Path(args.out).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
