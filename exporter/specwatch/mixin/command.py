"""`specwatch mixin render`: the bundle's rules and dashboards with the user's selectors and
thresholds, for a user who installed the wheel and has no Jsonnet tooling.

    specwatch mixin render --out DIR [--set KEY=VALUE ...]

    specwatch mixin render --out out --set selector='job="llm"'
    specwatch mixin render --out out --set vllmSelector='job="inference", namespace="llm"' \\
        --set alerts.SDAcceptanceRateLow.threshold=0.35 --set showMultiCluster=true

KEY is a dotted path into the mixin's ``_config`` (config.libsonnet: the same keys, the same
meaning), so a ``--set`` is what a Jsonnet user writes as ``_config+:: {...}``. One shorthand:
``selector`` sets ``vllmSelector`` and ``exporterSelector`` both, for the common case where
one label (``job``, ``namespace``) picks out the servers and specwatch alike.

VALUE takes the type of the key's default, so that a shell-quoted selector stays a string and
``0.35`` stays a number: a number key needs a number, a boolean key ``true``/``false``, a list
key a JSON list or comma-separated items. An unknown key, or a value of the wrong type, is one
error naming the key and what was expected (exit 2). The files written are the same three the
repository commits (``alerts/specwatch-alerts.yaml``, ``alerts/specwatch-rules.yaml``,
``dashboards/*.json``), rendered by the same code (`specwatch.mixin.render`).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
from pathlib import Path
from typing import Any

from specwatch import __version__
from specwatch.common.errors import ConfigError
from specwatch.mixin import render

# `--set selector=X` expands to these keys.
SELECTOR_SHORTHAND = ("vllmSelector", "exporterSelector")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `specwatch mixin` (one action today: render)."""
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    r = actions.add_parser(
        "render",
        help="write the rules and dashboards with your selectors and thresholds",
        description="Write alerts/specwatch-alerts.yaml, alerts/specwatch-rules.yaml and "
        "dashboards/*.json under --out, rendered from the packaged Jsonnet mixin with the "
        "--set overrides (keys of config.libsonnet's _config).",
    )
    r.add_argument("--out", required=True, type=Path, metavar="DIR",
                   help="output directory (created; existing files of the same name replaced)")
    r.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key, dotted for nested keys "
                   "(alerts.SDAcceptanceRateLow.threshold=0.35); `selector` sets both "
                   "vllmSelector and exporterSelector; repeatable")


def _typed(key: str, text: str, default: Any) -> Any:
    """``text`` converted to the type of the key's default value."""
    if isinstance(default, bool):
        lowered = text.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        raise ConfigError(f"--set {key}: expected true or false, got {text!r}")
    if isinstance(default, int | float):
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"--set {key}: expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise ConfigError(f"--set {key}: expected a finite number, got {text!r}")
        return int(value) if isinstance(default, int) and value.is_integer() else value
    if isinstance(default, list):
        stripped = text.strip()
        if stripped.startswith("["):
            try:
                value = json.loads(stripped)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"--set {key}: not a valid JSON list ({exc.msg})") from None
            if not isinstance(value, list):
                raise ConfigError(f"--set {key}: expected a list")
            return value
        return [item.strip() for item in text.split(",") if item.strip()]
    if isinstance(default, dict):
        keys = ", ".join(sorted(default))
        raise ConfigError(f"--set {key}: is a group of settings; set one of its keys "
                          f"({key}.<name>, name one of: {keys})")
    return text


def parse_sets(sets: list[str], config: dict[str, Any]) -> dict[str, Any]:
    """``["a.b=1", ...]`` -> the nested overrides dict `render` merges into ``_config``."""
    overrides: dict[str, Any] = {}
    for item in sets:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        keys = list(SELECTOR_SHORTHAND) if key == "selector" else [key]
        for full in keys:
            path = full.split(".")
            node: Any = config
            for depth, part in enumerate(path):
                if not isinstance(node, dict) or part not in node:
                    where = ".".join(path[:depth]) or "_config"
                    known = ", ".join(sorted(node)) if isinstance(node, dict) else "none"
                    raise ConfigError(f"--set {full}: {where} has no key {part!r} "
                                      f"(known: {known})")
                node = node[part]
            value = _typed(full, text, node)
            target = overrides
            for part in path[:-1]:
                target = target.setdefault(part, {})
            target[path[-1]] = value
    return overrides


def run(args: argparse.Namespace) -> int:
    overrides = parse_sets(args.sets, render.default_config())
    command = "specwatch mixin render --out DIR" + "".join(
        f" --set {shlex.quote(s)}" for s in args.sets)
    header = (f"# Generated by `{command}` from the specwatch mixin"
              f" (specwatch {__version__}). Do not edit: render again.\n")
    try:
        written = render.write_files(args.out, overrides, header)
    except OSError as exc:
        raise ConfigError(f"--out {args.out}: cannot write: {exc.strerror or exc}") from exc
    for rel in written:
        print(args.out / rel)
    return 0
