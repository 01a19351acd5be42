"""Files named in a serve config, read relative to the config file's folder.

Why its own module: every key that names a file is resolved in one place, like Prometheus
resolves the files its configuration names, so that the exporter reads the same files from
whatever folder it is started in. The poll path's own file keys (a target's auth secrets and
TLS files) are listed here; a plug-in's are resolved by its config section
(``ConfigSection.resolve_top`` / ``resolve_target``), so this module knows no plug-in key.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol


class PathSection(Protocol):
    """What this module needs of a config section: how it resolves its own file keys."""

    @property
    def resolve_top(self) -> Callable[[Mapping[str, Any], Callable[[str], str]],
                                      Mapping[str, Any]] | None: ...

    @property
    def resolve_target(self) -> Callable[[Mapping[str, Any], Callable[[str], str]],
                                         Mapping[str, Any]] | None: ...


#: The poll path's file keys in a target: block -> keys naming a file.
TARGET_FILE_KEYS = (("auth", ("token_file", "password_file")),
                    ("tls", ("ca_file", "cert_file", "key_file")))


def relative_to(config_file: str | None, path: str) -> str:
    """``path`` relative to the config file's directory when it is relative (as Prometheus
    resolves the files its configuration names)."""
    if config_file is None or os.path.isabs(path):
        return path
    return os.path.join(os.path.dirname(os.path.abspath(config_file)), path)


def resolve_paths(raw: Mapping[str, Any], config_file: str,
                  sections: Sequence[PathSection] = ()) -> Mapping[str, Any]:
    """Every file a validated config names, relative to the config file's folder: targets'
    auth secrets and TLS files here, then each section's own file keys. (The web config and
    the file_sd files are resolved where they are read.)"""

    def rel(value: str) -> str:
        return relative_to(config_file, value)

    out: Mapping[str, Any] = dict(raw)
    targets = []
    for t in raw.get("targets", []):
        t = dict(t)
        for block, keys in TARGET_FILE_KEYS:
            if block in t:
                t[block] = {k: rel(v) if k in keys else v for k, v in t[block].items()}
        for section in sections:
            if section.resolve_target is not None:
                t = dict(section.resolve_target(t, rel))
        targets.append(t)
    if "targets" in raw:
        out = {**out, "targets": targets}
    for section in sections:
        if section.resolve_top is not None:
            out = section.resolve_top(out, rel)
    return out
