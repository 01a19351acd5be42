"""REFERENCE (tests only): specwatch.poll.windows.bimodality before its prefix-sum rewrite.

Kept verbatim (this paragraph aside) so the prefix-sum implementation in
``specwatch.poll.windows.bimodality`` can be checked against it (same change points, the
same None cases, coefficients to 1e-9) by tests/poll/test_bimodality_equivalence.py. Not used
by the exporter.

Bimodality of the per-poll acceptance samples that a change over time cannot explain.

Why not Sarle's coefficient of the raw samples: samples taken over a window mix "before"
and "after" whenever acceptance changes. A plain drop from 0.57 to 0.29 fills a 15-minute
window with two clusters, and the raw coefficient reads 0.85-0.95, the signature of two
populations, although the traffic was never mixed. Two populations that
*coexist* keep alternating inside the window; a change happens once (a step), or twice (a
dip that recovers), or gradually (a drift).

Method (docs/metrics.md, "Acceptance heterogeneity: method and limits"):

1. Split the samples, in poll order, at no more than :data:`MAX_CHANGES` change points into
   segments of constant level (greedy binary segmentation: each round makes the one split
   that lowers the squared deviations from the segment means most). A step needs one change
   point and a dip that recovers two; two populations that take turns need one per switch,
   so two change points cannot separate them.
2. Leave out the sample on each side of each change point: the poll interval that straddles
   a change averages both levels and would sit between the clusters as an outlier.
3. Take Sarle's coefficient within each segment and average them, weighted by samples.
   After a step, each segment holds one level (unimodal: about 0.35 with normal noise);
   with interleaved populations each segment still holds both (0.8-0.9 for a 50/50 mix).

The reported coefficient is the smaller of that mean and the coefficient of all the
samples: it never exceeds the raw coefficient, so it can only fire less than before. A
gradual drift needs no special case: evenly spread samples are at most as bimodal as the
uniform distribution, 5/9, the threshold itself. It runs on every poll of every target, so
each split is O(n) with prefix sums (numpy), not an O(n²) exact segmentation.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

#: Sarle's threshold: a coefficient above 5/9 (uniform distribution) suggests two modes.
BIMODALITY_THRESHOLD = 5.0 / 9.0

#: Change points a window's samples may be explained by before what is left counts as
#: two populations: 1 explains a step, 2 a dip that recovers (or a step and a drift).
MAX_CHANGES = 2

_sum = np.add.reduce


def sarle_coefficient(samples: Sequence[float] | np.ndarray) -> float | None:
    """Sarle's bimodality coefficient with the small-sample corrections.

    BC = (G1² + 1) / (G2 + 3(n − 1)² / ((n − 2)(n − 3))), G1 the adjusted skewness and G2 the
    adjusted excess kurtosis. Needs n >= 4 and a non-zero variance, else None.
    """
    x = np.asarray(samples, dtype=float)
    n = x.size
    if n < 4:
        return None
    # _sum(a) / n is what ndarray.mean() computes (the same pairwise sum, one division),
    # without its Python-level wrapper: this runs for every window on every poll.
    d = x - float(_sum(x)) / n
    d2 = d * d
    m2 = float(_sum(d2)) / n
    if m2 <= 1e-18:
        return None
    m3 = float(_sum(d2 * d)) / n
    m4 = float(_sum(d2 * d2)) / n
    g1 = m3 / m2 ** 1.5
    g2 = m4 / m2 ** 2 - 3.0
    big_g1 = g1 * math.sqrt(n * (n - 1)) / (n - 2)
    big_g2 = ((n + 1) * g2 + 6.0) * (n - 1) / ((n - 2) * (n - 3))
    denom = big_g2 + 3.0 * (n - 1) ** 2 / ((n - 2) * (n - 3))
    if denom <= 0:
        return None
    bc = (big_g1 ** 2 + 1.0) / denom
    return bc if math.isfinite(bc) else None


def _sse(cs: np.ndarray, cs2: np.ndarray, a: np.ndarray | int, b: np.ndarray | int
         ) -> np.ndarray:
    """Sum of squared deviations from their mean of samples [a, b), from prefix sums."""
    s = cs[b] - cs[a]
    return np.maximum((cs2[b] - cs2[a]) - s * s / (b - a), 0.0)


def change_points(samples: Sequence[float] | np.ndarray, max_changes: int = MAX_CHANGES
                  ) -> list[int]:
    """Indices c (a change between samples c − 1 and c), at most ``max_changes``, sorted.

    Greedy binary segmentation into segments of constant level: each round applies the
    split, among the current segments, that lowers the sum of squared deviations from the
    segment means most (none that gains nothing). A segment may be one sample long, so a
    change one poll before the newest sample is found too.
    """
    x = np.asarray(samples, dtype=float)
    xc = x - float(_sum(x)) / x.size if x.size else x  # centred: less cancellation
    zero = np.zeros(1)
    cs = np.concatenate((zero, np.cumsum(xc)))
    cs2 = np.concatenate((zero, np.cumsum(xc * xc)))
    bounds = [0, x.size]
    for _ in range(max_changes):
        best_gain, best_c = 1e-15, -1
        for a, b in itertools.pairwise(bounds):
            if b - a < 2:
                continue
            cuts = np.arange(a + 1, b)
            gain = _sse(cs, cs2, a, b) - (_sse(cs, cs2, a, cuts) + _sse(cs, cs2, cuts, b))
            i = int(np.argmax(gain))
            if gain[i] > best_gain:
                best_gain, best_c = float(gain[i]), int(cuts[i])
        if best_c < 0:
            break
        bounds = sorted([*bounds, best_c])
    return bounds[1:-1]


def segments(samples: Sequence[float] | np.ndarray, max_changes: int = MAX_CHANGES
             ) -> list[np.ndarray]:
    """The samples split at :func:`change_points`, without the two beside each change.

    The poll interval that straddles a change averages both levels: it and its neighbour
    across the change are left out.
    """
    x = np.asarray(samples, dtype=float)
    cps = change_points(x, max_changes)
    keep = np.ones(x.size, dtype=bool)
    for c in cps:
        keep[max(0, c - 1):c + 1] = False
    bounds = [0, *cps, x.size]
    return [x[a:b][keep[a:b]] for a, b in itertools.pairwise(bounds)]


def coexistence_coefficient(samples: Sequence[float] | np.ndarray,
                            max_changes: int = MAX_CHANGES) -> float | None:
    """The bimodality coefficient reported as ``sd_acceptance_bimodality_coefficient``.

    min(Sarle's coefficient of all the samples, the sample-weighted mean of Sarle's
    coefficient within each of :func:`segments`). Segments whose coefficient is undefined
    (fewer than 4 samples, no spread) are left out of the mean. None when the raw
    coefficient is undefined (fewer than 4 samples, no variance) or no segment has one.
    """
    x = np.asarray(samples, dtype=float)
    raw = sarle_coefficient(x)
    if raw is None:
        return None
    total = weight = 0.0
    for seg in segments(x, max_changes):
        bc = sarle_coefficient(seg)
        if bc is not None:
            total += bc * seg.size
            weight += seg.size
    if weight == 0:
        return None
    return min(raw, total / weight)
