"""The bundle's promtool rule tests (``alerts/tests/*.yaml``) rendered for the user's ``--set``
values, so that `specwatch mixin test` checks the user's rules against the same behaviour the
bundled tests pin, and fails only where a rule really behaves differently.

Why: the tests are written for the default configuration. A render with another selector, URL
or threshold changes the labels of the input series the rules select and the text of the
annotations the tests expect, so every test would fail on text alone and a broken rule would
hide among them. Here each test is carried over to the user's configuration:

- input series: a series of the default vLLM or specwatch job gets labels that the user's
  selector matches (``=`` sets the label, ``=~`` a string the regex matches, ``!=``/``!~`` a
  value it does not), and the expected labels follow: whole-series results (those that keep
  ``instance``) carry every such label, aggregations keep ``job`` only;
- the recording rules' names follow ``rateWindow`` (``..._rate5m`` -> ``..._rate10m``);
- expected alert labels: the rule's own labels (``severity``, ``alertLabels``) as rendered;
- expected annotations: each literal part of the annotation template that the user's values
  changed (a threshold, a duration, ``grafanaURL``, ``runbookURLPattern``) is replaced by its
  new text, and a label value printed by the template (``job``) by the new value; an
  annotation the render no longer has (``grafanaURL=''``) is no longer expected;
- a changed ``threshold``: the input series the alert compares with it are scaled by new /
  old threshold (each input keeps its side of the threshold), and the value the annotation
  prints follows;
- tests of an alert switched off (``enabled=false``) are left out.

What is not carried over: evaluation times and durations. A ``for``, a window or a
``minArrivalRate`` moved past a test's input fails that test, naming the alert that now
behaves differently; that is the point of the test.
"""

from __future__ import annotations

import re
import urllib.parse
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from specwatch.common.errors import ConfigError
from specwatch.engines import registry
from specwatch.mixin import render, validate

TESTS_DIR = "alerts/tests"
_SERIES = re.compile(r"\s*([^{\s]*)\s*(?:\{(.*)\})?\s*", re.S)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_ACTION = re.compile(r"(\{\{.*?\}\})", re.S)
#: The configured selectors: the exporter's and one per engine family (`<family>Selector`).
_SELECTORS = ("exporterSelector", *(f"{family}Selector" for family in registry.families()))


def _unquote(quoted: str) -> str:
    body = quoted[1:-1]
    return body if quoted[0] == "`" else re.sub(r"\\(.)", r"\1", body)


# Regex pieces and a short text each matches: enough for the selectors people write
# (job=~"vllm-.*", namespace=~"llm-(a|b)"); every candidate is checked by a full match.
_SIMPLE = ((".*", ""), (".+", "x"), ("\\d+", "0"), ("\\d", "0"), ("\\w+", "a"),
           ("[0-9]+", "0"), ("[a-z]+", "a"), ("[a-z0-9]+", "a"), ("\\", ""))


def _full(pattern: str, text: str) -> bool:
    """Whether ``pattern`` (Prometheus' RE2 syntax, read by Python's re) matches all of
    ``text``; a ConfigError for a pattern Python cannot read."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # RE2's [[:alpha:]] reads as a set
        try:
            return re.fullmatch(pattern, text) is not None
        except re.error as exc:
            raise ConfigError(f"mixin test: cannot build a label value for the regex "
                              f"{pattern!r} ({exc}); the rule tests need one") from None


def _example(pattern: str) -> str | None:
    """A short string the regex ``pattern`` fully matches, or None."""
    simple = pattern
    for piece, text in _SIMPLE:
        simple = simple.replace(piece, text)
    simple = re.sub(r"\(\?:|[()^$]", "", simple)
    for candidate in (simple, *simple.split("|"), "", "x"):
        if _full(pattern, candidate):
            return candidate
    return None


def labels_for(selector: str, base: Mapping[str, str]) -> dict[str, str]:
    """``base`` changed as little as needed for ``selector`` to match it."""
    labels = dict(base)
    for name, op, quoted in validate.matchers(selector):
        name, value, current = name.strip('"'), _unquote(quoted), labels.get(name.strip('"'), "")
        if op == "=":
            labels[name] = value
        elif op == "!=" and current == value:
            labels[name] = f"{value}-other" if value else "other"
        elif op == "=~" and not _full(value, current):
            example = _example(value)
            if example is None:
                raise ConfigError(f"mixin test: no label value matches {name}=~{quoted} of the "
                                  f"selector {selector!r}; the rule tests need one")
            labels[name] = example
        elif op == "!~" and _full(value, current):
            for candidate in (f"{current}-other", "other", "x0"):
                if not _full(value, candidate):
                    labels[name] = candidate
                    break
        if labels.get(name) == "":
            del labels[name]
    return labels


def _parse_series(text: str) -> tuple[str, dict[str, str]] | None:
    m = _SERIES.fullmatch(text)
    if m is None:
        return None
    body, labels, pos = m.group(2) or "", {}, 0
    while pos < len(body):
        lm = _LABEL.match(body, pos)
        if lm is None:
            return None
        labels[lm.group(1)] = re.sub(r"\\(.)", r"\1", lm.group(2))
        pos = lm.end()
    return m.group(1), labels


def _format_series(metric: str, labels: Mapping[str, str]) -> str:
    inner = ", ".join(f'{k}="' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
                      for k, v in labels.items())
    return f"{metric}{{{inner}}}"


class _Carry:
    """The changes from the default configuration to the user's, applied to one test file."""

    def __init__(self, overrides: Mapping[str, Any]) -> None:
        default = render.render(None)
        user = render.render(overrides)
        self.jobs: dict[str, dict[str, str]] = {}  # default job -> the user's labels
        for key in _SELECTORS:
            d_sel, u_sel = default["config"][key], user["config"][key]
            (job,) = [_unquote(q) for n, op, q in validate.matchers(d_sel) if n == "job"]
            if d_sel != u_sel:
                self.jobs[job] = labels_for(u_sel, {"job": job})
        d_win, u_win = default["config"]["rateWindow"], user["config"]["rateWindow"]
        self.rate_names = (re.compile(rf"(?<=[_:])rate{d_win}\b"), f"rate{u_win}") if (
            d_win != u_win) else None
        self.default_rules = _alerts(default["alerts"])
        self.user_rules = _alerts(user["alerts"])
        self.records = {r["record"]: r["expr"] for g in user["rules"]["groups"]
                        for r in g["rules"] if "record" in r}
        # metric -> factor: the series an alert compares with its threshold, scaled by
        # new / old threshold, so that each test input keeps its side of the threshold.
        self.scale: dict[str, float] = {}
        for alert, cfg in default["config"]["alerts"].items():
            old_t = cfg.get("threshold")
            new_t = user["config"]["alerts"][alert].get("threshold")
            if alert not in self.default_rules or not old_t or not new_t or old_t == new_t:
                continue
            m = re.search(rf"([a-zA-Z_:][\w:]*)\{{[^}}]*\}}[^<>=\n]*?[<>]=?\s*{old_t:g}\b",
                          self.default_rules[alert]["expr"])
            if m and f"{new_t:g}" in self.user_rules.get(alert, {}).get("expr", ""):
                self.scale[m.group(1)] = new_t / old_t

    def series(self, text: str, expr: str | None = None, query: str = "") -> str:
        """An input series (``expr`` None: every label kept) or an expected sample of the
        rule ``expr``, for the user's selectors. A sample without a name (the test's
        ``query`` wraps the recorded series in a function) keeps what ``query`` keeps."""
        parsed = _parse_series(text)
        if parsed is None:
            return self.name(text)
        metric, labels = parsed
        if expr is None:
            expr = self.records.get(self.name(metric), "") if metric else query
        return _format_series(self.name(metric), self.labels(labels, expr))

    def name(self, text: str) -> str:
        return self.rate_names[0].sub(self.rate_names[1], text) if self.rate_names else text

    def labels(self, labels: Mapping[str, str], expr: str) -> dict[str, str]:
        """``labels`` of a default-job series with the user's selector labels, those of
        them that ``expr`` keeps in its result."""
        new = self.jobs.get(labels.get("job", "")) if "job" in labels else None
        if new is None:
            return dict(labels)
        out = {k: v for k, v in labels.items() if k != "job"}
        return {**out, **{k: v for k, v in new.items() if k == "job" or self.keeps(expr, k)}}

    def keeps(self, expr: str, label: str, seen: frozenset[str] = frozenset()) -> bool:
        """`keeps` for ``expr`` and every recording rule it reads, recursively."""
        if not keeps(expr, label):
            return False
        return all(self.keeps(rec, label, seen | {name}) for name, rec in self.records.items()
                   if name not in seen and re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])",
                                                     expr))

    def exp_labels(self, alert: str, labels: Mapping[str, Any]) -> dict[str, Any]:
        out = self.labels({k: str(v) for k, v in labels.items()},
                          self.user_rules[alert]["expr"])
        for key in self.default_rules[alert].get("labels", {}):
            out.pop(key, None)
        return {**out, **self.user_rules[alert].get("labels", {})}

    def annotations(self, alert: str, expected: Mapping[str, Any],
                    job: str | None) -> dict[str, Any]:
        d_ann = self.default_rules[alert].get("annotations", {})
        u_ann = self.user_rules[alert].get("annotations", {})
        out = {}
        for key, text in expected.items():
            if key not in u_ann:
                continue
            out[key] = _carry_text(str(text), d_ann.get(key, ""), u_ann[key], job,
                                   self.jobs.get(job or "", {}).get("job"))
        return out


def keeps(expr: str, label: str) -> bool:
    """Whether the result of PromQL ``expr`` keeps a label its input series carry: not
    through ``absent()``, nor past an aggregation (``by``/``without``) or a one-to-one
    match (``on``/``ignoring``) that drops it. Set operations (``and on (...)``) keep the
    left side's labels whole. The input series an expression is read with being the
    bundle's own rules, this is what their results carry."""
    if expr is None:
        return True
    if re.search(r"\babsent(?:_over_time)?\s*\(", expr):
        return False
    for m in re.finditer(r"\b(on|ignoring|by|without)\s*\(([^)]*)\)", expr):
        if re.search(r"\b(?:and|or|unless)\s*$", expr[:m.start()]):
            continue
        names = {n.strip() for n in m.group(2).split(",")}
        if (m.group(1) in ("on", "by")) != (label in names):
            return False
    return True


def _alerts(rule_file: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rule_file["groups"] for r in g["rules"] if "alert" in r}


def _carry_text(text: str, old: str, new: str, job: str | None, new_job: str | None) -> str:
    """An expected annotation written for template ``old`` carried over to template ``new``."""
    old_parts, new_parts = _ACTION.split(old), _ACTION.split(new)
    if old_parts[1::2] != new_parts[1::2]:
        return text  # another template, not other values: left for promtool to judge
    for before, after in zip(old_parts[0::2], new_parts[0::2], strict=True):
        if before != after and before:
            text = text.replace(before, after)
    if job and new_job and job != new_job:
        for i in range(1, len(new_parts), 2):
            action = new_parts[i]
            if "$labels.job" not in action or re.match(r"\{\{-?\s*(with|if|range)\b", action):
                continue
            prefix = new_parts[i - 1][-12:]
            if not prefix:
                continue
            quote = (lambda v: urllib.parse.quote_plus(v)) if "urlquery" in action else str
            text = text.replace(prefix + quote(job), prefix + quote(new_job))
    return text


_NUMBER = r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"
# promtool's expanding notation: a, a+bxn, a-bxn, axn, _ (no sample), stale.
_STEP = re.compile(rf"({_NUMBER})(?:([-+])({_NUMBER}))?(x\d+)?")


def _metric(series: str) -> str:
    return series.split("{", 1)[0].strip()


def _short(value: float) -> str:
    """A scaled input value, rounded past float noise (0.2625, not 0.26249999999999996)."""
    return f"{value:.10g}"


def _scaled_values(values: str, factor: float) -> str:
    out = []
    for token in values.split():
        m = _STEP.fullmatch(token)
        if m is None:
            out.append(token)  # _ or stale
            continue
        start, sign, step, times = m.groups()
        text = _short(float(start) * factor)
        if sign:
            text += sign + _short(float(step) * factor)
        out.append(text + (times or ""))
    return " ".join(out)


def _go_format(action: str, value: float) -> str | None:
    """``$value`` as the template ``action`` prints it, for the forms the bundle uses."""
    if "humanizePercentage" in action:
        percent = value * 100
        return f"{percent:.4g}%" if 1 <= abs(percent) < 1000 or percent == 0 else None
    m = re.search(r'printf\s+"%(\.\d+[fg])"', action)
    return f"{value:{m.group(1)}}" if m else None


def _scaled_text(text: str, template: str, lhs: str, scale: Mapping[str, float]) -> str:
    """Values printed in an expected annotation, for inputs scaled by ``scale`` (metric ->
    factor): ``$value`` (the alert's compared series ``lhs``) and ``.Value`` of a query's
    first sample (the metric that query names)."""
    parts = _ACTION.split(template)
    source = ""
    for i in range(1, len(parts), 2):
        action, prefix = parts[i], parts[i - 1][-12:]
        queried = re.search(r'printf\s+"([a-zA-Z_:][\w:]*)\{', action)
        if queried and "query" in action:
            source = queried.group(1)
        metric = lhs if "$value" in action else source if ".Value" in action else ""
        factor = scale.get(metric)
        if factor is None or not prefix:
            continue
        percent = "humanizePercentage" in action

        def scaled(m: re.Match[str], action: str = action, percent: bool = percent,
                   factor: float = factor) -> str:
            old = float(m.group(2)) / (100 if percent else 1)
            new = _go_format(action, float(_short(old * factor)))
            return m.group(1) + new if new is not None else m.group(0)

        text = re.sub(rf"({re.escape(prefix)})({_NUMBER}){'%' if percent else ''}", scaled,
                      text)
    return text


def _carry_test(test: dict[str, Any], carry: _Carry) -> dict[str, Any] | None:
    for series in test.get("input_series", []):
        factor = carry.scale.get(_metric(series["series"]))
        if factor is not None:
            series["values"] = _scaled_values(str(series["values"]), factor)
        series["series"] = carry.series(series["series"], "")
    kept = []
    for case in test.get("alert_rule_test", []):
        alert = case["alertname"]
        if alert not in carry.user_rules:
            continue  # switched off
        for exp in case.get("exp_alerts") or []:
            labels = exp.get("exp_labels") or {}
            job = labels.get("job")
            exp["exp_labels"] = carry.exp_labels(alert, labels)
            if "exp_annotations" in exp:
                exp["exp_annotations"] = carry.annotations(alert, exp["exp_annotations"], job)
                if carry.scale:
                    lhs = _metric(re.sub(r"^[\w\s(]*?\(", "", carry.user_rules[alert]["expr"]))
                    exp["exp_annotations"] = {
                        k: _scaled_text(str(v), carry.user_rules[alert]["annotations"].get(
                            k, ""), lhs, carry.scale) for k, v in exp["exp_annotations"].items()}
        kept.append(case)
    if "alert_rule_test" in test:
        test["alert_rule_test"] = kept
    for case in test.get("promql_expr_test", []):
        case["expr"] = carry.name(case["expr"])
        for sample in case.get("exp_samples") or []:
            sample["labels"] = carry.series(sample["labels"], None, case["expr"])
    if not kept and not test.get("promql_expr_test"):
        return None
    return test


def render_tests(overrides: Mapping[str, Any]) -> dict[str, str]:
    """``alerts/tests/<file>.yaml`` -> text, the bundled rule tests for ``overrides``: the
    files unchanged for the default configuration."""
    source = render.mixin_dir() / TESTS_DIR
    paths = sorted(source.glob("*.yaml"))
    if not paths:
        raise ConfigError(f"no rule tests in {source}: a bundle without its tests "
                          "(reinstall specwatch)")
    if not overrides:
        return {f"{TESTS_DIR}/{p.name}": p.read_text(encoding="utf-8") for p in paths}
    carry = _Carry(overrides)
    files = {}
    for path in paths:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        tests = [t for t in (_carry_test(t, carry) for t in doc.get("tests", [])) if t]
        if not tests:
            continue
        doc["tests"] = tests
        header = (f"# The bundled rule tests of {path.name}, carried over to the values this\n"
                  "# folder was rendered with (specwatch.mixin.ruletests). Do not edit: render "
                  "again.\n")
        files[f"{TESTS_DIR}/{path.name}"] = header + yaml.safe_dump(
            doc, sort_keys=False, allow_unicode=True, width=1_000_000)
    return files


def tests_in(folder: Path) -> list[Path]:
    """The rendered rule tests under ``folder`` (a render's output), sorted."""
    return sorted((folder / TESTS_DIR).glob("*.yaml"))
