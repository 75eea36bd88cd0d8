"""A throwaway CA and a server certificate for 127.0.0.1, for tests of TLS Redis."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _cert(subject: str, issuer_key, issuer: x509.Name, key, *, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(hours=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def write_tls_files(folder: Path, server: str = "redis") -> None:
    """``ca.crt``, ``tls.crt`` (CN ``server``, for 127.0.0.1) and ``tls.key`` in ``folder``
    (made if missing): the keys of a Kubernetes TLS Secret."""
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agentkv-test-ca")])
    folder.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    (folder / "ca.crt").write_bytes(_cert("agentkv-test-ca", ca_key, ca_name, ca_key, ca=True)
                                    .public_bytes(pem))
    (folder / "tls.crt").write_bytes(_cert(server, ca_key, ca_name, key, ca=False)
                                     .public_bytes(pem))
    (folder / "tls.key").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
