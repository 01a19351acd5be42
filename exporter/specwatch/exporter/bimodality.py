"""Bimodality of the per-poll acceptance samples that a change over time cannot explain.

Why not Sarle's coefficient of the raw samples: samples taken over a window mix "before"
and "after" whenever acceptance changes. A plain drop from 0.57 to 0.29 fills a 15-minute
window with two clusters, and the raw coefficient reads 0.85-0.95, the signature of two
populations, although the traffic was never mixed (issue 18, item 3). Two populations that
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

import bisect
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
    return _sarle(d, d2, n)


def _sarle(d: np.ndarray, d2: np.ndarray, n: int) -> float | None:
    """Sarle's coefficient from the deviations ``d`` from the mean (n >= 4) and their squares."""
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


def _prefix(v: np.ndarray) -> np.ndarray:
    """[0, v0, v0 + v1, ...]: the running sums of ``v`` after a leading 0."""
    out = np.empty(v.size + 1)
    out[0] = 0.0
    np.cumsum(v, out=out[1:])
    return out


def _split(d: np.ndarray, d2: np.ndarray, max_changes: int) -> list[int]:
    """Greedy binary segmentation of the centred samples ``d`` (``d2``: their squares).

    The sum of squared deviations of samples [a, c) is q − s²/(c − a) with s and q the
    differences of the running sums of d and d² at c and a. For a bound b (0, n or a change
    point found so far) one vector holds it for every other position c at once:
    ``dist[b][c]``, the samples between b and c. Splitting segment [a, b) at a < c < b gains
    dist[a][b] − (dist[a][c] + dist[b][c]): the same three terms, in the same floating-point
    operations, that the former per-segment evaluation computed, so the gains, hence the
    chosen points, are the same to the last bit; a round adds one vector (its new bound)
    instead of re-evaluating every segment.
    """
    n = d.size
    if n < 2 or max_changes < 1:
        return []
    cs, cs2 = _prefix(d), _prefix(d2)
    counts = np.arange(n + 1, dtype=float)  # positions 0..n; samples between b and c below
    counts[0] = 1.0  # dist[b][b] is 0 (0 − 0/1), not 0/0
    # From 0 (cs[0] = cs2[0] = 0: subtracting them changes no bit) and from n (counts
    # reversed: n − c, and 1 at n). cs2 never decreases (a running sum of squares), so the
    # differences of cs2 need no abs() here.
    dist = {0: np.maximum(cs2 - cs * cs / counts, 0.0)}
    s = cs - cs[n]
    dist[n] = np.maximum((cs2[n] - cs2) - s * s / counts[::-1], 0.0)
    bounds = [0, n]
    for _ in range(max_changes):
        best_gain, best_c = 1e-15, -1
        for a, b in itertools.pairwise(bounds):
            if b - a < 2:
                continue
            gain = dist[a][b] - (dist[a][a + 1:b] + dist[b][a + 1:b])
            i = int(gain.argmax())
            if gain[i] > best_gain:
                best_gain, best_c = float(gain[i]), a + 1 + i
        if best_c < 0:
            break
        bisect.insort(bounds, best_c)
        if len(bounds) - 2 < max_changes:  # another round will read it
            s = cs - cs[best_c]
            cnt = np.abs(np.arange(-best_c, n + 1 - best_c, dtype=float))
            cnt[best_c] = 1.0
            dist[best_c] = np.maximum(np.abs(cs2 - cs2[best_c]) - s * s / cnt, 0.0)
    return bounds[1:-1]


def change_points(samples: Sequence[float] | np.ndarray, max_changes: int = MAX_CHANGES
                  ) -> list[int]:
    """Indices c (a change between samples c − 1 and c), at most ``max_changes``, sorted.

    Greedy binary segmentation into segments of constant level: each round applies the
    split, among the current segments, that lowers the sum of squared deviations from the
    segment means most (none that gains nothing). A segment may be one sample long, so a
    change one poll before the newest sample is found too.
    """
    x = np.asarray(samples, dtype=float)
    if x.size < 2:
        return []
    d = x - float(_sum(x)) / x.size  # centred: less cancellation in the running sums
    return _split(d, d * d, max_changes)


def _kept(cps: list[int], n: int) -> list[tuple[int, int]]:
    """The ranges [a, b) of samples kept between the change points ``cps`` (of n samples).

    Leaving out samples c − 1 and c around each change point c trims one sample off each
    side of it: a segment stays one contiguous range (empty between adjacent points).
    """
    bounds = [0, *cps, n]
    return [(a + 1 if a > 0 else a, b - 1 if b < n else b)
            for a, b in itertools.pairwise(bounds)]


def segments(samples: Sequence[float] | np.ndarray, max_changes: int = MAX_CHANGES
             ) -> list[np.ndarray]:
    """The samples split at :func:`change_points`, without the two beside each change.

    The poll interval that straddles a change averages both levels: it and its neighbour
    across the change are left out.
    """
    x = np.asarray(samples, dtype=float)
    return [x[a:max(a, b)].copy() for a, b in _kept(change_points(x, max_changes), x.size)]


def coexistence_coefficient(samples: Sequence[float] | np.ndarray,
                            max_changes: int = MAX_CHANGES) -> float | None:
    """The bimodality coefficient reported as ``sd_acceptance_bimodality_coefficient``.

    min(Sarle's coefficient of all the samples, the sample-weighted mean of Sarle's
    coefficient within each of :func:`segments`). Segments whose coefficient is undefined
    (fewer than 4 samples, no spread) are left out of the mean. None when the raw
    coefficient is undefined (fewer than 4 samples, no variance) or no segment has one.

    One pass: the deviations from the mean serve the raw coefficient and the change points'
    running sums; each kept segment is a slice (no copy) whose coefficient is computed as
    :func:`sarle_coefficient` does, centred on its own mean (so a nearly constant segment
    meets the "no spread" rule exactly as before, with no cancellation from raw power sums).
    """
    x = np.asarray(samples, dtype=float)
    n = x.size
    if n < 4:
        return None
    d = x - float(_sum(x)) / n
    d2 = d * d
    raw = _sarle(d, d2, n)
    if raw is None:
        return None
    total = weight = 0.0
    for a, b in _kept(_split(d, d2, max_changes), n):
        m = b - a
        if m < 4:
            continue
        seg = x[a:b]
        ds = seg - float(_sum(seg)) / m
        bc = _sarle(ds, ds * ds, m)
        if bc is not None:
            total += bc * m
            weight += m
    if weight == 0:
        return None
    return min(raw, total / weight)
