"""The `specwatch ...` commands and serve config files that README.md and docs/*.md show, read
from the pages themselves, so that a test can run exactly what a reader would copy.

What counts:

- a command: a line of a code block (fenced, or indented by four spaces) that starts with
  ``specwatch ``, joined with its ``\\`` continuation lines; its ``--set`` lines come with it;
- a config file: a code block (a fenced ``yaml`` block or an indented one) whose first line is
  a top-level key of the serve config (``global:``, ``targets:``, ``pairs:``, ...);
- a Prometheus or Alertmanager config: a block whose first line is ``# prometheus.yml`` or
  ``# alertmanager.yml`` (checked with promtool / amtool, in the page's folder).

What is not run, and why, is in the page beside the command, where a reader sees it too:

- ``<!-- docs-test: skip (REASON) -->`` on the line before a block (blank lines between are
  allowed): nothing in that block is run (a vLLM on a GPU, your own Prometheus, ...);
- a trailing ``# needs ...`` comment on a command: that command is not run (``# needs your
  own Prometheus``);
- ``<!-- docs-test: exit N -->`` before a block: its commands end with exit status N;
- a synopsis is not a command: a line with ``[optional]`` parts, ``...`` or upper-case
  placeholders (``FILE``, ``URL``, ``NAME``) shows a command's shape, not one to copy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: The serve config's top-level keys: a block that starts with one is a config file.
CONFIG_KEYS = ("global:", "targets:", "file_sd_configs:", "pairs:", "pair_options:",
               "controller:")
_MARKER = re.compile(r"<!--\s*docs-test:\s*(skip|exit)\s*(.*?)\s*-->")
_PLACEHOLDER = re.compile(r"(?<![\w'\"=/.-])[A-Z][A-Z0-9_]{1,}(?:\.\.\.)?(?![\w'\"])")
_NEEDS = re.compile(r"#[^#]*?\b(needs (?:your|a|an)\b.*)$")


@dataclass(frozen=True)
class DocItem:
    """One command or config file of a page, with why it is not run (None: it is run)."""

    page: Path
    line: int
    kind: str  # "command" | "config" | "prometheus" | "alertmanager"
    text: str
    skip: str | None = None
    exit_code: int = 0

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@dataclass
class _Block:
    start: int  # 1-based line of the first line
    lines: list[str]
    lang: str
    marker: tuple[str, str] | None


def _blocks(text: str) -> list[_Block]:
    lines = text.splitlines()
    blocks: list[_Block] = []
    marker: tuple[str, str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        found = _MARKER.search(line)
        if found:
            marker = (found.group(1), found.group(2))
            i += 1
            continue
        fence = re.match(r"^(\s*)```(\w*)", line)
        if fence:
            indent = len(fence.group(1))
            body: list[str] = []
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                body.append(lines[j][indent:])
                j += 1
            blocks.append(_Block(i + 2, body, fence.group(2), marker))
            marker = None
            i = j + 1
            continue
        prev_blank = i == 0 or not lines[i - 1].strip()
        if line.startswith("    ") and line.strip() and prev_blank:
            body = []
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                body.append(lines[j][4:])
                j += 1
            while body and not body[-1].strip():
                body.pop()
            blocks.append(_Block(i + 1, body, "", marker))
            marker = None
            i = j
            continue
        if line.strip():
            marker = None
        i += 1
    return blocks


def _is_synopsis(command: str) -> bool:
    unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "''", command.split(" #", 1)[0])
    return ("[" in unquoted or "..." in unquoted or "…" in unquoted
            or bool(_PLACEHOLDER.search(unquoted)))


def items(page: Path) -> list[DocItem]:
    """The commands and config files of one page, in page order."""
    out: list[DocItem] = []
    for block in _blocks(page.read_text(encoding="utf-8")):
        skip = exit_code = None
        if block.marker is not None:
            kind, arg = block.marker
            if kind == "skip":
                skip = arg.strip("() ") or "marked skip"
            else:
                exit_code = int(arg)
        first = next((ln for ln in block.lines if ln.strip()), "")
        if first.strip() in ("# prometheus.yml", "# alertmanager.yml"):
            kind = first.strip()[2:].split(".")[0]
            out.append(DocItem(page, block.start, kind, "\n".join(block.lines) + "\n", skip))
            continue
        if (block.lang in ("yaml", "yml", "") and first.startswith(CONFIG_KEYS)
                and not any(ln.lstrip().startswith("specwatch ") for ln in block.lines)):
            out.append(DocItem(page, block.start, "config", "\n".join(block.lines) + "\n",
                               skip))
            continue
        j = 0
        while j < len(block.lines):
            line = block.lines[j].strip()
            start = j
            if line.startswith("$ "):
                line = line[2:]
            if not line.startswith("specwatch "):
                j += 1
                continue
            parts = [line]
            while parts[-1].split(" #", 1)[0].rstrip().endswith("\\") and j + 1 < len(block.lines):
                j += 1
                parts.append(block.lines[j].strip())
            j += 1
            command = "\n".join(parts)
            why = skip
            needs = _NEEDS.search(parts[-1])
            if why is None and needs:
                why = needs.group(1)
            if why is None and _is_synopsis(command):
                why = "synopsis (placeholders or [optional] parts), not a command to copy"
            out.append(DocItem(page, block.start + start, "command", command, why,
                               exit_code or 0))
    return out


def all_items() -> list[DocItem]:
    return [item for page in PAGES for item in items(page)]
