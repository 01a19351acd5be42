"""The docs site: the reference pages are generated from the code and current, the
site builds with `mkdocs build --strict` (every page in the nav, no broken link or anchor), the
README is a front page that points into it, and the runbook the alerts link to is on the site
with the same anchors.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("generate_docs",
                                                  ROOT / "scripts" / "generate_docs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", ["docs/metrics.md", "docs/cli.md", "docs/deployment.md"])
def test_reference_page_is_current(page: str) -> None:
    gen = _generator()
    expected = gen.pages()[ROOT / page]
    current = (ROOT / page).read_text(encoding="utf-8")
    assert current == expected, (
        f"{page} is stale: run `{gen.REGENERATE.split(' (')[0]}` (or `make generate`) "
        "and commit the result")


def test_metrics_reference_lists_every_series_of_the_table() -> None:
    from specwatch.app.catalogue import METRICS

    table = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8").split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \| (\w+) \|", table, flags=re.M)
    assert rows == [(m.exposed_name, m.type) for m in METRICS]


def test_cli_reference_has_every_command_and_option() -> None:
    from specwatch import cli

    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    gen = _generator()
    for name in cli.COMMANDS:
        assert f"## `specwatch {name}`" in page
        for action in gen._parser(name)._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}`" in page, f"{name} {option}"


def test_mkdocs_builds_strict(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runbook = (tmp_path / "runbook" / "index.html").read_text(encoding="utf-8")
    alerts = yaml.safe_load((ROOT / "alerts" / "specwatch-alerts.yaml").read_text())
    for group in alerts["groups"]:
        for rule in group["rules"]:
            anchor = rule["annotations"]["runbook_url"].rsplit("#", 1)[1]
            assert f'id="{anchor}"' in runbook, f"{rule['alert']}: no #{anchor} on the site"


def test_every_docs_page_is_in_the_nav() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(node) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [p for item in node for p in pages(item)]
        return [p for value in node.values() for p in pages(value)]

    listed = pages(config["nav"])
    docs = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").glob("*.md"))
    assert sorted(listed) == docs


def test_the_site_runbook_is_the_runbook_the_alerts_link_to() -> None:
    """runbook.md stays at the top of the repository (the alerts' runbook_url points there on
    GitHub); the site shows the same file through a symbolic link, never a copy."""
    link = ROOT / "docs" / "runbook.md"
    assert link.is_symlink() and link.resolve() == (ROOT / "runbook.md").resolve()


def test_readme_is_a_front_page_whose_links_resolve() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.count("\n") <= 250
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+:", t)]
    assert any(t.endswith(".png") for t in local), "the README has no picture"
    for target in local:
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def test_readme_picture_and_caption_numbers_are_todays() -> None:
    """Every number of the README's picture caption, and the numbers stored in the picture
    when it was drawn, are what `specwatch sweep` says today on the shipped parameters (the
    PNG bytes depend on matplotlib and are not compared)."""
    gen = _generator()
    numbers = gen.caption_numbers(gen.sweep_result())
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert gen.PICTURE_BEGIN in readme and gen.PICTURE_END in readme, (
        "README.md: the generated picture block is missing")
    block = readme.split(gen.PICTURE_BEGIN, 1)[1].split(gen.PICTURE_END, 1)[0]
    fresh = gen.picture_block(numbers)
    assert _NUMBER.findall(block) == _NUMBER.findall(fresh), (
        "README.md's picture caption is stale: run `make docs-images` and commit the result")
    assert block.strip() == fresh.strip()
    assert gen.png_numbers() == numbers, (
        f"{gen.SWEEP_IMAGE.name} was drawn from other numbers: run `make docs-images`")


def test_readme_caption_states_the_sweeps_break_even_and_sd_off_rates() -> None:
    """The caption's numbers are the sweep's, not a rounding that hides a change; it is at
    most 3 lines, and it calls a break-even only a rate where the speedup crosses 1 (on the
    shipped example there is none below SD's throughput ceiling, which it names apart)."""
    gen = _generator()
    out = gen.sweep_result()
    numbers = gen.caption_numbers(out)
    crossings = [[c["draft_length"], c["breakeven_arrival_rate"]] for c in out["curves"]
                 if c["breakeven_arrival_rate"] is not None]
    assert numbers["breakevens"] == [[k, round(r, 2)] for k, r in crossings]
    caps = [c["sd_ceiling_arrival_rate"] for c in out["curves"]]
    assert numbers["ceiling_low"][0] == pytest.approx(min(caps), abs=0.01)
    assert numbers["ceiling_high"][0] == pytest.approx(max(caps), abs=0.01)
    assert numbers["sd_off_from"] == out["sd_off_above_arrival_rate"]
    caption = gen.picture_block(numbers).split("\n\n", 1)[1]
    assert len(caption.splitlines()) <= 3, caption
    block = " ".join(gen.picture_block(numbers).split())
    if not crossings:
        assert "no draft length's speedup falls to 1 below SD's throughput ceiling" in block
        assert f"({gen._rate(min(caps))}–{gen._rate(max(caps))} req/s)" in block
    best = out["best_draft_length"]
    if numbers["sd_off_from"] is not None:
        assert f"off from {gen._rate(numbers['sd_off_from'])} req/s on" in block
    elif best[-1] < 0:
        # The sweep ends with no best k vouched for: the caption says up to where SD pays,
        # never that it pays over the whole range.
        last = max(lam for k, lam in zip(best, out["arrival_rates"], strict=True) if k >= 0)
        assert numbers["vouched_to"] == pytest.approx(last, abs=0.01)
        assert f"vouched for up to {gen._rate(last)} req/s" in block
        assert "whole range" not in block


def test_performance_page_is_a_reference_and_the_run_log_an_archive() -> None:
    """docs/performance.md gives the current figures and how to reproduce them; the
    session-by-session log lives in docs/performance-archive.md, which the site lists."""
    page = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    assert len(page.splitlines()) < 400, "performance.md grew back into a run log"
    for heading in ("## Current figures", "## How to reproduce"):
        assert f"\n{heading}\n" in page, heading
    figures = page.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    benches = set(re.findall(r"`bench/(\w+\.py)", figures))
    assert len(benches) >= 4 and all((ROOT / "bench" / b).is_file() for b in benches), benches
    assert "Status on" not in page  # the dated run paragraphs are archived
    archive = (ROOT / "docs" / "performance-archive.md").read_text(encoding="utf-8")
    assert "Status on 2026-12-02, fifth session" in archive
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    assert "performance-archive.md" in json.dumps(nav)


def test_site_css_keeps_names_whole_in_tables_and_wraps_code_blocks() -> None:
    """The site's stylesheet (checked by a headless-browser screenshot when it was written):
    inline code in tables is not broken inside a metric name, and code blocks wrap instead of
    hiding their ends behind a scrollbar."""
    conf = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert "css/extra.css" in conf.get("extra_css", [])
    css = re.sub(r"/\*.*?\*/", "", (ROOT / "docs" / "css" / "extra.css").read_text(), flags=re.S)
    rules = {k.strip(): v for k, v in re.findall(r"([^{}]+)\{([^}]*)\}", css)}
    table_code = rules[".md-typeset table:not([class]) code"]
    assert "word-break: normal" in table_code and "white-space: nowrap" in table_code
    assert "white-space: pre-wrap" in rules[".md-typeset pre > code"]
    assert "toc.integrate" in conf["theme"]["features"]
