"""The latency model's per-deployment coefficients (what calibration fits; pure dataclasses).

Only the validated numbers, in seconds (knees in tokens per step, capacities in requests and
tokens), with the one-line meaning of each; the formulas that use them are in `costs` and
`closed_form`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Union

import numpy as np

__all__ = ["ArrayLike", "Coefficients", "ExpertCoefficients", "MoECoefficients", "Model"]

ArrayLike = Union[float, int, np.ndarray, "list[float]"]


def _check_seconds(owner: object) -> None:
    """Every field is a finite number >= 0 (seconds; knees and capacities in tokens/requests)."""
    for f in fields(owner):  # type: ignore[arg-type]
        value = getattr(owner, f.name)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeError(f"{f.name}: expected a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{f.name}: expected a finite number >= 0, got {value}")


@dataclass(frozen=True)
class Coefficients:
    """Per-deployment costs in seconds, all >= 0 (what calibration fits).

    a_* are load-independent, b_* are per request in flight. Prefill (p) is paid once per
    request, verify (v) once per verify cycle, draft (d) once per draft token. Effective
    b_v = b_v + b_v_context·(p + g/2): the KV-cache traffic of a verify pass grows with the
    mean context length over a request's life.
    """

    a_p: float
    b_p: float
    a_v: float
    b_v: float
    a_d: float
    b_d: float
    b_v_context: float = 0.0
    # Saturation regime (model.md, "Saturation regime"); all zero = the linear model exactly.
    c_v: float = 0.0  # s per verified token past the verifier's knee (compute-bound slope)
    knee_v: float = 0.0  # tokens per verify step where verification turns compute-bound
    c_d: float = 0.0  # s per draft token past the drafter's knee
    knee_d: float = 0.0  # tokens per draft step (= requests in flight) of the drafter's knee
    max_num_seqs: float = 0.0  # most requests running at once (0: no limit)
    kv_cache_tokens: float = 0.0  # KV-cache capacity in tokens (0: no limit)
    # KV-cache capacity in tokens while a drafter runs beside the verifier (its weights and
    # KV cache take GPU memory, so fewer requests fit); 0: kv_cache_tokens applies to SD too.
    kv_cache_tokens_sd: float = 0.0

    def __post_init__(self) -> None:
        _check_seconds(self)

    @property
    def saturates(self) -> bool:
        """True when a saturation term is set: the fixed point is then found by bisection."""
        return bool(self.c_v or self.c_d or self.max_num_seqs or self.kv_cache_tokens
                    or self.kv_cache_tokens_sd)

    def capacity(self, p: ArrayLike, g: ArrayLike, k: ArrayLike = 0.0) -> np.ndarray:
        """Most requests running at once: max_num_seqs, and the KV-cache tokens over the
        p + g tokens one request holds at its end (inf where no limit is set). With SD
        (k > 0) the cache is kv_cache_tokens_sd when set: the drafter's memory shrinks it."""
        pp, gg, kk = (np.asarray(x, dtype=float) for x in (p, g, k))
        cap = np.full(np.broadcast_shapes(pp.shape, gg.shape, kk.shape), np.inf)
        if self.max_num_seqs:
            cap = np.minimum(cap, self.max_num_seqs)
        tokens: float | np.ndarray = self.kv_cache_tokens
        if self.kv_cache_tokens_sd:
            tokens = np.where(kk > 0, self.kv_cache_tokens_sd,
                              self.kv_cache_tokens if self.kv_cache_tokens else np.inf)
        if self.kv_cache_tokens or self.kv_cache_tokens_sd:
            with np.errstate(divide="ignore"):
                cap = np.minimum(cap, tokens / np.maximum(pp + gg, 1.0))
        return cap


@dataclass(frozen=True)
class ExpertCoefficients:
    """The expert part s of an MoE verifier's prefill and verify costs, in seconds, >= 0.

    Only a fraction φ of it is paid: the share of experts the routed tokens touch.
    """

    a_p: float
    b_p: float
    a_v: float
    b_v: float

    def __post_init__(self) -> None:
        _check_seconds(self)


@dataclass(frozen=True)
class MoECoefficients:
    """An MoE verifier: `dense` is the dense part u (drafter included), `expert` the part s."""

    dense: Coefficients
    expert: ExpertCoefficients
    experts: int
    active_experts: int

    def __post_init__(self) -> None:
        if not (isinstance(self.experts, int) and self.experts >= 1):
            raise ValueError(f"experts: expected an integer >= 1, got {self.experts!r}")
        if not (
            isinstance(self.active_experts, int) and 1 <= self.active_experts <= self.experts
        ):
            raise ValueError(
                f"active_experts: expected an integer in [1, experts={self.experts}], "
                f"got {self.active_experts!r}"
            )

    @property
    def untouched_share(self) -> float:
        """1 − m/M: the probability one routed token misses a given expert."""
        return 1.0 - self.active_experts / self.experts

    def expert_share(self, tokens: ArrayLike) -> np.ndarray:
        """φ(T) = 1 − (1 − m/M)^T: expected share of experts T routed tokens touch."""
        t = np.asarray(tokens, dtype=float)
        keep = self.untouched_share
        if keep == 0.0:
            return np.where(t > 0, 1.0, 0.0)
        with np.errstate(invalid="ignore"):
            return -np.expm1(t * math.log(keep))


Model = Coefficients | MoECoefficients


def _dense(coef: Model) -> Coefficients:
    return coef.dense if isinstance(coef, MoECoefficients) else coef
