"""Benchmark: CPU per fetch of a target's page, specwatch's two transports against requests.

The page server (``benchlib/fakefleet.py``, its own process so its CPU is not counted) serves
the real 55 KB vLLM 0.32 pages in turn on keep-alive connections. In this process, each side
fetches one page ``--fetches`` times, timed in process CPU seconds (``time.process_time``:
the machine may be shared), best of ``--repeat`` runs, one after the other in the same run:

- baseline: ``requests.Session().get(url).text``, what a script or a generic exporter pays;
- specwatch, requests transport (``fetch`` on ``new_session(url, "requests")``: the path of
  a target behind a proxy): deadline guard, size cap, redirect rules;
- specwatch, direct transport (``new_session(url, "direct")``, the default for a target
  reached directly): the same rules on one ``http.client`` connection, whose usual answer
  is read from the socket directly (``exporter/httpfast.py``);
- for reference, the floor: a bare ``http.client`` GET and ``read()``, no rules at all.

Each side is checked to return a whole page before timing. Ratios are baseline CPU
per fetch over each side's.

Run: `python bench/bench_fetch.py [--fetches 300] [--repeat 3]`.
"""

from __future__ import annotations

import argparse
import http.client
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import requests

from specwatch.poll.fetch.client import PollTarget, fetch, new_session

HERE = Path(__file__).resolve().parent


def cpu_per_call(fn: Callable[[], object], n: int, repeat: int) -> float:
    """Best of ``repeat`` loops of ``n`` calls: CPU seconds per call."""
    fn()  # connect, warm caches
    best = float("inf")
    for _ in range(repeat):
        c0 = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - c0) / n)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fetches", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, str(HERE / "benchlib" / "fakefleet.py"),
                               "--paths", "4", "--slow-share", "0"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[1])
        url = f"http://127.0.0.1:{port}/t1/metrics"
        target = PollTarget(name="t", url=url)
        via_requests = new_session(url, "requests")
        direct = new_session(url, "direct")
        plain = requests.Session()
        bare = http.client.HTTPConnection("127.0.0.1", port)

        def floor() -> str:
            bare.request("GET", "/t1/metrics", headers={"Accept-Encoding": "identity"})
            return bare.getresponse().read().decode()

        sides: list[tuple[str, Callable[[], str]]] = [
            ("baseline: requests.Session.get", lambda: plain.get(url, timeout=10).text),
            ("specwatch, requests transport", lambda: fetch(via_requests, target)),
            ("specwatch, direct transport", lambda: fetch(direct, target)),
            ("floor: bare http.client", floor),
        ]
        # The server moves each path one recorded page further per request, so the sides
        # cannot be compared byte for byte here (tests/poll/test_fetch_paths.py does that): each
        # must return a whole vLLM page.
        sizes = {name: len(fn()) for name, fn in sides}
        for name, fn in sides:
            body = fn()
            if not body.startswith("# HELP") or not body.endswith("\n") or len(body) < 50_000:
                raise SystemExit(f"{name} returned no whole page ({len(body)} bytes)")
        print(f"CPU per fetch of a {max(sizes.values()) / 1e3:.0f} KB page (process time, "
              f"best of {args.repeat} x {args.fetches} fetches)")
        base = None
        for name, fn in sides:
            per = cpu_per_call(fn, args.fetches, args.repeat)
            base = per if base is None else base
            print(f"{name:>32}: {per * 1e3:7.3f} ms   {base / per:5.2f}x", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
