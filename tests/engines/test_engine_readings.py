"""An engine whose families do not map one to one onto canonical signals is still one module.

Protected behaviour: :class:`specwatch.engines.base.Reading` lets a module read one family
as two signals (drafted tokens per position: their sum is the draft tokens, position 0's
series the drafts), under its own position label, and a gauge whose value is in a label
(a configuration info series stating k); and a KV cache stated by two gauges is read too.
The page is read the same by the fast and the full parser, never through a page plan (a
plan replays one key per line), and the windows derive every signal from it: acceptance
rate and length, draft length, per-position rates.
"""

from __future__ import annotations

import pytest

from specwatch.engines import base, registry
from specwatch.engines.base import Capabilities, Engine, Reading
from specwatch.poll import sources
from specwatch.poll.pageplan import PagePlan
from specwatch.poll.pipeline import Pipeline, PollResult
from specwatch.poll.windows import derive

MODEL = "m"
POSITION = {"token_position": "position"}
ENGINE = Engine(
    kind="perposition", family="perposition", versions="1", prefix="perposition_", order=91,
    counters={"perposition_requests_total": base.REQUESTS_FINISHED},
    gauges={"perposition_kv_blocks": base.KV_CACHE_BLOCKS,
            "perposition_kv_block_tokens": base.KV_CACHE_BLOCK_SIZE},
    max_gauges=frozenset({base.KV_CACHE_BLOCKS, base.KV_CACHE_BLOCK_SIZE}),
    readings={
        "perposition_drafted_total": (
            Reading(base.DRAFT_TOKENS),
            Reading(base.DRAFTS, where=(("token_position", "0"),)),
        ),
        "perposition_accepted_total": (
            Reading(base.ACCEPTED_TOKENS),
            Reading(base.ACCEPTED_PER_POSITION, rename=POSITION),
        ),
        "perposition_config_info": (
            Reading(base.SPEC_STEPS, value_label="num_tokens", gauge=True),
        ),
    },
    capabilities=Capabilities(per_position=True, configured_k="positions",
                              acceptance_length=True, kv_capacity=False,
                              acceptance=base.BY_TOKENS),
)


def page(drafted: list[float], accepted: list[float], requests: float) -> str:
    lines = ["# a page of a per-position engine",
             f'perposition_config_info{{model_name="{MODEL}",num_tokens="3"}} 1',
             f'perposition_requests_total{{model_name="{MODEL}"}} {requests}',
             f'perposition_kv_blocks{{model_name="{MODEL}",pid="1"}} 8192',
             f'perposition_kv_blocks{{model_name="{MODEL}",pid="2"}} 8192',
             f'perposition_kv_block_tokens{{model_name="{MODEL}",pid="1"}} 32']
    lines += [f'perposition_drafted_total{{model_name="{MODEL}",token_position="{i}"}} {v}'
              for i, v in enumerate(drafted)]
    lines += [f'perposition_accepted_total{{model_name="{MODEL}",token_position="{i}"}} {v}'
              for i, v in enumerate(accepted)]
    return "\n".join(lines) + "\n"


@pytest.fixture
def engine():
    registry.register(ENGINE)
    try:
        yield ENGINE
    finally:
        registry.unregister(ENGINE.kind)


def test_one_family_gives_two_signals_under_the_canonical_position_label(engine) -> None:
    text = page([100, 100, 100], [80, 60, 40], 10)
    fast = sources.parse_page(text)
    assert fast == sources.parse_page(text, parser="full")
    assert fast.engine == "perposition"
    by_signal: dict[str, float] = {}
    for (_, sig, _), v in fast.counters.items():
        by_signal[sig] = by_signal.get(sig, 0.0) + v
    assert by_signal[base.DRAFT_TOKENS] == 300
    assert by_signal[base.DRAFTS] == 100
    assert by_signal[base.ACCEPTED_TOKENS] == 180
    per_position = {dict(ident)["position"]: v for (_, sig, ident), v in fast.counters.items()
                    if sig == base.ACCEPTED_PER_POSITION}
    assert per_position == {"0": 80, "1": 60, "2": 40}
    assert fast.configured_k == {MODEL: 3}
    assert fast.gauges[(MODEL, base.SPEC_STEPS)] == 3.0
    assert fast.server is not None
    assert (fast.server.kv_cache_tokens, fast.server.num_gpu_blocks,
            fast.server.block_size) == (8192 * 32, 8192, 32)
    plan = PagePlan()
    for _ in range(2):
        assert sources.parse_page(text, plan=plan) == fast
    assert plan.hits == 0


def test_the_windows_derive_from_readings(engine) -> None:
    pipeline = Pipeline([("p", "auto")], derive.DeriveConfig(windows=(("1m", 60.0),)), 60.0)
    pipeline.apply(PollResult("p", 1000.0, 1000.0, 0.01,
                              body=page([100, 100, 100], [80, 60, 40], 10)))
    pipeline.apply(PollResult("p", 1060.0, 1060.0, 0.01,
                              body=page([1100, 1100, 1100], [880, 660, 440], 130)))
    w = pipeline.snapshot.targets["p"].models[MODEL].window("1m")
    assert w is not None
    assert w.values[derive.ACCEPTANCE_RATE] == pytest.approx(1800 / 3000)
    assert w.values[derive.ACCEPTANCE_LENGTH] == pytest.approx(2.8)
    assert w.values[derive.DRAFT_LENGTH] == pytest.approx(3.0)
    assert w.positions[derive.POSITION_ACCEPTANCE_RATE] == pytest.approx(
        {"0": 0.8, "1": 0.6, "2": 0.4})


def test_a_bad_value_in_a_read_family_is_an_invalid_series(engine) -> None:
    got = sources.parse_page(page([100, float("nan"), 100], [80, 60, 40], 10))
    bad = {sig for _, sig, _ in got.invalid_counters}
    assert bad == {base.DRAFT_TOKENS}  # position 1 is not a draft; its tokens are unknown
    assert got.invalid_models == (MODEL,)
