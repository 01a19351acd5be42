"""The llama.cpp server (llama-server ``--metrics``): the names of
``tools/server/server-task.cpp`` (``server_task_result_metrics::to_metrics``), documented in
``tools/server/README.md`` ("GET /metrics"; the version and file are cited in
``tests/fixtures/engines-constructed/README.md``).

What it gives: drafts (verification steps), draft tokens, accepted tokens and accepted
tokens per position (label ``position``), generated and prompt tokens, requests processing
and deferred. So acceptance rate and length, draft length, α, per-position rates and
heterogeneity are derived. What it cannot give: finished requests (no request counter, so no
arrival rate, batch size or mean lengths), latency histograms and the KV-cache size. Its
draft limit (``speculative.n_max``) is in ``/props`` and ``/slots``, not ``/metrics``: the
configured k read here is the number of per-position series, the positions the server has
counted so far. One model per server and no labels: its series are read as model ``default``
(:data:`MODEL`). The server
writes doubles with 6 significant digits, so a counter above 999999 moves in coarse steps.
"""

from __future__ import annotations

from specwatch.engines import base
from specwatch.engines.base import Capabilities, Engine
from specwatch.engines.registry import register

PREFIX = "llamacpp:"
#: The model name of its (unlabelled) series.
MODEL = "default"

COUNTERS: dict[str, str] = {
    "llamacpp:spec_decode_num_drafts_total": base.DRAFTS,
    "llamacpp:spec_decode_num_draft_tokens_total": base.DRAFT_TOKENS,
    "llamacpp:spec_decode_num_accepted_tokens_total": base.ACCEPTED_TOKENS,
    "llamacpp:spec_decode_num_accepted_tokens_per_pos_total": base.ACCEPTED_PER_POSITION,
    "llamacpp:tokens_predicted_total": base.GENERATION_TOKENS,
    "llamacpp:prompt_tokens_total": base.PROMPT_TOKENS,
}
GAUGES: dict[str, str] = {
    "llamacpp:requests_processing": base.RUNNING,
    "llamacpp:requests_deferred": base.WAITING,
}

ENGINE = register(Engine(
    kind="llamacpp", family="llamacpp", versions="llama-server with spec_decode_* on /metrics",
    prefix=PREFIX, order=50, counters=COUNTERS, gauges=GAUGES, unlabelled_model=MODEL,
    capabilities=Capabilities(
        per_position=True, configured_k="positions", acceptance_length=True, kv_capacity=False,
        acceptance=base.BY_TOKENS),
))
