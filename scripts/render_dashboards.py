"""Pictures of the dashboards on known data: `make docs-images` runs this.

The packaged demo story (`specwatch demo`, real Prometheus, the mixin's rules) is played to
its end; then every time-series and stat panel of each generated dashboard runs its own
queries over the whole story, with the variables a user's Grafana would set by default (each
query variable at All, each custom one at its default, $__rate_interval 4 x the demo's 1 s
scrape), and is drawn with matplotlib: lines with their legends, the panel's unit, and its
threshold lines where the panel draws them; a stat shows its value at the end. One PNG per
dashboard lands in docs/img/dashboard-<name>.png. It does not imitate Grafana: it shows
what the queries return, so a change that breaks a panel shows in review.

    scripts/render_dashboards.py [--out docs/img]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from specwatch.app import demo as demo_app
from specwatch.cli import demo as demo_cli

ROOT = Path(__file__).resolve().parents[1]

DRAWN = ("timeseries", "stat")
_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.*),\s*(?P<label>[a-zA-Z_]\w*)\)$")
_REGEX_SPECIAL = re.compile(r"([$^*{}\[\]'+?.()|\\])")


def _get(prom: str, path: str, params: dict[str, Any]) -> Any:
    url = f"{prom}{path}?{urllib.parse.urlencode(params, doseq=True)}"
    with urllib.request.urlopen(url, timeout=60) as r:
        body = json.loads(r.read().decode())
    if body["status"] != "success":
        raise RuntimeError(f"{path}: {body}")
    return body["data"]


def substitute(expr: str, variables: dict[str, str]) -> str:
    for name in sorted(variables, key=len, reverse=True):
        value = variables[name]
        expr = re.sub(r"\$\{" + name + r"(?::\w+)?\}", lambda _m, v=value: v, expr)
        expr = expr.replace("$" + name, value)
    return expr


def grafana_vars(prom: str, dashboard: dict[str, Any], start: float, end: float
                 ) -> dict[str, str]:
    """Each variable as Grafana sets it by default: query variables at All (their allValue,
    or the regex of the values their label_values() finds), custom ones at their default."""
    out = {"__rate_interval": "4s"}
    for v in dashboard["templating"]["list"]:
        if v["type"] == "datasource":
            out[v["name"]] = "prometheus"
        elif v["type"] == "custom":
            out[v["name"]] = v["current"]["value"]
        elif v["type"] == "query":
            m = _LABEL_VALUES.match(v["query"])
            if not m:
                raise RuntimeError(f"variable {v['name']}: unsupported query {v['query']!r}")
            series = _get(prom, "/api/v1/series", {
                "match[]": substitute(m.group("selector"), out), "start": start, "end": end})
            values = sorted({s[m.group("label")] for s in series if m.group("label") in s})
            out[v["name"]] = v.get("allValue") or (
                "(" + "|".join(_REGEX_SPECIAL.sub(r"\\\\\1", x) for x in values) + ")")
    return out


def _legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt or "") \
        or ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def draw_panel(ax: Any, panel: dict[str, Any], prom: str, variables: dict[str, str],
               start: float, end: float, to_minutes: Any) -> None:
    step = max((end - start) / 400.0, 1.0)
    lines = 0
    for t in panel.get("targets", []):
        expr = substitute(t["expr"], variables)
        if t.get("instant"):
            rows = _get(prom, "/api/v1/query", {"query": expr, "time": end})["result"]
            for r in rows:
                ax.plot([to_minutes(end)], [float(r["value"][1])], "o",
                        label=_legend(t.get("legendFormat", ""), r["metric"])[:60])
                lines += 1
            continue
        rows = _get(prom, "/api/v1/query_range", {"query": expr, "start": start, "end": end,
                                                   "step": step})["result"]
        for r in rows:
            xs = [to_minutes(float(ts)) for ts, _ in r["values"]]
            ys = [float(v) for _, v in r["values"]]
            ax.plot(xs, ys, linewidth=1, label=_legend(t.get("legendFormat", ""), r["metric"])[:60])
            lines += 1
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    style = defaults.get("custom", {}).get("thresholdsStyle", {}).get("mode", "off")
    if style != "off" or panel["type"] == "stat":
        for s in defaults.get("thresholds", {}).get("steps", []):
            if s.get("value") is not None and math.isfinite(s["value"]):
                ax.axhline(s["value"], color=s["color"].replace("dark-", ""), linestyle="--",
                           linewidth=0.8)
    ax.set_title(panel["title"][:70], fontsize=8)
    ax.set_ylabel(defaults.get("unit", ""), fontsize=7)
    ax.tick_params(labelsize=6)
    if lines:
        ax.legend(fontsize=5, loc="best")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)


def render(prom: str, dashboard: dict[str, Any], start: float, end: float, to_minutes: Any,
           out: Path) -> None:
    variables = grafana_vars(prom, dashboard, start, end)
    drawn = [p for p in _panels(dashboard) if p["type"] in DRAWN]
    cols = 3
    rows = math.ceil(len(drawn) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 5.5, rows * 3.2), squeeze=False)
    for ax, panel in zip(axes.flat, drawn, strict=False):
        draw_panel(ax, panel, prom, variables, start, end, to_minutes)
        ax.set_xlabel("scenario minutes", fontsize=6)
    for ax in list(axes.flat)[len(drawn):]:
        ax.axis("off")
    fig.suptitle(f"{dashboard['title']} on the demo story (panels' own queries)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    fig.savefig(out, dpi=80)
    plt.close(fig)
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dashboard.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    opts = parser.parse_args(argv)
    demo_parser = argparse.ArgumentParser()
    demo_cli.add_arguments(demo_parser)
    d = demo_app.Demo(demo_parser.parse_args(["--exporter-listen", "127.0.0.1:0"]))
    d.start()
    try:
        if not d.prometheus_url:
            print(f"render_dashboards: no Prometheus: {d.prometheus_note}", file=sys.stderr)
            return 2
        story_end = sum(ph.duration_s for ph in d.scenario.models[0].phases)
        start = time.time()
        while d.simulator.sim_time_now() < story_end + 60.0:
            time.sleep(1.0)
        end = time.time()
        speed, wall0 = d.options.speed, d.simulator.wall0

        def to_minutes(wall: float) -> float:
            return (wall - wall0) * speed / 60.0

        prom = d.prometheus_url.rstrip("/")
        for path in sorted((ROOT / "dashboards").glob("*.json")):
            dashboard = json.loads(path.read_text(encoding="utf-8"))
            render(prom, dashboard, start, end, to_minutes,
                   opts.out / f"dashboard-{path.stem}.png")
    finally:
        d.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
