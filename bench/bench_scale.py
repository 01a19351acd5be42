"""Benchmark: specwatch's CPU per page against Prometheus', and one exporter's fleet curve.

Printed in one run:

1. **CPU per page, Prometheus and specwatch, side by side.** Two fake fleets
   (bench/benchlib/fakefleet.py, one process each) serve the same recorded 55 KB vLLM 0.32
   pages over HTTP, ``--pair-targets`` paths each, every path one page further per request.
   The Debian ``prometheus`` binary, started here with an empty TSDB in a temporary
   directory, scrapes one fleet every ``--interval`` s into its TSDB. The specwatch exporter
   (bench/benchlib/harness.py: ``ServeApp``, what ``specwatch serve`` runs, history preloaded
   with an hour of polls) polls the other at the same interval, and this driver scrapes its
   ``/metrics`` every 15 s like Prometheus (gzip): the whole job (poll, parse, history,
   derive, the live model and pairs plug-ins as configured, the exposition). Both run at the
   same time, after the same warm-up, so the machine's load touches both. CPU of each process
   is its scheduler run time over ``--pair-duration`` s (/proc/PID/task/*/schedstat, checked
   against utime + stime, as bench/bench_poll.py reads it); pages are those its fleet served
   in that time (the fleet's ``/stats``). Reported: CPU per page of each, and the ratio.
2. **The fleet curve.** For each count of ``--curve`` (100 to 4,000 targets by default): one
   fleet with 5% of the paths never answering and 5% slow (answering after
   ``--slow-delay`` s, within the 3 s deadline), one exporter polling them every 5 s and
   scraped every 15 s, measured for ``--duration`` s after the warm-up (bench/bench_fleet.py
   explains why): CPU as a share of one core, peak RSS, the exposition's size, the exporter's
   time to answer a scrape (CPU and wall, render and gzip), skipped poll slots and polls
   ending after their next slot. Then the exposition time at 2,000 targets (or the largest
   count below it).

The figures are for the machine it runs on: run it when the machine is quiet; ``uptime`` is
printed with every part. ``--quick``: a smoke run (100 and 250 targets, short runs).

Run: `python bench/bench_scale.py [--quick] [--curve 100,250,500,1000,2000,4000]
[--duration 30] [--pair-targets 200] [--pair-duration 60]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench_fleet import cycles, scrape_loop
from bench_poll import cpu_reading, cpu_used

HERE = Path(__file__).resolve().parent
MIB = 1024 * 1024


def load() -> str:
    """The load averages, as ``uptime`` prints them."""
    with open("/proc/loadavg") as f:
        return "load average " + ", ".join(f.read().split()[:3])


def start_fleet(paths: int, dead_share: float, slow_share: float, slow_delay: float
                ) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "benchlib" / "fakefleet.py"), "--paths", str(paths),
         "--dead-share", str(dead_share), "--slow-share", str(slow_share),
         "--slow-delay", str(slow_delay)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True)
    return proc, int(proc.stdout.readline().split()[1])  # "PORT <port> SLOW <n> DEAD <n>"


def served(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as resp:
        return int(json.loads(resp.read())["served"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_exporter_config(path: Path, port: int, targets: int, interval: float,
                          timeout: float) -> None:
    lines = ["global:", f"  poll_interval: {interval}", f"  timeout: {timeout}",
             f"  max_targets: {targets}", '  listen: "127.0.0.1:0"', "targets:"]
    lines += [f"  - {{name: t{i:04d}, url: 'http://127.0.0.1:{port}/t{i}/metrics'}}"
              for i in range(targets)]
    path.write_text("\n".join(lines) + "\n")


def start_prometheus(work: Path, fleet_port: int, targets: int, interval: float
                     ) -> tuple[subprocess.Popen, int]:
    """Prometheus scraping ``targets`` paths of the fleet into a fresh TSDB; each target is
    its own static group, told apart by a ``target`` label (they share host and port)."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("bench_scale: the prometheus binary is not installed "
                         "(Debian package prometheus; `make system-deps`)")
    groups = [{"targets": [f"127.0.0.1:{fleet_port}"],
               "labels": {"__metrics_path__": f"/t{i}/metrics", "target": f"t{i:04d}"}}
              for i in range(targets)]
    cfg = {"global": {"scrape_interval": f"{interval:g}s", "scrape_timeout": "3s"},
           "scrape_configs": [{"job_name": "vllm", "static_configs": groups}]}
    (work / "prometheus.yml").write_text(json.dumps(cfg))  # JSON is YAML
    port = free_port()
    proc = subprocess.Popen(
        [binary, f"--config.file={work / 'prometheus.yml'}",
         f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
         "--log.level=error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2):
                return proc, port
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("bench_scale: prometheus did not start") from None
            time.sleep(0.2)


def start_exporter(cfg: Path, out: Path, warmup: float, duration: float
                   ) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "benchlib" / "harness.py"), "--config", str(cfg),
         "--duration", str(duration), "--out", str(out), "--warmup", str(warmup),
         "--prefill"], stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().split()[1]  # "LISTEN host:port"


def per_page(args: argparse.Namespace, work: Path) -> None:
    n = args.pair_targets
    print(f"\n== CPU per page: Prometheus and specwatch, {n} targets each, every "
          f"{args.interval:g} s, the same recorded 55 KB vLLM 0.32 pages ({load()})")
    procs: list[subprocess.Popen] = []
    try:
        prom_fleet, prom_fleet_port = start_fleet(n, 0.0, 0.0, 0.0)
        spec_fleet, spec_fleet_port = start_fleet(n, 0.0, 0.0, 0.0)
        procs += [prom_fleet, spec_fleet]
        prom, _ = start_prometheus(work, prom_fleet_port, n, args.interval)
        procs.append(prom)
        cfg = work / "pair.yaml"
        write_exporter_config(cfg, spec_fleet_port, n, args.interval, 3.0)
        spec, address = start_exporter(cfg, work / "pair.json", args.warmup,
                                       args.pair_duration + 10)
        procs.append(spec)
        stop = threading.Event()
        scrapes: list[tuple[float, int]] = []
        scraper = threading.Thread(target=scrape_loop, args=(
            address, args.scrape_every, time.monotonic() + 1e9, stop, scrapes))
        scraper.start()
        try:
            time.sleep(args.warmup)
            c0 = (cpu_reading(prom.pid), cpu_reading(spec.pid))
            p0 = (served(prom_fleet_port), served(spec_fleet_port))
            time.sleep(args.pair_duration)
            c1 = (cpu_reading(prom.pid), cpu_reading(spec.pid))
            p1 = (served(prom_fleet_port), served(spec_fleet_port))
        finally:
            stop.set()
            scraper.join()
        if spec.wait() != 0:
            raise SystemExit(f"bench_scale: the exporter harness failed ({spec.returncode})")
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
    prom_cpu, spec_cpu = cpu_used(c0[0], c1[0]), cpu_used(c0[1], c1[1])
    prom_pages, spec_pages = p1[0] - p0[0], p1[1] - p0[1]
    prom_ms = prom_cpu / max(prom_pages, 1) * 1e3
    spec_ms = spec_cpu / max(spec_pages, 1) * 1e3
    print(f"  Prometheus: {prom_cpu:.2f} s CPU for {prom_pages} pages in "
          f"{args.pair_duration:g} s = {prom_ms:.3f} ms per page (scrape, parse, TSDB)")
    print(f"  specwatch:  {spec_cpu:.2f} s CPU for {spec_pages} pages in "
          f"{args.pair_duration:g} s = {spec_ms:.3f} ms per page (poll, parse, history, "
          f"derive, exposition scraped every {args.scrape_every:g} s)")
    print(f"  ratio (Prometheus / specwatch): {prom_ms / spec_ms:.2f}x "
          f"(target >= 4x; specwatch <= 0.30 ms a page)   [{load()}]")


def curve_point(args: argparse.Namespace, work: Path, n: int) -> dict:
    fleet, port = start_fleet(n, args.dead_share, args.slow_share, args.slow_delay)
    try:
        cfg = work / f"fleet{n}.yaml"
        write_exporter_config(cfg, port, n, args.interval, 3.0)
        out = work / f"fleet{n}.json"
        before = load()
        spec, address = start_exporter(cfg, out, args.warmup, args.duration)
        stop = threading.Event()
        scrapes: list[tuple[float, int]] = []
        scraper = threading.Thread(target=scrape_loop, args=(
            address, args.scrape_every, time.monotonic() + args.warmup + args.duration, stop,
            scrapes))
        scraper.start()
        rc = spec.wait()
        stop.set()
        scraper.join()
        if rc != 0:
            raise SystemExit(f"bench_scale: the exporter harness failed ({rc})")
    finally:
        fleet.terminate()
        fleet.wait(timeout=30)
    result = json.loads(out.read_text())
    c = cycles(result)
    timed = result["scrapes"]
    sizes = [s[1] for s in scrapes if s[0] == s[0]]
    return {
        "targets": n, "cpu_share": c["cpu_share"], "cpu_per_poll": c["cpu_per_poll"],
        "rss_peak": result["rss_peak_sampled_bytes"], "maxrss": result["maxrss_lifetime_bytes"],
        "exposition_bytes": sizes[-1] if sizes else 0,
        "gzip_bytes": timed[-1][2] if timed else 0,
        "scrape_cpu": max((s[0] for s in timed), default=float("nan")),
        "scrape_wall": max((s[1] for s in timed), default=float("nan")),
        "scrape_wall_median": statistics.median(s[1] for s in timed) if timed else float("nan"),
        "scrapes": len(timed), "skipped": c["skipped"], "over_interval": c["over_interval"],
        "timeouts": c["timeouts"], "polls": len(result["polls"]),
        "load": f"{before} / {load()}",
    }


def curve(args: argparse.Namespace, work: Path) -> None:
    counts = [int(x) for x in args.curve.split(",")]
    print(f"\n== Fleet curve: one exporter, {args.interval:g} s polls, {args.dead_share:.0%} "
          f"of targets never answering, {args.slow_share:.0%} answering after "
          f"{args.slow_delay:g} s, /metrics scraped every {args.scrape_every:g} s (gzip), "
          f"an hour of history preloaded; {args.duration:g} s measured after "
          f"{args.warmup:g} s of warm-up")
    print(f"{'targets':>7} | {'CPU %core':>9} {'ms/poll':>7} | {'RSS peak':>8} | "
          f"{'/metrics':>9} {'gzip':>8} | {'scrape CPU':>10} {'wall':>7} | "
          f"{'skipped':>7} {'late':>4} | load (before / after)")
    points = []
    for n in counts:
        p = curve_point(args, work, n)
        points.append(p)
        print(f"{n:>7} | {100 * p['cpu_share']:>8.1f}% {p['cpu_per_poll'] * 1e3:>7.2f} | "
              f"{p['rss_peak'] / MIB:>4.0f} MiB | {p['exposition_bytes'] / 1e6:>6.1f} MB "
              f"{p['gzip_bytes'] / 1e6:>5.2f} MB | {p['scrape_cpu'] * 1e3:>7.0f} ms "
              f"{p['scrape_wall'] * 1e3:>4.0f} ms | {p['skipped']:>7} "
              f"{p['over_interval']:>4} | {p['load']}", flush=True)
    print("  CPU: the exporter's process CPU over the run (every thread, the scrapes "
          "included) per second; ms/poll: the same per poll. scrape: the exporter's /metrics "
          "handler, the slowest scrape of the run (CPU of its thread, and wall). skipped: "
          "poll slots without a poll; late: polls ending after the target's next slot.")
    at = max((p for p in points if p["targets"] <= 2000), key=lambda p: p["targets"],
             default=None)
    if at is not None:
        ok = at["targets"] == 2000 and at["cpu_share"] <= 0.12 and at["rss_peak"] <= 400 * MIB \
            and at["skipped"] == 0 and at["over_interval"] == 0
        print(f"\nexposition at {at['targets']} targets: {at['exposition_bytes'] / 1e6:.1f} MB "
              f"({at['gzip_bytes'] / 1e6:.2f} MB gzip), slowest scrape {at['scrape_cpu'] * 1e3:.0f}"
              f" ms CPU, {at['scrape_wall'] * 1e3:.0f} ms wall (median "
              f"{at['scrape_wall_median'] * 1e3:.0f} ms) against Prometheus' 10 s scrape "
              f"timeout")
        print(f"targets at 2000 (<= 12% of a core, <= 400 MiB, no slot skipped): "
              f"{'met' if ok else 'NOT met'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (about 3 minutes)")
    parser.add_argument("--curve", default="100,250,500,1000,2000,4000")
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=None,
                        help="seconds before measuring (default: three scrapes and 5 s)")
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--scrape-every", type=float, default=15.0)
    parser.add_argument("--dead-share", type=float, default=0.05)
    parser.add_argument("--slow-share", type=float, default=0.05)
    parser.add_argument("--slow-delay", type=float, default=1.5)
    parser.add_argument("--pair-targets", type=int, default=200)
    parser.add_argument("--pair-duration", type=float, default=60.0)
    parser.add_argument("--skip-pair", action="store_true")
    parser.add_argument("--skip-curve", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.curve, args.duration, args.pair_duration = "100,250", 10.0, 20.0
        args.pair_targets, args.scrape_every = 100, 5.0
    if args.warmup is None:
        args.warmup = 3 * args.scrape_every + 5.0
    print(f"bench_scale: {os.cpu_count()} CPUs, {load()}")
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_pair:
            per_page(args, Path(tmp))
        if not args.skip_curve:
            curve(args, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
