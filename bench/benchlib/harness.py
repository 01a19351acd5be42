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
import copy
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

from benchlib.pages import real_pages
from specwatch.app import settings
from specwatch.app.serve import ServeApp
from specwatch.poll import poller, sources
from specwatch.poll.pipeline import Pipeline
from specwatch.poll.windows import history

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE_SIZE


def prefill(pipeline: Pipeline, interval: float, seconds: float, now: float) -> int:
    """Preload ``seconds`` of poll history per target, ending at ``now`` (on the clock
    windows are measured on); returns polls per target.

    Target ``i`` gets the recorded pages from page ``i`` on, so targets ``i`` and ``i + 49``
    get the same history: the first target of each start page is filled poll by poll, the
    others get a deep copy of its state (their own arrays, the same values; their own
    forget hooks), which makes thousands of targets quick to preload."""
    pages = [sources.parse_page(p) for p in real_pages()]
    n = int(seconds / interval)
    filled: dict[int, history.TargetHistory] = {}
    for i, name in enumerate(pipeline.snapshot.targets):
        hist = pipeline.target_history(name)
        first = filled.get(i % len(pages))
        if first is None:
            for k in range(n):
                hist.update(pages[(i + k) % len(pages)], now - (n - k) * interval)
            filled[i % len(pages)] = hist
        else:
            clone = copy.deepcopy(first, memo={id(first.on_forget): hist.on_forget})
            vars(hist).update(vars(clone))
    return n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--prefill", action="store_true")
    parser.add_argument("--warmup", type=float, default=0.0,
                        help="seconds of polling (and scrapes) before measuring")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    cfg = settings.build_config(args.config, [], None, None)
    app = ServeApp(cfg)
    prefill_polls = 0
    t_prefill = time.process_time()
    if args.prefill:
        retention = max(max(s for _, s in cfg.windows), 3600.0)
        prefill_polls = prefill(app.pipeline, cfg.poll_interval, retention,
                                app.history_clock())
    t_prefill = time.process_time() - t_prefill
    gc.collect()

    records: list[tuple[str, float, float, str | None]] = []
    deliver = app.poller.on_result
    # Where a poll's CPU goes, on the polling thread's own clock: the fetch, the result
    # handling (parse, history, derive, hooks, publish), and the pre-rendering a worker does
    # after its run of polls; the rest of the process's CPU is scheduling, threads, scrapes
    # and the garbage collector.
    stage_cpu = {"fetch": 0.0, "apply": 0.0, "render": 0.0}
    real_fetch = poller.fetch

    def timed_fetch(*a, **kw):
        t0 = time.thread_time()
        try:
            return real_fetch(*a, **kw)
        finally:
            stage_cpu["fetch"] += time.thread_time() - t0

    poller.fetch = timed_fetch

    def on_result(result) -> None:
        t0 = time.thread_time()
        deliver(result)
        stage_cpu["apply"] += time.thread_time() - t0
        records.append((result.target, result.started, result.finished, result.error_reason))

    app.poller.on_result = on_result
    after_run = getattr(app.poller, "after_run", None)  # (None: code before it existed)

    def timed_after_run() -> None:
        t0 = time.thread_time()
        if after_run is not None:
            after_run()
        stage_cpu["render"] += time.thread_time() - t0

    app.poller.after_run = timed_after_run
    # Each /metrics scrape in the exporter: (thread CPU seconds, wall seconds, bytes sent).
    scrape_times: list[tuple[float, float, int]] = []
    metrics_route = app.web.routes["/metrics"]

    def timed_metrics(req):
        c0, w0 = time.thread_time(), time.perf_counter()
        resp = metrics_route(req)
        scrape_times.append((time.thread_time() - c0, time.perf_counter() - w0,
                             len(resp.body)))
        return resp

    app.web.routes["/metrics"] = timed_metrics
    rss_samples: list[int] = []
    thread_samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.25):
            rss_samples.append(rss_bytes())
            thread_samples.append(threading.active_count())

    # The cyclic garbage collector's passes during the run (count and CPU per generation):
    # a full pass walks every tracked object of 500 targets' state.
    gc_runs = [0, 0, 0]
    gc_cpu = [0.0, 0.0, 0.0]
    gc_started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_started[0] = time.thread_time()
        else:
            gc_runs[info["generation"]] += 1
            gc_cpu[info["generation"]] += time.thread_time() - gc_started[0]

    rss_before = rss_bytes()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    app.start()
    host, port = app.web.address
    print(f"LISTEN {host}:{port}", flush=True)
    if args.warmup > 0:
        # Steady state: the start-up round (a worker per target) is over, and the collector
        # has seen the scrapes it needs to render only what a scrape will read.
        time.sleep(args.warmup)
        stage_cpu.update(fetch=0.0, apply=0.0, render=0.0)
        records.clear()  # (list.clear and appends are atomic: no poll is lost or half-kept)
        scrape_times.clear()
    gc.callbacks.append(on_gc)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu0, wall0 = time.process_time(), time.time()
    time.sleep(args.duration)
    cpu1, wall1 = time.process_time(), time.time()
    gc.callbacks.remove(on_gc)
    stop.set()
    app.stop()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    ru1 = usage
    out = {
        "targets": len(app.targets.targets), "interval": cfg.poll_interval, "warmup": args.warmup,
        "parser": cfg.parser, "start": wall0, "end": wall1, "cpu_seconds": cpu1 - cpu0,
        "prefill_polls_per_target": prefill_polls, "prefill_cpu_seconds": t_prefill,
        "rss_before_bytes": rss_before, "rss_peak_sampled_bytes": max(rss_samples or [0]),
        "maxrss_lifetime_bytes": usage.ru_maxrss * 1024, "threads_peak": max(thread_samples or [0]),
        "gc_runs": gc_runs, "gc_cpu_seconds": gc_cpu, "gc_tracked_objects": len(gc.get_objects()),
        "stage_cpu_seconds": stage_cpu,
        "user_seconds": ru1.ru_utime - ru0.ru_utime, "system_seconds": ru1.ru_stime - ru0.ru_stime,
        "context_switches": [ru1.ru_nvcsw - ru0.ru_nvcsw, ru1.ru_nivcsw - ru0.ru_nivcsw],
        "minor_page_faults": ru1.ru_minflt - ru0.ru_minflt,
        "polls": records, "scrapes": scrape_times,
    }
    Path(args.out).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
