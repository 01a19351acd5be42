"""Benchmark: the exporter's /metrics exposition with 1, 50 and 500 targets.

The exporter (``ServeApp``, not started: no sockets) gets N targets whose histories are
preloaded with an hour of polls of the recorded vLLM 0.32 pages, then one real poll each
(through ``ServeApp.on_poll_result``, as the poller delivers them), so every target exposes its
health series and every window of derived series. Measured, in process CPU per scrape (best
of ``--repeat``), all in one run:

- specwatch, fresh snapshot: every target was polled again since the last scrape (a new
  snapshot: the page is joined from the targets' lines rendered at publish time, then
  gzipped): what a scrape costs at 500 targets polled every 5 s and scraped every 15 s;
- specwatch, same snapshot: a second scrape of an unchanged snapshot (an HA replica);
- baseline: the same registry encoded by prometheus_client from ``collect()`` (metric
  objects rebuilt from the snapshot on every scrape: how /metrics was served before
  the cached exposition, and what registry users still get), plus gzip level 1 as the web
  server did.

Also reported: CPU of rendering one target's lines at publish time (it moved from the scrape
to the poll path).

Run: `python bench/bench_exposition.py [--targets 1,50,500] [--repeat 5]`.
"""

from __future__ import annotations

import argparse
import gzip
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchlib.pages import real_pages
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.app import settings
from specwatch.app.serve import ServeApp
from specwatch.expose.collector import render_target
from specwatch.poll import sources
from specwatch.poll.pipeline import PollResult
from specwatch.web.routing import Request

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def build_app(targets: int, workdir: Path) -> ServeApp:
    cfg_file = workdir / "specwatch.yaml"
    cfg_file.write_text("global:\n  listen: '127.0.0.1:0'\ntargets:\n" + "".join(
        f"  - {{name: t{i:03d}, url: 'http://127.0.0.1:9/t{i}/metrics'}}\n"
        for i in range(targets)))
    app = ServeApp(settings.build_config(str(cfg_file), [], None, None))
    pages = real_pages()
    parsed = [sources.parse_page(p) for p in pages]
    interval, n = app.cfg.poll_interval, int(3600 / app.cfg.poll_interval)
    now = app.history_clock()
    for i, name in enumerate(app.pipeline.snapshot.targets):
        hist = app.pipeline.target_history(name)
        for k in range(n):
            hist.update(parsed[(i + k) % len(parsed)], now - (n - k) * interval)
    poll_all(app, pages, n)
    return app


def poll_all(app: ServeApp, pages: list[str], k: int) -> None:
    """One poll of every target (a new page each), as the poller delivers it: the results,
    then what a worker calls once its run of polls is done (``after_run``: the renders of
    the published targets, queued at publish since 2026-12-02; without it every scrape
    would render all the targets itself, which a server never does)."""
    wall = time.time()
    for i, name in enumerate(app.pipeline.snapshot.targets):
        app.on_poll_result(PollResult(name, wall, wall, 0.05,
                                      body=pages[(i + k) % len(pages)]))
    if app.poller.after_run is not None:
        app.poller.after_run()


def baseline_registry(text: str) -> CollectorRegistry:
    """The samples of ``text`` in prometheus_client metric objects (values as exposed)."""
    reg = CollectorRegistry(auto_describe=False)
    for fam in text_string_to_metric_families(text):
        if fam.type == "gauge" or fam.type == "unknown":
            names = sorted({k for s in fam.samples for k in s.labels})
            g = Gauge(fam.name, fam.documentation or "x", names, registry=reg)
            for s in fam.samples:
                (g.labels(**s.labels) if names else g).set(s.value)
        elif fam.type == "counter":
            names = sorted({k for s in fam.samples if s.name.endswith("_total")
                            for k in s.labels})
            c = Counter(fam.name, fam.documentation or "x", names, registry=reg)
            for s in fam.samples:
                if s.name.endswith("_total"):
                    (c.labels(**s.labels) if names else c).inc(s.value)
        elif fam.type == "histogram":
            bounds = sorted({float(s.labels["le"]) for s in fam.samples
                             if s.name.endswith("_bucket")} - {float("inf")})
            names = sorted({k for s in fam.samples for k in s.labels} - {"le"})
            h = Histogram(fam.name, fam.documentation or "x", names, buckets=bounds,
                          registry=reg)
            series: dict[tuple, list[tuple[float, float]]] = {}
            for s in fam.samples:
                if s.name.endswith("_bucket"):
                    key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                    series.setdefault(key, []).append((float(s.labels["le"]), s.value))
            for key, buckets in series.items():
                child = h.labels(**dict(key))
                prev = 0.0
                for le, cum in sorted(buckets):
                    for _ in range(int(cum - prev)):
                        child.observe(le if le != float("inf") else 2.0)
                    prev = cum
    return reg


def cpu_per_call(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="1,50,500")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    pages = real_pages()
    gz = {"accept-encoding": "gzip"}
    print(f"CPU per scrape (process time, best of {args.repeat}), gzip as Prometheus asks")
    print(f"{'targets':>7} {'series':>7} {'MB':>5} | {'fresh':>8} {'same':>8} {'OM':>8} | "
          f"{'baseline':>9} {'ratio':>6} | {'render/target':>13}")
    for n in [int(x) for x in args.targets.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            app = build_app(n, Path(tmp))
        body = app.metrics_handler(Request("GET", "/metrics", {}, {})).body
        series = sum(1 for line in body.split(b"\n") if line and not line.startswith(b"#"))
        fresh, om = [], []
        for r in range(args.repeat):
            poll_all(app, pages, r + 1)  # untimed: every target polled and rendered
            t0 = time.process_time()
            app.metrics_handler(Request("GET", "/metrics", {}, gz))
            fresh.append(time.process_time() - t0)
            poll_all(app, pages, r + 2)
            t0 = time.process_time()
            app.metrics_handler(Request("GET", "/metrics", {}, {**gz, "accept": OPENMETRICS}))
            om.append(time.process_time() - t0)
        same = cpu_per_call(
            lambda a=app: a.metrics_handler(Request("GET", "/metrics", {}, gz)), args.repeat)
        base = cpu_per_call(lambda a=app: gzip.compress(generate_latest(a.registry), 1),
                            args.repeat)
        targets = list(app.pipeline.snapshot.targets.values())
        t0 = time.process_time()
        for t in targets:
            render_target(t)
        render = (time.process_time() - t0) / len(targets)
        print(f"{n:>7} {series:>7,} {len(body) / 1e6:>5.2f} | {min(fresh) * 1e3:>6.1f}ms "
              f"{same * 1e3:>6.1f}ms {min(om) * 1e3:>6.1f}ms | {base * 1e3:>7.1f}ms "
              f"{base / min(fresh):>5.1f}x | {render * 1e6:>10.0f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
