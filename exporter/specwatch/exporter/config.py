"""`specwatch serve` configuration: YAML file and/or flags, strictly validated.

Validation is driven by a schema table (:data:`TOP_SCHEMA`, :data:`GLOBAL_SCHEMA`,
:data:`TARGET_SCHEMA`, :data:`AUTH_SCHEMA`) of :class:`Key` entries, not by ad-hoc checks, so a
later feature adds its key with one line (issue 3: ``TARGET_SCHEMA["params"] = Key(...)``;
issue 7: ``TOP_SCHEMA["controller"] = Key(...)``) and reads the validated value from
``TargetConfig.raw`` / ``ServeConfig.raw``. Every error names the file and the key path, e.g.
``specwatch.yaml: targets[1].url: expected an http(s) URL, got 'foo'``.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml

from specwatch import redact
from specwatch.discovery import DEFAULT_REFRESH_INTERVAL, FileSDConfig, shard_of
from specwatch.errors import ConfigError
from specwatch.sources import ENGINE_KINDS, PARSERS

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
#: Request headers whose values are secrets (never logged; see specwatch.redact).
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key"})


class CheckError(Exception):
    """Raised by a check: the message says what was expected (wrapped into ConfigError)."""


@dataclass(frozen=True)
class Key:
    """One schema entry. ``kind`` is the YAML type; ``check`` converts or raises CheckError.

    For ``kind=dict``: ``children`` is the nested schema (unknown keys are errors) or, with
    ``values`` set, a free mapping whose values follow ``values``. For ``kind=list``:
    ``items`` is the schema of each element.
    """

    kind: type | tuple[type, ...]
    required: bool = False
    check: Callable[[Any], Any] | None = None
    children: Mapping[str, Key] | None = None
    values: Key | None = None
    items: Key | None = None
    doc: str = ""


_DURATION_RE = re.compile(r"^((\d+)h)?((\d+)m(?!s))?((\d+)s)?((\d+)ms)?$")


def parse_duration(value: Any) -> float:
    """Seconds from a number or a Prometheus-style duration ("500ms", "30s", "1m30s", "1h")."""
    if isinstance(value, bool):
        raise CheckError(f"expected a duration, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        m = _DURATION_RE.match(value.strip())
        if not m or not value.strip():
            raise CheckError(f"expected a duration like 30s, 1m or 1h30m, got {value!r}")
        h, mi, s, ms = (int(g) if g else 0 for g in m.group(2, 4, 6, 8))
        seconds = h * 3600 + mi * 60 + s + ms / 1000.0
    else:
        raise CheckError(f"expected a duration, got {type(value).__name__}")
    if not seconds > 0:
        raise CheckError(f"expected a positive duration, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """The Prometheus spelling of a duration (used as the ``window`` label)."""
    ms = round(seconds * 1000)
    if ms % 1000:
        return f"{ms}ms"
    s = ms // 1000
    out = ""
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            out += f"{s // size}{unit}"
            s %= size
    return out or "0s"


def check_url(value: str) -> str:
    """An http(s) URL with a host; an empty path means ``/metrics``."""
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CheckError(f"expected an http(s) URL like http://host:8000/metrics, got {value!r}")
    try:
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as exc:
        raise CheckError(f"bad port in URL {value!r}") from exc
    if parts.username is not None or parts.password is not None:
        # Never echo the URL: it holds a password. Credentials in URLs end up in logs.
        raise CheckError("credentials in the URL are not allowed (they would reach logs); "
                         "use auth: {type: basic, username: ..., password_file: ...}")
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def check_url_any_path(value: str) -> str:
    """An http(s) URL with a host, path kept as given (a webhook endpoint)."""
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CheckError(f"expected an http(s) URL, got {value!r}")
    try:
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as exc:
        raise CheckError(f"bad port in URL {value!r}") from exc
    return value.strip()


def check_listen(value: str) -> str:
    _host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise CheckError(f"expected HOST:PORT, got {value!r}")
    return value


def _positive_int(minimum: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise CheckError(f"expected an integer >= {minimum}, got {value!r}")
        return value
    return check


def _non_negative(value: Any) -> float:
    if isinstance(value, bool) or value < 0:
        raise CheckError(f"expected a number >= 0, got {value!r}")
    return float(value)


def _one_of(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise CheckError(f"expected one of {', '.join(choices)}, got {value!r}")
        return value
    return check


def _positive_number(value: Any) -> float:
    if isinstance(value, bool) or not value > 0:
        raise CheckError(f"expected a number > 0, got {value!r}")
    return float(value)


def _name(value: str) -> str:
    if not value or not re.match(r"^[A-Za-z0-9_.:@/-]+$", value):
        raise CheckError(f"expected a target name of letters, digits and _.:@/-, got {value!r}")
    return value


_NUM = (int, float)

AUTH_SCHEMA: dict[str, Key] = {
    "type": Key(str, required=True, check=_one_of("bearer", "basic"), doc="bearer | basic"),
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
    "max_requests_in_flight": Key(int, check=_positive_int(1), doc="503 above (default 40)"),
    "max_connections": Key(int, check=_positive_int(1), doc="open connections (512)"),
    "request_timeout": Key((*_NUM, str), check=parse_duration, doc="per request (10s)"),
    "idle_timeout": Key((*_NUM, str), check=parse_duration, doc="keep-alive idle (60s)"),
    "tls_handshake_timeout": Key((*_NUM, str), check=parse_duration, doc="(5s)"),
}


def _unit_interval(value: Any) -> float:
    if isinstance(value, bool) or not 0 <= value <= 1:
        raise CheckError(f"expected a number in [0, 1], got {value!r}")
    return float(value)


def _positive(value: Any) -> float:
    if isinstance(value, bool) or not value > 0:
        raise CheckError(f"expected a number > 0, got {value!r}")
    return float(value)


def _duration_or_zero(value: Any) -> float:
    """A duration that may be 0 (e.g. no stabilization)."""
    if not isinstance(value, bool) and isinstance(value, int | float) and value == 0:
        return 0.0
    return parse_duration(value)


_DURATION = (*(int, float), str)

#: Per-target `controller:` block (issue 7; semantics in specwatch.controller and the
#: README, "Controller"). Cross-key rules (enable above disable, the webhook block in
#: webhook mode...) are checked by specwatch.controller.settings_from_config.
CONTROLLER_SCHEMA: dict[str, Key] = {
    "mode": Key(str, check=_one_of("recommend", "webhook", "command"),
                doc="recommend (default) | webhook | command"),
    "models": Key(list, items=Key(str), doc="model names to control (default: all)"),
    "disable_below_speedup": Key((int, float), check=_positive,
                                 doc="switch SD off below this best predicted speedup"),
    "enable_above_speedup": Key((int, float), check=_positive,
                                doc="switch SD on at or above this predicted speedup"),
    "min_acceptance_rate": Key((int, float), check=_unit_interval,
                               doc="switch SD off below this acceptance rate"),
    "stabilization_seconds": Key(_DURATION, check=_duration_or_zero,
                                 doc="a condition must hold this long"),
    "min_switch_interval_seconds": Key(_DURATION, check=_duration_or_zero,
                                       doc="no two switches closer than this"),
    "min_drafts_per_window": Key((int, float), check=_non_negative,
                                 doc="drafts the window needs (SD on)"),
    "min_requests_per_window": Key((int, float), check=_non_negative,
                                   doc="finished requests the window needs (SD off)"),
    "pending_timeout_seconds": Key(_DURATION, check=parse_duration,
                                   doc="give up waiting for a requested switch"),
    "max_reenable_delay_seconds": Key(_DURATION, check=parse_duration,
                                      doc="cap of the re-enable backoff"),
    "max_num_seqs": Key(int, check=_positive_int(1), doc="largest batch of the schedule"),
    "max_attempts": Key(int, check=_positive_int(1), doc="deliveries tried per decision"),
    "retry_backoff_seconds": Key(_DURATION, check=parse_duration,
                                 doc="first retry delay (doubles)"),
    "max_retry_backoff_seconds": Key(_DURATION, check=parse_duration,
                                     doc="largest retry delay"),
    "webhook": Key(dict, children={
        "url": Key(str, required=True, check=check_url_any_path, doc="receiver URL"),
        "timeout": Key(_DURATION, check=parse_duration, doc="per attempt"),
        "headers": Key(dict, values=Key(str), doc="literal headers"),
        "headers_from_file": Key(dict, values=Key(str), doc="header -> file with the value"),
        "headers_from_env": Key(dict, values=Key(str), doc="header -> environment variable"),
    }, doc="mode webhook: where decisions are POSTed"),
    "command": Key(dict, children={
        "argv": Key(list, required=True, items=Key(str), doc="program and arguments, no shell"),
        "timeout": Key(_DURATION, check=parse_duration, doc="per attempt"),
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
    "engine": Key(str, check=_one_of(*ENGINE_KINDS), doc="vllm | sglang | auto"),
    "timeout": Key((*_NUM, str), check=parse_duration, doc="total deadline of one poll"),
    "max_body_bytes": Key(int, check=_positive_int(1024), doc="largest page accepted"),
    "headers": Key(dict, values=Key(str), doc="extra request headers"),
    "auth": Key(dict, children=AUTH_SCHEMA, doc="bearer token or basic auth"),
    "params": Key(str, doc="latency-model parameters file (YAML) for the sd_predicted_* series"),
    "model_window": Key(str, doc="window whose signals feed the model (default global's, 5m)"),
    "tls": Key(dict, children=TARGET_TLS_SCHEMA, doc="CA, client certificate"),
    "max_series": Key(int, check=_positive_int(1), doc="source series kept per poll"),
    "controller": Key(dict, children=CONTROLLER_SCHEMA, doc="SD controller (off by default)"),
}
GLOBAL_SCHEMA: dict[str, Key] = {
    "listen": Key(str, check=check_listen, doc="HOST:PORT of the exporter"),
    "poll_interval": Key((*_NUM, str), check=parse_duration, doc="seconds between polls"),
    "timeout": Key((*_NUM, str), check=parse_duration, doc="default poll deadline"),
    "max_body_bytes": Key(int, check=_positive_int(1024), doc="default page size cap"),
    "windows": Key(list, items=Key((*_NUM, str), check=parse_duration), doc="time windows"),
    "count_window": Key(int, check=_positive_int(0), doc="requests in the count window"),
    "min_drafts_per_sample": Key(_NUM, check=_non_negative, doc="drafts per sample"),
    "min_bimodality_samples": Key(int, check=_positive_int(4), doc="samples for the BC"),
    "model_window": Key(str, doc="window whose signals feed the latency model (default 5m)"),
    "web_config": Key(str, doc="exporter-toolkit web config (TLS, basic auth)"),
    "max_targets": Key(int, check=_positive_int(1), doc="targets polled (excess dropped)"),
    "max_series": Key(int, check=_positive_int(1), doc="default of targets[].max_series"),
    "http_server": Key(dict, children=HTTP_SERVER_LIMITS_SCHEMA, doc="HTTP server limits"),
    "parser": Key(str, check=_one_of(*PARSERS),
                  doc="fast (only the families read) | full (prometheus_client, baseline)"),
    "shard_count": Key(int, check=_positive_int(1), doc="exporters sharing the targets"),
    "shard_index": Key(int, check=_positive_int(0), doc="this exporter's shard, 0-based"),
    "max_concurrent_polls": Key(int, check=_positive_int(1),
                                doc="polls in flight at once (default: one per target)"),
    "poll_spread": Key(bool, doc="spread targets over the interval (default true)"),
}
FILE_SD_SCHEMA: dict[str, Key] = {
    "files": Key(list, required=True, items=Key(str), doc="file_sd files (globs allowed)"),
    "refresh_interval": Key((*_NUM, str), check=parse_duration, doc="re-read period"),
}
TOP_SCHEMA: dict[str, Key] = {
    "global": Key(dict, children=GLOBAL_SCHEMA),
    "targets": Key(list, items=Key(dict, children=TARGET_SCHEMA)),
    "file_sd_configs": Key(list, items=Key(dict, children=FILE_SD_SCHEMA),
                           doc="Prometheus file_sd target files"),
    "controller": Key(dict, children=CONTROLLER_GLOBAL_SCHEMA),
}


def validate(value: Any, key: Key, path: str, where: str) -> Any:
    """Check ``value`` against ``key``; return the converted value or raise ConfigError."""
    def fail(msg: str) -> ConfigError:
        return ConfigError(f"{where}: {path}: {msg}")

    kinds = key.kind if isinstance(key.kind, tuple) else (key.kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise fail(f"expected {_kind_name(key.kind)}, got a boolean")
    if not isinstance(value, kinds):
        raise fail(f"expected {_kind_name(key.kind)}, got {_yaml_type(value)}")
    if key.kind is dict and key.children is not None:
        out = {}
        for k, v in value.items():
            sub = f"{path}.{k}" if path else str(k)
            if k not in key.children:
                allowed = ", ".join(key.children)
                raise ConfigError(f"{where}: {sub}: unknown key (allowed: {allowed})")
            out[k] = validate(v, key.children[k], sub, where)
        for k, child in key.children.items():
            if child.required and k not in value:
                raise fail(f"missing required key {k!r}")
        return out
    if key.kind is dict and key.values is not None:
        return {str(k): validate(v, key.values, f"{path}.{k}", where) for k, v in value.items()}
    if key.kind is list and key.items is not None:
        return [validate(v, key.items, f"{path}[{i}]", where) for i, v in enumerate(value)]
    if key.check is not None:
        try:
            return key.check(value)
        except CheckError as exc:
            raise fail(str(exc)) from None
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "a number", float: "a number", str: "a string", dict: "a mapping",
             list: "a list"}
    return " or ".join(dict.fromkeys(names.get(k, k.__name__) for k in kinds))


def _yaml_type(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__) \
        + (f" {value!r}" if isinstance(value, int | float | str) else "")


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
        try:
            with open(auth[file_key], encoding="utf-8") as fh:
                secret = fh.read().strip()
        except OSError as exc:
            raise ConfigError(f"{where}: {path}.{file_key}: cannot read {auth[file_key]!r}: "
                              f"{exc.strerror}") from exc
    else:
        secret = os.environ.get(auth[env_key], "")
        if not secret:
            raise ConfigError(f"{where}: {path}.{env_key}: environment variable "
                              f"{auth[env_key]!r} is not set or empty")
    if not secret:
        raise ConfigError(f"{where}: {path}.{file_key}: the file is empty")
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
            raise ConfigError(f"{where}: {tpath}.cert_file: cannot load the client "
                              f"certificate and key (not PEM, encrypted key, or the key does "
                              f"not match: {exc.reason})") from exc
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
        if hname.lower() in SECRET_HEADERS:
            redact.register(hvalue)
            redact.register(hvalue.partition(" ")[2])
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
        max_series=raw.get("max_series", default_max_series))


def read_yaml(path: str) -> Any:
    """Parse one YAML file (an empty file is ``{}``); errors name the file and line.

    Shared by every file the exporter reads at start-up (this config, the web config) so
    they all fail the same way: one ConfigError, never a traceback.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        raise ConfigError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from exc
    return {} if data is None else data


def load_file(path: str) -> Mapping[str, Any]:
    """Read and validate a YAML config file; return the validated mapping."""
    return validate(read_yaml(path), Key(dict, children=TOP_SCHEMA), "", path)


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
        targets = [t for t in targets if shard_of(t.name, shard_count) == shard_index]
    if poll_interval is not None and not poll_interval > 0:
        raise ConfigError(f"--poll-interval: expected a positive number, got {poll_interval}")
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
    return ServeConfig(
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


def _relative_to(config_file: str | None, path: str) -> str:
    """A relative file_sd path is relative to the config file's directory (like Prometheus)."""
    if config_file is None or os.path.isabs(path):
        return path
    return os.path.join(os.path.dirname(os.path.abspath(config_file)), path)
