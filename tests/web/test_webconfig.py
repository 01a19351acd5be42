"""Web config validation (exporter-toolkit format): a table of bad files, each rejected with
a ConfigError naming the file and the key, and of good files that load.

Certificates are generated per session; file paths in the YAML are substituted from the
generated PKI (``{cert}``, ``{key}``, ``{ca}``, ...).
"""

from __future__ import annotations

import ssl

import bcrypt
import pytest
from helpers import testsecrets
from helpers.certs import PKI, make_pki

from specwatch.common.errors import ConfigError
from specwatch.web import webconfig

HASH = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki-wc"))


def _subst(text: str, pki: PKI) -> str:
    return text.format(cert=pki.server.cert, key=pki.server.key, ca=pki.ca,
                       other_key=pki.other_client.key, hash=HASH,
                       cert_pem=pki.server.cert.read_text().replace("\n", "\n    "),
                       key_pem=pki.server.key.read_text().replace("\n", "\n    "))


TLS = "tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"

BAD = {
    "unknown_top_key": ("tls_config: {{}}\n", "tls_config: unknown key"),
    "unknown_tls_key": (TLS + "  cert_path: x\n", "tls_server_config.cert_path: unknown key"),
    "cert_file_missing": ("tls_server_config:\n  cert_file: /nonexistent.crt\n"
                          "  key_file: {key}\n", "tls_server_config.cert_file: cannot read"),
    "key_file_missing": ("tls_server_config:\n  cert_file: {cert}\n"
                         "  key_file: /nonexistent.key\n",
                         "tls_server_config.key_file: cannot read"),
    "cert_without_key": ("tls_server_config:\n  cert_file: {cert}\n",
                         "missing one of key or key_file"),
    "key_without_cert": ("tls_server_config:\n  key_file: {key}\n",
                         "missing one of cert or cert_file"),
    "cert_and_inline_cert": (TLS + "  cert: abc\n", "set only one of cert_file or cert"),
    "key_does_not_match_cert": ("tls_server_config:\n  cert_file: {cert}\n"
                                "  key_file: {other_key}\n", "key does not match"),
    "cert_file_not_pem": ("tls_server_config:\n  cert_file: {hash_file}\n  key_file: {key}\n",
                          "cannot load the certificate and key"),
    "unknown_tls_version": (TLS + "  min_version: TLS14\n",
                            "tls_server_config.min_version: expected one of TLS10"),
    "min_above_max": (TLS + "  min_version: TLS13\n  max_version: TLS12\n",
                      "min_version: TLS13 is above max_version TLS12"),
    "unknown_client_auth_type": (TLS + "  client_auth_type: Sometimes\n",
                                 "tls_server_config.client_auth_type: expected one of"),
    "ca_without_client_auth_policy": (TLS + "  client_ca_file: {ca}\n",
                                      "client CA is set without a client auth policy"),
    "ca_file_missing": (TLS + "  client_auth_type: RequireAndVerifyClientCert\n"
                              "  client_ca_file: /nonexistent-ca.crt\n",
                        "tls_server_config.client_ca_file: cannot read"),
    "ca_file_not_pem": (TLS + "  client_auth_type: RequireAndVerifyClientCert\n"
                              "  client_ca_file: {hash_file}\n",
                        "tls_server_config.client_ca_file: no valid PEM certificate"),
    "sans_without_required_cert": (TLS + "  client_auth_type: VerifyClientCertIfGiven\n"
                                         "  client_ca_file: {ca}\n"
                                         "  client_allowed_sans: [a]\n",
                                   "client_allowed_sans: requires client_auth_type"),
    "unknown_cipher": (TLS + "  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n",
                       "tls_server_config.cipher_suites[0]: unknown cipher suite"),
    "unknown_curve": (TLS + "  curve_preferences: [CurveP999]\n",
                      "tls_server_config.curve_preferences[0]: expected one of"),
    "plain_text_password": ("basic_auth_users:\n  alice: " + testsecrets.WEB_PASSWORD + "\n",
                            "basic_auth_users.alice: expected a bcrypt hash"),
    "bcrypt_bad_cost": ("basic_auth_users:\n  alice: '$2b$99$" + "a" * 53 + "'\n",
                        "basic_auth_users.alice: expected a bcrypt hash"),
    "user_with_colon": ("basic_auth_users:\n  'a:b': '{hash}'\n",
                        "basic_auth_users.a:b: a user name must be non-empty"),
    "header_not_allowed": ("http_server_config:\n  headers:\n    Server: nginx\n",
                           "http_server_config.headers.Server: header not allowed"),
    "frame_options_value": ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
                            "http_server_config.headers.X-Frame-Options: expected one of"),
    "content_type_options_value": ("http_server_config:\n  headers:\n"
                                   "    X-Content-Type-Options: sniff\n",
                                   "X-Content-Type-Options: expected one of nosniff"),
    "http2_not_bool": ("http_server_config:\n  http2: maybe\n",
                       "http_server_config.http2: expected bool"),
    "rate_limit_without_burst": ("rate_limit:\n  interval: 1s\n",
                                 "rate_limit: missing required key 'burst'"),
    "rate_limit_burst_zero": ("rate_limit:\n  interval: 1s\n  burst: 0\n",
                              "rate_limit.burst: expected an integer >= 1"),
    "rate_limit_bad_interval": ("rate_limit:\n  interval: often\n  burst: 1\n",
                                "rate_limit.interval: expected a duration"),
    "not_a_mapping": ("- tls_server_config\n", "expected a mapping, got a list"),
    "yaml_syntax": ("tls_server_config: [\n", "not valid YAML"),
}

GOOD = {
    "empty_file": "",
    "basic_auth_only": "basic_auth_users:\n  alice: '{hash}'\n  bob: '{hash}'\n",
    "tls_only": TLS,
    "tls_require_and_verify": TLS + "  client_auth_type: RequireAndVerifyClientCert\n"
                                    "  client_ca_file: {ca}\n",
    "tls_verify_if_given": TLS + "  client_auth_type: VerifyClientCertIfGiven\n"
                                 "  client_ca_file: {ca}\n",
    "tls_require_any_with_ca": TLS + "  client_auth_type: RequireAnyClientCert\n"
                                     "  client_ca_file: {ca}\n  client_allowed_sans: [x]\n",
    "tls_request_client_cert": TLS + "  client_auth_type: RequestClientCert\n",
    "tls_min_13": TLS + "  min_version: TLS13\n",
    "tls_ciphers_and_curves": TLS + "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,"
                                    " TLS_AES_128_GCM_SHA256]\n"
                                    "  prefer_server_cipher_suites: false\n"
                                    "  curve_preferences: [X25519, CurveP256]\n",
    "tls_inline_pem": "tls_server_config:\n  cert: |\n    {cert_pem}\n  key: |\n    {key_pem}\n",
    "headers_http2_rate_limit": "http_server_config:\n  http2: false\n  headers:\n"
                                "    x-content-type-options: NoSniff\n"
                                "    Content-Security-Policy: default-src 'self'\n"
                                "rate_limit: {{interval: 100ms, burst: 5}}\n",
    "empty_sections": "tls_server_config:\nbasic_auth_users:\n",
    "everything": TLS + "  client_auth_type: RequireAndVerifyClientCert\n"
                        "  client_ca_file: {ca}\n  min_version: TLS12\n  max_version: TLS13\n"
                        "basic_auth_users:\n  alice: '{hash}'\n"
                        "http_server_config:\n  headers:\n    X-Frame-Options: sameorigin\n",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_web_config_is_rejected_naming_file_and_key(name, pki, tmp_path):
    """Each bad file gives one ConfigError with the file name and the offending key."""
    text, message = BAD[name]
    hash_file = tmp_path / "not-pem.txt"
    hash_file.write_text("this is not PEM\n")
    path = tmp_path / "web.yml"
    path.write_text(_subst(text.replace("{hash_file}", str(hash_file)), pki))
    with pytest.raises(ConfigError) as err:
        webconfig.load(str(path))
    assert str(path) in str(err.value) and message in str(err.value), str(err.value)
    assert testsecrets.WEB_PASSWORD not in str(err.value)


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_web_config_loads(name, pki, tmp_path):
    path = tmp_path / "web.yml"
    path.write_text(_subst(GOOD[name], pki))
    cfg = webconfig.load(str(path))
    assert (cfg.tls is not None) == ("tls_server_config:\n  " in GOOD[name])
    assert (cfg.auth is not None) == ("basic_auth_users:\n  " in GOOD[name])


def test_table_sizes_match_the_toolkits_coverage():
    """At least 20 bad and 10 good fixtures (exporter-toolkit: 20 bad of 41)."""
    assert len(BAD) >= 20 and len(GOOD) >= 10


def test_relative_paths_resolve_against_the_config_directory(pki, tmp_path):
    d = tmp_path / "conf"
    d.mkdir()
    (d / "s.crt").write_bytes(pki.server.cert.read_bytes())
    (d / "s.key").write_bytes(pki.server.key.read_bytes())
    (d / "web.yml").write_text("tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n")
    assert webconfig.load(str(d / "web.yml")).tls is not None


def test_client_auth_mapping(pki, tmp_path):
    """How each toolkit client_auth_type maps onto Python's ssl verify modes."""
    want = {"NoClientCert": ssl.CERT_NONE, "RequestClientCert": ssl.CERT_NONE,
            "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
            "RequireAnyClientCert": ssl.CERT_REQUIRED,
            "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
    for auth_type, mode in want.items():
        ca = f"  client_ca_file: {pki.ca}\n" if mode != ssl.CERT_NONE else ""
        path = tmp_path / f"{auth_type}.yml"
        path.write_text(_subst(TLS, pki) + f"  client_auth_type: {auth_type}\n" + ca)
        assert webconfig.load(str(path)).tls.context.verify_mode == mode, auth_type
