"""The README's `specwatch mixin render` command, run as written, gives rules whose alerts fire
on the series the shipped scrape configurations produce.

Why: the two selectors pick different scrape jobs (vLLM's own series, specwatch's sd_*
series). The shipped Prometheus config and ServiceMonitor scrape the exporter as
job="specwatch"; a README command that sent the sd_* queries to another job produced alerts
that never fire, with nothing failing anywhere.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from helpers.readme import readme_command, with_out
from mixin_helpers import promtool

from specwatch import cli

ROOT = Path(__file__).resolve().parents[2]


def _exporter_job() -> str:
    """The job name the shipped Prometheus config scrapes specwatch's own port under."""
    doc = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    (job,) = [s["job_name"] for s in doc["scrape_configs"]
              if any(t.endswith(":10440") for c in s.get("static_configs", [])
                     for t in c["targets"])]
    return job


def test_shipped_scrape_configs_name_the_exporter_job_the_same() -> None:
    job = _exporter_job()
    monitors = list(yaml.safe_load_all(
        (ROOT / "deploy" / "kubernetes" / "base" / "servicemonitor.yaml").read_text()))
    exporter = next(m for m in monitors if m["metadata"]["name"] == "specwatch")
    # Without spec.jobLabel the Prometheus Operator names the job after the Service.
    service = yaml.safe_load(
        (ROOT / "deploy" / "kubernetes" / "base" / "service.yaml").read_text())
    assert "jobLabel" not in exporter["spec"] and service["metadata"]["name"] == job


def test_readme_mixin_command_gives_an_acceptance_alert_that_fires(tmp_path: Path) -> None:
    argv = readme_command("specwatch mixin render")
    out = tmp_path / "monitoring"
    assert cli.main(with_out(argv[1:], out)) == 0
    job = _exporter_job()
    labels = (f'job="{job}", instance="specwatch:10440", target="vllm-a", '
              'model_name="llama-8b", window="1m"')
    test = {
        "rule_files": ["../alerts/specwatch-alerts.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": f'sd_acceptance_alpha{{{labels}, method="first_position"}}',
                 "values": "0.2x30"},
                {"series": f"sd_arrival_rate{{{labels}}}", "values": "2x30"},
            ],
            "promql_expr_test": [{
                "expr": 'count(ALERTS{alertname="SDAcceptanceRateLow", alertstate="firing",'
                        ' target="vllm-a"})',
                "eval_time": "20m",
                "exp_samples": [{"labels": "{}", "value": 1}],
            }],
        }],
    }
    (out / "tests").mkdir()
    path = out / "tests" / "readme-acceptance.yaml"
    path.write_text(yaml.safe_dump(test), encoding="utf-8")
    result = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, (argv, result.stdout + result.stderr)
