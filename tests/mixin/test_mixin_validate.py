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
