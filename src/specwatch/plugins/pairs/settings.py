"""The ``pairs:`` and ``pair_options:`` sections of the serve config: their schema, the checks
across keys, and the sharding groups that keep both sides of a pair on one exporter.

:data:`SECTION` declares them; the application composes it into the serve config's schema,
so the poll path validates and shards by pairs without importing this plug-in.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specwatch.common.errors import ConfigError
from specwatch.common.schema import (
    NUM,
    CheckError,
    Key,
    format_duration,
    non_negative,
    parse_duration,
)
from specwatch.poll.config import ConfigSection, SectionContext, check_name

#: Default arrival-rate bin edges (requests per second): [0, 0.5), [0.5, 1), ... [32, +Inf).
DEFAULT_BINS: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
#: Default acceptance bands (accepted / proposed draft tokens of the SD side): [0, 0.25),
#: [0.25, 0.5), [0.5, 0.75), [0.75, 1]. A quarter of the range: a regime change that matters
#: to the speedup (temperature, another workload) moves acceptance by more than that.
DEFAULT_ACCEPTANCE_BANDS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75)
DEFAULT_WINDOW = "1m"
DEFAULT_MIN_REQUESTS = 50
DEFAULT_RETENTION_SECONDS = 3600.0


@dataclass(frozen=True)
class PairConfig:
    """One ``pairs:`` entry: two targets, optionally one model (default: every model both
    sides serve)."""

    name: str
    sd: str
    baseline: str
    model: str | None = None


@dataclass(frozen=True)
class PairSettings:
    """``pair_options:``: the window a segment is, thresholds, bins (default and per model)
    and acceptance bands."""

    window: str = DEFAULT_WINDOW
    min_requests: float = DEFAULT_MIN_REQUESTS
    retention_seconds: float = DEFAULT_RETENTION_SECONDS
    bins: tuple[float, ...] = DEFAULT_BINS
    model_bins: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    acceptance_bands: tuple[float, ...] = DEFAULT_ACCEPTANCE_BANDS

    def bins_for(self, model: str) -> tuple[float, ...]:
        return self.model_bins.get(model, self.bins)


def shard_keys(pairs: Sequence[PairConfig]) -> dict[str, str]:
    """Target name -> the name it is sharded by: the pair name for a paired target, so both
    sides of a pair land on one exporter. Pairs that share a target are one group, sharded
    by the group's first pair name in sorted order (every exporter computes the same)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for p in pairs:
        for t in (p.sd, p.baseline):
            a, b = find("t:" + t), find("p:" + p.name)
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups: dict[str, list[str]] = {}
    for p in pairs:
        groups.setdefault(find("p:" + p.name), []).append(p.name)
    first = {root: min(names) for root, names in groups.items()}
    return {t: first[find("t:" + t)] for p in pairs for t in (p.sd, p.baseline)}


def _bin_edges(value: Any) -> tuple[float, ...]:
    edges = []
    for x in value:
        if isinstance(x, bool) or not isinstance(x, int | float) or not x >= 0 \
                or not x < float("inf"):
            raise CheckError(f"expected non-negative numbers (requests/s), got {x!r}")
        edges.append(float(x))
    if len(edges) < 2 or any(b <= a for a, b in itertools.pairwise(edges)):
        raise CheckError(f"expected at least two increasing bin edges, got {list(value)}")
    return tuple(edges)


def _band_edges(value: Any) -> tuple[float, ...]:
    """Acceptance-rate band edges: increasing, from 0, each below 1 (``[0]``: one band)."""
    edges = _bin_edges([*value, 1.0]) if value else ()
    if not edges or edges[0] != 0:
        raise CheckError(f"expected increasing acceptance-rate band edges from 0, each below "
                         f"1, got {list(value)}")
    return edges[:-1]


#: `pairs:` entries: an SD target and a baseline target serving the same model.
PAIR_SCHEMA: dict[str, Key] = {
    "name": Key(str, required=True, check=check_name, doc="label value of `pair`"),
    "sd": Key(str, required=True, doc="target name of the side running SD"),
    "baseline": Key(str, required=True, doc="target name of the side without SD (or another k)"),
    "model": Key(str, doc="model name to compare (default: every model both serve)"),
}
PAIR_OPTIONS_SCHEMA: dict[str, Key] = {
    "window": Key(str, doc="window one segment is (one of global.windows; default 1m)"),
    "min_requests": Key(NUM, check=non_negative,
                        doc="finished requests each side needs in a bin (default 50)"),
    "retention": Key((*NUM, str), check=parse_duration, doc="how long segments count (1h)"),
    "arrival_rate_bins": Key(list, check=_bin_edges, doc="bin edges in requests/s"),
    "models": Key(dict, values=Key(dict, children={
        "arrival_rate_bins": Key(list, required=True, check=_bin_edges, doc="bin edges"),
    }), doc="per model: its own arrival_rate_bins"),
    "acceptance_bands": Key(list, check=_band_edges,
                            doc="acceptance-rate band edges, 0 first (default 0, .25, .5, .75)"),
}


@dataclass(frozen=True)
class Pairs:
    """The section's value: the pairs and their options."""

    pairs: tuple[PairConfig, ...] = ()
    settings: PairSettings = field(default_factory=PairSettings)


def build_pairs(raw: Mapping[str, Any], ctx: SectionContext) -> Pairs:
    """``pairs:`` and ``pair_options:`` checked against the targets and windows.

    A side must name a configured target unless targets are discovered (file_sd) or
    sharded, where the set is only known at run time; a pair's window must be one the
    exporter derives."""
    where, windows = ctx.where, ctx.windows
    pairs: list[PairConfig] = []
    seen: set[str] = set()
    known = set(ctx.target_names)
    for i, p in enumerate(raw.get("pairs", [])):
        path = f"pairs[{i}]"
        if p["name"] in seen:
            raise ConfigError(f"{where}: {path}.name: duplicate pair name {p['name']!r}")
        seen.add(p["name"])
        if p["sd"] == p["baseline"]:
            raise ConfigError(f"{where}: {path}.baseline: the same target as sd "
                              f"({p['sd']!r}); a pair compares two targets")
        for side in ("sd", "baseline"):
            if not ctx.open_target_set and p[side] not in known:
                raise ConfigError(f"{where}: {path}.{side}: no target named {p[side]!r} "
                                  f"(targets: {', '.join(sorted(known)) or 'none'})")
        pairs.append(PairConfig(p["name"], p["sd"], p["baseline"], p.get("model")))
    o = raw.get("pair_options", {})
    defaults = PairSettings()
    window = o.get("window", defaults.window)
    if "window" in o or pairs:
        try:
            window_s = parse_duration(window)
        except CheckError as exc:
            raise ConfigError(f"{where}: pair_options.window: {exc}") from None
        window = format_duration(window_s)
        if window not in windows:
            raise ConfigError(f"{where}: pair_options.window: {window!r} is not one of the "
                              f"exporter's windows ({', '.join(windows)}); add it to "
                              f"global.windows")
    settings = PairSettings(
        window=window, min_requests=o.get("min_requests", defaults.min_requests),
        retention_seconds=o.get("retention", defaults.retention_seconds),
        bins=o.get("arrival_rate_bins", defaults.bins),
        model_bins={m: v["arrival_rate_bins"] for m, v in o.get("models", {}).items()},
        acceptance_bands=o.get("acceptance_bands", defaults.acceptance_bands))
    return Pairs(tuple(pairs), settings)


def raw_shard_keys(raw: Mapping[str, Any]) -> dict[str, str]:
    """:func:`shard_keys` of the file's ``pairs:`` (validated key by key, not yet across)."""
    return shard_keys([PairConfig(p["name"], p["sd"], p["baseline"])
                       for p in raw.get("pairs", [])])


SECTION: ConfigSection[Pairs] = ConfigSection(
    "pairs",
    top={"pairs": Key(list, items=Key(dict, children=PAIR_SCHEMA),
                      doc="measured A/B pairs: sd_measured_speedup"),
         "pair_options": Key(dict, children=PAIR_OPTIONS_SCHEMA,
                             doc="windows and bins of pairs")},
    top_after="controller", build=build_pairs, shard_keys=raw_shard_keys)
