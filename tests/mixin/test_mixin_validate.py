"""`specwatch mixin render` checks each --set value for what its key means before it renders,
and the rendered rules with promtool before it writes; `specwatch mixin test` runs the bundle's
rule tests against a render."""

from __future__ import annotations

from pathlib import Path

import promql_parser
import pytest

from specwatch import cli
from specwatch.mixin import validate

SELECTORS = [
    'job="vllm"',
    'job="vllm", namespace="llm"',
    "job='vllm'",
    'job=~"vllm-.*",namespace!="dev"',
    'job!~`a|b`',
    'job="a",',
    ' job = "a" , cluster = "x" ',
    'job="with \\"escaped\\" quotes"',
    'job="a,b"',
    'job=vllm',
    'job="a" namespace="b"',
    '"job"',
    '=="a"',
    'job=="a"',
    'job="a",,cluster="b"',
    "",
    "   ",
    '1job="a"',
    'job="a"}',
]


@pytest.mark.parametrize("text", SELECTORS)
def test_selector_check_agrees_with_the_promql_parser(text: str) -> None:
    """The check accepts a matcher list exactly when Prometheus' grammar (promql-parser, the
    Rust port of Prometheus' parser) accepts it between the braces of a selector."""
    try:
        promql_parser.parse(f"up{{{text}}}")
        parses = bool(text.strip())  # `up{}` parses, but the mixin appends ", job=~..."
    except ValueError:
        parses = False
    try:
        validate.matchers(text)
        accepted = True
    except ValueError:
        accepted = False
    assert accepted == parses, text


@pytest.mark.parametrize("text, ok", [
    ("30s", True), ("10m", True), ("1h30m", True), ("2d", True), ("500ms", True),
    ("0m", False), ("10", False), ("10 m", False), ("m", False), ("30m1h", False),
    ("ten minutes", False), ("", False), ("1.5m", False),
])
def test_durations_are_prometheus_durations(text: str, ok: bool) -> None:
    assert validate.is_duration(text) is ok


def test_a_value_promtool_rejects_writes_nothing(tmp_path: Path, capsys) -> None:
    """A regex that is a valid string but not a valid RE2 pattern passes the matcher check;
    promtool, run on the rendered rules before writing, refuses it."""
    out = tmp_path / "o"
    rc = cli.main(["mixin", "render", "--out", str(out), "--set", 'exporterSelector=job=~"("'])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "fail `promtool check rules`" in err and "error parsing regexp" in err
    assert err.count("\n") == 1 and str(tmp_path) not in err
    assert not out.exists()


def test_valid_values_render(tmp_path: Path) -> None:
    rc = cli.main(["mixin", "render", "--out", str(tmp_path),
                   "--set", 'vllmSelector=job=~"vllm-.*", namespace="llm"',
                   "--set", "alerts.SDAcceptanceRateLow.keepFiringFor=",
                   "--set", "alerts.SDAcceptanceRateLow.window=1000req",
                   "--set", "alerts.SDAcceptanceRateLow.threshold=0",
                   "--set", "rateWindow=10m"])
    assert rc == 0
    assert (tmp_path / "alerts" / "specwatch-rules.yaml").is_file()


def test_mixin_test_passes_on_the_default_render_and_names_a_changed_alert(
        tmp_path: Path, capsys) -> None:
    assert cli.main(["mixin", "render", "--out", str(tmp_path / "d")]) == 0
    assert cli.main(["mixin", "test", str(tmp_path / "d")]) == 0
    assert "passed" in capsys.readouterr().out
    assert cli.main(["mixin", "render", "--out", str(tmp_path / "c"),
                     "--set", "alerts.SDAcceptanceRateLow.for=20m"]) == 0
    capsys.readouterr()
    assert cli.main(["mixin", "test", str(tmp_path / "c")]) == 1
    out = capsys.readouterr().out
    assert "SDAcceptanceRateLow" in out and "FAILED" in out


def test_mixin_test_on_a_folder_without_rules_is_one_line(tmp_path: Path, capsys) -> None:
    assert cli.main(["mixin", "test", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mixin render --out DIR" in err


def _render_error(tmp_path: Path, capsys, *sets: str) -> str:
    """The one-line error of a refused render (exit 2, nothing written)."""
    out = tmp_path / "refused"
    args = ["mixin", "render", "--out", str(out)]
    for item in sets:
        args += ["--set", item]
    rc = cli.main(args)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err and "jsonnet" not in err.lower()
    assert not out.exists()
    return err


@pytest.mark.parametrize("value", ["cluster, instance", "1cluster", "clu-ster", "", "a b"])
def test_cluster_label_must_be_one_label_name(tmp_path: Path, capsys, value: str) -> None:
    """clusterLabel is spliced into every `by (...)`/`on (...)` list: a list of names would
    silently regroup every recording rule, so only one label name is accepted."""
    err = _render_error(tmp_path, capsys, f"clusterLabel={value}")
    assert "clusterLabel" in err and "label name" in err


def test_a_cluster_label_name_renders(tmp_path: Path) -> None:
    assert cli.main(["mixin", "render", "--out", str(tmp_path),
                     "--set", "clusterLabel=k8s_cluster"]) == 0
    assert "k8s_cluster, job, model_name" in (
        tmp_path / "alerts" / "specwatch-rules.yaml").read_text()


@pytest.mark.parametrize("value", [
    "%d", "https://runbooks.example.com/specwatch", "https://x/%s/%s",
    "https://x/%s%d", "runbook.md#%s", "https://x/ %s", "ftp://x/%s",
])
def test_runbook_url_pattern_needs_one_placeholder_in_a_url(
        tmp_path: Path, capsys, value: str) -> None:
    """runbookURLPattern is a Jsonnet format string with the alert's anchor as its one `%s`;
    any other pattern is one line naming the key, never a Jsonnet stack trace."""
    err = _render_error(tmp_path, capsys, f"runbookURLPattern={value}")
    assert "runbookURLPattern" in err and "%s" in err


def test_runbook_url_pattern_with_an_escaped_percent_renders(tmp_path: Path) -> None:
    assert cli.main(["mixin", "render", "--out", str(tmp_path), "--set",
                     "runbookURLPattern=https://wiki.example.com/100%%25/specwatch#%s"]) == 0
    assert "https://wiki.example.com/100%25/specwatch#sdmodelinvalid" in (
        tmp_path / "alerts" / "specwatch-alerts.yaml").read_text()


@pytest.mark.parametrize("value", ["grafana.example.com", "https://", "https://g x",
                                   "https://g/{{ $labels.job }}", "https://g/?orgId=1"])
def test_grafana_url_is_an_http_url_or_empty(tmp_path: Path, capsys, value: str) -> None:
    err = _render_error(tmp_path, capsys, f"grafanaURL={value}")
    assert "grafanaURL" in err and "http" in err


def test_one_selector_for_vllm_and_specwatch_is_refused(tmp_path: Path, capsys) -> None:
    """vLLM's and specwatch's series come from different scrape jobs: one selector for both
    leaves one side's queries empty."""
    err = _render_error(tmp_path, capsys, 'exporterSelector=job="vllm"')
    assert "vllmSelector" in err and "exporterSelector" in err
    err = _render_error(tmp_path, capsys, "vllmSelector=job='inference'",
                        'exporterSelector= job = "inference" ')
    assert "vllmSelector" in err and "exporterSelector" in err


def test_keys_with_dots_are_addressable(tmp_path: Path) -> None:
    """dashboardTitles and dashboardUIDs are keyed by file name (with a dot): the key is
    matched whole, longest first."""
    assert cli.main(["mixin", "render", "--out", str(tmp_path), "--set",
                     "dashboardTitles.specwatch-sd-overview.json=Speculative decoding",
                     "--set", "dashboardUIDs.specwatch-exporter.json=sw-exporter"]) == 0
    overview = (tmp_path / "dashboards" / "specwatch-sd-overview.json").read_text()
    assert '"title": "specwatch / Speculative decoding"' in overview
    exporter = (tmp_path / "dashboards" / "specwatch-exporter.json").read_text()
    assert '"uid": "sw-exporter"' in exporter


def test_a_dotted_key_that_does_not_exist_names_the_known_keys(tmp_path: Path, capsys) -> None:
    err = _render_error(tmp_path, capsys, "dashboardTitles.nosuch.json=x")
    assert "specwatch-sd-overview.json" in err


@pytest.mark.parametrize("value", ["has space", "x" * 41, "a/b"])
def test_dashboard_uid_is_a_grafana_uid(tmp_path: Path, capsys, value: str) -> None:
    err = _render_error(tmp_path, capsys, f"dashboardUIDs.specwatch-exporter.json={value}")
    assert "dashboardUIDs" in err and "40" in err


def test_the_bundle_label_cannot_be_emptied(tmp_path: Path, capsys) -> None:
    """An empty alertLabels value removes the label the Alertmanager routes match on: the
    alerts would fall to the root route unseen."""
    err = _render_error(tmp_path, capsys, "alertLabels.component=")
    assert "alertLabels.component" in err and "Alertmanager" in err


def test_the_drafts_rate_guard_is_a_number_at_least_0(tmp_path: Path, capsys) -> None:
    """minDraftRate (the low-acceptance guard for engines without finished requests) is
    checked like minArrivalRate: a negative rate is one line naming the key."""
    err = _render_error(tmp_path, capsys, "alerts.SDAcceptanceRateLow.minDraftRate=-1")
    assert "minDraftRate" in err


@pytest.mark.parametrize("setting", ["alerts.SDAcceptanceRateLow.minDraftedPolls=-1",
                                     "alerts.SDAcceptanceRateLow.draftedPollsWindow=five"])
def test_the_drafted_polls_guard_is_checked(tmp_path: Path, capsys, setting: str) -> None:
    """The exporter-source guard for engines without finished requests (a count of drafted
    polls within a duration): a negative count or a window that is no duration is one line
    naming the key."""
    err = _render_error(tmp_path, capsys, setting)
    assert setting.split("=")[0].split(".")[-1] in err
