"""The SD dashboard's lines from the recording rules cover a mixed fleet.

Protected behaviour: every SD-overview query that reads recorded series (the "engine
counters" lines) draws each server of the five-engine fleet of
alerts/tests/engine-fleet-recording-rules.yaml (vLLM v1 and v0, SGLang, TensorRT-LLM,
llama.cpp) that records what the query reads, and no other. The query is the dashboard's
own text, evaluated by promtool over the real rule file and that test's input series; which
server records which name is that promtool test's own expectation, not written here.
"""

from __future__ import annotations

import re
import subprocess

import yaml
from mixin_helpers import REPO, dashboard_exprs, load_dashboards, metric_names, promtool
from mixin_helpers import recorded_metrics as recorded_names

FLEET = REPO / "alerts" / "tests" / "engine-fleet-recording-rules.yaml"
SD = "specwatch-sd-overview.json"
# What Grafana puts in place of the variables with every option selected.
VARIABLES = {"job": "specwatch", "vllm_job": "vllm", "target": ".+", "model_name": ".+",
             "cluster": ".+", "window": "5m", "__rate_interval": "1m"}
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def _substitute(expr: str) -> str:
    for name in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", VARIABLES[name]).replace("$" + name,
                                                                        VARIABLES[name])
    return expr


def _servers_recording() -> dict[str, set[tuple[str, str]]]:
    """Recorded name -> the fleet's (job, model_name) servers it holds a series for, from
    the fleet promtool test's expected samples."""
    [case] = yaml.safe_load(FLEET.read_text(encoding="utf-8"))["tests"]
    servers: dict[str, set[tuple[str, str]]] = {}
    for check in case["promql_expr_test"]:
        [name] = metric_names(check["expr"])
        for sample in check["exp_samples"]:
            labels = dict(_LABEL.findall(sample["labels"]))
            servers.setdefault(name, set()).add((labels["job"], labels["model_name"]))
    return servers


def test_the_fleet_test_states_every_recorded_name():
    """The truth the dashboard test reads is complete: the fleet promtool test expects
    samples of every recorded name, and covers five servers of four jobs."""
    servers = _servers_recording()
    assert set(servers) == recorded_names()
    assert len(set().union(*servers.values())) == 5


def test_recorded_lines_draw_every_engine_of_the_fleet(tmp_path):
    """Each recorded-series query of the SD dashboard returns, per (job, model_name), a line
    for exactly the fleet's servers that record every name it reads: the lines once drew
    vLLM's servers only (filtered by the vLLM job)."""
    servers = _servers_recording()
    [case] = yaml.safe_load(FLEET.read_text(encoding="utf-8"))["tests"]
    checks, where_of = [], []
    for where, expr in dashboard_exprs(SD, load_dashboards()[SD]):
        names = metric_names(expr) & recorded_names()
        if "panel" not in where or not names:
            continue
        expected = set.intersection(*(servers[n] for n in names))
        assert expected, f"{where}: no server of the fleet records {sorted(names)}"
        checks.append({
            "expr": f"group by (job, model_name) ({_substitute(expr)})",
            "eval_time": "10m",
            "exp_samples": [{"labels": f'{{job="{job}", model_name="{model}"}}', "value": 1}
                            for job, model in sorted(expected)],
        })
        where_of.append(where)
    assert len(checks) >= 9, where_of
    test_file = tmp_path / "fleet-dashboard.yaml"
    test_file.write_text(yaml.safe_dump({
        "rule_files": [str(REPO / "alerts" / "specwatch-rules.yaml")],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": case["input_series"],
                   "promql_expr_test": checks}],
    }), encoding="utf-8")
    proc = subprocess.run([promtool(), "test", "rules", str(test_file)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, "\n".join(where_of) + "\n" + proc.stdout + proc.stderr
