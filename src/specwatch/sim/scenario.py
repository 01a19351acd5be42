"""Simulator scenario files: what load, lengths and acceptance a simulated vLLM sees over time.

A scenario is YAML (docs/simulator.md, "Scenario files"): models with their timelines of
phases (arrival-rate profile and traffic mix), scripted restarts, a seed. It is validated
strictly (`specwatch.sim.validation`): an unknown key, a wrong type or an out-of-range
number raises `ConfigError` naming the file and the key path, so a typo never silently
becomes a default. The packaged scenarios live in ``specwatch/sim/data/scenarios/`` and
can be named without a path (``--scenario demo``).

The objects here are plain, immutable descriptions; the distributions are in
`specwatch.sim.distributions`, the physics in `specwatch.sim.engine`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from specwatch.common import boundedfile
from specwatch.common.errors import ConfigError
from specwatch.sim.distributions import (
    AcceptanceDist,
    LengthDist,
    parse_acceptance,
    parse_length,
)
from specwatch.sim.validation import Node, check_number, kind_of

__all__ = [
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
    of the simulated system; see `specwatch.sim.costs` for how they become step costs).
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


def _parse_rate(node: Node, key: str) -> RateProfile:
    value = node.raw(key, required=True)
    if isinstance(value, Mapping):
        sub = Node(node.source, node.where(key), value)
        start = float(sub.number("from", lo=0))
        end = float(sub.number("to", lo=0))
        sub.finish()
        return RateProfile(start, end)
    v = float(check_number(node, key, value, 0, None, False, False, False))
    return RateProfile(v, v)


def _parse_model(source: str, path: str, value: Any, base_dir: Path | None) -> ModelSpec:
    node = Node(source, path, value)
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
    phases = _parse_phases(node, _traffic_mix(node))
    _check_request_fits(node, phases, max_model_len, max_tokens, kv_tokens)
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


_Mix = tuple[AcceptanceDist | None, LengthDist | None, LengthDist | None]


def _traffic_mix(node: Node) -> _Mix:
    """The (acceptance, prompt_tokens, generation_tokens) a node sets (None where absent)."""
    source = node.source
    acc = (
        parse_acceptance(source, node.where("acceptance"), node.raw("acceptance"))
        if node.has("acceptance")
        else None
    )
    prompt = (
        parse_length(source, node.where("prompt_tokens"), node.raw("prompt_tokens"))
        if node.has("prompt_tokens")
        else None
    )
    gen = (
        parse_length(source, node.where("generation_tokens"), node.raw("generation_tokens"))
        if node.has("generation_tokens")
        else None
    )
    return acc, prompt, gen


def _parse_phases(node: Node, defaults: _Mix) -> list[Phase]:
    """The model's phases; each inherits the traffic mix of the one before (the first, the
    model's), overriding what it sets."""
    source = node.source
    phases: list[Phase] = []
    items = node.items("phases")
    if not items:
        node.fail("at least one phase is required", "phases")
    acc, prompt, gen = defaults
    for i, (ppath, pval) in enumerate(items):
        ph = Node(source, ppath, pval)
        ph.allow("name", "duration_s", "arrival_rate", "acceptance", "prompt_tokens",
                 "generation_tokens")
        pname = ph.string("name", f"phase-{i}")
        duration = ph.number("duration_s", lo=0, lo_open=True)
        rate = _parse_rate(ph, "arrival_rate")
        if ph.has("acceptance"):
            acc = parse_acceptance(source, ph.where("acceptance"), ph.raw("acceptance"))
        if ph.has("prompt_tokens"):
            prompt = parse_length(source, ph.where("prompt_tokens"), ph.raw("prompt_tokens"))
        if ph.has("generation_tokens"):
            gen = parse_length(
                source, ph.where("generation_tokens"), ph.raw("generation_tokens")
            )
        for key, val in (("acceptance", acc), ("prompt_tokens", prompt),
                         ("generation_tokens", gen)):
            if val is None:
                ph.fail("required (set it here, in an earlier phase, or on the model)", key)
        ph.finish()
        phases.append(Phase(pname, float(duration), rate, acc, prompt, gen))  # type: ignore[arg-type]
    return phases


def _check_request_fits(node: Node, phases: list[Phase], max_model_len: int, max_tokens: int,
                        kv_tokens: int) -> None:
    """Every request a phase can draw fits max_model_len and the KV cache."""
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


def parse_scenario(
    document: Any, source: str = "<scenario>", base_dir: Path | None = None
) -> Scenario:
    """Validate a parsed YAML document and build the `Scenario` (coefficients not loaded)."""
    node = Node(source, "", document)
    node.allow("version", "description", "seed", "loop", "models", "restarts")
    version = node.number("version", 1, lo=1, hi=1, integer=True)
    del version
    description = node.raw("description", "")
    if not isinstance(description, str):
        node.fail(f"expected a string, got {kind_of(description)}", "description")
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
        r = Node(source, rpath, rval)
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
    known = ", ".join(packaged_scenario_names())
    raise ConfigError(f"{value}: scenario file not found; a packaged scenario can be named "
                      f"instead of a path: {known}")


def load_scenario(value: str | Path, *, load_coefficients: bool = True) -> Scenario:
    """Read, validate and (by default) attach each model's coefficients from its params file."""
    path = resolve_scenario_path(str(value))
    document = boundedfile.read_yaml(path, boundedfile.SCENARIO)
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
