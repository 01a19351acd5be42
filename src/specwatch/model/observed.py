"""What calibration observed about one system: the load it measured and the capacity the
servers stated (the `calibrated_range` and `server_capacity` blocks of the parameters file).

Owns `CalibratedRange` (with its `MeasuredCeiling`s) and `ServerCapacity`, their readers from
the YAML document and their inverse (`to_mapping`). These are facts and bounds, not fitted
coefficients: `model.validity` compares predictions against them (docs/model.md, "Uncertainty").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from specwatch.model.paramcheck import Ctx, count, integer, mapping

__all__ = [
    "DEFAULT_LOAD_MARGIN",
    "SERVER_CAPACITY_NAMES",
    "CalibratedRange",
    "CurveTop",
    "MeasuredCeiling",
    "ServerCapacity",
    "read_calibrated_range",
    "read_server_capacity",
]

#: Keys of `server_capacity`: the capacity terms (same names) as the servers stated them.
SERVER_CAPACITY_NAMES = ("kv_cache_tokens", "kv_cache_tokens_sd", "max_num_seqs")
#: Default relative margin above the highest calibrated load before a prediction is marked
#: beyond_calibrated_load: 10% is about the spread of repeated benchmark runs.
DEFAULT_LOAD_MARGIN = 0.1


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
class CurveTop(MeasuredCeiling):
    """The highest arrival rate one measured curve (k on one workload, measured at two load
    levels or more) was served at: the server has no ceiling below it, so a latency at a
    clearly lower rate lies between that curve's runs (the same fields as a ceiling).

    `rising`: the step into the top run still raised throughput nearly as much as requests
    in flight (calibrate's `RISING_ELASTICITY`), so the top run was not at the curve's
    ceiling and a latency at or below its rate is vouched for by the runs up to it."""

    rising: bool = False

    def to_mapping(self) -> dict[str, Any]:
        return {**super().to_mapping(), **({"rising": True} if self.rising else {})}


_Rate = TypeVar("_Rate", bound=MeasuredCeiling)


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
    #: The top of each measured curve: a fixed point below a curve's top rate by more than
    #: the margin is between that curve's runs, so the headroom bound does not apply to it
    #: (empty: not recorded).
    curve_tops: tuple[CurveTop, ...] = ()

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
            **({"curve_tops": [c.to_mapping() for c in self.curve_tops]}
               if self.curve_tops else {}),
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


def read_calibrated_range(ctx: Ctx, value: Any) -> CalibratedRange:
    path: tuple[str | int, ...] = ("calibrated_range",)
    names = ("max_arrival_rate", "max_in_flight", "draft_lengths", "margin",
             "max_tokens_per_step", "max_arrival_rate_by_k", "max_utilization_seen",
             "measured_ceilings", "headroom_in_flight_sd", "headroom_in_flight_nosd",
             "headroom_tokens_per_step", "curve_tops")
    m = mapping(ctx, path, value, names, names[:3])
    rate = count(ctx, (*path, "max_arrival_rate"), m["max_arrival_rate"], "req/s")
    in_flight = count(ctx, (*path, "max_in_flight"), m["max_in_flight"], "requests")
    ks = m["draft_lengths"]
    if not isinstance(ks, list) or not ks or not all(
        isinstance(k, int) and not isinstance(k, bool) and 0 <= k <= 64 for k in ks
    ):
        raise ctx.fail((*path, "draft_lengths"),
                       f"expected a non-empty list of integers in [0, 64], got {ks!r}")
    margin = DEFAULT_LOAD_MARGIN
    if m.get("margin") is not None:
        margin = count(ctx, (*path, "margin"), m["margin"], "a fraction, 0.1 = 10%")
    tokens = None
    if m.get("max_tokens_per_step") is not None:
        tokens = count(ctx, (*path, "max_tokens_per_step"), m["max_tokens_per_step"],
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
            by_k[key] = count(ctx, (*bp, key), val, "req/s")
    seen = None
    if m.get("max_utilization_seen") is not None:
        seen = count(ctx, (*path, "max_utilization_seen"), m["max_utilization_seen"],
                      "a utilisation λ/λ_max")
    ceilings = _curve_rates(ctx, (*path, "measured_ceilings"), m.get("measured_ceilings"),
                            MeasuredCeiling)
    tops = _curve_rates(ctx, (*path, "curve_tops"), m.get("curve_tops"), CurveTop)
    headroom: dict[str, float | None] = {}
    for name, unit in (("headroom_in_flight_sd", "requests"),
                       ("headroom_in_flight_nosd", "requests"),
                       ("headroom_tokens_per_step", "tokens per verify step")):
        headroom[name] = (count(ctx, (*path, name), m[name], unit)
                          if m.get(name) is not None else None)
    return CalibratedRange(max_arrival_rate=rate, max_in_flight=in_flight,
                           draft_lengths=tuple(sorted(set(ks))), margin=margin,
                           max_tokens_per_step=tokens, max_arrival_rate_by_k=by_k,
                           max_utilization_seen=seen, measured_ceilings=ceilings,
                           curve_tops=tops, **headroom)


def _curve_rates(ctx: Ctx, path: tuple[str | int, ...], raw: Any,
                 cls: type[_Rate]) -> tuple[_Rate, ...]:
    """A list of per-curve rates (k, prompt and generation tokens, arrival rate)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ctx.fail(path, f"expected a list of curves, got {raw!r}")
    names = ("k", "prompt_tokens", "generation_tokens", "arrival_rate")
    allowed = (*names, "rising") if cls is CurveTop else names
    out = []
    for i, item in enumerate(raw):
        cm = mapping(ctx, (*path, i), item, allowed, names)
        extra: dict[str, Any] = {}
        if cm.get("rising") is not None:
            if not isinstance(cm["rising"], bool):
                raise ctx.fail((*path, i, "rising"), f"expected true or false, got "
                               f"{cm['rising']!r}")
            extra["rising"] = cm["rising"]
        out.append(cls(
            k=integer(ctx, (*path, i, "k"), cm["k"], 0, 64),
            prompt_tokens=count(ctx, (*path, i, "prompt_tokens"), cm["prompt_tokens"], "tokens"),
            generation_tokens=count(ctx, (*path, i, "generation_tokens"),
                                     cm["generation_tokens"], "tokens"),
            arrival_rate=count(ctx, (*path, i, "arrival_rate"), cm["arrival_rate"], "req/s"),
            **extra))
    return tuple(out)

def read_server_capacity(ctx: Ctx, value: Any) -> ServerCapacity:
    """The `server_capacity` block: each stated term a count > 0."""
    sc = mapping(ctx, ("server_capacity",), value, SERVER_CAPACITY_NAMES)
    values: dict[str, float] = {}
    for n in SERVER_CAPACITY_NAMES:
        if sc.get(n) is not None:
            unit = "requests" if n == "max_num_seqs" else "tokens"
            v = count(ctx, ("server_capacity", n), sc[n], f"{unit}, > 0")
            if v <= 0:
                raise ctx.fail(("server_capacity", n), f"expected {unit} > 0, got {v:g}")
            values[n] = v
    return ServerCapacity(**values)
