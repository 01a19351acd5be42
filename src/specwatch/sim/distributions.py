"""The scenario's random quantities: token-length and acceptance (α) distributions.

Each distribution carries a sampler and its exact (or numerically integrated) moments, because
the tests compare what the exporter derives against the scenario's known truth;
`acceptance_truth` gives what vLLM's SD counters converge to under an α distribution. Moments
integrated numerically use fixed seeds: the truth is a number, not a random variable.
Distributions are frozen (hashable) dataclasses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from specwatch.common.errors import ConfigError
from specwatch.sim.validation import Node, check_number, kind_of

__all__ = ["AcceptanceDist", "LengthDist", "acceptance_truth", "parse_acceptance",
           "parse_length"]

# Draws used to integrate moments of distributions that have no closed form (truncated
# lognormals, mixtures seen through non-linear functions).
_TRUTH_SAMPLES = 200_000


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution (prompt or generation), integer-valued and >= 1.

    kinds: ``fixed`` (value), ``uniform`` (min..max inclusive), ``lognormal`` (mean, cv,
    optional min/max clip), ``exponential`` (mean, optional min/max clip).
    """

    kind: str
    value: float = 0.0
    mean_: float = 0.0
    cv: float = 0.0
    lo: int = 1
    hi: int = 1 << 30

    def sample(self, rng: np.random.Generator, n: int | None = None) -> Any:
        size = 1 if n is None else n
        if self.kind == "fixed":
            out = np.full(size, int(self.value), dtype=np.int64)
        elif self.kind == "uniform":
            out = rng.integers(self.lo, self.hi + 1, size=size)
        elif self.kind == "lognormal":
            sigma2 = math.log1p(self.cv**2)
            mu = math.log(self.mean_) - sigma2 / 2.0
            raw = rng.lognormal(mu, math.sqrt(sigma2), size=size)
            out = np.clip(np.rint(raw), self.lo, self.hi).astype(np.int64)
        else:  # exponential
            raw = rng.exponential(self.mean_, size=size)
            out = np.clip(np.rint(raw), self.lo, self.hi).astype(np.int64)
        out = np.maximum(out, 1)
        return int(out[0]) if n is None else out

    def mean(self) -> float:
        """Exact for fixed/uniform; integrated numerically where clipping/rounding apply."""
        if self.kind == "fixed":
            return float(int(self.value))
        if self.kind == "uniform":
            return (self.lo + self.hi) / 2.0
        rng = np.random.default_rng(12345)
        return float(np.mean(self.sample(rng, _TRUTH_SAMPLES)))

    @property
    def upper(self) -> int:
        """The largest value this distribution can produce (for KV-cache sanity checks)."""
        if self.kind == "fixed":
            return int(self.value)
        return int(self.hi)


def parse_length(source: str, path: str, value: Any) -> LengthDist:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        parent, _, key = path.rpartition(".")
        v = check_number(Node(source, parent, {}), key, value, 1, None, False, False, True)
        return LengthDist("fixed", value=v)
    node = Node(source, path, value)
    kind = node.string("dist")
    if kind == "fixed":
        dist = LengthDist("fixed", value=node.number("value", lo=1, integer=True))
    elif kind == "uniform":
        lo = node.number("min", lo=1, integer=True)
        hi = node.number("max", lo=1, integer=True)
        if hi < lo:
            node.fail(f"must be >= min ({lo}), got {hi}", "max")
        dist = LengthDist("uniform", lo=lo, hi=hi)
    elif kind in ("lognormal", "exponential"):
        mean = node.number("mean", lo=1)
        cv = node.number("cv", lo=0, lo_open=True) if kind == "lognormal" else 1.0
        lo = node.number("min", 1, lo=1, integer=True)
        hi = node.number("max", 1 << 30, lo=1, integer=True)
        if hi < lo:
            node.fail(f"must be >= min ({lo}), got {hi}", "max")
        dist = LengthDist(kind, mean_=float(mean), cv=float(cv), lo=lo, hi=hi)
    else:
        node.fail(
            f"unknown distribution {kind!r} (expected fixed, uniform, lognormal, exponential)",
            "dist",
        )
    node.finish()
    return dist


@dataclass(frozen=True)
class AcceptanceDist:
    """Distribution of the per-request token acceptance probability α (i.i.d. per position).

    kinds: ``fixed`` (value), ``beta`` (mean + concentration, or a + b), ``mixture`` (weighted
    components, each fixed or beta: bimodal traffic such as easy code completion mixed with
    hard creative text).

    A mixture mixes per request by default: every poll interval then sees both populations,
    which shows in the per-position acceptance (conditional acceptance rising with
    position). With ``switch_every_s`` the populations take turns instead: every block of
    that many scenario seconds serves one component (drawn by weight), as when tenants or
    batch jobs alternate; the per-interval acceptance-rate samples then split in two.
    """

    kind: str
    value: float = 0.0
    a: float = 0.0
    b: float = 0.0
    weights: tuple[float, ...] = ()
    components: tuple[AcceptanceDist, ...] = ()
    switch_every_s: float = 0.0

    def sample(self, rng: np.random.Generator, n: int | None = None) -> Any:
        size = 1 if n is None else n
        if self.kind == "fixed":
            out = np.full(size, self.value)
        elif self.kind == "beta":
            out = rng.beta(self.a, self.b, size=size)
        else:
            which = rng.choice(len(self.components), size=size, p=np.asarray(self.weights))
            out = np.empty(size)
            for i, comp in enumerate(self.components):
                mask = which == i
                if mask.any():
                    out[mask] = comp.sample(rng, int(mask.sum()))
        return float(out[0]) if n is None else out

    def mean(self) -> float:
        if self.kind == "fixed":
            return self.value
        if self.kind == "beta":
            return self.a / (self.a + self.b)
        return float(sum(w * c.mean() for w, c in zip(self.weights, self.components, strict=True)))

    def truth(self, k: int, generation: LengthDist | None = None) -> dict[str, Any]:
        """See `acceptance_truth` (cached: the integration takes a few tens of ms)."""
        return acceptance_truth(self, k, generation)

    def _truth(self, k: int, generation: LengthDist | None = None) -> dict[str, Any]:
        rng = np.random.default_rng(54321)
        alpha = self.sample(rng, _TRUTH_SAMPLES)
        if k <= 0:
            return {"alpha_mean": float(np.mean(alpha))}
        powers = alpha[:, None] ** np.arange(1, k + 1)[None, :]  # P(accepted >= i), i = 1..k
        e = 1.0 + powers.sum(axis=1)
        g = generation.sample(rng, _TRUTH_SAMPLES).astype(float) if generation else 1.0
        cycles = g / e
        drafts = float(np.sum(cycles))
        accepted = float(np.sum(cycles * (e - 1.0)))
        per_pos = [float(np.sum(cycles * powers[:, i]) / drafts) for i in range(k)]
        out: dict[str, Any] = {
            "alpha_mean": float(np.mean(alpha)),
            "acceptance_rate": accepted / (drafts * k),
            "acceptance_length": 1.0 + accepted / drafts,
            "position_acceptance_rate": per_pos,
        }
        if k >= 2 and 0.0 < per_pos[0] < 1.0:
            # draft-weighted Var(α) / (E α (1 − E α)): 0 for one α, up to 1 for two extremes
            p0, p1 = per_pos[0], per_pos[1]
            out["acceptance_heterogeneity"] = (p1 - p0 * p0) / (p0 * (1.0 - p0))
        return out


@lru_cache(maxsize=256)
def acceptance_truth(dist: AcceptanceDist, k: int,
                     generation: LengthDist | None = None) -> dict[str, Any]:
    """What vLLM's counters converge to for drafts of length k under α distribution `dist`.

    Every request contributes drafts in proportion to its verify cycles, g/E(α): requests
    with low α need more cycles, so counter ratios weight them more than a plain average
    over requests would. Keys: ``acceptance_rate`` (accepted/proposed),
    ``acceptance_length`` (1 + accepted/drafts), ``position_acceptance_rate`` (P(accepted >
    i) per draft, i = 0..k−1), ``acceptance_heterogeneity`` (the exporter's normalised
    variance of α, from positions 0 and 1), ``alpha_mean`` (over requests).
    """
    return dist._truth(k, generation)


def parse_acceptance(source: str, path: str, value: Any, *,
                      nested: bool = False) -> AcceptanceDist:
    if nested and not isinstance(value, Mapping):
        raise ConfigError(
            f"{source}: {path}: expected a mapping with weight and dist, got {kind_of(value)}"
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        parent, _, key = path.rpartition(".")
        v = check_number(Node(source, parent, {}), key, value, 0, 1, False, False, False)
        return AcceptanceDist("fixed", value=float(v))
    node = Node(source, path, value)
    if nested:
        node.number("weight", lo=0, lo_open=True)
    kind = node.string("dist")
    if kind == "fixed":
        dist = AcceptanceDist("fixed", value=float(node.number("value", lo=0, hi=1)))
    elif kind == "beta":
        if node.has("mean") or node.has("concentration"):
            mean = node.number("mean", lo=0, hi=1, lo_open=True, hi_open=True)
            conc = node.number("concentration", lo=0, lo_open=True)
            a, b = mean * conc, (1.0 - mean) * conc
        else:
            a = node.number("a", lo=0, lo_open=True)
            b = node.number("b", lo=0, lo_open=True)
        dist = AcceptanceDist("beta", a=float(a), b=float(b))
    elif kind == "mixture" and not nested:
        comps = node.items("components")
        if len(comps) < 2:
            node.fail("a mixture needs at least two components", "components")
        parsed = [parse_acceptance(source, p, v, nested=True) for p, v in comps]
        weights = [float(v["weight"]) for _, v in comps]
        total = sum(weights)
        switch = node.number("switch_every_s", 0.0, lo=0)
        dist = AcceptanceDist(
            "mixture",
            weights=tuple(w / total for w in weights),
            components=tuple(parsed),
            switch_every_s=float(switch),
        )
    else:
        allowed = "fixed, beta" if nested else "fixed, beta, mixture"
        node.fail(f"unknown distribution {kind!r} (expected {allowed})", "dist")
    node.finish()
    return dist
