"""Benchmark: whole-process CPU of `specwatch serve` polling one server, against the naive loop.

What a user pays, measured as a user would: one ``specwatch serve`` process (the real CLI)
polls one vLLM page every second; next to it, in the same run, a naive process fetches the
same page every second with ``requests`` and parses all of it with prometheus_client
(``text_string_to_metric_families``), which is what a script or a generic exporter does.
Both processes' CPU time is read after a warm-up and again after ``--duration`` seconds;
the ratio of the two is the figure (same run, same server, so the machine's load touches
both). CPU time is the scheduler's run time of every thread (nanoseconds,
/proc/PID/task/*/schedstat), checked against utime + stime (10 ms ticks, which alone would
make one tick 10% of specwatch's figure on the 55 KB page).

Pages (bench/benchlib/pageserve.py): the real 55 KB vLLM 0.32 page, and a 2 MB page grown
from it (14 models x 4 engines); each served either the same every poll (an idle server:
specwatch skips the parse of identical bytes) or changing every poll (the 49 recorded pages
in turn: counters move, every poll is parsed).

Run: `python bench/bench_poll.py [--duration 30] [--cases big-same,big-changing,...]`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
TICK = os.sysconf("SC_CLK_TCK")

NAIVE = textwrap.dedent("""
    import sys, time, requests
    from prometheus_client.parser import text_string_to_metric_families
    url, interval = sys.argv[1], float(sys.argv[2])
    session = requests.Session()
    session.headers["User-Agent"] = "naive/1"
    nxt = time.monotonic()
    while True:
        text = session.get(url, timeout=10).text
        n = sum(len(f.samples) for f in text_string_to_metric_families(text))
        nxt += interval
        time.sleep(max(0.0, nxt - time.monotonic()))
""")


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (every thread, exited ones included), in ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def run_seconds(pid: int) -> float | None:
    """Time on a CPU of the process's live threads, in nanoseconds (/proc/PID/task/*/schedstat).

    Why: specwatch uses about 0.1 s of CPU in 30 s of polls, 10 ticks of 10 ms, so one tick
    is 10% of the ratio. The scheduler's own run time has nanosecond resolution. It misses
    threads that exited between two readings (the tick count includes them): the caller
    compares both and keeps the tick count when they disagree by more than two ticks.
    """
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e9


def cpu_used(before: tuple[float, float | None], after: tuple[float, float | None]) -> float:
    """CPU seconds between two (ticks, run time) readings: the precise run time unless it
    disagrees with the ticks by more than two ticks (a thread exited: the ticks are right)."""
    ticks = after[0] - before[0]
    if before[1] is None or after[1] is None:
        return ticks
    run = after[1] - before[1]
    return run if abs(run - ticks) <= 2.0 / TICK + 0.05 * ticks else ticks


def cpu_reading(pid: int) -> tuple[float, float | None]:
    return cpu_seconds(pid), run_seconds(pid)


def polls(port: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as resp:
        return json.loads(resp.read())


def run_case(page: str, mode: str, duration: float, warmup: float
             ) -> tuple[float, float, int, int]:
    server = subprocess.Popen([sys.executable, str(HERE / "benchlib" / "pageserve.py"),
                               "--page", page, "--mode", mode], stdout=subprocess.PIPE,
                              text=True)
    procs: list[subprocess.Popen] = [server]
    try:
        port = int(server.stdout.readline().split()[1])
        url = f"http://127.0.0.1:{port}/metrics"
        spec = subprocess.Popen([sys.executable, "-m", "specwatch", "serve", "--target",
                                 f"bench={url}", "--poll-interval", "1", "--listen",
                                 "127.0.0.1:0", "--log-level", "error"],
                                stdout=subprocess.DEVNULL)
        naive = subprocess.Popen([sys.executable, "-c", NAIVE, url, "1"],
                                 stdout=subprocess.DEVNULL)
        procs += [spec, naive]
        time.sleep(warmup)
        c0 = (cpu_reading(spec.pid), cpu_reading(naive.pid))
        n0 = polls(port)
        time.sleep(duration)
        c1 = (cpu_reading(spec.pid), cpu_reading(naive.pid))
        n1 = polls(port)
        for p in (spec, naive):
            if p.poll() is not None:
                raise SystemExit(f"a measured process exited early ({p.args[:4]})")
        naive_polls = n1.get("naive", 0) - n0.get("naive", 0)
        spec_polls = sum(n1.values()) - sum(n0.values()) - naive_polls
        return (cpu_used(c0[0], c1[0]), cpu_used(c0[1], c1[1]), spec_polls, naive_polls)
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=15.0,
                        help="seconds before measuring (start-up and imports excluded)")
    parser.add_argument("--cases", default="big-same,big-changing,real-same,real-changing")
    args = parser.parse_args()
    print(f"CPU seconds over {args.duration:g} s of 1 s polls (run time of every thread from "
          f"/proc/PID/task/*/schedstat, checked against utime+stime in {1000 / TICK:g} ms ticks)")
    print("ratio: naive CPU per poll / specwatch CPU per poll (a loaded machine slows the naive"
          " loop below one poll a second: per poll, not per second)")
    print(f"{'page':>6} {'mode':>9} | {'specwatch':>15} {'naive':>15} | "
          f"{'ms/poll':>8} {'naive ms/poll':>13} | {'ratio':>7}")
    for case in args.cases.split(","):
        page, mode = case.split("-")
        spec, naive, n_spec, n_naive = run_case(page, mode, args.duration, args.warmup)
        per_spec = spec / max(n_spec, 1)
        per_naive = naive / max(n_naive, 1)
        ratio = per_naive / per_spec if per_spec > 0 else float("inf")
        print(f"{page:>6} {mode:>9} | {spec:>6.2f}s/{n_spec:>3} polls {naive:>6.2f}s/"
              f"{n_naive:>3} polls | {per_spec * 1e3:>8.2f} {per_naive * 1e3:>13.1f} | "
              f"{ratio:>6.1f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
