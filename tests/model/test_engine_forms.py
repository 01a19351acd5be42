"""The batch-size schedule in the forms SGLang and TensorRT-LLM read: each form, read the way
the engine reads it, gives the vLLM schedule's k at every batch size 1..max_num_seqs, and
passes the checks the engine's own parser makes.

Neither engine installs here (both need CUDA builds of torch), so their rules are taken from
their sources and cited:

- SGLang ``--speculative-adaptive-config`` (sgl-project/sglang):
  python/sglang/srt/speculative/adaptive_spec_params.py at commit
  015c872628e328b530880bcf95ae91222604b225 (``_load_adaptive_config``: a JSON object, slot
  keys are strings of digits, at least one; ``candidate_steps`` a non-empty list of
  non-negative ints; ``resolve_candidate_steps_from_config``: the union of the slots'
  candidates, which ``--speculative-num-steps`` must belong to), and
  python/sglang/srt/speculative/adaptive_step_router.py at commit
  a12239f6ac74d804d169ee5d3cfed3c49fa7162c (``batch_size_key_for_batch``: a batch goes to
  the largest key at or below its size, the smallest key below that).
- TensorRT-LLM ``draft_len_schedule`` (NVIDIA/TensorRT-LLM): tensorrt_llm/llmapi/llm_args.py
  at commit 0004396720054fd8e205cbf616f21f0b57c6b412, ``DecodingBaseConfig`` (batch sizes up
  to a key use its draft length, past the last key speculation is off;
  ``validate_draft_len_schedule_and_sort``: keys >= 1, lengths >= 0, the smallest key's
  length equals ``max_draft_len``, none above it).
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path

import pytest

from specwatch.cli import main
from specwatch.model.schedule import (
    schedule_k,
    sglang_adaptive_config,
    trtllm_draft_len_schedule,
)

PARAMS = Path(__file__).resolve().parents[2] / "examples/params/qwen3-32b-h100-eagle3.yaml"


def sglang_k(config: dict, batch_size: int) -> int:
    """The k SGLang's router picks for a batch (no CUDA-graph padding)."""
    keys = sorted(int(k) for k in config if k.isdigit())
    key = keys[max(0, bisect.bisect_right(keys, batch_size) - 1)]
    (k,) = config[str(key)]["candidate_steps"]
    return k


def check_sglang_config(config: object, num_steps: int) -> None:
    """What SGLang's loader refuses (a ValueError at start-up)."""
    assert isinstance(config, dict)
    slots = {k: v for k, v in config.items() if k.isdigit()}
    assert slots, "at least one integer-string batch-size key"
    for entry in slots.values():
        steps = entry["candidate_steps"]
        assert isinstance(steps, list) and steps
        assert all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps)
    assert num_steps in {s for e in slots.values() for s in e["candidate_steps"]}


def trtllm_k(schedule: dict[int, int], batch_size: int) -> int:
    """The draft length TensorRT-LLM runs at a batch size (0 past the last key)."""
    for bound in sorted(schedule):
        if batch_size <= bound:
            return schedule[bound]
    return 0


def check_trtllm_schedule(schedule: dict[int, int], max_draft_len: int) -> None:
    """What TensorRT-LLM's validator refuses."""
    assert all(isinstance(b, int) and b >= 1 for b in schedule)
    assert all(isinstance(k, int) and k >= 0 for k in schedule.values())
    assert schedule[min(schedule)] == max_draft_len
    assert all(k <= max_draft_len for k in schedule.values())


def advise(capsys, *extra: str) -> dict:
    rc = main(["advise", "--params", str(PARAMS), "--arrival-rate-p50", "1",
               "--arrival-rate-p95", "2", "--arrival-rate-p99", "3",
               "--prompt-tokens", "500", "--generation-tokens", "200", "--json", *extra])
    assert rc == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("max_num_seqs", [64, 256])
def test_each_engine_reads_the_advised_schedule_at_every_batch_size(capsys,
                                                                   max_num_seqs: int) -> None:
    out = advise(capsys, "--alpha", "0.5", "--max-num-seqs", str(max_num_seqs))
    ranges = out["schedule"]
    assert len({k for _, _, k in ranges}) > 1  # a schedule that changes k with load
    forms = out["engine_forms"]
    assert forms["vllm"] == {"num_speculative_tokens": out["num_speculative_tokens"],
                             "num_speculative_tokens_per_batch_size": ranges}
    sg = forms["sglang"]
    check_sglang_config(sg["speculative_adaptive_config"], sg["speculative_num_steps"])
    # --json writes TensorRT-LLM's int keys as JSON strings; its config loader takes YAML.
    trt = {int(b): k for b, k in forms["tensorrt_llm"]["draft_len_schedule"].items()}
    check_trtllm_schedule(trt, forms["tensorrt_llm"]["max_draft_len"])
    for bs in range(1, max_num_seqs + 1):
        want = schedule_k(ranges, bs)
        assert sglang_k(sg["speculative_adaptive_config"], bs) == want, bs
        assert trtllm_k(trt, bs) == want, bs


def test_advise_text_gives_each_engines_form(capsys) -> None:
    assert main(["advise", "--params", str(PARAMS), "--arrival-rate-p50", "1",
                 "--arrival-rate-p95", "2", "--arrival-rate-p99", "3", "--alpha", "0.5",
                 "--prompt-tokens", "500", "--generation-tokens", "200",
                 "--max-num-seqs", "64"]) == 0
    text = capsys.readouterr().out
    assert "--speculative-adaptive-config FILE" in text
    assert "draft_len_schedule: {" in text


def test_no_engine_form_when_sd_stays_off(capsys) -> None:
    out = advise(capsys, "--alpha", "0")
    assert out["enable"] is False and out["engine_forms"] is None


def test_sglang_slots_start_where_the_ranges_start() -> None:
    ranges = [[1, 10, 3], [11, 40, 2], [41, 64, 0]]
    config = sglang_adaptive_config(ranges)
    assert config == {"1": {"candidate_steps": [3]}, "11": {"candidate_steps": [2]},
                      "41": {"candidate_steps": [0]}}
    check_sglang_config(config, 3)
    assert [sglang_k(config, bs) for bs in (1, 10, 11, 40, 41, 64, 500)] == [3, 3, 2, 2, 0, 0, 0]


def test_trtllm_leaves_trailing_sd_off_implicit() -> None:
    """Past its last key TensorRT-LLM drafts nothing: a trailing K = 0 range is that."""
    assert trtllm_draft_len_schedule([[1, 10, 3], [11, 40, 2], [41, 64, 0]]) == {10: 3, 40: 2}
    assert trtllm_draft_len_schedule([[1, 64, 2]]) == {64: 2}


@pytest.mark.parametrize("ranges", [
    [[1, 8, 2], [9, 64, 3]],      # k grows with load: the smallest key must hold the largest
    [[1, 64, 0]],                 # SD off throughout: nothing to schedule
    [[1, 4, 0], [5, 64, 2]],      # SD off at batch 1 only
])
def test_trtllm_form_is_none_where_it_cannot_express_the_schedule(ranges) -> None:
    assert trtllm_draft_len_schedule(ranges) is None
