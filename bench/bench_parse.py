"""Benchmark: CPU per page of specwatch's poll path against a full prometheus_client parse.

Pages: the real 55 KB vLLM 0.32 page from the fixtures, and a 2 MB page built from it (the
same series for many models x 4 data-parallel engines, the layout vLLM writes).

Each side gets the page as the poller does, as bytes off the socket, and is timed in process
CPU seconds (``time.process_time``, not wall time: the machine may be shared), best of
``--repeat`` runs of a loop over the page:

- baseline: ``bytes.decode`` + ``prometheus_client.parser.text_string_to_metric_families``
  consumed to the end (what an exporter that parses the whole page pays), and, for
  reference, specwatch's own ``parse_page(parser="full")`` (the same parse + the mapping to
  canonical signals);
- specwatch: ``bytes.decode`` + ``parse_page(parser="fast")``, the default poll path, whose
  result is checked equal to the full parse's before timing.

Run: `python bench/bench_parse.py [--repeat N] [--big-bytes B]`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from benchlib.pages import big_page, real_page
from prometheus_client.parser import text_string_to_metric_families

from specwatch.poll import sources


def cpu_per_call(fn: Callable[[], object], min_seconds: float, repeat: int) -> float:
    """Best of ``repeat`` loops (each at least ``min_seconds`` of CPU) of CPU s per call."""
    best = float("inf")
    for _ in range(repeat):
        n = 0
        t0 = time.process_time()
        while True:
            fn()
            n += 1
            spent = time.process_time() - t0
            if spent >= min_seconds:
                break
        best = min(best, spent / n)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="best of N timing loops")
    parser.add_argument("--min-seconds", type=float, default=0.5,
                        help="CPU seconds per timing loop")
    parser.add_argument("--big-bytes", type=int, default=2_000_000)
    args = parser.parse_args()

    big, models, engines = big_page(args.big_bytes)
    cases = [("real vLLM 0.32 page", real_page()),
             (f"built page ({models} models x {engines} engines)", big)]
    print(f"CPU per page, process time, best of {args.repeat} loops of >= "
          f"{args.min_seconds:g} s CPU each")
    for label, text in cases:
        body = text.encode()
        full = sources.parse_page(text, parser="full")
        fast = sources.parse_page(text, parser="fast")
        assert fast == full, "fast and full parse disagree"
        lines = text.count("\n")

        def baseline(body: bytes = body) -> None:
            for _ in text_string_to_metric_families(body.decode("utf-8")):
                pass

        t_base = cpu_per_call(baseline, args.min_seconds, args.repeat)
        t_full = cpu_per_call(lambda b=body: sources.parse_page(b.decode("utf-8"),
                                                                 parser="full"),
                              args.min_seconds, args.repeat)
        t_fast = cpu_per_call(lambda b=body: sources.parse_page(b.decode("utf-8")),
                              args.min_seconds, args.repeat)
        print(f"\n{label}: {len(body):,} bytes, {lines:,} lines, "
              f"{sum(1 for _ in full.counters):,} counter series read")
        print(f"  baseline prometheus_client full parse     : {t_base * 1e3:9.2f} ms")
        print(f"  specwatch parse_page(parser='full')       : {t_full * 1e3:9.2f} ms")
        print(f"  specwatch poll path parse_page('fast')    : {t_fast * 1e3:9.2f} ms")
        target = 10 if len(body) > 1_000_000 else 3
        print(f"  ratio (baseline / specwatch)              : {t_base / t_fast:9.1f}x  "
              f"(target >= {target}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
