"""The mixin's rules and alerts: generated files current, promtool-clean, unit-tested with
promtool for every alert (firing and silent cases), documented, and overridable from tests."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mixin_helpers import ALERTS_YAML, REPO, RULES_YAML, load_rule_file, promtool

from specwatch.common.errors import ConfigError
from specwatch.mixin import render as mixin

GENERATE = [sys.executable, str(REPO / "scripts" / "generate.py")]
TEST_FILES = sorted((REPO / "alerts" / "tests").glob("*.yaml"))
OVERRIDE_TESTS = REPO / "alerts" / "tests" / "overrides"
SEVERITIES = {"critical", "warning", "info"}


def _alerts() -> list[dict]:
    return [r for g in load_rule_file(ALERTS_YAML)["groups"] for r in g["rules"]]


def _alert(rule_file: dict, name: str) -> dict:
    return next(r for g in rule_file["groups"] for r in g["rules"] if r.get("alert") == name)


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


def _render_into(tmp_path: Path, overrides: dict) -> Path:
    """Render the mixin with overrides into tmp_path (alerts/ and dashboards/ below it)."""
    mixin.write_files(tmp_path, overrides)
    return tmp_path / "alerts"


# --- generated files -------------------------------------------------------------------------


def test_committed_generated_files_match_a_fresh_render(tmp_path):
    """CI fails when someone edits the Jsonnet and forgets `make generate` (or edits the output)."""
    proc = _run([*GENERATE, "--out-dir", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    fresh = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert fresh, "the renderer wrote nothing"
    for rel in fresh:
        committed = REPO / rel
        assert committed.is_file(), f"{rel} is generated but not committed: run `make generate`"
        assert committed.read_bytes() == (tmp_path / rel).read_bytes(), (
            f"{rel} is out of date: run `make generate` and commit the result"
        )


def test_check_mode_reports_edited_and_stale_files(tmp_path):
    """`make check-generated` names an edited output and an output the mixin no longer makes."""
    mixin.write_files(tmp_path)
    edited = tmp_path / mixin.ALERTS_FILE
    edited.write_text(edited.read_text() + "# hand edit\n")
    (tmp_path / "dashboards" / "old-dashboard.json").write_text("{}\n")
    proc = _run([*GENERATE, "--check", "--out-dir", str(tmp_path)])
    assert proc.returncode == 1
    assert f"{mixin.ALERTS_FILE}: differs from a fresh render" in proc.stderr
    assert "dashboards/old-dashboard.json: not produced by the mixin any more" in proc.stderr


def test_jsonnet_sources_are_jsonnetfmt_clean():
    """Sources follow jsonnetfmt with kubernetes-mixin's flags (Debian's jsonnetfmt)."""
    fmt = shutil.which("jsonnetfmt")
    assert fmt, "jsonnetfmt not found: `make setup` installs Debian's jsonnet package"
    sources = sorted(
        p
        for p in REPO.rglob("*sonnet")
        if ".venv" not in p.parts and p.suffix in (".libsonnet", ".jsonnet")
    )
    assert len(sources) >= 8
    flags = ["-n", "2", "--max-blank-lines", "2", "--string-style", "s", "--comment-style", "s"]
    proc = _run([fmt, *flags, "--test", *map(str, sources)])
    assert proc.returncode == 0, f"not jsonnetfmt-clean (run `make fmt-jsonnet`): {proc.stderr}"


# --- promtool ----------------------------------------------------------------------------------


def test_promtool_check_rules_with_lint():
    """Both rule files load in Prometheus with every lint check fatal."""
    cmd = [promtool(), "check", "rules", "--lint=all", "--lint-fatal"]
    proc = _run([*cmd, str(ALERTS_YAML), str(RULES_YAML)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == 2


def test_promtool_unit_tests_pass():
    """alerts/tests/*.yaml: every alert fires when it should, when it should not it stays silent."""
    assert len(TEST_FILES) >= 4
    proc = _run([promtool(), "test", "rules", *map(str, TEST_FILES)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(TEST_FILES)


@pytest.mark.parametrize(
    ("low", "test_file"),
    [({"source": "vllm"}, "vllm-source.yaml"), ({"measure": "rate"}, "rate-measure.yaml")],
)
def test_low_acceptance_variants_pass_their_promtool_tests(tmp_path, low, test_file):
    """With source 'vllm', the low-acceptance alert reads the α recorded from vLLM's
    per-position counters: it fires on sustained low acceptance, never on an idle server nor
    on a long draft whose rate alone is low. With measure 'rate' it reads vLLM's rate."""
    alerts_dir = _render_into(tmp_path, {"alerts": {"SDAcceptanceRateLow": low}})
    dest = alerts_dir / "tests" / "overrides"
    dest.mkdir(parents=True)
    shutil.copy(OVERRIDE_TESTS / test_file, dest)
    proc = _run([promtool(), "test", "rules", str(dest / test_file)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # And each variant's tests fail against the default rules (they test the variant).
    default_dir = _render_into(tmp_path / "default", {})
    (default_dir / "tests" / "overrides").mkdir(parents=True)
    shutil.copy(OVERRIDE_TESTS / test_file, default_dir / "tests" / "overrides")
    proc = _run([promtool(), "test", "rules",
                 str(default_dir / "tests" / "overrides" / test_file)])
    assert proc.returncode != 0, f"{test_file} passes against the default rules too"


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"alerts": {"SDAcceptanceRateLow": {"for": "9m"}}}, "fires at 9 minutes"),
        ({"alerts": {"SDAcceptanceRateLow": {"minArrivalRate": 0}}}, "pages on a trickle"),
        ({"alerts": {"SDAcceptanceRateLow": {"keepFiringFor": ""}}}, "resolves at once"),
    ],
)
def test_promtool_tests_catch_a_broken_low_acceptance_alert(tmp_path, overrides, why):
    """The unit tests are not vacuous: a rule that {why} makes them fail."""
    alerts_dir = _render_into(tmp_path, overrides)
    (alerts_dir / "tests").mkdir()
    test_file = alerts_dir / "tests" / "sd-acceptance-rate-low.yaml"
    shutil.copy(REPO / "alerts" / "tests" / "sd-acceptance-rate-low.yaml", test_file)
    proc = _run([promtool(), "test", "rules", str(test_file)])
    assert proc.returncode != 0, f"promtool tests still pass when the alert {why}"
    assert "FAILED" in proc.stdout + proc.stderr


def test_every_alert_has_firing_and_silent_promtool_cases():
    """Each alert has at least one test case where it fires and one where it must not."""
    firing: set[str] = set()
    silent: set[str] = set()
    for path in [*TEST_FILES, *sorted(OVERRIDE_TESTS.glob("*.yaml"))]:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for t in case.get("alert_rule_test", []):
                (firing if t.get("exp_alerts") else silent).add(t["alertname"])
    names = {a["alert"] for a in _alerts()}
    assert names - firing == set(), "alerts never tested firing"
    assert names - silent == set(), "alerts never tested staying silent"


# --- alert and rule conventions --------------------------------------------------------------


def test_alerts_follow_the_mixin_conventions():
    """CamelCase SD*/Specwatch* names, severity, `for`, a static summary sentence, a templated
    description, and a runbook_url pointing at this alert's section of runbook.md."""
    runbook = (REPO / "runbook.md").read_text()
    sections = set(re.findall(r"^## (\w+)$", runbook, re.MULTILINE))
    config = mixin.default_config()
    for a in _alerts():
        name = a["alert"]
        assert re.fullmatch(r"(SD|Specwatch)[A-Z][A-Za-z]+", name) and len(name) <= 40, name
        assert a["labels"]["severity"] in SEVERITIES, name
        assert re.fullmatch(r"\d+[smh]", a["for"]), name
        ann = a["annotations"]
        assert ann["summary"][0].isupper() and ann["summary"].endswith("."), name
        assert "{{" not in ann["summary"], f"{name}: summary must be static"
        assert len(ann["description"]) > 40, name
        assert ann["runbook_url"] == config["runbookURLPattern"] % name.lower(), name
        assert name in sections, f"{name}: no '## {name}' section in runbook.md"
    for g in load_rule_file(ALERTS_YAML)["groups"]:
        assert len(g["rules"]) <= 20 and len(g["name"]) <= 40


def test_alert_descriptions_carry_value_and_location():
    """Descriptions of per-series alerts quote the value and the labels that locate it."""
    for a in _alerts():
        desc = a["annotations"]["description"]
        if a["alert"] == "SDModelInvalid":  # the value is always 0; it quotes utilisation instead
            assert "sd_model_utilization" in desc and "$labels.model_name" in desc
        elif a["alert"].startswith("SD"):
            assert "$value" in desc and "$labels.model_name" in desc, a["alert"]
        elif a["alert"] != "SpecwatchAbsent":  # absent() has no labels to quote
            assert "$labels.instance" in desc, a["alert"]


def test_every_configured_alert_is_rendered_and_listed_in_the_docs():
    readme = (REPO / "docs" / "dashboards-alerts.md").read_text()
    configured = set(mixin.default_config()["alerts"])
    assert configured == {a["alert"] for a in _alerts()}
    for name in configured:
        assert f"`{name}`" in readme, f"{name} missing from docs/dashboards-alerts.md"


def test_low_acceptance_alert_reads_the_draft_length_independent_alpha():
    """SDAcceptanceRateLow compares the α (not vLLM's rate, which falls with k) with 0.4
    for 10m, and is a warning: low acceptance alone does not make requests slower."""
    (low,) = [a for a in _alerts() if a["alert"] == "SDAcceptanceRateLow"]
    assert low["labels"]["severity"] == "warning"
    assert low["for"] == "10m"
    assert re.search(r"sd_acceptance_alpha\{[^}]*\}\[2m\]\) < 0.4\n", low["expr"])
    assert "sd_acceptance_rate{" not in low["expr"]
    assert "$labels.method" in low["annotations"]["description"]
    rate = _alert(mixin.render_rules({"alerts": {"SDAcceptanceRateLow": {"measure": "rate"}}}),
                  "SDAcceptanceRateLow")
    assert "sd_acceptance_rate{" in rate["expr"] and "sd_acceptance_alpha" not in rate["expr"]


def _proves_slowdown(expr: str) -> bool:
    """The expression holds only where SD makes requests slower: the measured speedup's
    upper bound below 1, or a valid prediction's upper bound below 1."""
    measured = re.search(r"^sd_measured_speedup_upper\{[^}]*statistic=\"mean\"\} < 1\n", expr)
    predicted = (re.search(r"^sd_predicted_speedup_upper\{[^}]*\} < 1\n", expr)
                 and re.search(r"sd_model_valid\{[^}]*\} == 1\n", expr))
    return bool(measured or predicted)


def test_only_a_slowdown_pages():
    """The severity policy (config.libsonnet, runbook.md): critical only for SD that makes
    requests slower, measured (SDMeasuredSlowdown, bound upper) or predicted with its whole
    interval (SDPredictedSlowdown); both exist and page, and nothing else does."""
    critical = {a["alert"]: a["expr"] for a in _alerts() if a["labels"]["severity"] == "critical"}
    assert set(critical) == {"SDMeasuredSlowdown", "SDPredictedSlowdown"}
    for name, expr in critical.items():
        assert _proves_slowdown(expr), name
    assert not _proves_slowdown(_alert(mixin.render_rules(
        {"alerts": {"SDMeasuredSlowdown": {"bound": "point"}}}), "SDMeasuredSlowdown")["expr"])


def test_recording_rules_are_named_level_metric_operations():
    """Exactly two colons, no `vllm:` prefix leaking into the name, the window in the operations."""
    window = mixin.default_config()["rateWindow"]
    for g in load_rule_file(RULES_YAML)["groups"]:
        for r in g["rules"]:
            level, metric, ops = r["record"].split(":")
            assert re.fullmatch(r"[a-z_]+", level), r["record"]
            assert re.fullmatch(r"[a-z0-9_]+", metric), r["record"]
            assert re.fullmatch(r"[a-z0-9_]+", ops), r["record"]
            if "rate" in ops:
                assert ops.endswith(f"rate{window}"), r["record"]


# --- overrides (render_rules) ----------------------------------------------------------------


def test_render_rules_applies_overrides_deeply():
    """Tests elsewhere shorten durations: the override changes only the named fields."""
    rules = mixin.render_rules(
        {"alerts": {"SDAcceptanceRateLow": {"for": "1m", "keepFiringFor": "30s"}}}
    )
    names = [g["name"] for g in rules["groups"]]
    assert names[0] == "specwatch-vllm-spec-decode.rules", "recording rules come first"
    low = _alert(rules, "SDAcceptanceRateLow")
    assert (low["for"], low["keep_firing_for"]) == ("1m", "30s")
    assert low["labels"]["severity"] == "warning"
    assert "< 0.4" in low["expr"]
    speedup = _alert(rules, "SDPredictedSpeedupLow")
    assert speedup["for"] == "15m"


def test_render_rules_output_loads_in_promtool(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(mixin.dump_rules(mixin.render_rules({"exporterSelector": 'job="sw"'})))
    proc = _run([promtool(), "check", "rules", str(path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert 'job="sw"' in path.read_text() and 'job="specwatch"' not in path.read_text()


def test_disabled_alert_is_not_rendered():
    rules = mixin.render_rules({"alerts": {"SDAcceptanceBimodal": {"enabled": False}}})
    alerts = {r.get("alert") for g in rules["groups"] for r in g["rules"]}
    assert "SDAcceptanceBimodal" not in alerts and "SDAcceptanceRateLow" in alerts


def test_grafana_url_adds_dashboard_links():
    rules = mixin.render_rules({"grafanaURL": "https://grafana.example.com"})
    low = _alert(rules, "SDAcceptanceRateLow")
    assert low["annotations"]["dashboard_url"].startswith(
        "https://grafana.example.com/d/specwatch-sd-overview/?"
    )
    none = mixin.render_rules({"grafanaURL": ""})
    assert not any("dashboard_url" in r.get("annotations", {})
                   for g in none["groups"] for r in g["rules"])


def test_every_located_alert_links_to_its_dashboard_filtered_to_its_target():
    """Alerts had no dashboard link (grafanaURL empty). Every alert that
    names a target links to the dashboard with that target (and model) selected; the
    promtool tests check the rendered links (alerts/tests/*.yaml, exp_annotations)."""
    config = mixin.default_config()
    assert config["grafanaURL"]
    for a in _alerts():
        if a["alert"] == "SpecwatchAbsent":  # no labels to filter on
            continue
        url = a["annotations"]["dashboard_url"]
        assert url.startswith(config["grafanaURL"] + "/d/"), a["alert"]
        if a["alert"] != "SpecwatchExporterDown":
            assert "var-target={{" in url, a["alert"]
        if a["alert"].startswith("SD"):
            assert "var-model_name={{ $labels.model_name | urlquery }}" in url, a["alert"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"alerts": {"SDAcceptanceRateLow": {"fro": "1m"}}},
            "'alerts.SDAcceptanceRateLow.fro': no such config key",
        ),
        (
            {"alerts": {"NoSuchAlert": {"enabled": False}}},
            "'alerts.NoSuchAlert': no such config key",
        ),
        ({"rateWindow": {"x": 1}}, "'rateWindow': expected a str, got an object"),
        ({"alerts": {"SDAcceptanceRateLow": {"source": "both"}}}, "must be 'exporter' or 'vllm'"),
        ({"alerts": {"SDAcceptanceRateLow": {"measure": "length"}}}, "must be 'alpha' or 'rate'"),
    ],
)
def test_bad_overrides_are_clear_errors(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        mixin.render_rules(overrides)


def test_generate_cli_rejects_bad_overrides_with_exit_2(tmp_path):
    proc = _run([*GENERATE, "--out-dir", str(tmp_path), "--overrides", "{not json"])
    assert proc.returncode == 2
    assert "--overrides: not valid JSON (line 1, column 2" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = _run([*GENERATE, "--out-dir", str(tmp_path), "--overrides", '{"alerts": {"X": {}}}'])
    assert proc.returncode == 2 and "'alerts.X': no such config key" in proc.stderr


def test_generate_cli_writes_overridden_rules(tmp_path):
    """The simulator's end-to-end test renders through the CLI with a JSON file of overrides."""
    overrides = tmp_path / "overrides.json"
    overrides.write_text('{"alerts": {"SDAcceptanceRateLow": {"for": "30s"}}}')
    out = tmp_path / "out"
    proc = _run([*GENERATE, "--out-dir", str(out), "--overrides", f"@{overrides}"])
    assert proc.returncode == 0, proc.stderr
    rendered = load_rule_file(out / mixin.ALERTS_FILE)
    low = _alert(rendered, "SDAcceptanceRateLow")
    assert low["for"] == "30s"
