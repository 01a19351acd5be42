"""The mixin's rules and dashboards as Kubernetes objects: one PrometheusRule (Prometheus
Operator, ``monitoring.coreos.com/v1``) per rule file and one ConfigMap labelled
``grafana_dashboard: "1"`` (the label the Grafana Helm chart's dashboard sidecar watches) per
dashboard, and a kustomization listing them.

One code path for both uses: ``specwatch mixin render --format kubernetes`` (the user's
selectors and URLs, from the wheel) and scripts/generate_deploy.py (the committed
deploy/kubernetes/mixin/, with the defaults). Everything is deterministic (sorted inputs,
fixed key order), so the generator's check compares bytes.

Every object is checked offline against a vendored JSON schema before it is written, as
kubeconform does (strict: unknown fields refused): ``schemas/`` holds the PrometheusRule CRD's
OpenAPI schema and the ConfigMap schema (their README says where they come from).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import PurePosixPath
from typing import Any

import yaml

from specwatch.common.errors import ConfigError

COMMON_LABELS = {
    "app.kubernetes.io/name": "specwatch",
    "app.kubernetes.io/component": "mixin",
}
# kube-prometheus' default ruleSelector; kube-prometheus-stack selects on `release` instead,
# which an overlay adds (deploy/README.md).
RULE_LABELS = {"prometheus": "k8s", "role": "alert-rules"}
DASHBOARD_LABEL = {"grafana_dashboard": "1"}
# The Grafana chart's sidecar puts the dashboard in this folder when its
# `sidecar.dashboards.folderAnnotation` is set to `grafana_folder`.
DASHBOARD_ANNOTATIONS = {"grafana_folder": "specwatch"}
# `kubectl apply` (client side) stores the whole object in an annotation limited to 256 KiB.
MAX_CONFIGMAP_BYTES = 262_144
SCHEMAS = {
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-monitoring-v1.json",
    ("v1", "ConfigMap"): "configmap-v1.json",
}


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (PromQL, descriptions, dashboard JSON): the
    manifests stay readable and their diffs line-oriented."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_representer)


def dump(documents: Iterable[Mapping[str, Any]]) -> str:
    return yaml.dump_all(
        list(documents), Dumper=_Dumper, sort_keys=False, width=10_000,
        default_flow_style=False, allow_unicode=True, explicit_start=True,
    )


def k8s_name(stem: str) -> str:
    """A file stem as a Kubernetes object name (RFC 1123 subdomain, at most 253 chars)."""
    name = re.sub(r"[^a-z0-9.-]+", "-", stem.lower()).strip("-.")
    if not name:
        raise ConfigError(f"cannot derive a Kubernetes name from {stem!r}")
    return name[:253]


def prometheus_rule(rel: str, text: str) -> dict[str, Any]:
    """One rule file as a PrometheusRule: `spec.groups` is the file's `groups` unchanged."""
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict) or not doc.get("groups"):
        raise ConfigError(f"{rel}: not a Prometheus rule file with groups")
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": k8s_name(PurePosixPath(rel).stem),
            "labels": {**COMMON_LABELS, **RULE_LABELS},
        },
        "spec": {"groups": doc["groups"]},
    }


def dashboard_configmap(rel: str, text: str) -> dict[str, Any]:
    """One dashboard as a ConfigMap for the Grafana sidecar; the JSON is kept byte for byte."""
    try:
        dashboard = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{rel}: not valid JSON (line {exc.lineno}: {exc.msg})") from exc
    if not isinstance(dashboard, dict) or not dashboard.get("uid"):
        raise ConfigError(f"{rel}: not a Grafana dashboard (no `uid`)")
    size = len(text.encode("utf-8"))
    if size > MAX_CONFIGMAP_BYTES:
        raise ConfigError(f"{rel}: {size} bytes, over the {MAX_CONFIGMAP_BYTES} bytes that "
                          "`kubectl apply` can store; split the dashboard")
    path = PurePosixPath(rel)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": k8s_name(f"{path.stem}-dashboard"),
            "labels": {**COMMON_LABELS, **DASHBOARD_LABEL},
            "annotations": dict(DASHBOARD_ANNOTATIONS),
        },
        "data": {path.name: text},
    }


@functools.cache
def _validator(name: str) -> Any:
    import jsonschema  # a dependency of specwatch; imported where it is used

    schema = json.loads(resources.files("specwatch.mixin").joinpath("schemas", name)
                        .read_text(encoding="utf-8"))
    return jsonschema.Draft7Validator(schema)


def check(obj: Mapping[str, Any], where: str) -> None:
    """Raise ConfigError when ``obj`` does not validate against its kind's vendored schema."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in SCHEMAS:
        raise ConfigError(f"{where}: no schema for {key[1]} {key[0]}")
    errors = sorted(_validator(SCHEMAS[key]).iter_errors(obj), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        at = ".".join(str(p) for p in first.absolute_path) or "(object)"
        raise ConfigError(f"{where}: {key[1]} fails its schema at {at}: {first.message}")


def manifests(files: Mapping[str, str], header: str) -> dict[str, str]:
    """The Kubernetes rendering of the mixin's files (relative path -> text: rule files
    ``alerts/*.yaml``, dashboards ``dashboards/*.json``): file name -> manifest text, the
    kustomization included. ``header`` is formatted with ``source`` (the input's path)."""
    out: dict[str, str] = {}
    resources_: list[str] = []
    rules = sorted(rel for rel in files if re.fullmatch(r"alerts/[^/]+\.yaml", rel))
    dashboards = sorted(rel for rel in files if re.fullmatch(r"dashboards/[^/]+\.json", rel))
    kinds = [*((rel, prometheus_rule, "prometheusrule") for rel in rules),
             *((rel, dashboard_configmap, "configmap") for rel in dashboards)]
    for rel, build, prefix in kinds:
        obj = build(rel, files[rel])
        name = f"{prefix}-{obj['metadata']['name']}.yaml"
        check(obj, name)
        out[name] = header.format(source=rel) + dump([obj])
        resources_.append(name)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": resources_,
    }
    out["kustomization.yaml"] = header.format(source="alerts/*.yaml, dashboards/*.json") + (
        yaml.dump(kustomization, Dumper=_Dumper, sort_keys=False, default_flow_style=False))
    return out
