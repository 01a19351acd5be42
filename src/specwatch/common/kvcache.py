"""What one vLLM engine states about its KV cache in its ``vllm:cache_config_info`` labels:
read by the poll path (a live page) and by calibration (a Prometheus history) alike."""

from __future__ import annotations

import math
from collections.abc import Mapping


def label_number(labels: Mapping[str, str], name: str) -> float | None:
    """A positive finite number written in a label ("None" before the engine profiled)."""
    try:
        v = float(labels.get(name, ""))
    except ValueError:
        return None
    return v if math.isfinite(v) and v > 0 else None


def engine_kv_cache(labels: Mapping[str, str]) -> tuple[float | None, float | None,
                                                         float | None]:
    """(tokens, blocks, block size) one engine states; tokens is ``kv_cache_size_tokens``,
    else ``num_gpu_blocks`` × ``block_size`` (older vLLM); None where not stated."""
    blocks = label_number(labels, "num_gpu_blocks")
    size = label_number(labels, "block_size")
    tokens = label_number(labels, "kv_cache_size_tokens")
    if tokens is None and blocks is not None and size is not None:
        tokens = blocks * size
    return tokens, blocks, size
