"""Benchmark: the vectorised closed-form model against the naive seed's scalar loop.

One million (arrival rate, draft length, α) points are priced twice on the same inputs:

- specwatch: `specwatch.model.predict` (E from α, both systems at their own fixed point,
  speedup, validity), one vectorised numpy call;
- baseline: the naive seed pseudo-code (`specwatch.model.naive.naive_speedup_scalar`), a Python
  fixed-point loop on the batch size, one point at a time.

The scalar loop would take minutes on a million points, so it runs on a random subsample and
its time is extrapolated linearly (each point is independent, so the cost is linear in the
number of points); the output says so. Run: `python bench/bench_model.py [--points N]`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from specwatch.model.closed_form import acceptance_length_from_alpha, cost_terms, predict
from specwatch.model.naive import naive_speedup_scalar
from specwatch.model.params import load_params

ROOT = Path(__file__).resolve().parent.parent
PARAMS = ROOT / "examples" / "params" / "qwen3-32b-h100-eagle3.yaml"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--baseline-sample", type=int, default=5_000,
                        help="points the scalar baseline actually runs (then extrapolated)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="best of N timings per side")
    args = parser.parse_args()

    coef = load_params(PARAMS).coefficients
    p, g = 76.0, 256.0
    rng = np.random.default_rng(args.seed)
    n = args.points
    c2_d = float(cost_terms(coef, 0, 1.0, p, g)[1])
    lam_max = 0.9 / c2_d  # the no-SD system up to its validity ceiling
    lam = rng.uniform(0.0, lam_max, n)
    k = rng.integers(1, 9, n).astype(float)
    alpha = rng.uniform(0.0, 0.95, n)

    # Best of `--repeat` for both sides: the machine may be shared, and the minimum is the
    # least noisy estimate of what the code itself costs.
    t_vec = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        e = acceptance_length_from_alpha(alpha, k)
        pred = predict(coef, lam, k, e, p, g)
        t_vec = min(t_vec, time.perf_counter() - t0)
    valid = int(pred.valid.sum())

    m = min(args.baseline_sample, n)
    idx = rng.choice(n, size=m, replace=False)
    sample = [(float(lam[i]), float(k[i]), float(alpha[i])) for i in idx]
    t_sample = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        converged = 0
        for lam_i, k_i, a_i in sample:
            s = naive_speedup_scalar(coef, lam_i, k_i, a_i, g)
            converged += s == s
        t_sample = min(t_sample, time.perf_counter() - t0)
    t_scalar = t_sample * n / m

    print(f"points: {n:,} (arrival rate 0-{lam_max:.1f} req/s, k 1-8, alpha 0-0.95; fitted "
          f"coefficients {PARAMS.relative_to(ROOT)}, p={p:g}, g={g:g})")
    print(f"specwatch vectorised closed form : {t_vec:9.3f} s  (best of {args.repeat}; "
          f"{valid:,} valid, {n - valid:,} saturated or above the 0.9 ceiling)")
    print(f"naive scalar fixed-point loop    : {t_scalar:9.3f} s  (EXTRAPOLATED from "
          f"{m:,} points timed at {t_sample:.3f} s, best of {args.repeat}; "
          f"{converged:,} of them converged)")
    print(f"ratio (baseline / specwatch)     : {t_scalar / t_vec:9.1f}x  (target >= 100x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
