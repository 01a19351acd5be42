"""Test PKI generated at test time with `cryptography`: a CA, a server certificate for
127.0.0.1/localhost, client certificates from that CA and from an unrelated CA.

EC P-256 keys keep generation in the milliseconds. Nothing here is committed: every run
makes fresh keys in a temporary directory.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class PKI:
    ca: Path  # CA certificate (PEM)
    server: Pair  # SAN 127.0.0.1, localhost; signed by ca
    client: Pair  # SAN DNS:prometheus.test; signed by ca
    other_client: Pair  # SAN DNS:prometheus.test; signed by an unrelated CA
    other_ca: Path

    def server_context(self, client_cert: bool = False) -> ssl.SSLContext:
        """A TLS server context with the server certificate; ``client_cert``: clients must
        present a certificate signed by ``ca`` (mutual TLS)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(self.server.cert), str(self.server.key))
        if client_cert:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(str(self.ca))
        return ctx


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | None) -> None:
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        path.with_suffix(".key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))


def _ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def _leaf(cn: str, sans: list[x509.GeneralName], usage: x509.ObjectIdentifier,
          ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey
          ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(cn))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, key


def make_pki(directory: Path) -> PKI:
    """Write the PKI under ``directory`` and return the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = _ca("specwatch test CA")
    other_cert, other_key = _ca("unrelated CA")
    _write(directory / "ca", ca_cert, None)
    _write(directory / "other-ca", other_cert, None)
    server = _leaf("127.0.0.1", [x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                 x509.DNSName("localhost")],
                   ExtendedKeyUsageOID.SERVER_AUTH, ca_cert, ca_key)
    _write(directory / "server", *server)
    client = _leaf("prometheus", [x509.DNSName("prometheus.test")],
                   ExtendedKeyUsageOID.CLIENT_AUTH, ca_cert, ca_key)
    _write(directory / "client", *client)
    other = _leaf("prometheus", [x509.DNSName("prometheus.test")],
                  ExtendedKeyUsageOID.CLIENT_AUTH, other_cert, other_key)
    _write(directory / "other-client", *other)

    def pair(n: str) -> Pair:
        return Pair(directory / f"{n}.crt", directory / f"{n}.key")

    return PKI(ca=directory / "ca.crt", server=pair("server"), client=pair("client"),
               other_client=pair("other-client"), other_ca=directory / "other-ca.crt")
