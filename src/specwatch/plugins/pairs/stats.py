"""Statistics of a measured A/B pair's bins from histogram buckets (pure functions).

Why apart from :mod:`specwatch.plugins.pairs.plugin`: these answer what the buckets allow one to
say, whatever the bins are: a quantile ratio only where the buckets resolve it, the largest
variance a distribution with given bucket counts and mean can have, and a ratio's interval
from two means and their variances (docs/exporter.md#measured-ab-pairs says why each).
Buckets are ((upper bound, cumulative count), ...) sorted by bound, +Inf last.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence

from specwatch.poll.formulas import histogram_quantile

#: The interval of the mean ratio: two-sided 90%.
INTERVAL_LEVEL = 0.90
#: A quantile ratio whose two quantiles share one histogram bucket (lo, hi] is exposed only
#: when hi / lo is at most this: the buckets alone then pin the ratio to within 10%.
SHARED_BUCKET_MAX_WIDTH = 1.10


def merge(hists: Sequence[tuple[tuple[float, float], ...]]) -> tuple[tuple[float, float], ...]:
    """Sum cumulative bucket counts of several windows (bounds unioned; a bound one window
    lacks takes that window's count at its next lower bound, the cumulative convention)."""
    bounds = sorted({b for h in hists for b, _ in h})
    total = dict.fromkeys(bounds, 0.0)
    for h in hists:
        hb = [b for b, _ in h]
        for b in bounds:
            i = bisect.bisect_right(hb, b) - 1
            if i >= 0:
                total[b] += h[i][1]
    return tuple((b, total[b]) for b in bounds)


def max_variance(buckets: Sequence[tuple[float, float]], mean: float) -> float | None:
    """The largest variance any distribution with these bucket counts and this exact mean
    can have (None with a request in the +Inf bucket: no upper end, no bound).

    Inside a bucket [lo, hi] with mean m_b, E[X^2] is at most m_b (lo + hi) - lo hi
    (Bhatia-Davis: all mass at the two ends). Summed over the buckets this is linear in the
    bucket means, which are free within their buckets but must add up to the exact mean:
    a fractional knapsack, maximised by raising the bucket means with the largest lo + hi
    first. Sharp, so the interval is as narrow as the buckets allow and no narrower.
    """
    rows = []  # (count, lo, hi)
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count > prev_count:
            if math.isinf(bound):
                return None
            rows.append((count - prev_count, prev_bound, bound))
        prev_bound, prev_count = bound, count
    n = sum(c for c, _, _ in rows)
    if n <= 0:
        return None
    budget = n * mean - sum(c * lo for c, lo, _ in rows)  # what the means rise above lo
    second = sum(c * lo * lo for c, lo, _ in rows)  # E[X^2] x n with every mean at lo
    for c, lo, hi in sorted(rows, key=lambda r: r[1] + r[2], reverse=True):
        rise = min(max(budget, 0.0), c * (hi - lo))
        second += rise * (lo + hi)
        budget -= rise
    return max(0.0, second / n - mean * mean)


def ratio_interval(num: float, num_var: float, den: float, den_var: float
                   ) -> tuple[float, float]:
    """90% interval of num / den by the delta method on the log scale.

    log(num / den) has variance num_var / num^2 + den_var / den^2 (the two taken as
    independent; for the two sides of a pair, which serve the same requests, the errors are
    positively correlated and the true variance is smaller: the interval errs wide, never
    narrow). Normal on the log scale: the interval of a ratio is asymmetric and positive.
    """
    z = statistics.NormalDist().inv_cdf(0.5 + INTERVAL_LEVEL / 2)
    half = z * math.sqrt(num_var / (num * num) + den_var / (den * den))
    ratio = num / den
    return ratio * math.exp(-half), ratio * math.exp(half)


def _quantile_bucket(q: float, buckets: Sequence[tuple[float, float]]
                     ) -> tuple[float, float] | None:
    """(lower, upper) bound of the bucket holding the q-quantile (the bucket PromQL's
    histogram_quantile interpolates in); None without observations."""
    if not buckets or not math.isinf(buckets[-1][0]) or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank and count > prev_count:
            return prev_bound, bound
        prev_bound, prev_count = bound, count
    return None


def quantile_ratio(q: float, sd: Sequence[tuple[float, float]],
                   base: Sequence[tuple[float, float]]) -> float | None:
    """Baseline q-quantile / SD q-quantile, only where the buckets resolve it.

    Resolved: the two quantiles lie in different buckets (the buckets alone say which side
    is faster), or in one bucket (lo, hi] with lo > 0 and hi / lo at most
    :data:`SHARED_BUCKET_MAX_WIDTH` (any two values in it are within 10%). Otherwise (both
    in one wide bucket, e.g. vLLM's first e2e bucket 0-0.3 s, where interpolation reads ~1
    whatever the truth) None: no series. A quantile in the +Inf bucket is never resolved.
    """
    bs, bb = _quantile_bucket(q, sd), _quantile_bucket(q, base)
    if bs is None or bb is None or math.isinf(bs[1]) or math.isinf(bb[1]):
        return None
    if bs == bb and not (bs[0] > 0 and bs[1] / bs[0] <= SHARED_BUCKET_MAX_WIDTH):
        return None
    qs, qb = histogram_quantile(q, sd), histogram_quantile(q, base)
    if not qs or qb is None or qs <= 0:
        return None
    return qb / qs
