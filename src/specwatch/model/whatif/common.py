"""Shared plumbing of the what-if computations (predict, sweep, advise).

The three take the same parameters file, acceptance and length inputs (typed here as
:class:`ModelOptions` and :class:`AcceptanceOptions`), validate them the same way (an error
names the option, exit 2, and `--json` still prints a machine-readable `valid: false` object),
and print tables the same way (rich when installed, plain aligned text otherwise). Their
options are declared in :mod:`specwatch.cli.whatif_options`.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specwatch.common.bundle import missing_params_hint, resolve_params
from specwatch.common.errors import ConfigError
from specwatch.model.closed_form import (
    Reason,
    acceptance_length_from_alpha,
    acceptance_length_from_profile,
    alpha_from_acceptance_length,
    reason_text,
)
from specwatch.model.params import Params, load_params
from specwatch.model.uncertainty import DEFAULT_MAX_HALFWIDTH


class InputError(ConfigError):
    """A bad command-line value; the message starts with the option name."""


@dataclass(frozen=True)
class ModelOptions:
    """The parameters file and the overrides of its defaults (None: the file's)."""

    params: str
    max_utilization: float | None = None
    k_max: int | None = None
    max_interval: float | None = None


@dataclass(frozen=True)
class AcceptanceOptions:
    """Acceptance as given on the command line (None: not given)."""

    alpha: float | None = None
    acceptance_length: float | None = None


# --------------------------------------------------------------------------- validation


def finite_nonnegative(option: str, value: float) -> float:
    if value is None or not math.isfinite(value) or value < 0:
        raise InputError(f"{option}: expected a finite number >= 0, got {value}")
    return float(value)


def check_alpha(option: str, value: float) -> float:
    if not math.isfinite(value) or not 0.0 <= value < 1.0:
        raise InputError(
            f"{option}: expected a per-token acceptance probability in [0, 1), got {value} "
            "(this is the i.i.d. α, not vLLM's acceptance rate; use --acceptance-length "
            "for the measured tokens per verify cycle)"
        )
    return float(value)


def check_acceptance_length(option: str, value: float, k: float) -> float:
    if not math.isfinite(value) or not 1.0 <= value <= k + 1.0:
        raise InputError(
            f"{option}: expected tokens per verify cycle in [1, k + 1] = [1, {k + 1:g}] "
            f"for draft length {k:g}, got {value}"
        )
    return float(value)


def load(opts: ModelOptions) -> Params:
    """Load the parameters file and check the overrides."""
    path = resolve_params(opts.params)
    try:
        params = load_params(path)
    except ConfigError as exc:
        if path.exists():
            raise
        raise ConfigError(f"{exc}{missing_params_hint(opts.params, '--params ')}") from None
    ceiling = opts.max_utilization
    if ceiling is not None and not (math.isfinite(ceiling) and 0.0 < ceiling <= 1.0):
        raise InputError(f"--max-utilization: expected a number in (0, 1], got {ceiling}")
    k_max = opts.k_max
    if k_max is not None and not 1 <= k_max <= 64:
        raise InputError(f"--k-max: expected an integer in [1, 64], got {k_max}")
    return params


def ceiling_of(opts: ModelOptions, params: Params) -> float:
    value = opts.max_utilization
    return params.max_utilization if value is None else float(value)


def halfwidth_of(opts: ModelOptions, params: Params) -> float:
    """The `sensitive` limit: --max-interval, else the file's, else ±15%."""
    value = opts.max_interval
    if value is not None:
        if not (math.isfinite(value) and value > 0):
            raise InputError(f"--max-interval: expected a fraction > 0 (0.15 = ±15%), got "
                             f"{value}")
        return float(value)
    if params.uncertainty is not None:
        return params.uncertainty.max_relative_halfwidth
    return DEFAULT_MAX_HALFWIDTH


def k_max_of(opts: ModelOptions, params: Params) -> int:
    value = opts.k_max
    return params.k_max if value is None else int(value)


@dataclass(frozen=True)
class Acceptance:
    """How acceptance is known: an i.i.d. α, or the parameters file's per-position profile."""

    source: str  # "alpha", "acceptance_length" or "profile"
    alpha: float | None
    profile: tuple[float, ...] | None

    def length(self, k: Any) -> np.ndarray:
        """E(k) under this acceptance model."""
        if self.profile is not None:
            return acceptance_length_from_profile(self.profile, k)
        return acceptance_length_from_alpha(self.alpha, k)

    def optimal_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for model.optimal_draft_length."""
        if self.profile is not None:
            return {"profile": self.profile}
        return {"alpha": self.alpha}

    def describe(self) -> str:
        if self.profile is not None:
            return "per-position profile " + ", ".join(f"{p:g}" for p in self.profile)
        return f"i.i.d. α = {self.alpha:.4g}"


def acceptance_from(opts: AcceptanceOptions, params: Params, k: float | None) -> Acceptance:
    """α from --alpha, or from --acceptance-length at draft length k, or the file's profile."""
    alpha = opts.alpha
    e = opts.acceptance_length
    if alpha is not None:
        return Acceptance("alpha", check_alpha("--alpha", alpha), None)
    if e is not None:
        if k is None:
            raise InputError("--acceptance-length: needs --draft-length (the k it was measured at)")
        check_acceptance_length("--acceptance-length", e, k)
        if k == 0:
            raise InputError("--draft-length: 0 means SD off; α cannot be derived from it")
        return Acceptance("acceptance_length",
                          float(alpha_from_acceptance_length(e, k)), None)
    if params.acceptance_profile is not None:
        return Acceptance("profile", None, params.acceptance_profile)
    raise InputError(
        "--alpha: give --alpha or --acceptance-length (the parameters file has no "
        "acceptance_profile to fall back on)"
    )


# --------------------------------------------------------------------------- output


def clean(value: Any) -> Any:
    """JSON-safe: numpy scalars to Python, NaN and ±inf to null (JSON has neither)."""
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, np.ndarray):
        return clean(value.tolist())
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return v if math.isfinite(v) else None
    return value


def print_json(obj: dict[str, Any]) -> None:
    print(json.dumps(clean(obj), indent=2, allow_nan=False, ensure_ascii=False))


def print_result(out: dict[str, Any], as_json: bool,
                 render: Callable[[dict[str, Any]], None]) -> None:
    """The result as one JSON object (``--json``), else as the command's table."""
    if as_json:
        print_json(out)
    else:
        render(out)


def invalid_reason(code: int, utilization: float | None = None, ceiling: float | None = None,
                   arrival_option: str = "--arrival-rate") -> str:
    """A reason string with the numbers that make it actionable."""
    code = Reason(int(code))
    if code == Reason.SATURATED and utilization is not None and math.isfinite(utilization):
        return (f"{arrival_option}: at or past saturation (utilisation λ/λ_max = "
                f"{utilization:.3g} >= 1): the queue grows without bound")
    if code == Reason.ABOVE_CEILING and utilization is not None and ceiling is not None:
        return (f"{arrival_option}: utilisation λ/λ_max = {utilization:.3g} is above the validity "
                f"ceiling {ceiling:g}; the model is not trusted this close to saturation")
    return reason_text(code)


def run_guarded(as_json: bool, body: Callable[[], int], empty: dict[str, Any]) -> int:
    """Run a command body; with --json a bad input still prints `valid: false` + reason.

    Without --json the error propagates to :func:`specwatch.cli.main`, which prints it and
    exits 2.
    """
    try:
        return body()
    except ConfigError as exc:
        if not as_json:
            raise
        print_json({**empty, "valid": False, "reason": str(exc)})
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


def sd_off_above(lams: np.ndarray, best: np.ndarray, valid: np.ndarray) -> float | None:
    """The smallest rate of an ascending grid from which on the best choice is SD off: the
    first valid k = 0 past the last valid SD k (the first rate when SD is never the best
    choice; None when no such rate is on the grid). A rate without a valid best k is
    neither SD on nor off. Shared by `sweep` and `advise`."""
    on = valid & (best > 0)
    if not on.any():
        return float(lams[0]) if (valid & (best == 0)).any() else None
    last_on = int(np.flatnonzero(on)[-1])
    after = np.flatnonzero(valid & (best == 0) & (np.arange(lams.size) > last_on))
    return float(lams[after[0]]) if after.size else None


def fmt(value: Any, spec: str = ".3g", none: str = "—") -> str:
    if value is None:
        return none
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(v):
        return none
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    return format(v, spec)


def render_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]],
                 notes: Sequence[str] = ()) -> None:
    """Print a table: rich when installed (the `analysis` extra), aligned text otherwise."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - exercised by test with rich hidden
        Console = None  # noqa: N806
    if Console is not None:
        table = Table()
        for i, h in enumerate(headers):
            table.add_column(h, justify="left" if i == 0 else "right")
        for row in rows:
            table.add_row(*row)
        console = Console(file=sys.stdout, width=120)
        console.print(title, highlight=False, markup=False)
        console.print(table)
        for note in notes:
            console.print(note, highlight=False, markup=False)
        return
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    print(title)
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w)
                    for i, (h, w) in enumerate(zip(headers, widths, strict=True))))
    for row in rows:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    for note in notes:
        print(note)
