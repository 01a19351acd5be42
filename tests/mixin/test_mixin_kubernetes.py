"""`specwatch mixin render --format kubernetes`: PrometheusRule objects and Grafana dashboard
ConfigMaps with the user's selectors and URLs, from the wheel, checked against vendored
schemas; deploy/kubernetes/mixin/ is the same code's output for the defaults.

Why: the Operator path needed a development checkout (edit config.libsonnet, `make
generate`), and the pre-rendered manifests carried job="vllm", job="specwatch" and
http://127.0.0.1:3000 with nothing to change them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from specwatch import cli
from specwatch.common.errors import ConfigError
from specwatch.mixin import kubernetes

ROOT = Path(__file__).resolve().parents[2]
SETS = ['vllmSelector=job="inference", namespace="llm"',
        'exporterSelector=job="specwatch", namespace="monitoring"',
        "grafanaURL=https://grafana.example.com"]


def _render(out: Path, *extra: str, sets: list[str] = SETS) -> None:
    args = ["mixin", "render", "--out", str(out), *extra]
    for item in sets:
        args += ["--set", item]
    assert cli.main(args) == 0


def _objects(folder: Path) -> dict[str, dict]:
    out = {}
    for path in sorted(folder.glob("*.yaml")):
        (doc,) = list(yaml.safe_load_all(path.read_text()))
        out[path.name] = doc
    return out


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("k8s")
    _render(base / "files")
    _render(base / "k8s", "--format", "kubernetes")
    return base / "files", base / "k8s"


def test_kubernetes_format_writes_rules_dashboards_and_a_kustomization(rendered) -> None:
    files, k8s = rendered
    objects = _objects(k8s)
    assert set(objects) == {
        "prometheusrule-specwatch-alerts.yaml", "prometheusrule-specwatch-rules.yaml",
        "configmap-specwatch-sd-overview-dashboard.yaml",
        "configmap-specwatch-exporter-dashboard.yaml", "kustomization.yaml"}
    assert sorted(objects["kustomization.yaml"]["resources"]) == sorted(
        n for n in objects if n != "kustomization.yaml")
    for name in ("alerts", "rules"):
        rule = objects[f"prometheusrule-specwatch-{name}.yaml"]
        assert rule["apiVersion"] == "monitoring.coreos.com/v1"
        plain = yaml.safe_load((files / "alerts" / f"specwatch-{name}.yaml").read_text())
        assert rule["spec"]["groups"] == plain["groups"]
    text = (k8s / "prometheusrule-specwatch-alerts.yaml").read_text()
    assert 'job="specwatch", namespace="monitoring"' in text
    assert "https://grafana.example.com/d/" in text and "127.0.0.1:3000" not in text
    assert 'job="inference", namespace="llm"' in (
        k8s / "prometheusrule-specwatch-rules.yaml").read_text()
    for stem in ("specwatch-sd-overview", "specwatch-exporter"):
        cm = objects[f"configmap-{stem}-dashboard.yaml"]
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["data"] == {f"{stem}.json": (files / "dashboards" / f"{stem}.json")
                              .read_text()}
    assert "--format kubernetes --set" in text.splitlines()[0]


def test_the_objects_pass_kubernetes_own_schemas_and_kustomize(rendered) -> None:
    """Beside the vendored schemas the renderer checks: the ConfigMaps strictly against the
    Kubernetes API's schemas (kubernetes-validate) and the folder through kustomize."""
    _, k8s = rendered
    for doc in _objects(k8s).values():
        if doc.get("kind") == "ConfigMap":
            kubernetes_validate.validate(doc, "1.29", strict=True)
    kubectl = Path(sys.executable).parent / "kubectl"
    result = subprocess.run([kubectl, "kustomize", str(k8s)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(result.stdout)]
    assert sorted(kinds) == ["ConfigMap", "ConfigMap", "PrometheusRule", "PrometheusRule"]


def test_the_committed_manifests_are_this_renderers_defaults(tmp_path: Path) -> None:
    """deploy/kubernetes/mixin/ holds the same objects as the command with no --set: its
    job="vllm", job="specwatch" and 127.0.0.1:3000 are the defaults, made the user's by it."""
    _render(tmp_path, "--format", "kubernetes", sets=[])
    assert _objects(tmp_path) == _objects(ROOT / "deploy" / "kubernetes" / "mixin")
    header = (ROOT / "deploy" / "kubernetes" / "mixin" / "kustomization.yaml").read_text()
    assert "default config.libsonnet" in header
    assert "specwatch mixin render --format kubernetes" in header


@pytest.mark.parametrize(("obj", "message"), [
    ({"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
      "metadata": {"name": "x"},
      "spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up", "fro": "5m"}]}]}},
     "spec.groups.0.rules.0"),
    ({"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
      "metadata": {"name": "x"},
      "spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up",
                                                   "for": "five minutes"}]}]}},
     "for"),
    ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "label": {}},
      "data": {}}, "metadata"),
    ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"},
      "data": {"a.json": 3}}, "data.a.json"),
])
def test_the_schema_check_refuses_what_the_api_would(obj: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        kubernetes.check(obj, "obj.yaml")
    text = str(info.value)
    assert text.startswith("obj.yaml: ") and message in text and "\n" not in text


def test_the_vendored_schemas_accept_the_shipped_objects() -> None:
    for path in sorted((ROOT / "deploy" / "kubernetes" / "mixin").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc["kind"] != "Kustomization":
            kubernetes.check(doc, path.name)
    # And the dashboards' JSON stays the ConfigMap's string, not an object.
    doc = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "mixin" /
                          "configmap-specwatch-exporter-dashboard.yaml").read_text())
    assert json.loads(doc["data"]["specwatch-exporter.json"])["uid"]


def test_the_readme_overlay_replaces_the_default_rules_and_dashboards(tmp_path: Path) -> None:
    """deploy/README's overlay (section 3, step 2), with a copy of deploy/kubernetes for the
    remote base: kustomize's output carries the user's selectors and Grafana URL only."""
    readme = (ROOT / "deploy" / "README.md").read_text()
    patches = [line.strip().removeprefix("- path: ") for line in readme.splitlines()
               if line.strip().startswith("- path: specwatch-mixin/")]
    assert len(patches) == 4
    shutil.copytree(ROOT / "deploy" / "kubernetes", tmp_path / "kubernetes")
    overlay = tmp_path / "overlay"
    _render(overlay / "specwatch-mixin", "--format", "kubernetes",
            sets=['vllmSelector=job="inference"', "grafanaURL=https://grafana.example.com"])
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": "llm-serving", "resources": ["../kubernetes/base"],
        "patches": [{"path": p} for p in patches]}))
    kubectl = Path(sys.executable).parent / "kubectl"
    result = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert 'job="inference"' in result.stdout and 'job="vllm"' not in result.stdout
    assert "127.0.0.1:3000" not in result.stdout
    rules = [d for d in yaml.safe_load_all(result.stdout) if d["kind"] == "PrometheusRule"]
    alerts = [r for d in rules for g in d["spec"]["groups"] for r in g["rules"] if "alert" in r]
    shipped = yaml.safe_load((ROOT / "alerts" / "specwatch-alerts.yaml").read_text())
    assert len(alerts) == sum(1 for g in shipped["groups"] for r in g["rules"] if "alert" in r)
