"""Bimodality of the per-poll acceptance samples that a change over time cannot explain.

Samples taken over a window mix "before" and "after" whenever acceptance changes, so
Sarle's coefficient of the raw samples reads two populations after a plain drop. Two
populations that *coexist* keep alternating inside the window; a change happens once (a
step), twice (a dip that recovers) or gradually (a drift). So the samples are split, in
poll order, at no more than :data:`MAX_CHANGES` change points (greedy binary segmentation,
O(n) a split with prefix sums), the sample on each side of each change point is left out
(the poll interval that straddles a change averages both levels), and Sarle's coefficient
is taken within each segment and averaged, weighted by samples.

Invariant: the reported coefficient is the smaller of that mean and the coefficient of all
the samples, so it never exceeds the raw coefficient.

Method and limits: docs/metrics.md, "Acceptance heterogeneity: method and limits"; how it is
computed in a few numpy calls a window: docs/performance.md, "History, derive and
exposition" (checked against ``tests/helpers/reference_bimodality.py``).
"""

from __future__ import annotations

import bisect
import functools
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
    """Sarle's coefficient from the deviations ``d`` from the mean (n >= 4) and their squares.

    The moments are dot products (one call each, no temporary). They sum in another order
    than numpy's pairwise sum (the reference, ``tests/helpers/reference_bimodality.py``), so
    they may differ in the last bits: by at most 2·(n + 1)·2⁻⁵³ relative for the sums of
    squares and fourth powers (positive terms), and for the third moment by as little of
    the coefficient (its skewness enters squared beside 1), far below the 1e-9 the
    reference tests ask. The "no spread" rule m2 <= 1e-18 must decide as the reference
    does: an m2 within that rounding of 1e-18 is summed again with the pairwise sum.
    """
    m2 = float(d.dot(d)) / n
    if abs(m2 - 1e-18) <= 1e-33 * (n + 1):  # too close to the limit to trust the order
        m2 = float(_sum(d2)) / n
    if m2 <= 1e-18:
        return None
    m3 = float(d2.dot(d)) / n
    m4 = float(d2.dot(d2)) / n
    g1 = m3 / m2 ** 1.5
    g2 = m4 / m2 ** 2 - 3.0
    big_g1 = g1 * math.sqrt(n * (n - 1)) / (n - 2)
    big_g2 = ((n + 1) * g2 + 6.0) * (n - 1) / ((n - 2) * (n - 3))
    denom = big_g2 + 3.0 * (n - 1) ** 2 / ((n - 2) * (n - 3))
    if denom <= 0:
        return None
    bc = (big_g1 ** 2 + 1.0) / denom
    return bc if math.isfinite(bc) else None


@functools.lru_cache(maxsize=32)
def _counts(n: int) -> np.ndarray:
    """max(|j|, 1) for j = −n..n, at index n + j; read-only, shared by calls with this n.

    |p − c| samples lie between positions p and c; the 1 where p = c makes the squared
    deviations of no samples 0 − 0/1 = 0 instead of 0/0. Window lengths barely change from
    one poll to the next, so the cache (32 lengths at most) keeps this off the poll path.
    """
    k = np.abs(np.arange(-n, n + 1, dtype=float))
    k[n] = 1.0
    k.flags.writeable = False
    return k


def _centred(x: np.ndarray) -> np.ndarray:
    """Rows [0, d...] and [0, d²...]: the deviations d from the mean and their squares.

    A running sum along the rows (in place) then gives the prefix sums the change points
    read, one row each, with the leading 0 where a segment starts at sample 0.
    """
    n = x.size
    buf = np.zeros((2, n + 1))
    d = buf[0, 1:]
    np.subtract(x, float(_sum(x)) / n, out=d)  # centred: less cancellation in the sums
    np.multiply(d, d, out=buf[1, 1:])
    return buf


def _split(cs: np.ndarray, cs2: np.ndarray, max_changes: int) -> list[int]:
    """Greedy binary segmentation from the prefix sums of the centred samples (cs) and of
    their squares (cs2), both n + 1 long with cs[0] = cs2[0] = 0.

    The sum of squared deviations of samples [a, c) is q − s²/(c − a) with s and q the
    differences of cs and cs2 at c and a. For a bound b (0, n or a change point found so
    far) one vector holds it for every position c at once: ``dist[b][c]``, the samples
    between b and c. Splitting segment [a, b) at a < c < b gains dist[a][b] −
    (dist[a][c] + dist[b][c]): the same three terms, from the same floating-point
    operations (a difference negated, a count |c − b|), that a per-segment evaluation
    (the reference) computes, so the gains, hence the chosen points, are the same to the last
    bit. A round adds one vector (its new bound) instead of re-evaluating three sums of
    squares per segment.
    """
    n = cs.size - 1
    if n < 2 or max_changes < 1:
        return []
    k = _counts(n)
    dist = dict(zip((0, n), _ends(cs, cs2, n), strict=True))
    bounds = [0, n]
    for round_ in range(max_changes):
        best_gain, best_c = 1e-15, -1
        for a, b in itertools.pairwise(bounds):
            if b - a < 2:
                continue
            da = dist[a]
            gain = da[a + 1:b] + dist[b][a + 1:b]
            np.subtract(float(da[b]), gain, out=gain)
            i = int(gain.argmax())
            g = float(gain[i])
            if g > best_gain:
                best_gain, best_c = g, a + 1 + i
        if best_c < 0:
            break
        bisect.insort(bounds, best_c)
        if round_ + 1 < max_changes:  # another round reads its distances
            dist[best_c] = _dist(cs, cs2, best_c, k[n - best_c:2 * n + 1 - best_c])
    return bounds[1:-1]


@functools.lru_cache(maxsize=32)
def _end_counts(n: int) -> np.ndarray:
    """|c − b| (1 at b) for the bounds b = 0 and b = n, as two rows: ``_counts(n)[n:]`` and
    ``_counts(n)[:n + 1]``; read-only, shared like :func:`_counts`."""
    k = _counts(n)
    rows = np.stack((k[n:], k[:n + 1]))
    rows.flags.writeable = False
    return rows


def _ends(cs: np.ndarray, cs2: np.ndarray, n: int) -> np.ndarray:
    """:func:`_dist` for the bounds 0 and n, the first two every segmentation reads, as two
    rows made by the same operations on each element (nine numpy calls instead of
    fourteen: windows are short, so the calls cost more than the arithmetic)."""
    s = cs - cs[::n, None]  # cs[::n]: cs[0] and cs[n] (cs is n + 1 long), a view
    np.multiply(s, s, out=s)
    np.divide(s, _end_counts(n), out=s)
    q = cs2 - cs2[::n, None]
    np.abs(q, out=q)
    np.subtract(q, s, out=q)
    return np.maximum(q, 0.0, out=q)


def _dist(cs: np.ndarray, cs2: np.ndarray, b: int, counts: np.ndarray) -> np.ndarray:
    """Sum of squared deviations of the samples between position b and each position c,
    max(|cs2[c] − cs2[b]| − (cs[c] − cs[b])² / |c − b|, 0) (``counts``: |c − b|, 1 at b).

    For c < b the differences are negated, which changes no bit of the square or the
    absolute value. In place: seven numpy calls, two arrays.
    """
    s = cs - float(cs[b])
    np.multiply(s, s, out=s)
    np.divide(s, counts, out=s)
    q = cs2 - float(cs2[b])
    np.abs(q, out=q)
    np.subtract(q, s, out=q)
    return np.maximum(q, 0.0, out=q)


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
    buf = np.add.accumulate(_centred(x), axis=1)
    return _split(buf[0], buf[1], max_changes)


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
    meets the "no spread" rule exactly as there, with no cancellation from raw power sums).
    """
    x = np.asarray(samples, dtype=float)
    n = x.size
    if n < 4:
        return None
    buf = _centred(x)
    raw = _sarle(buf[0, 1:], buf[1, 1:], n)
    if raw is None:
        return None
    np.add.accumulate(buf, axis=1, out=buf)  # the rows' prefix sums (cumsum)
    total = weight = 0.0
    for a, b in _kept(_split(buf[0], buf[1], max_changes), n):
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
