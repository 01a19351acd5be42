#!/usr/bin/env bash
# Explained in docs/controller.md (command mode).
# specwatch controller -> systemd: switch vLLM's speculative decoding off or on for a vLLM
# server run by a systemd unit, then restart the unit.
#
# The unit reads its SD arguments from an environment file this script rewrites:
#   # /etc/systemd/system/vllm.service (excerpt)
#   [Service]
#   EnvironmentFile=/etc/vllm/speculative.env
#   ExecStart=/opt/vllm/bin/vllm serve Qwen/Qwen3-32B --port 8000 $VLLM_SPECULATIVE_ARGS
# ($VAR, not ${VAR}: systemd drops an empty $VAR and keeps a non-empty one as one word, so
# the compact JSON below must contain no spaces.)
#
# Use it as the controller's command (README, "Controller"):
#   controller: {mode: command, command: {argv: [/usr/local/lib/specwatch/systemd-switch-sd.sh]}}
# The decision payload (JSON) arrives on stdin. Settings (environment of specwatch serve):
#   SPECWATCH_SYSTEMD_UNIT         unit to restart          (default: vllm.service)
#   SPECWATCH_SYSTEMD_ENV_FILE     environment file          (default: /etc/vllm/speculative.env)
#   SPECWATCH_SYSTEMD_BASE_CONFIG  the SD configuration to switch back on, JSON with method,
#                                  model... (default: /etc/vllm/speculative-config.json)
#   SPECWATCH_USE_SCHEDULE         1: on enable, also hand vLLM the batch-size schedule
#   SYSTEMCTL                      systemctl command (default: systemctl; e.g. "sudo systemctl"
#                                  with a sudoers rule for this one unit)
# Safe to retry: the last applied decision id is kept next to the environment file; a
# decision already applied exits 0 without restarting vLLM again.
set -euo pipefail

UNIT="${SPECWATCH_SYSTEMD_UNIT:-vllm.service}"
ENV_FILE="${SPECWATCH_SYSTEMD_ENV_FILE:-/etc/vllm/speculative.env}"
BASE_CONFIG="${SPECWATCH_SYSTEMD_BASE_CONFIG:-/etc/vllm/speculative-config.json}"
read -r -a SYSTEMCTL <<< "${SYSTEMCTL:-systemctl}"
STATE_FILE="${ENV_FILE}.decision"
payload="$(cat)"

decision="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["decision_id"])' "$payload")"
if [ -f "$STATE_FILE" ] && [ "$(cat "$STATE_FILE")" = "$decision" ]; then
  echo "decision $decision already applied; nothing to do" >&2
  exit 0
fi

line="$(python3 - "$payload" "$BASE_CONFIG" "${SPECWATCH_USE_SCHEDULE:-0}" <<'PY'
import json
import sys

payload, base_path, use_schedule = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
if payload["action"] == "disable":
    print("VLLM_SPECULATIVE_ARGS=")
    sys.exit(0)
with open(base_path, encoding="utf-8") as fh:
    config = json.load(fh)
config.pop("num_speculative_tokens_per_batch_size", None)
dynamic = payload.get("dynamic_speculative_config_update")
config.update(dynamic if use_schedule and dynamic else
              payload.get("speculative_config_update") or {})
print("VLLM_SPECULATIVE_ARGS=--speculative-config=" + json.dumps(config, separators=(",", ":")))
PY
)"

tmp="$(mktemp "${ENV_FILE}.XXXXXX")"
printf '# written by specwatch (decision %s)\n%s\n' "$decision" "$line" > "$tmp"
chmod 0644 "$tmp"
mv -f "$tmp" "$ENV_FILE"
"${SYSTEMCTL[@]}" restart "$UNIT"
printf '%s\n' "$decision" > "$STATE_FILE"
echo "$UNIT restarted with: $line" >&2
