"""Why a certificate and key pair did not load, in words.

Python's ``ssl`` reports a PEM file it cannot read as ``SSLError`` with ``reason`` None
("[SSL] PEM lib"), and a key that does not belong to the certificate with OpenSSL's code
names. An error message built from ``exc.reason`` alone then ends in ": None". This module
tells which file is at fault by loading the certificate on its own.
"""

from __future__ import annotations

import ssl

_REASONS = {
    "KEY_VALUES_MISMATCH": "the key does not match the certificate",
    "NO_CERTIFICATE_ASSIGNED": "the key does not match the certificate (another key type)",
}


def _is_pem_certificate(path: str) -> bool:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
    except (ssl.SSLError, OSError):
        return False
    return True


def chain_error(exc: ssl.SSLError, cert_file: str, *, cert_key: str = "cert_file",
                key_key: str = "key_file") -> str:
    """What went wrong loading ``cert_file`` with its key, naming the config key at fault."""
    reason = exc.reason
    if reason in _REASONS:
        return _REASONS[reason]
    if reason is None:
        if not _is_pem_certificate(cert_file):
            return f"{cert_key} holds no PEM certificate"
        return f"{key_key} holds no PEM private key (or the key is encrypted)"
    return str(reason).replace("_", " ").lower()
