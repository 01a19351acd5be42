"""`--web-config FILE`: TLS and basic auth in the prometheus/exporter-toolkit format.

Operators protect every Prometheus exporter with the same ``web-config.yml``; specwatch reads
that schema (``tls_server_config``, ``http_server_config``, ``basic_auth_users``,
``rate_limit``) so the file can be shared with node_exporter and friends. The schema, where
Python's ``ssl`` differs from Go's ``crypto/tls``, and how basic auth resists timing and
flooding are in docs/security.md ("Protecting the exporter").

Owns loading and validating the file into a `WebConfig` (a ready `ssl.SSLContext`, the users,
the headers, the rate limit), basic-auth checking with its cache (keyed on user, hash and
password; successes apart from failures), the per-address limit on failed logins
(`FailureLimiter`) and the request rate limit (`RateLimiter`). Validation is strict and every
error names the file and the key; relative paths are resolved against the file's directory, as
the toolkit does.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import logging
import os
import random
import re
import secrets
import ssl
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import bcrypt

from specwatch.common import boundedfile, tlsfiles
from specwatch.common.boundedfile import WEB_CONFIG
from specwatch.common.errors import ConfigError
from specwatch.common.schema import CheckError, Key, parse_duration, read_yaml, validate

log = logging.getLogger(__name__)

CLIENT_AUTH_TYPES = ("NoClientCert", "RequestClientCert", "RequireAnyClientCert",
                     "RequireClientCert", "VerifyClientCertIfGiven",
                     "RequireAndVerifyClientCert")
TLS_VERSIONS: dict[str, ssl.TLSVersion] = {
    "TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3,
}
#: Go curve names → OpenSSL names.
CURVES: dict[str, str] = {"CurveP256": "prime256v1", "CurveP384": "secp384r1",
                          "CurveP521": "secp521r1", "X25519": "X25519"}
#: Go (IANA) cipher-suite names → OpenSSL names, for the suites Go's crypto/tls offers.
#: TLS 1.3 suites are listed with None: Go and OpenSSL both keep them fixed.
CIPHER_SUITES: dict[str, str | None] = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
}
#: The only response headers the toolkit lets a web config set, with their allowed values.
ALLOWED_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Content-Security-Policy": None,
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-Content-Type-Options": ("nosniff",),
    "X-XSS-Protection": None,
    "Strict-Transport-Security": None,
}
_BCRYPT_RE = re.compile(rb"\$2[abxy]?\$(\d\d)\$[./A-Za-z0-9]{53}")
#: Highest bcrypt cost accepted (the format, like exporter-toolkit's, allows 4 to 31): each
#: unverified password (first login, wrong password, unknown user) costs a bcrypt at that
#: cost under the bcrypt lock; cost 14 is about a second on one core, cost 31 about 35 hours.
BCRYPT_MAX_COST = 14
#: bcrypt reads at most 72 bytes of a password; longer ones are refused, never truncated.
_BCRYPT_MAX_PASSWORD = 72
_CACHE_SIZE = 100


def _choice(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise CheckError(f"expected one of {', '.join(choices)}, got {value!r}")
        return value
    return check


def _cipher(value: str) -> str:
    if value not in CIPHER_SUITES:
        raise CheckError(f"unknown cipher suite {value!r} (expected a Go crypto/tls name such "
                         f"as TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)")
    return value


def _bcrypt_hash(value: str) -> str:
    m = _BCRYPT_RE.fullmatch(value.encode("utf-8", "replace"))
    if not m or not 4 <= int(m.group(1)) <= 31:
        # Never echo the value: it may be a plain-text password pasted by mistake.
        raise CheckError("expected a bcrypt hash like $2b$10$... (htpasswd -nBC 10 \"\" | "
                         "tr -d ':\\n'), got something else")
    if (cost := int(m.group(1))) > BCRYPT_MAX_COST:
        raise CheckError(f"bcrypt cost {cost} is above {BCRYPT_MAX_COST}, the most specwatch "
                         f"spends on a password check (about a second on one core; {cost} is "
                         f"{2 ** (cost - BCRYPT_MAX_COST)} times that): re-hash with a lower "
                         f"cost, e.g. htpasswd -nBC 12 \"\" | tr -d ':\\n'")
    return value


def _burst(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckError(f"expected an integer >= 1, got {value!r}")
    return value


TLS_SERVER_SCHEMA: dict[str, Key] = {
    "cert_file": Key(str, doc="server certificate (PEM), relative to this file"),
    "key_file": Key(str, doc="server private key (PEM)"),
    "cert": Key(str, doc="inline server certificate (PEM)"),
    "key": Key(str, doc="inline server private key (PEM)"),
    "client_auth_type": Key(str, check=_choice(*CLIENT_AUTH_TYPES), doc="client cert policy"),
    "client_ca_file": Key(str, doc="CA bundle that signs client certificates"),
    "client_ca": Key(str, doc="inline client CA bundle (PEM)"),
    "client_allowed_sans": Key(list, items=Key(str), doc="client certificate SAN allow-list"),
    "min_version": Key(str, check=_choice(*TLS_VERSIONS), doc="default TLS12"),
    "max_version": Key(str, check=_choice(*TLS_VERSIONS), doc="default TLS13"),
    "cipher_suites": Key(list, items=Key(str, check=_cipher), doc="TLS <= 1.2 suites"),
    "prefer_server_cipher_suites": Key(bool, doc="default true"),
    "curve_preferences": Key(list, items=Key(str, check=_choice(*CURVES)), doc="ECDH curve"),
}
HTTP_SERVER_SCHEMA: dict[str, Key] = {
    "http2": Key(bool, doc="accepted for compatibility; HTTP/1.1 is served"),
    "headers": Key(dict, values=Key(str), doc="security headers (allow-list)"),
}
RATE_LIMIT_SCHEMA: dict[str, Key] = {
    "interval": Key((int, float, str), required=True, check=parse_duration,
                    doc="one request per interval on average"),
    "burst": Key(int, required=True, check=_burst, doc="bucket size"),
}
WEB_CONFIG_SCHEMA: dict[str, Key] = {
    "tls_server_config": Key(dict, children=TLS_SERVER_SCHEMA),
    "http_server_config": Key(dict, children=HTTP_SERVER_SCHEMA),
    "basic_auth_users": Key(dict, values=Key(str, check=_bcrypt_hash)),
    "rate_limit": Key(dict, children=RATE_LIMIT_SCHEMA),
}


@dataclass(frozen=True)
class TLSServer:
    """A ready server context plus what must be checked after the handshake."""

    context: ssl.SSLContext
    allowed_sans: frozenset[str] | None = None
    client_auth_type: str = "NoClientCert"


@dataclass(frozen=True)
class WebConfig:
    """One loaded web config: swapped as a whole on reload, never mutated."""

    path: str | None = None
    tls: TLSServer | None = None
    auth: BasicAuth | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    rate_limit: tuple[float, int] | None = None  # (interval seconds, burst)


def load(path: str) -> WebConfig:
    """Read, validate and build a web config; raise ConfigError naming file and key."""
    data = read_yaml(path, WEB_CONFIG)
    if isinstance(data, dict):
        # An empty section (`basic_auth_users:` with nothing under it) means "not set".
        data = {k: v for k, v in data.items() if v is not None}
    raw = validate(data, Key(dict, children=WEB_CONFIG_SCHEMA), "", path)
    base = os.path.dirname(os.path.abspath(path))
    tls = _build_tls(raw.get("tls_server_config") or {}, base, path)
    headers = _check_headers(raw.get("http_server_config", {}).get("headers", {}), path)
    users = raw.get("basic_auth_users") or {}
    for user in users:
        if ":" in user or not user:
            raise ConfigError(f"{path}: basic_auth_users.{user}: a user name must be non-empty "
                              f"and contain no ':' (basic auth splits at the first ':')")
    auth = BasicAuth({u: h.encode() for u, h in users.items()}) if users else None
    rl = raw.get("rate_limit")
    return WebConfig(path=path, tls=tls, auth=auth, headers=headers,
                     rate_limit=(rl["interval"], rl["burst"]) if rl else None)


def _check_headers(headers: Mapping[str, str], where: str) -> dict[str, str]:
    canon = {k.lower(): k for k in ALLOWED_HEADERS}
    out: dict[str, str] = {}
    for name, value in headers.items():
        key = f"http_server_config.headers.{name}"
        proper = canon.get(name.lower())
        if proper is None:
            raise ConfigError(f"{where}: {key}: header not allowed (allowed: "
                              f"{', '.join(ALLOWED_HEADERS)})")
        allowed = ALLOWED_HEADERS[proper]
        if allowed is not None and value.lower() not in allowed:
            raise ConfigError(f"{where}: {key}: expected one of {', '.join(allowed)}, "
                              f"got {value!r}")
        out[proper] = value
    return out


def _resolve(base: str, p: str) -> str:
    return p if os.path.isabs(p) else os.path.join(base, p)


def _build_tls(c: Mapping[str, Any], base: str, where: str) -> TLSServer | None:
    """The toolkit's ConfigToTLSConfig: TLS is on as soon as any TLS key is set."""
    k = "tls_server_config"
    enabling = ("cert_file", "key_file", "cert", "key", "client_ca_file", "client_ca",
                "client_auth_type")
    if not any(c.get(x) for x in enabling):
        if c.get("client_allowed_sans") is not None:
            raise ConfigError(f"{where}: {k}.client_allowed_sans: set without a certificate, "
                              f"key and client_auth_type")
        return None
    for file_key, inline_key in (("cert_file", "cert"), ("key_file", "key")):
        if c.get(file_key) and c.get(inline_key):
            raise ConfigError(f"{where}: {k}.{file_key}: set only one of {file_key} or "
                              f"{inline_key}")
        if not c.get(file_key) and not c.get(inline_key):
            raise ConfigError(f"{where}: {k}: missing one of {inline_key} or {file_key}")

    ctx = _tls_context(c, where)
    _load_cert_chain(ctx, c, base, where)
    auth_type = _client_auth(ctx, c, base, where)
    _ciphers_and_curves(ctx, c, where)
    sans = c.get("client_allowed_sans")
    return TLSServer(context=ctx, client_auth_type=auth_type,
                     allowed_sans=frozenset(_norm_san(s) for s in sans)
                     if sans is not None else None)


def _tls_context(c: Mapping[str, Any], where: str) -> ssl.SSLContext:
    """A server context bounded by min_version and max_version."""
    k = "tls_server_config"
    min_v = TLS_VERSIONS[c.get("min_version", "TLS12")]
    max_v = TLS_VERSIONS[c.get("max_version", "TLS13")]
    if min_v > max_v:
        raise ConfigError(f"{where}: {k}.min_version: {c.get('min_version', 'TLS12')} is above "
                          f"max_version {c.get('max_version', 'TLS13')}")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.minimum_version = min_v
        ctx.maximum_version = max_v
    except (ValueError, ssl.SSLError) as exc:
        raise ConfigError(f"{where}: {k}.min_version: not supported by this OpenSSL: "
                          f"{exc}") from exc
    return ctx


def _client_auth(ctx: ssl.SSLContext, c: Mapping[str, Any], base: str, where: str) -> str:
    """Apply client_auth_type and the client CA to the context; the policy in force
    (RequireClientCert is its alias RequireAnyClientCert)."""
    k = "tls_server_config"
    auth_type = c.get("client_auth_type", "NoClientCert")
    if auth_type == "RequireClientCert":
        auth_type = "RequireAnyClientCert"
    has_ca = bool(c.get("client_ca_file") or c.get("client_ca"))
    if c.get("client_ca_file") and c.get("client_ca"):
        raise ConfigError(f"{where}: {k}.client_ca_file: set only one of client_ca_file or "
                          f"client_ca")
    if has_ca and auth_type == "NoClientCert":
        raise ConfigError(f"{where}: {k}.client_ca_file: a client CA is set without a client "
                          f"auth policy; set client_auth_type (RequireAndVerifyClientCert)")
    if c.get("client_allowed_sans") is not None and auth_type not in (
            "RequireAnyClientCert", "RequireAndVerifyClientCert"):
        raise ConfigError(f"{where}: {k}.client_allowed_sans: requires client_auth_type "
                          f"RequireAnyClientCert or RequireAndVerifyClientCert")
    if auth_type in ("NoClientCert", "RequestClientCert"):
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx.verify_mode = ssl.CERT_OPTIONAL if auth_type == "VerifyClientCertIfGiven" \
            else ssl.CERT_REQUIRED
        if auth_type == "RequireAnyClientCert":
            log.warning("%s: client_auth_type RequireAnyClientCert: Python's ssl verifies every "
                        "client certificate it asks for, so specwatch requires one that "
                        "verifies against the client CA (RequireAndVerifyClientCert)", where)
        if c.get("client_ca_file"):  # OpenSSL reads it: refuse a FIFO before it blocks
            boundedfile.check_regular(_resolve(base, c["client_ca_file"]), boundedfile.TLS_FILE,
                                      where=f"{where}: {k}.client_ca_file")
        try:
            if c.get("client_ca_file"):
                ctx.load_verify_locations(cafile=_resolve(base, c["client_ca_file"]))
            elif c.get("client_ca"):
                ctx.load_verify_locations(cadata=c["client_ca"])
            else:
                ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        except ssl.SSLError as exc:
            key = "client_ca_file" if c.get("client_ca_file") else "client_ca"
            raise ConfigError(f"{where}: {k}.{key}: no valid PEM certificate ({exc.reason})") \
                from exc
        except OSError as exc:
            raise ConfigError(f"{where}: {k}.client_ca_file: cannot read "
                              f"{c.get('client_ca_file')!r}: {exc.strerror}") from exc
        if has_ca and not ctx.get_ca_certs():
            raise ConfigError(f"{where}: {k}.client_ca_file: holds no CA certificate")
    return auth_type


def _ciphers_and_curves(ctx: ssl.SSLContext, c: Mapping[str, Any], where: str) -> None:
    """cipher_suites (Go's names), prefer_server_cipher_suites and curve_preferences."""
    k = "tls_server_config"
    suites = c.get("cipher_suites") or []
    openssl_names = [CIPHER_SUITES[s] for s in suites if CIPHER_SUITES[s]]
    if openssl_names:
        try:
            ctx.set_ciphers(":".join(openssl_names))
        except ssl.SSLError as exc:
            raise ConfigError(f"{where}: {k}.cipher_suites: none of {suites} is available in "
                              f"this OpenSSL") from exc
    if c.get("prefer_server_cipher_suites", True):
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    curves = c.get("curve_preferences") or []
    if curves:
        if len(curves) > 1:
            log.warning("%s: curve_preferences: Python's ssl applies one ECDH curve; using %s",
                        where, curves[0])
        try:
            ctx.set_ecdh_curve(CURVES[curves[0]])
        except (ValueError, ssl.SSLError) as exc:
            raise ConfigError(f"{where}: {k}.curve_preferences: {curves[0]} is not available "
                              f"in this OpenSSL") from exc


def _load_cert_chain(ctx: ssl.SSLContext, c: Mapping[str, Any], base: str, where: str) -> None:
    k = "tls_server_config"
    cert_path = _resolve(base, c["cert_file"]) if c.get("cert_file") else None
    key_path = _resolve(base, c["key_file"]) if c.get("key_file") else None
    for key, p in (("cert_file", cert_path), ("key_file", key_path)):
        if p is not None:
            boundedfile.check_regular(p, boundedfile.TLS_FILE, where=f"{where}: {k}.{key}")
    tmpdir = None
    try:
        if cert_path is None or key_path is None:
            # ssl loads certificates from files only: inline PEM goes to a private temp dir
            # that is removed right after loading.
            tmpdir = tempfile.mkdtemp(prefix="specwatch-tls-")
            if cert_path is None:
                cert_path = os.path.join(tmpdir, "cert.pem")
                _write_private(cert_path, c["cert"])
            if key_path is None:
                key_path = os.path.join(tmpdir, "key.pem")
                _write_private(key_path, c["key"])
        try:
            ctx.load_cert_chain(cert_path, key_path)
        except OSError as exc:
            if isinstance(exc, ssl.SSLError):
                what = tlsfiles.chain_error(
                    exc, cert_path,
                    cert_key="cert_file" if c.get("cert_file") else "cert",
                    key_key="key_file" if c.get("key_file") else "key")
                raise ConfigError(f"{where}: {k}: cannot load the certificate and key: "
                                  f"{what}") from exc
            raise ConfigError(f"{where}: {k}.cert_file: cannot read: {exc.strerror}") from exc
    finally:
        if tmpdir is not None:
            for name in os.listdir(tmpdir):
                os.unlink(os.path.join(tmpdir, name))
            os.rmdir(tmpdir)


def _write_private(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def _norm_san(value: str) -> str:
    """IP SANs compare as addresses (Python prints IPv6 SANs expanded, Go compressed)."""
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        return value


def peer_sans(cert: Mapping[str, Any] | None) -> list[str]:
    """DNS, e-mail, IP and URI SANs of a verified peer certificate (getpeercert() form)."""
    if not cert:
        return []
    return [_norm_san(v) for kind, v in cert.get("subjectAltName", ())
            if kind in ("DNS", "email", "IP Address", "URI")]


#: The alphabet of bcrypt's base64 (the 31 characters of a hash's digest).
_BCRYPT_ALPHABET = "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def dummy_hash(cost: int) -> bytes:
    """A hash of ``cost`` no password matches, built without bcrypt (a fresh salt, a random
    digest): checking one against it costs a real check at that cost, building it nothing."""
    digest = "".join(secrets.choice(_BCRYPT_ALPHABET) for _ in range(31))
    return bcrypt.gensalt(rounds=cost) + digest.encode()


class BasicAuth:
    """bcrypt basic auth with a fake-hash path, a bcrypt lock and a poisoning-safe cache.

    **Cache.** Results are kept per credential, keyed on a hash of (user, stored hash,
    password): a success unlocks only that exact password (CVE-2022-46146). Successes and
    failures live in separate bounded maps, so a flood of distinct wrong passwords evicts
    other failures, never the scraper's verified credential: bcrypt runs once per distinct
    credential, and a known-good one is answered from memory (:meth:`cached`) without
    waiting for the bcrypt lock that wrong passwords queue on.
    """

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users = dict(users)
        costs = [int(h[4:6]) for h in self._users.values()]
        self._dummy = dummy_hash(max(costs or [10]))
        self._bcrypt_lock = threading.Lock()
        self._good: OrderedDict[bytes, None] = OrderedDict()  # LRU of verified credentials
        self._bad: dict[bytes, None] = {}
        self._cache_lock = threading.Lock()
        self.bcrypt_calls = 0  # for tests and the curious: how often bcrypt really ran

    @property
    def users(self) -> frozenset[str]:
        return frozenset(self._users)

    def _key(self, user: str, password: bytes) -> tuple[bool, bytes, bytes]:
        known = user in self._users
        hashed = self._users[user] if known else self._dummy
        key = hashlib.sha256(b"\0".join(
            (str(len(user)).encode(), user.encode("utf-8", "surrogateescape"),
             hashed, str(len(password)).encode(), password))).digest()
        return known, hashed, key

    def cached(self, user: str, password: bytes) -> bool | None:
        """The remembered result for this exact credential, or None (bcrypt not run yet)."""
        known, _, key = self._key(user, password)
        with self._cache_lock:
            if key in self._good:
                self._good.move_to_end(key)
                return known
            if key in self._bad:
                return False
        return None

    def check(self, user: str, password: bytes) -> bool:
        known, hashed, key = self._key(user, password)
        remembered = self.cached(user, password)
        if remembered is not None:
            return remembered
        too_long = len(password) > _BCRYPT_MAX_PASSWORD
        with self._bcrypt_lock:
            self.bcrypt_calls += 1
            try:
                ok = bcrypt.checkpw(password[:_BCRYPT_MAX_PASSWORD], hashed)
            except ValueError:
                ok = False
        ok = ok and known and not too_long
        with self._cache_lock:
            if ok:
                self._good[key] = None
                if len(self._good) > _CACHE_SIZE:
                    self._good.popitem(last=False)
            else:
                if len(self._bad) >= _CACHE_SIZE:
                    self._bad.pop(random.choice(list(self._bad)))
                self._bad[key] = None
        return ok


class FailureLimiter:
    """Failed logins per client address: a token bucket per address (``burst`` failures,
    then one per ``interval``).

    An address whose bucket is empty gets 429 before bcrypt runs, so wrong passwords cost
    the server at most one bcrypt per ``interval`` per address after the burst. A credential
    already verified (cached) never needs an attempt, so an attacker sharing the scraper's
    address cannot lock the scraper out once it has logged in. The map is
    bounded (``max_clients``): when full, buckets that have refilled are dropped first, then
    the oldest.
    """

    def __init__(self, burst: int = 10, interval: float = 1.0, max_clients: int = 4096,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.burst = float(burst)
        self.rate = 1.0 / interval
        self.max_clients = max_clients
        self._monotonic = monotonic
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at
        self._lock = threading.Lock()

    def _tokens(self, client: str, now: float) -> float:
        tokens, at = self._buckets.get(client, (self.burst, now))
        return min(self.burst, tokens + (now - at) * self.rate)

    def acquire(self, client: str) -> bool:
        """Take one attempt for ``client`` before checking its password (False: none left).

        Taken before bcrypt runs, not after it failed, so 40 wrong passwords arriving at
        once cannot all reach bcrypt: at most ``burst`` per address are ever checked at once.
        """
        with self._lock:
            now = self._monotonic()
            tokens = self._tokens(client, now)
            if tokens < 1.0:
                return False
            self._buckets[client] = (tokens - 1.0, now)
            self._buckets.move_to_end(client)
            if len(self._buckets) > self.max_clients:
                full = [c for c in list(self._buckets)[:64]
                        if self._tokens(c, now) >= self.burst]
                for c in full or [next(iter(self._buckets))]:
                    del self._buckets[c]
            return True

    def succeeded(self, client: str) -> None:
        """Give back the attempt taken by :meth:`acquire`: only failures count."""
        with self._lock:
            if client in self._buckets:
                now = self._monotonic()
                self._buckets[client] = (min(self.burst, self._tokens(client, now) + 1.0), now)

    def __len__(self) -> int:
        return len(self._buckets)


def parse_basic(header: str | None) -> tuple[str, bytes] | None:
    """(user, password) from ``Basic base64(user:password)``; None when malformed."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


class RateLimiter:
    """Token bucket (Go's rate.Limiter semantics): ``burst`` tokens, one per ``interval``."""

    def __init__(self, interval: float, burst: int,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.rate = 1.0 / interval
        self.burst = float(burst)
        self._tokens = float(burst)
        self._last = monotonic()
        self._monotonic = monotonic
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            now = self._monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False
