"""Files named in a serve config, read relative to the config file's folder.

Why its own module: every key that names a file (auth secrets, TLS files, parameters files,
the controller's header and token files) is listed here in one place, so that a new file key
is resolved like the others, and `specwatch.poll.config` stays about the schema.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


def relative_to(config_file: str | None, path: str) -> str:
    """``path`` relative to the config file's directory when it is relative (as Prometheus
    resolves the files its configuration names)."""
    if config_file is None or os.path.isabs(path):
        return path
    return os.path.join(os.path.dirname(os.path.abspath(config_file)), path)


def resolve_paths(raw: Mapping[str, Any], config_file: str) -> Mapping[str, Any]:
    """Every file a config names, relative to the config file's folder (as Prometheus does),
    so that the exporter reads the same files from whatever folder it is started in:
    targets' auth secrets, TLS files and parameters files, the controller's header and token
    files, the web config and file_sd files. A ``params`` value that names no file there but
    is the name of a shipped example (``qwen3-32b-h100-eagle3``) is that example, as
    ``specwatch predict --params`` takes it."""
    from specwatch.common.bundle import example_params

    def rel(value: str) -> str:
        return relative_to(config_file, value)

    examples = None
    out = dict(raw)
    targets = []
    for t in raw.get("targets", []):
        t = dict(t)
        for block, keys in (("auth", ("token_file", "password_file")),
                            ("tls", ("ca_file", "cert_file", "key_file"))):
            if block in t:
                t[block] = {k: rel(v) if k in keys else v for k, v in t[block].items()}
        if "params" in t:
            value = t["params"]
            resolved = rel(value)
            if not os.path.exists(resolved) and os.sep not in value \
                    and not value.endswith((".yaml", ".yml")):
                examples = example_params() if examples is None else examples
                if value in examples:
                    resolved = str(examples[value])
            t["params"] = resolved
        webhook = (t.get("controller") or {}).get("webhook")
        if webhook and "headers_from_file" in webhook:
            t["controller"] = {**t["controller"], "webhook": {
                **webhook, "headers_from_file": {
                    h: rel(f) for h, f in webhook["headers_from_file"].items()}}}
        targets.append(t)
    if "targets" in raw:
        out["targets"] = targets
    am = (raw.get("controller") or {}).get("alertmanager")
    if am and "token_file" in am:
        out["controller"] = {**raw["controller"],
                             "alertmanager": {**am, "token_file": rel(am["token_file"])}}
    return out
