#!/usr/bin/env bash
# Explained in docs/controller.md (command mode).
# specwatch controller -> Kubernetes: switch vLLM's speculative decoding off or on by patching
# the Deployment's --speculative-config argument. Changing the pod template makes Kubernetes
# roll the Deployment; specwatch sees the new configuration on the restarted server's
# /metrics (SD families gone or back) and leaves its `pending` state.
#
# Use it as the controller's command (README, "Controller"):
#   controller: {mode: command, command: {argv: [/opt/specwatch/kubernetes-switch-sd.sh]}}
# The decision payload (JSON) arrives on stdin. Settings (environment of specwatch serve):
#   SPECWATCH_K8S_NAMESPACE   namespace of the vLLM Deployment        (default: default)
#   SPECWATCH_K8S_DEPLOYMENT  Deployment name                         (default: the target)
#   SPECWATCH_K8S_CONTAINER   container running `vllm serve`          (default: vllm)
#   SPECWATCH_USE_SCHEDULE    1: on enable, also hand vLLM the batch-size schedule
#                             (num_speculative_tokens_per_batch_size: dynamic SD)
#   KUBECTL                   kubectl binary                          (default: kubectl)
# RBAC: get and patch on deployments in that namespace (see README, "Controller").
#
# Safe to retry: the decision id is stored in the annotation specwatch.io/last-decision and
# a decision already applied exits 0 without patching again. Switching off stashes the
# running --speculative-config in the annotation specwatch.io/speculative-config, so
# switching on restores the method and drafter and only sets the draft length.
set -euo pipefail

KUBECTL="${KUBECTL:-kubectl}"
NAMESPACE="${SPECWATCH_K8S_NAMESPACE:-default}"
CONTAINER="${SPECWATCH_K8S_CONTAINER:-vllm}"
payload="$(cat)"
target="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["target"])' "$payload")"
DEPLOYMENT="${SPECWATCH_K8S_DEPLOYMENT:-$target}"

deployment="$("$KUBECTL" get deployment "$DEPLOYMENT" --namespace "$NAMESPACE" -o json)"

# Build the JSON patch (or nothing when this decision was already applied).
patch="$(python3 - "$payload" "$deployment" "$CONTAINER" "${SPECWATCH_USE_SCHEDULE:-0}" <<'PY'
import json
import sys

payload, deployment = json.loads(sys.argv[1]), json.loads(sys.argv[2])
container_name, use_schedule = sys.argv[3], sys.argv[4] == "1"
FLAGS = ("--speculative-config", "-sc")
annotations = deployment["metadata"].get("annotations") or {}
if annotations.get("specwatch.io/last-decision") == payload["decision_id"]:
    sys.exit(0)  # already applied: print no patch
containers = deployment["spec"]["template"]["spec"]["containers"]
index = next((i for i, c in enumerate(containers) if c["name"] == container_name), None)
if index is None:
    sys.exit(f"no container {container_name!r} in the deployment")
args = list(containers[index].get("args") or [])

# Find and remove the running --speculative-config (both `--flag=value` and `--flag value`).
current, kept, skip = None, [], False
for i, arg in enumerate(args):
    if skip:
        skip = False
        continue
    name, eq, value = arg.partition("=")
    if name in FLAGS:
        if eq:
            current = value
        elif i + 1 < len(args):
            current, skip = args[i + 1], True
        continue
    kept.append(arg)

ops = []
stash = annotations.get("specwatch.io/speculative-config")
if payload["action"] == "disable":
    new_args = kept
    if current is not None:
        stash = current
else:
    base = current or stash
    if base is None:
        sys.exit("enable: no --speculative-config running and none stashed by a previous "
                 "disable; add the annotation specwatch.io/speculative-config")
    config = json.loads(base)
    update = payload.get("speculative_config_update") or {}
    dynamic = payload.get("dynamic_speculative_config_update")
    config.pop("num_speculative_tokens_per_batch_size", None)
    config.update(dynamic if use_schedule and dynamic else update)
    new_args = [*kept, "--speculative-config=" + json.dumps(config, separators=(",", ":"))]

path = f"/spec/template/spec/containers/{index}/args"
ops.append({"op": "add", "path": path, "value": new_args})
new_annotations = dict(annotations)
new_annotations["specwatch.io/last-decision"] = payload["decision_id"]
if stash is not None:
    new_annotations["specwatch.io/speculative-config"] = stash
ops.append({"op": "add", "path": "/metadata/annotations", "value": new_annotations})
print(json.dumps(ops))
PY
)"

if [ -z "$patch" ]; then
  echo "decision already applied to deployment/$DEPLOYMENT; nothing to do" >&2
  exit 0
fi
"$KUBECTL" patch deployment "$DEPLOYMENT" --namespace "$NAMESPACE" --type=json -p "$patch"
echo "deployment/$DEPLOYMENT patched; Kubernetes is rolling it out" >&2
