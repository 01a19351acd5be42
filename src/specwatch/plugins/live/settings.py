"""The live model's keys of the serve config: a target's ``params`` (its latency-model
parameters file) and ``model_window``, and ``global.model_window``, as :data:`SECTION`.

The application composes this section into the serve config's schema; the plug-in reads the
parsed values (:class:`LiveTarget`, :class:`LiveGlobal`) and never the file's mappings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specwatch.common.bundle import example_params
from specwatch.common.schema import Key
from specwatch.poll.config import ConfigSection, Resolve, SectionContext

DEFAULT_MODEL_WINDOW = "5m"


@dataclass(frozen=True)
class LiveTarget:
    """One target's keys: its parameters file (None: no predictions) and its model window
    (None: ``global.model_window``)."""

    params: str | None = None
    model_window: str | None = None


@dataclass(frozen=True)
class LiveGlobal:
    """``global.model_window``: the window whose signals feed the model by default."""

    model_window: str = DEFAULT_MODEL_WINDOW


def target_settings(raw: Mapping[str, Any], _path: str, _where: str) -> LiveTarget:
    return LiveTarget(raw.get("params"), raw.get("model_window"))


def global_settings(raw: Mapping[str, Any], _ctx: SectionContext) -> LiveGlobal:
    return LiveGlobal(raw.get("global", {}).get("model_window", DEFAULT_MODEL_WINDOW))


def resolve_params(target: Mapping[str, Any], rel: Resolve) -> Mapping[str, Any]:
    """``params`` relative to the config file; a value that names no file there but is the
    name of a shipped example (``qwen3-32b-h100-eagle3``) is that example, as ``specwatch
    predict --params`` takes it."""
    if "params" not in target:
        return target
    value = target["params"]
    resolved = rel(value)
    if not os.path.exists(resolved) and os.sep not in value \
            and not value.endswith((".yaml", ".yml")):
        examples = example_params()
        if value in examples:
            resolved = str(examples[value])
    return {**target, "params": resolved}


SECTION: ConfigSection[LiveGlobal] = ConfigSection(
    "live_model",
    target={"params": Key(str, doc="latency-model parameters file (YAML) for the "
                                   "sd_predicted_* series"),
            "model_window": Key(str, doc="window whose signals feed the model (default "
                                         "global's, 5m)")},
    target_after="auth",
    global_keys={"model_window": Key(str, doc="window whose signals feed the latency model "
                                              "(default 5m)")},
    global_after="min_bimodality_samples",
    build=global_settings, target_build=target_settings, resolve_target=resolve_params)
