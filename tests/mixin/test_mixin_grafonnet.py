"""The mixin's dashboard builder (dashboards/lib/g.libsonnet) is a subset of grafonnet's API,
so that a user who has grafonnet (jsonnetfile.json declares it) can swap it in.

Every function of the builder is either a function grafonnet v11.4.0 documents under the same
path (tests/fixtures/grafonnet/v11.4.0-api.txt, from grafonnet's generated docs) or one of the
extensions docs/dashboards-alerts.md lists; the page's list is exactly those extensions. The
builder's output is typed against Grafana's schema by tests/mixin/test_grafana_schema.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "tests" / "fixtures" / "grafonnet" / "v11.4.0-api.txt"
_WALK = """
local g = import 'dashboards/lib/g.libsonnet';
local walk(o, p) = std.flattenArrays([
  local v = o[k];
  if std.isFunction(v) then [p + k] else if std.isObject(v) then walk(v, p + k + '.') else []
  for k in std.objectFieldsAll(o)
]);
walk(g, '')
"""


def builder_functions() -> list[str]:
    import _jsonnet

    return json.loads(_jsonnet.evaluate_snippet("walk.jsonnet", _WALK, jpathdir=[str(ROOT)]))


def grafonnet_api() -> set[tuple[str, str]]:
    out = set()
    for line in API.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            page, anchor = line.split()
            out.add(("" if page == "." else page, anchor))
    return out


def in_grafonnet(path: str, api: set[tuple[str, str]]) -> bool:
    """``panel.timeSeries.standardOptions.withUnit`` is documented on page panel/timeSeries
    under the anchor ``fn-standardoptionswithunit``."""
    parts = path.split(".")
    return any(("/".join(parts[:i]), "".join(parts[i:]).lower()) in api
               for i in range(len(parts)))


def documented_extensions() -> set[str]:
    page = (ROOT / "docs" / "dashboards-alerts.md").read_text(encoding="utf-8")
    section = page.split("<!-- grafonnet extensions -->", 1)[1].split("<!-- end -->", 1)[0]
    return set(re.findall(r"`g\.([\w.]+)`", section))


def test_every_builder_function_is_grafonnets_or_a_documented_extension() -> None:
    api = grafonnet_api()
    functions = builder_functions()
    assert len(functions) > 200  # the walk sees the whole builder
    extensions = {f for f in functions if not in_grafonnet(f, api)}
    documented = documented_extensions()
    assert extensions == documented, (
        f"not in grafonnet v11.4.0 and not listed in docs/dashboards-alerts.md: "
        f"{sorted(extensions - documented)}; listed but not extensions: "
        f"{sorted(documented - extensions)}")
    # Most of the builder is grafonnet's own API.
    assert len(extensions) < len(functions) / 10


def test_jsonnetfile_declares_the_grafonnet_version_of_the_fixture() -> None:
    doc = json.loads((ROOT / "jsonnetfile.json").read_text(encoding="utf-8"))
    (dep,) = doc["dependencies"]
    assert dep["source"]["git"]["remote"] == "https://github.com/grafana/grafonnet.git"
    assert dep["source"]["git"]["subdir"] == "gen/grafonnet-v11.4.0"
    assert "v11.4.0" in API.read_text(encoding="utf-8").splitlines()[0]
