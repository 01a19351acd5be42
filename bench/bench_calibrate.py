"""Benchmark: `specwatch calibrate` time and peak memory against the number of runs.

The inputs are the public sweep (tests/fixtures/sd-validation/, 323 runs of three drafters)
resampled to N runs: run i is fixture row i mod 323, its latency multiplied by a Gaussian
factor 1 ± 1% past the first copy (seeded), so that no two copies are identical. Each size
runs `specwatch calibrate INPUT --out DIR/params-{system}.yaml` in its own process (the
command as a user runs it, three systems fitted), timed on the wall clock, its peak resident
memory and CPU seconds from ``getrusage(RUSAGE_CHILDREN)`` (on a shared machine the CPU
seconds are the figure to compare; the wall time includes waiting for a core). One size
past `calibrate.inputs.MAX_RUNS` checks the refusal (one line, exit 2).

The bound the command keeps: 10^5 runs in under 30 s and 500 MiB.
Run: `python bench/bench_calibrate.py [--sizes 2000,10000,100000]`.
"""

from __future__ import annotations

import argparse
import csv
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specwatch.calibrate.inputs import MAX_RUNS

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "tests/fixtures/sd-validation/tomasruizt_qwen3-32b_1xH100_vllm-bench.csv"


def write_runs(n: int, out: Path, seed: int = 0) -> None:
    with SWEEP.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    rng = random.Random(seed)
    with out.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        for i in range(n):
            row = dict(rows[i % len(rows)])
            if i >= len(rows):
                factor = 1.0 + rng.gauss(0.0, 0.01)
                row["e2e_latency_s_est"] = f"{float(row['e2e_latency_s_est']) * factor:.4f}"
            writer.writerow(row)


def run(path: Path, folder: Path) -> tuple[int, float, float, float, str]:
    """(exit status, wall seconds, CPU seconds, peak MiB of this child, stderr's last line)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    before, cpu0 = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "specwatch", "calibrate", str(path), "--out",
                           str(folder / "params-{system}.yaml")], capture_output=True,
                          text=True, check=False)
    seconds = time.monotonic() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak, cpu = usage.ru_maxrss, usage.ru_utime + usage.ru_stime - cpu0
    # ru_maxrss of children is the largest child so far: sizes run in increasing order
    mib = max(peak, before) / 1024
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    return proc.returncode, seconds, cpu, mib, last


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=f"2000,10000,{MAX_RUNS}",
                    help="comma-separated numbers of runs (increasing)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] + [MAX_RUNS + 1]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(f"{'runs':>8} {'exit':>4} {'wall s':>8} {'CPU s':>7} {'peak MiB':>9}")
        for n in sizes:
            path = folder / f"runs-{n}.csv"
            write_runs(n, path)
            rc, seconds, cpu, mib, last = run(path, folder)
            print(f"{n:>8} {rc:>4} {seconds:>8.1f} {cpu:>7.1f} {mib:>9.0f}"
                  + (f"  {last[:100]}" if rc else ""))


if __name__ == "__main__":
    main()
