"""The bundle's rules and dashboards with the user's selectors and thresholds, for a user who
installed the wheel and has no Jsonnet tooling (`specwatch mixin`, whose options are in
:mod:`specwatch.cli.mixin`).

A ``--set KEY=VALUE`` names a dotted path into the mixin's ``_config`` (config.libsonnet: the
same keys, the same meaning), so it is what a Jsonnet user writes as ``_config+:: {...}``. A
key that holds dots itself (the file names under ``dashboardTitles``) is written as it is:
the longest key that exists is taken at each level. The
two selectors are separate keys on purpose: ``vllmSelector`` picks vLLM's own series (the
recording rules, the latency panels), ``exporterSelector`` picks specwatch's ``sd_*`` series
(every SD alert); they are different scrape jobs, so one value for both leaves one side empty.

VALUE takes the type of the key's default, so that a shell-quoted selector stays a string and
``0.35`` stays a number, and is then checked for what the key means (`specwatch.mixin.validate`:
a selector is a PromQL matcher list, a duration a Prometheus duration, a threshold a number in
range). A bad key or value is one error naming the key and what was expected (exit 2), and
nothing is written. The rule files are checked with ``promtool check rules`` before they are
written when promtool is installed. The files written are the same three the repository
commits (``alerts/specwatch-alerts.yaml``, ``alerts/specwatch-rules.yaml``, ``dashboards/*.json``),
rendered by the same code (`specwatch.mixin.render`).

The render also writes the bundle's rule tests (``alerts/tests/*.yaml``: each alert firing
and silent) carried over to the same values (`specwatch.mixin.ruletests`: the user's selectors,
URLs, thresholds, switched-off alerts), and ``mixin test DIR`` runs those:
it passes for rules that behave as the bundle's do, and names the alert whose rule does not.
"""

from __future__ import annotations

import json
import math
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specwatch import __version__
from specwatch.common.errors import ConfigError
from specwatch.mixin import kubernetes, render, ruletests, validate

# Keys that are not in `_config` but that a user may try; each gets its own explanation.
NOT_A_KEY = {
    "selector": "there is no single selector: vllmSelector picks vLLM's own series (the "
                "scrape job of your inference servers, default job=\"vllm\") and "
                "exporterSelector picks specwatch's sd_* series (the scrape job of specwatch, "
                "default job=\"specwatch\"); set the one you mean",
}


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


def _resolve(key: str, config: dict[str, Any]) -> tuple[list[str], Any]:
    """The config path a dotted ``key`` names and its default value.

    A key may itself contain dots (``dashboardTitles.specwatch-sd-overview.json``): at each
    level the longest run of parts that is a key there is taken, so a file name is written as
    it is."""
    parts = key.split(".")
    path: list[str] = []
    node: Any = config
    i = 0
    while i < len(parts):
        if not isinstance(node, dict):
            raise ConfigError(f"--set {key}: {'.'.join(path)} is a value, not a group of "
                              "settings")
        for j in range(len(parts), i, -1):
            candidate = ".".join(parts[i:j])
            if candidate in node:
                path.append(candidate)
                node = node[candidate]
                i = j
                break
        else:
            where = ".".join(path) or "_config"
            known = ", ".join(sorted(node))
            # A group whose keys have no dots is named by the one part that is not a key.
            missing = ".".join(parts[i:]) if any("." in k for k in node) else parts[i]
            raise ConfigError(f"--set {key}: {where} has no key {missing!r} "
                              f"(known: {known})")
    return path, node


def parse_sets(sets: list[str], config: dict[str, Any]) -> dict[str, Any]:
    """``["a.b=1", ...]`` -> the nested overrides dict `render` merges into ``_config``,
    each value typed as its key's default and checked (`specwatch.mixin.validate`)."""
    overrides: dict[str, Any] = {}
    for item in sets:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        if key in NOT_A_KEY:
            raise ConfigError(f"--set {key}: {NOT_A_KEY[key]}")
        path, default = _resolve(key, config)
        value = _typed(key, text, default)
        validate.check_value(key, value, path)
        target = overrides
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = value
    validate.check_selectors(overrides.get("vllmSelector", config["vllmSelector"]),
                             overrides.get("exporterSelector", config["exporterSelector"]))
    return overrides


def promtool_check(files: dict[str, str]) -> None:
    """``promtool check rules`` on the rendered rule files (relative path -> text) when
    promtool is installed; a ConfigError with its first complaint otherwise."""
    promtool = shutil.which("promtool")
    if promtool is None:
        return
    rule_files = {rel: text for rel, text in files.items()
                  if rel in (render.ALERTS_FILE, render.RULES_FILE)}
    with tempfile.TemporaryDirectory(prefix="specwatch-mixin-") as tmp:
        paths = []
        for rel, text in rule_files.items():
            path = Path(tmp) / Path(rel).name
            path.write_text(text, encoding="utf-8")
            paths.append(str(path))
        try:
            result = subprocess.run([promtool, "check", "rules", *paths], capture_output=True,
                                    text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"promtool check rules could not run: {exc}") from None
    if result.returncode != 0:
        text = (result.stderr + result.stdout).replace(tmp + "/", "")
        lines = [ln.strip() for ln in text.splitlines()
                 if ln.strip() and ln.strip() not in ("SUCCESS", "FAILED:")
                 and not ln.startswith("Checking")]
        first = lines[0] if lines else f"exit status {result.returncode}"
        raise ConfigError(f"the rendered rules fail `promtool check rules` ({first}); "
                          "nothing written: check the --set values")


FORMATS = ("files", "kubernetes")


def render_bundle(out: Path, sets: Sequence[str], fmt: str = "files",
                  notes: list[str] | None = None) -> list[str]:
    """Render the rules and dashboards with the ``--set`` overrides under ``out``; the
    relative paths written (nothing is written when a value or the rules are bad). What the
    user should know about the output is appended to ``notes``.

    ``files``: the rule files, the dashboards and the rule tests carried over to the values;
    ``kubernetes``: PrometheusRule objects, dashboard ConfigMaps and their kustomization
    (`specwatch.mixin.kubernetes`), each checked against its vendored schema."""
    notes = [] if notes is None else notes
    overrides = parse_sets(list(sets), render.default_config())
    command = "specwatch mixin render --out DIR" + (
        f" --format {fmt}" if fmt != "files" else "") + "".join(
        f" --set {shlex.quote(s)}" for s in sets)
    header = (f"# Generated by `{command}` from the specwatch mixin"
              f" (specwatch {__version__}). Do not edit: render again.\n")
    files = render.render_files(overrides, header)
    promtool_check(files)
    if fmt == "kubernetes":
        braced = command.replace("{", "{{").replace("}", "}}")
        files = kubernetes.manifests(
            files, f"# Generated by `{braced}` from the specwatch mixin (specwatch "
                   f"{__version__}; {{source}}). Do not edit: render again.\n")
    else:
        try:
            files.update(ruletests.render_tests(overrides))
        except ConfigError as exc:  # the rules stand; only their tests cannot follow
            notes.append(f"rule tests not written ({exc}); `mixin test` runs the bundle's "
                         "tests for the default configuration")
    try:
        return render.write_rendered(out, files)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot write: {exc.strerror or exc}") from exc


@dataclass(frozen=True)
class RuleTests:
    """The outcome of the bundle's promtool unit tests against one folder of rules."""

    output: str  # promtool's report, temporary paths removed
    files: int  # number of rule test files run
    rules_dir: Path
    passed: bool


def run_rule_tests(folder: Path | None) -> RuleTests:
    """``promtool test rules`` against ``folder``/alerts (a render's output) with the tests
    that render wrote for its values (the bundle's own, for a folder without them), or the
    packaged rules and tests for None."""
    promtool = shutil.which("promtool")
    if promtool is None:
        raise ConfigError("mixin test needs promtool (Prometheus' tool; Debian/Ubuntu: apt-get "
                          "install prometheus, or from a Prometheus release) on the PATH")
    bundle = render.mixin_dir()
    rules_dir = (folder / "alerts") if folder else (bundle / "alerts")
    tests = (ruletests.tests_in(folder) if folder else []) or ruletests.tests_in(bundle)
    if not tests:
        raise ConfigError(f"no rule tests in {bundle / 'alerts' / 'tests'}: a bundle without "
                          "its tests (reinstall specwatch)")
    for name in (render.ALERTS_FILE, render.RULES_FILE):
        if not (rules_dir / Path(name).name).is_file():
            raise ConfigError(f"{rules_dir / Path(name).name}: no such file; expected the "
                              "folder a `specwatch mixin render --out DIR` wrote")
    # The tests name their rule files relative to themselves (../specwatch-alerts.yaml):
    # lay them out beside copies of the rules under test.
    with tempfile.TemporaryDirectory(prefix="specwatch-mixin-test-") as tmp:
        alerts = Path(tmp) / "alerts"
        (alerts / "tests").mkdir(parents=True)
        for name in (render.ALERTS_FILE, render.RULES_FILE):
            shutil.copyfile(rules_dir / Path(name).name, alerts / Path(name).name)
        for test in tests:
            shutil.copyfile(test, alerts / "tests" / test.name)
        result = subprocess.run(
            [promtool, "test", "rules", *sorted(str(p) for p in (alerts / "tests").glob("*"))],
            capture_output=True, text=True, timeout=300, cwd=tmp)
    output = (result.stdout + result.stderr).replace(tmp + "/", "")
    return RuleTests(output, len(tests), rules_dir, result.returncode == 0)
