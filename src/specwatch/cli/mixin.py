"""`specwatch mixin`: its options (render, test), calling :mod:`specwatch.mixin.overrides`.

    specwatch mixin render --out DIR [--format files|kubernetes] [--set KEY=VALUE ...]
    specwatch mixin test [DIR]

    specwatch mixin render --out out --set vllmSelector='job="vllm"' \\
        --set exporterSelector='job="specwatch"'
    specwatch mixin render --out out --set vllmSelector='job="inference", namespace="llm"' \\
        --set alerts.SDAcceptanceRateLow.threshold=0.35 --set showMultiCluster=true

``mixin test`` runs the bundle's promtool unit tests against rendered rule files: exit 0 when
they pass, 1 when one fails.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specwatch.mixin import overrides


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `specwatch mixin` (render, test)."""
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    r = actions.add_parser(
        "render",
        help="write the rules and dashboards with your selectors and thresholds",
        description="Write alerts/specwatch-alerts.yaml, alerts/specwatch-rules.yaml, "
        "dashboards/*.json and the rule tests alerts/tests/*.yaml under --out (or, with "
        "--format kubernetes, PrometheusRules and dashboard ConfigMaps). They are rendered "
        "from the packaged Jsonnet mixin with the --set overrides (keys of config.libsonnet's "
        "_config). "
        "Every value is checked first and the rule files with `promtool check rules` when "
        "promtool is installed; a bad value writes nothing.",
    )
    r.add_argument("--out", required=True, type=Path, metavar="DIR",
                   help="output directory (created; existing files of the same name replaced)")
    r.add_argument("--format", dest="fmt", choices=overrides.FORMATS, default="files",
                   help="files: alerts/*.yaml rule files, dashboards/*.json and the rule tests "
                   "for `mixin test` (default); kubernetes: PrometheusRule objects "
                   "(monitoring.coreos.com/v1), dashboard ConfigMaps (label grafana_dashboard: "
                   "\"1\") and a kustomization.yaml, for `kubectl apply -k DIR`, each checked "
                   "against its vendored schema")
    r.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key, dotted for nested keys "
                   "(alerts.SDAcceptanceRateLow.threshold=0.35); vllmSelector (vLLM's "
                   "series) and exporterSelector (specwatch's sd_* series) are separate; "
                   "repeatable")
    t = actions.add_parser(
        "test",
        help="run the bundled promtool rule tests against rendered rules",
        description="Run `promtool test rules` with the bundle's unit tests "
        "(alerts/tests/*.yaml: every alert firing and silent) against the rule files under "
        "DIR/alerts (what `specwatch mixin render --out DIR` wrote), or the packaged rules "
        "without DIR. The tests are those that render carried over to its --set values "
        "(selectors, URLs, thresholds): a test that fails names an alert whose rule behaves "
        "differently.",
    )
    t.add_argument("dir", nargs="?", type=Path, metavar="DIR",
                   help="folder a `mixin render --out` wrote (default: the packaged rules)")


def run(args: argparse.Namespace) -> int:
    if args.action == "test":
        result = overrides.run_rule_tests(args.dir)
        print(result.output.rstrip())
        print(f"{result.files} rule test files against {result.rules_dir}: "
              + ("passed" if result.passed else "FAILED"))
        return 0 if result.passed else 1
    notes: list[str] = []
    for rel in overrides.render_bundle(args.out, args.sets, args.fmt, notes):
        print(args.out / rel)
    for note in notes:
        print(f"specwatch mixin: note: {note}", file=sys.stderr)
    return 0
