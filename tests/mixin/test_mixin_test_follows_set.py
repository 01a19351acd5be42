"""`specwatch mixin test` follows the user's configuration: `mixin render` writes the bundle's
rule tests carried over to its --set values (selectors, URLs, thresholds, switched-off
alerts), so every render the docs show passes its tests, and a rule that is
really broken still fails them.

Why: the tests were written for the default configuration; a render with the documented
grafanaURL or another selector failed all the test files on label and annotation text, and a
broken rule could not be told from changed text.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from specwatch import cli
from specwatch.mixin import ruletests

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/dashboards-alerts.md", "deploy/README.md", "docs/getting-started.md")


def documented_renders() -> list[tuple[str, list[str]]]:
    """Every `specwatch mixin render` command in the docs: (where, its --set values)."""
    found = []
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8").replace("\\\n", " ")
        for line in text.splitlines():
            m = re.search(r"specwatch mixin render\b(.*)", line)
            if m is None or "--set" not in m.group(1):
                continue
            words = shlex.split(m.group(1), comments=True)
            sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
            found.append((f"{doc}: {' '.join(sets)}", sets))
    return found


RENDERS = documented_renders()


def _render(out: Path, sets: list[str]) -> None:
    args = ["mixin", "render", "--out", str(out)]
    for item in sets:
        args += ["--set", item]
    assert cli.main(args) == 0


def test_the_docs_show_renders_with_selectors_urls_and_thresholds() -> None:
    shown = " ".join(" ".join(sets) for _, sets in RENDERS)
    for key in ("vllmSelector", "exporterSelector", "grafanaURL", "runbookURLPattern",
                "threshold", "enabled=false", "dashboardTitles."):
        assert key in shown, key


@pytest.mark.parametrize("sets", [s for _, s in RENDERS], ids=[w for w, _ in RENDERS])
def test_mixin_test_passes_after_every_documented_render(tmp_path: Path, capsys,
                                                         sets: list[str]) -> None:
    _render(tmp_path / "m", sets)
    capsys.readouterr()
    assert cli.main(["mixin", "test", str(tmp_path / "m")]) == 0, capsys.readouterr().out
    assert "6 rule test files" in capsys.readouterr().out or not sets


@pytest.mark.parametrize("sets", [
    ['exporterSelector=job="sw", namespace="mon"'],
    ['vllmSelector=namespace=~"llm-.*"'],
    # The other engines of a mixed fleet, each under its own job and namespace.
    ['trtllmSelector=job="trt", namespace="llm"', 'llamacppSelector=job="llama-server"',
     'sglangSelector=job="sgl", namespace="llm"'],
    ['exporterSelector=job=~"specwatch|sw"', "rateWindow=10m"],
    ["grafanaURL=", "alerts.SpecwatchTargetDown.severity=critical",
     "alertLabels.component=sd-bundle"],
    # Thresholds either way: the compared inputs are scaled, the printed values follow.
    ["alerts.SDAcceptanceRateLow.threshold=0.2", "alerts.SDModelDrift.threshold=0.3",
     "alerts.SDPredictedSpeedupLow.threshold=1.2", "alerts.SDMeasuredSlowdown.threshold=0.9"],
    ["alerts.SDAcceptanceRateLow.threshold=0.6", "alerts.SDModelSaturated.threshold=0.8",
     "alerts.SDAcceptanceBimodal.threshold=0.7", "alerts.SDModelDrift.threshold=0.1"],
])
def test_mixin_test_passes_for_other_selectors_windows_labels_and_thresholds(
        tmp_path: Path, capsys, sets: list[str]) -> None:
    _render(tmp_path / "m", sets)
    capsys.readouterr()
    assert cli.main(["mixin", "test", str(tmp_path / "m")]) == 0, capsys.readouterr().out


@pytest.mark.parametrize(("alert", "old", "new"), [
    # The comparison turned round: pages on healthy acceptance, never on low.
    ("SDAcceptanceRateLow", "< 0.35", ">= 0.35"),
    # A recording rule reading the wrong counter: accepted tokens read as proposed ones.
    ("model_name:vllm_spec_decode_acceptance_rate",
     'vllm:spec_decode_num_accepted_tokens_total{job="inference", namespace="llm"}',
     'vllm:spec_decode_num_draft_tokens_total{job="inference", namespace="llm"}'),
])
def test_mixin_test_still_fails_an_injected_fault(tmp_path: Path, capsys, alert: str,
                                                  old: str, new: str) -> None:
    sets = ['vllmSelector=job="inference", namespace="llm"',
            "alerts.SDAcceptanceRateLow.threshold=0.35",
            "grafanaURL=https://grafana.example.com"]
    _render(tmp_path / "m", sets)
    for name in ("specwatch-alerts.yaml", "specwatch-rules.yaml"):
        path = tmp_path / "m" / "alerts" / name
        text = path.read_text()
        path.write_text(text.replace(old, new))
        if text != path.read_text():
            break
    else:
        pytest.fail(f"fault {old!r} not found")
    capsys.readouterr()
    assert cli.main(["mixin", "test", str(tmp_path / "m")]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and alert in out


def test_a_duration_past_a_tests_times_names_the_alert(tmp_path: Path, capsys) -> None:
    """Evaluation times are not moved with a `for`: a longer one is a real change of
    behaviour, reported by the alert's name."""
    _render(tmp_path / "m", ["alerts.SDModelDrift.for=45m"])
    capsys.readouterr()
    assert cli.main(["mixin", "test", str(tmp_path / "m")]) == 1
    out = capsys.readouterr().out
    assert "SDModelDrift" in out and "SDAcceptanceRateLow" not in out


def test_the_default_render_writes_the_bundled_tests_unchanged(tmp_path: Path) -> None:
    _render(tmp_path / "m", [])
    for path in sorted((ROOT / "alerts" / "tests").glob("*.yaml")):
        assert (tmp_path / "m" / "alerts" / "tests" / path.name).read_text() == path.read_text()


@pytest.mark.parametrize(("selector", "labels"), [
    ('job="inference", namespace="llm"', {"job": "inference", "namespace": "llm"}),
    ('namespace=~"llm-.*"', {"job": "vllm", "namespace": "llm-"}),
    ('job=~"a|b"', {"job": "a"}),
    ('job!="vllm"', {"job": "vllm-other"}),
    ('job!~"vllm.*", cluster!=""', {"job": "other", "cluster": "other"}),
])
def test_series_labels_satisfy_the_selector(selector: str, labels: dict[str, str]) -> None:
    assert ruletests.labels_for(selector, {"job": "vllm"}) == labels


@pytest.mark.parametrize(("expr", "label", "kept"), [
    ('x{job="a"} < 1 and on (cluster, job) y{job="a"} > 0', "namespace", True),
    ('x{job="a"} > on (cluster, job, instance) y{job="a"}', "namespace", False),
    ('x{job="a"} > on (cluster, job, instance) y{job="a"}', "instance", True),
    ('sum by (cluster, job, model_name) (rate(x{job="a"}[5m]))', "namespace", False),
    ('absent(up{job="a"} == 1)', "job", False),
    ('up{job="a"} == 0', "namespace", True),
])
def test_which_labels_a_rule_keeps(expr: str, label: str, kept: bool) -> None:
    assert ruletests.keeps(expr, label) is kept


def test_a_selector_the_tests_cannot_match_still_renders_with_a_note(tmp_path: Path,
                                                                     capsys) -> None:
    """The rules stand when no test series can be built for a regex (RE2's POSIX classes):
    the render says in one line that its tests were not written."""
    _render(tmp_path / "m", ['vllmSelector=job=~"[[:alpha:]]{3}q"'])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rule tests not written" in err and "Traceback" not in err
    assert (tmp_path / "m" / "alerts" / "specwatch-rules.yaml").is_file()
    assert not (tmp_path / "m" / "alerts" / "tests").exists()
