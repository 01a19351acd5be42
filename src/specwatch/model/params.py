"""The parameters file: one system's fitted latency-model coefficients (YAML).

Calibration writes it; the what-if commands, the live model and the simulator read it. It is
strict on purpose: a coefficient typed in milliseconds where seconds are expected, a negative
cost or a misspelt key would silently turn every prediction into nonsense, so loading names
the file, line and field and says what was expected (`ConfigError`, exit 2). The schema, block
by block, is in docs/whatif.md ("Parameters file").

Owns `Params` (and its `moe` block), the document's top level and its readers, loading,
`to_mapping` and the atomic dump; the inverse of loading is exact (`load(dump(p)) == p`). The
`calibrated_range` and `server_capacity` blocks live in `specwatch.model.observed`, the field
checks in `specwatch.model.paramcheck`. Numbers are seconds; a string with a unit ("25ms",
"40us") is accepted and converted, because humans copy step times from profilers in
milliseconds.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specwatch.common.boundedfile import PARAMETERS, compose_yaml, read_text
from specwatch.common.errors import ConfigError
from specwatch.model.closed_form import DEFAULT_K_MAX, DEFAULT_MAX_UTILIZATION
from specwatch.model.coefficients import Coefficients, ExpertCoefficients, MoECoefficients
from specwatch.model.observed import (
    CalibratedRange,
    ServerCapacity,
    read_calibrated_range,
    read_server_capacity,
)
from specwatch.model.paramcheck import (
    Ctx,
    count,
    integer,
    mapping,
    number,
    seconds,
)
from specwatch.model.uncertainty import (
    DEFAULT_LEVEL,
    DEFAULT_MAX_HALFWIDTH,
    Band,
    Uncertainty,
)

__all__ = [
    "MoEParams",
    "Params",
    "Uncertainty",
    "dump_params",
    "load_params",
    "params_from_mapping",
]

_COEFFICIENT_NAMES = ("a_p", "b_p", "a_v", "b_v", "a_d", "b_d")
_EXPERT_NAMES = ("a_p", "b_p", "a_v", "b_v")
# Upper bounds that catch unit mistakes (milliseconds written as seconds): a prefill may
# take minutes for huge prompts, one decode or draft step never takes a minute.
_UPPER = {"a_p": 3600.0, "b_p": 3600.0, "a_v": 60.0, "b_v": 60.0, "a_d": 60.0, "b_d": 60.0}
_TOP_KEYS = (
    "system",
    "coefficients",
    "b_v_context",
    "moe",
    "acceptance_profile",
    "max_utilization",
    "k_max",
    "provenance",
    "saturation",
    "capacity",
    "calibrated_range",
    "uncertainty",
    "server_capacity",
)
_SATURATION_NAMES = ("c_v", "knee_v", "c_d", "knee_d")
_CAPACITY_NAMES = ("max_num_seqs", "kv_cache_tokens", "kv_cache_tokens_sd")


@dataclass(frozen=True)
class MoEParams:
    """Mixture-of-experts block: M experts, m active per token, the expert cost part s."""

    experts: int
    active_experts: int
    expert_coefficients: ExpertCoefficients


@dataclass(frozen=True)
class Params:
    """A validated parameters file. `model()` gives what the model functions take."""

    system: str
    coefficients: Coefficients
    moe: MoEParams | None = None
    acceptance_profile: tuple[float, ...] | None = None
    max_utilization: float = DEFAULT_MAX_UTILIZATION
    k_max: int = DEFAULT_K_MAX
    provenance: Mapping[str, Any] = field(default_factory=dict)
    source: str = field(default="<params>", compare=False)
    calibrated_range: CalibratedRange | None = None
    uncertainty: Uncertainty | None = None
    server_capacity: ServerCapacity | None = None

    def model(self) -> Coefficients | MoECoefficients:
        """Dense coefficients, or the MoE split when the file has a `moe` block."""
        if self.moe is None:
            return self.coefficients
        return MoECoefficients(
            dense=self.coefficients,
            expert=self.moe.expert_coefficients,
            experts=self.moe.experts,
            active_experts=self.moe.active_experts,
        )

    def to_mapping(self) -> dict[str, Any]:
        """The YAML document for this object (the inverse of `params_from_mapping`)."""
        c = self.coefficients
        out: dict[str, Any] = {
            "system": self.system,
            "coefficients": {n: float(getattr(c, n)) for n in _COEFFICIENT_NAMES},
        }
        if c.b_v_context:
            out["b_v_context"] = float(c.b_v_context)
        if any(getattr(c, n) for n in _SATURATION_NAMES):
            out["saturation"] = {n: float(getattr(c, n)) for n in _SATURATION_NAMES}
        if any(getattr(c, n) for n in _CAPACITY_NAMES):  # 0 = no limit: only the set ones
            out["capacity"] = {n: float(getattr(c, n)) for n in _CAPACITY_NAMES if getattr(c, n)}
        if self.moe is not None:
            e = self.moe.expert_coefficients
            out["moe"] = {
                "experts": self.moe.experts,
                "active_experts": self.moe.active_experts,
                "expert_coefficients": {n: float(getattr(e, n)) for n in _EXPERT_NAMES},
            }
        if self.acceptance_profile is not None:
            out["acceptance_profile"] = [float(x) for x in self.acceptance_profile]
        out["max_utilization"] = float(self.max_utilization)
        out["k_max"] = int(self.k_max)
        if self.calibrated_range is not None:
            out["calibrated_range"] = self.calibrated_range.to_mapping()
        if self.uncertainty is not None:
            out["uncertainty"] = self.uncertainty.to_mapping()
        if self.server_capacity:
            out["server_capacity"] = self.server_capacity.to_mapping()
        if self.provenance:
            out["provenance"] = _plain(dict(self.provenance))
        return out


def _plain(value: Any) -> Any:
    """Convert to types yaml.safe_dump writes (tuples to lists, dates to ISO strings)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (_dt.date, _dt.datetime)):
        return value.isoformat()
    return value



def _coefficients(ctx: Ctx, path: tuple[str, ...], value: Any,
                  names: tuple[str, ...]) -> dict[str, float]:
    m = mapping(ctx, path, value, names, names)
    return {n: seconds(ctx, (*path, n), m[n], _UPPER[n]) for n in names}


def _uncertainty(ctx: Ctx, value: Any) -> Uncertainty:
    path: tuple[str | int, ...] = ("uncertainty",)
    m = mapping(ctx, path, value, ("method", "level", "max_relative_halfwidth", "bands"),
                 ("bands",))
    method = m.get("method", "residual_spread")
    if method != "residual_spread":
        raise ctx.fail((*path, "method"), f"expected residual_spread, got {method!r}")
    level = DEFAULT_LEVEL
    if m.get("level") is not None:
        level = number(ctx, (*path, "level"), m["level"], "a coverage in (0, 1)")
        if not 0.0 < level < 1.0:
            raise ctx.fail((*path, "level"), f"expected a coverage in (0, 1), got {level:g}")
    limit = DEFAULT_MAX_HALFWIDTH
    if m.get("max_relative_halfwidth") is not None:
        limit = number(ctx, (*path, "max_relative_halfwidth"), m["max_relative_halfwidth"],
                        "a fraction > 0 (0.15 = ±15%)")
        if not limit > 0:
            raise ctx.fail((*path, "max_relative_halfwidth"),
                           f"expected a fraction > 0 (0.15 = ±15%), got {limit:g}")
    raw = m["bands"]
    if not isinstance(raw, list) or not raw:
        raise ctx.fail((*path, "bands"), f"expected a non-empty list of bands, got {raw!r}")
    bands: list[Band] = []
    for i, item in enumerate(raw):
        bp = (*path, "bands", i)
        bm = mapping(ctx, bp, item, ("utilization_below", "sigma", "runs"),
                      ("utilization_below", "sigma"))
        top = bm["utilization_below"]
        if isinstance(top, bool) or not isinstance(top, (int, float)) or math.isnan(top) \
                or top <= 0:
            raise ctx.fail((*bp, "utilization_below"),
                           f"expected a utilisation > 0 (.inf for the last band), got {top!r}")
        if bands and float(top) <= bands[-1].utilization_below:
            raise ctx.fail((*bp, "utilization_below"),
                           "bands must be in increasing utilisation")
        sigma = count(ctx, (*bp, "sigma"), bm["sigma"], "a relative spread (0.02 = 2%)")
        runs = integer(ctx, (*bp, "runs"), bm.get("runs", 0), 0, 10**9)
        bands.append(Band(float(top), sigma, runs))
    return Uncertainty(bands=tuple(bands), level=level, max_relative_halfwidth=limit)


def _profile(ctx: Ctx, value: Any) -> tuple[float, ...]:
    path: tuple[str | int, ...] = ("acceptance_profile",)
    if not isinstance(value, list) or not value:
        raise ctx.fail(path, f"expected a non-empty list of probabilities, got {value!r}")
    out: list[float] = []
    for i, item in enumerate(value):
        v = number(ctx, (*path, i), item, "a probability in [0, 1]")
        if not 0.0 <= v <= 1.0:
            raise ctx.fail((*path, i), f"expected a probability in [0, 1], got {item!r}")
        if out and v > out[-1] + 1e-9:
            raise ctx.fail(
                (*path, i),
                f"{v:g} is above position {i - 1}'s {out[-1]:g}: entries are "
                "P(first i+1 drafts accepted), which cannot grow with i",
            )
        out.append(v)
    if len(out) > 64:
        raise ctx.fail(path, f"expected at most 64 positions, got {len(out)}")
    return tuple(out)


def _provenance(ctx: Ctx, value: Any) -> dict[str, Any]:
    path: tuple[str | int, ...] = ("provenance",)
    m = dict(mapping(ctx, path, value, None))
    if "method" in m and not isinstance(m["method"], str):
        raise ctx.fail((*path, "method"), f"expected a string, got {m['method']!r}")
    if "fitted_at" in m:
        at = m["fitted_at"]
        if isinstance(at, (_dt.date, _dt.datetime)):
            m["fitted_at"] = at.isoformat()
        elif not isinstance(at, str):
            raise ctx.fail((*path, "fitted_at"), f"expected an ISO 8601 timestamp, got {at!r}")
    if "r2" in m:
        r2 = number(ctx, (*path, "r2"), m["r2"], "a coefficient of determination <= 1")
        if r2 > 1:
            raise ctx.fail((*path, "r2"), f"expected a coefficient of determination <= 1, got {r2}")
    if "mape" in m:
        mape = number(ctx, (*path, "mape"), m["mape"], "a non-negative fraction (0.02 = 2%)")
        if mape < 0:
            raise ctx.fail((*path, "mape"), f"expected a non-negative fraction, got {mape}")
    if "data" in m:
        data = m["data"]
        if isinstance(data, str):
            data = [data]
        if not isinstance(data, list) or not all(isinstance(d, str) for d in data):
            raise ctx.fail((*path, "data"), f"expected a list of strings, got {m['data']!r}")
        m["data"] = data
    return _plain(m)



def _build(ctx: Ctx, doc: Any) -> Params:
    top = mapping(ctx, (), doc, _TOP_KEYS, ("system", "coefficients"))
    system = top["system"]
    if not isinstance(system, str) or not system.strip():
        raise ctx.fail(("system",), f"expected a non-empty name, got {system!r}")
    coefficients, stated = _model_coefficients(ctx, top)
    moe = None
    if top.get("moe") is not None:
        moe = _moe(ctx, top["moe"])
    if moe is not None and coefficients.saturates:
        raise ctx.fail(("saturation",), "the saturation regime is not supported together "
                       "with moe; remove one of the two blocks")
    return Params(
        system=system.strip(),
        coefficients=coefficients,
        moe=moe,
        source=ctx.source,
        server_capacity=stated,
        **_optional_blocks(ctx, top),
    )


def _model_coefficients(ctx: Ctx, top: Mapping[str, Any]
                        ) -> tuple[Coefficients, ServerCapacity | None]:
    """`coefficients`, `b_v_context`, `saturation` and `capacity` as one `Coefficients`,
    with the `server_capacity` block that fills the capacity terms `capacity` leaves unset."""
    coef = _coefficients(ctx, ("coefficients",), top["coefficients"], _COEFFICIENT_NAMES)
    b_v_context = 0.0
    if top.get("b_v_context") is not None:
        b_v_context = seconds(ctx, ("b_v_context",), top["b_v_context"], 1.0)
    extra: dict[str, float] = {}
    if top.get("saturation") is not None:
        sm = mapping(ctx, ("saturation",), top["saturation"], _SATURATION_NAMES)
        for n in _SATURATION_NAMES:
            if n in sm:
                if n.startswith("c_"):
                    extra[n] = seconds(ctx, ("saturation", n), sm[n], 60.0)
                else:
                    extra[n] = count(ctx, ("saturation", n), sm[n], "tokens per step")
    if top.get("capacity") is not None:
        cm = mapping(ctx, ("capacity",), top["capacity"], _CAPACITY_NAMES)
        for n in _CAPACITY_NAMES:
            if n in cm:
                extra[n] = count(ctx, ("capacity", n), cm[n],
                                 "requests" if n == "max_num_seqs" else "tokens")
    stated = None
    if top.get("server_capacity") is not None:
        stated = read_server_capacity(ctx, top["server_capacity"])
    # A stated capacity is the model's capacity term unless `capacity` sets it (an MoE
    # model has no capacity terms: the record is kept, the model unchanged).
    if stated is not None and top.get("moe") is None:
        for n, v in stated.to_mapping().items():
            extra.setdefault(n, v)
    coefficients = Coefficients(**coef, b_v_context=b_v_context, **extra)
    if coefficients.a_p == 0 and coefficients.a_v == 0:
        raise ctx.fail(
            ("coefficients",),
            "a_p and a_v are both 0: an isolated request would take no time; "
            "at least one load-independent prefill or verify cost must be positive",
        )
    return coefficients, stated


def _moe(ctx: Ctx, value: Any) -> MoEParams:
    mp = ("moe",)
    mm = mapping(ctx, mp, value, ("experts", "active_experts", "expert_coefficients"),
                 ("experts", "active_experts", "expert_coefficients"))
    experts = integer(ctx, (*mp, "experts"), mm["experts"], 1, 1_000_000)
    active = integer(ctx, (*mp, "active_experts"), mm["active_experts"], 1, experts)
    ec = _coefficients(ctx, (*mp, "expert_coefficients"), mm["expert_coefficients"],
                       _EXPERT_NAMES)
    return MoEParams(experts=experts, active_experts=active,
                     expert_coefficients=ExpertCoefficients(**ec))


def _optional_blocks(ctx: Ctx, top: Mapping[str, Any]) -> dict[str, Any]:
    """The `Params` fields of the optional top-level keys, read in the file's order of
    checks (the error reported first does not depend on the key order)."""
    calibrated = None
    if top.get("calibrated_range") is not None:
        calibrated = read_calibrated_range(ctx, top["calibrated_range"])

    uncertainty = None
    if top.get("uncertainty") is not None:
        uncertainty = _uncertainty(ctx, top["uncertainty"])

    profile = None
    if top.get("acceptance_profile") is not None:
        profile = _profile(ctx, top["acceptance_profile"])

    max_util = DEFAULT_MAX_UTILIZATION
    if top.get("max_utilization") is not None:
        max_util = number(ctx, ("max_utilization",), top["max_utilization"],
                          "a utilisation ceiling in (0, 1]")
        if not 0.0 < max_util <= 1.0:
            raise ctx.fail(("max_utilization",),
                           f"expected a utilisation ceiling in (0, 1], got {max_util:g}")

    k_max = DEFAULT_K_MAX
    if top.get("k_max") is not None:
        k_max = integer(ctx, ("k_max",), top["k_max"], 1, 64)

    provenance: dict[str, Any] = {}
    if top.get("provenance") is not None:
        provenance = _provenance(ctx, top["provenance"])
    return {"acceptance_profile": profile, "max_utilization": max_util, "k_max": k_max,
            "provenance": provenance, "calibrated_range": calibrated,
            "uncertainty": uncertainty}


def params_from_mapping(doc: Mapping[str, Any], source: str = "<params>") -> Params:
    """Validate an already-parsed document (what calibration builds before dumping it)."""
    return _build(Ctx(source, None), doc)


def load_params(path: str | os.PathLike[str]) -> Params:
    """Read and validate a parameters file; any problem is a ConfigError naming the field.

    The file is read with the bounds of :data:`~specwatch.common.boundedfile.PARAMETERS`
    (a regular file of at most 256 KiB; YAML without aliases, duplicate keys or deep nesting).
    """
    source = str(path)
    root, doc = compose_yaml(read_text(path, PARAMETERS), source)
    ctx = Ctx(source, root)
    if doc is None:
        raise ConfigError(f"{source}: empty parameters file (expected system and coefficients)")
    return _build(ctx, doc)


#: The first line of a written parameters file: where a reader finds what it means.
HEADER = ("# Latency-model parameters written by specwatch calibrate; "
          "explained in docs/whatif.md (Parameters file).\n")


def dump_params(params: Params, path: str | os.PathLike[str]) -> None:
    """Write a parameters file atomically (a reader never sees half a file).

    Floats are written with repr precision, so load_params(dump_params(p)) == p.
    """
    text = HEADER + yaml.safe_dump(params.to_mapping(), sort_keys=False, allow_unicode=True)
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or Path("."))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
