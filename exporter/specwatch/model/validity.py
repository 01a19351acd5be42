"""Why a prediction cannot be trusted: named validity reasons (pure numpy).

The model's own `Reason` codes say what the formula cannot price (bad input, saturation, the
utilisation ceiling). A prediction can also be outside what the calibration supports: a load
above the highest measured one, or a draft length never measured. Those are not errors of
the formula but of its evidence, so they are judged here against the parameters file's
`calibrated_range` and reported with stable names, the same names the what-if `--json`
outputs (`validity_reasons`) and the exporter's `sd_model_valid{reason}` series use:

- ``saturated``: no fixed point below the throughput ceiling (or the capacity limit);
- ``above_utilization_ceiling``: below saturation but past the validity ceiling;
- ``beyond_calibrated_load``: λ, the batch in flight, or the tokens per verify step B·(k+1)
  (the knee's unit) more than the margin above the highest calibrated point (the parameters
  file records that range);
- ``extrapolated_k``: a draft length (other than 0) calibration never measured;
- ``queueing``: live only: the server queues requests (waiting requests, KV cache full,
  preemptions), so the open-loop model does not describe what is measured;
- ``capacity_mismatch``: live only: the server states another capacity (KV cache,
  max_num_seqs) than the one the parameters file was calibrated with (`server_capacity`),
  so it is another configuration than the one the coefficients describe;
- ``invalid_input`` and ``not_converged`` for the rest of the model's codes.
"""

from __future__ import annotations

import numpy as np

from specwatch.model.closed_form import Reason
from specwatch.model.params import CalibratedRange

__all__ = [
    "ABOVE_CEILING",
    "BEYOND_CALIBRATED_LOAD",
    "CAPACITY_MISMATCH",
    "EXTRAPOLATED_K",
    "QUEUEING",
    "SATURATED",
    "model_reason_name",
    "range_reasons",
]

SATURATED = "saturated"
ABOVE_CEILING = "above_utilization_ceiling"
BEYOND_CALIBRATED_LOAD = "beyond_calibrated_load"
EXTRAPOLATED_K = "extrapolated_k"
QUEUEING = "queueing"
CAPACITY_MISMATCH = "capacity_mismatch"

_MODEL_NAMES = {
    Reason.OK: "",
    Reason.BAD_INPUT: "invalid_input",
    Reason.BAD_DRAFT_LENGTH: "invalid_input",
    Reason.ALPHA_OUT_OF_RANGE: "invalid_input",
    Reason.ACCEPTANCE_LENGTH_OUT_OF_RANGE: "invalid_input",
    Reason.DEGENERATE: "invalid_input",
    Reason.SATURATED: SATURATED,
    Reason.NOT_CONVERGED: "not_converged",
    Reason.ABOVE_CEILING: ABOVE_CEILING,
}


def model_reason_name(code: int) -> str:
    """The stable name of a model `Reason` code ('' for OK)."""
    return _MODEL_NAMES[Reason(int(code))]


def range_reasons(
    calibrated: CalibratedRange | None,
    arrival_rate: float,
    in_flight: float | None,
    draft_length: float,
) -> list[str]:
    """Reasons a point lies outside the calibrated range (empty when inside or unknown).

    `in_flight` is the batch B = λ·L the model predicts (None when it has no fixed point: the
    saturation reason covers that). A file without `calibrated_range` (written before it
    existed, or by hand) cannot be judged: no reason, and `--json` says `calibrated_range:
    null` so the caller sees that nothing was checked.
    """
    if calibrated is None:
        return []
    out: list[str] = []
    factor = 1.0 + calibrated.margin
    over_rate = arrival_rate > calibrated.max_arrival_rate * factor
    over_batch = (
        in_flight is not None
        and np.isfinite(in_flight)
        and in_flight > calibrated.max_in_flight * factor
    )
    over_tokens = (
        in_flight is not None
        and calibrated.max_tokens_per_step is not None
        and np.isfinite(in_flight)
        and in_flight * (float(draft_length) + 1.0) > calibrated.max_tokens_per_step * factor
    )
    if over_rate or over_batch or over_tokens:
        out.append(BEYOND_CALIBRATED_LOAD)
    k = float(draft_length)
    if k != 0 and not any(abs(k - m) < 1e-9 for m in calibrated.draft_lengths):
        out.append(EXTRAPOLATED_K)
    return out
