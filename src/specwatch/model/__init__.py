"""The latency model: interpretable closed forms for speculative decoding under load, the
parameter files that carry fitted coefficients, and the what-if computations built on them.

Owns: ``closed_form`` (per-system fixed points, speedup, break-even entry point, best draft
length; pure, vectorised numpy) with the modules it is built from (``coefficients``,
``acceptance``, ``costs``, ``breakeven``, ``moe``, ``saturation``), ``params`` (parameters
files: load, validate, dump; with ``observed`` and ``paramcheck``), ``uncertainty`` and
``validity`` (intervals and the reasons a prediction is not vouched for), ``bestk`` (the
best k a command shows), ``naive`` (the scalar reference the tests and benchmarks compare
against), ``schedule`` (the batch-size → k schedule), ``whatif`` (what ``specwatch predict |
sweep | advise`` compute and print; their options are in ``specwatch.cli``).

The model's public names are re-exported here from their modules, so ``from specwatch.model
import predict`` is the way other subpackages call the model.
"""

from specwatch.model.acceptance import (
    acceptance_length_from_alpha,
    acceptance_length_from_profile,
    alpha_from_acceptance_length,
    extend_profile,
)
from specwatch.model.breakeven import BreakEven, BreakEvenKind, breakeven_from_costs
from specwatch.model.closed_form import (
    DEFAULT_K_MAX,
    DEFAULT_MAX_UTILIZATION,
    OptimalDraft,
    Prediction,
    Reason,
    SystemLatency,
    breakeven,
    breakeven_arrival_rate,
    latency,
    optimal_draft_length,
    predict,
    reason_text,
    speedup,
)
from specwatch.model.coefficients import Coefficients, ExpertCoefficients, MoECoefficients
from specwatch.model.costs import (
    batch_latency,
    cost_terms,
    latency_from_costs,
    moe_cost_terms,
    throughput_ceiling,
)
from specwatch.model.moe import MoESolution, solve_moe_latency

__all__ = [
    "DEFAULT_K_MAX",
    "DEFAULT_MAX_UTILIZATION",
    "BreakEven",
    "BreakEvenKind",
    "Coefficients",
    "ExpertCoefficients",
    "MoECoefficients",
    "MoESolution",
    "OptimalDraft",
    "Prediction",
    "Reason",
    "SystemLatency",
    "acceptance_length_from_alpha",
    "acceptance_length_from_profile",
    "alpha_from_acceptance_length",
    "batch_latency",
    "breakeven",
    "breakeven_arrival_rate",
    "breakeven_from_costs",
    "cost_terms",
    "extend_profile",
    "latency",
    "latency_from_costs",
    "moe_cost_terms",
    "optimal_draft_length",
    "predict",
    "reason_text",
    "solve_moe_latency",
    "speedup",
    "throughput_ceiling",
]
