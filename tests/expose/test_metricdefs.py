"""The metric table (`specwatch.expose.metricdefs`) is what `/metrics` serves: every family
the exporter exposes is defined there with the same type, HELP text and labels, and no
collector builds a family of its own. The metrics reference (docs/metrics.md) is generated from
that table (tests/test_docs_generated.py), so the page is what a scrape shows.
"""

from __future__ import annotations

import ast
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from specwatch.app.catalogue import BY_NAME, METRICS
from specwatch.expose import metricdefs

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "specwatch"
NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


def test_table_names_are_unique_and_follow_prometheus_naming() -> None:
    assert len(BY_NAME) == len(METRICS)
    for m in METRICS:
        assert NAME.match(m.name), m.name
        assert m.type in metricdefs.TYPES, m
        assert m.name.startswith(("sd_", "specwatch_")), m.name
        assert not m.name.endswith("_total"), f"{m.name}: counters are named without _total"
        assert not re.search(r"_(milli|micro)?seconds_|_ms$|_millis", m.name), m.name
        assert m.help.endswith(".") and m.doc, m.name
        assert len(set(m.labels)) == len(m.labels), m.name


def test_every_help_is_one_short_line() -> None:
    """HELP is what `curl /metrics` and Prometheus's metric explorer show: one plain line of at
    most 100 characters, for the exporter's series and every plug-in's (the catalogue holds
    them all); formulas and caveats are in the reference's `doc` column."""
    for d in METRICS:
        assert "\n" not in d.help and d.help.strip() == d.help, d.name
        assert len(d.help) <= metricdefs.HELP_MAX_CHARS, f"{d.name}: {len(d.help)} chars"


def test_no_collector_builds_a_family_outside_the_table() -> None:
    """Every `*MetricFamily(...)` call of the exporter lives in metricdefs; the simulator's
    families (vLLM's own names) are the only others. A new series is added to the table."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "expose/metricdefs.py" or rel.startswith("sim/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute)
                    and (getattr(node.func, "id", None) or getattr(node.func, "attr", ""))
                    .endswith("MetricFamily")):
                offenders.append(f"{rel}:{node.lineno}")
    assert offenders == [], (
        "metric families built outside specwatch.expose.metricdefs (add the series to "
        f"METRICS and build it with metricdefs.gauge/counter/histogram): {offenders}")


def test_builders_refuse_names_or_types_the_table_does_not_define() -> None:
    try:
        metricdefs.gauge("sd_not_a_series")
    except KeyError as exc:
        assert "metricdefs.METRICS" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("an unknown name was accepted")
    try:
        metricdefs.counter("sd_acceptance_rate")
    except TypeError as exc:
        assert "is a gauge" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("a gauge was built as a counter")


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def test_what_the_exporter_serves_is_what_the_table_defines() -> None:
    """The demo (simulator + exporter with the latency model and the controller) scraped:
    each family's type, HELP and label names are the table's."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "specwatch", "demo", "--speed", "20", "--poll-interval", "1",
         "--exporter-listen", "127.0.0.1:0", "--prometheus", "off", "--duration", "90"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    try:
        exporter = None
        deadline = time.monotonic() + 60
        while exporter is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "demo exited before printing its banner"
            m = re.search(r"exporter\s+(http://\S+)", line)
            exporter = m.group(1) if m else None
        assert exporter
        wanted = {"sd_acceptance_rate", "sd_predicted_speedup", "sd_controller_state",
                  "specwatch_target_up", "specwatch_http_requests_in_flight"}
        deadline = time.monotonic() + 60
        while True:
            text = _get(exporter)
            families = {f.name: f for f in text_string_to_metric_families(text)}
            if wanted <= {n for n, f in families.items() if f.samples}:
                break
            assert time.monotonic() < deadline, sorted(wanted - set(families))
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    checked = 0
    for name, fam in families.items():
        # Every HELP a scrape shows, prometheus_client's own families included.
        assert len(fam.documentation) <= metricdefs.HELP_MAX_CHARS, (name, fam.documentation)
        if name.startswith(("process_", "python_")):
            continue
        assert name in BY_NAME, f"{name} is served but not defined in metricdefs.METRICS"
        d = BY_NAME[name]
        assert fam.type == d.type, name
        assert fam.documentation == d.help, name
        for sample in fam.samples:
            labels = set(sample.labels) - {"le"}
            assert labels == set(d.labels), f"{sample.name}: labels {sorted(labels)}"
        checked += 1
    assert checked >= 25, sorted(families)
