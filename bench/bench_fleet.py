"""Benchmark: one exporter polling a fleet of 500 vLLM servers at a 5 s interval.

Three processes: a fake fleet (bench/benchlib/fakefleet.py: one asyncio server, 500 paths
replaying the recorded vLLM 0.32 pages, 10% of them answering only after 10 s), the exporter
(bench/benchlib/harness.py: ``ServeApp``, what ``specwatch serve`` runs, with its history
preloaded to one hour of polls so memory and derive work are those of a long-running
exporter), and this driver, which scrapes the exporter's ``/metrics`` every 15 s like
Prometheus (gzip) while it runs.

Measured in the exporter process: every poll's start and end; process CPU seconds over the
run (all threads, the scrapes included) as a share of one core; resident memory sampled
every 0.25 s (peak) and the lifetime peak (ru_maxrss, prefill included).

Steady state: the run is measured after a warm-up (``--warmup``, by default three scrape
periods and 5 s) in which the exporter already polls and is scraped. It leaves out the
start-up round (every target's first poll, each with a worker of its own), and it lets the
collector see the three scrapes from which it learns the scrape period: until then it renders
every poll's lines at publish, after it only the polls a scrape will read (one in three at
5 s polls and 15 s scrapes). Measured from the start (``--warmup 0``, as before
2026-12-01), a 60 s run renders nothing for 15 s and every poll for the next 30 s: neither is
what a long-running exporter does.

Polls are spread over the interval (each target on its own slot, like Prometheus' scrape
offsets), so a *cycle* is one interval: it is kept when every target is polled on its slot
and the poll ends before the target's next slot. Reported: skipped slots, start lateness,
and the time from each poll's slot to its end (the slow targets end at their 3 s deadline).
Baseline: the same exporter with ``global.parser: full`` (prometheus_client's full parse of
every page), run right after.

Run: `python bench/bench_fleet.py [--duration 120] [--baseline-duration 60] [--targets 500]
[--warmup 50]`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent


def start_fleet(args: argparse.Namespace) -> tuple[subprocess.Popen, int, int]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "benchlib" / "fakefleet.py"), "--paths", str(args.targets),
         "--slow-share", str(args.slow_share), "--slow-delay", str(args.slow_delay)],
        stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()  # "PORT <port> SLOW <n>"
    return proc, int(line[1]), int(line[3])


def write_config(path: Path, port: int, args: argparse.Namespace, parser: str) -> None:
    lines = ["global:", f"  poll_interval: {args.interval}", f"  timeout: {args.timeout}",
             '  listen: "127.0.0.1:0"', f"  parser: {parser}", "targets:"]
    lines += [f"  - {{name: t{i:03d}, url: 'http://127.0.0.1:{port}/t{i}/metrics'}}"
              for i in range(args.targets)]
    path.write_text("\n".join(lines) + "\n")


def scrape_loop(address: str, every: float, until: float, stop: threading.Event,
                out: list[tuple[float, int]]) -> None:
    """GET /metrics with gzip every ``every`` s until ``until`` (monotonic): (wall seconds,
    uncompressed bytes)."""
    while not stop.wait(every) and time.monotonic() + every / 2 < until:
        req = urllib.request.Request(f"http://{address}/metrics",
                                     headers={"Accept-Encoding": "gzip"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                body = resp.read()
                if resp.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
        except OSError as exc:
            out.append((float("nan"), 0))
            print(f"  scrape failed: {exc}", file=sys.stderr)
            continue
        out.append((time.perf_counter() - t0, len(body)))


def run_exporter(cfg: Path, duration: float, prefill: bool, scrape_every: float,
                 workdir: Path, warmup: float = 0.0) -> tuple[dict, list[tuple[float, int]]]:
    out = workdir / f"{cfg.stem}.json"
    cmd = [sys.executable, str(HERE / "benchlib" / "harness.py"), "--config", str(cfg),
           "--duration", str(duration), "--out", str(out), "--warmup", str(warmup)]
    if prefill:
        cmd.append("--prefill")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    address = proc.stdout.readline().split()[1]  # "LISTEN host:port"
    scrapes: list[tuple[float, int]] = []
    stop = threading.Event()
    until = time.monotonic() + warmup + duration
    thread = threading.Thread(target=scrape_loop,
                              args=(address, scrape_every, until, stop, scrapes))
    thread.start()
    rc = proc.wait()
    stop.set()
    thread.join()
    if rc != 0:
        raise SystemExit(f"exporter harness failed (exit {rc})")
    return json.loads(out.read_text()), scrapes


def cycles(result: dict) -> dict:
    """Schedule keeping, per target: slots, lateness, skipped slots, slot-to-end times.

    The poller polls every target once when it starts, then on the target's own slots
    ``anchor + k x interval`` (targets spread over the interval). A target's slots are
    recovered from its poll starts (the grid through its least late poll); a *cycle* is one
    interval, and it is kept when every target is polled on each of its slots and each poll
    ends before the target's next slot.
    """
    interval, start, end = result["interval"], result["start"], result["end"]
    by_target: dict[str, list] = {}
    for target, started, finished, reason in result["polls"]:
        by_target.setdefault(target, []).append((started, finished, reason))
    lateness, slot_to_end, skipped, fast_durations = [], [], 0, []
    for polls in by_target.values():
        polls.sort()
        steady = polls[1:]  # the first poll is the start-up one, off the grid
        if not steady:
            continue
        ks = [round((p[0] - steady[0][0]) / interval) for p in steady]
        anchor = min(p[0] - k * interval for p, k in zip(steady, ks, strict=True))
        for p, k in zip(steady, ks, strict=True):
            slot = anchor + k * interval
            lateness.append(p[0] - slot)
            slot_to_end.append(p[1] - slot)
            if p[2] is None:
                fast_durations.append(p[1] - p[0])
        skipped += ks[-1] - (len(ks) - 1)
        # slots before the run's end that have no poll at all
        skipped += max(0, int((end - 0.5 - (anchor + ks[-1] * interval)) // interval))
    polls = result["polls"]
    return {
        "targets_polled": len(by_target), "lateness": lateness, "slot_to_end": slot_to_end,
        "skipped": skipped, "fast_poll_max": max(fast_durations, default=0.0),
        "polls_per_target": len(polls) / max(len(by_target), 1),
        "expected_per_target": (end - start) / interval,
        "timeouts": sum(p[3] == "timeout" for p in polls),
        "other_errors": sum(p[3] not in (None, "timeout") for p in polls),
        "over_interval": sum(x >= interval for x in slot_to_end),
        "cpu_share": result["cpu_seconds"] / (end - start),
        "cpu_per_poll": result["cpu_seconds"] / max(len(polls), 1),
    }


def report(label: str, result: dict, scrapes: list[tuple[float, int]], slow: int) -> dict:
    c = cycles(result)
    mib = 1024 * 1024
    print(f"\n{label}: parser={result['parser']}, {result['targets']} targets ({slow} slow), "
          f"interval {result['interval']:g} s, {result['end'] - result['start']:.0f} s run "
          f"after {result.get('warmup', 0):.0f} s of warm-up, "
          f"history preloaded with {result['prefill_polls_per_target']} polls per target")
    if c["slot_to_end"]:
        lat, ste = c["lateness"], c["slot_to_end"]
        print(f"  schedule: {c['targets_polled']} targets polled, {c['polls_per_target']:.1f} "
              f"polls each in {c['expected_per_target']:.1f} intervals; skipped slots "
              f"{c['skipped']}; start lateness median {statistics.median(lat) * 1e3:.0f} ms, "
              f"max {max(lat) * 1e3:.0f} ms")
        print(f"  cycle (slot to end of the poll): median {statistics.median(ste):.2f} s, max "
              f"{max(ste):.2f} s (the slow targets end at their deadline); polls ending after "
              f"the next slot: {c['over_interval']}")
    print(f"  polls: {len(result['polls'])}, timeouts {c['timeouts']} (the slow targets), "
          f"other errors {c['other_errors']}; slowest successful poll {c['fast_poll_max']:.2f} s")
    print(f"  CPU: {result['cpu_seconds']:.1f} s over {result['end'] - result['start']:.0f} s "
          f"= {100 * c['cpu_share']:.1f}% of one core (scrapes included), "
          f"{c['cpu_per_poll'] * 1e3:.2f} ms per poll")
    if "user_seconds" in result:
        print(f"  CPU split: user {result['user_seconds']:.1f} s, system "
              f"{result['system_seconds']:.1f} s; context switches voluntary "
              f"{result['context_switches'][0]:,}, involuntary {result['context_switches'][1]:,}"
              + (f"; minor page faults {result['minor_page_faults']:,}"
                 if "minor_page_faults" in result else ""))
    if "stage_cpu_seconds" in result:
        n = max(len(result["polls"]), 1)
        st = result["stage_cpu_seconds"]
        render = st.get("render", 0.0)
        rest = result["cpu_seconds"] - st["fetch"] - st["apply"] - render
        print(f"  CPU per poll by stage (polling thread's clock): fetch {st['fetch'] / n * 1e3:.2f}"
              f" ms, result handling {st['apply'] / n * 1e3:.2f} ms, pre-rendering after the "
              f"runs of polls {render / n * 1e3:.2f} ms, rest of the process "
              f"{rest / n * 1e3:.2f} ms")
    if "gc_runs" in result:
        print(f"  garbage collector: {result['gc_runs']} passes per generation, "
              f"{sum(result['gc_cpu_seconds']):.2f} s CPU ({result['gc_cpu_seconds'][2]:.2f} s in "
              f"full passes), {result['gc_tracked_objects']:,} tracked objects")
    print(f"  RSS: {result['rss_before_bytes'] / mib:.0f} MiB after preload, peak "
          f"{result['rss_peak_sampled_bytes'] / mib:.0f} MiB while polling (lifetime peak "
          f"{result['maxrss_lifetime_bytes'] / mib:.0f} MiB); threads peak "
          f"{result['threads_peak']}")
    ok = [s for s in scrapes if s[0] == s[0]]
    if ok:
        print(f"  /metrics scrapes (warm-up and run): {len(ok)}, wall median "
              f"{statistics.median(s[0] for s in ok) * 1e3:.0f} ms, max "
              f"{max(s[0] for s in ok) * 1e3:.0f} ms, {ok[-1][1] / 1e6:.1f} MB uncompressed")
    return c


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=500)
    parser.add_argument("--slow-share", type=float, default=0.1)
    parser.add_argument("--slow-delay", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds (specwatch)")
    parser.add_argument("--baseline-duration", type=float, default=60.0,
                        help="seconds of the full-parse baseline run (0: skip it)")
    parser.add_argument("--no-prefill", action="store_true",
                        help="start with empty histories (a freshly started exporter)")
    parser.add_argument("--scrape-every", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=None,
                        help="seconds polled and scraped before measuring (default: three "
                             "scrape periods and 5 s; 0: measure from the start)")
    args = parser.parse_args()
    if args.warmup is None:
        args.warmup = 3 * args.scrape_every + 5.0

    fleet, port, slow = start_fleet(args)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            runs = [("specwatch", "fast", args.duration)]
            if args.baseline_duration > 0:
                runs.append(("baseline", "full", args.baseline_duration))
            results = {}
            for label, parser_kind, duration in runs:
                cfg = work / f"{label}.yaml"
                write_config(cfg, port, args, parser_kind)
                result, scrapes = run_exporter(cfg, duration, not args.no_prefill,
                                               args.scrape_every, work, args.warmup)
                results[label] = report(label, result, scrapes, slow)
    finally:
        fleet.terminate()
        fleet.wait(timeout=10)
    s = results["specwatch"]
    kept = s["over_interval"] == 0 and s["skipped"] == 0
    print(f"\ntargets: every cycle within the interval: {kept}; "
          f"CPU {100 * s['cpu_share']:.1f}% of one core (< 50%)")
    if "baseline" in results:
        b = results["baseline"]
        print(f"ratio (baseline / specwatch), CPU per poll: "
              f"{b['cpu_per_poll'] / s['cpu_per_poll']:.1f}x; CPU share: "
              f"{b['cpu_share'] / s['cpu_share']:.1f}x (the baseline is capped near one core "
              f"by the GIL: it falls behind and skips slots instead)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
