"""Shared helpers for the mixin tests: where the generated files are, every PromQL expression
they hold, the metric names those expressions read, and the metric names each source produces.

Why one module: the dashboard tests, the rule tests and the end-to-end smoke test must agree on
what "an expression of the mixin" and "a metric we know" mean; keeping the extraction in one
place means a new panel or rule is checked by every test without being listed anywhere.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser
import yaml

REPO = Path(__file__).resolve().parents[1]
ALERTS_YAML = REPO / "alerts" / "specwatch-alerts.yaml"
RULES_YAML = REPO / "alerts" / "specwatch-rules.yaml"
DASHBOARD_FILES = sorted((REPO / "dashboards").glob("*.json"))
FIXTURES = REPO / "tests" / "fixtures"

# Series Prometheus itself writes: scrape health and the alert state.
PROMETHEUS_METRICS = frozenset({"up", "scrape_duration_seconds", "ALERTS"})

# Series the mixin reads that the exporter does not produce yet. A name leaves this list when
# the exporter's metrics reference documents it (a test enforces that).
NOT_YET_EXPORTED: frozenset[str] = frozenset()

# vLLM names from before 0.11 that the dashboards read as a fallback (`new or old`), so that
# a panel keeps data on an older server. vLLM's V1 metrics migration renamed them:
# vllm:gpu_cache_usage_perc -> vllm:kv_cache_usage_perc, and vllm:time_per_output_token_seconds
# -> vllm:request_time_per_output_token_seconds (plus vllm:inter_token_latency_seconds).
OLDER_VLLM_METRICS = frozenset({
    "vllm:gpu_cache_usage_perc",
    "vllm:time_per_output_token_seconds_bucket",
    "vllm:time_per_output_token_seconds_count",
    "vllm:time_per_output_token_seconds_sum",
})

_REFERENCE_ROW = re.compile(r"^\| `([a-z_:]+)` \| (gauge|counter|histogram|summary|info) \|")


def exporter_metrics() -> frozenset[str]:
    """The exporter's series as its metrics reference (docs/metrics.md) documents
    them: the one place the exporter's names are listed for users. Histograms expand to their
    _bucket/_count/_sum series."""
    page = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    section = page.split("\n## ", 1)[0]  # the table, before the method notes
    names: set[str] = set()
    for line in section.splitlines():
        m = _REFERENCE_ROW.match(line)
        if not m:
            continue
        name, kind = m.groups()
        if kind in ("histogram", "summary"):
            names.update(f"{name}{suffix}" for suffix in ("_bucket", "_count", "_sum"))
        else:
            names.add(name)
    return frozenset(names)


_SAMPLE_NAME = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{| )")


def vllm_metrics() -> frozenset[str]:
    """Every sample name a real vLLM server exposed (the recorded vLLM 0.32 pages) plus the
    vLLM 0.33 page built from vLLM's metric definitions."""
    names: set[str] = set()
    pages = sorted((FIXTURES / "vllm-0.32-cpu-ngram").glob("*.prom"))
    pages.append(FIXTURES / "constructed" / "vllm-0.33-spec-decode.prom")
    for page in pages:
        for line in page.read_text(encoding="utf-8").splitlines():
            m = _SAMPLE_NAME.match(line)
            if m and m.group(1).startswith("vllm:"):
                names.add(m.group(1))
    return frozenset(names)


#: Pages of the other engines whose counters the recording rules read: SGLang (constructed
#: from its definitions) and the TensorRT-LLM and llama.cpp sequences.
ENGINE_PAGES = ("constructed/sglang-0.5.23-spec.prom", "engines-constructed/trtllm/*.txt",
                "engines-constructed/llamacpp/*.txt")


def engine_metrics() -> frozenset[str]:
    """Every sample name on the SGLang, TensorRT-LLM and llama.cpp fixture pages."""
    names: set[str] = set()
    for pattern in ENGINE_PAGES:
        for page in sorted(FIXTURES.glob(pattern)):
            for line in page.read_text(encoding="utf-8").splitlines():
                m = _SAMPLE_NAME.match(line)
                if m:
                    names.add(m.group(1))
    return frozenset(names)


def load_rule_file(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def recorded_metrics() -> frozenset[str]:
    rules = load_rule_file(RULES_YAML)
    return frozenset(r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r)


def load_dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in DASHBOARD_FILES}


def panels(dashboard: dict) -> Iterator[dict]:
    """Every panel, including those nested in collapsed rows."""
    for p in dashboard.get("panels", []):
        yield p
        yield from p.get("panels", [])


def rule_exprs(path: Path) -> Iterator[tuple[str, str]]:
    for g in load_rule_file(path)["groups"]:
        for r in g["rules"]:
            yield f"{path.name}: {r.get('alert') or r.get('record')}", r["expr"]


_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.*),\s*(?P<label>[a-zA-Z_]\w*)\)$")


def dashboard_exprs(name: str, dashboard: dict) -> Iterator[tuple[str, str]]:
    """(where, expr) for every query: panel targets, annotation queries, and the series
    selector of every label_values() variable."""
    for p in panels(dashboard):
        for t in p.get("targets", []):
            yield f"{name}: panel {p['title']!r} ref {t.get('refId')}", t["expr"]
    for a in dashboard.get("annotations", {}).get("list", []):
        if a.get("expr"):
            yield f"{name}: annotation {a['name']!r}", a["expr"]
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            m = _LABEL_VALUES.match(v["query"])
            assert m, f"{name}: variable {v['name']}: unsupported query {v['query']!r}"
            yield f"{name}: variable {v['name']!r}", m.group("selector")


def all_mixin_exprs() -> list[tuple[str, str]]:
    exprs = list(rule_exprs(RULES_YAML)) + list(rule_exprs(ALERTS_YAML))
    for name, d in load_dashboards().items():
        exprs.extend(dashboard_exprs(name, d))
    return exprs


_GRAFANA_VARS = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
# Values Grafana's own interval variables stand for, for parsing only.
_INTERVALS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
# Variables whose values are numbers (the queries read them as such).
_NUMBERS = {"quantile_bounds": "1"}


def substitute_grafana_vars(expr: str) -> str:
    """Replace Grafana variables by values of the right kind, so the text is plain PromQL."""

    def repl(m: re.Match) -> str:
        var = m.group(1) or m.group(2)
        return _INTERVALS.get(var) or _NUMBERS.get(var, "x")

    return _GRAFANA_VARS.sub(repl, expr)


def substitute_target_vars(expr: str, target: str, window: str) -> str:
    """A dashboard query as Grafana sends it with one exporter target selected: every model,
    engine and vLLM instance, the mean statistic, `window` as both the exporter window and
    `$__rate_interval` (longest variable names first, so `$window` never eats a prefix)."""
    values = {"datasource": "prometheus", "job": "specwatch", "vllm_job": "vllm",
              "target": target, "model_name": ".+", "vllm_instance": ".+", "engine": ".+",
              "window": window, "statistic": "mean", "quantile_bounds": "1",
              "__rate_interval": window}
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return expr


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool not found: `make setup` installs Debian's prometheus package"
    return path


def promtool_check_exprs(
    exprs: list[tuple[str, str]], tmp_dir: Path
) -> subprocess.CompletedProcess:
    """Parse every expression with Prometheus' own parser: each becomes a recording rule of a
    throwaway rule file that `promtool check rules` loads (it rejects any that do not parse)."""
    rules = [
        {"record": f"specwatch_expr_check_{i}", "expr": substitute_grafana_vars(expr)}
        for i, (_, expr) in enumerate(exprs)
    ]
    path = tmp_dir / "exprs.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "exprs", "rules": rules}]}), "utf-8")
    return subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )


def _walk(node) -> Iterator:
    yield node
    for attr in ("expr", "lhs", "rhs", "param", "vector_selector"):
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, (str, int, float)):
            yield from _walk(child)
    if isinstance(node, promql_parser.Call):
        for arg in node.args:
            yield from _walk(arg)


def parse(expr: str):
    return promql_parser.parse(substitute_grafana_vars(expr))


def metric_names(expr: str) -> set[str]:
    """Names of every series an expression selects."""
    names = set()
    for node in _walk(parse(expr)):
        if isinstance(node, promql_parser.VectorSelector):
            name = node.name
            if not name:
                for m in node.matchers.matchers:
                    if m.name == "__name__":
                        name = m.value
            assert name, f"selector without a metric name in {expr!r}"
            names.add(name)
    return names


COUNTER_SUFFIXES = ("_total", "_count", "_sum", "_bucket")
RATE_FUNCTIONS = frozenset({"rate", "irate", "increase"})


def counters_outside_rate(expr: str) -> set[str]:
    """Counter series (by name suffix) read other than through rate/irate/increase."""
    found: set[str] = set()

    def visit(node, in_rate: bool) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if not in_rate and node.name.endswith(COUNTER_SUFFIXES):
                found.add(node.name)
            return
        if isinstance(node, promql_parser.Call):
            inside = in_rate or node.func.name in RATE_FUNCTIONS
            for arg in node.args:
                visit(arg, inside)
            return
        if isinstance(node, promql_parser.MatrixSelector):
            visit(node.vector_selector, in_rate)
            return
        for attr in ("expr", "lhs", "rhs", "param"):
            child = getattr(node, attr, None)
            if child is not None and not isinstance(child, (str, int, float)):
                visit(child, in_rate)

    visit(parse(expr), False)
    return found


COMPARISONS = (">", "<")


@dataclass(frozen=True)
class Signal:
    alert: str
    metric: str
    op: str  # "<" or ">": the alert's condition is `metric op threshold`
    window: str | None  # the rule's `window` matcher; None where it selects none
    threshold: float


def selectors(expr: str) -> list[Any]:
    """Every vector selector of a PromQL expression (Grafana variables substituted)."""
    return [n for n in _walk(parse(expr)) if isinstance(n, promql_parser.VectorSelector)]


def _selector(node: Any) -> Any | None:
    """The one vector selector under ``node`` (through functions such as last_over_time)."""
    found = [n for n in _walk(node) if isinstance(n, promql_parser.VectorSelector)]
    return found[0] if len(found) == 1 else None


def window_of(selector: Any) -> str | None:
    """The value of a selector's `window` matcher (None without one)."""
    values = [m.value for m in selector.matchers.matchers if m.name == "window"]
    return values[0] if values else None


def _signals(alert: str, node: Any) -> list[Signal]:
    if isinstance(node, promql_parser.ParenExpr):
        return _signals(alert, node.expr)
    if not isinstance(node, promql_parser.BinaryExpr):
        return []
    op = str(node.op).strip().lower()
    if op in ("and", "unless"):
        return _signals(alert, node.lhs)
    if op == "or":
        return _signals(alert, node.lhs) + _signals(alert, node.rhs)
    sel = _selector(node.lhs)
    if op in COMPARISONS and sel is not None and isinstance(node.rhs, promql_parser.NumberLiteral):
        return [Signal(alert, sel.name, op, window_of(sel), float(node.rhs.val))]
    return []


def alert_signals() -> list[Signal]:
    """What each alert acts on, from the rendered rules: the series its expression compares
    with a number (`<` or `>`; a condition joined with `and` or `unless` only gates it, `or`
    joins two sides of one signal), with the window the rule selects."""
    out = []
    for g in load_rule_file(ALERTS_YAML)["groups"]:
        for r in g["rules"]:
            if "alert" in r:
                out.extend(_signals(r["alert"], parse(r["expr"])))
    return out
