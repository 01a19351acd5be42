"""The parameters file: one system's fitted latency-model coefficients (YAML).

Calibration writes it, the what-if CLI, the exporter and the simulator read it. It is strict
on purpose: a coefficient typed in milliseconds where seconds are expected, a negative cost
or a misspelt key would silently turn every prediction into nonsense, so loading names the
file, line and field and says what was expected (specwatch.common.errors.ConfigError, exit 2).

Schema (README "Parameters file"):

    system: qwen3-32b-h100-eagle3              # required, free text
    coefficients: {a_p: .., b_p: .., a_v: .., b_v: .., a_d: .., b_d: ..}   # seconds, >= 0
    b_v_context: 0.0                           # optional, seconds per context token
    saturation:                                # optional roofline knee (model.md); all 0 = linear
      c_v: 7.1e-05       # s per verified token past knee_v (compute-bound slope)
      knee_v: 192        # tokens per verify step where verification turns compute-bound
      c_d: 9.0e-05       # s per draft token past knee_d
      knee_d: 128        # tokens per draft step (requests in flight) of the drafter's knee
    capacity:                                  # optional; beyond: requests wait (saturated)
      max_num_seqs: 256          # requests running at once
      kv_cache_tokens: 80000     # KV-cache tokens (a request holds p + g at its end)
      kv_cache_tokens_sd: 23000  # the same with the drafter loaded (0: kv_cache_tokens)
    server_capacity:                           # optional, what the servers stated (facts)
      kv_cache_tokens: 524288    # vLLM cache_config_info of the server without SD
      kv_cache_tokens_sd: 400000 # the same of the server running SD (drafter loaded)
      max_num_seqs: 256          # --max-num-seqs the runs were served with
    calibrated_range:                          # optional, what calibration saw (validity)
      max_arrival_rate: 16.1    # req/s, highest measured throughput
      max_in_flight: 249        # requests, highest measured B = λ·L
      draft_lengths: [0, 1, 2, 3]
      margin: 0.1               # a prediction this much above is beyond_calibrated_load
      max_tokens_per_step: 1500 # highest B·(k+1) measured (the knee's unit)
      max_arrival_rate_by_k: {0: 16.1, 1: 15.9}   # req/s, highest measured per k (0 = no SD)
      max_utilization_seen: 0.97 # highest λ/λ_max of a run (the fit's own utilisation)
      measured_ceilings:        # where a measured curve stopped rising (k, lengths, req/s)
        - {k: 1, prompt_tokens: 147, generation_tokens: 200, arrival_rate: 15.1}
      headroom_in_flight_sd: 62     # most requests in flight a run with headroom held (SD)
      headroom_in_flight_nosd: 127  # the same without SD
      headroom_tokens_per_step: 427 # most tokens per verify step of a run with headroom
    uncertainty:                               # optional: the fit's residual spread (intervals)
      method: residual_spread
      level: 0.9                # the intervals' coverage
      max_relative_halfwidth: 0.15   # a wider latency interval is `sensitive` (not valid)
      bands:                    # relative RMS residual of L(B), by utilisation band
        - {utilization_below: 0.5, sigma: 0.014, runs: 84}
        - {utilization_below: .inf, sigma: 0.04, runs: 35}
    moe:                                       # optional: `coefficients` is then the dense part
      experts: 128
      active_experts: 8
      expert_coefficients: {a_p: .., b_p: .., a_v: .., b_v: ..}
    acceptance_profile: [0.78, 0.48, 0.27]     # optional, P(first i+1 drafts accepted)
    max_utilization: 0.9                       # optional validity ceiling, (0, 1]
    k_max: 8                                   # optional, largest draft length considered
    provenance: {method: .., fitted_at: .., r2: .., mape: .., data: [..]}   # optional

Numbers are seconds; a string with a unit ("25ms", "40us", "0.025s") is accepted and
converted, because humans copy step times from profilers in milliseconds.

Size: a little over 600 lines: the schema, its strict validation (one error per field with
file and line) and its inverse (`to_mapping`) are one contract; splitting the blocks'
parsers from the dataclasses they build would put the field list in two places.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specwatch.common.errors import ConfigError
from specwatch.model.closed_form import (
    DEFAULT_K_MAX,
    DEFAULT_MAX_UTILIZATION,
    Coefficients,
    ExpertCoefficients,
    MoECoefficients,
)
from specwatch.model.uncertainty import (
    DEFAULT_LEVEL,
    DEFAULT_MAX_HALFWIDTH,
    Band,
    Uncertainty,
)

__all__ = [
    "DEFAULT_LOAD_MARGIN",
    "SERVER_CAPACITY_NAMES",
    "CalibratedRange",
    "MeasuredCeiling",
    "MoEParams",
    "Params",
    "ServerCapacity",
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
#: Keys of `server_capacity`: the capacity terms (same names) as the servers stated them.
SERVER_CAPACITY_NAMES = ("kv_cache_tokens", "kv_cache_tokens_sd", "max_num_seqs")
#: Default relative margin above the highest calibrated load before a prediction is marked
#: beyond_calibrated_load: 10% is about the spread of repeated benchmark runs.
DEFAULT_LOAD_MARGIN = 0.1
_UNIT_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(s|ms|us|µs|ns)\s*$")


@dataclass(frozen=True)
class MoEParams:
    """Mixture-of-experts block: M experts, m active per token, the expert cost part s."""

    experts: int
    active_experts: int
    expert_coefficients: ExpertCoefficients


@dataclass(frozen=True)
class MeasuredCeiling:
    """Where one measured curve (draft length k, 0 = no SD, on one workload of mean prompt
    and generation tokens) stopped rising: from `arrival_rate` on, more requests in flight
    brought no more throughput (the server was at its ceiling), so no λ there has one
    latency."""

    k: int
    prompt_tokens: float
    generation_tokens: float
    arrival_rate: float

    def to_mapping(self) -> dict[str, Any]:
        return {"k": int(self.k), "prompt_tokens": float(self.prompt_tokens),
                "generation_tokens": float(self.generation_tokens),
                "arrival_rate": float(self.arrival_rate)}


@dataclass(frozen=True)
class CalibratedRange:
    """The load and draft lengths calibration saw: predictions beyond it are extrapolation.

    `margin` is the relative slack above max_arrival_rate / max_in_flight before a point is
    `beyond_calibrated_load`; `draft_lengths` are the k measured (k = 0 is no SD).
    """

    max_arrival_rate: float
    max_in_flight: float
    draft_lengths: tuple[int, ...]
    margin: float = DEFAULT_LOAD_MARGIN
    #: Highest tokens per verify step B·(k+1) measured: the quantity the knee is stated in,
    #: so a prediction past it extrapolates the step cost itself (None: not recorded).
    max_tokens_per_step: float | None = None
    #: Highest measured arrival rate per draft length (0 = no SD), req/s (empty: not recorded).
    max_arrival_rate_by_k: Mapping[int, float] = field(default_factory=dict)
    #: Highest utilisation λ/λ_max (the fit's own throughput ceiling) of a calibration run:
    #: past it the fit never saw how close to its ceiling the system really was (None: not
    #: recorded).
    max_utilization_seen: float | None = None
    #: Measured throughput ceilings of the calibration curves (empty: none seen).
    measured_ceilings: tuple[MeasuredCeiling, ...] = ()
    #: Most requests in flight B = λ·L held by a run with throughput headroom (a run of its
    #: curve holding more requests served at least 10% more: the server was not at a knee or
    #: its capacity there), with SD (any k: the same drafter and memory) and without SD; and
    #: the most tokens per verify step B·(k+1) of such a run (either system: the same
    #: verifier). Past them the runs cannot tell whether a knee lies just beyond (None: not
    #: recorded, or no curve measured at two load levels).
    headroom_in_flight_sd: float | None = None
    headroom_in_flight_nosd: float | None = None
    headroom_tokens_per_step: float | None = None

    def headroom_in_flight(self, draft_length: float) -> float | None:
        """The in-flight bound of the system that runs at this draft length (0 = no SD)."""
        return self.headroom_in_flight_nosd if draft_length == 0 else \
            self.headroom_in_flight_sd

    def to_mapping(self) -> dict[str, Any]:
        """The YAML/JSON form (also what `--json` prints as `calibrated_range`)."""
        return {
            "max_arrival_rate": float(self.max_arrival_rate),
            "max_in_flight": float(self.max_in_flight),
            "draft_lengths": [int(k) for k in self.draft_lengths],
            "margin": float(self.margin),
            **({"max_tokens_per_step": float(self.max_tokens_per_step)}
               if self.max_tokens_per_step is not None else {}),
            **({"max_arrival_rate_by_k": {int(k): float(v) for k, v in
                                          sorted(self.max_arrival_rate_by_k.items())}}
               if self.max_arrival_rate_by_k else {}),
            **({"max_utilization_seen": float(self.max_utilization_seen)}
               if self.max_utilization_seen is not None else {}),
            **({"measured_ceilings": [c.to_mapping() for c in self.measured_ceilings]}
               if self.measured_ceilings else {}),
            **{name: float(v) for name, v in (
                ("headroom_in_flight_sd", self.headroom_in_flight_sd),
                ("headroom_in_flight_nosd", self.headroom_in_flight_nosd),
                ("headroom_tokens_per_step", self.headroom_tokens_per_step)) if v is not None},
        }


@dataclass(frozen=True)
class ServerCapacity:
    """What the calibrated servers said about their own capacity: facts, not fits.

    `kv_cache_tokens` is the KV cache of the server without SD, `kv_cache_tokens_sd` of the
    one running SD (the drafter's weights and cache take memory), both as vLLM states them
    (`vllm:cache_config_info`); `max_num_seqs` the scheduler's limit. None: not stated. The
    model's `capacity` terms take these values (model.md, "Server capacity"), and a live
    server stating another capacity is flagged (`capacity_mismatch`).
    """

    kv_cache_tokens: float | None = None
    kv_cache_tokens_sd: float | None = None
    max_num_seqs: float | None = None

    def to_mapping(self) -> dict[str, float]:
        return {n: float(v) for n in SERVER_CAPACITY_NAMES
                if (v := getattr(self, n)) is not None}

    def __bool__(self) -> bool:
        return bool(self.to_mapping())


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


# --------------------------------------------------------------------------- validation


class _Ctx:
    """Where we are: file name and YAML node tree, to put a line number on each error."""

    def __init__(self, source: str, root: yaml.Node | None) -> None:
        self.source = source
        self.root = root

    def line(self, path: tuple[str | int, ...]) -> int | None:
        node = self.root
        line = None
        for part in path:
            if node is None:
                break
            nxt = None
            if isinstance(node, yaml.MappingNode):
                for key_node, value_node in node.value:
                    if key_node.value == part:
                        nxt = value_node
                        line = key_node.start_mark.line + 1
                        break
            elif (
                isinstance(node, yaml.SequenceNode)
                and isinstance(part, int)
                and 0 <= part < len(node.value)
            ):
                nxt = node.value[part]
                line = nxt.start_mark.line + 1
            node = nxt
        return line

    def fail(self, path: tuple[str | int, ...], message: str) -> ConfigError:
        where = self.source
        line = self.line(path)
        if line is not None:
            where = f"{where}:{line}"
        dotted = ""
        for part in path:
            dotted += f"[{part}]" if isinstance(part, int) else (f".{part}" if dotted else part)
        return ConfigError(f"{where}: {dotted}: {message}" if dotted else f"{where}: {message}")


def _number(ctx: _Ctx, path: tuple[str | int, ...], value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ctx.fail(path, f"expected {what}, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ctx.fail(path, f"expected {what}, got {value!r}")
    return v


def _seconds(ctx: _Ctx, path: tuple[str | int, ...], value: Any, upper: float) -> float:
    what = "a non-negative number of seconds"
    if isinstance(value, str):
        m = _DURATION_RE.match(value)
        if not m:
            raise ctx.fail(path, f"expected {what} (or a duration like '25ms'), got {value!r}")
        v = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    else:
        v = _number(ctx, path, value, what)
    if v < 0:
        raise ctx.fail(path, f"expected {what}, got {value!r}")
    if v > upper:
        raise ctx.fail(
            path,
            f"{v:g} s is above {upper:g} s: values are seconds, was this written in "
            "milliseconds? (write '25ms' or 0.025)",
        )
    return v


def _mapping(ctx: _Ctx, path: tuple[str | int, ...], value: Any, allowed: tuple[str, ...] | None,
             required: tuple[str, ...] = ()) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ctx.fail(path, f"expected a mapping, got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str):
            raise ctx.fail(path, f"keys must be strings, got {key!r}")
        if allowed is not None and key not in allowed:
            raise ctx.fail((*path, key), f"unknown key; expected one of {', '.join(allowed)}")
    for key in required:
        if key not in value:
            raise ctx.fail(path, f"missing required key {key!r}")
    return value


def _integer(ctx: _Ctx, path: tuple[str | int, ...], value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ctx.fail(path, f"expected an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


def _coefficients(ctx: _Ctx, path: tuple[str, ...], value: Any,
                  names: tuple[str, ...]) -> dict[str, float]:
    m = _mapping(ctx, path, value, names, names)
    return {n: _seconds(ctx, (*path, n), m[n], _UPPER[n]) for n in names}


def _count(ctx: _Ctx, path: tuple[str | int, ...], value: Any, unit: str) -> float:
    v = _number(ctx, path, value, f"a number >= 0 ({unit})")
    if v < 0:
        raise ctx.fail(path, f"expected a number >= 0 ({unit}), got {value!r}")
    return v


def _calibrated_range(ctx: _Ctx, value: Any) -> CalibratedRange:
    path: tuple[str | int, ...] = ("calibrated_range",)
    names = ("max_arrival_rate", "max_in_flight", "draft_lengths", "margin",
             "max_tokens_per_step", "max_arrival_rate_by_k", "max_utilization_seen",
             "measured_ceilings", "headroom_in_flight_sd", "headroom_in_flight_nosd",
             "headroom_tokens_per_step")
    m = _mapping(ctx, path, value, names, names[:3])
    rate = _count(ctx, (*path, "max_arrival_rate"), m["max_arrival_rate"], "req/s")
    in_flight = _count(ctx, (*path, "max_in_flight"), m["max_in_flight"], "requests")
    ks = m["draft_lengths"]
    if not isinstance(ks, list) or not ks or not all(
        isinstance(k, int) and not isinstance(k, bool) and 0 <= k <= 64 for k in ks
    ):
        raise ctx.fail((*path, "draft_lengths"),
                       f"expected a non-empty list of integers in [0, 64], got {ks!r}")
    margin = DEFAULT_LOAD_MARGIN
    if m.get("margin") is not None:
        margin = _count(ctx, (*path, "margin"), m["margin"], "a fraction, 0.1 = 10%")
    tokens = None
    if m.get("max_tokens_per_step") is not None:
        tokens = _count(ctx, (*path, "max_tokens_per_step"), m["max_tokens_per_step"],
                        "tokens per verify step")
    by_k: dict[int, float] = {}
    if m.get("max_arrival_rate_by_k") is not None:
        bp = (*path, "max_arrival_rate_by_k")
        raw = m["max_arrival_rate_by_k"]
        if not isinstance(raw, Mapping):
            raise ctx.fail(bp, f"expected a mapping of draft length to req/s, got {raw!r}")
        for key, val in raw.items():
            if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key <= 64:
                raise ctx.fail(bp, f"expected integer draft lengths in [0, 64] as keys, "
                               f"got {key!r}")
            by_k[key] = _count(ctx, (*bp, key), val, "req/s")
    seen = None
    if m.get("max_utilization_seen") is not None:
        seen = _count(ctx, (*path, "max_utilization_seen"), m["max_utilization_seen"],
                      "a utilisation λ/λ_max")
    ceilings: list[MeasuredCeiling] = []
    if m.get("measured_ceilings") is not None:
        cp = (*path, "measured_ceilings")
        raw_c = m["measured_ceilings"]
        if not isinstance(raw_c, list):
            raise ctx.fail(cp, f"expected a list of ceilings, got {raw_c!r}")
        names_c = ("k", "prompt_tokens", "generation_tokens", "arrival_rate")
        for i, item in enumerate(raw_c):
            cm = _mapping(ctx, (*cp, i), item, names_c, names_c)
            ceilings.append(MeasuredCeiling(
                k=_integer(ctx, (*cp, i, "k"), cm["k"], 0, 64),
                prompt_tokens=_count(ctx, (*cp, i, "prompt_tokens"), cm["prompt_tokens"],
                                     "tokens"),
                generation_tokens=_count(ctx, (*cp, i, "generation_tokens"),
                                         cm["generation_tokens"], "tokens"),
                arrival_rate=_count(ctx, (*cp, i, "arrival_rate"), cm["arrival_rate"],
                                    "req/s")))
    headroom: dict[str, float | None] = {}
    for name, unit in (("headroom_in_flight_sd", "requests"),
                       ("headroom_in_flight_nosd", "requests"),
                       ("headroom_tokens_per_step", "tokens per verify step")):
        headroom[name] = (_count(ctx, (*path, name), m[name], unit)
                          if m.get(name) is not None else None)
    return CalibratedRange(max_arrival_rate=rate, max_in_flight=in_flight,
                           draft_lengths=tuple(sorted(set(ks))), margin=margin,
                           max_tokens_per_step=tokens, max_arrival_rate_by_k=by_k,
                           max_utilization_seen=seen, measured_ceilings=tuple(ceilings),
                           **headroom)


def _uncertainty(ctx: _Ctx, value: Any) -> Uncertainty:
    path: tuple[str | int, ...] = ("uncertainty",)
    m = _mapping(ctx, path, value, ("method", "level", "max_relative_halfwidth", "bands"),
                 ("bands",))
    method = m.get("method", "residual_spread")
    if method != "residual_spread":
        raise ctx.fail((*path, "method"), f"expected residual_spread, got {method!r}")
    level = DEFAULT_LEVEL
    if m.get("level") is not None:
        level = _number(ctx, (*path, "level"), m["level"], "a coverage in (0, 1)")
        if not 0.0 < level < 1.0:
            raise ctx.fail((*path, "level"), f"expected a coverage in (0, 1), got {level:g}")
    limit = DEFAULT_MAX_HALFWIDTH
    if m.get("max_relative_halfwidth") is not None:
        limit = _number(ctx, (*path, "max_relative_halfwidth"), m["max_relative_halfwidth"],
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
        bm = _mapping(ctx, bp, item, ("utilization_below", "sigma", "runs"),
                      ("utilization_below", "sigma"))
        top = bm["utilization_below"]
        if isinstance(top, bool) or not isinstance(top, (int, float)) or math.isnan(top) \
                or top <= 0:
            raise ctx.fail((*bp, "utilization_below"),
                           f"expected a utilisation > 0 (.inf for the last band), got {top!r}")
        if bands and float(top) <= bands[-1].utilization_below:
            raise ctx.fail((*bp, "utilization_below"),
                           "bands must be in increasing utilisation")
        sigma = _count(ctx, (*bp, "sigma"), bm["sigma"], "a relative spread (0.02 = 2%)")
        runs = _integer(ctx, (*bp, "runs"), bm.get("runs", 0), 0, 10**9)
        bands.append(Band(float(top), sigma, runs))
    return Uncertainty(bands=tuple(bands), level=level, max_relative_halfwidth=limit)


def _profile(ctx: _Ctx, value: Any) -> tuple[float, ...]:
    path: tuple[str | int, ...] = ("acceptance_profile",)
    if not isinstance(value, list) or not value:
        raise ctx.fail(path, f"expected a non-empty list of probabilities, got {value!r}")
    out: list[float] = []
    for i, item in enumerate(value):
        v = _number(ctx, (*path, i), item, "a probability in [0, 1]")
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


def _provenance(ctx: _Ctx, value: Any) -> dict[str, Any]:
    path: tuple[str | int, ...] = ("provenance",)
    m = dict(_mapping(ctx, path, value, None))
    if "method" in m and not isinstance(m["method"], str):
        raise ctx.fail((*path, "method"), f"expected a string, got {m['method']!r}")
    if "fitted_at" in m:
        at = m["fitted_at"]
        if isinstance(at, (_dt.date, _dt.datetime)):
            m["fitted_at"] = at.isoformat()
        elif not isinstance(at, str):
            raise ctx.fail((*path, "fitted_at"), f"expected an ISO 8601 timestamp, got {at!r}")
    if "r2" in m:
        r2 = _number(ctx, (*path, "r2"), m["r2"], "a coefficient of determination <= 1")
        if r2 > 1:
            raise ctx.fail((*path, "r2"), f"expected a coefficient of determination <= 1, got {r2}")
    if "mape" in m:
        mape = _number(ctx, (*path, "mape"), m["mape"], "a non-negative fraction (0.02 = 2%)")
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


def _check_duplicates(ctx: _Ctx, node: yaml.Node | None, path: tuple[str | int, ...] = ()) -> None:
    """PyYAML keeps the last of two equal keys silently; a params file must not."""
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                raise ConfigError(
                    f"{ctx.source}:{key_node.start_mark.line + 1}: "
                    f"{'.'.join(str(p) for p in (*path, key))}: duplicate key"
                )
            seen.add(key)
            _check_duplicates(ctx, value_node, (*path, key))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicates(ctx, item, (*path, i))


def _build(ctx: _Ctx, doc: Any) -> Params:
    top = _mapping(ctx, (), doc, _TOP_KEYS, ("system", "coefficients"))
    system = top["system"]
    if not isinstance(system, str) or not system.strip():
        raise ctx.fail(("system",), f"expected a non-empty name, got {system!r}")
    coef = _coefficients(ctx, ("coefficients",), top["coefficients"], _COEFFICIENT_NAMES)
    b_v_context = 0.0
    if top.get("b_v_context") is not None:
        b_v_context = _seconds(ctx, ("b_v_context",), top["b_v_context"], 1.0)
    extra: dict[str, float] = {}
    if top.get("saturation") is not None:
        sm = _mapping(ctx, ("saturation",), top["saturation"], _SATURATION_NAMES)
        for n in _SATURATION_NAMES:
            if n in sm:
                if n.startswith("c_"):
                    extra[n] = _seconds(ctx, ("saturation", n), sm[n], 60.0)
                else:
                    extra[n] = _count(ctx, ("saturation", n), sm[n], "tokens per step")
    if top.get("capacity") is not None:
        cm = _mapping(ctx, ("capacity",), top["capacity"], _CAPACITY_NAMES)
        for n in _CAPACITY_NAMES:
            if n in cm:
                extra[n] = _count(ctx, ("capacity", n), cm[n],
                                  "requests" if n == "max_num_seqs" else "tokens")
    stated = None
    if top.get("server_capacity") is not None:
        sc = _mapping(ctx, ("server_capacity",), top["server_capacity"], SERVER_CAPACITY_NAMES)
        values: dict[str, float] = {}
        for n in SERVER_CAPACITY_NAMES:
            if sc.get(n) is not None:
                unit = "requests" if n == "max_num_seqs" else "tokens"
                v = _count(ctx, ("server_capacity", n), sc[n], f"{unit}, > 0")
                if v <= 0:
                    raise ctx.fail(("server_capacity", n), f"expected {unit} > 0, got {v:g}")
                values[n] = v
        stated = ServerCapacity(**values)
        # A stated capacity is the model's capacity term unless `capacity` sets it (an MoE
        # model has no capacity terms: the record is kept, the model unchanged).
        if top.get("moe") is None:
            for n, v in values.items():
                extra.setdefault(n, v)
    coefficients = Coefficients(**coef, b_v_context=b_v_context, **extra)
    if coefficients.a_p == 0 and coefficients.a_v == 0:
        raise ctx.fail(
            ("coefficients",),
            "a_p and a_v are both 0: an isolated request would take no time; "
            "at least one load-independent prefill or verify cost must be positive",
        )

    moe = None
    if top.get("moe") is not None:
        mp = ("moe",)
        mm = _mapping(ctx, mp, top["moe"], ("experts", "active_experts", "expert_coefficients"),
                      ("experts", "active_experts", "expert_coefficients"))
        experts = _integer(ctx, (*mp, "experts"), mm["experts"], 1, 1_000_000)
        active = _integer(ctx, (*mp, "active_experts"), mm["active_experts"], 1, experts)
        ec = _coefficients(ctx, (*mp, "expert_coefficients"), mm["expert_coefficients"],
                           _EXPERT_NAMES)
        moe = MoEParams(experts=experts, active_experts=active,
                        expert_coefficients=ExpertCoefficients(**ec))

    if moe is not None and coefficients.saturates:
        raise ctx.fail(("saturation",), "the saturation regime is not supported together "
                       "with moe; remove one of the two blocks")

    calibrated = None
    if top.get("calibrated_range") is not None:
        calibrated = _calibrated_range(ctx, top["calibrated_range"])

    uncertainty = None
    if top.get("uncertainty") is not None:
        uncertainty = _uncertainty(ctx, top["uncertainty"])

    profile = None
    if top.get("acceptance_profile") is not None:
        profile = _profile(ctx, top["acceptance_profile"])

    max_util = DEFAULT_MAX_UTILIZATION
    if top.get("max_utilization") is not None:
        max_util = _number(ctx, ("max_utilization",), top["max_utilization"],
                           "a utilisation ceiling in (0, 1]")
        if not 0.0 < max_util <= 1.0:
            raise ctx.fail(("max_utilization",),
                           f"expected a utilisation ceiling in (0, 1], got {max_util:g}")

    k_max = DEFAULT_K_MAX
    if top.get("k_max") is not None:
        k_max = _integer(ctx, ("k_max",), top["k_max"], 1, 64)

    provenance: dict[str, Any] = {}
    if top.get("provenance") is not None:
        provenance = _provenance(ctx, top["provenance"])

    return Params(
        system=system.strip(),
        coefficients=coefficients,
        moe=moe,
        acceptance_profile=profile,
        max_utilization=max_util,
        k_max=k_max,
        provenance=provenance,
        source=ctx.source,
        calibrated_range=calibrated,
        uncertainty=uncertainty,
        server_capacity=stated,
    )


def params_from_mapping(doc: Mapping[str, Any], source: str = "<params>") -> Params:
    """Validate an already-parsed document (what calibration builds before dumping it)."""
    return _build(_Ctx(source, None), doc)


def load_params(path: str | os.PathLike[str]) -> Params:
    """Read and validate a parameters file; any problem is a ConfigError naming the field."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: parameters file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot read parameters file: {exc}") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    ctx = _Ctx(source, root)
    if doc is None:
        raise ConfigError(f"{source}: empty parameters file (expected system and coefficients)")
    _check_duplicates(ctx, root)
    return _build(ctx, doc)


def dump_params(params: Params, path: str | os.PathLike[str]) -> None:
    """Write a parameters file atomically (a reader never sees half a file).

    Floats are written with repr precision, so load_params(dump_params(p)) == p.
    """
    text = yaml.safe_dump(params.to_mapping(), sort_keys=False, allow_unicode=True)
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or Path("."))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
