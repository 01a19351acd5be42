"""Engine costs of the simulated system: the latency model's coefficients as step, prefill
and prefill-stall durations.

`StepCosts` owns the coefficient → engine-cost mapping (docs/simulator.md, "The simulated
system"): a step with n requests in the batch costs the batch-of-one cost plus the marginal
cost of each of the n − 1 *other* requests, a new prefill stalls every request already
admitted by b_p, and MoE, saturation (roofline knee) and non-linear terms add to it. With no
noise and no non-linear term, the simulation's long-run mean latency is the model's
L = C1 / (1 − λ·C2). Pure arithmetic; imports nothing from specwatch.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["StepCosts"]

_INF = float("inf")


class StepCosts:
    """The coefficient → engine-cost mapping (docs/simulator.md, "The simulated system").

    `coef` is a `specwatch.model.Coefficients` or `MoECoefficients` (duck-typed: dense
    coefficients a_p, b_p, a_v, b_v, a_d, b_d, b_v_context; MoE adds dense, expert,
    experts, active_experts).
    """

    def __init__(self, coef: Any, k: int, nonlinear_s: float = 0.0) -> None:
        moe = hasattr(coef, "expert")
        dense = coef.dense if moe else coef
        self.k = k
        self.c0 = dense.a_v + k * dense.a_d
        self.c1 = dense.b_v + k * dense.b_d
        self.ctx = float(getattr(dense, "b_v_context", 0.0))
        self.a_p = dense.a_p
        self.b_p = dense.b_p
        self.nonlinear = nonlinear_s
        # Saturation regime (model.md): compute-bound cost past the verifier's and the
        # drafter's knee, in tokens per step; zero for the linear model and MoE.
        self.c_v = float(getattr(dense, "c_v", 0.0))
        self.knee_v = float(getattr(dense, "knee_v", 0.0))
        self.c_d = float(getattr(dense, "c_d", 0.0))
        self.knee_d = float(getattr(dense, "knee_d", 0.0))
        self.moe = moe
        if moe:
            self.s_c0 = coef.expert.a_v
            self.s_c1 = coef.expert.b_v
            self.s_a_p = coef.expert.a_p
            self.s_b_p = coef.expert.b_p
            self._log_keep = (
                math.log(1.0 - coef.active_experts / coef.experts)
                if coef.active_experts < coef.experts
                else -_INF
            )

    def phi(self, n: int) -> float:
        """Share of experts the step's n·(k+1) routed tokens touch (0 for dense models)."""
        if not self.moe or n <= 0:
            return 0.0
        if self._log_keep == -_INF:
            return 1.0
        return -math.expm1(n * (self.k + 1) * self._log_keep)

    def step(self, n: int, total_context: float) -> float:
        """Duration of one verify step with n requests in the batch (n >= 1)."""
        others = n - 1
        cost = self.c0 + others * self.c1
        if self.ctx:
            cost += self.ctx * total_context * others / n
        if self.moe:
            cost += self.phi(n) * (self.s_c0 + others * self.s_c1)
        if self.nonlinear:
            cost += self.nonlinear * others * others
        if self.c_v:
            cost += self.c_v * max(0.0, others * (self.k + 1) - self.knee_v)
        if self.c_d:
            cost += self.k * self.c_d * max(0.0, others - self.knee_d)
        return cost

    def prefill(self, n: int) -> float:
        """The admitted request's own prefill time (to its first token); n includes it."""
        return self.a_p + (self.phi(n) * self.s_a_p if self.moe else 0.0)

    def stall(self, n: int) -> float:
        """How long admitting one prefill delays every request already in the batch."""
        return self.b_p + (self.phi(n) * self.s_b_p if self.moe else 0.0)
