"""The serve config as the exporter reads it: the poll path's keys and the plug-ins'
sections, composed here explicitly.

The order of :data:`SECTIONS` fixes where each plug-in's keys sit in the tables (and so the
order an "unknown key" message lists them in); importing a plug-in changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specwatch.plugins.control.settings import SECTION as CONTROLLER
from specwatch.plugins.live.settings import SECTION as LIVE_MODEL
from specwatch.plugins.pairs.settings import SECTION as PAIRS
from specwatch.poll import config

SECTIONS = (CONTROLLER, LIVE_MODEL, PAIRS)
#: Every key a serve config file may hold.
SCHEMA = config.compose(SECTIONS)


def build_config(config_file: str | None, target_flags: list[str], listen: str | None,
                 poll_interval: float | None, web_config: str | None = None,
                 shard_index: int | None = None, shard_count: int | None = None
                 ) -> config.ServeConfig:
    """:func:`specwatch.poll.config.build_config` with the plug-ins' keys."""
    return config.build_config(config_file, target_flags, listen, poll_interval,
                               web_config=web_config, shard_index=shard_index,
                               shard_count=shard_count, schema=SCHEMA)


def load_file(path: str) -> Mapping[str, Any]:
    """:func:`specwatch.poll.config.load_file` with the plug-ins' keys."""
    return config.load_file(path, SCHEMA)
