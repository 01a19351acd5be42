"""The names of the signals the poll path derives: the keys of ``WindowSignals.values`` and
``WindowSignals.positions``.

Owns the spelling of each derived signal; the exposition's metric catalogue
(:mod:`specwatch.expose.metricdefs`) and the plug-ins read the names from here.
"""

from __future__ import annotations

ACCEPTANCE_RATE = "sd_acceptance_rate"
ACCEPTANCE_LENGTH = "sd_acceptance_length"
DRAFT_LENGTH = "sd_draft_length"
TOKEN_ACCEPTANCE_PROBABILITY = "sd_token_acceptance_probability"
#: The draft-length-independent α (formulas.draft_length_independent_alpha), label ``method``.
ACCEPTANCE_ALPHA = "sd_acceptance_alpha"
POSITION_ACCEPTANCE_RATE = "sd_position_acceptance_rate"
POSITION_CONDITIONAL_ACCEPTANCE_RATE = "sd_position_conditional_acceptance_rate"
ACCEPTANCE_HETEROGENEITY = "sd_acceptance_heterogeneity"
ARRIVAL_RATE = "sd_arrival_rate"
EFFECTIVE_BATCH_SIZE = "sd_effective_batch_size"
MEAN_PROMPT_TOKENS = "sd_mean_prompt_tokens"
MEAN_GENERATION_TOKENS = "sd_mean_generation_tokens"
MEAN_LATENCY_SECONDS = "sd_mean_latency_seconds"
#: Computed on its own first read (:mod:`specwatch.poll.windows.lazy`).
BIMODALITY_COEFFICIENT = "sd_acceptance_bimodality_coefficient"
