"""What calibrating one system produces: `SystemFit` and the records it holds.

A `SystemFit` is filled by one of the fitting paths (`calibrate.fit` for the linear
six-coefficient form and its per-configuration fallback, `calibrate.load_range` for the
saturation form) and read by `calibrate.report` and `calibrate.evidence`. Plain data; may
import `specwatch.model` types and `calibrate.inputs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specwatch import model
from specwatch.calibrate.inputs import Point
from specwatch.model.observed import CalibratedRange
from specwatch.model.uncertainty import Uncertainty

__all__ = ["ConfigurationFit", "DraftLengthSummary", "Excluded", "MeasuredSpeedup", "SystemFit"]


@dataclass(frozen=True)
class Excluded:
    """A point left out of the fit, and why (shown in every report)."""

    point: Point
    reason: str


@dataclass(frozen=True)
class ConfigurationFit:
    """(C1, C2) of one configuration (one draft length on one workload), fitted on its own."""

    k: float
    workload: str
    c1: float
    c2: float
    n_points: int
    acceptance_length: float
    prompt_tokens: float | None
    generation_tokens: float | None


@dataclass(frozen=True)
class DraftLengthSummary:
    """What the fit says about one draft length: zero-load speedup, break-even (speedup = 1)
    and SD's throughput ceiling."""

    k: float
    acceptance_length: float
    prompt_tokens: float | None
    generation_tokens: float | None
    zero_load_speedup: float
    breakeven_arrival_rate: float
    breakeven_kind: str
    #: SD's throughput ceiling (req/s; NaN unknown), a separate figure from the break-even:
    #: the rate past which SD no longer keeps up, "measured" or from the "model".
    sd_ceiling_arrival_rate: float = float("nan")
    sd_ceiling_source: str | None = None
    #: The range reasons predict gives at each figure's rate (beyond_calibrated_load, ...).
    breakeven_reasons: tuple[str, ...] = ()
    sd_ceiling_reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class MeasuredSpeedup:
    """L_D / L_SD measured at the lowest concurrency both systems ran on one workload."""

    k: float
    workload: str
    concurrency: float
    measured: float
    predicted: float


@dataclass
class SystemFit:
    """The result of calibrating one system (see `fit_system`)."""

    system: str
    mode: str  # "saturation", "six-coefficient" or "per-configuration"
    points: list[Point]
    excluded: list[Excluded]
    predicted: np.ndarray
    utilization: np.ndarray
    r2: float
    mape: float
    coefficients: model.Coefficients | None = None
    vif: dict[str, float] = field(default_factory=dict)
    not_identifiable: list[str] = field(default_factory=list)
    fallback_reason: str | None = None
    leave_one_k_out_mape: float | None = None
    leave_one_k_out_by_k: dict[float, float] = field(default_factory=dict)
    leave_one_k_out_note: str | None = None
    configurations: list[ConfigurationFit] = field(default_factory=list)
    draft_lengths: list[DraftLengthSummary] = field(default_factory=list)
    measured_speedups: list[MeasuredSpeedup] = field(default_factory=list)
    acceptance_profile: tuple[float, ...] | None = None
    notes: list[str] = field(default_factory=list)
    # Saturation mode only (calibrate.load_range): what the parameters file records for
    # validity, and the whole-range report (knees, per-concurrency errors, break-even).
    calibrated_range: CalibratedRange | None = None
    saturation: dict[str, Any] | None = None
    #: The residual spread of L(B) per utilisation band (intervals; every coefficient mode).
    uncertainty: Uncertainty | None = None
    #: Every run predicted through `specwatch predict`'s path (`evidence.user_path`).
    user_path: dict[str, Any] | None = None

    @property
    def n_points(self) -> int:
        return len(self.points)

    @property
    def n_excluded(self) -> int:
        return len(self.excluded)

    def residuals(self) -> np.ndarray:
        """Relative residuals (predicted − measured) / measured of the points used."""
        measured = np.array([p.latency_s for p in self.points])
        return (self.predicted - measured) / measured
