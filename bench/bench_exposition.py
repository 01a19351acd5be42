"""Benchmark: the exporter's /metrics exposition with 500 targets.

The exporter (``ServeApp``, not started: no sockets) gets 500 targets whose histories are
preloaded with an hour of polls of the recorded vLLM 0.32 pages, then one real poll each,
so every target exposes its health series and every window of derived series. Then:

- specwatch: ``ServeApp.metrics_handler`` (what ``GET /metrics`` runs: the collector
  rebuilds every family from the immutable snapshot, prometheus_client encodes them), in
  the Prometheus text format and in OpenMetrics (what Prometheus negotiates by default),
  plus the gzip the HTTP layer applies when the client accepts it;
- baseline: the same samples held in prometheus_client's own metric objects (``Gauge`` /
  ``Counter`` / ``Histogram`` with labels, the usual way to instrument), encoded by
  ``generate_latest``: what exposition costs when nothing is rebuilt per scrape.

Timed in process CPU seconds per scrape, best of ``--repeat``. The ratio says how much the
rebuild-from-snapshot design costs (or saves) against stored metric objects.

Run: `python bench/bench_exposition.py [--targets 500] [--repeat 5]`.
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
from specwatch.app.serve import ServeApp
from specwatch.exporter import config, sources
from specwatch.exporter.pipeline import PollResult
from specwatch.web.server import Request

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def build_app(targets: int, workdir: Path) -> ServeApp:
    cfg_file = workdir / "specwatch.yaml"
    cfg_file.write_text("global:\n  listen: '127.0.0.1:0'\ntargets:\n" + "".join(
        f"  - {{name: t{i:03d}, url: 'http://127.0.0.1:9/t{i}/metrics'}}\n"
        for i in range(targets)))
    app = ServeApp(config.build_config(str(cfg_file), [], None, None))
    pages = real_pages()
    parsed = [sources.parse_page(p) for p in pages]
    interval, n = app.cfg.poll_interval, int(3600 / app.cfg.poll_interval)
    now = time.time()
    for i, name in enumerate(app.pipeline.snapshot.targets):
        hist = app.pipeline.target_history(name)
        for k in range(n):
            hist.update(parsed[(i + k) % len(parsed)], now - (n - k) * interval)
        app.pipeline.apply(PollResult(name, now, now, 0.05, body=pages[(i + n) % len(pages)]))
    return app


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
    parser.add_argument("--targets", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    with tempfile.TemporaryDirectory() as tmp:
        app = build_app(args.targets, Path(tmp))
    text_req = Request("GET", "/metrics", {}, {})
    om_req = Request("GET", "/metrics", {}, {"accept": OPENMETRICS})
    body = app.metrics_handler(text_req).body
    series = sum(1 for line in body.split(b"\n") if line and not line.startswith(b"#"))
    reg = baseline_registry(body.decode())
    base_body = generate_latest(reg)
    base_series = sum(1 for line in base_body.split(b"\n")
                      if line and not line.startswith(b"#") and b"_created" not in line)

    t_text = cpu_per_call(lambda: app.metrics_handler(text_req), args.repeat)
    t_om = cpu_per_call(lambda: app.metrics_handler(om_req), args.repeat)
    t_gzip = cpu_per_call(lambda: gzip.compress(app.metrics_handler(text_req).body, 1),
                          args.repeat)
    t_base = cpu_per_call(lambda: generate_latest(reg), args.repeat)
    print(f"/metrics of {args.targets} targets (each: an hour of history, every window): "
          f"{series:,} series, {len(body) / 1e6:.1f} MB text, "
          f"{len(gzip.compress(body, 1)) / 1e6:.2f} MB gzip")
    print(f"CPU per scrape, process time, best of {args.repeat}")
    print(f"  specwatch, text format              : {t_text * 1e3:8.0f} ms")
    print(f"  specwatch, OpenMetrics              : {t_om * 1e3:8.0f} ms")
    print(f"  specwatch, text format + gzip       : {t_gzip * 1e3:8.0f} ms")
    print(f"  baseline, stored metric objects     : {t_base * 1e3:8.0f} ms "
          f"({base_series:,} series without _created)")
    print(f"  ratio (baseline / specwatch, text)  : {t_base / t_text:8.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
