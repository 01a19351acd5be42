"""`specwatch serve` configuration: YAML file and/or flags, strictly validated.

Validation is driven by a schema table (:data:`TOP_SCHEMA`, :data:`GLOBAL_SCHEMA`,
:data:`TARGET_SCHEMA`, :data:`AUTH_SCHEMA`) of :class:`Key` entries, not by ad-hoc checks, so a
later feature adds its key with one line (issue 3: ``TARGET_SCHEMA["params"] = Key(...)``;
issue 7: ``TOP_SCHEMA["controller"] = Key(...)``) and reads the validated value from
``TargetConfig.raw`` / ``ServeConfig.raw``. Every error names the file and the key path, e.g.
``specwatch.yaml: targets[1].url: expected an http(s) URL, got 'foo'``.
"""

from __future__ import annotations

import itertools
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from specwatch.common import redact, tlsfiles
from specwatch.common.errors import ConfigError
from specwatch.common.schema import (
    DURATION,
    NUM,
    CheckError,
    Key,
    check_listen,
    check_url,
    check_url_any_path,
    duration_or_zero,
    format_duration,
    non_negative,
    one_of,
    parse_duration,
    positive,
    positive_int,
    read_yaml,
    unit_interval,
    validate,
)
from specwatch.common.secretfile import read_secret_file
from specwatch.plugins.pairs.plugin import PairConfig, PairSettings, shard_keys
from specwatch.poll import configpaths
from specwatch.poll.discovery import DEFAULT_REFRESH_INTERVAL, FileSDConfig, shard_of
from specwatch.poll.sources import ENGINE_KINDS, PARSERS

DEFAULT_LISTEN = "0.0.0.0:10440"
DEFAULT_POLL_INTERVAL = 5.0
DEFAULT_TIMEOUT = 3.0
DEFAULT_WINDOWS = ("1m", "5m", "15m")
DEFAULT_COUNT_WINDOW = 1000
DEFAULT_MIN_DRAFTS = 50
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_MIN_BIMODALITY_SAMPLES = 10
DEFAULT_MAX_SERIES = 10000
DEFAULT_MAX_TARGETS = 1000
#: Request headers whose values are secrets (never logged; see specwatch.common.redact).
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key"})
#: ``follow_redirects`` values: same_host (default) follows redirects to the target's own
#: scheme, host and port only; any follows every redirect but sends no configured header
#: or credential to another origin; none follows none.
FOLLOW_REDIRECTS = ("same_host", "any", "none")


def _name(value: str) -> str:
    if not value or not re.match(r"^[A-Za-z0-9_.:@/-]+$", value):
        raise CheckError(f"expected a target name of letters, digits and _.:@/-, got {value!r}")
    return value


AUTH_SCHEMA: dict[str, Key] = {
    "type": Key(str, required=True, check=one_of("bearer", "basic"), doc="bearer | basic"),
    "token_file": Key(str, doc="bearer: file holding the token"),
    "token_env": Key(str, doc="bearer: environment variable holding the token"),
    "username": Key(str, doc="basic: user name"),
    "password_file": Key(str, doc="basic: file holding the password"),
    "password_env": Key(str, doc="basic: environment variable holding the password"),
}
TARGET_TLS_SCHEMA: dict[str, Key] = {
    "ca_file": Key(str, doc="CA bundle that signs the target's certificate"),
    "cert_file": Key(str, doc="client certificate (PEM) for mutual TLS"),
    "key_file": Key(str, doc="client private key (PEM)"),
    "insecure_skip_verify": Key(bool, doc="do not verify the target's certificate (off)"),
}
HTTP_SERVER_LIMITS_SCHEMA: dict[str, Key] = {
    "max_requests_in_flight": Key(int, check=positive_int(1), doc="503 above (default 40)"),
    "max_connections": Key(int, check=positive_int(1), doc="open connections (512)"),
    "max_connections_per_client": Key(int, check=positive_int(1),
                                      doc="open connections from one address (64)"),
    "failed_logins_per_client": Key(int, check=positive_int(1),
                                    doc="failed logins from one address before 429 (10)"),
    "failed_login_interval": Key((*NUM, str), check=parse_duration,
                                 doc="one more failed login allowed per interval (1s)"),
    "request_timeout": Key((*NUM, str), check=parse_duration, doc="per request (10s)"),
    "idle_timeout": Key((*NUM, str), check=parse_duration, doc="keep-alive idle (60s)"),
    "tls_handshake_timeout": Key((*NUM, str), check=parse_duration, doc="(5s)"),
}


#: Per-target `controller:` block (semantics in specwatch.plugins.control.controller and the
#: README, "Controller"). Cross-key rules (enable above disable, the webhook block in
#: webhook mode...) are checked by specwatch.plugins.control.controller.settings_from_config.
CONTROLLER_SCHEMA: dict[str, Key] = {
    "mode": Key(str, check=one_of("recommend", "webhook", "command"),
                doc="recommend (default) | webhook | command"),
    "models": Key(list, items=Key(str), doc="model names to control (default: all)"),
    "disable_below_speedup": Key((int, float), check=positive,
                                 doc="switch SD off below this best predicted speedup"),
    "enable_above_speedup": Key((int, float), check=positive,
                                doc="switch SD on at or above this predicted speedup"),
    "min_acceptance_rate": Key((int, float), check=unit_interval,
                               doc="switch SD off below this acceptance rate"),
    "stabilization_seconds": Key(DURATION, check=duration_or_zero,
                                 doc="a condition must hold this long"),
    "min_switch_interval_seconds": Key(DURATION, check=duration_or_zero,
                                       doc="no two switches closer than this"),
    "min_drafts_per_window": Key((int, float), check=non_negative,
                                 doc="drafts the window needs (SD on)"),
    "min_requests_per_window": Key((int, float), check=non_negative,
                                   doc="finished requests the window needs (SD off)"),
    "pending_timeout_seconds": Key(DURATION, check=parse_duration,
                                   doc="give up waiting for a requested switch"),
    "max_reenable_delay_seconds": Key(DURATION, check=parse_duration,
                                      doc="cap of the re-enable backoff"),
    "max_num_seqs": Key(int, check=positive_int(1), doc="largest batch of the schedule"),
    "max_attempts": Key(int, check=positive_int(1), doc="deliveries tried per decision"),
    "retry_backoff_seconds": Key(DURATION, check=parse_duration,
                                 doc="first retry delay (doubles)"),
    "max_retry_backoff_seconds": Key(DURATION, check=parse_duration,
                                     doc="largest retry delay"),
    "webhook": Key(dict, children={
        "url": Key(str, required=True, check=check_url_any_path, doc="receiver URL"),
        "timeout": Key(DURATION, check=parse_duration, doc="per attempt"),
        "headers": Key(dict, values=Key(str), doc="literal headers"),
        "headers_from_file": Key(dict, values=Key(str), doc="header -> file with the value"),
        "headers_from_env": Key(dict, values=Key(str), doc="header -> environment variable"),
    }, doc="mode webhook: where decisions are POSTed"),
    "command": Key(dict, children={
        "argv": Key(list, required=True, items=Key(str), doc="program and arguments, no shell"),
        "timeout": Key(DURATION, check=parse_duration, doc="per attempt"),
    }, doc="mode command: the program run per decision"),
}
#: Exporter-wide `controller:` block: the Alertmanager webhook receiver.
CONTROLLER_GLOBAL_SCHEMA: dict[str, Key] = {
    "alertmanager": Key(dict, children={
        "token_file": Key(str, required=True, doc="file holding the bearer token"),
        "alerts": Key(list, items=Key(str), doc="alert names meaning 'switch SD off'"),
    }, doc="POST /controller/alertmanager"),
}

TARGET_SCHEMA: dict[str, Key] = {
    "name": Key(str, check=_name, doc="label value of `target` (default: host:port)"),
    "url": Key(str, required=True, check=check_url, doc="the /metrics URL"),
    "engine": Key(str, check=one_of(*ENGINE_KINDS), doc="vllm | sglang | auto"),
    "timeout": Key((*NUM, str), check=parse_duration, doc="total deadline of one poll"),
    "max_body_bytes": Key(int, check=positive_int(1024), doc="largest page accepted"),
    "headers": Key(dict, values=Key(str), doc="extra request headers"),
    "follow_redirects": Key(str, check=one_of(*FOLLOW_REDIRECTS),
                            doc="same_host (default) | any | none"),
    "auth": Key(dict, children=AUTH_SCHEMA, doc="bearer token or basic auth"),
    "params": Key(str, doc="latency-model parameters file (YAML) for the sd_predicted_* series"),
    "model_window": Key(str, doc="window whose signals feed the model (default global's, 5m)"),
    "max_num_seqs": Key(int, check=positive_int(1),
                        doc="vLLM --max-num-seqs of the server (no page states it)"),
    "tls": Key(dict, children=TARGET_TLS_SCHEMA, doc="CA, client certificate"),
    "max_series": Key(int, check=positive_int(1), doc="source series kept per poll"),
    "max_models": Key(int, check=positive_int(1),
                      doc="models followed at once, and vanished models remembered"),
    "controller": Key(dict, children=CONTROLLER_SCHEMA, doc="SD controller (off by default)"),
}
GLOBAL_SCHEMA: dict[str, Key] = {
    "listen": Key(str, check=check_listen, doc="HOST:PORT of the exporter"),
    "poll_interval": Key((*NUM, str), check=parse_duration, doc="seconds between polls"),
    "timeout": Key((*NUM, str), check=parse_duration, doc="default poll deadline"),
    "max_body_bytes": Key(int, check=positive_int(1024), doc="default page size cap"),
    "windows": Key(list, items=Key((*NUM, str), check=parse_duration), doc="time windows"),
    "count_window": Key(int, check=positive_int(0), doc="requests in the count window"),
    "min_drafts_per_sample": Key(NUM, check=non_negative, doc="drafts per sample"),
    "min_bimodality_samples": Key(int, check=positive_int(4), doc="samples for the BC"),
    "model_window": Key(str, doc="window whose signals feed the latency model (default 5m)"),
    "web_config": Key(str, doc="exporter-toolkit web config (TLS, basic auth)"),
    "max_targets": Key(int, check=positive_int(1), doc="targets polled (excess dropped)"),
    "max_series": Key(int, check=positive_int(1), doc="default of targets[].max_series"),
    "max_models": Key(int, check=positive_int(1), doc="default of targets[].max_models"),
    "max_label_value_bytes": Key(int, check=positive_int(32),
                                 doc="longer label values from targets are cut (hash suffix)"),
    "http_server": Key(dict, children=HTTP_SERVER_LIMITS_SCHEMA, doc="HTTP server limits"),
    "parser": Key(str, check=one_of(*PARSERS),
                  doc="fast (only the families read) | full (prometheus_client, baseline)"),
    "shard_count": Key(int, check=positive_int(1), doc="exporters sharing the targets"),
    "shard_index": Key(int, check=positive_int(0), doc="this exporter's shard, 0-based"),
    "max_concurrent_polls": Key(int, check=positive_int(1),
                                doc="polls in flight at once (default: one per target)"),
    "poll_spread": Key(bool, doc="spread targets over the interval (default true)"),
}
def _bin_edges(value: Any) -> tuple[float, ...]:
    edges = []
    for x in value:
        if isinstance(x, bool) or not isinstance(x, int | float) or not x >= 0 \
                or not x < float("inf"):
            raise CheckError(f"expected non-negative numbers (requests/s), got {x!r}")
        edges.append(float(x))
    if len(edges) < 2 or any(b <= a for a, b in itertools.pairwise(edges)):
        raise CheckError(f"expected at least two increasing bin edges, got {list(value)}")
    return tuple(edges)


def _band_edges(value: Any) -> tuple[float, ...]:
    """Acceptance-rate band edges: increasing, from 0, each below 1 (``[0]``: one band)."""
    edges = _bin_edges([*value, 1.0]) if value else ()
    if not edges or edges[0] != 0:
        raise CheckError(f"expected increasing acceptance-rate band edges from 0, each below "
                         f"1, got {list(value)}")
    return edges[:-1]


#: `pairs:` entries (issue 16): an SD target and a baseline target serving the same model.
PAIR_SCHEMA: dict[str, Key] = {
    "name": Key(str, required=True, check=_name, doc="label value of `pair`"),
    "sd": Key(str, required=True, doc="target name of the side running SD"),
    "baseline": Key(str, required=True, doc="target name of the side without SD (or another k)"),
    "model": Key(str, doc="model name to compare (default: every model both serve)"),
}
PAIR_OPTIONS_SCHEMA: dict[str, Key] = {
    "window": Key(str, doc="window one segment is (one of global.windows; default 1m)"),
    "min_requests": Key(NUM, check=non_negative,
                        doc="finished requests each side needs in a bin (default 50)"),
    "retention": Key((*NUM, str), check=parse_duration, doc="how long segments count (1h)"),
    "arrival_rate_bins": Key(list, check=_bin_edges, doc="bin edges in requests/s"),
    "models": Key(dict, values=Key(dict, children={
        "arrival_rate_bins": Key(list, required=True, check=_bin_edges, doc="bin edges"),
    }), doc="per model: its own arrival_rate_bins"),
    "acceptance_bands": Key(list, check=_band_edges,
                            doc="acceptance-rate band edges, 0 first (default 0, .25, .5, .75)"),
}
FILE_SD_SCHEMA: dict[str, Key] = {
    "files": Key(list, required=True, items=Key(str), doc="file_sd files (globs allowed)"),
    "refresh_interval": Key((*NUM, str), check=parse_duration, doc="re-read period"),
}
TOP_SCHEMA: dict[str, Key] = {
    "global": Key(dict, children=GLOBAL_SCHEMA),
    "targets": Key(list, items=Key(dict, children=TARGET_SCHEMA)),
    "file_sd_configs": Key(list, items=Key(dict, children=FILE_SD_SCHEMA),
                           doc="Prometheus file_sd target files"),
    "controller": Key(dict, children=CONTROLLER_GLOBAL_SCHEMA),
    "pairs": Key(list, items=Key(dict, children=PAIR_SCHEMA),
                 doc="measured A/B pairs: sd_measured_speedup"),
    "pair_options": Key(dict, children=PAIR_OPTIONS_SCHEMA, doc="windows and bins of pairs"),
}


@dataclass(frozen=True)
class TargetConfig:
    name: str
    url: str
    engine: str = "auto"
    timeout: float = DEFAULT_TIMEOUT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    #: requests' ``verify``: True (system CAs), a CA bundle path, or False (skip verify).
    tls_verify: bool | str = True
    #: (certificate, key) paths of a client certificate, or None.
    tls_client_cert: tuple[str, str] | None = None
    max_series: int = DEFAULT_MAX_SERIES
    follow_redirects: str = "same_host"


@dataclass(frozen=True)
class ServeConfig:
    targets: tuple[TargetConfig, ...]
    listen: str = DEFAULT_LISTEN
    poll_interval: float = DEFAULT_POLL_INTERVAL
    windows: tuple[tuple[str, float], ...] = tuple(
        (w, parse_duration(w)) for w in DEFAULT_WINDOWS)
    count_window: int = DEFAULT_COUNT_WINDOW
    min_drafts_per_sample: float = DEFAULT_MIN_DRAFTS
    min_bimodality_samples: int = DEFAULT_MIN_BIMODALITY_SAMPLES
    parser: str = "fast"
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    web_config: str | None = None
    max_targets: int = DEFAULT_MAX_TARGETS
    #: Names of configured targets beyond ``max_targets`` (not polled; counted and logged).
    dropped_targets: tuple[str, ...] = ()
    #: Validated ``global.http_server`` mapping (limits of the HTTP server).
    http_server: Mapping[str, Any] = field(default_factory=dict)
    #: Sharding (issue 10): this exporter polls the targets whose shard is shard_index.
    shard_index: int = 0
    shard_count: int = 1
    file_sd: tuple[FileSDConfig, ...] = ()
    #: Polls in flight at once; None: one per target (see README, Performance and scale).
    max_concurrent_polls: int | None = None
    #: Poll each target on its own phase of the interval (False: all together).
    poll_spread: bool = True
    #: Defaults a discovered (file_sd) target gets: timeout, max_body_bytes, max_series.
    target_defaults: tuple[float, int, int] = (DEFAULT_TIMEOUT, DEFAULT_MAX_BODY_BYTES,
                                               DEFAULT_MAX_SERIES)

    #: Measured A/B pairs (issue 16) and their options.
    pairs: tuple[PairConfig, ...] = ()
    pair_settings: PairSettings = field(default_factory=PairSettings)

    #: Where the configuration came from (the file name, for error messages).
    source: str = "command line"

    def discovered_target(self, raw: Mapping[str, Any], where: str) -> TargetConfig:
        """A file_sd target (``{"url": ...}``) validated like a configured one."""
        checked = validate(dict(raw), Key(dict, children=TARGET_SCHEMA), "", where)
        timeout, max_body, max_series = self.target_defaults
        return build_target(checked, "", where, timeout, max_body, max_series)


def _read_secret(auth: Mapping[str, str], file_key: str, env_key: str, path: str,
                 where: str) -> str:
    if (file_key in auth) == (env_key in auth):
        raise ConfigError(f"{where}: {path}: set exactly one of {file_key} or {env_key}")
    if file_key in auth:
        return read_secret_file(auth[file_key], f"{where}: {path}.{file_key}")
    secret = os.environ.get(auth[env_key], "")
    if not secret:
        raise ConfigError(f"{where}: {path}.{env_key}: environment variable "
                          f"{auth[env_key]!r} is not set or empty")
    redact.register(secret)
    return secret


def _build_tls(tls: Mapping[str, Any], path: str, where: str
               ) -> tuple[bool | str, tuple[str, str] | None]:
    """requests' ``verify`` and ``cert`` for a target, checked now so errors name the key."""
    tpath = f"{path}.tls"
    verify: bool | str = True
    if tls.get("insecure_skip_verify"):
        if "ca_file" in tls:
            raise ConfigError(f"{where}: {tpath}.ca_file: set together with "
                              f"insecure_skip_verify: true; choose one")
        verify = False
    if "ca_file" in tls:
        try:
            ctx = ssl.create_default_context(cafile=tls["ca_file"])
        except ssl.SSLError as exc:
            raise ConfigError(f"{where}: {tpath}.ca_file: no valid PEM certificate in "
                              f"{tls['ca_file']!r} ({exc.reason})") from exc
        except OSError as exc:
            raise ConfigError(f"{where}: {tpath}.ca_file: cannot read {tls['ca_file']!r}: "
                              f"{exc.strerror}") from exc
        del ctx
        verify = tls["ca_file"]
    cert = None
    if ("cert_file" in tls) != ("key_file" in tls):
        missing = "key_file" if "cert_file" in tls else "cert_file"
        raise ConfigError(f"{where}: {tpath}: missing {missing} (a client certificate needs "
                          f"both cert_file and key_file)")
    if "cert_file" in tls:
        for key in ("cert_file", "key_file"):
            if not os.path.isfile(tls[key]):
                raise ConfigError(f"{where}: {tpath}.{key}: cannot read {tls[key]!r}: "
                                  f"no such file")
        try:
            ssl.create_default_context().load_cert_chain(tls["cert_file"], tls["key_file"])
        except ssl.SSLError as exc:
            raise ConfigError(f"{where}: {tpath}: cannot load the client certificate and "
                              f"key: {tlsfiles.chain_error(exc, tls['cert_file'])}") from exc
        except OSError as exc:
            raise ConfigError(f"{where}: {tpath}.cert_file: cannot read: {exc.strerror}") \
                from exc
        cert = (tls["cert_file"], tls["key_file"])
    return verify, cert


def default_target_name(url: str) -> str:
    parts = urlsplit(url)
    return parts.netloc.rsplit("@", 1)[-1] or url


def build_target(raw: Mapping[str, Any], path: str, where: str, default_timeout: float,
                 default_max_body: int, default_max_series: int = DEFAULT_MAX_SERIES
                 ) -> TargetConfig:
    """Turn one validated target mapping into a TargetConfig (reads auth secrets)."""
    headers = dict(raw.get("headers", {}))
    for hname, hvalue in headers.items():
        # Any configured header may carry a credential (X-Api-Key, X-Auth-Token, a
        # signature): all but the few that never do are registered for redaction.
        redact.register_header(hname, hvalue)
    redact.register_url(raw["url"])
    basic = None
    auth = raw.get("auth")
    if auth is not None:
        apath = f"{path}.auth"
        if auth["type"] == "bearer":
            extra = {"username"} & set(auth)
            if extra:
                raise ConfigError(f"{where}: {apath}.username: not used with type bearer")
            token = _read_secret(auth, "token_file", "token_env", apath, where)
            headers["Authorization"] = f"Bearer {token}"
        else:
            if "username" not in auth:
                raise ConfigError(f"{where}: {apath}: missing required key 'username'")
            basic = (auth["username"],
                     _read_secret(auth, "password_file", "password_env", apath, where))
    url = raw["url"]
    verify, cert = _build_tls(raw.get("tls", {}), path, where)
    return TargetConfig(
        name=raw.get("name") or default_target_name(url), url=url,
        engine=raw.get("engine", "auto"), timeout=raw.get("timeout", default_timeout),
        max_body_bytes=raw.get("max_body_bytes", default_max_body), headers=headers,
        basic_auth=basic, raw=raw, tls_verify=verify, tls_client_cert=cert,
        max_series=raw.get("max_series", default_max_series),
        follow_redirects=raw.get("follow_redirects", "same_host"))


def load_file(path: str) -> Mapping[str, Any]:
    """Read and validate a YAML config file; return the validated mapping, its relative
    file paths made relative to the file's folder (`configpaths.resolve_paths`)."""
    raw = validate(read_yaml(path), Key(dict, children=TOP_SCHEMA), "", path)
    return configpaths.resolve_paths(raw, path)


def parse_target_flag(flag: str) -> dict[str, Any]:
    """``[NAME=]URL`` from --target into a target mapping validated like the file's."""
    name, sep, url = flag.partition("=")
    if not sep or "://" in name:
        name, url = "", flag
    raw: dict[str, Any] = {"url": url}
    if name:
        raw["name"] = name
    return validate(raw, Key(dict, children=TARGET_SCHEMA), "", f"--target {flag}")


def build_config(config_file: str | None, target_flags: list[str], listen: str | None,
                 poll_interval: float | None, web_config: str | None = None,
                 shard_index: int | None = None, shard_count: int | None = None
                 ) -> ServeConfig:
    """Merge the file and the flags (flags win for listen, poll interval, web config and
    sharding)."""
    raw = load_file(config_file) if config_file else {}
    where = config_file or "command line"
    g = raw.get("global", {})
    timeout = g.get("timeout", DEFAULT_TIMEOUT)
    max_body = g.get("max_body_bytes", DEFAULT_MAX_BODY_BYTES)
    max_series = g.get("max_series", DEFAULT_MAX_SERIES)
    targets: list[TargetConfig] = []
    for i, t in enumerate(raw.get("targets", [])):
        targets.append(build_target(t, f"targets[{i}]", where, timeout, max_body, max_series))
    for flag in target_flags:
        targets.append(build_target(parse_target_flag(flag), "target", f"--target {flag}",
                                    timeout, max_body, max_series))
    seen: dict[str, int] = {}
    for i, t in enumerate(targets):
        if t.name in seen:
            loc = f"targets[{i}].name" if i < len(raw.get("targets", [])) else "--target"
            raise ConfigError(f"{where}: {loc}: duplicate target name {t.name!r} (also "
                              f"targets[{seen[t.name]}]); give each target a unique name")
        seen[t.name] = i
    file_sd = tuple(
        FileSDConfig(tuple(_relative_to(config_file, f) for f in c["files"]),
                     c.get("refresh_interval", DEFAULT_REFRESH_INTERVAL))
        for c in raw.get("file_sd_configs", []))
    if not targets and not file_sd:
        raise ConfigError("no targets: give --target [NAME=]URL or a --config file with "
                          "targets or file_sd_configs")
    shard_count = shard_count if shard_count is not None else g.get("shard_count", 1)
    shard_index = shard_index if shard_index is not None else g.get("shard_index", 0)
    if shard_count < 1 or not 0 <= shard_index < shard_count:
        raise ConfigError(f"{where}: shard index {shard_index} is not in 0..{shard_count - 1}"
                          f" (--shard-index/global.shard_index must be below --shard-count/"
                          f"global.shard_count)")
    if shard_count > 1:
        # Both sides of a pair on one exporter: a paired target is sharded by its pair.
        keys = shard_keys([PairConfig(p["name"], p["sd"], p["baseline"])
                           for p in raw.get("pairs", [])])
        targets = [t for t in targets
                   if shard_of(keys.get(t.name, t.name), shard_count) == shard_index]
    if poll_interval is not None:
        try:
            poll_interval = parse_duration(poll_interval)
        except CheckError as exc:
            raise ConfigError(f"--poll-interval: {exc}") from None
    windows_raw = g.get("windows")
    windows = tuple((format_duration(s), s) for s in windows_raw) if windows_raw is not None \
        else ServeConfig.__dataclass_fields__["windows"].default
    labels = [w for w, _ in windows]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"{where}: global.windows: duplicate window {labels}")
    listen_value = listen if listen is not None else g.get("listen", DEFAULT_LISTEN)
    if listen is not None:
        try:
            check_listen(listen)
        except CheckError as exc:
            raise ConfigError(f"--listen: {exc}") from None
    max_targets = g.get("max_targets", DEFAULT_MAX_TARGETS)
    dropped = tuple(t.name for t in targets[max_targets:])
    web_config_file = web_config if web_config is not None else g.get("web_config")
    if web_config is None and web_config_file and config_file \
            and not os.path.isabs(web_config_file):
        web_config_file = os.path.join(os.path.dirname(os.path.abspath(config_file)),
                                       web_config_file)
    pairs, pair_settings = build_pairs(raw, where, [t.name for t in targets],
                                       bool(file_sd) or shard_count > 1, labels)
    return ServeConfig(
        pairs=pairs, pair_settings=pair_settings,
        targets=tuple(targets[:max_targets]), listen=listen_value,
        web_config=web_config_file, max_targets=max_targets, dropped_targets=dropped,
        http_server=g.get("http_server", {}),
        poll_interval=poll_interval if poll_interval is not None
        else g.get("poll_interval", DEFAULT_POLL_INTERVAL),
        windows=windows, count_window=g.get("count_window", DEFAULT_COUNT_WINDOW),
        min_drafts_per_sample=g.get("min_drafts_per_sample", DEFAULT_MIN_DRAFTS),
        min_bimodality_samples=g.get("min_bimodality_samples", DEFAULT_MIN_BIMODALITY_SAMPLES),
        parser=g.get("parser", "fast"), shard_index=shard_index, shard_count=shard_count,
        file_sd=file_sd, max_concurrent_polls=g.get("max_concurrent_polls"),
        poll_spread=g.get("poll_spread", True),
        target_defaults=(timeout, max_body, max_series), raw=raw,
        source=where)


def build_pairs(raw: Mapping[str, Any], where: str, target_names: list[str],
                open_target_set: bool, windows: list[str]
                ) -> tuple[tuple[PairConfig, ...], PairSettings]:
    """``pairs:`` and ``pair_options:`` checked against the targets and windows.

    A side must name a configured target unless targets are discovered (file_sd) or
    sharded, where the set is only known at run time; a pair's window must be one the
    exporter derives."""
    pairs: list[PairConfig] = []
    seen: set[str] = set()
    known = set(target_names)
    for i, p in enumerate(raw.get("pairs", [])):
        path = f"pairs[{i}]"
        if p["name"] in seen:
            raise ConfigError(f"{where}: {path}.name: duplicate pair name {p['name']!r}")
        seen.add(p["name"])
        if p["sd"] == p["baseline"]:
            raise ConfigError(f"{where}: {path}.baseline: the same target as sd "
                              f"({p['sd']!r}); a pair compares two targets")
        for side in ("sd", "baseline"):
            if not open_target_set and p[side] not in known:
                raise ConfigError(f"{where}: {path}.{side}: no target named {p[side]!r} "
                                  f"(targets: {', '.join(sorted(known)) or 'none'})")
        pairs.append(PairConfig(p["name"], p["sd"], p["baseline"], p.get("model")))
    o = raw.get("pair_options", {})
    defaults = PairSettings()
    window = o.get("window", defaults.window)
    if "window" in o or pairs:
        try:
            window_s = parse_duration(window)
        except CheckError as exc:
            raise ConfigError(f"{where}: pair_options.window: {exc}") from None
        window = format_duration(window_s)
        if window not in windows:
            raise ConfigError(f"{where}: pair_options.window: {window!r} is not one of the "
                              f"exporter's windows ({', '.join(windows)}); add it to "
                              f"global.windows")
    settings = PairSettings(
        window=window, min_requests=o.get("min_requests", defaults.min_requests),
        retention_seconds=o.get("retention", defaults.retention_seconds),
        bins=o.get("arrival_rate_bins", defaults.bins),
        model_bins={m: v["arrival_rate_bins"] for m, v in o.get("models", {}).items()},
        acceptance_bands=o.get("acceptance_bands", defaults.acceptance_bands))
    return tuple(pairs), settings


def _relative_to(config_file: str | None, path: str) -> str:
    """A relative file_sd path is relative to the config file's directory (like Prometheus)."""
    if config_file is None or os.path.isabs(path):
        return path
    return os.path.join(os.path.dirname(os.path.abspath(config_file)), path)
