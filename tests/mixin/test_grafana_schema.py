"""Every generated dashboard typed against Grafana's own schema: the `@grafana/schema` npm
package of the minimum Grafana version the mixin declares and of the newest release, checked
by the TypeScript compiler (`tsc --noEmit`).

Why TypeScript: Grafana publishes its dashboard and panel schemas as TypeScript types
(generated from its CUE kinds). Assigning a dashboard's JSON, as an object literal, to the
`Dashboard` type, and each panel to `Panel<Options, FieldConfig>` of its plugin, makes the
compiler reject a misspelt field, a wrong enum value or a wrong type, which Grafana itself
would silently ignore (an option that does nothing).

The packages are pinned in tests/grafana-schema/package.json and its lockfile and installed
with `npm ci` (by `make setup`, or here when missing). Every error the compiler reports must
match a reviewed deviation in tests/grafana-schema/deviations.yaml (with the reason it is
acceptable), and every listed deviation must still occur, so the list cannot go stale.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers.shared import run_lock
from mixin_helpers import REPO, load_dashboards

from specwatch.mixin import render as mixin

SCHEMA_DIR = REPO / "tests" / "grafana-schema"
DEVIATIONS = yaml.safe_load((SCHEMA_DIR / "deviations.yaml").read_text(encoding="utf-8"))
PACKAGE = json.loads((SCHEMA_DIR / "package.json").read_text(encoding="utf-8"))


def _version(alias: str) -> str:
    spec = PACKAGE["devDependencies"][alias]
    m = re.fullmatch(r"npm:@grafana/schema@(\d+\.\d+\.\d+)", spec)
    assert m, f"package.json: {alias} must pin an exact @grafana/schema version, got {spec}"
    return m.group(1)


# alias in package.json -> (root of the types, how a panel plugin's types file is named)
SCHEMAS = {
    "min": ("grafana-schema-min", "dist/index",
            "dist/esm/raw/composable/{dir}/panelcfg/x/{name}_types.gen"),
    "latest": ("grafana-schema-latest", "dist/types/index",
               "dist/types/raw/composable/{dir}/panelcfg/x/types.gen"),
}


@pytest.fixture(scope="module")
def node_modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Install the pinned packages once (npm ci from the lockfile; one worker at a time, as
    npm ci empties node_modules first)."""
    modules = SCHEMA_DIR / "node_modules"
    stamp = modules / ".package-lock.json"
    lock = SCHEMA_DIR / "package-lock.json"
    with run_lock(tmp_path_factory, "npm-ci"):
        if not stamp.is_file() or stamp.stat().st_mtime < lock.stat().st_mtime:
            npm = shutil.which("npm")
            assert npm, "npm not found: `make setup` installs Debian's npm package"
            proc = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=SCHEMA_DIR,
                                  capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stdout + proc.stderr
    assert shutil.which("node"), "node not found: `make setup` installs Debian's nodejs"
    return modules


def test_the_minimum_version_is_the_one_the_dashboards_declare():
    """The schema the test types against is the minimum Grafana of config.libsonnet (and of
    every dashboard's __requires); the other is the newest release known when pinned."""
    minimum = mixin.default_config()["grafana"]["minVersion"]
    assert _version("grafana-schema-min") == minimum
    for name, d in load_dashboards().items():
        (grafana,) = [r for r in d["__requires"] if r["type"] == "grafana"]
        assert grafana["version"] == minimum, name
    newest = tuple(map(int, _version("grafana-schema-latest").split(".")))
    assert newest > tuple(map(int, minimum.split(".")))


def _panel_types(alias: str) -> dict[str, tuple[str, str]]:
    """Panel type -> (schema folder, file stem) for this schema version."""
    out = {}
    for ptype, entry in DEVIATIONS["panel_schemas"].items():
        chosen = entry.get(alias, entry["default"])
        out[ptype] = (chosen["dir"], chosen.get("name", ""))
    return out


def _typescript(alias: str, dashboards: dict[str, dict]) -> tuple[str, list[str]]:
    """The TypeScript program and, per line, what that line holds (dashboard and panel)."""
    package, index, panel_path = SCHEMAS[alias]
    lines: list[str] = [
        "import type { Dashboard, Panel, RowPanel }"
        f' from "./node_modules/{package}/{index}";',
        # JSON holds an enum's value ("absolute"), never the TypeScript enum member
        # (ThresholdsMode.Absolute): accept each string enum's values, nothing else.
        "type Json<T> = T extends string ? `${T}`"
        " : T extends object ? { [K in keyof T]: Json<T[K]> } : T;",
        # The published Panel<TOptions, ...> does not use TOptions (options stay untyped):
        # put the plugin's Options in its place.
        "type Typed<O, F = Record<string, unknown>>"
        " = Omit<Panel<Record<string, unknown>, F>, 'options'> & { options: O };",
    ]
    where: list[str] = ["imports", "imports", "imports"]
    types = _panel_types(alias)
    has_field_config: dict[str, bool] = {}
    used = sorted({p["type"] for d in dashboards.values() for p in d["panels"]
                   if p["type"] != "row"})
    for ptype in used:
        assert ptype in types, f"panel type {ptype}: not in deviations.yaml panel_schemas"
        folder, stem = types[ptype]
        path = panel_path.format(dir=folder, name=stem)
        lines.append(f'import type * as {_ident(ptype)} from "./node_modules/{package}/{path}";')
        where.append("imports")
        declared = (SCHEMA_DIR / "node_modules" / package / f"{path}.d.ts").read_text("utf-8")
        has_field_config[ptype] = "export interface FieldConfig" in declared

    def emit(text: str, location: str) -> None:
        for line in text.split("\n"):
            lines.append(line)
            where.append(location)

    for name, d in dashboards.items():
        d = _strip(d)
        refs = []
        for i, p in enumerate(d["panels"]):
            var = f"{_ident(name)}_panel_{i}"
            refs.append(var)
            if p["type"] == "row":
                kind = "Json<RowPanel>"
            else:
                mod = _ident(p["type"])
                # A plugin without custom field options (stat) publishes no FieldConfig.
                custom = f", {mod}.FieldConfig" if has_field_config[p["type"]] else ""
                kind = f"Json<Typed<{mod}.Options{custom}>>"
            emit(f"const {var}: {kind} = {json.dumps(p, indent=2, ensure_ascii=False)};",
                 f"{name}: panel {p['title']!r} ({p['type']})")
        # The panels are typed above, each by its own plugin's schema (Dashboard's own
        # `panels` only knows untyped options).
        top = {k: v for k, v in d.items() if k != "panels"}
        body = json.dumps(top, indent=2, ensure_ascii=False)
        emit(f'export const {_ident(name)}: Json<Omit<Dashboard, "panels">> = {body};',
             f"{name}: dashboard")
        emit(f"export const {_ident(name)}_panels = [{', '.join(refs)}];", f"{name}: dashboard")
    return "\n".join(lines) + "\n", where


def _stripped(d: dict) -> dict[str, list[dict]]:
    """Where each stripped_fields entry applies in a dashboard."""
    return {
        "the dashboard (top level)": [d],
        "query variables (templating.list, type query)":
            [v for v in d["templating"]["list"] if v["type"] == "query"],
        "annotation queries (annotations.list, not builtIn)":
            [a for a in d["annotations"]["list"] if not a.get("builtIn")],
    }


def _strip(d: dict) -> dict:
    """A copy of the dashboard without the listed, reviewed fields the schema lacks."""
    d = json.loads(json.dumps(d))
    places = _stripped(d)
    for entry in DEVIATIONS["stripped_fields"]:
        for obj in places[entry["in"]]:
            for field in entry["fields"]:
                obj.pop(field, None)
    return d


def test_every_stripped_field_still_occurs():
    """A stripped field the dashboards no longer use must leave the list."""
    dashboards = load_dashboards()
    for entry in DEVIATIONS["stripped_fields"]:
        for field in entry["fields"]:
            assert any(field in obj for d in dashboards.values()
                       for obj in _stripped(d)[entry["in"]]), (entry["in"], field)


def _ident(text: str) -> str:
    return re.sub(r"\W", "_", text)


_ERROR = re.compile(
    r"^(?P<file>[^(]+)\((?P<line>\d+),(?P<col>\d+)\): error (?P<code>TS\d+): (?P<msg>.*)$")


def _compile(alias: str, modules: Path, tmp: Path, dashboards: dict | None = None) -> list[dict]:
    """Run tsc on the program for this schema version; the errors, located."""
    package = SCHEMAS[alias][0]
    program, where = _typescript(alias, dashboards or load_dashboards())
    source = SCHEMA_DIR / f".check-{alias}.ts"
    config = SCHEMA_DIR / f".tsconfig-{alias}.json"
    source.write_text(program, encoding="utf-8")
    config.write_text(json.dumps({
        "compilerOptions": {
            "strict": True, "noEmit": True, "skipLibCheck": True, "target": "ES2020",
            "module": "ES2020", "moduleResolution": "node", "baseUrl": ".",
            # The panel types import their shared types as '@grafana/schema': this version's.
            "paths": {"@grafana/schema": [f"./node_modules/{package}/{SCHEMAS[alias][1]}"]},
            "noErrorTruncation": True,
        },
        "files": [source.name],
    }), encoding="utf-8")
    try:
        proc = subprocess.run(
            ["node", str(modules / "typescript" / "bin" / "tsc"), "-p", config.name,
             "--pretty", "false"],
            cwd=SCHEMA_DIR, capture_output=True, text=True, timeout=600)
    finally:
        (tmp / source.name).write_text(program, encoding="utf-8")
        source.unlink()
        config.unlink()
    errors = []
    for line in proc.stdout.splitlines():
        m = _ERROR.match(line)
        if m:
            errors.append({"where": where[int(m["line"]) - 1], "code": m["code"],
                           "message": m["msg"]})
        elif line.strip() and not line.startswith(" "):
            errors.append({"where": "tsc", "code": "output", "message": line})
    assert proc.returncode == (1 if errors else 0) or errors, proc.stdout + proc.stderr
    return errors


def _matches(deviation: dict, alias: str, error: dict) -> bool:
    return (alias in deviation["versions"]
            and re.search(deviation["where"], error["where"]) is not None
            and deviation["code"] == error["code"]
            and re.search(deviation["message"], error["message"]) is not None)


@pytest.mark.parametrize("alias", ["min", "latest"])
def test_every_dashboard_types_against_grafana_schema(alias, node_modules, tmp_path):
    """Every dashboard types against @grafana/schema of the minimum version and of
    the newest; only the reviewed deviations of tests/grafana-schema/deviations.yaml remain."""
    errors = _compile(alias, node_modules, tmp_path)
    listed = [d for d in DEVIATIONS["deviations"] if alias in d["versions"]]
    unexplained = [e for e in errors if not any(_matches(d, alias, e) for d in listed)]
    assert unexplained == [], (
        f"@grafana/schema {_version('grafana-schema-' + alias)}: errors not in deviations.yaml "
        "(fix the dashboard, or review and list the deviation with its reason):\n"
        + "\n".join(f"  {e['where']}: {e['code']} {e['message'][:400]}" for e in unexplained))
    stale = [d["why"] for d in listed if not any(_matches(d, alias, e) for e in errors)]
    assert stale == [], f"deviations that no longer occur (remove them): {stale}"


def test_the_check_rejects_a_misspelt_option(node_modules, tmp_path):
    """Not vacuous: a panel option Grafana does not know is a compiler error."""
    dashboards = load_dashboards()
    panel = next(p for p in dashboards["specwatch-exporter.json"]["panels"]
                 if p["type"] == "timeseries")
    panel["options"]["legend"]["displayMod"] = "table"
    errors = _compile("latest", node_modules, tmp_path, dashboards)
    assert any("displayMod" in e["message"] and panel["title"] in e["where"]
               for e in errors), errors
