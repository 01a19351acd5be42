"""`specwatch serve` configuration: YAML file and/or flags, strictly validated.

Owns the poll path's keys: validation is driven by schema tables (:data:`TOP_SCHEMA`,
:data:`GLOBAL_SCHEMA`, :data:`TARGET_SCHEMA`, :data:`AUTH_SCHEMA`) of :class:`Key` entries, not
by ad-hoc checks. The file is parsed once into typed objects: :class:`ServeConfig` (the file and
``global``), :class:`TargetConfig` (each target) and each plug-in's own value.

A plug-in declares its part of the file as a :class:`ConfigSection` (its keys, where they sit,
the parsers of its typed values, the files it names). Nothing registers on import: the
application composes the sections it runs with (:func:`compose`) and passes them to
:func:`build_config`, so what validates never depends on what was imported first. A plug-in
reads its values with :meth:`ServeConfig.section` and :meth:`TargetConfig.section`. Every
error names the file and the key path, e.g.
``specwatch.yaml: targets[1].url: expected an http(s) URL, got 'foo'``.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar, cast
from urllib.parse import urlsplit

from specwatch.common import boundedfile, redact, tlsfiles
from specwatch.common.errors import ConfigError
from specwatch.common.schema import (
    NUM,
    CheckError,
    Key,
    check_listen,
    check_url,
    format_duration,
    non_negative,
    one_of,
    parse_duration,
    positive_int,
    read_yaml,
    validate,
)
from specwatch.common.secretfile import read_secret_file
from specwatch.poll import configpaths
from specwatch.poll.discovery import DEFAULT_REFRESH_INTERVAL, FileSDConfig, shard_of
from specwatch.poll.sources import DEFAULT_MAX_LABEL_VALUE_BYTES, ENGINE_KINDS, PARSERS
from specwatch.web.limits import ServerLimits

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


def check_name(value: str) -> str:
    """Check: a target (or pair) name, the value of a label."""
    if not value or not re.fullmatch(r"[A-Za-z0-9_.:@/-]+", value):
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


#: The poll path's keys of a target, of ``global`` and of the file; :func:`compose` puts each
#: plug-in's keys into copies of these tables.
TARGET_SCHEMA: dict[str, Key] = {
    "name": Key(str, check=check_name, doc="label value of `target` (default: host:port)"),
    "url": Key(str, required=True, check=check_url, doc="the /metrics URL"),
    "engine": Key(str, check=one_of(*ENGINE_KINDS), doc=" | ".join(ENGINE_KINDS)),
    "timeout": Key((*NUM, str), check=parse_duration, doc="total deadline of one poll"),
    "max_body_bytes": Key(int, check=positive_int(1024), doc="largest page accepted"),
    "headers": Key(dict, values=Key(str), doc="extra request headers"),
    "follow_redirects": Key(str, check=one_of(*FOLLOW_REDIRECTS),
                            doc="same_host (default) | any | none"),
    "auth": Key(dict, children=AUTH_SCHEMA, doc="bearer token or basic auth"),
    "max_num_seqs": Key(int, check=positive_int(1),
                        doc="vLLM --max-num-seqs of the server (no page states it)"),
    "tls": Key(dict, children=TARGET_TLS_SCHEMA, doc="CA, client certificate"),
    "max_series": Key(int, check=positive_int(1), doc="source series kept per poll"),
    "max_models": Key(int, check=positive_int(1),
                      doc="models followed at once, and vanished models remembered"),
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
FILE_SD_SCHEMA: dict[str, Key] = {
    "files": Key(list, required=True, items=Key(str), doc="file_sd files (globs allowed)"),
    "refresh_interval": Key((*NUM, str), check=parse_duration, doc="re-read period"),
}
TOP_SCHEMA: dict[str, Key] = {
    "global": Key(dict, children=GLOBAL_SCHEMA),
    "targets": Key(list, items=Key(dict, children=TARGET_SCHEMA)),
    "file_sd_configs": Key(list, items=Key(dict, children=FILE_SD_SCHEMA),
                           doc="Prometheus file_sd target files"),
}


T = TypeVar("T")


@dataclass(frozen=True)
class SectionContext:
    """What a section's check across keys may rely on: the targets this exporter polls, whether
    more may appear at run time (file_sd or sharding), and the window labels it derives."""

    where: str
    target_names: tuple[str, ...]
    open_target_set: bool
    windows: tuple[str, ...]


#: Turns a file name the config gives into the name to open (relative to the config file).
Resolve = Callable[[str], str]


@dataclass(frozen=True)
class ConfigSection(Generic[T]):
    """A plug-in's part of the file: keys at the top level, in each target and in ``global``,
    each group placed after a key of the tables above (the order the errors list them in; at
    the end when that key is not there yet).

    ``build`` parses the file's validated mapping into the section's value once the targets
    are known (:meth:`ServeConfig.section`); ``target_build`` parses one target's validated
    mapping, with its key path and file (:meth:`TargetConfig.section`). Both are given an
    empty mapping when the file could not hold the section's keys. ``shard_keys`` names
    targets that must be sharded together (target name -> the name it is sharded by).
    ``resolve_top`` and ``resolve_target`` return the file's (or one target's) mapping with
    the files the section's keys name made relative to the config file."""

    name: str
    top: Mapping[str, Key] = field(default_factory=dict)
    top_after: str = ""
    target: Mapping[str, Key] = field(default_factory=dict)
    target_after: str = ""
    global_keys: Mapping[str, Key] = field(default_factory=dict)
    global_after: str = ""
    build: Callable[[Mapping[str, Any], SectionContext], T] | None = None
    target_build: Callable[[Mapping[str, Any], str, str], Any] | None = None
    shard_keys: Callable[[Mapping[str, Any]], Mapping[str, str]] | None = None
    resolve_top: Callable[[Mapping[str, Any], Resolve], Mapping[str, Any]] | None = None
    resolve_target: Callable[[Mapping[str, Any], Resolve], Mapping[str, Any]] | None = None


def _inserted_after(table: Mapping[str, Key], after: str,
                    keys: Mapping[str, Key]) -> dict[str, Key]:
    items = list(table.items())
    at = next((i + 1 for i, (k, _) in enumerate(items) if k == after), len(items))
    items[at:at] = keys.items()
    return dict(items)


@dataclass(frozen=True)
class Schema:
    """The poll path's tables with the given sections' keys in place, in the sections' order;
    the tables of the poll path alone are left as they are."""

    sections: tuple[ConfigSection[Any], ...]
    top: Mapping[str, Key]
    global_keys: Mapping[str, Key]
    target: Mapping[str, Key]

    def file_key(self) -> Key:
        return Key(dict, children=self.top)

    def target_key(self) -> Key:
        return Key(dict, children=self.target)


def compose(sections: Sequence[ConfigSection[Any]] = ()) -> Schema:
    """The schema of a file holding the poll path's keys and these sections' (each name once;
    the first of a name wins)."""
    unique: dict[str, ConfigSection[Any]] = {}
    for section in sections:
        unique.setdefault(section.name, section)
    top: Mapping[str, Key] = TOP_SCHEMA
    global_keys: Mapping[str, Key] = GLOBAL_SCHEMA
    target: Mapping[str, Key] = TARGET_SCHEMA
    for section in unique.values():
        top = _inserted_after(top, section.top_after, section.top)
        target = _inserted_after(target, section.target_after, section.target)
        global_keys = _inserted_after(global_keys, section.global_after, section.global_keys)
    top = {**top, "global": replace(top["global"], children=global_keys),
           "targets": replace(top["targets"], items=Key(dict, children=target))}
    return Schema(tuple(unique.values()), top, global_keys, target)


#: The poll path's keys alone (no plug-in).
POLL_SCHEMA = compose()


@dataclass(frozen=True)
class TargetConfig:
    name: str
    url: str
    engine: str = "auto"
    timeout: float = DEFAULT_TIMEOUT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    #: requests' ``verify``: True (system CAs), a CA bundle path, or False (skip verify).
    tls_verify: bool | str = True
    #: (certificate, key) paths of a client certificate, or None.
    tls_client_cert: tuple[str, str] | None = None
    max_series: int = DEFAULT_MAX_SERIES
    follow_redirects: str = "same_host"
    #: Models followed at once (None: the pipeline's default).
    max_models: int | None = None
    #: The server's --max-num-seqs (no page states it), or None.
    max_num_seqs: int | None = None
    #: Each section's value for this target, by section name (:meth:`section`).
    sections: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def section(self, section: ConfigSection[Any]) -> Any:
        """This target's value of a section (parsed from no keys when the target was built
        without that section)."""
        if section.name in self.sections:
            return self.sections[section.name]
        if section.target_build is None:
            raise KeyError(f"config section {section.name!r} has no per-target value")
        return section.target_build({}, "", "")


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
    web_config: str | None = None
    max_targets: int = DEFAULT_MAX_TARGETS
    #: Names of configured targets beyond ``max_targets`` (not polled; counted and logged).
    dropped_targets: tuple[str, ...] = ()
    #: ``global.http_server``: the limits of the HTTP server (defaults for what is not set).
    http_server: ServerLimits = field(default_factory=ServerLimits)
    #: Sharding: this exporter polls the targets whose shard is shard_index.
    shard_index: int = 0
    shard_count: int = 1
    file_sd: tuple[FileSDConfig, ...] = ()
    #: Polls in flight at once; None: one per target (see README, Performance and scale).
    max_concurrent_polls: int | None = None
    #: Poll each target on its own phase of the interval (False: all together).
    poll_spread: bool = True
    #: Defaults a discovered (file_sd) target gets: timeout, max_body_bytes, max_series,
    #: max_models.
    target_defaults: TargetDefaults = (DEFAULT_TIMEOUT, DEFAULT_MAX_BODY_BYTES,
                                       DEFAULT_MAX_SERIES, None)
    #: Longer label values from targets are cut (``global.max_label_value_bytes``).
    max_label_value_bytes: int = DEFAULT_MAX_LABEL_VALUE_BYTES
    #: The keys this configuration was validated against (the poll path's and the sections').
    schema: Schema = POLL_SCHEMA

    #: Target name -> the name it is sharded by (the registered sections' groups).
    shard_keys: Mapping[str, str] = field(default_factory=dict)
    #: Each registered section's built value, by section name (:meth:`section`).
    sections: Mapping[str, Any] = field(default_factory=dict, repr=False)

    #: Where the configuration came from (the file name, for error messages).
    source: str = "command line"

    def section(self, section: ConfigSection[T]) -> T:
        """The value ``section.build`` gave for this configuration (built now from no keys for
        a section the configuration was not built with, whose keys it therefore cannot
        hold)."""
        if section.name in self.sections:
            return cast(T, self.sections[section.name])
        if section.build is None:
            raise KeyError(f"config section {section.name!r} has no value")
        context = SectionContext(self.source, tuple(t.name for t in self.targets),
                                 bool(self.file_sd) or self.shard_count > 1,
                                 tuple(w for w, _ in self.windows))
        return section.build({}, context)

    def discovered_target(self, raw: Mapping[str, Any], where: str) -> TargetConfig:
        """A file_sd target (``{"url": ...}``) validated like a configured one."""
        checked = validate(dict(raw), self.schema.target_key(), "", where)
        return build_target(checked, "", where, *self.target_defaults,
                            sections=self.schema.sections)


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
        boundedfile.check_regular(tls["ca_file"], boundedfile.TLS_FILE,
                                  where=f"{where}: {tpath}.ca_file")
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
            boundedfile.check_regular(tls[key], boundedfile.TLS_FILE,
                                      where=f"{where}: {tpath}.{key}")
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


#: What a target takes from ``global`` unless it sets its own: timeout, max_body_bytes,
#: max_series, max_models (None: the pipeline's default).
TargetDefaults = tuple[float, int, int, int | None]


def build_target(raw: Mapping[str, Any], path: str, where: str, default_timeout: float,
                 default_max_body: int, default_max_series: int = DEFAULT_MAX_SERIES,
                 default_max_models: int | None = None,
                 sections: Sequence[ConfigSection[Any]] = ()) -> TargetConfig:
    """Turn one validated target mapping into a TargetConfig (reads auth secrets), with each
    section's value for it."""
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
        basic_auth=basic, tls_verify=verify, tls_client_cert=cert,
        max_series=raw.get("max_series", default_max_series),
        follow_redirects=raw.get("follow_redirects", "same_host"),
        max_models=raw.get("max_models", default_max_models),
        max_num_seqs=raw.get("max_num_seqs"),
        sections={s.name: s.target_build(raw, path, where) for s in sections
                  if s.target_build is not None})


def load_file(path: str, schema: Schema = POLL_SCHEMA) -> Mapping[str, Any]:
    """Read and validate a YAML config file against ``schema``; return the validated mapping,
    its relative file paths made relative to the file's folder (`configpaths.resolve_paths`)."""
    raw = validate(read_yaml(path), schema.file_key(), "", path)
    return configpaths.resolve_paths(raw, path, schema.sections)


def parse_target_flag(flag: str) -> dict[str, Any]:
    """``[NAME=]URL`` from --target into a target mapping validated like the file's."""
    name, sep, url = flag.partition("=")
    if not sep or "://" in name:
        name, url = "", flag
    raw: dict[str, Any] = {"url": url}
    if name:
        raw["name"] = name
    # The flag is quoted in the message with its control characters escaped: one line.
    return validate(raw, Key(dict, children=TARGET_SCHEMA), "",
                    f"--target {redact.escape_controls(flag)}")


def build_config(config_file: str | None, target_flags: list[str], listen: str | None,
                 poll_interval: float | None, web_config: str | None = None,
                 shard_index: int | None = None, shard_count: int | None = None,
                 schema: Schema = POLL_SCHEMA) -> ServeConfig:
    """Merge the file and the flags (flags win for listen, poll interval, web config and
    sharding). The file may hold the poll path's keys and those of ``schema``'s sections."""
    raw = load_file(config_file, schema) if config_file else {}
    where = config_file or "command line"
    g = raw.get("global", {})
    defaults: TargetDefaults = (g.get("timeout", DEFAULT_TIMEOUT),
                                g.get("max_body_bytes", DEFAULT_MAX_BODY_BYTES),
                                g.get("max_series", DEFAULT_MAX_SERIES), g.get("max_models"))
    targets = _targets(raw, target_flags, where, defaults, schema.sections)
    file_sd = tuple(
        FileSDConfig(tuple(configpaths.relative_to(config_file, f) for f in c["files"]),
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
    keys = {t: k for section in schema.sections if section.shard_keys is not None
            for t, k in section.shard_keys(raw).items()}
    if shard_count > 1:
        # Targets grouped by a section (both sides of a pair) land on one exporter.
        targets = [t for t in targets
                   if shard_of(keys.get(t.name, t.name), shard_count) == shard_index]
    interval = _poll_interval(poll_interval) if poll_interval is not None \
        else g.get("poll_interval", DEFAULT_POLL_INTERVAL)
    windows = _windows(g, where)
    listen_value = _listen(listen, g)
    max_targets = g.get("max_targets", DEFAULT_MAX_TARGETS)
    context = SectionContext(where, tuple(t.name for t in targets),
                             bool(file_sd) or shard_count > 1, tuple(w for w, _ in windows))
    return ServeConfig(
        targets=tuple(targets[:max_targets]),
        listen=listen_value, web_config=_web_config(web_config, g, config_file),
        max_targets=max_targets, dropped_targets=tuple(t.name for t in targets[max_targets:]),
        http_server=_server_limits(g.get("http_server", {})),
        poll_interval=interval,
        windows=windows, count_window=g.get("count_window", DEFAULT_COUNT_WINDOW),
        min_drafts_per_sample=g.get("min_drafts_per_sample", DEFAULT_MIN_DRAFTS),
        min_bimodality_samples=g.get("min_bimodality_samples", DEFAULT_MIN_BIMODALITY_SAMPLES),
        parser=g.get("parser", "fast"), shard_index=shard_index, shard_count=shard_count,
        file_sd=file_sd, max_concurrent_polls=g.get("max_concurrent_polls"),
        poll_spread=g.get("poll_spread", True), target_defaults=defaults,
        max_label_value_bytes=g.get("max_label_value_bytes", DEFAULT_MAX_LABEL_VALUE_BYTES),
        source=where, shard_keys=keys, schema=schema,
        sections={section.name: section.build(raw, context) for section in schema.sections
                  if section.build is not None})


def _targets(raw: Mapping[str, Any], target_flags: list[str], where: str,
             defaults: TargetDefaults, sections: Sequence[ConfigSection[Any]]
             ) -> list[TargetConfig]:
    """The file's targets, then the --target flags', each name unique."""
    targets = [build_target(t, f"targets[{i}]", where, *defaults, sections=sections)
               for i, t in enumerate(raw.get("targets", []))]
    for flag in target_flags:
        targets.append(build_target(parse_target_flag(flag), "target", f"--target {flag}",
                                    *defaults, sections=sections))
    seen: dict[str, int] = {}
    for i, t in enumerate(targets):
        if t.name in seen:
            loc = f"targets[{i}].name" if i < len(raw.get("targets", [])) else "--target"
            raise ConfigError(f"{where}: {loc}: duplicate target name {t.name!r} (also "
                              f"targets[{seen[t.name]}]); give each target a unique name")
        seen[t.name] = i
    return targets


def _server_limits(h: Mapping[str, Any]) -> ServerLimits:
    d = ServerLimits()
    return ServerLimits(
        max_requests_in_flight=h.get("max_requests_in_flight", d.max_requests_in_flight),
        max_connections=h.get("max_connections", d.max_connections),
        max_connections_per_client=h.get("max_connections_per_client",
                                         d.max_connections_per_client),
        failed_logins_per_client=h.get("failed_logins_per_client",
                                       d.failed_logins_per_client),
        failed_login_interval=h.get("failed_login_interval", d.failed_login_interval),
        request_timeout=h.get("request_timeout", d.request_timeout),
        idle_timeout=h.get("idle_timeout", d.idle_timeout),
        handshake_timeout=h.get("tls_handshake_timeout", d.handshake_timeout))


def _poll_interval(flag: Any) -> float:
    try:
        return parse_duration(flag)
    except CheckError as exc:
        raise ConfigError(f"--poll-interval: {exc}") from None


def _windows(g: Mapping[str, Any], where: str) -> tuple[tuple[str, float], ...]:
    """``global.windows`` as (label, seconds), each label once."""
    windows_raw = g.get("windows")
    windows = tuple((format_duration(s), s) for s in windows_raw) if windows_raw is not None \
        else ServeConfig.__dataclass_fields__["windows"].default
    labels = [w for w, _ in windows]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"{where}: global.windows: duplicate window {labels}")
    return windows


def _listen(flag: str | None, g: Mapping[str, Any]) -> str:
    if flag is None:
        return g.get("listen", DEFAULT_LISTEN)
    try:
        check_listen(flag)
    except CheckError as exc:
        raise ConfigError(f"--listen: {exc}") from None
    return flag


def _web_config(flag: str | None, g: Mapping[str, Any], config_file: str | None) -> str | None:
    """--web-config as given; the file's ``global.web_config`` relative to the file."""
    if flag is not None:
        return flag
    path = g.get("web_config")
    return configpaths.relative_to(config_file, path) if path else path
