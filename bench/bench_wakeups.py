"""Benchmark: what a wake-up from idle costs a poll, the reason the poller batches fast polls.

One thread fetches the real 55 KB vLLM pages from a fake fleet (``benchlib/fakefleet.py``, its
own process) and applies each to a pipeline preloaded with history (``benchlib/harness.py``'s
prefill: 500 targets, 5 s polls, an hour by default), one target after the other: the work of
a poll in ``specwatch serve`` (fetch, parse, history, derive; nothing scrapes this pipeline,
so nothing is rendered), without threads. One unmeasured round first opens every target's
connection and warms its caches. Between polls it sleeps as much as an exporter polling 100
targets a second is idle, either after every poll (each poll starts from idle, as with one
worker per poll) or after each group of ``k`` polls (the same sleep in total: each group
runs back to back, as the poller's batches do).

Reported per poll, on the thread's own CPU clock: fetch, apply, and their sum; the ratio is
each grouping's cost against polls run one at a time, in the same run. docs/performance.md
quotes this benchmark.

Run: `python bench/bench_wakeups.py [--targets 500] [--history 3600] [--groups 1,5,20]
[--rounds 2]`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from benchlib.harness import prefill

from specwatch.poll import config
from specwatch.poll.fetch import client as fetch
from specwatch.poll.pipeline import Pipeline, PollResult
from specwatch.poll.windows import derive

HERE = Path(__file__).resolve().parent
INTERVAL = 5.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=500)
    parser.add_argument("--groups", default="1,5,20", help="polls run back to back per wake-up")
    parser.add_argument("--rounds", type=int, default=2, help="polls of every target per grouping")
    parser.add_argument("--idle", type=float, default=0.01, help="seconds idle per poll")
    parser.add_argument("--history", type=float, default=3600.0, help="seconds preloaded")
    args = parser.parse_args()
    fleet = subprocess.Popen(
        [sys.executable, str(HERE / "benchlib" / "fakefleet.py"), "--paths", str(args.targets),
         "--slow-share", "0"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(fleet.stdout.readline().split()[1])
        names = [f"t{i}" for i in range(args.targets)]
        dcfg = derive.DeriveConfig(windows=config.ServeConfig.__dataclass_fields__["windows"]
                                   .default, histograms=False)
        pipe = Pipeline([(n, "vllm") for n in names], dcfg, INTERVAL)
        t = 1000.0
        prefill(pipe, INTERVAL, args.history, t)
        targets = [fetch.PollTarget(n, f"http://127.0.0.1:{port}/t{i}/metrics")
                   for i, n in enumerate(names)]
        sessions = [fetch.new_session(x.url) for x in targets]

        def poll_round(group: int) -> tuple[float, float]:
            """One poll of every target, a sleep after every ``group`` of them: CPU seconds
            of the fetches and of the applies."""
            nonlocal t
            t += INTERVAL
            fetch_cpu = apply_cpu = 0.0
            for i, n in enumerate(names):
                c0 = time.thread_time()
                body = fetch.fetch(sessions[i], targets[i])
                c1 = time.thread_time()
                pipe.apply(PollResult(n, t, t, 0.01, body=body, monotonic=t + i * 1e-3))
                c2 = time.thread_time()
                fetch_cpu += c1 - c0
                apply_cpu += c2 - c1
                if i % group == group - 1:
                    time.sleep(args.idle * group)
            return fetch_cpu, apply_cpu

        poll_round(1)  # connections opened, caches and derive plans made: not measured
        print(f"{args.targets} targets, {args.history:g} s of history each; idle "
              f"{args.idle * 1e3:g} ms per poll; CPU per poll (thread clock)")
        first = None
        for group in (int(g) for g in args.groups.split(",")):
            rounds = [poll_round(group) for _ in range(args.rounds)]
            polls = args.rounds * len(names)
            fetch_cpu = sum(f for f, _ in rounds) / polls
            apply_cpu = sum(a for _, a in rounds) / polls
            total = fetch_cpu + apply_cpu
            first = first or total
            print(f"  {group:3d} poll(s) a wake-up: fetch {fetch_cpu * 1e3:.3f} ms, "
                  f"apply {apply_cpu * 1e3:.3f} ms, total {total * 1e3:.3f} ms "
                  f"({first / total:.2f}x cheaper than one a wake-up)")
        for s in sessions:
            s.close()
    finally:
        fleet.terminate()
        fleet.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
