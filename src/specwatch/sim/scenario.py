"""Simulator scenario files: what load, lengths and acceptance a simulated vLLM sees over time.

A scenario is YAML (documented in the README, "Simulator and demo"). It is validated strictly,
like every specwatch input: an unknown key, a wrong type or an out-of-range number raises
`ConfigError` naming the file and the key path (``models[0].phases[2].arrival_rate.to``), so a
typo never silently becomes a default. The packaged scenarios live in
``specwatch/sim/data/scenarios/`` and can be named without a path (``--scenario demo``).

The objects here are plain, immutable descriptions; the physics lives in `specwatch.sim.engine`.
Distributions carry both a sampler and their exact (or numerically integrated) moments, because
the tests compare what the exporter derives against the scenario's known truth.

Size: the scenario file format is one schema (models, phases, acceptance distributions,
restarts, faults) validated in one pass with errors that name the file and key; it reads
best as one module, like the serve config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from specwatch.common.errors import ConfigError

__all__ = [
    "AcceptanceDist",
    "LengthDist",
    "ModelSpec",
    "Phase",
    "RateProfile",
    "Restart",
    "Scenario",
    "load_scenario",
    "packaged_scenario_names",
    "packaged_scenario_path",
    "parse_scenario",
    "resolve_scenario_path",
]

_SCENARIO_DIR = "data/scenarios"
# Draws used to integrate moments of distributions that have no closed form (truncated
# lognormals, mixtures seen through non-linear functions). Fixed seed: the truth is a number,
# not a random variable.
_TRUTH_SAMPLES = 200_000


# --------------------------------------------------------------------------- validation


class _Node:
    """One mapping of the YAML document with its key path, for strict, well-named checks."""

    def __init__(self, source: str, path: str, value: Any) -> None:
        self.source = source
        self.path = path
        if not isinstance(value, Mapping):
            self.fail(f"expected a mapping, got {_kind(value)}")
        self.data: Mapping[str, Any] = value
        self.used: set[str] = set()

    def where(self, key: str | None = None) -> str:
        if key is None:
            return self.path or "(top level)"
        return f"{self.path}.{key}" if self.path else key

    def fail(self, message: str, key: str | None = None) -> ConfigError:
        raise ConfigError(f"{self.source}: {self.where(key)}: {message}")

    def allow(self, *keys: str) -> None:
        """Reject unknown keys before anything else, so a typo is reported as a typo."""
        unknown = [k for k in self.data if k not in keys]
        if unknown:
            self.fail(f"unknown key {unknown[0]!r} (allowed here: {', '.join(keys)})",
                      str(unknown[0]))

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = ..., required: bool = False) -> Any:
        self.used.add(key)
        if key not in self.data:
            if required or default is ...:
                self.fail("required key is missing", key)
            return default
        return self.data[key]

    def number(
        self,
        key: str,
        default: Any = ...,
        *,
        lo: float | None = None,
        hi: float | None = None,
        lo_open: bool = False,
        hi_open: bool = False,
        integer: bool = False,
    ) -> Any:
        value = self.raw(key, default)
        if value is default and default is not ...:
            return value
        return _check_number(self, key, value, lo, hi, lo_open, hi_open, integer)

    def string(self, key: str, default: Any = ...) -> Any:
        value = self.raw(key, default)
        if value is default and default is not ...:
            return value
        if not isinstance(value, str) or not value:
            self.fail(f"expected a non-empty string, got {_kind(value)}", key)
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            self.fail(f"expected true or false, got {_kind(value)}", key)
        return value

    def child(self, key: str) -> _Node:
        return _Node(self.source, self.where(key), self.raw(key, required=True))

    def items(self, key: str, default: Any = ...) -> list[tuple[str, Any]]:
        value = self.raw(key, default)
        if value is default and default is not ...:
            return []
        if not isinstance(value, list):
            self.fail(f"expected a list, got {_kind(value)}", key)
        return [(f"{self.where(key)}[{i}]", item) for i, item in enumerate(value)]

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.used, key=str)
        if unknown:
            allowed = ", ".join(sorted(self.used))
            self.fail(f"unknown key {unknown[0]!r} (allowed here: {allowed})", str(unknown[0]))


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({value})"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _check_number(
    node: _Node,
    key: str,
    value: Any,
    lo: float | None,
    hi: float | None,
    lo_open: bool,
    hi_open: bool,
    integer: bool,
) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        node.fail(f"expected a number, got {_kind(value)}", key)
    if not math.isfinite(value):
        node.fail(f"expected a finite number, got {value}", key)
    if integer:
        if isinstance(value, float) and not value.is_integer():
            node.fail(f"expected an integer, got {value}", key)
        value = int(value)
    too_low = lo is not None and (value <= lo if lo_open else value < lo)
    too_high = hi is not None and (value >= hi if hi_open else value > hi)
    if too_low or too_high:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        span = f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}"
        node.fail(f"expected a number in {span}, got {value}", key)
    return value


# --------------------------------------------------------------------------- distributions


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


def _parse_length(source: str, path: str, value: Any) -> LengthDist:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        parent, _, key = path.rpartition(".")
        v = _check_number(_Node(source, parent, {}), key, value, 1, None, False, False, True)
        return LengthDist("fixed", value=v)
    node = _Node(source, path, value)
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


def _parse_acceptance(source: str, path: str, value: Any, *,
                      nested: bool = False) -> AcceptanceDist:
    if nested and not isinstance(value, Mapping):
        raise ConfigError(
            f"{source}: {path}: expected a mapping with weight and dist, got {_kind(value)}"
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        parent, _, key = path.rpartition(".")
        v = _check_number(_Node(source, parent, {}), key, value, 0, 1, False, False, False)
        return AcceptanceDist("fixed", value=float(v))
    node = _Node(source, path, value)
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
        parsed = [_parse_acceptance(source, p, v, nested=True) for p, v in comps]
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


# --------------------------------------------------------------------------- timeline


@dataclass(frozen=True)
class RateProfile:
    """Arrival rate over one phase: constant, or a linear ramp from `start` to `end` (req/s)."""

    start: float
    end: float

    def at(self, fraction: float) -> float:
        return self.start + (self.end - self.start) * fraction

    @property
    def peak(self) -> float:
        return max(self.start, self.end)

    @property
    def mean(self) -> float:
        return (self.start + self.end) / 2.0


@dataclass(frozen=True)
class Phase:
    """A stretch of scenario time with one arrival-rate profile and one traffic mix."""

    name: str
    duration_s: float
    arrival_rate: RateProfile
    acceptance: AcceptanceDist
    prompt_tokens: LengthDist
    generation_tokens: LengthDist


@dataclass(frozen=True)
class ModelSpec:
    """One served model: its engines, SD configuration, cost system and timeline.

    `params` is the path of the parameters file holding the six coefficients (the ground truth
    of the simulated system; see `specwatch.sim.engine` for how they become step costs).
    `coefficients` is filled in by the loader (or directly by Python callers and tests).
    """

    model_name: str
    phases: tuple[Phase, ...]
    num_speculative_tokens: int = 3
    engines: int = 1
    max_num_seqs: int = 256
    kv_cache_tokens: int = 1 << 20
    block_size: int = 16
    max_model_len: int = 8192
    max_tokens: int = 4096
    prefix_cache_hit_rate: float = 0.0
    step_noise_cv: float = 0.0
    nonlinear_s: float = 0.0
    params: str | None = None
    coefficients: Any = None

    @property
    def duration_s(self) -> float:
        return float(sum(p.duration_s for p in self.phases))

    def phase_at(self, t: float, loop: bool) -> tuple[int, float]:
        """(phase index, seconds into it) at scenario time t; the last phase holds forever
        unless the scenario loops."""
        total = self.duration_s
        if loop and total > 0:
            t = math.fmod(t, total)
        for i, ph in enumerate(self.phases):
            if t < ph.duration_s:
                return i, t
            t -= ph.duration_s
        last = len(self.phases) - 1
        return last, self.phases[last].duration_s + t

    def phase_start(self, index: int) -> float:
        return float(sum(p.duration_s for p in self.phases[:index]))


@dataclass(frozen=True)
class Restart:
    """A scripted restart at scenario time `at_s`.

    Without `model_name`, the whole server restarts: it stops answering for `downtime_s`
    (connection refused), every counter starts again from 0 and in-flight requests are lost.
    With `model_name` (and optionally `engine`), only those engines restart (their series
    reset; the page keeps answering), as when one data-parallel engine core is replaced.
    With `num_speculative_tokens`, the restarted models come back with that draft length
    (0 switches SD off: the spec_decode families disappear), as after a deployer changed
    ``--speculative-config``.
    """

    at_s: float
    downtime_s: float = 0.0
    model_name: str | None = None
    engine: int | None = None
    num_speculative_tokens: int | None = None  # come back with this k (0: SD off)


@dataclass(frozen=True)
class Scenario:
    """A whole scenario: models with their timelines, scripted restarts, seed, looping."""

    models: tuple[ModelSpec, ...]
    restarts: tuple[Restart, ...] = ()
    seed: int = 0
    loop: bool = False
    description: str = ""
    source: str = "<scenario>"

    @property
    def duration_s(self) -> float:
        return max(m.duration_s for m in self.models)


# --------------------------------------------------------------------------- parsing


def _parse_rate(node: _Node, key: str) -> RateProfile:
    value = node.raw(key, required=True)
    if isinstance(value, Mapping):
        sub = _Node(node.source, node.where(key), value)
        start = float(sub.number("from", lo=0))
        end = float(sub.number("to", lo=0))
        sub.finish()
        return RateProfile(start, end)
    v = float(_check_number(node, key, value, 0, None, False, False, False))
    return RateProfile(v, v)


def _parse_model(source: str, path: str, value: Any, base_dir: Path | None) -> ModelSpec:
    node = _Node(source, path, value)
    node.allow("model_name", "params", "num_speculative_tokens", "engines", "max_num_seqs",
               "kv_cache_tokens", "block_size", "max_model_len", "max_tokens",
               "prefix_cache_hit_rate", "step_noise_cv", "nonlinear_s", "acceptance",
               "prompt_tokens", "generation_tokens", "phases")
    name = node.string("model_name")
    params = node.string("params")
    k = node.number("num_speculative_tokens", 3, lo=0, hi=32, integer=True)
    engines = node.number("engines", 1, lo=1, hi=64, integer=True)
    max_num_seqs = node.number("max_num_seqs", 256, lo=1, integer=True)
    kv_tokens = node.number("kv_cache_tokens", 1 << 20, lo=1, integer=True)
    block_size = node.number("block_size", 16, lo=1, integer=True)
    max_model_len = node.number("max_model_len", 8192, lo=2, integer=True)
    max_tokens = node.number("max_tokens", min(4096, max_model_len - 1), lo=1, integer=True)
    hit_rate = node.number("prefix_cache_hit_rate", 0.0, lo=0, hi=1, hi_open=True)
    noise = node.number("step_noise_cv", 0.0, lo=0, hi=2)
    nonlinear = node.number("nonlinear_s", 0.0, lo=0)
    default_acc = (
        _parse_acceptance(source, node.where("acceptance"), node.raw("acceptance"))
        if node.has("acceptance")
        else None
    )
    default_prompt = (
        _parse_length(source, node.where("prompt_tokens"), node.raw("prompt_tokens"))
        if node.has("prompt_tokens")
        else None
    )
    default_gen = (
        _parse_length(source, node.where("generation_tokens"), node.raw("generation_tokens"))
        if node.has("generation_tokens")
        else None
    )
    phases: list[Phase] = []
    items = node.items("phases")
    if not items:
        node.fail("at least one phase is required", "phases")
    acc, prompt, gen = default_acc, default_prompt, default_gen
    for i, (ppath, pval) in enumerate(items):
        ph = _Node(source, ppath, pval)
        ph.allow("name", "duration_s", "arrival_rate", "acceptance", "prompt_tokens",
                 "generation_tokens")
        pname = ph.string("name", f"phase-{i}")
        duration = ph.number("duration_s", lo=0, lo_open=True)
        rate = _parse_rate(ph, "arrival_rate")
        if ph.has("acceptance"):
            acc = _parse_acceptance(source, ph.where("acceptance"), ph.raw("acceptance"))
        if ph.has("prompt_tokens"):
            prompt = _parse_length(source, ph.where("prompt_tokens"), ph.raw("prompt_tokens"))
        if ph.has("generation_tokens"):
            gen = _parse_length(
                source, ph.where("generation_tokens"), ph.raw("generation_tokens")
            )
        for key, val in (("acceptance", acc), ("prompt_tokens", prompt),
                         ("generation_tokens", gen)):
            if val is None:
                ph.fail("required (set it here, in an earlier phase, or on the model)", key)
        ph.finish()
        phases.append(Phase(pname, float(duration), rate, acc, prompt, gen))  # type: ignore[arg-type]
    if max_tokens >= max_model_len:
        node.fail(f"must be below max_model_len ({max_model_len}), got {max_tokens}", "max_tokens")
    for i, ph_ in enumerate(phases):
        if ph_.prompt_tokens.upper + 1 > max_model_len:
            node.fail(
                f"prompt lengths up to {ph_.prompt_tokens.upper} do not fit max_model_len "
                f"{max_model_len}",
                f"phases[{i}].prompt_tokens",
            )
        if ph_.prompt_tokens.upper + min(max_tokens, ph_.generation_tokens.upper) > kv_tokens:
            node.fail(
                f"one request can need more KV-cache tokens than kv_cache_tokens ({kv_tokens})",
                f"phases[{i}]",
            )
    node.finish()
    if base_dir is not None and not Path(params).is_absolute():
        params = str((base_dir / params).resolve())
    return ModelSpec(
        model_name=name,
        phases=tuple(phases),
        num_speculative_tokens=k,
        engines=engines,
        max_num_seqs=max_num_seqs,
        kv_cache_tokens=kv_tokens,
        block_size=block_size,
        max_model_len=max_model_len,
        max_tokens=max_tokens,
        prefix_cache_hit_rate=float(hit_rate),
        step_noise_cv=float(noise),
        nonlinear_s=float(nonlinear),
        params=params,
    )


def parse_scenario(
    document: Any, source: str = "<scenario>", base_dir: Path | None = None
) -> Scenario:
    """Validate a parsed YAML document and build the `Scenario` (coefficients not loaded)."""
    node = _Node(source, "", document)
    node.allow("version", "description", "seed", "loop", "models", "restarts")
    version = node.number("version", 1, lo=1, hi=1, integer=True)
    del version
    description = node.raw("description", "")
    if not isinstance(description, str):
        node.fail(f"expected a string, got {_kind(description)}", "description")
    seed = node.number("seed", 0, lo=0, integer=True)
    loop = node.boolean("loop", False)
    models = [_parse_model(source, p, v, base_dir) for p, v in node.items("models")]
    if not models:
        node.fail("at least one model is required", "models")
    names = [m.model_name for m in models]
    for i, name in enumerate(names):
        if name in names[:i]:
            node.fail(f"duplicate model_name {name!r}", f"models[{i}].model_name")
    restarts: list[Restart] = []
    for rpath, rval in node.items("restarts", None):
        r = _Node(source, rpath, rval)
        at = r.number("at_s", lo=0)
        downtime = r.number("downtime_s", 0.0, lo=0)
        model = r.string("model_name", None)
        engine = r.number("engine", None, lo=0, integer=True)
        new_k = r.number("num_speculative_tokens", None, lo=0, hi=32, integer=True)
        if model is not None and model not in names:
            r.fail(f"no model named {model!r} in this scenario", "model_name")
        if engine is not None:
            if model is None:
                r.fail("engine needs model_name", "engine")
            n_eng = models[names.index(model)].engines
            if engine >= n_eng:
                r.fail(f"model {model!r} has {n_eng} engine(s); got engine {engine}", "engine")
        if model is not None and downtime:
            r.fail("a per-model restart keeps the page up; downtime_s applies to the whole "
                   "server only", "downtime_s")
        if engine is not None and new_k is not None:
            r.fail("all engines of a model share one SD configuration: restart the model, "
                   "not one engine", "num_speculative_tokens")
        r.finish()
        restarts.append(Restart(float(at), float(downtime), model, engine, new_k))
    node.finish()
    restarts.sort(key=lambda r: r.at_s)
    return Scenario(
        models=tuple(models),
        restarts=tuple(restarts),
        seed=seed,
        loop=loop,
        description=description.strip(),
        source=source,
    )


def packaged_scenario_names() -> list[str]:
    """Names of the scenarios shipped with specwatch (usable as ``--scenario NAME``)."""
    root = resources.files("specwatch.sim").joinpath(_SCENARIO_DIR)
    names = []
    for entry in root.iterdir():
        if entry.name.endswith(".yaml") and not entry.name.endswith("-params.yaml"):
            names.append(entry.name[: -len(".yaml")])
    return sorted(names)


def packaged_scenario_path(name: str) -> Path:
    return Path(str(resources.files("specwatch.sim").joinpath(_SCENARIO_DIR, f"{name}.yaml")))


def resolve_scenario_path(value: str) -> Path:
    """A file path, or the name of a packaged scenario (``demo``, ``acceptance-drop``, ...)."""
    path = Path(value)
    if path.exists():
        return path
    if "/" not in value and not value.endswith((".yaml", ".yml")):
        packaged = packaged_scenario_path(value)
        if packaged.exists():
            return packaged
        known = ", ".join(packaged_scenario_names())
        raise ConfigError(f"scenario {value!r}: no such file and no packaged scenario by that "
                          f"name (packaged: {known})")
    raise ConfigError(f"{value}: scenario file not found")


def load_scenario(value: str | Path, *, load_coefficients: bool = True) -> Scenario:
    """Read, validate and (by default) attach each model's coefficients from its params file."""
    path = resolve_scenario_path(str(value))
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read scenario: {exc.strerror}") from exc
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} not valid YAML: {exc}") from exc
    if document is None:
        raise ConfigError(f"{path}: the scenario file is empty")
    scenario = parse_scenario(document, str(path), path.parent)
    if load_coefficients:
        scenario = attach_coefficients(scenario)
    return scenario


def attach_coefficients(scenario: Scenario) -> Scenario:
    """Load every model's parameters file (`specwatch.model.params`, the model's own loader)."""
    from specwatch.model.params import load_params

    models = []
    for i, m in enumerate(scenario.models):
        if m.coefficients is not None:
            models.append(m)
            continue
        if m.params is None:
            raise ConfigError(f"{scenario.source}: models[{i}].params: required key is missing")
        models.append(replace(m, coefficients=load_params(m.params).model()))
    return replace(scenario, models=tuple(models))


def with_models(scenario: Scenario, models: Sequence[ModelSpec]) -> Scenario:
    """A copy of `scenario` with other models (tests build variants this way)."""
    return replace(scenario, models=tuple(models))

